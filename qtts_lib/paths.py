"""Where every artifact lives. Introduced in 00.

All chapters resolve files through here, so a checkout can be moved and the
checkpoint switched with one environment variable (`QTTS_CHECKPOINT`, read by
`qtts_lib.settings`).
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
DATA = ROOT / "data"
INPUTS = DATA / "inputs"
CONFIGS = Path(__file__).resolve().parent / "configs"

# name -> (size, variant); these are synthesized when not on disk.
SYNTHETIC = {
    "tiny-base": ("tiny", "base"),
    "tiny-customvoice": ("tiny", "customvoice"),
    "full-base": ("full", "base"),
    "full-customvoice": ("full", "customvoice"),
}


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


def model_dir(ckpt: str) -> Path:
    return MODELS / ckpt


def checkpoint_dir(name_or_dir: str) -> Path:
    """A command line's `--checkpoint`: an existing directory as it is, else a name under models/."""
    return Path(name_or_dir) if Path(name_or_dir).is_dir() else model_dir(name_or_dir)


def ncnn_dir(ckpt: str) -> Path:
    return MODELS / ckpt / "ncnn"


def golden_dir(ckpt: str) -> Path:
    return DATA / "golden" / ckpt


def reports_dir(ckpt: str) -> Path:
    return DATA / "reports" / ckpt


def outputs_dir(ckpt: str) -> Path:
    return DATA / "outputs" / ckpt


def voice_wav() -> Path:
    return INPUTS / "voice.wav"
