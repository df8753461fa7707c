"""runtime.experimental.codec_process: the codec in a second process. Its codes are the loop's and its audio the
in-process decoder's; a cancelled stream does not leak into the next utterance; a dead child is an error, not a
hang."""
import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.check import snr_db
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.experimental.codec_process import CodecProcess, CodecProcessError

CKPT = "tiny-base"
TEXT = "Two processes, one voice."
GREEDY = Sampling(greedy=True)


@pytest.fixture(scope="module")
def pair(tts):
    from qtts_lib import export

    export.ensure(tts, CKPT)
    local = Synthesizer(paths.model_dir(CKPT), threads=1)
    piped = Synthesizer(paths.model_dir(CKPT), threads=1, decoders=CodecProcess.for_checkpoint(paths.model_dir(CKPT)))
    yield local, piped
    piped.close()


@pytest.fixture(scope="module")
def voices(pair):
    clip = load_wav(paths.voice_wav())
    text = (paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip()
    return [{"xvector": s.voice(wav=clip), "icl": s.voice(wav=clip, text=text)} for s in pair]


@pytest.mark.parametrize("mode", ["xvector", "icl"])
def test_synthesize_with_a_codec_process_is_synthesize(pair, voices, mode):
    (local, piped), (lv, pv) = pair, voices
    a = local.synthesize(TEXT, "english", lv[mode], GREEDY, max_frames=40)
    b = piped.synthesize(TEXT, "english", pv[mode], GREEDY, max_frames=40)
    assert np.array_equal(a.codes, b.codes)
    extra = len(a.wav) - len(b.wav)  # ICL: synthesize's float-ratio cut may keep one sample of the clip (chapter 15)
    assert 0 <= extra <= (1 if mode == "icl" else 0)
    assert snr_db(b.wav, a.wav[extra:]) >= 100.0


def test_streamed_pieces_are_the_in_process_decoders(pair, voices):
    (local, piped), (lv, pv) = pair, voices
    ours = list(local.stream(TEXT, "english", lv["icl"], GREEDY, max_frames=30, chunk_frames=4))
    theirs = list(piped.stream(TEXT, "english", pv["icl"], GREEDY, max_frames=30, chunk_frames=4))
    assert np.array_equal(np.concatenate(ours), np.concatenate(theirs))  # the same arithmetic, in the child


def test_a_cancelled_stream_does_not_leak_into_the_next(pair, voices):
    """synthesize's pieces in the child are as long as whatever has come when the child is free, so two runs can
    differ in the last bits (float sums over other chunk lengths); what must hold is the utterance itself: the same
    codes, the same length, and the in-process whole decode's audio to float rounding, with no leftover of the
    cancelled stream in front."""
    (local, piped), (lv, pv) = pair, voices
    whole = local.synthesize(TEXT, "english", lv["xvector"], GREEDY, max_frames=30)
    pieces = piped.stream(TEXT, "english", pv["xvector"], GREEDY, max_frames=30, chunk_frames=1)
    next(pieces)
    pieces.close()
    after = piped.synthesize(TEXT, "english", pv["xvector"], GREEDY, max_frames=30)
    assert np.array_equal(after.codes, whole.codes) and len(after.wav) == len(whole.wav)
    assert snr_db(after.wav, whole.wav) >= 100.0


def test_a_dead_codec_process_is_an_error(tts):
    from qtts_lib import export

    export.ensure(tts, CKPT)
    process = CodecProcess.for_checkpoint(paths.model_dir(CKPT))
    synth = Synthesizer(paths.model_dir(CKPT), threads=1, decoders=process)
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    process.proc.kill()
    process.proc.wait()
    with pytest.raises(CodecProcessError):
        synth.synthesize(TEXT, "english", voice, GREEDY, max_frames=8)


def test_a_codec_process_in_the_int8_tier(tts):
    """The child decodes in the codec tier it is given: the int8 stream's pieces are the in-process int8 codec's
    (the same arithmetic, in the child), and an unknown tier is refused before any child starts."""
    from qtts_lib import export
    from qtts_lib.runtime.errors import PrecisionError

    export.ensure(tts, CKPT)
    with pytest.raises(PrecisionError):
        CodecProcess.for_checkpoint(paths.model_dir(CKPT), precision="fp8")
    local = Synthesizer(paths.model_dir(CKPT), threads=1, codec_precision="int8")
    with Synthesizer(paths.model_dir(CKPT), threads=1,
                     decoders=CodecProcess.for_checkpoint(paths.model_dir(CKPT), precision="int8")) as piped:
        voice = [s.voice(wav=load_wav(paths.voice_wav())) for s in (local, piped)]
        ours = list(local.stream(TEXT, "english", voice[0], GREEDY, max_frames=16, chunk_frames=4))
        theirs = list(piped.stream(TEXT, "english", voice[1], GREEDY, max_frames=16, chunk_frames=4))
    assert np.array_equal(np.concatenate(ours), np.concatenate(theirs))
    fp32 = list(Synthesizer(paths.model_dir(CKPT), threads=1).stream(TEXT, "english", voice[0], GREEDY, max_frames=16,
                                                                     chunk_frames=4))
    assert not np.array_equal(np.concatenate(fp32), np.concatenate(theirs))  # really the int8 tier
