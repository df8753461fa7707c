"""Reading and writing wavs for the model: 24 kHz mono float32; the 16-bit wire format. Introduced in 00.

The reference model only accepts 24 kHz (`extract_speaker_embedding` asserts it), and
librosa's resampler cannot be reproduced bit for bit elsewhere, so we never resample
silently: a wav at another rate or with several channels is converted with a note on
stderr (never stdout: `qtts say -o -` writes the audio there), or refused with `strict=True`.

The wire formats (stdout, chapter 15; HTTP, chapter 18): 16-bit little-endian PCM at 24 kHz mono, raw (`pcm`, as
OpenAI's speech API) or behind a WAV header whose sizes say "unknown length" (0xFFFFFFFF, `wav`), which players
that read a pipe (ffplay, sox, aplay, mpv) accept; and `WavFile`, a float32 wav written piece by piece.
"""
from __future__ import annotations

import struct
import sys
from math import gcd
from pathlib import Path

import numpy as np

from ..errors import AudioError

SAMPLE_RATE = 24000           # Hz: the codec's output rate and the only rate the encoders take
SAMPLES_PER_FRAME = 1920      # one 12.5 Hz codec frame (the codec upsamples each frame 1920x)
FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME  # 12.5 frames per second of audio
UNKNOWN_SIZE = 0xFFFFFFFF  # a WAV size field meaning "streamed, length not known"


def load_wav(path: str | Path, strict: bool = False, quiet: bool = False) -> np.ndarray:
    """A wav file as float32 mono at 24 kHz, shape (n,). Another rate or several channels are converted with a note
    on stderr (`quiet`: none), or refused (`strict`)."""
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"reference wav not found: {path}")
    wav, notes = read_audio(path, strict)
    if not quiet:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return wav


def read_audio(source: str | Path | bytes, strict: bool = False, name: str | None = None,
               max_seconds: float | None = None) -> tuple[np.ndarray, list[str]]:
    """A file, or the bytes of one (wav, flac, ogg, mp3: what libsndfile reads), as float32 mono at 24 kHz, with
    notes on what was converted (channels averaged, rate resampled), or an `AudioError` (unreadable, empty, or not
    24 kHz mono when `strict`). `name` calls the audio in messages (default: the file's path).

    `max_seconds` bounds what is decoded (a server's uploads: a few kilobytes of FLAC can hold hours of silence).
    The length the container states (a wav's data size, FLAC's STREAMINFO, the last Ogg page, an mp3's frames) is
    read before any sample, and a longer clip refused at once; a container that does not say (or lies) is decoded
    only up to the limit, channels averaged block by block, and refused as soon as it goes past: the samples held
    are never more than `max_seconds` of mono audio at a rate of at most MAX_READ_RATE."""
    import io

    import soundfile as sf

    whole = name or (str(source) if not isinstance(source, bytes) else "the audio")
    short = name or (Path(source).name if not isinstance(source, bytes) else "the audio")
    if not isinstance(source, bytes) and not Path(source).is_file():
        raise AudioError(f"audio file not found: {whole}")
    try:
        with sf.SoundFile(io.BytesIO(source) if isinstance(source, bytes) else str(source)) as f:
            sr, channels = f.samplerate, f.channels
            wav = _decode(f, whole, max_seconds)
    except AudioError:
        raise
    except Exception as e:  # soundfile raises several types for unreadable files
        raise AudioError(f"cannot read {whole} as audio: {e}") from None
    if len(wav) == 0:
        raise AudioError(f"{whole} holds no samples")
    notes = []
    if channels > 1:
        if strict:
            raise AudioError(f"{whole} has {channels} channels; the model takes mono")
        notes.append(f"{short} has {channels} channels; averaging them to mono")
    if sr != SAMPLE_RATE:
        if strict:
            raise AudioError(f"{whole} is {sr} Hz; the model takes {SAMPLE_RATE} Hz")
        notes.append(f"{short} is {sr} Hz; resampling to {SAMPLE_RATE} Hz (polyphase)")
        wav = resample(wav, sr, SAMPLE_RATE)
    return wav, notes


