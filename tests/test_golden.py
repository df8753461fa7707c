"""The runtime against the reference, end to end, in the unit suite (llm.c's test_gpt2): chapter 03's greedy golden
files (made here by the same functions when the chapter has not run yet), and the runtime's greedy codes for an
x-vector clone, an ICL clone and a built-in speaker, token for token, with the waveform beside them."""
import numpy as np
import pytest

from qtts_lib import check, checkpoint, export, golden, inputs, paths, reference
from qtts_lib.runtime import Sampling, Synthesizer, load_wav

GREEDY = Sampling(greedy=True)
FRAMES = inputs.GOLDEN_MAX_NEW_TOKENS - 1  # HF's max_new_tokens N gives N - 1 frames; the runtime counts frames


@pytest.fixture(scope="module")
def base(tts):
    export.ensure(tts, "tiny-base")
    return Synthesizer(paths.model_dir("tiny-base")), golden.ensure("tiny-base", tts)


@pytest.fixture(scope="module")
def custom():
    tts = reference.load(checkpoint.ensure("tiny-customvoice"), threads=2)
    export.ensure(tts, "tiny-customvoice")
    return Synthesizer(paths.model_dir("tiny-customvoice")), golden.ensure("tiny-customvoice", tts)


def assert_matches(synth, voice, gold):
    result = synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, GREEDY, max_frames=FRAMES)
    bad, total = check.mismatches(result.codes, gold["codes"]) if result.codes.shape == gold["codes"].shape \
        else (-1, gold["codes"].size)
    assert (bad, total) == (0, FRAMES * 16), f"{bad}/{total} codes differ (shapes {result.codes.shape})"
    assert result.eos_step == int(gold["eos_step"])
    assert result.stopped == ("cap" if result.eos_step < 0 else "eos")
    extra = len(result.wav) - len(gold["wav"])  # ICL: the reference's float-ratio cut (chapter 15)
    assert 0 <= extra <= 1
    assert check.snr_db(result.wav[extra:], gold["wav"]) >= 60.0


def test_xvector_clone_equals_the_golden(base):
    synth, gold = base
    assert_matches(synth, synth.voice(xvector=gold["xvec_greedy"]["xvector"]), gold["xvec_greedy"])


def test_icl_clone_equals_the_golden(base):
    """The voice made by the runtime itself (numpy mel, ncnn speaker encoder, ncnn Mimi + numpy RVQ)."""
    synth, gold = base
    voice = synth.voice(wav=load_wav(paths.voice_wav()), text=(paths.INPUTS / "voice.txt").read_text().strip())
    np.testing.assert_array_equal(voice.codes, gold["icl_greedy"]["voice_codes"])
    assert check.cos_sim(voice.speaker_row, gold["icl_greedy"]["xvector"]) > 1 - 1e-5
    assert_matches(synth, voice, gold["icl_greedy"])


def test_builtin_speaker_equals_the_golden(custom):
    synth, gold = custom
    assert_matches(synth, synth.voice(speaker=synth.speakers[0]), gold["speaker_greedy"])


def test_the_gpu_loop_equals_the_golden(base):
    """The GPU forms (packed caches, the fused predictor) on a Vulkan device: the same codes. Skipped, with the
    reason, where ncnn sees no Vulkan device; a failure where QTTS_REQUIRE_VULKAN is set (.ci/run)."""
    from qtts_lib.lab.vulkan import vulkan_or_skip

    found, why = vulkan_or_skip()
    if not found:
        pytest.skip(why)
    synth, gold = base
    gpu = Synthesizer(paths.model_dir("tiny-base"), device="vulkan")
    assert_matches(gpu, gpu.voice(xvector=gold["xvec_greedy"]["xvector"]), gold["xvec_greedy"])


@pytest.mark.parametrize("ckpt", ["tiny-1.7b-base", "tiny-1.7b-customvoice", "tiny-voicedesign"])
def test_every_prompt_kind_of_the_wider_checkpoints_equals_its_golden(ckpt):
    """tiny-1.7b-* and tiny-voicedesign: a talker wider than its code predictor (the projection and the wide tables
    are real); x-vector and ICL clones, a speaker with and without an instruction, a voice described and not."""
    tts = reference.load(checkpoint.ensure(ckpt), threads=2)
    export.ensure(tts, ckpt)
    synth = Synthesizer(paths.model_dir(ckpt))
    assert synth.config.talker["hidden_size"] != synth.config.predictor["hidden_size"]
    goldens = golden.ensure(ckpt, tts)
    for name, voice in golden.cases(tts).items():
        if "voice_wav" in voice:
            v = synth.voice(wav=voice["voice_wav"], text=voice.get("voice_text"))
        elif "speaker" in voice:
            v = synth.voice(speaker=voice["speaker"], instruct=voice.get("instruct"))
        else:
            v = synth.voice(instruct=voice["instruct"])
        assert_matches(synth, v, goldens[name])
