"""`qtts serve`: a local speech server speaking OpenAI's speech API, streamed. Introduced in 18.

    qtts serve --checkpoint tiny-base --voices voices/ --port 8000
    curl -sN localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"input": "Hello.", "voice": "alice"}' | ffplay -nodisp -autoexit -

Endpoints: `POST /v1/audio/speech`, `GET /v1/models`, `GET|POST /v1/voices`, `DELETE /v1/voices/{name}`, OpenAI's custom
voices (`GET|POST /v1/audio/voices`, `DELETE /v1/audio/voices/{voice_id}`, `GET|POST /v1/audio/voice_consents`,
`GET|POST|DELETE /v1/audio/voice_consents/{consent_id}`), `GET /health`, `GET /metrics` (Prometheus, `metrics`), `GET
/openapi.json` (the API as data, `openapi`) and `GET /`, a page to try the voices and add one (`static/`). The request
is `schema.SpeechRequest`: `input`, `voice`, optional `model`, `response_format` (mp3, the default as OpenAI's | opus |
aac | flac | wav | pcm), `stream_format` (audio | sse), `speed` (0.25 to 4.0: the tempo, at the same pitch,
`audio.tempo`), `language`, `instructions` (OpenAI's style prompt: a style for a built-in speaker on a 1.7B CustomVoice
checkpoint, the voice itself on a VoiceDesign one, whose one voice is `design`; refused with a 400 where the checkpoint
cannot follow it), and the sampling parameters of `pipeline.sampling.Sampling` (`temperature`, `top_k`, `top_p`,
`repetition_penalty`, `seed`, `greedy`); missing ones take the checkpoint's generation_config, so the server samples as
the reference does. Without a `seed` every request draws a fresh one, and every answer says the seed it used in its
`X-Seed` header: a request with that seed gives the same audio again, bit for bit when it runs alone (batched beside
other requests, to float rounding, which now and then flips a sampled code: chapter 17; greedy decoding needs no seed
and says 0).

A `voice` is a built-in speaker (CustomVoice checkpoints) or the name of `<name>.wav` in the voices folder (Base
checkpoints: x-vector cloning; with `<name>.txt` beside it holding the clip's transcript, ICL), given as the name or
as OpenAI's custom-voice object `{"id": name}`; `Voices` holds them all, each built once. On a Base checkpoint
`POST /v1/voices` (a form: `name`, the clip file `audio`, its transcript `text` if any) adds one while the server
runs: the clip passes `audio.clips`'s checks (a 400 that says why not), its voice is built off the engine's thread
and saved in the folder, so a restart finds it; `DELETE` removes it. OpenAI's SDK adds one the same way
(`client.audio.voices.create`: the form's `name`, clip `audio_sample` and `consent`, the id of a consent recording
uploaded first through `client.audio.voice_consents`, which `Consents` keeps in the folder's `consents/`, else in
memory); such a voice also gets an OpenAI id, `voice_...`, kept in `<name>.json` beside its clip, and
`{"id": "voice_..."}` names it in a speech request as its name does. Voices from a prompt (`type: "prompt"`) are
refused. On CustomVoice and VoiceDesign checkpoints every endpoint that adds or removes voices or consents answers a
400 (`cannot_clone`). OpenAI's voice names (alloy, ash, ...) speak a voice the server has: `--voice-alias
alloy=NAME`, else the default voice (`--default-voice`, else the first voice in the folder in name order, else the
checkpoint's first built-in speaker), unless a voice of that name exists; `GET /v1/audio/voices` lists every voice
with the names that speak it. A request may instead bring its own clip, `ref_audio` (a file in base64, or a `data:`
URI) with its transcript `ref_text` for ICL (Base checkpoints; the others have no speaker encoder and refuse it):
checked as an upload is, and its voice built once, cached by the clip's hash (`refs.RefVoices`).

Audio is 24 kHz mono, encoded piece by piece as frames are generated (on FFmpeg's own threads, off the event loop:
`reply.ENCODING`) and sent as it is encoded (chunked transfer, `audio.encode.Encoder`): `pcm` raw 16-bit, `wav` behind a
header of unknown length, mp3, Ogg Opus, ADTS AAC and FLAC through FFmpeg. With `stream_format: "sse"` the same bytes
come as OpenAI's server-sent events: a `speech.audio.delta` event per chunk (its bytes in base64, in any
response_format), then `speech.audio.done` with the usage (the input's text tokens, the audio frames generated). A long
`input` is spoken segment by segment with short pauses (`pipeline.longform.LongText`, chapter 16), each segment capped
by its own length and by `--max-frames`.

The server is three parts, each its own module: the engine (`engine.Engine`: the one thread that runs ncnn, the
batch, long texts, backlog, deadlines and the watchdog; its whole surface is `speak` and `status`), the voice store
(`voices`: every file under `--voices`, the voices a request may name, the consent recordings) and the HTTP layer
(`http`: the routes and the key, which talks only to those two; a speech answer is `reply.Reply`), with the
request's and answers' models in `schema` (uploads: `forms`; the OpenAPI document: `openapi`) and the instruments
in `metrics`. This module starts them (`serve`) and holds the command's options (`add_arguments`).

Every request's work is bounded: the body (64 KiB, refused from its Content-Length or as soon as more is read; a speech
request that names `ref_audio` in its first 64 KiB, an upload's 16 MiB; one that stalls for `--body-timeout` seconds is
dropped with a 408 that closes the connection), the text (`--frame-budget` frames at most, else a 400 before any work),
the places (`--max-batch` speaking and `--queue` waiting; past that a 503 with Retry-After at once; `--max-connections`
for uvicorn), and the audio a client has not read yet: past `--backlog` seconds its text is held (no next segment), and
a client that takes no audio for `--send-timeout` seconds is dropped. A text the model ends at once (its end of speech
at the first frame) is answered 200 with no samples (a wav header alone, an empty pcm body, a compressed stream of
nothing): there was nothing to say, and nothing failed. Failures are seen: every bad request gets a 4xx with an
OpenAI-style JSON error before any audio; an engine that stopped makes `/health` answer 503 and every request a 5xx JSON
error; a stream that fails after its first audio is cut off (its chunked body never ends), never ended as if complete; a
client that leaves, queued or speaking, frees its place at once. A step that hangs stops the engine (`--stall-seconds`,
`/health` 503 with why: a supervisor restarts the process on it), and a request past its deadline (`--deadline-margin`)
is cut with a 504, or its stream cut off. With an API key ($QTTS_API_KEY, or `--api-key`, which other users see in `ps`)
every /v1/ request (the voices too), /metrics and /openapi.json need `Authorization: Bearer KEY` (what OpenAI's clients
send; the scheme in any case), else 401; the page and /health stay open. A browser on another origin may call the server
only from an origin given with `--cors-origin`.

Built on Starlette + uvicorn, pydantic, prometheus_client, PyAV and python-multipart (`pip install qtts[serve]`),
imported only when serving.
"""

