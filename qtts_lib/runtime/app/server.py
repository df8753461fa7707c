"""`qtts serve`: a local speech server speaking OpenAI's speech API, streamed. Introduced in 14.

    qtts serve --checkpoint tiny-base --voices voices/ --port 8000
    curl -sN localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"input": "Hello.", "voice": "alice"}' | ffplay -nodisp -autoexit -

Endpoints: `POST /v1/audio/speech`, `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus, `app.metrics`),
`GET /openapi.json` (the API as data, `app.schema`) and `GET /`, a page to try the voices (`app/static/`). The
request is `schema.SpeechRequest`: `input`, `voice`, optional `model`, `response_format` (mp3 | opus | aac | flac |
wav | pcm), `speed` (1.0 only), `language`, `instructions` (OpenAI's style prompt: a style for a built-in speaker
on a 1.7B CustomVoice checkpoint, the voice itself on a VoiceDesign one, whose one voice is `design`; refused with a
400 where the checkpoint cannot follow it), and the sampling parameters of `pipeline.sampling.Sampling`
(`temperature`, `top_k`, `top_p`, `repetition_penalty`, `seed`, `greedy`); missing ones take the checkpoint's
generation_config, so the server samples as the reference does. A `voice` is a built-in speaker (CustomVoice
checkpoints) or the name of `<name>.wav` in the voices folder (Base checkpoints: x-vector cloning; with
`<name>.txt` beside it holding the clip's transcript, ICL); `Voices` holds them all, built when the server starts.
Audio is 24 kHz mono, encoded piece by piece as frames are generated and sent as it is encoded (chunked transfer,
`audio.encode.Encoder`): `pcm` raw 16-bit, `wav` behind a header of unknown length, mp3, Ogg Opus, ADTS AAC and
FLAC through FFmpeg. A long `input` is spoken segment by segment with short pauses (`pipeline.longform.LongText`,
chapter 15), each segment capped by its own length and by `--max-frames`.

One thread runs every piece of ncnn work (`Engine`): OpenMP keeps a worker pool per thread that ran ncnn, so ncnn
called from whichever thread the event loop lends would starve on a machine with few cores (chapter 14). Up to
`--max-batch` requests are decoded together (`pipeline.scheduler.Scheduler`, chapter 16): each frame's graph calls
serve all of them, and each response streams as its own frames come. A request keeps its place from its first
segment to its last; one that joins is prefilled a piece per frame, so the streams already running never wait for a
whole prompt.

Every request's work is bounded: the body (64 KiB, refused from its Content-Length or as soon as more is read), the
text (`--frame-budget` frames at most, else a 400 before any work), the places (`--max-batch` speaking and `--queue`
waiting; past that a 503 with Retry-After at once; `--max-connections` for uvicorn), and the audio a client has not
read yet: past `--backlog` seconds its text is held (no next segment), and a client that takes no audio for
`--send-timeout` seconds is dropped. Failures are seen: every bad request gets a 4xx with an OpenAI-style JSON error
before any audio; an engine that stopped makes `/health` answer 503 and every request a 5xx JSON error; a stream
that fails after its first audio is cut off (its chunked body never ends), never ended as if complete; a client that
leaves, queued or speaking, frees its place at once. With `--api-key` (or $QTTS_API_KEY) every /v1/ request and
/metrics need `Authorization: Bearer KEY` (what OpenAI's clients send), else 401. Built on Starlette + uvicorn,
pydantic, prometheus_client and PyAV (`pip install qtts[serve]`), imported only when serving.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..audio.encode import FORMATS, Encoder
from ..audio.wav import SAMPLE_RATE, load_wav
from ..binding.net import release_threads
from ..errors import AudioError, InputError
from ..pipeline.longform import BudgetError, LongText, check_budget, plan
from ..pipeline.scheduler import DEFAULT_MAX_BATCH, Scheduler
from .options import add_batch_option, add_model_options, load_synthesizer, max_batch_of, model_dir, positive_int

DESIGNED = "design"  # a VoiceDesign checkpoint's one voice: the one its `instructions` describe
API_KEY_ENV = "QTTS_API_KEY"
PROTECTED = ("/v1/", "/metrics")  # what --api-key guards; the page, /health and /openapi.json stay open
STATIC = Path(__file__).parent / "static"
FRAME_BUDGET = 9000      # frames a request may take (12 minutes: a 4096-character English text fits)
BACKLOG_SECONDS = 20.0   # audio a client may leave unread before its text is held
SEND_TIMEOUT = 30.0      # seconds a client may take no audio at all before it is dropped


class Voices:
    """Every voice the server speaks, in one place: the checkpoint's built-in speakers, `<name>.wav` clips in the
    voices folder (`<name>.txt` beside one: its transcript, ICL), or a VoiceDesign checkpoint's `design`. `names`
    lists them (the folder read again each time); `build` runs the encoders on a clip once (at start, for those
    already there: `preload`) and `get` hands back the built `Voice` with a request's instructions."""

    def __init__(self, synth, folder: Path | None):
        self.synth, self.folder = synth, folder
        self.built: dict = {}

    def names(self) -> list[str]:
        from .schema import VOICE_PATTERN  # a name, never a path

        if self.synth.kind == "voice_design":
            return [DESIGNED]
        files = sorted(self.folder.glob("*.wav")) if self.folder else []
        return self.synth.speakers + [f.stem for f in files if re.match(VOICE_PATTERN, f.stem)]

    def preload(self, log: Callable[[str], None]) -> None:
        """Build every voice now (the encoders run once per clip, before any request waits); a described voice
        (VoiceDesign) is only words, built with each request."""
        if self.synth.kind == "voice_design":
            return
        for name in self.names():
            try:
                self.build(name)
            except (AudioError, InputError) as e:
                log(f"voice {name!r} cannot be used: {e}")

    def build(self, name: str):
        if name not in self.built:
            if name.lower() in self.synth.speakers:
                self.built[name] = self.synth.voice(speaker=name.lower())
            else:
                clip = self.folder / f"{name}.wav"
                transcript = clip.with_suffix(".txt")
                text = transcript.read_text(encoding="utf-8").strip() if transcript.is_file() else None
                self.built[name] = self.synth.voice(wav=load_wav(clip, strict=True, quiet=True), text=text or None)
        return self.built[name]

    def get(self, name: str, instructions: str | None = None):
        """The `Voice` for `name` with `instructions` (on the engine thread: a clip added since the start is built
        here, once)."""
        if self.synth.kind == "voice_design":
            return self.synth.voice(instruct=instructions)
        voice = self.build(name)
        return dataclasses.replace(voice, instruct=instructions) if instructions else voice


