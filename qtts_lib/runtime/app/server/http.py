"""`qtts serve`'s HTTP layer: the routes, the API key, the answers. Introduced in 18.
"""
from __future__ import annotations

import hmac
import re
import sys
import time
from pathlib import Path

from ...audio.encode import FORMATS
from ...errors import AudioError, InputError
from ...pipeline.longform import BudgetError
from .engine import DeadlinePassed, Engine, Job, Unavailable
from .refs import BadClip, RefVoices
from .reply import SEND_TIMEOUT, AudioResponse, Reply, unavailable
from .voices import Consents, Voices

PROTECTED = ("/v1/", "/metrics", "/openapi.json")  # what an API key guards (the voices too); the page and /health
#                                                    stay open
STATIC = Path(__file__).parent / "static"


def build_app(engine: Engine, voices: Voices, model_id: str, api_key: str | None = None,
              send_timeout: float = SEND_TIMEOUT, body_timeout: float | None = None, cors_origins: tuple = ()):
    """The Starlette app over one `Engine` and its `Voices` (its endpoints: `Api`); with `api_key`, the PROTECTED
    paths need it as a bearer token; `body_timeout`: seconds a request body may stall (default
    `schema.BODY_TIMEOUT`); `cors_origins`: the origins a browser may call it from besides its own (`--cors-origin`,
    Starlette's CORSMiddleware, in front of the key: a browser's preflight carries none)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware.cors import CORSMiddleware
    from starlette.routing import Route, WebSocketRoute

    from .schema import SEED_HEADER

    api = Api(engine, voices, model_id, api_key is not None, send_timeout, body_timeout)
    routes = [Route("/v1/audio/speech", api.speech, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]),
              Route("/v1/voices", api.voices, methods=["GET"]), Route("/v1/voices", api.add_voice, methods=["POST"]),
              Route("/v1/voices/{name}", api.delete_voice, methods=["DELETE"]),
              Route("/v1/audio/voices", api.create_audio_voice, methods=["POST"]),
              Route("/v1/audio/voices", api.audio_voices, methods=["GET"]),
              Route("/v1/audio/voices/{voice_id}", api.delete_audio_voice, methods=["DELETE"]),
              Route("/v1/audio/voice_consents", api.create_consent, methods=["POST"]),
              Route("/v1/audio/voice_consents", api.list_consents, methods=["GET"]),
              Route("/v1/audio/voice_consents/{consent_id}", api.consent, methods=["GET", "POST", "DELETE"]),
              Route("/health", api.health, methods=["GET"]),
              Route("/metrics", api.scrape, methods=["GET"]), Route("/openapi.json", api.openapi, methods=["GET"]),
              Route("/", api.index, methods=["GET"]),
              WebSocketRoute("/v1/audio/speech/stream", api.speech_stream)]
    app = Starlette(routes=routes, exception_handlers={HTTPException: api.http_error, Exception: api.server_error})
    gated = Gate(app, api.metrics, api_key, cors_origins)
    if not cors_origins:
        return gated
    return CORSMiddleware(gated, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "DELETE"],
                          allow_headers=["Authorization", "Content-Type"],
                          expose_headers=[SEED_HEADER, "X-Sample-Rate"])


def _json(body: dict, status: int = 200, headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers=headers)


def _refusal(e) -> object:
    """A `schema.RequestError` as its JSON answer."""
    return _json(e.body(), e.status, e.headers)


def _consent(record: dict) -> dict:
    """A `Consents` record as OpenAI's answer (`schema.VoiceConsent`)."""
    from .schema import VoiceConsent

    return VoiceConsent(id=record["id"], created_at=record["created_ns"] // 10**9, name=record["name"],
                        language=record["language"]).model_dump()


