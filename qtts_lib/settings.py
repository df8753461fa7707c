"""The settings a chapter runs under, read from the environment. Introduced in 00.

`QTTS_CHECKPOINT` picks the checkpoint (default tiny-base), `QTTS_THREADS` the CPU threads for
torch and ncnn (default 2, the CI machine's cores), `QTTS_DEVICE` where ncnn runs (cpu, vulkan,
vulkan:N; default cpu). Paths live in `qtts_lib.paths`; these are not paths.
"""
from __future__ import annotations

import os

from . import paths

DEFAULT_CHECKPOINT = "tiny-base"


class UnknownCheckpoint(ValueError):
    pass


def checkpoint() -> str:
    """The checkpoint name every chapter works on: `QTTS_CHECKPOINT`, default tiny-base."""
    name = os.environ.get("QTTS_CHECKPOINT", "").strip() or DEFAULT_CHECKPOINT
    valid = list(paths.SYNTHETIC) + paths.real_checkpoints()
    if name not in valid:
        raise UnknownCheckpoint(
            f"QTTS_CHECKPOINT={name!r} is not a known checkpoint. Valid choices: {', '.join(valid)}. "
            "To use a real checkpoint, put its directory (config.json, model.safetensors, "
            "speech_tokenizer/, tokenizer files) under models/, e.g. models/Qwen3-TTS-12Hz-0.6B-Base, "
            "and set QTTS_CHECKPOINT to the directory name."
        )
    return name


def threads() -> int:
    """CPU threads for torch and ncnn (`QTTS_THREADS`, default 2).

    Golden references are only bitwise repeatable at a fixed thread count."""
    value = os.environ.get("QTTS_THREADS", "2").strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"QTTS_THREADS={value!r}: give a whole number of threads, at least 1")
    return int(value)


def device() -> str:
    """Where the chapters run ncnn: `QTTS_DEVICE` (cpu, vulkan, vulkan:N), default cpu."""
    return os.environ.get("QTTS_DEVICE", "").strip() or "cpu"
