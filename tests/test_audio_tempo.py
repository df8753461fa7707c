"""`audio.tempo`: OpenAI's `speed` as FFmpeg's atempo (PyAV), piece by piece: the duration changes by the speed, the
pitch does not, and a piece-by-piece run is the whole run sample for sample."""
import sys

import numpy as np
import pytest

from qtts_lib.runtime.audio import tempo
from qtts_lib.runtime.audio.wav import SAMPLE_RATE as SR
from qtts_lib.runtime.errors import InputError

F0 = 180.0  # a voice's fundamental


def voiced(seconds: float = 4.0) -> np.ndarray:
    """A 180 Hz tone with five harmonics, at a syllable rate (4 Hz) of loudness, and a little noise."""
    t = np.arange(int(seconds * SR)) / SR
    tone = sum(np.sin(2 * np.pi * F0 * k * t) / k for k in range(1, 6)) * (0.55 + 0.45 * np.sin(2 * np.pi * 4 * t))
    wav = 0.1 * tone + 0.002 * np.random.default_rng(0).standard_normal(len(t))
    return wav.astype(np.float32)


def pitch(wav: np.ndarray) -> float:
    """The strongest spectral peak (the fundamental here), interpolated between bins."""
    spectrum = np.abs(np.fft.rfft(wav * np.hanning(len(wav))))
    k = int(np.argmax(spectrum[1:])) + 1
    a, b, c = np.log(spectrum[k - 1:k + 2])
    return (k + 0.5 * (a - c) / (a - 2 * b + c)) * SR / len(wav)


def centroid(wav: np.ndarray) -> float:
    """The spectral centroid, weighted by power (the harmonics, not the noise floor between them)."""
    power = np.abs(np.fft.rfft(wav * np.hanning(len(wav)))) ** 2
    return float((np.fft.rfftfreq(len(wav), 1 / SR) * power).sum() / power.sum())


def cut(wav: np.ndarray, seed: int = 1) -> list[np.ndarray]:
    """Pieces of random sizes, some empty, some a sample long (what a stream may hand over)."""
    sizes = np.random.default_rng(seed).choice([0, 1, 7, 480, 1920, 7680, 5003], 400)
    return np.split(wav, np.cumsum(sizes)[np.cumsum(sizes) < len(wav)])


@pytest.mark.parametrize("speed", [0.5, 2.0, 0.25, 4.0, 1.3])
def test_speed_changes_the_duration_not_the_pitch(speed):
    wav = voiced()
    fast = tempo.change_tempo(wav, speed)
    assert abs(len(fast) * speed / len(wav) - 1) < 0.05, len(fast)
    assert abs(pitch(fast) / pitch(wav) - 1) < 0.05, (pitch(wav), pitch(fast))
    assert abs(pitch(wav) / F0 - 1) < 0.01
    assert abs(centroid(fast) / centroid(wav) - 1) < 0.05, (centroid(wav), centroid(fast))
    assert fast.dtype == np.float32 and np.isfinite(fast).all()


@pytest.mark.parametrize("speed", [0.5, 2.0, 0.25, 4.0, 0.8])
def test_piece_by_piece_is_the_whole_run(speed):
    """The filter buffers its own windows: pieces of any size give the whole run's samples, and a write gives back
    samples as they are ready (not all at the close)."""
    wav = voiced(3.0)
    whole = tempo.change_tempo(wav, speed)
    t = tempo.Tempo(speed)
    outs = [t.write(p) for p in cut(wav)]
    rest = t.close()
    assert np.array_equal(np.concatenate(outs + [rest]), whole)
    assert sum(map(len, outs)) > len(whole) // 2 and t.samples_in == len(wav) and t.samples_out == len(whole)
    assert np.array_equal(np.concatenate(list(tempo.tempo_pieces(cut(wav, seed=2), speed))), whole)


def test_stages_stay_in_one_filters_range():
    assert tempo.stages(4.0) == [2.0, 2.0] and tempo.stages(0.25) == [0.5, 0.5] and tempo.stages(2.0) == [2.0]
    for speed in np.linspace(tempo.MIN_SPEED, tempo.MAX_SPEED, 97):
        factors = tempo.stages(float(speed))
        assert all(tempo.STAGE_MIN - 1e-12 <= f <= tempo.STAGE_MAX + 1e-12 for f in factors)
        assert np.isclose(np.prod(factors), speed) and len(factors) <= 2


def test_speed_one_passes_the_samples_through_without_ffmpeg(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    wav = voiced(1.0)
    t = tempo.Tempo(1.0)
    assert t.write(wav) is not None and np.array_equal(t.write(wav), wav) and len(t.close()) == 0
    assert np.array_equal(np.concatenate(list(tempo.tempo_pieces([wav, wav], 1))), np.concatenate([wav, wav]))
    with pytest.raises(InputError, match="speed other than 1.0 needs PyAV.*pip install av"):
        tempo.Tempo(1.5)


@pytest.mark.parametrize("bad", [0.2, 4.5, 0, -1, float("nan"), float("inf"), "fast", True, None])
def test_a_speed_out_of_range_says_the_range(bad):
    with pytest.raises(InputError, match="speed must be a number from 0.25 to 4.0"):
        tempo.Tempo(bad)