class Api:
    """The server's endpoints over one `Engine` and its `Voices`, one method each (`build_app` routes them); the
    speech request's parsing is `schema`'s, its answer a `Reply`."""

    def __init__(self, engine: Engine, voices: Voices, model_id: str, auth: bool, send_timeout: float,
                 body_timeout: float | None = None):
        from .metrics import Metrics
        from .schema import BODY_TIMEOUT, Served

        self.engine, self.store, self.model_id, self.auth = engine, voices, model_id, auth
        self.send_timeout = send_timeout
        self.body_timeout = BODY_TIMEOUT if body_timeout is None else body_timeout
        self.metrics = Metrics(engine.status, engine.max_batch)
        engine.on_step = self.metrics.batch_size.observe
        s = self.synth = voices.synth
        self.served = Served(model_id, s.kind, s.config.config.get("tts_model_size"), s.languages, s.speakers,
                             s.follows_instructions, s.sampling)
        self.page = (STATIC / "index.html").read_text(encoding="utf-8")
        self._openapi: tuple[list, dict] | None = None
        self.consents = Consents(voices.folder / "consents" if voices.folder and voices.clones else None, voices.log)
        self.refs = RefVoices(voices)

    async def _body(self, request, upload: bool = False, speech: bool = False) -> bytes:
        """`schema.read_body` within this server's body timeout: a request's limit, or an upload's (a speech request
        that carries `ref_audio` may be as large as an upload)."""
        from .schema import MAX_BODY_BYTES, MAX_UPLOAD_BYTES, read_body

        return await read_body(request, MAX_UPLOAD_BYTES if upload else MAX_BODY_BYTES, self.body_timeout,
                               clip=MAX_UPLOAD_BYTES if speech else None)

    async def speech(self, request):
        """Read, check and admit the request (a 4xx or 503 at once), wait for its first audio, then stream."""
        from . import schema

        received = time.monotonic()
        try:
            job = await self.admit(request)
        except schema.RequestError as e:
            return _refusal(e)
        try:
            reply = await Reply.open(job, self.metrics, received, self.send_timeout)
        except InputError as e:  # PyAV missing: the server was installed without the serve extra
            job.close()
            speed = "speed" in str(e)
            why = "" if speed else " (response_format is mp3 unless the request says otherwise, as OpenAI's; wav " \
                                   "and pcm need no PyAV)"
            return _refusal(schema.RequestError(501, str(e) + why, "speed" if speed else "response_format",
                                                kind="server_error", code="format_unavailable"))
        except BaseException:
            job.close()
            raise
        try:
            first = await reply.first(request)
        except BaseException:
            reply.close()
            raise
        if first is not None and first[0] in ("audio", "done"):  # "done" first: no audio (EOS at the first frame)
            return AudioResponse(reply, first, FORMATS[job.speech.format].content_type,
                                 sse=job.speech.stream_format == "sse")
        reply.outcome = "error" if first and first[0] == "error" else "abandoned"
        reply.close()
        if first is None:
            from starlette.responses import Response

            return Response(status_code=499)  # nobody reads it: the client has gone
        kind, e = first
        if kind == "busy":  # waited past --max-wait for a place among the streams
            return _refusal(unavailable(e))
        if kind == "refused":
            return _refusal(schema.RequestError(400, str(e), "voice" if isinstance(e, AudioError) else None))
        if isinstance(e, DeadlinePassed):
            return _refusal(schema.RequestError(504, str(e), kind="server_error", code="deadline_exceeded"))
        healthy = self.engine.status().healthy
        return _refusal(schema.RequestError(500 if healthy else 503, f"the engine failed: {e}", kind="server_error",
                                            code="engine_error"))

    async def admit(self, request) -> Job:
        """The request read (`schema.read_body`), checked (`schema.parse_speech`), its voice taken from the store
        (built now, once, for a clip copied in since the start), then given to the engine (planned against the
        budget, given a place); any refusal a `schema.RequestError`."""
        from .schema import RequestError

        speech = self.parse(await self._body(request, speech=True))
        voice = await self.voice_of(speech)
        try:
            job = await self.engine.speak(speech, voice)
        except BudgetError as e:
            raise RequestError(400, str(e), "input", code="over_budget") from None
        except InputError as e:
            raise RequestError(400, str(e)) from None
        except Unavailable as e:
            raise unavailable(e) from None
        return job

    async def speech_stream(self, websocket):
        """The WebSocket of a text that streams in (`live`)."""
        from .live import speech_stream

        await speech_stream(self, websocket)

    def parse(self, body: bytes):
        """A speech request's body checked (`schema.parse_speech`) against this server's checkpoint and voices."""
        from .schema import parse_speech

        names = self.store.names()
        return parse_speech(body, self.served, names, self.store.by_id(), self.store.aliases(names))

    async def voice_of(self, speech):
        """The request's voice: its `ref_audio`'s (built once per clip), or the store's (built now, once, for a
        clip copied in since the start); a `schema.RequestError` (400) when it cannot be made."""
        from .schema import RequestError

        try:
            if speech.ref_audio is not None:
                return await self.refs.voice(speech.ref_audio, speech.ref_text)
            await self.store.ready(speech.voice)
            return self.store.get(speech.voice, speech.instructions)
        except BadClip as e:
            raise RequestError(400, str(e), e.param, code=e.code) from None
        except (AudioError, InputError) as e:
            raise RequestError(400, str(e), "voice", code="bad_voice") from None

    async def models(self, request):
        from . import schema

        s = self.synth
        capabilities = schema.ModelCapabilities(
            kind=s.kind, clone=s.kind == "base", speakers=s.speakers, languages=s.languages,
            voices=self.store.names(), instructions=s.follows_instructions, formats=list(FORMATS),
            aliases=list(schema.OPENAI_MODELS))
        return _json(schema.ModelList(data=[schema.Model(id=self.model_id, qtts=capabilities)]).model_dump())

    async def health(self, request):
        from .schema import Health

        st = self.engine.status()
        return _json(Health(
            status="ok" if st.healthy else "error", error=st.error, model=self.model_id, busy=st.speaking > 0,
            speaking=st.speaking, batch=st.batch, max_batch=st.max_batch, largest_batch=st.largest_batch,
            waiting=st.waiting, held=st.held, refused=st.refused, served=st.served, streams=st.streams,
            auth=self.auth,
        ).model_dump(), 200 if st.healthy else 503)

    async def openapi(self, request):
        from .openapi import openapi

        voices = self.store.names()
        if self._openapi is None or self._openapi[0] != voices:  # built again only when the voices changed
            self._openapi = voices, openapi(self.model_id, voices, self.synth.languages, self.auth)
        return _json(self._openapi[1])

    async def voices(self, request):
        from .schema import VoiceInfo, VoiceList

        return _json(VoiceList(voices=[VoiceInfo(**v) for v in self.store.info()]).model_dump())

    async def audio_voices(self, request):
        """`GET /v1/audio/voices`: every voice as an OpenAI list, each with the names that speak it
        (`schema.ListedVoices`)."""
        from .schema import ListedVoice, ListedVoices

        return _json(ListedVoices(data=[ListedVoice(**v) for v in self.store.listed()]).model_dump())

    async def add_voice(self, request):
        """A voice from an uploaded clip (`schema.parse_voice_form`), built off the engine's thread
        (`Voices.add`) and saved in the voices folder: 201, or a 4xx saying why not."""
        from .forms import parse_voice_form
        from .schema import RequestError, VoiceCreated

        try:
            self._cloning(folder=True)
            form = await parse_voice_form(await self._body(request, upload=True), request.headers)
            created = await self._add_voice(form.name, form.audio, form.text, form.filename, "audio")
        except RequestError as e:
            return _refusal(e)
        return _json(VoiceCreated(**created).model_dump(), 201)

    async def create_audio_voice(self, request):
        """OpenAI's `POST /v1/audio/voices`: a voice from an audio sample (`schema.parse_sample_form`) under a
        consent recording this server holds, made as `POST /v1/voices` makes one (no transcript: x-vector) and
        given an OpenAI id: `schema.AudioVoice`, or a 4xx saying why not."""
        from .forms import parse_sample_form
        from .schema import AudioVoice, RequestError, shown

        try:
            self._cloning(folder=True)
            form = await parse_sample_form(await self._body(request, upload=True), request.headers)
            if form.consent not in self.consents:
                raise RequestError(400, f"no consent recording {shown(form.consent)}: upload one with POST "
                                        "/v1/audio/voice_consents and send its id", "consent",
                                   code="consent_not_found")
            created = await self._add_voice(form.name, form.audio, None, form.filename, "audio_sample",
                                            consent=form.consent)
        except RequestError as e:
            return _refusal(e)
        return _json(AudioVoice(id=created["id"], created_at=int(time.time()), name=created["name"]).model_dump())

    async def delete_audio_voice(self, request):
        """OpenAI's `DELETE /v1/audio/voices/{voice_id}`: the voice with that OpenAI id, removed as `DELETE
        /v1/voices/{name}` removes it (its consent recording stays)."""
        from .schema import AudioVoiceDeleted, RequestError, shown

        voice_id, voices = request.path_params["voice_id"], self.store
        try:
            self._cloning()
            name = voices.by_id().get(voice_id)
            if name is None:
                raise RequestError(404, f"no voice with the id {shown(voice_id)}", "voice_id", code="voice_not_found")
        except RequestError as e:
            return _refusal(e)
        await voices.delete(name)
        return _json(AudioVoiceDeleted(id=voice_id).model_dump())

    def _cloning(self, folder: bool = False) -> None:
        """A `schema.RequestError` (400) unless this checkpoint clones voices (Base) and, with `folder`, the server
        has a voices folder to keep them in."""
        from .schema import RequestError

        voices, kind = self.store, self.synth.kind
        if not voices.clones:
            raise RequestError(400, f"this checkpoint ({kind.replace('_', ' ')}) cannot clone a voice: only "
                                    "Base checkpoints clone a clip; its voices are "
                                    f"{', '.join(voices.names())}", code="cannot_clone")
        if folder and voices.folder is None:
            raise RequestError(400, "this server keeps no voices: start it with --voices DIR, the folder where "
                                    "uploaded voices are saved (and read again at the next start)",
                               code="no_voices_folder")

    async def _add_voice(self, name: str, audio: bytes, text: str | None, filename: str | None, field: str,
                         consent: str | None = None) -> dict:
        """`Voices.add`, its refusals as `schema.RequestError`s (`field`: the form's clip field; a quota passed:
        403, not 429, which OpenAI's SDK retries)."""
        from .schema import RequestError
        from .voices import QuotaExceeded

        voices = self.store
        try:
            if voices.exists(name):
                raise FileExistsError(name)
            return await voices.add(name, audio, text, filename, consent)
        except FileExistsError:  # or uploaded twice at once: the second finds the first's files
            raise RequestError(409, f"a voice named {name!r} exists; delete it first (DELETE /v1/voices/{name}) or "
                                    "choose another name", "name", code="voice_exists") from None
        except QuotaExceeded as e:
            raise RequestError(403, str(e), code="quota_exceeded") from None
        except AudioError as e:
            raise RequestError(400, str(e), field, code="bad_clip") from None
        except InputError as e:
            raise RequestError(400, str(e), "text") from None

    async def create_consent(self, request):
        """OpenAI's `POST /v1/audio/voice_consents`: a consent recording (`schema.parse_consent_form`), checked as a
        voice clip is and kept (`Consents`): `schema.VoiceConsent`, or a 4xx saying why not."""
        from .forms import parse_consent_form
        from .schema import RequestError
        from .voices import QuotaExceeded

        try:
            self._cloning()
            form = await parse_consent_form(await self._body(request, upload=True), request.headers)
            record = await self.consents.add(form.name, form.language, form.recording, form.filename,
                                             self.store.consent_quota)
        except RequestError as e:
            return _refusal(e)
        except QuotaExceeded as e:
            return _refusal(RequestError(403, str(e), code="quota_exceeded"))
        except AudioError as e:
            return _refusal(RequestError(400, str(e), "recording", code="bad_recording"))
        return _json(_consent(record))

    async def list_consents(self, request):
        """OpenAI's `GET /v1/audio/voice_consents`: a cursor page of them (`after`, `limit`), oldest first."""
        from .forms import parse_list_query
        from .schema import RequestError, VoiceConsentList, shown

        try:
            self._cloning()
            after, limit = parse_list_query(request.query_params)
            records, more = self.consents.page(after, limit)
        except RequestError as e:
            return _refusal(e)
        except KeyError:
            return _refusal(RequestError(400, f"`after` {shown(after)} is no consent recording's id", "after"))
        data = [_consent(r) for r in records]
        return _json(VoiceConsentList(data=data, first_id=data[0]["id"] if data else None,
                                      last_id=data[-1]["id"] if data else None, has_more=more).model_dump())

    async def consent(self, request):
        """OpenAI's retrieve (GET), update (POST: a new label, `schema.parse_consent_update`) and delete of one
        consent recording, by its id."""
        from .forms import parse_consent_update
        from .schema import RequestError, VoiceConsentDeleted, shown

        consent_id = request.path_params["consent_id"]
        try:
            self._cloning()
            name = parse_consent_update(await self._body(request)) if request.method == "POST" else None
            if consent_id not in self.consents:
                raise RequestError(404, f"no consent recording {shown(consent_id)}", "consent_id",
                                   code="consent_not_found")
        except RequestError as e:
            return _refusal(e)
        if name is not None:
            return _json(_consent(self.consents.rename(consent_id, name)))
        if request.method == "DELETE":
            self.consents.delete(consent_id)
            return _json(VoiceConsentDeleted(id=consent_id).model_dump())
        return _json(_consent(self.consents.get(consent_id)))

    async def delete_voice(self, request):
        from .schema import VOICE_PATTERN, RequestError, VoiceDeleted, shown

        name, voices = request.path_params["name"], self.store
        if voices.builtin(name):
            return _refusal(RequestError(400, f"{name!r} is one of the checkpoint's own voices: it cannot be deleted",
                                         "name", code="builtin_voice"))
        if not re.match(VOICE_PATTERN, name) or name not in voices.names():
            return _refusal(RequestError(404, f"no voice named {shown(name)}", "name", code="voice_not_found"))
        await voices.delete(name)
        return _json(VoiceDeleted(deleted=name).model_dump())

    async def scrape(self, request):
        from starlette.responses import Response

        text, content_type = self.metrics.scrape()
        return Response(text, media_type=content_type)

    async def index(self, request):
        from starlette.responses import HTMLResponse

        return HTMLResponse(self.page)

    async def http_error(self, request, exc):
        return _json({"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None,
                                "code": None}}, exc.status_code)

    async def server_error(self, request, exc):
        print(f"qtts serve: error: {exc!r}", file=sys.stderr)
        return _json({"error": {"message": "internal error", "type": "server_error", "param": None, "code": None}},
                     500)


