"""`qtts serve`: a local speech server speaking OpenAI's speech API, streamed. Introduced in 11.

    qtts serve --checkpoint tiny-base --voices voices/ --port 8000
    curl -sN localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"input": "Hello.", "voice": "alice"}' | ffplay -nodisp -autoexit -

Endpoints: `POST /v1/audio/speech` (`input`, `voice`, `response_format` wav | pcm, optional `language`
and `model`), `GET /v1/models`, `GET /health`. A `voice` is a built-in speaker (CustomVoice checkpoints)
or the name of `<name>.wav` in the voices folder (Base checkpoints: x-vector cloning; with `<name>.txt`
beside it holding the clip's transcript, ICL). Audio is 16-bit PCM at 24 kHz mono, sent piece by piece
as frames are generated (chunked transfer): `pcm` raw, `wav` behind a header of unknown length. A long
`input` is spoken segment by segment with short pauses (`longform.stream_long`, chapter 12), each segment
capped by its own length and by `--max-frames`.

One synthesizer serves one request at a time (ncnn's nets are not shared between threads here, and two
requests at once on a few cores would only be slower each). Requests wait in a FIFO of `queue` places;
past that the answer is 503 at once. Every bad request gets a 4xx with an OpenAI-style JSON error body
before any audio is sent. Built on Starlette + uvicorn (`pip install qtts[serve]`), imported only here.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from .audio import SAMPLE_RATE, AudioError, load_wav
from .longform import stream_long
from .net import release_threads
from .stream import pcm16, wav_header
from .synthesizer import InputError

MAX_INPUT_CHARS = 4096   # OpenAI's limit for `input`
MAX_BODY_BYTES = 64 * 1024
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class Speaker:
    """The synthesizer behind one lock, the voices it has built, and the queue in front of it."""

    def __init__(self, synth, voices_dir: Path | None, max_frames: int, queue: int, chunk_frames: int,
                 context_frames: int | None = None):
        self.synth, self.voices_dir = synth, voices_dir
        self.max_frames, self.queue, self.chunk_frames = max_frames, queue, chunk_frames
        self.context_frames = context_frames
        self.lock = asyncio.Lock()
        self.waiting = 0   # requests holding or waiting for the lock
        self.served = 0
        self.voices: dict = {}

    def voice_names(self) -> list[str]:
        files = sorted(self.voices_dir.glob("*.wav")) if self.voices_dir else []
        return self.synth.speakers + [f.stem for f in files if VOICE_NAME.match(f.stem)]

    def voice(self, name: str):
        """A built `Voice` for `name` (cached); call with the lock held: building runs the encoders."""
        if name in self.voices:
            return self.voices[name]
        if name.lower() in self.synth.speakers:
            voice = self.synth.voice(speaker=name.lower())
        else:
            clip = self.voices_dir / f"{name}.wav"
            transcript = clip.with_suffix(".txt")
            text = transcript.read_text(encoding="utf-8").strip() if transcript.is_file() else None
            voice = self.synth.voice(wav=load_wav(clip, strict=True, quiet=True), text=text or None)
        self.voices[name] = voice
        return voice

    def parse(self, body: bytes) -> dict:
        """The request's fields, validated; a `RequestError` (4xx) for anything wrong."""
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise RequestError(400, "the body is not JSON") from None
        if not isinstance(req, dict):
            raise RequestError(400, "the body must be a JSON object")
        text = req.get("input")
        if not isinstance(text, str) or not text.strip():
            raise RequestError(400, "`input` must be a non-empty string", "input")
        if len(text) > MAX_INPUT_CHARS:
            raise RequestError(400, f"`input` is over {MAX_INPUT_CHARS} characters", "input")
        fmt = req.get("response_format", "wav")
        if fmt not in FORMATS:
            raise RequestError(400, f"response_format {fmt!r} is not supported; use one of {', '.join(FORMATS)}",
                               "response_format")
        language = req.get("language", "auto")
        if not isinstance(language, str) or language.lower() not in self.synth.languages:
            raise RequestError(400, f"unknown language {language!r}; valid: {', '.join(self.synth.languages)}",
                               "language")
        speed = req.get("speed", 1.0)
        if speed != 1.0 and speed != 1:
            raise RequestError(400, "only speed 1.0 is supported", "speed")
        name = req.get("voice")
        valid = self.voice_names()
        if not isinstance(name, str) or not VOICE_NAME.match(name) or (
                name not in valid and name.lower() not in self.synth.speakers):
            raise RequestError(400, f"unknown voice {name!r}; valid: {', '.join(valid) or '(none: pass --voices DIR)'}",
                               "voice")
        return {"text": text, "format": fmt, "language": language.lower(), "voice": name}