class Job:
    """One request in the engine: its `speech` and planned segments go in; what comes out (audio pieces, then
    "done", or "refused"/"error") is put on `out` through the event loop. `backlog`: samples sent and not yet
    taken by the response (the client's reading, felt through the event loop's flow control)."""

    def __init__(self, speech, planned: list, loop: asyncio.AbstractEventLoop):
        self.speech, self.planned, self.loop = speech, planned, loop
        self.out: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.released = False
        self.long: LongText | None = None  # the engine thread's
        self._backlog, self._lock = 0, threading.Lock()

    @property
    def backlog(self) -> int:
        return self._backlog

    def send(self, kind: str, value=None) -> None:
        """From the engine thread."""
        if kind == "audio":
            with self._lock:
                self._backlog += len(value)
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed: the server is going down
            self.cancelled.set()

    async def take(self):
        """The next (kind, value), on the event loop."""
        kind, value = await self.out.get()
        if kind == "audio":
            with self._lock:
                self._backlog -= len(value)
        return kind, value


class Unavailable(Exception):
    """The engine cannot take a request now: overloaded (retry later) or stopped."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class Engine:
    """The synthesizer behind the one thread that runs ncnn: its voices, its scheduler (the batch), the requests
    it speaks and the inbox in front of it. `submit` and `release` are the event loop's; the rest runs on the
    engine's thread. An exception there stops the engine: every request is told, `/health` answers 503, new requests
    are refused at once (a supervisor restarts the process; nothing is hidden)."""

    def __init__(self, synth, voices_dir: Path | None, max_frames: int = 600, chunk_frames: int = 4,
                 queue_places: int = 8, max_batch: int = DEFAULT_MAX_BATCH, budget: int | None = FRAME_BUDGET,
                 backlog_seconds: float = BACKLOG_SECONDS, log: Callable[[str], None] | None = None):
        self.synth, self.voices = synth, Voices(synth, voices_dir)
        self.max_frames, self.chunk_frames, self.queue_places, self.budget = max_frames, chunk_frames, \
            queue_places, budget
        self.backlog = int(backlog_seconds * SAMPLE_RATE)
        self.scheduler = Scheduler(synth, max_batch)
        self.inbox: queue.Queue[Job | None] = queue.Queue()
        self.speaking: list[Job] = []  # the engine thread's
        self.pending = 0               # requests holding a place, queued or speaking (the event loop's)
        self.active = 0                # requests the engine is speaking
        self.largest_batch = self.served = 0
        self.failure: BaseException | None = None
        self.on_step: Callable[[int], None] | None = None  # told each step's batch size (the metrics), on this thread
        self.voices.preload(log or (lambda m: print(f"qtts serve: {m}", file=sys.stderr)))
        release_threads()  # loading ran ncnn in this thread; from now on only the engine's thread does
        self.thread = threading.Thread(target=self._work, name="qtts-engine", daemon=True)
        self.thread.start()

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def running(self) -> bool:
        return self.active > 0

    @property
    def alive(self) -> bool:
        return self.failure is None and self.thread.is_alive()

    def voice_names(self) -> list[str]:
        return self.voices.names()

    def served_model(self, model_id: str):
        """What requests are checked against (`schema.Served`)."""
        from .schema import Served

        s = self.synth
        return Served(model_id, s.kind, s.config.config.get("tts_model_size"), s.languages, s.speakers,
                      s.follows_instructions, s.sampling)

    def plan(self, speech) -> list:
        """The request's segments and their caps (the tokenizer only: no ncnn), refused past the budget."""
        segments = plan(self.synth, speech.text, max_frames=self.max_frames)
        check_budget(segments, self.budget)
        return segments

    # ------------------------------------------------------------ the event loop's side
    def submit(self, speech, planned: list) -> Job:
        """A place for the request, or `Unavailable` at once."""
        if not self.alive:
            raise Unavailable(f"the engine stopped: {self.failure!r}")
        if self.pending >= self.max_batch + self.queue_places:
            raise Unavailable(f"server busy: {self.max_batch} requests speaking and {self.queue_places} queued; "
                              "retry later", retry_after=max(1, round(self.pending / self.max_batch)))
        job = Job(speech, planned, asyncio.get_running_loop())
        self.pending += 1
        self.inbox.put(job)
        return job

    def release(self, job: Job) -> None:
        """The request is over, however it ended: its place is free (once), its work stops at the next step."""
        if not job.released:
            job.released = True
            self.pending -= 1
            job.cancelled.set()
            self.inbox.put(None)  # wakes an idle engine, which drops the job if it has not started it yet

    def stop(self) -> None:
        self.inbox.put(False)

    # ------------------------------------------------------------ the engine's thread
    def _work(self) -> None:
        try:
            while self._take_inbox():
                if self.speaking:
                    self._step()
        except BaseException as e:  # noqa: BLE001 - the engine stops, and says why to everyone
            self.failure = e
            print(f"qtts serve: the engine stopped: {e!r}", file=sys.stderr)
            for job in self.speaking:
                job.send("error", e)
            self.speaking, self.active = [], 0
            while True:
                try:
                    job = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if job:
                    job.send("error", e)

    def _take_inbox(self) -> bool:
        """Start the requests that came (wait for one when idle); drop those whose clients left; False: stop."""
        incoming = []
        try:
            incoming.append(self.inbox.get(block=not self.speaking))
            while True:
                incoming.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        if False in incoming:
            for job in self.speaking:
                job.long.cancel()
                job.send("done")
            return False
        for job in incoming:
            if job and not job.cancelled.is_set():
                self._start(job)
        for job in [j for j in self.speaking if j.cancelled.is_set()]:  # the client left
            self._end(job)
        return True

    def _start(self, job: Job) -> None:
        s = job.speech
        try:
            voice = self.voices.get(s.voice, s.instructions)
            job.long = LongText(self.synth, self.scheduler, s.text, s.language, voice, s.sampling,
                                max_frames=self.max_frames, chunk_frames=self.chunk_frames, planned=job.planned)
        except (InputError, AudioError) as e:
            job.send("refused", e)
            return
        self.speaking.append(job)
        self.active = len(self.speaking)

    def _step(self) -> None:
        events = self.scheduler.step()
        self.largest_batch = max(self.largest_batch, len(events))  # one event per utterance in the batch
        if self.on_step is not None:
            self.on_step(len(events))
        for job in list(self.speaking):
            for piece in job.long.take(events):
                job.send("audio", piece)
            if job.long.done:  # not counted as speaking once its client can hear it is done (`/health`)
                self._end(job, "done")
            else:
                job.long.hold(job.backlog > self.backlog)  # a client far behind: no next segment for now

    def _end(self, job: Job, message: str | None = None) -> None:
        job.long.cancel()
        self.speaking.remove(job)
        self.active = len(self.speaking)
        if message:
            job.send(message)


