"""qtts_lib.runtime.mel against the reference mel_spectrogram (torch) and librosa's filterbank."""
import numpy as np
import pytest
import soundfile as sf

from qtts_lib.paths import ROOT
from qtts_lib.runtime.audio import mel as M

VOICE_WAV = ROOT / "data" / "inputs" / "voice.wav"


@pytest.fixture(scope="module")
def reference_mel():
    """The reference, called exactly as extract_speaker_embedding calls it; returns (frames, 128)."""
    import torch

    from qtts_lib import reference

    reference.import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    def run(wav: np.ndarray) -> np.ndarray:
        out = mel_spectrogram(torch.from_numpy(wav).unsqueeze(0), n_fft=1024, num_mels=128,
                              sampling_rate=24000, hop_size=256, win_size=1024, fmin=0, fmax=12000)
        return out.transpose(1, 2)[0].numpy()

    return run


def _chirp(n: int, f0: float = 100.0, f1: float = 11000.0) -> np.ndarray:
    t = np.arange(n) / 24000
    return 0.5 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * t[-1]) * t**2))


def _wav(name: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if name == "voice.wav":
        wav, sr = sf.read(str(VOICE_WAV), dtype="float32")
        assert sr == 24000
        return wav
    if name == "noise":
        return (rng.standard_normal(37123) * 0.1).astype(np.float32)
    if name == "chirp+dither":  # 50001 samples: not a multiple of 256
        return (_chirp(50001) + rng.standard_normal(50001) * 1e-3).astype(np.float32)
    if name == "short":  # 2000 samples: 7 frames, both reflect pads inside the first/last frames
        return (rng.standard_normal(2000) * 0.2).astype(np.float32)
    if name == "pure chirp":
        return _chirp(50001).astype(np.float32)
    raise KeyError(name)


def _cos_rel(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    a, b = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    return cos, rel


@pytest.mark.parametrize("name", ["voice.wav", "noise", "chirp+dither", "short"])
def test_parity_with_reference(reference_mel, name):
    wav = _wav(name)
    ref = reference_mel(wav)
    ours = M.mel_spectrogram(wav)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (M.num_frames(len(wav)), 128)
    cos, rel = _cos_rel(ours, ref)
    print(f"{name}: {len(wav)} samples, {ours.shape[0]} frames, 1-cos={1 - cos:.1e} rel={rel:.2e}")
    assert cos >= 0.9999999 and rel <= 1e-5, (cos, rel)


def test_pure_chirp_is_limited_by_float32(reference_mel):
    """A noiseless chirp leaves most mel bands ~140 dB under the peak, where both sides'
    float32 rounding (FFT, window taps) sets the value; log() amplifies that. Measured rel
    1.3e-5 here, while the reference is itself 2.0e-5 away from a float64 computation."""
    wav = _wav("pure chirp")
    cos, rel = _cos_rel(M.mel_spectrogram(wav), reference_mel(wav))
    assert cos >= 0.9999999 and rel <= 3e-5, (cos, rel)


def test_filterbank_equals_librosa():
    import librosa

    for sr, n_fft, n_mels, fmin, fmax in [(24000, 1024, 128, 0, 12000), (22050, 2048, 80, 0, 8000),
                                          (16000, 512, 40, 20, 8000)]:
        ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
        ours = M.mel_filterbank(sr, n_fft, n_mels, fmin, fmax)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= 1e-7


def test_mel_scale_is_slaney():
    assert np.allclose(M.hz_to_mel(np.array([0.0, 500.0, 1000.0])), [0.0, 7.5, 15.0])  # linear part
    assert np.isclose(M.hz_to_mel(np.array([6400.0]))[0], 15 + 27)  # log part: 27 mel per x6.4
    f = np.array([0.0, 300.0, 999.0, 1000.0, 4321.0, 12000.0])
    assert np.allclose(M.mel_to_hz(M.hz_to_mel(f)), f)


def test_hann_window_matches_torch():
    import torch

    ours, ref = M.hann_window(1024), torch.hann_window(1024).numpy()
    assert ours.dtype == np.float32 and ours[0] == 0.0 and ours[512] == 1.0
    assert np.abs(ours - ref).max() <= 6e-8  # one float32 ulp at most


@pytest.mark.parametrize("n", [385, 1000, 2000, 24000, 24001, 24000 + 255])
def test_frames_formula(reference_mel, n):
    wav = (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    assert M.num_frames(n) == 1 + (n + 768 - 1024) // 256
    assert M.mel_spectrogram(wav).shape == reference_mel(wav).shape == (M.num_frames(n), 128)


def test_reflect_pad_edges():
    wav = _wav("short")
    fr = M.frames(wav) / np.where(M.hann_window() == 0, 1, M.hann_window())
    # first frame: x[384], ..., x[1], then x[0], x[1], ... (edge sample not repeated)
    np.testing.assert_allclose(fr[0, 1:384], wav[383:0:-1], rtol=1e-6)
    np.testing.assert_allclose(fr[0, 384:1024], wav[:640], rtol=1e-6)
    # last frame runs into the right pad: ..., x[-1], x[-2], ...
    start = (M.num_frames(len(wav)) - 1) * 256 - 384
    tail = np.concatenate([wav[start:], wav[-2:-386:-1]])[:1024]
    np.testing.assert_allclose(fr[-1, 1:], tail[1:], rtol=1e-6)  # tap 0 of the window is 0
    with pytest.raises(ValueError, match="too short"):
        M.mel_spectrogram(wav[:384])
    with pytest.raises(ValueError, match="mono"):
        M.mel_spectrogram(np.zeros((2, 4800), np.float32))
