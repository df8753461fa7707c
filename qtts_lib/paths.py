"""Where every artifact lives. Introduced in 00.

All chapters resolve files through here, so a checkout can be moved and the
checkpoint switched with one environment variable (`QTTS_CHECKPOINT`).
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
DATA = ROOT / "data"
INPUTS = DATA / "inputs"
CONFIGS = Path(__file__).resolve().parent / "configs"

DEFAULT_CHECKPOINT = "tiny-base"
# name -> (size, variant); these are synthesized when not on disk.
SYNTHETIC = {
    "tiny-base": ("tiny", "base"),
    "tiny-customvoice": ("tiny", "customvoice"),
    "full-base": ("full", "base"),
    "full-customvoice": ("full", "customvoice"),
}


class UnknownCheckpoint(ValueError):
    pass


def real_checkpoints() -> list[str]:
    """Directories under models/ that hold a checkpoint we did not synthesize."""
    if not MODELS.is_dir():
        return []
    found = []
    for d in sorted(MODELS.iterdir()):
        if d.name in SYNTHETIC or not d.is_dir():
            continue
        if (d / "config.json").is_file() and (d / "model.safetensors").is_file():
            found.append(d.name)
    return found


def checkpoint() -> str:
    """The checkpoint name every chapter works on: `QTTS_CHECKPOINT`, default tiny-base."""
    name = os.environ.get("QTTS_CHECKPOINT", "").strip() or DEFAULT_CHECKPOINT
    valid = list(SYNTHETIC) + real_checkpoints()
    if name not in valid:
        raise UnknownCheckpoint(
            f"QTTS_CHECKPOINT={name!r} is not a known checkpoint. Valid choices: {', '.join(valid)}. "
            "To use a real checkpoint, put its directory (config.json, model.safetensors, "
            "speech_tokenizer/, tokenizer files) under models/, e.g. models/Qwen3-TTS-12Hz-0.6B-Base, "
            "and set QTTS_CHECKPOINT to the directory name."
        )
    return name


def model_dir(ckpt: str) -> Path:
    return MODELS / ckpt


def ncnn_dir(ckpt: str) -> Path:
    return MODELS / ckpt / "ncnn"


def golden_dir(ckpt: str) -> Path:
    return DATA / "golden" / ckpt


def reports_dir(ckpt: str) -> Path:
    return DATA / "reports" / ckpt


def outputs_dir(ckpt: str) -> Path:
    return DATA / "outputs" / ckpt


def reference_wav() -> Path:
    return INPUTS / "ref.wav"


def threads() -> int:
    """CPU threads for torch and ncnn (`QTTS_THREADS`, default 2: the CI machine's cores).

    Golden references are only bitwise repeatable at a fixed thread count."""
    return int(os.environ.get("QTTS_THREADS", "2"))