MAX_READ_RATE = 192000      # Hz: the highest rate a bounded read takes (a header may claim any)
READ_BLOCK_VALUES = 1 << 20  # samples (all channels) decoded at a time by a bounded read: 4 MB of float32
UNKNOWN_FRAMES = (1 << 63) - 1  # what libsndfile says for a length the container does not state


def too_long(whole: str, max_seconds: float, seconds: float | None = None) -> AudioError:
    said = f"{seconds:.1f} s long" if seconds is not None else "longer than that"
    return AudioError(f"{whole} is {said}; this server reads at most {max_seconds:.0f} s of audio "
                      f"(the limit on a clip's length): cut it to the part you want")


def _decode(f, whole: str, max_seconds: float | None) -> np.ndarray:
    """The samples of an open `soundfile.SoundFile`, mono float32 at its own rate; with `max_seconds`, bounded as
    `read_audio` says."""
    if max_seconds is None:
        return f.read(dtype="float32", always_2d=True).mean(axis=1).astype(np.float32)
    if f.samplerate > MAX_READ_RATE:
        raise AudioError(f"{whole} is {f.samplerate} Hz; this server reads audio up to {MAX_READ_RATE} Hz")
    limit = int(max_seconds * f.samplerate)
    if 0 <= f.frames < UNKNOWN_FRAMES and f.frames > limit:  # refused from the container's word, before decoding
        raise too_long(whole, max_seconds, f.frames / f.samplerate)
    block = max(1, READ_BLOCK_VALUES // f.channels)
    pieces, got = [], 0
    while got <= limit:
        data = f.read(min(block, limit + 1 - got), dtype="float32", always_2d=True)
        if len(data) == 0:
            break
        pieces.append(data.mean(axis=1).astype(np.float32))
        got += len(data)
    if got > limit:  # the container did not say, or said less than it holds: stopped one sample past the limit
        raise too_long(whole, max_seconds)
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    from scipy.signal import resample_poly

    g = gcd(sr_in, sr_out)
    return resample_poly(wav, sr_out // g, sr_in // g).astype(np.float32)


def save_wav(path: str | Path, wav: np.ndarray, sr: int = SAMPLE_RATE) -> Path:
    import soundfile as sf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.asarray(wav, dtype=np.float32), sr, subtype="FLOAT")
    return path


# ---------------------------------------------------------------- wire formats
def wav_header(sample_rate: int = SAMPLE_RATE, data_bytes: int = UNKNOWN_SIZE) -> bytes:
    """A 44-byte header for 16-bit mono PCM; the default sizes say "length unknown" (streaming)."""
    riff = UNKNOWN_SIZE if data_bytes == UNKNOWN_SIZE else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
            sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", data_bytes))


def pcm16(wav: np.ndarray) -> bytes:
    """float samples in [-1, 1] -> 16-bit little-endian PCM bytes (rounded, clipped)."""
    return (np.clip(np.asarray(wav, np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class WavFile:
    """A float32 wav (the format `save_wav` writes) written piece by piece: the sizes in the header are
    rewritten after every piece, so the file is a complete wav whenever a player opens it."""

    def __init__(self, path, sample_rate: int = SAMPLE_RATE):
        self.file, self.sample_rate, self.samples = open(path, "wb"), sample_rate, 0
        self._header()

    def _header(self) -> None:
        data = self.samples * 4
        self.file.seek(0)
        self.file.write(b"RIFF" + struct.pack("<I", 50 + data) + b"WAVEfmt "
                        + struct.pack("<IHHIIHHH", 18, 3, 1, self.sample_rate, self.sample_rate * 4, 4, 32, 0)
                        + b"fact" + struct.pack("<II", 4, self.samples) + b"data" + struct.pack("<I", data))
        self.file.seek(0, 2)

    def write(self, wav: np.ndarray) -> None:
        self.file.write(np.asarray(wav, "<f4").tobytes())
        self.samples += len(wav)
        self._header()
        self.file.flush()

    def close(self) -> None:
        self.file.close()