class Gate:
    """ASGI middleware in front of the app: the API key on PROTECTED paths (OpenAI's 401 body), and every answer
    counted by path and status for /metrics. The key comes as `Authorization: Bearer KEY`, the scheme's name in any
    case (RFC 9110: an authentication scheme is case-insensitive). A WebSocket is checked too, before its handshake
    is accepted (`websocket`): the key, and the browser's `Origin` against the server's own and `origins`."""

    def __init__(self, app, metrics, api_key: str | None, origins: tuple = ()):
        self.app, self.metrics, self.origins = app, metrics, set(origins)
        self.key = None if api_key is None else api_key.encode()

    def authorized(self, header: bytes) -> bool:
        scheme, _, token = header.strip().partition(b" ")
        return hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"

    async def websocket(self, scope, receive, send):
        """A WebSocket with the key (a header, or `?api_key=` from a browser) and an accepted `Origin` goes on to
        the app; any other's handshake is refused (the ASGI server answers it 403)."""
        from urllib.parse import parse_qs, urlparse

        headers = dict(scope["headers"])
        key_ok = self.key is None or not scope["path"].startswith(PROTECTED) or \
            self.authorized(headers.get(b"authorization", b"")) or any(
                hmac.compare_digest(k.encode(), self.key)
                for k in parse_qs(scope.get("query_string", b"").decode()).get("api_key", []))
        origin = headers.get(b"origin", b"").decode()
        host = headers.get(b"host", b"").decode()
        origin_ok = not origin or origin in self.origins or urlparse(origin).netloc == host
        if key_ok and origin_ok:
            return await self.app(scope, receive, send)
        await receive()  # the client's websocket.connect
        print(f"qtts serve: a WebSocket refused: {'no valid API key' if not key_ok else f'origin {origin}'}",
              file=sys.stderr)
        await send({"type": "websocket.close", "code": 1008})

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            return await self.websocket(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.answered(path, message["status"])
            await send(message)

        if self.key is not None and path.startswith(PROTECTED):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not self.authorized(given):
                from starlette.responses import JSONResponse

                from .schema import RequestError

                why = "a wrong API key" if given else "no API key (Authorization: Bearer KEY)"
                answer = JSONResponse(RequestError(401, f"this server needs its API key; the request sent {why}",
                                                   code="invalid_api_key").body(), status_code=401,
                                      headers={"WWW-Authenticate": "Bearer"})
                return await answer(scope, receive, counted)
        await self.app(scope, receive, counted)
