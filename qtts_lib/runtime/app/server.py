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
`<name>.txt` beside it holding the clip's transcript, ICL). Audio is 24 kHz mono, encoded piece by piece as frames
are generated and sent as it is encoded (chunked transfer, `audio.encode.Encoder`): `pcm` raw 16-bit, `wav` behind
a header of unknown length, mp3, Ogg Opus, ADTS AAC and FLAC through FFmpeg. A long `input` is spoken segment by
segment with short pauses (`pipeline.longform.stream_long`, chapter 15), each segment capped by its own length and
by `--max-frames`.

One thread runs every piece of ncnn work (`Engine`): OpenMP keeps a worker pool per thread that ran ncnn, so ncnn
called from whichever thread the event loop lends would starve on a machine with few cores (chapter 14). Up to
`--max-batch` requests are decoded together in one batch (`pipeline.synthesizer.Scheduler`, chapter 16): each
frame's graph calls serve all of them, a request joins between two frames and leaves the frame it ends, and each
response still streams as its own frames come. More wait in a FIFO of `--queue` places; past that the answer is
503 at once. `/health` shows the batch in flight. Every bad request gets a 4xx with an OpenAI-style JSON error body
before any audio is sent. With `--api-key` (or $QTTS_API_KEY) every /v1/ request and /metrics need
`Authorization: Bearer KEY` (what OpenAI's clients send), else 401. Built on Starlette + uvicorn, pydantic,
prometheus_client and PyAV (`pip install qtts[serve]`), imported only when serving.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
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
from ..pipeline.longform import LongText
from ..pipeline.synthesizer import DEFAULT_MAX_BATCH, Scheduler
from .options import add_batch_option, add_model_options, load_synthesizer, max_batch_of, model_dir, positive_int

MAX_BODY_BYTES = 64 * 1024
DESIGNED = "design"  # a VoiceDesign checkpoint's one voice: the one its `instructions` describe
API_KEY_ENV = "QTTS_API_KEY"
PROTECTED = ("/v1/", "/metrics")  # what --api-key guards; the page, /health and /openapi.json stay open
STATIC = Path(__file__).parent / "static"


class RequestError(Exception):
    """A request the server refuses: its HTTP status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class Job:
    """One request on its way through the engine: `start()` (run on the engine thread) gives its `LongText`;
    what comes out (pieces, then the end, or an error) is put on `out` through the event loop."""

    def __init__(self, start: Callable, loop: asyncio.AbstractEventLoop):
        self.start, self.loop = start, loop
        self.out: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def send(self, kind: str, value=None) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, (kind, value))


class Engine:
    """The synthesizer behind the one thread that runs ncnn, its scheduler (the batch), the voices it has built
    and the queue in front of it."""

    def __init__(self, synth, voices_dir: Path | None, max_frames: int, chunk_frames: int, queue_places: int,
                 max_batch: int = DEFAULT_MAX_BATCH):
        self.synth, self.voices_dir = synth, voices_dir
        self.max_frames, self.chunk_frames, self.queue_places = max_frames, chunk_frames, queue_places
        self.scheduler = Scheduler(synth, max_batch)
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.pending = 0   # jobs queued or running (changed on the event loop only)
        self.active = 0    # requests the engine is speaking (their segments running or waiting in the scheduler)
        self.largest_batch = 0
        self.served = 0
        self.on_step: Callable[[int], None] | None = None  # told each step's batch size (the metrics), on this thread
        self.voices: dict = {}
        release_threads()  # loading ran ncnn in this thread; from now on only the engine's thread does
        self.thread = threading.Thread(target=self._work, name="qtts-engine", daemon=True)
        self.thread.start()

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def running(self) -> bool:
        return self.active > 0

    # ------------------------------------------------------------ voices
    def voice_names(self) -> list[str]:
        from .schema import VOICE_PATTERN

        if self.synth.kind == "voice_design":
            return [DESIGNED]
        files = sorted(self.voices_dir.glob("*.wav")) if self.voices_dir else []
        return self.synth.speakers + [f.stem for f in files if re.match(VOICE_PATTERN, f.stem)]

    def voice(self, name: str, instructions: str | None = None):
        """A built `Voice` for `name` (cached) with the request's `instructions`; on the engine thread: building runs
        the encoders."""
        if self.synth.kind == "voice_design":
            return self.synth.voice(instruct=instructions)
        if name not in self.voices:
            if name.lower() in self.synth.speakers:
                self.voices[name] = self.synth.voice(speaker=name.lower())
            else:
                clip = self.voices_dir / f"{name}.wav"
                transcript = clip.with_suffix(".txt")
                text = transcript.read_text(encoding="utf-8").strip() if transcript.is_file() else None
                self.voices[name] = self.synth.voice(wav=load_wav(clip, strict=True, quiet=True), text=text or None)
        return dataclasses.replace(self.voices[name], instruct=instructions) if instructions else self.voices[name]

    # ------------------------------------------------------------ the engine thread
    def _work(self) -> None:
        speaking: dict[Job, object] = {}   # job -> its LongText
        while True:
            # new requests: wait for one when idle, else take what has come without waiting
            incoming = []
            try:
                incoming.append(self.jobs.get(block=not speaking))
                while True:
                    incoming.append(self.jobs.get_nowait())
            except queue.Empty:
                pass
            if None in incoming:
                for job, long in speaking.items():
                    long.cancel()
                    job.send("done")
                return
            for job in incoming:
                if job.cancelled.is_set():
                    job.send("done")
                    continue
                try:
                    speaking[job] = job.start()
                    job.send("started")
                except (InputError, AudioError) as e:
                    job.send("refused", e)
                except BaseException as e:  # noqa: BLE001 - handed to the request, answered there
                    job.send("error", e)
            for job in [j for j in speaking if j.cancelled.is_set()]:  # the client left
                speaking.pop(job).cancel()
                self.active = len(speaking)
                job.send("done")
            self.active = len(speaking)
            if not speaking:
                continue
            try:
                events = self.scheduler.step()
            except BaseException as e:  # noqa: BLE001 - every request in the batch is told
                failed = list(speaking.items())
                speaking.clear()
                self.active = 0  # before the clients hear of it, as below
                for job, long in failed:
                    long.cancel()
                    job.send("error", e)
                continue
            self.largest_batch = max(self.largest_batch, len(events))  # one event per utterance in the batch
            if self.on_step is not None:
                self.on_step(len(events))
            for job, long in list(speaking.items()):
                for piece in long.take(events):
                    job.send("audio", piece)
                if long.done:  # not counted as speaking once its client can hear it is done (`/health`)
                    del speaking[job]
                    self.active = len(speaking)
                    job.send("done")

    def submit(self, start: Callable) -> Job:
        job = Job(start, asyncio.get_running_loop())
        self.pending += 1
        self.jobs.put(job)
        return job

    def stop(self) -> None:
        self.jobs.put(None)

    # ------------------------------------------------------------ requests
    def parse(self, body: bytes, model_id: str) -> dict:
        """The request's fields, validated (`schema.SpeechRequest`, then what depends on the checkpoint); a
        `RequestError` (4xx) for anything wrong."""
        from pydantic import ValidationError

        from .schema import OPENAI_MODELS, SAMPLING_FIELDS, SpeechRequest, first_error

        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            obj = json.loads(body)
        except RecursionError:
            raise RequestError(400, "the body is nested too deeply to be a speech request") from None
        except (ValueError, UnicodeDecodeError):
            raise RequestError(400, "the body is not JSON") from None
        if not isinstance(obj, dict):
            raise RequestError(400, "the body must be a JSON object")
        try:
            req = SpeechRequest.model_validate(obj)
        except ValidationError as e:
            raise RequestError(400, *first_error(e)) from None
        if req.model is not None and req.model not in (model_id, *OPENAI_MODELS):
            raise RequestError(404, f"the model {req.model!r} does not exist here; this server speaks {model_id!r} "
                                    f"(also accepted: {', '.join(OPENAI_MODELS)})", "model", code="model_not_found")
        instructions = (req.instructions or "").strip() or None
        if instructions and not self.synth.follows_instructions:
            size = self.synth.config.config.get("tts_model_size")
            raise RequestError(400, f"this checkpoint ({self.synth.kind}, {size}) cannot follow `instructions`: "
                                    "Base checkpoints clone a voice and 0.6B "
                                    "CustomVoice ones ignore style prompts; the 1.7B CustomVoice and VoiceDesign "
                                    "checkpoints follow them", "instructions")
        if req.language.lower() not in self.synth.languages:
            raise RequestError(400, f"unknown language {_shown(req.language)}; valid: "
                                    f"{', '.join(self.synth.languages)}", "language")
        valid = self.voice_names()
        if req.voice not in valid and req.voice.lower() not in self.synth.speakers:
            raise RequestError(400, f"unknown voice {_shown(req.voice)}; valid: "
                                    f"{', '.join(valid) or '(none: pass --voices DIR)'}", "voice")
        given = {k: getattr(req, k) for k in SAMPLING_FIELDS if getattr(req, k) is not None}
        try:
            sampling = self.synth.sampling.replace(**given)
        except InputError as e:
            raise RequestError(400, str(e), next(iter(given), None)) from None
        return {"text": req.input, "format": req.response_format, "language": req.language.lower(),
                "voice": req.voice, "sampling": sampling, "instructions": instructions}

    def speak(self, req: dict) -> LongText:
        """What the engine runs for a request (on its thread): the voice, then its text's segments one after
        another on the shared scheduler, streamed in pieces (bad input raises here, before any audio)."""
        voice = self.voice(req["voice"], req["instructions"])
        return LongText(self.synth, self.scheduler, req["text"], req["language"], voice, req["sampling"],
                        max_frames=self.max_frames, chunk_frames=self.chunk_frames)


def _shown(v) -> str:
    """A value for an error message, short and printable whatever it is."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def build_app(engine: Engine, model_id: str, api_key: str | None = None):
    """The Starlette app over one `Engine`; with `api_key`, the PROTECTED paths need it as a bearer token."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from . import schema
    from .metrics import Metrics

    metrics = Metrics(engine)
    engine.on_step = metrics.batch_size.observe
    page = (STATIC / "index.html").read_text(encoding="utf-8")

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def speech(request):
        received = time.monotonic()
        try:
            req = engine.parse(await request.body(), model_id)
        except RequestError as e:
            return error(e)
        if engine.pending >= engine.max_batch + engine.queue_places:  # a full batch + `queue` waiting
            return error(RequestError(503, f"server busy: {engine.max_batch} requests speaking and "
                                           f"{engine.queue_places} queued; retry later", kind="server_error",
                                      code="overloaded"))
        job = engine.submit(lambda: engine.speak(req))
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                job.cancelled.set()
                engine.pending -= 1

        try:
            kind, value = await job.out.get()
            while kind == "started":
                kind, value = await job.out.get()
        except BaseException:  # the client left while queued
            end()
            raise
        if kind == "refused":
            end()
            return error(RequestError(400, str(value), "voice" if isinstance(value, AudioError) else None))
        if kind == "error":
            end()
            raise value
        fmt = req["format"]
        try:
            encoder = Encoder(fmt)
        except InputError as e:  # PyAV missing: the server was installed without the serve extra
            end()
            return error(RequestError(501, str(e), "response_format", kind="server_error"))

        async def body():
            nonlocal kind, value
            outcome = "abandoned"  # unless the stream reaches its end or fails: the client hung up
            try:
                first = True
                while kind == "audio":
                    chunk = encoder.write(value)
                    if chunk:
                        if first:
                            metrics.time_to_first_audio.observe(time.monotonic() - received)
                            first = False
                        yield chunk
                    kind, value = await job.out.get()
                if kind == "error":
                    outcome = "error"
                    print(f"qtts serve: error while streaming: {value!r}", file=sys.stderr)
                    return
                rest = encoder.close()
                outcome = "done"
                engine.served += 1
                audio_s = encoder.samples / SAMPLE_RATE
                metrics.audio_seconds.inc(audio_s)
                if audio_s > 0:
                    metrics.real_time_factor.observe((time.monotonic() - received) / audio_s)
                end()  # before the last chunk goes out: the client's next request finds the server free
                if rest:
                    yield rest
            finally:
                end()
                if outcome != "done":
                    encoder.discard()
                metrics.streams.labels(fmt, outcome).inc()

        return StreamingResponse(body(), media_type=FORMATS[fmt].content_type,
                                 headers={"X-Sample-Rate": str(SAMPLE_RATE)})

    def capabilities() -> schema.ModelCapabilities:
        s = engine.synth
        return schema.ModelCapabilities(kind=s.kind, clone=s.kind == "base", speakers=s.speakers,
                                        languages=s.languages, voices=engine.voice_names(),
                                        instructions=s.follows_instructions, formats=list(FORMATS),
                                        aliases=list(schema.OPENAI_MODELS))

    async def models(request):
        listed = schema.ModelList(data=[schema.Model(id=model_id, qtts=capabilities())])
        return JSONResponse(listed.model_dump())

    async def health(request):
        return JSONResponse(schema.Health(
            model=model_id, busy=engine.running, speaking=engine.active, batch=len(engine.scheduler.batch),
            max_batch=engine.max_batch, largest_batch=engine.largest_batch,
            waiting=max(engine.pending - engine.active, 0), served=engine.served, auth=api_key is not None,
        ).model_dump())

    async def openapi(request):
        return JSONResponse(schema.openapi(model_id, engine.voice_names(), engine.synth.languages,
                                           api_key is not None))

    async def scrape(request):
        text, content_type = metrics.scrape()
        return Response(text, media_type=content_type)

    async def index(request):
        return HTMLResponse(page)

    async def http_error(request, exc):
        return JSONResponse({"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None,
                                       "code": None}}, status_code=exc.status_code)

    async def server_error(request, exc):
        print(f"qtts serve: error: {exc!r}", file=sys.stderr)
        return JSONResponse({"error": {"message": "internal error", "type": "server_error", "param": None,
                                       "code": None}}, status_code=500)

    routes = [Route("/v1/audio/speech", speech, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]), Route("/metrics", scrape, methods=["GET"]),
              Route("/openapi.json", openapi, methods=["GET"]), Route("/", index, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    return Gate(app, metrics, api_key)


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
    synth = load_synthesizer(args, log=lambda m: print(f"qtts serve: {m}", file=sys.stderr))
    say = lambda m: print(f"qtts serve: {m}", file=sys.stderr)  # noqa: E731
    engine = Engine(synth, args.voices, args.max_frames, args.chunk_frames, args.queue, max_batch_of(synth, args, say))
    print(f"qtts serve: {directory.name} on http://{args.host}:{args.port} (voices: "
          f"{', '.join(engine.voice_names()) or 'none'})", file=sys.stderr, flush=True)
    try:
        key = api_key_of(args)
        if key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
            say(f"warning: listening on {args.host} with no API key: anyone who can reach it may use it "
                f"(--api-key or ${API_KEY_ENV})")
        uvicorn.run(build_app(engine, directory.name, api_key=key), host=args.host, port=args.port,
                    log_level=args.log_level)
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
    add_model_options(p)
    g = p.add_argument_group("generation")
    g.add_argument("--max-frames", type=positive_int, default=600,
                   help="cap on frames per segment (a long input is spoken in segments, each capped by its length too)")
    g.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")

