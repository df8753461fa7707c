"""runtime.pipeline: the codec in a second process. Its audio is the in-process decoder's, its codes the loop's;
a cancelled stream does not leak into the next utterance; a dead child is an error, not a hang."""
import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.check import snr_db
from qtts_lib.runtime.audio.wav import load_wav
from qtts_lib.runtime.errors import InputError
from qtts_lib.runtime.experimental.codec_process import CodecProcessError
from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

CKPT = "tiny-base"
TEXT = "Two processes, one voice."


@pytest.fixture(scope="module")
def pair(tts):
    from qtts_lib import export

    export.ensure(tts, CKPT)
    local = Synthesizer(paths.model_dir(CKPT), threads=1)
    piped = Synthesizer(paths.model_dir(CKPT), threads=1, codec_process=True)
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
    a = local.synthesize(TEXT, "english", lv[mode], max_new_tokens=41)
    b = piped.synthesize(TEXT, "english", pv[mode], max_new_tokens=41)
    assert np.array_equal(a.codes, b.codes)
    extra = len(a.wav) - len(b.wav)  # ICL: synthesize's float-ratio cut may keep one sample of the clip (chapter 11)
    assert 0 <= extra <= (1 if mode == "icl" else 0)
    assert snr_db(b.wav, a.wav[extra:]) >= 100.0
    assert b.seconds["codec"] >= 0.0


def test_streamed_pieces_are_the_in_process_decoders(pair, voices):
    (local, piped), (lv, pv) = pair, voices
    ours = list(local.stream(TEXT, "english", lv["icl"], max_new_tokens=31, chunk_frames=4))
    theirs = list(piped.stream(TEXT, "english", pv["icl"], max_new_tokens=31, chunk_frames=4))
    assert np.array_equal(np.concatenate(ours), np.concatenate(theirs))  # the same arithmetic, in the child


def test_a_cancelled_stream_does_not_leak_into_the_next(pair, voices):
    piped, pv = pair[1], voices[1]
    whole = piped.synthesize(TEXT, "english", pv["xvector"], max_new_tokens=31).wav
    pieces = piped.stream(TEXT, "english", pv["xvector"], max_new_tokens=31, chunk_frames=1)
    next(pieces)
    pieces.close()
    assert np.array_equal(piped.synthesize(TEXT, "english", pv["xvector"], max_new_tokens=31).wav, whole)


def test_context_frames_and_gpus_are_refused(pair, voices):
    piped, pv = pair[1], voices[1]
    with pytest.raises(ValueError, match="context_frames"):
        list(piped.stream(TEXT, "english", pv["xvector"], max_new_tokens=5, context_frames=8))
    with pytest.raises(InputError, match="GPU"):
        Synthesizer(paths.model_dir(CKPT), device="vulkan", codec_process=True)


def test_a_dead_codec_process_is_an_error(tts):
    from qtts_lib import export

    export.ensure(tts, CKPT)
    synth = Synthesizer(paths.model_dir(CKPT), threads=1, codec_process=True)
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    synth.codec_process.proc.kill()
    synth.codec_process.proc.wait()
    with pytest.raises(CodecProcessError):
        synth.synthesize(TEXT, "english", voice, max_new_tokens=9)
