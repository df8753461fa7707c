"""`Synthesizer.prompt` (`pipeline.prompt.PromptBuilder`) against the prompt the reference builds, for every way a
voice enters it.

The reference run is captured (`reference.capture_generation`, two new tokens) and the runtime is
given the same x-vector and voice codes, so only the prompt assembly is under test."""
import numpy as np
import pytest

from qtts_lib import check, checkpoint, export, inputs, paths, reference
from qtts_lib.runtime.audio.wav import load_wav
from qtts_lib.runtime.pipeline.prompt import Voice
from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

VOICE_TEXT = inputs.VOICE_TEXT


@pytest.fixture(scope="module")
def base(tts):
    export.ensure(tts, "tiny-base")
    return tts, Synthesizer(paths.model_dir("tiny-base"))


@pytest.fixture(scope="module")
def custom():
    tts = reference.load(checkpoint.ensure("tiny-customvoice"), threads=2)
    export.ensure(tts, "tiny-customvoice")
    return tts, Synthesizer(paths.model_dir("tiny-customvoice"))


def assert_same_prompt(ours, captured):
    assert ours.embeds.shape == captured["inputs_embeds"].shape
    assert ours.trailing.shape == captured["trailing_text_hidden"].shape
    assert check.rel_err(ours.embeds, captured["inputs_embeds"]) <= 1e-5
    assert check.rel_err(ours.trailing, captured["trailing_text_hidden"]) <= 1e-5
    assert check.rel_err(ours.tts_pad, captured["tts_pad_embed"]) <= 1e-5


@pytest.mark.parametrize("text", [inputs.TARGET_TEXT, "Hi"], ids=["sentence", "one-token"])
@pytest.mark.parametrize("non_streaming", [False, True], ids=["streaming", "non-streaming"])
@pytest.mark.parametrize("icl", [False, True], ids=["xvector", "icl"])
def test_cloned_voice(base, text, non_streaming, icl):
    tts, synth = base
    clip = load_wav(paths.voice_wav())
    run = reference.capture_generation(tts, text, "english", clip, VOICE_TEXT if icl else None,
                                       max_new_tokens=2, non_streaming=non_streaming)
    voice = Voice(run["xvector"], codes=run["voice_codes"] if icl else None, text=VOICE_TEXT if icl else None)
    assert voice.mode == ("icl" if icl else "xvector")
    assert_same_prompt(synth.prompt(text, "english", voice, non_streaming=non_streaming), run)


@pytest.mark.parametrize("non_streaming", [None, False], ids=["default", "streaming"])
@pytest.mark.parametrize("language", ["english", "auto"])
def test_builtin_speaker(custom, language, non_streaming):
    tts, synth = custom
    cfg = tts.model.config.talker_config
    # a dialect speaker with "auto" also checks the switch to the dialect's language tag
    speaker = next((s for s, d in cfg.spk_is_dialect.items() if d), synth.speakers[0]) if language == "auto" \
        else synth.speakers[0]
    run = reference.capture_generation(tts, inputs.TARGET_TEXT, language, speaker=speaker, max_new_tokens=2,
                                       non_streaming=non_streaming)
    ours = synth.prompt(inputs.TARGET_TEXT, language, synth.voice(speaker=speaker), non_streaming=non_streaming)
    assert_same_prompt(ours, run)


def test_voice_needs_exactly_one_source(base):
    _, synth = base
    from qtts_lib.runtime.errors import InputError

    with pytest.raises(InputError, match="exactly one voice"):
        synth.voice()
    with pytest.raises(InputError, match="transcript needs the voice clip"):
        synth.voice(xvector=np.zeros(128, np.float32), text="hello")
    with pytest.raises(InputError, match="unknown speaker"):
        synth.voice(speaker="nobody")
