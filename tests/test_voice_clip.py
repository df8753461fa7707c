"""Voice clips people bring (qtts_lib.runtime.audio.clips.check_voice_clip and friends): one generated wav per rule,
then the same clips through `qtts say` (one line on stderr, exit status 2)."""
import numpy as np
import pytest
import soundfile as sf

from qtts_lib import paths
from qtts_lib.runtime.app.cli import main
from qtts_lib.runtime.audio import clips as audio
from qtts_lib.runtime.audio.clips import check_voice_clip, prepare_voice_clip, read_voice_clip, trim_voice_clip
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, load_wav
from qtts_lib.runtime.errors import AudioError

SR = SAMPLE_RATE


def speechlike(seconds: float, level: float = 0.1, seed: int = 0, gaps=()) -> np.ndarray:
    """A 150 Hz buzz with harmonics, syllable-rate (4 Hz) amplitude modulation and a little noise; silent gaps."""
    t = np.arange(int(seconds * SR)) / SR
    buzz = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 6))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    wav = buzz * envelope + 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    wav = level * wav / np.sqrt(np.mean(wav**2))
    for a, b in gaps:
        wav[int(a * SR):int(b * SR)] *= 1e-3
    return wav.astype(np.float32)


def test_a_good_clip_passes_silently():
    assert check_voice_clip(speechlike(5)) == []
    wav, messages = prepare_voice_clip(speechlike(5))
    assert len(wav) == 5 * SR and messages == []


