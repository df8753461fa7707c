"""`qtts serve`: a local speech server speaking OpenAI's speech API, streamed. Introduced in 11.

    qtts serve --checkpoint tiny-base --voices voices/ --port 8000
    curl -sN localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"input": "Hello.", "voice": "alice"}' | ffplay -nodisp -autoexit -

Endpoints: `POST /v1/audio/speech`, `GET /v1/models`, `GET /health`. The request's fields (`REQUEST_FIELDS`):
`input`, `voice`, optional `model`, `response_format` (wav | pcm), `speed` (1.0 only), `language`, `instructions`
(OpenAI's style prompt: a style for a built-in speaker on a 1.7B CustomVoice checkpoint, the voice itself on a
VoiceDesign one, whose one voice is `design`; refused with a 400 where the checkpoint cannot follow it), and the
sampling
parameters of `pipeline.sampling.Sampling` (`temperature`, `top_k`, `top_p`, `repetition_penalty`, `seed`,
`greedy`); missing ones take the checkpoint's generation_config, so the server samples as the reference does. A
`voice` is a built-in speaker (CustomVoice checkpoints) or the name of `<name>.wav` in the voices folder (Base
checkpoints: x-vector cloning; with `<name>.txt` beside it holding the clip's transcript, ICL). Audio is 16-bit PCM
at 24 kHz mono, sent piece by piece as frames are generated (chunked transfer): `pcm` raw, `wav` behind a header of
unknown length. A long `input` is spoken segment by segment with short pauses (`pipeline.longform.stream_long`,
chapter 12), each segment capped by its own length and by `--max-frames`.

One thread runs every piece of ncnn work (`Engine`): OpenMP keeps a worker pool per thread that ran ncnn, so ncnn
called from whichever thread the event loop lends would starve on a machine with few cores (chapter 11). Up to
`--max-batch` requests are decoded together in one batch (`pipeline.synthesizer.Scheduler`, chapter 14): each
frame's graph calls serve all of them, a request joins between two frames and leaves the frame it ends, and each
response still streams as its own frames come. More wait in a FIFO of `--queue` places; past that the answer is
503 at once. `/health` shows the batch in flight. Every bad request gets a
4xx with an OpenAI-style JSON error body before any audio is sent. Built on Starlette + uvicorn
(`pip install qtts[serve]`), imported only when serving.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import queue
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ..audio.wav import SAMPLE_RATE, load_wav, pcm16, wav_header
from ..binding.net import release_threads
from ..errors import AudioError, InputError
from ..pipeline.longform import LongText
from ..pipeline.synthesizer import DEFAULT_MAX_BATCH, Scheduler
from .options import add_batch_option, add_model_options, load_synthesizer, max_batch_of, model_dir, positive_int

MAX_INPUT_CHARS = 4096   # OpenAI's limit for `input`
MAX_BODY_BYTES = 64 * 1024
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DESIGNED = "design"  # a VoiceDesign checkpoint's one voice: the one its `instructions` describe
MAX_INSTRUCTIONS_CHARS = 4096
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # what OpenAI clients send: all mean the loaded model
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "greedy")
REQUEST_FIELDS = ("model", "input", "voice", "response_format", "speed", "language", "instructions",
                  "stream_format") + SAMPLING_FIELDS


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
        if self.synth.kind == "voice_design":
            return [DESIGNED]
        files = sorted(self.voices_dir.glob("*.wav")) if self.voices_dir else []
        return self.synth.speakers + [f.stem for f in files if VOICE_NAME.match(f.stem)]

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
                job.send("done")
            self.active = len(speaking)
            if not speaking:
                continue
            try:
                events = self.scheduler.step()
            except BaseException as e:  # noqa: BLE001 - every request in the batch is told
                for job, long in speaking.items():
                    long.cancel()
                    job.send("error", e)
                speaking.clear()
                self.active = 0
                continue
            self.largest_batch = max(self.largest_batch, len(events))  # one event per utterance in the batch
            for job, long in list(speaking.items()):
                for piece in long.take(events):
                    job.send("audio", piece)
                if long.done:
                    del speaking[job]
                    job.send("done")
            self.active = len(speaking)

    def submit(self, start: Callable) -> Job:
        job = Job(start, asyncio.get_running_loop())
        self.pending += 1
        self.jobs.put(job)
        return job

    def stop(self) -> None:
        self.jobs.put(None)

    # ------------------------------------------------------------ requests
    def parse(self, body: bytes, model_id: str) -> dict:
        """The request's fields, validated; a `RequestError` (4xx) for anything wrong."""
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            req = json.loads(body)
        except RecursionError:
            raise RequestError(400, "the body is nested too deeply to be a speech request") from None
        except (ValueError, UnicodeDecodeError):
            raise RequestError(400, "the body is not JSON") from None
        if not isinstance(req, dict):
            raise RequestError(400, "the body must be a JSON object")
        unknown = sorted(k for k in req if k not in REQUEST_FIELDS)
        if unknown:
            raise RequestError(400, f"unrecognized request argument(s): {', '.join(map(repr, unknown))}; valid: "
                                    f"{', '.join(REQUEST_FIELDS)}", unknown[0])
        model = req.get("model")
        if model is not None and model not in (model_id, *OPENAI_MODELS):
            raise RequestError(404, f"the model {model!r} does not exist here; this server speaks {model_id!r} "
                                    f"(also accepted: {', '.join(OPENAI_MODELS)})", "model", code="model_not_found")
        text = req.get("input")
        if not isinstance(text, str) or not text.strip():
            raise RequestError(400, "`input` must be a non-empty string", "input")
        if len(text) > MAX_INPUT_CHARS:
            raise RequestError(400, f"`input` is over {MAX_INPUT_CHARS} characters", "input")
        if not _is_text(text):
            raise RequestError(400, "`input` is not valid Unicode text (it holds a lone surrogate)", "input")
        instructions = req.get("instructions")
        if instructions is not None and (not isinstance(instructions, str) or not _is_text(instructions)
                                         or len(instructions) > MAX_INSTRUCTIONS_CHARS):
            raise RequestError(400, f"`instructions` must be text of at most {MAX_INSTRUCTIONS_CHARS} characters",
                               "instructions")
        if instructions and instructions.strip() and not self.synth.follows_instructions:
            size = self.synth.config.config.get("tts_model_size")
            raise RequestError(400, f"this checkpoint ({self.synth.kind}, {size}) cannot follow `instructions`: "
                                    "Base checkpoints clone a voice and 0.6B "
                                    "CustomVoice ones ignore style prompts; the 1.7B CustomVoice and VoiceDesign "
                                    "checkpoints follow them", "instructions")
        fmt = req.get("response_format", "wav")
        if not isinstance(fmt, str) or fmt not in FORMATS:
            raise RequestError(400, f"response_format {_shown(fmt)} is not supported; use one of {', '.join(FORMATS)}",
                               "response_format")
        if req.get("stream_format", "audio") != "audio":
            raise RequestError(400, "only stream_format 'audio' is supported", "stream_format")
        language = req.get("language", "auto")
        if not isinstance(language, str) or not _is_text(language) or language.lower() not in self.synth.languages:
            raise RequestError(400, f"unknown language {_shown(language)}; valid: {', '.join(self.synth.languages)}",
                               "language")
        speed = req.get("speed", 1.0)
        if not _number(speed) or speed != 1.0:
            raise RequestError(400, "only speed 1.0 is supported", "speed")
        name = req.get("voice")
        valid = self.voice_names()
        if not isinstance(name, str) or not VOICE_NAME.match(name) or (
                name not in valid and name.lower() not in self.synth.speakers):
            raise RequestError(400, f"unknown voice {_shown(name)}; valid: "
                                    f"{', '.join(valid) or '(none: pass --voices DIR)'}", "voice")
        given = {k: req[k] for k in SAMPLING_FIELDS if req.get(k) is not None}
        for k, v in given.items():
            if k == "greedy" and not isinstance(v, bool):
                raise RequestError(400, f"`greedy` must be true or false, not {_shown(v)}", k)
            if k != "greedy" and not _number(v):
                raise RequestError(400, f"`{k}` must be a number, not {_shown(v)}", k)
            if k in ("top_k", "seed") and not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
                raise RequestError(400, f"`{k}` must be a whole number, not {_shown(v)}", k)
        given = {k: int(v) if k in ("top_k", "seed") else v for k, v in given.items()}
        try:
            sampling = self.synth.sampling.replace(**given)
        except InputError as e:
            raise RequestError(400, str(e), next(iter(given), None)) from None
        return {"text": text, "format": fmt, "language": language.lower(), "voice": name, "sampling": sampling,
                "instructions": (instructions or "").strip() or None}

    def speak(self, req: dict) -> LongText:
        """What the engine runs for a request (on its thread): the voice, then its text's segments one after
        another on the shared scheduler, streamed in pieces (bad input raises here, before any audio)."""
        voice = self.voice(req["voice"], req["instructions"])
        return LongText(self.synth, self.scheduler, req["text"], req["language"], voice, req["sampling"],
                        max_frames=self.max_frames, chunk_frames=self.chunk_frames)


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _shown(v) -> str:
    """A value for an error message, short and printable whatever it is."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def build_app(engine: Engine, model_id: str):
    """The Starlette app over one `Engine`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def speech(request):
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

        async def body():
            nonlocal kind, value
            try:
                if req["format"] == "wav":
                    yield wav_header()
                while kind == "audio":
                    yield pcm16(value)
                    kind, value = await job.out.get()
                if kind == "error":
                    print(f"qtts serve: error while streaming: {value!r}", file=sys.stderr)
                    return
                engine.served += 1
            finally:
                end()  # before the last chunk goes out: the client's next request finds the server free

        return StreamingResponse(body(), media_type=FORMATS[req["format"]],
                                 headers={"X-Sample-Rate": str(SAMPLE_RATE)})

    async def models(request):
        s = engine.synth
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": 0, "owned_by": "qtts",
             "qtts": {"kind": s.kind, "clone": s.kind == "base", "speakers": s.speakers, "languages": s.languages,
                      "voices": engine.voice_names(), "instructions": s.follows_instructions,
                      "formats": list(FORMATS),
                      "aliases": list(OPENAI_MODELS)}}]})

    async def health(request):
        batch = len(engine.scheduler.batch)
        return JSONResponse({"status": "ok", "model": model_id, "busy": engine.running,
                             "speaking": engine.active, "batch": batch, "max_batch": engine.max_batch,
                             "largest_batch": engine.largest_batch,
                             "waiting": max(engine.pending - engine.active, 0), "served": engine.served})

    async def http_error(request, exc):
        return JSONResponse({"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None,
                                       "code": None}}, status_code=exc.status_code)

    async def server_error(request, exc):
        print(f"qtts serve: error: {exc!r}", file=sys.stderr)
        return JSONResponse({"error": {"message": "internal error", "type": "server_error", "param": None,
                                       "code": None}}, status_code=500)

    routes = [Route("/v1/audio/speech", speech, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


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
        uvicorn.run(build_app(engine, directory.name), host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.stop()
    return 0


def add_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--voices", type=Path, help="folder of NAME.wav voice clips (NAME.txt beside one: ICL)")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait beside the batch; past that, 503")
    add_batch_option(p, "requests")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    add_model_options(p)
    g = p.add_argument_group("generation")
    g.add_argument("--max-frames", type=positive_int, default=600,
                   help="cap on frames per segment (a long input is spoken in segments, each capped by its length too)")
    g.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")

