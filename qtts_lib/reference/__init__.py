"""The reference model: the real `qwen-tts` package, 12 Hz path only. Introduced in 00.

`qwen_tts/__init__` imports the 25 Hz speech tokenizer module, and only that
module needs torchaudio/sox/onnxruntime/einops. We register a placeholder under
its name before the first import; the 12 Hz path never touches it.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

V1_MODULE = "qwen_tts.core.tokenizer_25hz.modeling_qwen3_tts_tokenizer_v1"


class _Tokenizer25HzUnavailable:
    """Stands in for the 25 Hz tokenizer model, which this project does not use."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("the 25 Hz speech tokenizer is not available in qtts (12 Hz path only)")


def import_qwen_tts():
    """Import `qwen_tts` without its 25 Hz dependencies; returns the package."""
    if V1_MODULE not in sys.modules:
        placeholder = types.ModuleType(V1_MODULE)
        placeholder.Qwen3TTSTokenizerV1Model = _Tokenizer25HzUnavailable
        placeholder.__doc__ = "placeholder registered by qtts_lib.reference (12 Hz path only)"
        sys.modules[V1_MODULE] = placeholder
    import qwen_tts

    return qwen_tts


def load(model_dir: str | Path, threads: int | None = None, attn: str = "sdpa"):
    """Load a checkpoint directory with qwen_tts's own loader, CPU fp32, offline."""
    import os

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if threads is not None:
        torch.set_num_threads(threads)
    qwen_tts = import_qwen_tts()
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation=attn, local_files_only=True
    )
    tts.model.eval()
    return tts


GREEDY = dict(do_sample=False, subtalker_dosample=False)
"""Greedy settings for golden references: talker and sub-talker take the argmax.

Everything else (repetition_penalty 1.05, min_new_tokens 2, the suppressed
control-token range) stays as the checkpoint's generation_config and
`Qwen3TTSForConditionalGeneration.generate` set it, so the port must reproduce it."""