class Reply:
    """One speech request's answer, on the event loop: wait for its first audio (or its client leaving), then
    stream the rest (`AudioResponse`). However it ends, `close` frees its place once and counts its outcome."""

    def __init__(self, engine: Engine, job: Job, metrics, received: float, send_timeout: float):
        self.engine, self.job, self.metrics, self.received = engine, job, metrics, received
        self.send_timeout, self.outcome = send_timeout, "abandoned"
        self.encoder = Encoder(job.speech.format)
        self.samples = 0

    async def first(self, request):
        """("audio", piece), ("refused"/"error", exception), or None when the client left first. An engine that
        stops while the request waits is noticed within a second, whatever it managed to tell."""
        taken = asyncio.ensure_future(self.job.take())
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            while not (taken.done() or gone.done()):
                await asyncio.wait({taken, gone}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                if not (taken.done() or gone.done() or self.engine.alive):
                    return "error", self.engine.failure
            return taken.result() if taken.done() else None
        finally:
            for task in (taken, gone):
                task.cancel()

    async def chunks(self, kind: str, value):
        """The encoded stream from the first message on; raises `BrokenStream` on an engine error."""
        first = True
        while kind == "audio":
            self.samples += len(value)
            chunk = self.encoder.write(value)
            if chunk:
                if first:
                    self.metrics.time_to_first_audio.observe(time.monotonic() - self.received)
                    first = False
                yield chunk
            kind, value = await self.job.take()
        if kind != "done":
            self.outcome = "error"
            raise BrokenStream(value)
        rest = self.encoder.close()
        self.outcome = "done"
        self.engine.served += 1
        audio_s = self.encoder.samples / SAMPLE_RATE
        self.metrics.audio_seconds.inc(audio_s)
        if audio_s > 0:
            self.metrics.real_time_factor.observe((time.monotonic() - self.received) / audio_s)
        self.engine.release(self.job)  # before the last chunk goes out: the client's next request finds it free
        if rest:
            yield rest

    def close(self) -> None:
        self.engine.release(self.job)
        if self.outcome != "done":
            self.encoder.discard()
        self.metrics.streams.labels(self.job.speech.format, self.outcome).inc()


class BrokenStream(Exception):
    """The engine failed after the stream's first audio: the response is cut off, not ended."""


async def _disconnected(receive) -> None:
    """Returns when the client has gone (its body already read, the next ASGI message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def build_app(engine: Engine, model_id: str, api_key: str | None = None, send_timeout: float = SEND_TIMEOUT):
    """The Starlette app over one `Engine` (its endpoints: `Api`); with `api_key`, the PROTECTED paths need it as a
    bearer token."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    api = Api(engine, model_id, api_key is not None, send_timeout)
    routes = [Route("/v1/audio/speech", api.speech, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]), Route("/health", api.health, methods=["GET"]),
              Route("/metrics", api.scrape, methods=["GET"]), Route("/openapi.json", api.openapi, methods=["GET"]),
              Route("/", api.index, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: api.http_error, Exception: api.server_error})
    return Gate(app, api.metrics, api_key)


