"""Reading and writing wavs for the model: 24 kHz mono float32. Introduced in 00.

The reference model only accepts 24 kHz (`extract_speaker_embedding` asserts it), and
librosa's resampler cannot be reproduced bit for bit elsewhere, so we never resample
silently: a wav at another rate or with several channels is converted with a printed
note, or refused with `strict=True`.
"""
from __future__ import annotations

from math import gcd
from pathlib import Path

import numpy as np

SAMPLE_RATE = 24000           # Hz: the codec's output rate and the only rate the encoders take
SAMPLES_PER_FRAME = 1920      # one 12.5 Hz codec frame (the codec upsamples each frame 1920x)
FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME  # 12.5 frames per second of audio


class AudioError(ValueError):
    pass


def load_wav(path: str | Path, strict: bool = False, quiet: bool = False) -> np.ndarray:
    """A wav file as float32 mono at 24 kHz, shape (n,)."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise AudioError(f"reference wav not found: {path}")
    try:
        wav, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises several types for unreadable files
        raise AudioError(f"cannot read {path} as audio: {e}") from None
    if wav.shape[0] == 0:
        raise AudioError(f"{path} holds no samples")
    if wav.shape[1] > 1:
        if strict:
            raise AudioError(f"{path} has {wav.shape[1]} channels; the model takes mono")
        if not quiet:
            print(f"note: {path.name} has {wav.shape[1]} channels; averaging them to mono")
    wav = wav.mean(axis=1).astype(np.float32)
    if sr != SAMPLE_RATE:
        if strict:
            raise AudioError(f"{path} is {sr} Hz; the model takes {SAMPLE_RATE} Hz")
        if not quiet:
            print(f"note: {path.name} is {sr} Hz; resampling to {SAMPLE_RATE} Hz (polyphase)")
        wav = resample(wav, sr, SAMPLE_RATE)
    return wav


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
