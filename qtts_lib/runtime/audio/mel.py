"""The speaker encoder's log-mel frontend in numpy. Introduced in 08; also used by the CLI.

Reproduces `qwen_tts.core.models.modeling_qwen3_tts.mel_spectrogram` exactly as
`Qwen3TTSForConditionalGeneration.extract_speaker_embedding` calls it (24 kHz only):

    n_fft 1024, win 1024, hop 256, 128 mels, fmin 0, fmax 12000, center=False

1. reflect-pad the wav by (n_fft - hop) // 2 = 384 samples on both sides (the edge sample
   is not repeated: x[384], ..., x[1], x[0], x[1], ...);
2. cut frames of 1024 samples every 256: frames = 1 + (len + 2*384 - 1024) // 256;
3. multiply by the periodic Hann window (`torch.hann_window(1024)`);
4. one-sided DFT, 513 bins; magnitude sqrt(re^2 + im^2 + 1e-9);
5. project onto the Slaney mel filterbank (`librosa.filters.mel` defaults, built here);
6. log(max(x, 1e-5)).

Output is (frames, 128) float32: the reference's (1, 128, frames) after its transpose(1, 2),
which is what the speaker encoder takes. Everything runs in float32 like the reference
(numpy >= 2 keeps float32 through rfft). numpy's rfft stands in for torch.stft; a C port
uses a radix-2 FFT of size 1024 (real input, keep bins 0..512). Numpy and the standard
library only: this module belongs to the torch-free runtime.
"""
from __future__ import annotations

import math

import numpy as np

from .wav import SAMPLE_RATE

N_FFT = 1024
WIN_SIZE = 1024
HOP_SIZE = 256
N_MELS = 128
FMIN = 0.0
FMAX = 12000.0
PAD = (N_FFT - HOP_SIZE) // 2  # 384
MAG_EPS = 1e-9  # added under the square root of the magnitude
LOG_CLIP = 1e-5  # floor before the log

# Slaney mel scale (librosa htk=False): linear below 1 kHz, logarithmic above.
_F_SP = 200.0 / 3  # Hz per mel in the linear part
_MIN_LOG_HZ = 1000.0  # where the log part starts
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # = 15 mel
_LOGSTEP = math.log(6.4) / 27.0  # log(Hz ratio) per mel in the log part


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: m = f / (200/3) below 1 kHz, 15 + ln(f / 1000) / (ln(6.4) / 27) above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _F_SP
    log_part = hz >= _MIN_LOG_HZ
    mel[log_part] = _MIN_LOG_MEL + np.log(hz[log_part] / _MIN_LOG_HZ) / _LOGSTEP
    return mel


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    """Inverse of `hz_to_mel`: f = (200/3) m below 15 mel, 1000 exp((ln(6.4) / 27) (m - 15)) above."""
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * _F_SP
    log_part = mel >= _MIN_LOG_MEL
    hz[log_part] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel[log_part] - _MIN_LOG_MEL))
    return hz


def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                   fmin: float = FMIN, fmax: float = FMAX) -> np.ndarray:
    """(n_mels, n_fft//2 + 1) float32, equal to `librosa.filters.mel(sr=, n_fft=, n_mels=, fmin=, fmax=)`.

    Edges: n_mels + 2 points evenly spaced on the Slaney mel scale between fmin and fmax,
    mapped back to Hz (f_0 .. f_{n_mels+1}). Filter i is a triangle over the FFT bin
    frequencies k * sr / n_fft: rising from f_i to a peak of 1 at f_{i+1}, falling to 0 at
    f_{i+2}, i.e. max(0, min((f - f_i) / (f_{i+1} - f_i), (f_{i+2} - f) / (f_{i+2} - f_{i+1}))).
    Slaney normalization scales it by 2 / (f_{i+2} - f_i), giving every filter the same area.
    Computed in float64; the triangle is rounded to float32 before the scaling and again
    after, in the order librosa does it, so the result matches it bit for bit.
    """
    bins = np.arange(n_fft // 2 + 1, dtype=np.float64) * (sr / n_fft)  # np.fft.rfftfreq
    edges = mel_to_hz(np.linspace(hz_to_mel(np.array([fmin]))[0], hz_to_mel(np.array([fmax]))[0], n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lo) / (mid - lo)
    falling = (hi - bins[None, :]) / (hi - mid)
    triangles = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    return (triangles * (2.0 / (hi - lo))).astype(np.float32)


def hann_window(n: int = WIN_SIZE) -> np.ndarray:
    """Periodic Hann window, float32: 0.5 - 0.5 cos(2 pi k / n), k = 0..n-1.

    Follows torch.hann_window's recipe (float32 angle, cosine, * -0.5 + 0.5); torch's own
    vectorized cosine still differs from this on a few taps by one float32 ulp (6e-8).
    """
    angle = np.arange(n, dtype=np.float32) * np.float32(2.0 * math.pi / n)
    cos = np.cos(angle.astype(np.float64)).astype(np.float32)
    return (cos * np.float32(-0.5) + np.float32(0.5)).astype(np.float32)


def num_frames(n_samples: int) -> int:
    """Frames the reference produces for a wav of n_samples: 1 + (n + 2*384 - 1024) // 256."""
    return 1 + (n_samples + 2 * PAD - N_FFT) // HOP_SIZE


def frames(wav: np.ndarray) -> np.ndarray:
    """Reflect-padded, windowed frames (num_frames, 1024) float32."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"mel_spectrogram takes a mono wav of shape (n,), got {wav.shape}")
    if wav.shape[0] <= PAD:
        # torch's reflect pad refuses a pad as long as the input; so do we.
        raise ValueError(f"wav too short for the mel frontend: {wav.shape[0]} samples, need > {PAD}")
    padded = np.pad(wav, PAD, mode="reflect")
    view = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_SIZE]
    return view * hann_window(WIN_SIZE)


def magnitude(windowed: np.ndarray) -> np.ndarray:
    """|rfft| of each frame, (frames, 513) float32: sqrt(re^2 + im^2 + 1e-9)."""
    spec = np.fft.rfft(windowed, n=N_FFT, axis=-1)
    re = spec.real.astype(np.float32)
    im = spec.imag.astype(np.float32)
    return np.sqrt(re * re + im * im + np.float32(MAG_EPS)).astype(np.float32)


_MEL_BASIS_T: np.ndarray | None = None


def _mel_basis_t() -> np.ndarray:
    """The filterbank for the model's settings, transposed to (513, 128), built once."""
    global _MEL_BASIS_T
    if _MEL_BASIS_T is None:
        _MEL_BASIS_T = np.ascontiguousarray(mel_filterbank().T)
    return _MEL_BASIS_T


def mel_spectrogram(wav: np.ndarray) -> np.ndarray:
    """Log-mel features for the speaker encoder: (frames, 128) float32 from a 24 kHz mono wav (n,).

    frames = 1 + (n + 2*384 - 1024) // 256; the wav needs more than 384 samples.
    """
    mel = magnitude(frames(wav)) @ _mel_basis_t()
    return np.log(np.maximum(mel, np.float32(LOG_CLIP))).astype(np.float32)
