"""`qtts serve`: a local speech server speaking OpenAI's speech API, streamed. Introduced in 18.

    qtts serve --checkpoint tiny-base --voices voices/ --port 8000
    curl -sN localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"input": "Hello.", "voice": "alice"}' | ffplay -nodisp -autoexit -

Endpoints: `POST /v1/audio/speech`, `GET /v1/models`, `GET|POST /v1/voices`, `DELETE /v1/voices/{name}`, OpenAI's
custom voices (`POST /v1/audio/voices`, `DELETE /v1/audio/voices/{voice_id}`, `GET|POST /v1/audio/voice_consents`,
`GET|POST|DELETE /v1/audio/voice_consents/{consent_id}`), `GET /health`, `GET /metrics` (Prometheus, `app.metrics`),
`GET /openapi.json` (the API as data, `app.schema`) and `GET /`, a page to try the voices and add one
(`app/static/`). The request is `schema.SpeechRequest`: `input`, `voice`, optional `model`, `response_format` (mp3 |
opus | aac | flac | wav | pcm), `stream_format` (audio | sse), `speed` (0.25 to 4.0: the tempo, at the same pitch,
`audio.tempo`), `language`, `instructions` (OpenAI's style prompt: a style for a built-in speaker on a 1.7B
CustomVoice checkpoint, the voice itself on a VoiceDesign one, whose one voice is `design`; refused with a 400 where
the checkpoint cannot follow it), and the sampling parameters of `pipeline.sampling.Sampling` (`temperature`,
`top_k`, `top_p`, `repetition_penalty`, `seed`, `greedy`); missing ones take the checkpoint's generation_config, so
the server samples as the reference does. Without a `seed` every request draws a fresh one, and every answer says
the seed it used in its `X-Seed` header: a request with that seed gives the same audio again, bit for bit when it
runs alone (batched beside other requests, to float rounding, which now and then flips a sampled code: chapter 17;
greedy decoding needs no seed and says 0).

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
400 (`cannot_clone`).

Audio is 24 kHz mono, encoded piece by piece as frames are generated and sent as it is encoded (chunked transfer,
`audio.encode.Encoder`): `pcm` raw 16-bit, `wav` behind a header of unknown length, mp3, Ogg Opus, ADTS AAC and
FLAC through FFmpeg. With `stream_format: "sse"` the same bytes come as OpenAI's server-sent events: a
`speech.audio.delta` event per chunk (its bytes in base64, in any response_format), then `speech.audio.done` with
the usage (the input's text tokens, the audio frames generated). A long `input` is spoken segment by segment with
short pauses (`pipeline.longform.LongText`, chapter 16), each segment capped by its own length and by `--max-frames`.

One thread runs every piece of ncnn work (`Engine`): OpenMP keeps a worker pool per thread that ran ncnn, so ncnn
called from whichever thread the event loop lends would starve on a machine with few cores (appendix D). Up to
`--max-batch` requests are decoded together (`pipeline.scheduler.Scheduler`, chapter 17): each frame's graph calls
serve all of them, and each response streams as its own frames come. A request keeps its place from its first
segment to its last; one that joins is prefilled a piece per frame, so the streams already running never wait for a
whole prompt.

Every request's work is bounded: the body (64 KiB, refused from its Content-Length or as soon as more is read; one
that stalls for `--body-timeout` seconds is dropped with a 408 that closes the connection), the
text (`--frame-budget` frames at most, else a 400 before any work), the places (`--max-batch` speaking and `--queue`
waiting; past that a 503 with Retry-After at once; `--max-connections` for uvicorn), and the audio a client has not
read yet: past `--backlog` seconds its text is held (no next segment), and a client that takes no audio for
`--send-timeout` seconds is dropped. A text the model ends at once (its end of speech at the first frame) is answered
200 with no samples (a wav header alone, an empty pcm body, a compressed stream of nothing): there was nothing to
say, and nothing failed. Failures are seen: every bad request gets a 4xx with an OpenAI-style JSON error
before any audio; an engine that stopped makes `/health` answer 503 and every request a 5xx JSON error; a stream
that fails after its first audio is cut off (its chunked body never ends), never ended as if complete; a client that
leaves, queued or speaking, frees its place at once. With an API key ($QTTS_API_KEY, or `--api-key`, which other
users see in `ps`) every /v1/ request (the voices too), /metrics and /openapi.json need `Authorization: Bearer KEY`
(what OpenAI's clients send; the scheme in any case), else 401; the page and /health stay open.

Built on Starlette + uvicorn, pydantic, prometheus_client, PyAV and python-multipart (`pip install qtts[serve]`),
imported only when serving.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import json
import os
import queue
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..audio.clips import MAX_UPLOAD_SECONDS, read_voice_clip
from ..audio.encode import FORMATS, Encoder
from ..audio.tempo import Tempo
from ..audio.wav import SAMPLE_RATE, save_wav
from ..binding.net import release_threads
from ..errors import AudioError, InputError
from ..pipeline.longform import BudgetError, LongText, check_budget, plan
from ..pipeline.scheduler import DEFAULT_MAX_BATCH, Scheduler
from .options import add_batch_option, add_model_options, load_synthesizer, max_batch_of, model_dir, positive_int

DESIGNED = "design"  # a VoiceDesign checkpoint's one voice: the one its `instructions` describe
API_KEY_ENV = "QTTS_API_KEY"
PROTECTED = ("/v1/", "/metrics", "/openapi.json")  # what an API key guards (the voices too); the page and /health
#                                                    stay open
STATIC = Path(__file__).parent / "static"
FRAME_BUDGET = 9000      # frames a request may take (12 minutes: a 4096-character English text fits)
BACKLOG_SECONDS = 20.0   # audio a client may leave unread before its text is held
SEND_TIMEOUT = 30.0      # seconds a client may take no audio at all before it is dropped


class Voices:
    """Every voice the server speaks, in one place: the checkpoint's built-in speakers, the clips in the voices folder
    (`<name>.wav`; `<name>.txt` beside one holds its transcript: ICL), or a VoiceDesign checkpoint's `design`.
    `names` lists them (the folder read again each time: a clip copied in is seen). Every clip passes
    `audio.clips.read_voice_clip`'s checks (NaN, silent, too short; a long one trimmed, or refused with a
    transcript), and its `Voice` (the x-vector, for ICL the clip's codes) is built once and kept: at start for the
    clips already there (`preload`), when one is uploaded (`add`, which writes its files into the folder, so a
    restart finds it), or before the first request for one copied in since (`ready`). A voice made through OpenAI's
    `POST /v1/audio/voices` (`add` with the consent recording it was made under) also has an OpenAI id, `voice_...`,
    kept with that consent's id in `<name>.json` beside its clip (`ids`).

    After the start every build runs on one thread of its own (`builder`), never on the engine's: a running stream
    never waits for the voice encoders (they share the CPU meanwhile), and the builder's OpenMP workers are released
    after each build (`binding.net.release_threads`). `get`, on the engine's thread, only hands out what is built."""

    def __init__(self, synth, folder: Path | None, log: Callable[[str], None] | None = None):
        self.synth, self.folder = synth, folder
        self.log = log or (lambda m: print(f"qtts serve: {m}", file=sys.stderr))
        self.built: dict = {}
        self.broken: dict[str, str] = {}  # a clip in the folder that cannot be used: why
        self.ids = self._read_ids()        # {name: OpenAI voice id}: replaced whole, never changed in place (the
        #                                    builder writes it while requests read it: `by_id`)
        self.builder = ThreadPoolExecutor(1, thread_name_prefix="qtts-voices")

    @property
    def clones(self) -> bool:
        """Whether voices can be added (Base checkpoints clone clips; the others have their own voices)."""
        return self.synth.kind == "base"

    def names(self) -> list[str]:
        from .schema import VOICE_PATTERN  # a name, never a path

        if self.synth.kind == "voice_design":
            return [DESIGNED]
        files = sorted(self.folder.glob("*.wav")) if self.folder and self.clones else []
        return self.synth.speakers + [f.stem for f in files if re.match(VOICE_PATTERN, f.stem)]

    def builtin(self, name: str) -> bool:
        """A voice of the checkpoint's own (a speaker, or `design`): never a file, never deleted."""
        return name == DESIGNED if self.synth.kind == "voice_design" else name.lower() in self.synth.speakers

    def exists(self, name: str) -> bool:
        return self.builtin(name) or (self.folder is not None and (self.folder / f"{name}.wav").exists())

    def _key(self, name: str) -> str:
        return name.lower() if self.builtin(name) else name

    def _read_ids(self) -> dict[str, str]:
        """{name: OpenAI voice id} from the `<name>.json` files in the folder; one that cannot be read is logged."""
        from .schema import VOICE_PATTERN

        ids: dict[str, str] = {}
        for meta in sorted(self.folder.glob("*.json")) if self.folder and self.clones else []:
            if not re.match(VOICE_PATTERN, meta.stem):
                continue  # a file being written (`_write_atomically`), not a voice's
            try:
                voice_id = json.loads(meta.read_text(encoding="utf-8"))["id"]
                if not isinstance(voice_id, str):
                    raise TypeError(f"the id {voice_id!r} is not text")
                ids[meta.stem] = voice_id
            except (OSError, ValueError, KeyError, TypeError) as e:
                self.log(f"{meta.name} in the voices folder holds no voice id ({e!r}): that voice has none")
        return ids

    def by_id(self) -> dict[str, str]:
        """{OpenAI voice id: name}: what a speech request's `{"id": ...}` may give instead of the name."""
        ids = self.ids  # one version of it: the builder replaces the dict, never changes it
        return {voice_id: name for name, voice_id in ids.items()}

    def info(self) -> list[dict]:
        """`schema.VoiceInfo` of every voice."""
        out = []
        for name in self.names():
            if self.builtin(name):
                mode = "design" if name == DESIGNED else "speaker"
            else:
                built = self.built.get(name)
                mode = built.mode if built is not None else \
                    "icl" if (self.folder / f"{name}.txt").is_file() else "xvector"
            out.append({"name": name, "builtin": self.builtin(name), "mode": mode, "error": self.broken.get(name),
                        "id": self.ids.get(name)})
        return out

    def preload(self) -> None:
        """Build every voice now (the encoders run once per clip, before any request waits); a clip that cannot be
        used is logged and kept in `broken` (a request for it gets why). A described voice (VoiceDesign) is only
        words, built with each request."""
        if self.synth.kind == "voice_design":
            return
        for name in self.names():
            try:
                self.build(name)
            except (AudioError, InputError) as e:
                self.log(f"voice {name!r} cannot be used: {e}")

    def build(self, name: str):
        """The `Voice` of `name`, built now if it is not yet (its clip read and checked); an `AudioError` or
        `InputError` for one that cannot be used, also kept in `broken`."""
        key = self._key(name)
        if key in self.built:
            return self.built[key]
        try:
            if self.builtin(name):
                voice = self.synth.voice(speaker=key)
            else:
                path = self.folder / f"{name}.wav" if self.folder else None
                if path is None or not path.is_file():
                    raise AudioError(f"the voice {name!r} is gone: no {name}.wav in the voices folder")
                transcript = path.with_suffix(".txt")
                text = (transcript.read_text(encoding="utf-8").strip() or None) if transcript.is_file() else None
                clip = read_voice_clip(path, text, name=f"{name}.wav", keep_long_option=None)
                for message in clip.messages:
                    self.log(f"voice {name!r}: {message}")
                voice = self.synth.voice(wav=clip.wav, text=text)
        except (AudioError, InputError) as e:
            self.broken[name] = str(e)
            raise
        self.broken.pop(name, None)
        self.built[key] = voice
        return voice

    async def ready(self, name: str) -> None:
        """`name` built, on the builder's thread when it is not yet (the event loop's; errors as `build`)."""
        if self.synth.kind != "voice_design" and self._key(name) not in self.built:
            await asyncio.get_running_loop().run_in_executor(self.builder, self._released, self.build, name)

    async def add(self, name: str, audio: bytes, text: str | None, filename: str | None = None,
                  consent: str | None = None) -> dict:
        """A new voice from an uploaded clip (its file's bytes) and optional transcript: checked, built, and saved
        as `<name>.wav` (the clip as used: 24 kHz mono, trimmed) and `<name>.txt` in the folder; with the `consent`
        recording it was made under (OpenAI's `POST /v1/audio/voices`), also a fresh OpenAI id, saved with the
        consent's id in `<name>.json`. Returns its `schema.VoiceCreated` fields; a `FileExistsError` for a name
        taken, an `AudioError` or `InputError` for a clip that cannot be used. On the builder's thread: one build at
        a time, none on the engine's."""
        return await asyncio.get_running_loop().run_in_executor(self.builder, self._released, self._add, name, audio,
                                                                text, filename, consent)

    def _add(self, name: str, audio: bytes, text: str | None, filename: str | None, consent: str | None) -> dict:
        if self.exists(name):
            raise FileExistsError(name)
        clip = read_voice_clip(audio, text, name=f"the uploaded clip {filename!r}" if filename else "the uploaded clip",
                               keep_long_option=None, max_seconds=MAX_UPLOAD_SECONDS)
        voice = self.synth.voice(wav=clip.wav, text=text)
        wav, txt, meta = (self.folder / f"{name}{suffix}" for suffix in (".wav", ".txt", ".json"))
        if text is not None:
            _write_atomically(txt, lambda part: part.write_text(text, encoding="utf-8"))
        else:
            txt.unlink(missing_ok=True)  # a transcript left behind would make the clip an ICL voice at the next start
        voice_id = None if consent is None else f"voice_{secrets.token_hex(12)}"
        if voice_id is None:
            meta.unlink(missing_ok=True)  # an id left behind would name this clip at the next start
        else:
            record = json.dumps({"id": voice_id, "consent": consent})
            _write_atomically(meta, lambda part: part.write_text(record, encoding="utf-8"))
        _write_atomically(wav, lambda part: save_wav(part, clip.wav))  # float32: the samples as checked, exactly
        self.built[name] = voice
        self.broken.pop(name, None)
        if voice_id is not None:
            self.ids = self.ids | {name: voice_id}
        return {"name": name, "builtin": False, "mode": voice.mode, "error": None, "id": voice_id,
                "seconds": round(clip.seconds, 3), "messages": list(clip.messages)}

    async def delete(self, name: str) -> None:
        """Forget a clip's voice and remove its files (after any build in progress)."""
        await asyncio.get_running_loop().run_in_executor(self.builder, self._delete, name)

    def _delete(self, name: str) -> None:
        for suffix in (".wav", ".txt", ".json"):
            (self.folder / f"{name}{suffix}").unlink(missing_ok=True)
        self.built.pop(name, None)
        self.broken.pop(name, None)
        self.ids = {n: i for n, i in self.ids.items() if n != name}

    @staticmethod
    def _released(work, *args):
        try:
            return work(*args)
        finally:
            release_threads()  # this thread's OpenMP workers: gone until the next build

    def get(self, name: str, instructions: str | None = None):
        """The `Voice` for `name` with `instructions`, on the engine's thread: only what is built (`ready` ran
        first); an `AudioError` for a voice deleted since."""
        if self.synth.kind == "voice_design":
            return self.synth.voice(instruct=instructions)
        voice = self.built.get(self._key(name))
        if voice is None:
            raise AudioError(self.broken.get(name) or f"the voice {name!r} is gone (deleted while the request waited)")
        return dataclasses.replace(voice, instruct=instructions) if instructions else voice

    def close(self) -> None:
        self.builder.shutdown(wait=False, cancel_futures=True)


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(part)` to a file beside `path` that no listing takes for a voice (a dot first), then renamed to `path`:
    a reader sees the whole file or none."""
    part = path.with_name(f".{path.stem}.part{path.suffix}")
    try:
        write(part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


class Consents:
    """OpenAI's voice consent recordings (`/v1/audio/voice_consents`), which a voice made through `POST
    /v1/audio/voices` must name: each a record (`schema.VoiceConsent`'s fields: an id `cons_...`, when it came, its
    label and language; the upload's file name) and the recording as uploaded, once it passed a voice clip's checks
    (`audio.clips.read_voice_clip`: readable, not NaN, not silent, long enough, at most MAX_UPLOAD_SECONDS, refused
    before it is decoded whole; never trimmed; one at a time, `checker`). With a folder (the
    voices folder's `consents/`) both are kept there, `<id>.json` and the recording beside it, so a restart finds
    them; without one only the records are, in memory (no endpoint reads a recording back). Listed oldest first
    (each record's `created_ns`, its time of creation to the nanosecond). Records change on the event loop; the
    checks and the writes of a new one run off it."""

    FIELDS = {"id": str, "created_ns": int, "name": str, "language": str, "recording": str}  # and `filename`

    def __init__(self, folder: Path | None, log: Callable[[str], None]):
        self.folder, self.records = folder, {}
        self.checker = ThreadPoolExecutor(1, thread_name_prefix="qtts-consents")  # one recording decoded at a time
        for meta in sorted(folder.glob("cons_*.json")) if folder and folder.is_dir() else []:
            try:
                record = json.loads(meta.read_text(encoding="utf-8"))
                if not all(isinstance(record[k], kind) for k, kind in self.FIELDS.items()):
                    raise ValueError("a field is not of its type")
                if record["id"] != meta.stem or Path(record["recording"]).name != record["recording"] or \
                        not record["recording"].startswith(f"{meta.stem}."):
                    raise ValueError("its id or its recording's file name is not its own")
                self.records[record["id"]] = record
            except (OSError, ValueError, KeyError, TypeError) as e:
                log(f"{meta} is not a consent record ({e}): skipped")
        self.records = dict(sorted(self.records.items(), key=lambda item: item[1]["created_ns"]))

    def __contains__(self, consent_id: str) -> bool:
        return consent_id in self.records

    def get(self, consent_id: str) -> dict | None:
        return self.records.get(consent_id)

    async def add(self, name: str, language: str, recording: bytes, filename: str | None) -> dict:
        """A new consent recording's record, the recording checked and kept; an `AudioError` for one that cannot be
        used."""
        record = await asyncio.get_running_loop().run_in_executor(self.checker, self._check_and_save, name,
                                                                  language, recording, filename)
        self.records[record["id"]] = record
        return record

    def _check_and_save(self, name: str, language: str, recording: bytes, filename: str | None) -> dict:
        read_voice_clip(recording, keep_long=True, name=f"the consent recording {filename!r}" if filename else
                        "the consent recording", keep_long_option=None, max_seconds=MAX_UPLOAD_SECONDS)
        consent_id = f"cons_{secrets.token_hex(12)}"
        suffix = Path(filename or "").suffix.lower()
        kept = consent_id + (suffix if re.match(r"^\.[a-z0-9]{1,8}$", suffix) else ".audio")
        record = {"id": consent_id, "created_ns": time.time_ns(), "name": name, "language": language,
                  "filename": filename, "recording": kept}
        if self.folder is not None:
            self.folder.mkdir(exist_ok=True)
            _write_atomically(self.folder / kept, lambda part: part.write_bytes(recording))
            self._save(record)
        return record

    def rename(self, consent_id: str, name: str) -> dict:
        record = self.records[consent_id] | {"name": name}
        if self.folder is not None:
            self._save(record)
        self.records[consent_id] = record
        return record

    def page(self, after: str | None, limit: int) -> tuple[list[dict], bool]:
        """Up to `limit` records, from the one after `after` (the first without): (them, whether more follow); a
        `KeyError` for an `after` that names none."""
        ids = list(self.records)
        if after is not None and after not in self.records:
            raise KeyError(after)
        start = 0 if after is None else ids.index(after) + 1
        return [self.records[i] for i in ids[start:start + limit]], start + limit < len(ids)

    def delete(self, consent_id: str) -> None:
        record = self.records.pop(consent_id)
        if self.folder is not None:
            (self.folder / f"{consent_id}.json").unlink(missing_ok=True)
            (self.folder / record["recording"]).unlink(missing_ok=True)

    def _save(self, record: dict) -> None:
        text = json.dumps(record)
        _write_atomically(self.folder / f"{record['id']}.json", lambda part: part.write_text(text, encoding="utf-8"))


class Job:
    """One request in the engine: its `speech` and planned segments go in; what comes out (audio pieces, then
    "done", or "refused"/"error") is put on `out` through the event loop. `backlog`: samples sent and not yet
    taken by the response (the client's reading, felt through the event loop's flow control)."""

    def __init__(self, speech, planned: list, loop: asyncio.AbstractEventLoop, wake: Callable[[], None] = lambda: None):
        self.speech, self.planned, self.loop, self.wake = speech, planned, loop, wake
        self.out: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.released = False
        self.long: LongText | None = None  # the engine thread's
        self._backlog, self._lock = 0, threading.Lock()
        self._held_over: int | None = None  # held for a backlog over this many samples: `take` wakes the engine

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

    def held(self, limit: int) -> bool:
        """From the engine thread: whether the backlog is over `limit` samples (its text then waits); while it is,
        the client's next `take` that brings it back under wakes the engine (`wake`), which sleeps meanwhile."""
        with self._lock:
            held = self._backlog > limit
            self._held_over = limit if held else None
            return held

    async def take(self):
        """The next (kind, value), on the event loop."""
        kind, value = await self.out.get()
        if kind == "audio":
            with self._lock:
                self._backlog -= len(value)
                wake = self._held_over is not None and self._backlog <= self._held_over
                if wake:
                    self._held_over = None
            if wake:
                self.wake()
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
        log = log or (lambda m: print(f"qtts serve: {m}", file=sys.stderr))
        self.synth, self.voices = synth, Voices(synth, voices_dir, log)
        self.max_frames, self.chunk_frames, self.queue_places, self.budget = max_frames, chunk_frames, \
            queue_places, budget
        self.backlog = int(backlog_seconds * SAMPLE_RATE)
        self.scheduler = Scheduler(synth, max_batch)
        self.inbox: queue.Queue[Job | None] = queue.Queue()
        self.speaking: list[Job] = []  # the engine thread's: every request started, admitted to the batch or not
        self.pending = 0               # requests holding a place, queued or speaking (the event loop's)
        self.active = 0                # requests speaking: those the batch has admitted (the rest wait, /health)
        self.largest_batch = self.served = 0
        self.failure: BaseException | None = None
        self.on_step: Callable[[int], None] | None = None  # each frame step's batch size (the metrics), this thread
        self.voices.preload()
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
        job = Job(speech, planned, asyncio.get_running_loop(), wake=lambda: self.inbox.put(None))
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
        self.voices.close()

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
        """Start the requests that came (wait for one when idle: nothing speaking, or every text held for its
        client's backlog with nothing left to step); drop those whose clients left; False: stop."""
        incoming = []
        try:
            incoming.append(self.inbox.get(block=not self.speaking or not self.scheduler))
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
        self._count()

    def _step(self) -> None:
        events = self.scheduler.step()
        batch = sum(not e.drained for e in events)  # one event per utterance in the batch; none if it only drained
        self.largest_batch = max(self.largest_batch, batch)
        if batch and self.on_step is not None:
            self.on_step(batch)
        for job in list(self.speaking):
            for piece in job.long.take(events):
                job.send("audio", piece)
            if job.long.done:  # not counted as speaking once its client can hear it is done (`/health`)
                self._end(job, "done")
            else:
                job.long.hold(job.held(self.backlog))  # a client far behind: no next segment for now
        self._count()

    def _count(self) -> None:
        """`active`: the requests the batch has admitted (their first segment, and every later one, keep their
        place); the others started here still wait in the scheduler's queue, and count as waiting."""
        self.active = sum(job.long.lane.started for job in self.speaking)

    def _end(self, job: Job, message: str | None = None) -> None:
        job.long.cancel()
        self.speaking.remove(job)
        self._count()
        if message:
            job.send(message)


class Reply:
    """One speech request's answer, on the event loop: wait for its first audio (or its client leaving), then
    stream the rest (`AudioResponse`): each piece through the tempo filter (`audio.tempo.Tempo`, the request's
    `speed`) and the encoder of its format, as it comes. However it ends, `close` frees its place once and counts
    its outcome. Raises `InputError` when PyAV is missing for the format or the speed."""

    def __init__(self, engine: Engine, job: Job, metrics, received: float, send_timeout: float):
        self.engine, self.job, self.metrics, self.received = engine, job, metrics, received
        self.send_timeout, self.outcome = send_timeout, "abandoned"
        self.encoder = Encoder(job.speech.format)
        self.tempo = Tempo(job.speech.speed)
        self.samples = 0
        # PyAV's work (an encoder of a compressed format, the tempo filter) could run on a thread, off the event
        # loop; tried (issue 53), it stalled the engine's ncnn steps for seconds under four clients on two cores (the
        # soak of test_server.py timed out), so it stays on the loop until the cores are shared by measurement
        self.off_loop = False
        self._busy: asyncio.Future | None = None  # that work, while it runs (`close` waits for it to discard)

    async def _encode(self, work, *args) -> bytes:
        if not self.off_loop:
            return work(*args)
        self._busy = asyncio.get_running_loop().run_in_executor(None, work, *args)
        return await self._busy

    def _piece(self, value) -> bytes:
        return self.encoder.write(self.tempo.write(value))

    def _rest(self) -> bytes:
        return self.encoder.write(self.tempo.close()) + self.encoder.close()

    @property
    def seed(self) -> int:
        return self.job.speech.sampling.seed

    def usage(self) -> dict:
        """OpenAI's usage of the request: the input's text tokens in, the audio frames out (once done)."""
        tokens, frames = sum(s.tokens for s in self.job.planned), sum(s.frames for s in self.job.planned)
        return {"input_tokens": tokens, "output_tokens": frames, "total_tokens": tokens + frames}

    async def first(self, request):
        """("audio", piece), ("done", None) for an utterance with no audio at all (the model's end of speech at its
        first frame), ("refused"/"error", exception), or None when the client left first. An engine that
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
            chunk = await self._encode(self._piece, value)
            if chunk:
                if first:
                    self.metrics.time_to_first_audio.observe(time.monotonic() - self.received)
                    first = False
                yield chunk
            kind, value = await self.job.take()
        if kind != "done":
            self.outcome = "error"
            raise BrokenStream(value)
        rest = await self._encode(self._rest)
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
            if self._busy is not None and not self._busy.done():  # a piece still encoding on its thread
                self._busy.add_done_callback(lambda _: self.encoder.discard())
            else:
                self.encoder.discard()
        self.metrics.streams.labels(self.job.speech.format, self.outcome).inc()


class BrokenStream(Exception):
    """The engine failed after the stream's first audio: the response is cut off, not ended."""


async def _disconnected(receive) -> None:
    """Returns when the client has gone (its body already read, the next ASGI message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def build_app(engine: Engine, model_id: str, api_key: str | None = None, send_timeout: float = SEND_TIMEOUT,
              body_timeout: float | None = None):
    """The Starlette app over one `Engine` (its endpoints: `Api`); with `api_key`, the PROTECTED paths need it as a
    bearer token; `body_timeout`: seconds a request body may stall (default `schema.BODY_TIMEOUT`)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    api = Api(engine, model_id, api_key is not None, send_timeout, body_timeout)
    routes = [Route("/v1/audio/speech", api.speech, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]),
              Route("/v1/voices", api.voices, methods=["GET"]), Route("/v1/voices", api.add_voice, methods=["POST"]),
              Route("/v1/voices/{name}", api.delete_voice, methods=["DELETE"]),
              Route("/v1/audio/voices", api.create_audio_voice, methods=["POST"]),
              Route("/v1/audio/voices/{voice_id}", api.delete_audio_voice, methods=["DELETE"]),
              Route("/v1/audio/voice_consents", api.create_consent, methods=["POST"]),
              Route("/v1/audio/voice_consents", api.list_consents, methods=["GET"]),
              Route("/v1/audio/voice_consents/{consent_id}", api.consent, methods=["GET", "POST", "DELETE"]),
              Route("/health", api.health, methods=["GET"]),
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


def _consent(record: dict) -> dict:
    """A `Consents` record as OpenAI's answer (`schema.VoiceConsent`)."""
    from .schema import VoiceConsent

    return VoiceConsent(id=record["id"], created_at=record["created_ns"] // 10**9, name=record["name"],
                        language=record["language"]).model_dump()


class Api:
    """The server's endpoints over one `Engine`, one method each (`build_app` routes them); the speech request's
    parsing is `schema`'s, its answer a `Reply`."""

    def __init__(self, engine: Engine, model_id: str, auth: bool, send_timeout: float,
                 body_timeout: float | None = None):
        from .metrics import Metrics
        from .schema import BODY_TIMEOUT

        self.engine, self.model_id, self.auth, self.send_timeout = engine, model_id, auth, send_timeout
        self.body_timeout = BODY_TIMEOUT if body_timeout is None else body_timeout
        self.metrics = Metrics(engine)
        engine.on_step = self.metrics.batch_size.observe
        self.served = engine.served_model(model_id)
        self.page = (STATIC / "index.html").read_text(encoding="utf-8")
        self._openapi: tuple[list, dict] | None = None
        voices = engine.voices
        self.consents = Consents(voices.folder / "consents" if voices.folder and voices.clones else None, voices.log)

    async def _body(self, request, upload: bool = False) -> bytes:
        """`schema.read_body` within this server's body timeout: a speech request's limit, or an upload's."""
        from .schema import MAX_BODY_BYTES, MAX_UPLOAD_BYTES, read_body

        return await read_body(request, MAX_UPLOAD_BYTES if upload else MAX_BODY_BYTES, self.body_timeout)

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
            return _refusal(schema.RequestError(501, str(e), "speed" if "speed" in str(e) else "response_format",
                                                kind="server_error"))
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
        if kind == "refused":
            return _refusal(schema.RequestError(400, str(e), "voice" if isinstance(e, AudioError) else None))
        return _refusal(schema.RequestError(500 if self.engine.alive else 503, f"the engine failed: {e!r}",
                                            kind="server_error", code="engine_error"))

    async def admit(self, request) -> Job:
        """The request read (`schema.read_body`), checked (`schema.parse_speech`), planned against the budget and
        given a place; any refusal a `schema.RequestError`."""
        from .schema import RequestError, parse_speech

        voices = self.engine.voices
        speech = parse_speech(await self._body(request), self.served, voices.names(), voices.by_id())
        try:
            await voices.ready(speech.voice)  # a clip copied in since the start: built now, once
        except (AudioError, InputError) as e:
            raise RequestError(400, str(e), "voice", code="bad_voice") from None
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

    async def voices(self, request):
        from .schema import VoiceInfo, VoiceList

        return _json(VoiceList(voices=[VoiceInfo(**v) for v in self.engine.voices.info()]).model_dump())

    async def add_voice(self, request):
        """A voice from an uploaded clip (`schema.parse_voice_form`), built off the engine's thread
        (`Voices.add`) and saved in the voices folder: 201, or a 4xx saying why not."""
        from .schema import RequestError, VoiceCreated, parse_voice_form

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
        from .schema import AudioVoice, RequestError, parse_sample_form, shown

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

        voice_id, voices = request.path_params["voice_id"], self.engine.voices
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

        voices, kind = self.engine.voices, self.engine.synth.kind
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
        """`Voices.add`, its refusals as `schema.RequestError`s (`field`: the form's clip field)."""
        from .schema import RequestError

        voices = self.engine.voices
        try:
            if voices.exists(name):
                raise FileExistsError(name)
            return await voices.add(name, audio, text, filename, consent)
        except FileExistsError:  # or uploaded twice at once: the second finds the first's files
            raise RequestError(409, f"a voice named {name!r} exists; delete it first (DELETE /v1/voices/{name}) or "
                                    "choose another name", "name", code="voice_exists") from None
        except AudioError as e:
            raise RequestError(400, str(e), field, code="bad_clip") from None
        except InputError as e:
            raise RequestError(400, str(e), "text") from None

    async def create_consent(self, request):
        """OpenAI's `POST /v1/audio/voice_consents`: a consent recording (`schema.parse_consent_form`), checked as a
        voice clip is and kept (`Consents`): `schema.VoiceConsent`, or a 4xx saying why not."""
        from .schema import RequestError, parse_consent_form

        try:
            self._cloning()
            form = await parse_consent_form(await self._body(request, upload=True), request.headers)
            record = await self.consents.add(form.name, form.language, form.recording, form.filename)
        except RequestError as e:
            return _refusal(e)
        except AudioError as e:
            return _refusal(RequestError(400, str(e), "recording", code="bad_recording"))
        return _json(_consent(record))

    async def list_consents(self, request):
        """OpenAI's `GET /v1/audio/voice_consents`: a cursor page of them (`after`, `limit`), oldest first."""
        from .schema import RequestError, VoiceConsentList, parse_list_query, shown

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
        from .schema import RequestError, VoiceConsentDeleted, parse_consent_update, shown

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

        name, voices = request.path_params["name"], self.engine.voices
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


class AudioResponse:
    """The streamed answer (an ASGI response): the headers (the format's content type, X-Sample-Rate, X-Seed: the
    seed the request sampled with), then each encoded chunk as it comes; with `sse`, each chunk is a server-sent
    event instead (`speech.audio.delta`, its bytes in base64), and a `speech.audio.done` event with the usage ends
    the stream (OpenAI's `stream_format: "sse"`). Every send waits at most the reply's `send_timeout` for the client
    to take it; a client that does not is dropped. An engine error after the first audio, a client that left or one
    dropped: the body is cut off (the connection closes with no last chunk, and no done event), never ended as if
    complete. `Reply.close` runs however it ends."""

    def __init__(self, reply: Reply, first: tuple, media_type: str, sse: bool = False):
        self.reply, self.first, self.sse = reply, first, sse
        self.media_type = "text/event-stream" if sse else media_type

    async def __call__(self, scope, receive, send) -> None:
        from .schema import SEED_HEADER

        reply = self.reply
        headers = [(b"content-type", self.media_type.encode()), (b"x-sample-rate", str(SAMPLE_RATE).encode()),
                   (SEED_HEADER.lower().encode(), str(reply.seed).encode())]
        if self.sse:
            headers.append((b"cache-control", b"no-cache"))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in reply.chunks(*self.first):
                body = sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}) \
                    if self.sse else chunk
                if not await _send_or_leave(send, {"type": "http.response.body", "body": body, "more_body": True},
                                            gone, reply.send_timeout):
                    return
            last = sse_event({"type": "speech.audio.done", "usage": reply.usage()}) if self.sse else b""
            await send({"type": "http.response.body", "body": last, "more_body": False})
        except BrokenStream as e:
            print(f"qtts serve: error while streaming: {e.args[0]!r}", file=sys.stderr)
        finally:
            gone.cancel()
            reply.close()


def sse_event(data: dict) -> bytes:
    """One server-sent event holding `data` as JSON (a `data:` line, then the blank line that ends the event)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


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
    counted by path and status for /metrics. The key comes as `Authorization: Bearer KEY`, the scheme's name in any
    case (RFC 9110: an authentication scheme is case-insensitive)."""

    def __init__(self, app, metrics, api_key: str | None):
        self.app, self.metrics = app, metrics
        self.key = None if api_key is None else api_key.encode()

    def authorized(self, header: bytes) -> bool:
        scheme, _, token = header.strip().partition(b" ")
        return hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send):
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
    engine = Engine(synth, args.voices, args.max_frames, args.chunk_frames, args.queue, max_batch_of(synth, args, say),
                    budget=args.frame_budget, backlog_seconds=args.backlog, log=say)
    print(f"qtts serve: {directory.name} on http://{args.host}:{args.port} (voices: "
          f"{', '.join(engine.voices.names()) or 'none'})", file=sys.stderr, flush=True)
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
        uvicorn.run(build_app(engine, directory.name, api_key=key, send_timeout=args.send_timeout,
                              body_timeout=args.body_timeout), host=args.host,
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
    p.add_argument("--voices", type=Path, help="folder of NAME.wav voice clips (NAME.txt beside one: its transcript, "
                                               "ICL); voices uploaded with POST /v1/voices are saved here (without "
                                               "it, uploads are refused)")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait beside the batch; past that, 503")
    add_batch_option(p, "requests")
    p.add_argument("--api-key", help=f"a key clients must send as a bearer token; better set ${API_KEY_ENV}: a key "
                                     "on the command line shows in `ps` (default: none needed)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
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
    add_model_options(p)
    g = p.add_argument_group("generation")
    g.add_argument("--max-frames", type=positive_int, default=600,
                   help="cap on frames per segment (a long input is spoken in segments, each capped by its length too)")
    g.add_argument("--frame-budget", type=positive_int, default=FRAME_BUDGET,
                   help=f"frames a request may take at most, its segments' caps added up (default {FRAME_BUDGET}, "
                        f"{FRAME_BUDGET // 750} minutes); a longer text is refused with a 400")
    g.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")