import os
import sys
from pathlib import Path

from ...errors import InputError
from ..options import add_batch_option, add_model_options, load_synthesizer, max_batch_of, model_dir, positive_int
from .engine import (
    BACKLOG_SECONDS,
    DEADLINE_FRAME_SECONDS,
    DEADLINE_MARGIN,
    FRAME_BUDGET,
    MAX_WAIT,
    STALL_SECONDS,
    STALL_TIMES,
    Engine,
)
from .http import build_app
from .reply import SEND_TIMEOUT
from .voices import CONSENTS_MB, MAX_CONSENTS, MAX_VOICES, VOICES_MB, Quota, Voices

API_KEY_ENV = "QTTS_API_KEY"


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
    if args.voices is not None and synth.kind != "base":
        say(f"--voices {args.voices}: a {synth.kind.replace('_', ' ')} checkpoint speaks its own voices; the clips "
            "there are not used (only Base checkpoints clone)")
    voices = Voices(synth, args.voices, say, quota=Quota(args.max_voices, args.voices_mb),
                    consent_quota=Quota(args.max_consents, args.consents_mb), alias=dict(args.voice_alias or ()),
                    default=args.default_voice)
    voices.preload()
    voices.check_aliases()
    engine = Engine(synth, max_frames=args.max_frames, chunk_frames=args.chunk_frames, queue_places=args.queue,
                    max_batch=max_batch_of(synth, args, say),
                    budget=args.frame_budget, backlog_seconds=args.backlog, stall_seconds=args.stall_seconds,
                    deadline_margin=args.deadline_margin, admit=args.admit, max_wait=args.max_wait, log=say)
    print(f"qtts serve: {directory.name} on http://{args.host}:{args.port} (voices: "
          f"{', '.join(voices.names()) or 'none'}; OpenAI's voice names speak {voices.default() or 'none'})",
          file=sys.stderr, flush=True)
    try:
        key = api_key_of(args)
        if key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
            say(f"warning: listening on {args.host} with no API key: anyone who can reach it may use it "
                f"(set ${API_KEY_ENV})")
        elif key is not None:
            say("API key required (Authorization: Bearer KEY) on /v1/, /metrics and /openapi.json; " +
                (f"warning: a key given with --api-key shows in `ps` to every user of this machine: set "
                 f"${API_KEY_ENV} instead" if args.api_key else f"the key comes from ${API_KEY_ENV}"))
        connections = args.max_connections or engine.max_batch + engine.queue_places + 32
        uvicorn.run(build_app(engine, voices, directory.name, api_key=key, send_timeout=args.send_timeout,
                              body_timeout=args.body_timeout, cors_origins=tuple(args.cors_origin or ())),
                    host=args.host,
                    port=args.port, log_level=args.log_level, limit_concurrency=connections)
    finally:
        engine.stop()
        voices.close()
    return 0