def test_the_tutorials_voice_clip_passes():
    assert check_voice_clip(load_wav(paths.voice_wav())) == []


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_is_an_error(bad):
    wav = speechlike(3)
    wav[SR // 2: SR // 2 + 10] = bad
    with pytest.raises(AudioError, match=r"10 NaN or infinite samples \(the first at 0.50 s\)"):
        check_voice_clip(wav)


def test_shorter_than_the_minimum_is_an_error_saying_the_minimum():
    with pytest.raises(AudioError, match=r"0.10 s long; it must be at least 1 s"):
        check_voice_clip(speechlike(0.1))
    assert check_voice_clip(speechlike(audio.MIN_VOICE_SECONDS)) == []


def test_silence_is_an_error():
    with pytest.raises(AudioError, match="silent.*-60 dBFS floor"):
        check_voice_clip(np.zeros(3 * SR, np.float32))
    with pytest.raises(AudioError, match="silent"):
        check_voice_clip(speechlike(3, level=audio.SILENCE_RMS / 2))
    assert check_voice_clip(speechlike(3, level=audio.SILENCE_RMS * 2)) == []  # quiet, but there


def test_clipping_is_a_warning_naming_it():
    wav = np.clip(speechlike(3, level=0.5) * 3, -1, 1)
    (warning,) = check_voice_clip(wav)
    assert "clipped" in warning and "full scale" in warning
    barely = speechlike(3)
    barely[:10] = 1.0  # 10 samples of 72,000: below the 0.1% threshold
    assert check_voice_clip(barely) == []


def test_a_long_clip_is_trimmed_at_a_quiet_point_with_a_note():
    wav = speechlike(40, gaps=[(13.2, 13.5)])
    trimmed, note = trim_voice_clip(wav)
    assert 13.2 <= len(trimmed) / SR <= 13.5 and "40.0 s" in note and "--keep-long-voice" in note
    same, messages = prepare_voice_clip(wav)
    assert np.array_equal(same, trimmed) and messages == [f"note: {note}"]
    kept, messages = prepare_voice_clip(wav, keep_long=True)
    assert len(kept) == len(wav) and "kept the whole 40.0 s" in messages[0]
    short = speechlike(10)
    same, note = trim_voice_clip(short)
    assert same is short and note is None


def test_a_trimmed_clip_is_never_longer_than_the_maximum():
    trimmed, _ = trim_voice_clip(speechlike(20))  # no real pause: the quietest 50 ms wins anyway
    assert audio.MAX_VOICE_SECONDS - audio.TRIM_SEARCH_SECONDS <= len(trimmed) / SR <= audio.MAX_VOICE_SECONDS


def test_a_long_clip_with_a_transcript_is_refused_not_trimmed():
    with pytest.raises(AudioError, match="comes with a transcript.*--keep-long-voice"):
        prepare_voice_clip(speechlike(20), transcript="what it says")
    kept, messages = prepare_voice_clip(speechlike(20), transcript="what it says", keep_long=True)
    assert len(kept) == 20 * SR and "ICL prompt of 250 frames" in messages[0]


# ------------------------------------------------------------ one home: files and uploads (`read_voice_clip`)
def encoded(wav: np.ndarray, sr: int = SR, fmt: str = "WAV", subtype: str | None = "FLOAT") -> bytes:
    import io

    buf = io.BytesIO()
    sf.write(buf, wav, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize("make, message", [
    (lambda: nan_clip(), "NaN or infinite samples"),
    (lambda: speechlike(0.3), "it must be at least 1 s"),
    (lambda: np.zeros(3 * SR, np.float32), "is silent"),
    (lambda: np.clip(speechlike(3, level=0.5) * 3, -1, 1), None),
], ids=["nan", "short", "silent", "clipped"])
def test_an_upload_meets_the_same_rules_as_an_array(make, message):
    """The bytes of a file (as an upload brings them) pass the same checks, with the same messages."""
    wav = make()
    if message:
        with pytest.raises(AudioError, match=message):
            read_voice_clip(encoded(wav), name="the upload")
        with pytest.raises(AudioError, match=message):
            prepare_voice_clip(wav)
    else:
        clip = read_voice_clip(encoded(wav), name="the upload")
        assert clip.messages == tuple(prepare_voice_clip(wav)[1]) and "clipped" in clip.warnings[0]


def test_an_upload_at_another_rate_or_in_stereo_is_converted_with_a_note(tmp_path):
    wav = speechlike(4)
    stereo = np.stack([wav, wav], axis=1)
    clip = read_voice_clip(encoded(stereo[::3], SR // 3), name="alice.wav")
    assert clip.messages == ("note: alice.wav has 2 channels; averaging them to mono",
                             "note: alice.wav is 8000 Hz; resampling to 24000 Hz (polyphase)")
    assert abs(clip.seconds - 4) < 1e-3 and clip.wav.dtype == np.float32 and clip.warnings == []
    with pytest.raises(AudioError, match="alice.wav has 2 channels; the model takes mono"):
        read_voice_clip(encoded(stereo), strict=True, name="alice.wav")
    flac = read_voice_clip(encoded(wav, fmt="FLAC", subtype="PCM_16"))
    assert flac.messages == () and np.abs(flac.wav - wav).max() < 1e-4
    (tmp_path / "v.wav").write_bytes(encoded(wav))
    assert np.array_equal(read_voice_clip(tmp_path / "v.wav").wav, wav)
    with pytest.raises(AudioError, match="cannot read the upload as audio"):
        read_voice_clip(b"RIFF....not really", name="the upload")
    with pytest.raises(AudioError, match="not found"):
        read_voice_clip(tmp_path / "nope.wav")


def test_a_long_clip_names_the_front_ends_own_way_to_keep_it():
    """`keep_long_option` is how the caller keeps a long clip (qtts say: --keep-long-voice); None: no such way."""
    wav = speechlike(20, gaps=[(13.2, 13.5)])
    _, (note,) = prepare_voice_clip(wav, keep_long_option="keep_long=true")
    assert "keep_long=true keeps it all" in note and "--keep-long-voice" not in note
    _, (note,) = prepare_voice_clip(wav, keep_long_option=None)
    assert note.endswith("(a voice needs a few seconds)")
    with pytest.raises(AudioError, match="transcribe that part or drop the transcript to clone from the x-vector "
                                         "alone$"):
        read_voice_clip(encoded(wav), transcript="what it says", keep_long_option=None)


def test_a_clip_is_mono_samples():
    with pytest.raises(AudioError, match=r"mono samples, shape \(n,\), not \(72000, 2\)"):
        prepare_voice_clip(np.zeros((3 * SR, 2), np.float32))
    with pytest.raises(AudioError, match="array of samples, not str"):
        check_voice_clip("voice.wav")
    column, _ = prepare_voice_clip(speechlike(3)[:, None])
    assert column.shape == (3 * SR,)


# ------------------------------------------------------------ the same through `qtts say`
def say(tmp_path, wav, *extra):
    sf.write(tmp_path / "clip.wav", wav, SR, subtype="FLOAT")
    return main(["say", "--checkpoint", str(paths.model_dir("tiny-base")), "--voice", str(tmp_path / "clip.wav"),
                 "--text", "Hello.", "--language", "english", "--greedy", "--max-frames", "2", "--threads", "2",
                 "-o", str(tmp_path / "out.wav"), *extra])


def nan_clip():
    wav = speechlike(3)
    wav[100] = np.nan
    return wav


@pytest.mark.parametrize("make, message", [
    (nan_clip, "NaN or infinite samples"),
    (lambda: speechlike(0.3), "it must be at least 1 s"),
    (lambda: np.zeros(3 * SR, np.float32), "is silent"),
], ids=["nan", "short", "silent"])
def test_cli_refuses_bad_clips_with_exit_2(tmp_path, capsys, make, message):
    assert say(tmp_path, make()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qtts: error:") and message in err


def test_cli_refuses_a_long_icl_clip_with_exit_2(tmp_path, capsys):
    assert say(tmp_path, speechlike(20), "--voice-text", "what it says") == 2
    assert "comes with a transcript" in capsys.readouterr().err


@pytest.fixture(scope="module")
def exported(tts):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")


def test_cli_warns_on_clipping_and_trims_a_long_clip(exported, tmp_path, capsys):
    assert say(tmp_path, np.clip(speechlike(3, level=0.5) * 3, -1, 1)) == 0
    assert "qtts: warning: the voice clip is clipped" in capsys.readouterr().err
    assert say(tmp_path, speechlike(20, gaps=[(13.2, 13.5)])) == 0
    err = capsys.readouterr().err
    assert "qtts: note: the voice clip is 20.0 s; kept its first 13." in err
    assert say(tmp_path, speechlike(20), "--keep-long-voice") == 0
    assert "kept the whole 20.0 s" in capsys.readouterr().err
