"""`qtts serve`'s voice store: every file under `--voices` is its (the clips of cloned voices, their transcripts and
OpenAI ids, the consent recordings in `consents/`). `Voices` holds the voices a request may name and builds each
once; `Consents` keeps OpenAI's voice consent recordings. The HTTP layer (`http`) asks it for a request's `Voice`
and hands that to the engine (`engine`), which never reads a file. Introduced in 18.

What the store keeps is bounded: the voices, and the consent recordings, each under a `Quota` (how many, how many
megabytes of files), counted from the files on disk, so a restart sees the same totals; an upload that would pass
one is refused (`QuotaExceeded`) before any file is written. The files of one voice, or of one consent, appear
together or not at all: one file of each is its commit point, written last and removed first (a voice's clip
`<name>.wav`, a consent's record `cons_....json`), and at start whatever a write cut short left behind (an id
with no clip, a recording with no record, a temporary `.*.part*` file) is removed and logged. A text file with no
clip is left in place (it may be the user's own notes) and logged: it is no voice until a clip of its name comes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...audio.clips import MAX_UPLOAD_SECONDS, read_voice_clip
from ...audio.wav import SAMPLE_RATE
from ...binding.net import release_threads
from ...errors import AudioError, InputError

DESIGNED = "design"  # a VoiceDesign checkpoint's one voice: the one its `instructions` describe
MB = 10**6
MAX_VOICES, VOICES_MB = 200, 300  # 200 clips of the longest a voice keeps (15 s of float32 at 24 kHz: 1.44 MB) fit
MAX_CONSENTS, CONSENTS_MB = 200, 200  # a recording is kept as uploaded: a spoken statement takes well under 1 MB
PARTS = ".*.part*"  # `_write_atomically`'s temporary files


@dataclasses.dataclass(frozen=True)
class Quota:
    """A store's bound on what it keeps on disk: at most `count` items (voices, or consent recordings) and
    `megabytes` MB (10^6 bytes) of their files."""
    count: int
    megabytes: float


class QuotaExceeded(Exception):
    """An upload refused because what it adds would pass a `Quota`; the message says which limit, and how to free
    room."""


def _check_quota(quota: Quota, count: int, stored: int, new: int | None, *, items: str, options: tuple[str, str],
                 free: str) -> None:
    """A `QuotaExceeded` unless one more item (`new` bytes; None: its size is not known yet, only the count is
    checked) fits under `quota` beside the `count` items of `stored` bytes on disk. `items` names them, `options`
    are the server's options for the two limits, `free` says how to delete one."""
    if count + 1 > quota.count:
        raise QuotaExceeded(f"this server keeps at most {quota.count} {items} ({options[0]}) and holds {count}: "
                            f"delete one first ({free})")
    if new is not None and stored + new > quota.megabytes * MB:
        raise QuotaExceeded(f"this upload's {new / MB:.2f} MB would bring the {items} kept to "
                            f"{(stored + new) / MB:.2f} MB, past this server's quota of {quota.megabytes:g} MB "
                            f"({options[1]}): delete one first ({free})")


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

    The clips in the folder, with their transcripts and ids, stay under `quota` (`--max-voices`, `--voices-mb`;
    clips copied in by hand count too): an upload that would pass it raises `QuotaExceeded` before any file is
    written. A voice's clip is its commit point: `add` writes the transcript and id first and the clip last (a
    failed write removes what it wrote), `delete` removes the clip first, and at start a transcript or id with no
    clip beside it, or a temporary file, is removed and logged (`_clean`). `consent_quota` is the bound the
    server's `Consents` are kept under (`--max-consents`, `--consents-mb`).

    After the start every build runs on one thread of its own (`builder`), never on the engine's: a running stream
    never waits for the voice encoders (they share the CPU meanwhile), and the builder's OpenMP workers are released
    after each build (`binding.net.release_threads`). `get`, on the event loop, only hands out what is built.

    OpenAI's voice names (`schema.OPENAI_VOICES`: alloy, ...) speak a voice the store has: the one `alias` gives
    (`--voice-alias NAME=VOICE`, any NAME), else the default voice (`default`, `--default-voice`; else the first
    stored voice in name order that can be used, else the checkpoint's first built-in speaker), unless a voice of
    that name exists (`aliases`)."""

    def __init__(self, synth, folder: Path | None, log: Callable[[str], None] | None = None,
                 quota: Quota = Quota(MAX_VOICES, VOICES_MB), consent_quota: Quota = Quota(MAX_CONSENTS, CONSENTS_MB),
                 alias: dict[str, str] | None = None, default: str | None = None):
        self.synth, self.folder, self.quota, self.consent_quota = synth, folder, quota, consent_quota
        self.alias, self.default_name = dict(alias or {}), default
        self.log = log or (lambda m: print(f"qtts serve: {m}", file=sys.stderr))
        if self.folder is not None and self.clones:
            self._clean()
            count, stored = self.stored()
            if count >= quota.count or stored >= quota.megabytes * MB:
                self.log(f"the voices folder holds {count} voices, {stored / MB:.1f} MB: at its quota "
                         f"({quota.count} voices, {quota.megabytes:g} MB; --max-voices, --voices-mb), so uploads "
                         "are refused until voices are deleted")
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

    def default(self, names: list[str] | None = None) -> str | None:
        """The voice OpenAI's voice names speak when no alias names one (None: the store has no voice); `names`:
        `names()`, when the caller has it."""
        if self.default_name is not None:
            return self.default_name
        names = self.names() if names is None else names
        stored = [n for n in names if not self.builtin(n) and n not in self.broken]
        return stored[0] if stored else next((n for n in names if self.builtin(n)), None)

    def aliases(self, names: list[str] | None = None) -> dict[str, str]:
        """{name: voice} for every name a request may give that is no voice's own: `alias`'s, and OpenAI's voice
        names the default voice; `names`: `names()`, when the caller has it."""
        from .schema import OPENAI_VOICES

        names = self.names() if names is None else names
        default = self.default(names)
        given = ({n: default for n in OPENAI_VOICES} if default is not None else {}) | self.alias
        known = set(names)
        return {n: voice for n, voice in given.items() if n not in known and not self.builtin(n)}

    def check_aliases(self) -> None:
        """An `InputError` unless `alias` and `default` name voices the store has (at the start; a voice deleted
        later is refused when a request names it)."""
        for option, name in [("--default-voice", self.default_name)] + [
                (f"--voice-alias {n}={v}", v) for n, v in self.alias.items()]:
            if name is not None and not self.exists(name):
                raise InputError(f"{option}: no voice named {name!r}; this server's voices are "
                                 f"{', '.join(self.names()) or 'none'}")

    def listed(self) -> list[dict]:
        """`schema.ListedVoice` of every voice: `info`, each with the names that speak it."""
        names = self.names()
        aliases, default = self.aliases(names), self.default(names)
        return [v | {"id": v["id"] or v["name"], "default": v["name"] == default,
                     "aliases": sorted(n for n, voice in aliases.items() if voice == v["name"])} for v in self.info()]

    def builtin(self, name: str) -> bool:
        """A voice of the checkpoint's own (a speaker, or `design`): never a file, never deleted."""
        return name == DESIGNED if self.synth.kind == "voice_design" else name.lower() in self.synth.speakers

    def exists(self, name: str) -> bool:
        return self.builtin(name) or (self.folder is not None and (self.folder / f"{name}.wav").exists())

    def _key(self, name: str) -> str:
        return name.lower() if self.builtin(name) else name

    def _clean(self) -> None:
        """Remove, and log, what a write cut short left in the folder: an id record (`<name>.json` holding a
        `voice_...` id) with no clip (`<name>.wav`) beside it, and `_write_atomically`'s temporary files. A
        `<name>.txt` with no clip is only logged: the store cannot tell a transcript left behind from a user's
        file."""
        from .schema import VOICE_PATTERN

        for path in sorted(self.folder.glob(PARTS)):
            if path.is_file():
                path.unlink(missing_ok=True)
                self.log(f"removed {path.name} from the voices folder: a file whose write was cut short")
        for path in sorted([*self.folder.glob("*.txt"), *self.folder.glob("*.json")]):
            if not (re.match(VOICE_PATTERN, path.stem) and path.is_file()) or path.with_suffix(".wav").exists():
                continue
            if path.suffix == ".json" and _is_id_record(path):
                path.unlink(missing_ok=True)
                self.log(f"removed {path.name} from the voices folder: a voice id with no {path.stem}.wav beside it "
                         "(a voice whose clip was never written, or was deleted)")
            elif path.suffix == ".txt":
                self.log(f"{path.name} in the voices folder has no {path.stem}.wav beside it: not a voice (left in "
                         f"place; a clip named {path.stem}.wav would take it as its transcript)")

    def stored(self) -> tuple[int, int]:
        """(voices, bytes): the clips in the folder and the size of their files (clip, transcript, id), as on disk
        now."""
        from .schema import VOICE_PATTERN

        count = size = 0
        for clip in self.folder.glob("*.wav") if self.folder else []:
            if not re.match(VOICE_PATTERN, clip.stem):
                continue
            count += 1
            for path in (clip, clip.with_suffix(".txt"), clip.with_suffix(".json")):
                try:
                    size += path.stat().st_size
                except OSError:  # none, or deleted meanwhile
                    pass
        return count, size

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
        taken, a `QuotaExceeded` for a voice past `quota` (the count checked before the clip is read, the size of
        its files before it is built), an `AudioError` or `InputError` for a clip that cannot be used. The clip is
        written last: until it is, the voice does not exist, and a failed write removes the files written before it.
        On the builder's thread: one build at a time, none on the engine's."""
        return await asyncio.get_running_loop().run_in_executor(self.builder, self._released, self._add, name, audio,
                                                                text, filename, consent)

    def _add(self, name: str, audio: bytes, text: str | None, filename: str | None, consent: str | None) -> dict:
        if self.exists(name):
            raise FileExistsError(name)
        free = "DELETE /v1/voices/{name}, or DELETE /v1/audio/voices/{voice_id}"
        limits = dict(items="voices", options=("--max-voices", "--voices-mb"), free=free)
        _check_quota(self.quota, *self.stored(), None, **limits)
        clip = read_voice_clip(audio, text, name=f"the uploaded clip {filename!r}" if filename else "the uploaded clip",
                               keep_long_option=None, max_seconds=MAX_UPLOAD_SECONDS)
        voice_id = None if consent is None else f"voice_{secrets.token_hex(12)}"
        transcript = None if text is None else text.encode("utf-8")
        record = None if voice_id is None else json.dumps({"id": voice_id, "consent": consent}).encode("utf-8")
        samples = _wav_bytes(clip.wav)  # float32: the samples as checked, exactly
        _check_quota(self.quota, *self.stored(), len(samples) + len(transcript or b"") + len(record or b""), **limits)
        voice = self.synth.voice(wav=clip.wav, text=text)
        wav, txt, meta = (self.folder / f"{name}{suffix}" for suffix in (".wav", ".txt", ".json"))
        try:
            # a transcript left behind would make the clip an ICL voice, an id would name it: none are kept
            for path, data in ((txt, transcript), (meta, record)):
                if data is None:
                    path.unlink(missing_ok=True)
                else:
                    _write_atomically(path, lambda part, data=data: part.write_bytes(data))
            _write_atomically(wav, lambda part: part.write_bytes(samples))  # the commit point: the voice exists
        except BaseException:  # the clip never came: what was written before it goes
            for path in (txt, meta):
                path.unlink(missing_ok=True)
            raise
        self.built[name] = voice
        self.broken.pop(name, None)
        if voice_id is not None:
            self.ids = self.ids | {name: voice_id}
        return {"name": name, "builtin": False, "mode": voice.mode, "error": None, "id": voice_id,
                "seconds": round(clip.seconds, 3), "messages": list(clip.messages)}

    async def delete(self, name: str) -> None:
        """Forget a clip's voice and remove its files, the clip first (after any build in progress)."""
        await asyncio.get_running_loop().run_in_executor(self.builder, self._delete, name)

    def _delete(self, name: str) -> None:
        for suffix in (".wav", ".txt", ".json"):
            (self.folder / f"{name}{suffix}").unlink(missing_ok=True)
        self.built.pop(name, None)
        self.broken.pop(name, None)
        self.ids = {n: i for n, i in self.ids.items() if n != name}

    async def off_loop(self, work, *args):
        """`work(*args)` on the builder's thread (a voice from a request's own clip: `refs.RefVoices`)."""
        return await asyncio.get_running_loop().run_in_executor(self.builder, self._released, work, *args)

    @staticmethod
    def _released(work, *args):
        try:
            return work(*args)
        finally:
            release_threads()  # this thread's OpenMP workers: gone until the next build

    def get(self, name: str, instructions: str | None = None):
        """The `Voice` for `name` with `instructions`: only what is built (`ready` ran first); an `AudioError` for a
        voice deleted since."""
        if self.synth.kind == "voice_design":
            return self.synth.voice(instruct=instructions)
        voice = self.built.get(self._key(name))
        if voice is None:
            raise AudioError(self.broken.get(name) or f"the voice {name!r} is gone (deleted meanwhile)")
        return dataclasses.replace(voice, instruct=instructions) if instructions else voice

    def close(self) -> None:
        self.builder.shutdown(wait=False, cancel_futures=True)


def _wav_bytes(wav) -> bytes:
    """`wav` as the float32 wav file `audio.wav.save_wav` writes, in memory: its size is known before it is written."""
    import io

    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.asarray(wav, dtype=np.float32), SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def _is_id_record(path: Path) -> bool:
    """Whether `path` holds what `Voices` writes beside a clip: {"id": "voice_...", ...}."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and str(record.get("id", "")).startswith("voice_")


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
    checks and the writes of a new one run off it.

    Each `add` is given the `Quota` the consents are kept under (the server's `Voices.consent_quota`): how many
    records, and with a folder how many bytes of records and recordings on disk. The record is a consent's commit
    point: the recording is written first, the record last (a failed write removes the recording), `delete` removes
    the record first, and at start a recording with no record beside it, or a temporary file, is removed and
    logged."""

    FIELDS = {"id": str, "created_ns": int, "name": str, "language": str, "recording": str}  # and `filename`
    FREE = "DELETE /v1/audio/voice_consents/{consent_id}"

    def __init__(self, folder: Path | None, log: Callable[[str], None]):
        self.folder, self.records, self.log = folder, {}, log
        self.checker = ThreadPoolExecutor(1, thread_name_prefix="qtts-consents")  # one recording decoded at a time
        if folder and folder.is_dir():
            self._clean()
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

    def _clean(self) -> None:
        """Remove, and log, what a write cut short left in the folder: a recording (`cons_<id>.<ext>`) with no
        record (`cons_<id>.json`) beside it, and `_write_atomically`'s temporary files."""
        for path in sorted(self.folder.glob(PARTS)):
            if path.is_file():
                path.unlink(missing_ok=True)
                self.log(f"removed {path.name} from {self.folder}: a file whose write was cut short")
        for path in sorted(self.folder.glob("cons_*")):
            consent_id = path.name.split(".", 1)[0]
            if path.suffix != ".json" and path.is_file() and not (self.folder / f"{consent_id}.json").exists():
                path.unlink(missing_ok=True)
                self.log(f"removed {path.name} from {self.folder}: a consent recording with no record "
                         f"({consent_id}.json) beside it")

    def stored(self) -> tuple[int, int]:
        """(consents, bytes): with a folder, the records on disk and the size of every consent's files (records and
        recordings) now; without one, the records in memory and 0 (no recording is kept)."""
        if self.folder is None:
            return len(self.records), 0
        count = size = 0
        for path in self.folder.glob("cons_*") if self.folder.is_dir() else []:
            try:
                size += path.stat().st_size
            except OSError:  # deleted meanwhile
                continue
            count += path.suffix == ".json"
        return count, size

    async def add(self, name: str, language: str, recording: bytes, filename: str | None,
                  quota: Quota = Quota(MAX_CONSENTS, CONSENTS_MB)) -> dict:
        """A new consent recording's record, the recording checked and kept; a `QuotaExceeded` for one past `quota`
        (the count checked before the recording is read, the size of its files before they are written), an
        `AudioError` for one that cannot be used."""
        record = await asyncio.get_running_loop().run_in_executor(self.checker, self._check_and_save, name,
                                                                  language, recording, filename, quota)
        if self.folder is None:  # the records are all there is: counted again here, where they change
            _check_quota(quota, len(self.records), 0, None, **self._limits())
        self.records[record["id"]] = record
        return record

    def _limits(self) -> dict:
        return dict(items="consent recordings", options=("--max-consents", "--consents-mb"), free=self.FREE)

    def _check_and_save(self, name: str, language: str, recording: bytes, filename: str | None,
                        quota: Quota) -> dict:
        _check_quota(quota, *self.stored(), None, **self._limits())
        read_voice_clip(recording, keep_long=True, name=f"the consent recording {filename!r}" if filename else
                        "the consent recording", keep_long_option=None, max_seconds=MAX_UPLOAD_SECONDS)
        consent_id = f"cons_{secrets.token_hex(12)}"
        suffix = Path(filename or "").suffix.lower()
        kept = consent_id + (suffix if re.match(r"^\.[a-z0-9]{1,8}$", suffix) else ".audio")
        record = {"id": consent_id, "created_ns": time.time_ns(), "name": name, "language": language,
                  "filename": filename, "recording": kept}
        if self.folder is not None:
            _check_quota(quota, *self.stored(), len(recording) + len(_record_bytes(record)), **self._limits())
            self.folder.mkdir(exist_ok=True)
            _write_atomically(self.folder / kept, lambda part: part.write_bytes(recording))
            try:
                self._save(record)  # the commit point: the consent exists
            except BaseException:
                (self.folder / kept).unlink(missing_ok=True)
                raise
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
        """Forget a consent and remove its files, the record first."""
        record = self.records.pop(consent_id)
        if self.folder is not None:
            (self.folder / f"{consent_id}.json").unlink(missing_ok=True)
            (self.folder / record["recording"]).unlink(missing_ok=True)

    def _save(self, record: dict) -> None:
        data = _record_bytes(record)
        _write_atomically(self.folder / f"{record['id']}.json", lambda part: part.write_bytes(data))


def _record_bytes(record: dict) -> bytes:
    """A consent's record as its `<id>.json` holds it."""
    return json.dumps(record).encode("utf-8")
