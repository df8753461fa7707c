"""Audio in OpenAI's speech formats, encoded piece by piece as the pieces come. Introduced in 18.

`wav` and `pcm` are the 16-bit wire formats of `audio.wav` (no dependency). `mp3`, `opus` (Ogg Opus), `aac` (ADTS)
and `flac` are encoded by FFmpeg through PyAV (`pip install av`; the `serve` extra has it): its wheels bundle FFmpeg
with LAME, libopus, FFmpeg's own AAC and FLAC encoders, so one maintained library covers all four, where libsndfile
(soundfile) has no AAC and writes FLAC and Ogg only to a seekable file. Every container here can be streamed: mp3
and ADTS are sequences of self-contained frames, Ogg is a sequence of pages (flushed every `OGG_PAGE_US`, not once
a second as FFmpeg's default, so a player hears the first words at once), and FLAC's header is written with the
total length unknown (a streamed FLAC; players and decoders accept it).

    encoder = Encoder("mp3")
    for piece in pieces:            # float32 pieces at 24 kHz
        send(encoder.write(piece))  # bytes ready now (perhaps none: an encoder holds back part of a frame)
    send(encoder.close())           # the rest

Container and codec run with FFmpeg's `bitexact` flags: no version strings and no random Ogg serial number, so the
same audio gives the same bytes (the tests compare a streamed body with a whole one).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..errors import InputError
from .wav import SAMPLE_RATE, pcm16, wav_header

OGG_PAGE_US = 20_000  # an Ogg page per 20 ms Opus packet: a piece of audio goes out as soon as it is encoded


@dataclasses.dataclass(frozen=True)
class Format:
    """One response format: its content type and, for the compressed ones, FFmpeg's container and codec."""

    content_type: str
    container: str | None = None   # None: written here (wav, pcm)
    codec: str | None = None
    sample_format: str | None = None  # what the codec is fed (FLAC: 16-bit, so it is lossless against `pcm`)
    bit_rate: int | None = None


# Content types as OpenAI-compatible servers send them (`opus` is Ogg Opus, sent as audio/opus like OpenAI's API).
FORMATS = {
    "mp3": Format("audio/mpeg", "mp3", "libmp3lame", "fltp", 64_000),
    "opus": Format("audio/opus", "ogg", "libopus", "flt", 32_000),
    "aac": Format("audio/aac", "adts", "aac", "fltp", 64_000),
    "flac": Format("audio/flac", "flac", "flac", "s16"),
    "wav": Format("audio/wav"),
    "pcm": Format("audio/pcm"),
}
COMPRESSED = tuple(name for name, f in FORMATS.items() if f.container)  # mp3, opus, aac, flac: PyAV's
EXTENSIONS = {"mp3": "mp3", "opus": "opus", "ogg": "opus", "aac": "aac", "flac": "flac"}  # `qtts say -o` by suffix


def format_of_path(path: str | Path) -> str | None:
    """The compressed format a file name asks for (`out.mp3` -> mp3), or None (a wav, as `save_wav` writes)."""
    return EXTENSIONS.get(Path(path).suffix.lower().lstrip("."))


def require(name: str):
    """PyAV, for a compressed format (an `InputError` saying how to install it, before any audio is made)."""
    try:
        import av
    except ImportError:
        raise InputError(f"{name} needs PyAV (FFmpeg): pip install av, or the serve extra "
                         "(pip install 'qtts[serve]')") from None
    return av


class _Sink:
    """Where FFmpeg writes: bytes collected until taken. No `seek`, so FFmpeg writes a stream, never going back
    to patch a header (which a response already sent could not take back either)."""

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class Encoder:
    """Float32 pieces at 24 kHz in, the bytes of one response format out, as soon as the codec has them."""

    def __init__(self, name: str, sample_rate: int = SAMPLE_RATE):
        if name not in FORMATS:
            raise InputError(f"unknown audio format {name!r}; use one of {', '.join(FORMATS)}")
        self.name, self.format, self.sample_rate = name, FORMATS[name], sample_rate
        self.samples = 0
        self._head = wav_header(sample_rate) if name == "wav" else b""
        self._out = None
        if self.format.container is None:
            return
        av = require(name)
        self._av, self._sink = av, _Sink()
        options = {"fflags": "+bitexact"} | ({"page_duration": str(OGG_PAGE_US)} if self.format.container == "ogg"
                                             else {})
        self._out = av.open(self._sink, "w", format=self.format.container, options=options)
        self._stream = self._out.add_stream(self.format.codec, rate=sample_rate)
        ctx = self._stream.codec_context
        ctx.layout, ctx.format = "mono", self.format.sample_format
        ctx.flags |= av.codec.context.Flags.bitexact
        if self.format.bit_rate:
            ctx.bit_rate = self.format.bit_rate
        ctx.open()
        # a codec takes frames of its own size (1152 samples for LAME at 24 kHz, 1024 AAC, 480 Opus): the
        # resampler (same rate; converts the sample format) cuts our pieces into those
        self._frames = av.AudioResampler(format=self.format.sample_format, layout="mono", rate=sample_rate,
                                         frame_size=ctx.frame_size or None)

    def write(self, wav: np.ndarray) -> bytes:
        """The bytes this piece completes (a header first, on the first call)."""
        wav = np.asarray(wav, np.float32)
        self.samples += len(wav)
        head, self._head = self._head, b""
        if self.format.container is None:
            return head + pcm16(wav)
        if len(wav):
            # the wire's 16-bit samples go in, so every format carries the samples `pcm` carries (FLAC exactly)
            frame = self._av.AudioFrame.from_ndarray(np.frombuffer(pcm16(wav), "<i2")[None], format="s16",
                                                     layout="mono")
            frame.rate = self.sample_rate
            self._encode(self._frames.resample(frame))
        return head + self._sink.take()

    def close(self) -> bytes:
        """The rest: what the codec held back, and the container's end."""
        head, self._head = self._head, b""
        if self.format.container is None:
            return head
        if self._out is None:
            return head
        self._encode(self._frames.resample(None))
        self._encode([None])
        self._out.close()
        self._out = None
        return head + self._sink.take()

    def discard(self) -> None:
        """Drop what is held back and free the codec (a stream whose client left); after `close`, a no-op."""
        if self.format.container is not None and self._out is not None:
            self._out.close()
            self._sink.take()
        self._out = None

    def _encode(self, frames) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._out.mux(packet)


def encode(name: str, wav: np.ndarray) -> bytes:
    """A whole wav in one format (what streaming every piece through `Encoder` gives, for a deterministic codec)."""
    encoder = Encoder(name)
    return encoder.write(wav) + encoder.close()


def save_encoded(path: str | Path, wav: np.ndarray, name: str | None = None) -> Path:
    """`wav` written to `path` in the format its suffix names (`format_of_path`), e.g. `qtts say -o out.mp3`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(name or format_of_path(path), wav))
    return path
