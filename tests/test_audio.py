import numpy as np
import pytest
import soundfile as sf

from qtts_lib.runtime.audio.wav import load_wav
from qtts_lib.runtime.errors import AudioError


def test_native_24k_mono_is_untouched(tmp_path):
    x = (np.random.default_rng(0).standard_normal(4800) * 0.1).astype(np.float32)
    sf.write(tmp_path / "a.wav", x, 24000, subtype="FLOAT")
    np.testing.assert_array_equal(load_wav(tmp_path / "a.wav"), x)


def test_other_rate_and_stereo_are_converted_with_a_note(tmp_path, capsys):
    t = np.arange(16000) / 16000
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32) * 0.5
    sf.write(tmp_path / "b.wav", np.stack([tone, tone], 1), 16000)
    y = load_wav(tmp_path / "b.wav")
    seen = capsys.readouterr()
    assert "2 channels" in seen.err and "16000 Hz" in seen.err and not seen.out  # stdout may be carrying a wav
    assert len(y) == 24000
    spectrum = np.abs(np.fft.rfft(y))
    assert abs(np.argmax(spectrum) * 24000 / len(y) - 440) < 2  # still a 440 Hz tone
    with pytest.raises(AudioError, match="2 channels"):
        load_wav(tmp_path / "b.wav", strict=True)
    sf.write(tmp_path / "c.wav", tone, 16000)
    with pytest.raises(AudioError, match="16000 Hz"):
        load_wav(tmp_path / "c.wav", strict=True)


def test_missing_and_unreadable(tmp_path):
    with pytest.raises(AudioError, match="not found"):
        load_wav(tmp_path / "nope.wav")
    (tmp_path / "junk.wav").write_bytes(b"not a wav at all")
    with pytest.raises(AudioError, match="cannot read"):
        load_wav(tmp_path / "junk.wav")