def build_app(speaker: Speaker, model_id: str):
    """The Starlette app over one `Speaker`."""
    from anyio import CancelScope, to_thread
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    synth = speaker.synth

    class Stream(StreamingResponse):
        """A streamed answer that hands the synthesizer back however it ends (done, client gone, error)."""

        def __init__(self, content, media_type: str, cleanup):
            super().__init__(content, media_type=media_type, headers={"X-Sample-Rate": str(SAMPLE_RATE)})
            self.cleanup = cleanup

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                await self.cleanup()

    async def speech(request):
        try:
            req = speaker.parse(await request.body())
        except RequestError as e:
            return JSONResponse(error_body(e.message, e.param), status_code=e.status)
        if speaker.waiting > speaker.queue:  # one running + `queue` waiting
            return JSONResponse(error_body(f"server busy: {speaker.queue} requests already queued; retry later",
                                           kind="server_busy"), status_code=503)
        speaker.waiting += 1
        try:
            await speaker.lock.acquire()
        except BaseException:  # the client left while queued
            speaker.waiting -= 1
            raise
        pieces, held = None, True

        async def cleanup():
            nonlocal pieces, held
            if pieces is not None:
                with CancelScope(shield=True):
                    await to_thread.run_sync(pieces.close)  # stops the loop at its next frame
                pieces = None
            if held:
                held = False
                speaker.lock.release()
                speaker.waiting -= 1

        def start():
            try:
                voice = speaker.voice(req["voice"])
                # a long input is spoken segment by segment (chapter 12), each segment streamed as it is generated
                stream = stream_long(synth, req["text"], req["language"], voice, max_frames=speaker.max_frames,
                                     chunk_frames=speaker.chunk_frames, context_frames=speaker.context_frames)
                return stream, next(stream, None)  # errors in the prompt surface here, before any audio
            finally:
                release_threads()  # the stream's worker does the ncnn work from here on (runtime.net says why)

        try:
            pieces, first = await to_thread.run_sync(start)
        except (InputError, AudioError) as e:
            await cleanup()
            return JSONResponse(error_body(str(e), "voice" if isinstance(e, AudioError) else None), status_code=400)
        except BaseException:
            await cleanup()
            raise

        async def body():
            if req["format"] == "wav":
                yield wav_header()
            piece = first
            while piece is not None:
                yield pcm16(piece)
                piece = await to_thread.run_sync(next, pieces, None)
            speaker.served += 1
            await cleanup()  # free the speaker before the response's last chunk: a client that sends its next
            #                  request as soon as this one ends must find the server free (not 503)

        return Stream(body(), FORMATS[req["format"]], cleanup)

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": 0, "owned_by": "qtts"}]})

    async def health(request):
        return JSONResponse({"status": "ok", "model": model_id, "busy": speaker.lock.locked(),
                             "waiting": speaker.waiting, "served": speaker.served})

    async def http_error(request, exc):
        return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code)

    async def server_error(request, exc):
        print(f"qtts serve: error: {exc!r}", file=sys.stderr)
        return JSONResponse(error_body("internal error", kind="server_error"), status_code=500)

    routes = [Route("/v1/audio/speech", speech, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


def serve(args) -> int:
    """`qtts serve` (arguments from `add_arguments`)."""
    try:
        import uvicorn
    except ImportError:
        raise InputError("qtts serve needs the serve extra: pip install 'qtts[serve]'") from None
    from .cli import model_dir
    from .synthesizer import Synthesizer

    directory = model_dir(args.checkpoint)
    if args.queue < 0:
        raise InputError(f"--queue must be 0 or more, not {args.queue}")
    if args.voices is not None and not args.voices.is_dir():
        raise InputError(f"--voices {args.voices} is not a directory")
    if args.codec_process and args.context_frames is not None:
        raise InputError("--context-frames re-decodes each piece in this process; it cannot be combined with "
                         "--codec-process")
    synth = Synthesizer(directory, threads=args.threads, device=args.device, precision=args.precision,
                        log=lambda m: print(f"qtts serve: {m}", file=sys.stderr), codec_process=args.codec_process)
    speaker = Speaker(synth, args.voices, args.max_frames, args.queue, args.chunk_frames, args.context_frames)
    release_threads()  # loading ran ncnn here; requests run it in other threads
    print(f"qtts serve: {directory.name} on http://{args.host}:{args.port} (voices: "
          f"{', '.join(speaker.voice_names()) or 'none'})", file=sys.stderr, flush=True)
    uvicorn.run(build_app(speaker, directory.name), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_arguments(p, positive_int) -> None:
    p.add_argument("--checkpoint", default="tiny-base",
                   help="checkpoint directory, or a name under $QTTS_MODELS or ./models")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--voices", type=Path, help="folder of NAME.wav voice clips (NAME.txt beside one: ICL)")
    p.add_argument("--max-frames", type=positive_int, default=600,
                   help="cap on frames per segment (a long input is spoken in segments, each capped by its length too)")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait; past that, 503")
    p.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece")
    p.add_argument("--context-frames", type=positive_int,
                   help="re-decode each piece with this many frames of left context (default: decode every frame "
                        "once on the CPU, exact; chapter 11)")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, vulkan or vulkan:N")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "int8"],
                   help="weights of the talker and code predictor (chapter 10); fp32 is exact")
    p.add_argument("--codec-process", action="store_true",
                   help="decode in a second process on one more core while --threads generate (CPU only; chapter 10)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
