"""What every benchmark speaks: one text, one voice clip, one language, greedy. Introduced in 11.

The CPU and the GPU harness, the codec, streaming, quality and overlap measurements all take their prompt from
here, so rows of different files describe the same work: an x-vector clone of data/inputs/voice.wav saying `TEXT`
in English, greedy (random weights practically never emit EOS, so a run makes exactly the frames asked for; a real
checkpoint stops earlier and every time is divided by the frames made).
"""
from __future__ import annotations

from pathlib import Path

from .. import paths
from ..runtime.pipeline.precision import HEADS, weight_bytes

TEXT = "Hello from ncnn. Every token of this sentence is checked against PyTorch."
LANGUAGE = "english"


def voice_wav() -> Path:
    return paths.voice_wav()


def weight_bytes_per_frame(ncnn_dir: Path, groups: int = 16, precision: str = "fp32") -> int:
    """Weights one frame reads: the talker decoder and codec head once, the code predictor's decoder
    and one of its heads per predicted codebook (15). Embedding lookups read a few rows only. A precision
    tier (chapter 13) stores the two decoders in fewer bytes per weight, and int8 the predictor's heads too."""
    size = lambda name: (ncnn_dir / f"{name}.bin").stat().st_size  # noqa: E731
    shrink = weight_bytes(precision) / 4.0
    heads = shrink if precision == "int8" and "predictor_heads" in HEADS else 1.0
    per_head = size("predictor_heads") / (groups - 1)
    return int(shrink * size("talker_decoder") + size("talker_codec_head")
               + (groups - 1) * (shrink * size("predictor_decoder") + heads * per_head))


def voice(synth):
    """The workload's voice on any checkpoint kind: an x-vector clone of the clip (Base), the first built-in speaker
    (CustomVoice), the described voice of the goldens (VoiceDesign)."""
    from ..reference import DESIGNED_VOICE
    from ..runtime import load_wav

    if synth.kind == "custom_voice":
        return synth.voice(speaker=synth.speakers[0])
    if synth.kind == "voice_design":
        return synth.voice(instruct=DESIGNED_VOICE)
    return synth.voice(wav=load_wav(voice_wav()))