def api_key_of(args) -> str | None:
    """--api-key, else $QTTS_API_KEY, else None (no key needed); an empty value is no key."""
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def voice_alias(value: str) -> tuple[str, str]:
    """`--voice-alias NAME=VOICE` as (NAME, VOICE), both voice names."""
    import argparse
    import re

    from .schema import VOICE_PATTERN

    name, eq, voice = value.partition("=")
    if not eq or not re.match(VOICE_PATTERN, name) or not re.match(VOICE_PATTERN, voice):
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=VOICE (two voice names, e.g. alloy=alice)")
    return name, voice


def add_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--voices", type=Path, help="folder of NAME.wav voice clips (NAME.txt beside one: its transcript, "
                                               "ICL); voices uploaded with POST /v1/voices are saved here (without "
                                               "it, uploads are refused)")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait beside the batch; past that, 503")
    p.add_argument("--admit", choices=("realtime", "all"), default="realtime",
                   help="realtime (default): speak only as many requests at once as keep real time (measured at "
                        "start), the others wait; all: start every request that has a place (more audio a second "
                        "where the machine batches well, every stream slower than real time past that)")
    p.add_argument("--max-wait", type=float, default=MAX_WAIT,
                   help=f"seconds a request may wait for a place among the streams before a 503 with Retry-After "
                        f"(default {MAX_WAIT:.0f})")
    add_batch_option(p, "requests")
    p.add_argument("--api-key", help=f"a key clients must send as a bearer token; better set ${API_KEY_ENV}: a key "
                                     "on the command line shows in `ps` (default: none needed)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.add_argument("--voice-alias", type=voice_alias, action="append", metavar="NAME=VOICE",
                   help="a request's voice NAME speaks VOICE (repeatable), e.g. alloy=alice; OpenAI's voice names "
                        "(alloy, ash, ...) with no alias speak the default voice")
    p.add_argument("--default-voice", metavar="VOICE",
                   help="the voice OpenAI's voice names speak (default: the first voice in --voices in name order, "
                        "else the checkpoint's first built-in speaker)")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="an origin a browser may call this server from, e.g. https://app.example (repeatable; "
                        "default: none, only the server's own page)")
    p.add_argument("--max-connections", type=positive_int, help="connections uvicorn serves at once, past that 503 "
                                                                "(default: max batch + queue + 32)")
    p.add_argument("--send-timeout", type=float, default=SEND_TIMEOUT,
                   help=f"seconds a client may take no audio before it is dropped (default {SEND_TIMEOUT:.0f})")
    p.add_argument("--body-timeout", type=float, default=None,
                   help="seconds a request body may send nothing before it is dropped with a 408 (default 10; the "
                        "whole body must come within 12 times it)")
    p.add_argument("--backlog", type=float, default=BACKLOG_SECONDS,
                   help="seconds of audio a client may leave unread before its text's next segment waits "
                        f"(default {BACKLOG_SECONDS:.0f})")
    p.add_argument("--stall-seconds", type=float, default=STALL_SECONDS,
                   help=f"the watchdog: a step that runs {STALL_TIMES} times its running median and at least this "
                        f"long stops the engine (/health answers 503 with why; default {STALL_SECONDS:.0f})")
    p.add_argument("--deadline-margin", type=float, default=DEADLINE_MARGIN,
                   help=f"a request is cut with an error once it has run {DEADLINE_FRAME_SECONDS} s per planned frame "
                        f"plus this many seconds (default {DEADLINE_MARGIN:.0f})")
    add_model_options(p)
    g = p.add_argument_group("generation")
    g.add_argument("--max-frames", type=positive_int, default=600,
                   help="cap on frames per segment (a long input is spoken in segments, each capped by its length too)")
    g.add_argument("--frame-budget", type=positive_int, default=FRAME_BUDGET,
                   help=f"frames a request may take at most, its segments' caps added up (default {FRAME_BUDGET}, "
                        f"{FRAME_BUDGET // 750} minutes); a longer text is refused with a 400")
    g.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")
    q = p.add_argument_group("what --voices keeps (counted on disk; an upload past a limit is refused with a 403)")
    q.add_argument("--max-voices", type=positive_int, default=MAX_VOICES,
                   help=f"voices the folder may hold, clips copied in included (default {MAX_VOICES})")
    q.add_argument("--voices-mb", type=positive_int, default=VOICES_MB,
                   help=f"megabytes (10^6 bytes) the voices' files may take: clips, transcripts, ids (default "
                        f"{VOICES_MB})")
    q.add_argument("--max-consents", type=positive_int, default=MAX_CONSENTS,
                   help=f"consent recordings kept, in consents/ (in memory without --voices; default {MAX_CONSENTS})")
    q.add_argument("--consents-mb", type=positive_int, default=CONSENTS_MB,
                   help=f"megabytes the consent recordings and their records may take (default {CONSENTS_MB})")