def _json(body: dict, status: int = 200, headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers=headers)


def _refusal(e) -> object:
    """A `schema.RequestError` as its JSON answer."""
    return _json(e.body(), e.status, e.headers)


class Api:
    """The server's endpoints over one `Engine`, one method each (`build_app` routes them); the speech request's
    parsing is `schema`'s, its answer a `Reply`."""

    def __init__(self, engine: Engine, model_id: str, auth: bool, send_timeout: float):
        from .metrics import Metrics

        self.engine, self.model_id, self.auth, self.send_timeout = engine, model_id, auth, send_timeout
        self.metrics = Metrics(engine)
        engine.on_step = self.metrics.batch_size.observe
        self.served = engine.served_model(model_id)
        self.page = (STATIC / "index.html").read_text(encoding="utf-8")
        self._openapi: tuple[list, dict] | None = None

    async def speech(self, request):
        """Read, check and admit the request (a 4xx or 503 at once), wait for its first audio, then stream."""
        from . import schema

        received = time.monotonic()
        try:
            job = await self.admit(request)
        except schema.RequestError as e:
            return _refusal(e)
        try:
            reply = Reply(self.engine, job, self.metrics, received, self.send_timeout)
        except InputError as e:  # PyAV missing: the server was installed without the serve extra
            self.engine.release(job)
            return _refusal(schema.RequestError(501, str(e), "response_format", kind="server_error"))
        try:
            first = await reply.first(request)
        except BaseException:
            reply.close()
            raise
        if first is not None and first[0] == "audio":
            return AudioResponse(reply, first, FORMATS[job.speech.format].content_type)
        reply.outcome = "error" if first and first[0] == "error" else "abandoned"
        reply.close()
        if first is None:
            from starlette.responses import Response

            return Response(status_code=499)  # nobody reads it: the client has gone
        kind, e = first
        if kind == "refused":
            return _refusal(schema.RequestError(400, str(e), "voice" if isinstance(e, AudioError) else None))
        return _refusal(schema.RequestError(500 if self.engine.alive else 503, f"the engine failed: {e!r}",
                                            kind="server_error", code="engine_error"))

    async def admit(self, request) -> Job:
        """The request read (`schema.read_body`), checked (`schema.parse_speech`), planned against the budget and
        given a place; any refusal a `schema.RequestError`."""
        from .schema import RequestError, parse_speech, read_body

        speech = parse_speech(await read_body(request), self.served, self.engine.voices.names())
        try:
            planned = await asyncio.to_thread(self.engine.plan, speech)  # the tokenizer, off the event loop
            job = self.engine.submit(speech, planned)
        except BudgetError as e:
            raise RequestError(400, str(e), "input", code="over_budget") from None
        except InputError as e:
            raise RequestError(400, str(e)) from None
        except Unavailable as e:
            raise RequestError(503, str(e), kind="server_error", code="overloaded" if e.retry_after else
                               "engine_stopped", headers={"Retry-After": str(e.retry_after)} if e.retry_after
                               else None) from None
        return job

    async def models(self, request):
        from . import schema

        s = self.engine.synth
        capabilities = schema.ModelCapabilities(
            kind=s.kind, clone=s.kind == "base", speakers=s.speakers, languages=s.languages,
            voices=self.engine.voices.names(), instructions=s.follows_instructions, formats=list(FORMATS),
            aliases=list(schema.OPENAI_MODELS))
        return _json(schema.ModelList(data=[schema.Model(id=self.model_id, qtts=capabilities)]).model_dump())

    async def health(self, request):
        from .schema import Health

        e = self.engine
        return _json(Health(
            status="ok" if e.alive else "error", error=None if e.alive else repr(e.failure), model=self.model_id,
            busy=e.running, speaking=e.active, batch=len(e.scheduler.batch), max_batch=e.max_batch,
            largest_batch=e.largest_batch, waiting=max(e.pending - e.active, 0), served=e.served, auth=self.auth,
        ).model_dump(), 200 if e.alive else 503)

    async def openapi(self, request):
        from .schema import openapi

        voices = self.engine.voices.names()
        if self._openapi is None or self._openapi[0] != voices:  # built again only when the voices changed
            self._openapi = voices, openapi(self.model_id, voices, self.engine.synth.languages, self.auth)
        return _json(self._openapi[1])

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


