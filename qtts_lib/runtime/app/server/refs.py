"""`qtts serve`'s voices from a clip sent with the speech request (`ref_audio`, optional `ref_text`): decoded,
checked exactly as an uploaded clip is (`audio.clips.read_voice_clip`: the length its container states read before
any sample is decoded, at most MAX_UPLOAD_SECONDS, the same messages), built on the voice store's builder thread and
kept in a small cache by the clip's hash and its transcript, the least recently used dropped first past REF_VOICES
voices or REF_VOICES_MB megabytes of them. Introduced in 18.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib

import numpy as np

from ...audio.clips import MAX_UPLOAD_SECONDS, read_voice_clip
from ...errors import AudioError, InputError
from ...pipeline.bounded import BoundedCache

REF_VOICES = 32     # voices kept: a client that speaks with its own clip pays for its build once ...
REF_VOICES_MB = 8   # ... and their arrays at most this many megabytes (an ICL voice of 15 s: 188 x 16 codes, ~24 kB)
FIELD = "ref_audio"


class BadClip(Exception):
    """A `ref_audio` that cannot be used; `param` is the request field to name (`ref_audio`, or `ref_text`)."""

    def __init__(self, message: str, param: str = FIELD, code: str = "bad_clip"):
        super().__init__(message)
        self.param, self.code = param, code


def clip_bytes(ref_audio: str) -> bytes:
    """The file in `ref_audio`: base64 (white space ignored: a client may wrap its lines), or a `data:` URI
    (`data:audio/wav;base64,...`); a `BadClip` for anything else."""
    text = ref_audio
    if text.startswith("data:"):
        head, comma, text = text.partition(",")
        if not comma or not head.lower().endswith(";base64"):
            raise BadClip("`ref_audio` is a data: URI that does not hold base64 (data:audio/wav;base64,...)",
                          code="invalid_base64")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadClip("`ref_audio` is not base64 (nor a data: URI holding base64): send the clip's file "
                      "(wav, flac, ogg or mp3) encoded in base64", code="invalid_base64") from None
    if not data:
        raise BadClip("`ref_audio` holds no bytes", code="invalid_base64")
    return data


def _size(voice) -> int:
    """The bytes a built voice holds (its arrays and its transcript): what the cache counts."""
    return sum(v.nbytes for v in vars(voice).values() if isinstance(v, np.ndarray)) + len((voice.text or "").encode())


class RefVoices:
    """The voices of clips sent with requests, over one voice store (`voices.Voices`: its checkpoint, its builder
    thread). `voice` is called on the event loop; the decoding, hashing, checks and build run off it, one build per
    clip even when requests bring it at once."""

    def __init__(self, store, count: int = REF_VOICES, megabytes: float = REF_VOICES_MB):
        self.store = store
        self.cache = BoundedCache(int(megabytes * 10**6), count)  # (clip digest, transcript) -> its voice
        self.building: dict[tuple[str, str | None], asyncio.Future] = {}

    async def voice(self, ref_audio: str, ref_text: str | None):
        """The `Voice` of the clip in `ref_audio` (ICL with `ref_text`): from the cache, else decoded, checked and
        built; a `BadClip` saying why it cannot be."""
        data, digest = await asyncio.to_thread(_decoded, ref_audio)
        key = (digest, ref_text)
        if (kept := self.cache.get(key)) is not None:
            return kept
        if key not in self.building:  # the first request with this clip builds it; the others wait for it
            future = asyncio.ensure_future(self.store.off_loop(self._build, data, ref_text))
            self.building[key] = future
            future.add_done_callback(lambda f, key=key: self._built(key, f))
        return await asyncio.shield(self.building[key])  # a client that leaves does not cancel the others' build

    def _built(self, key, future: asyncio.Future) -> None:
        self.building.pop(key, None)
        if not future.cancelled() and future.exception() is None:
            self.cache.put(key, future.result(), _size(future.result()))

    def _build(self, data: bytes, text: str | None):
        try:
            clip = read_voice_clip(data, text, name="the clip in `ref_audio`", keep_long_option=None,
                                   max_seconds=MAX_UPLOAD_SECONDS)
        except AudioError as e:
            raise BadClip(str(e)) from None
        try:
            return self.store.synth.voice(wav=clip.wav, text=text)
        except (AudioError, InputError) as e:
            raise BadClip(str(e), "ref_text" if text else FIELD) from None


def _decoded(ref_audio: str) -> tuple[bytes, str]:
    data = clip_bytes(ref_audio)
    return data, hashlib.sha256(data).hexdigest()