class AudioResponse:
    """The streamed answer (an ASGI response): the headers, then each encoded chunk as it comes. Every send waits
    at most the reply's `send_timeout` for the client to take it; a client that does not is dropped. An engine
    error after the first audio, a client that left or one dropped: the body is cut off (the connection closes
    with no last chunk), never ended as if complete. `Reply.close` runs however it ends."""

    def __init__(self, reply: Reply, first: tuple, media_type: str):
        self.reply, self.first, self.media_type = reply, first, media_type

    async def __call__(self, scope, receive, send) -> None:
        reply = self.reply
        headers = [(b"content-type", self.media_type.encode()), (b"x-sample-rate", str(SAMPLE_RATE).encode())]
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in reply.chunks(*self.first):
                if not await _send_or_leave(send, {"type": "http.response.body", "body": chunk, "more_body": True},
                                            gone, reply.send_timeout):
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except BrokenStream as e:
            print(f"qtts serve: error while streaming: {e.args[0]!r}", file=sys.stderr)
        finally:
            gone.cancel()
            reply.close()


async def _send_or_leave(send, message: dict, gone: asyncio.Future, timeout: float) -> bool:
    """Send `message`, unless the client has left or takes nothing for `timeout` seconds: whether the client is
    still there to take more."""
    if gone.done():
        return False
    sending = asyncio.ensure_future(send(message))
    done, _ = await asyncio.wait({sending, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if sending in done:
        sending.result()
        return not gone.done()
    sending.cancel()
    if gone not in done:
        print(f"qtts serve: a client took no audio for {timeout:.0f} s: dropped", file=sys.stderr)
    return False


class Gate:
    """ASGI middleware in front of the app: the API key on PROTECTED paths (OpenAI's 401 body), and every answer
    counted by path and status for /metrics."""

    def __init__(self, app, metrics, api_key: str | None):
        self.app, self.metrics = app, metrics
        self.token = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.answered(path, message["status"])
            await send(message)

        if self.token is not None and path.startswith(PROTECTED):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.token):
                from starlette.responses import JSONResponse

                from .schema import RequestError

                why = "a wrong API key" if given else "no API key (Authorization: Bearer KEY)"
                answer = JSONResponse(RequestError(401, f"this server needs its API key; the request sent {why}",
                                                   code="invalid_api_key").body(), status_code=401,
                                      headers={"WWW-Authenticate": "Bearer"})
                return await answer(scope, receive, counted)
        await self.app(scope, receive, counted)


def serve(args) -> int:
    """`qtts serve` (arguments from `add_arguments`)."""
    try:
        import uvicorn
    except ImportError:
        raise InputError("qtts serve needs the serve extra: pip install 'qtts[serve]'") from None
    directory = model_dir(args.checkpoint)
    if args.queue < 0:
        raise InputError(f"--queue must be 0 or more, not {args.queue}")
    if args.voices is not None and not args.voices.is_dir():
        raise InputError(f"--voices {args.voices} is not a directory")
    say = lambda m: print(f"qtts serve: {m}", file=sys.stderr)  # noqa: E731
    synth = load_synthesizer(args, log=say)
    engine = Engine(synth, args.voices, args.max_frames, args.chunk_frames, args.queue, max_batch_of(synth, args, say),
                    budget=args.frame_budget, backlog_seconds=args.backlog, log=say)
    print(f"qtts serve: {directory.name} on http://{args.host}:{args.port} (voices: "
          f"{', '.join(engine.voices.names()) or 'none'})", file=sys.stderr, flush=True)
    try:
        key = api_key_of(args)
        if key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
            say(f"warning: listening on {args.host} with no API key: anyone who can reach it may use it "
                f"(--api-key or ${API_KEY_ENV})")
        connections = args.max_connections or engine.max_batch + engine.queue_places + 32
        uvicorn.run(build_app(engine, directory.name, api_key=key, send_timeout=args.send_timeout), host=args.host,
                    port=args.port, log_level=args.log_level, limit_concurrency=connections)
    finally:
        engine.stop()
    return 0


def api_key_of(args) -> str | None:
    """--api-key, else $QTTS_API_KEY, else None (no key needed); an empty value is no key."""
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def add_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--voices", type=Path, help="folder of NAME.wav voice clips (NAME.txt beside one: ICL)")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait beside the batch; past that, 503")
    add_batch_option(p, "requests")
    p.add_argument("--api-key", help=f"a key clients must send as a bearer token (default ${API_KEY_ENV}; unset: "
                                     "none needed)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.add_argument("--max-connections", type=positive_int, help="connections uvicorn serves at once, past that 503 "
                                                                "(default: max batch + queue + 32)")
    p.add_argument("--send-timeout", type=float, default=SEND_TIMEOUT,
                   help=f"seconds a client may take no audio before it is dropped (default {SEND_TIMEOUT:.0f})")
    p.add_argument("--backlog", type=float, default=BACKLOG_SECONDS,
                   help="seconds of audio a client may leave unread before its text's next segment waits "
                        f"(default {BACKLOG_SECONDS:.0f})")
    add_model_options(p)
    g = p.add_argument_group("generation")
    g.add_argument("--max-frames", type=positive_int, default=600,
                   help="cap on frames per segment (a long input is spoken in segments, each capped by its length too)")
    g.add_argument("--frame-budget", type=positive_int, default=FRAME_BUDGET,
                   help=f"frames a request may take at most, its segments' caps added up (default {FRAME_BUDGET}, "
                        f"{FRAME_BUDGET // 750} minutes); a longer text is refused with a 400")
    g.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")
