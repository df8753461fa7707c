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

# name -> (size, variant, model size); these are synthesized when not on disk (qtts_lib.checkpoint says how).
# tiny: the real config keys and ids, small widths (CI); full: the real dimensions (speed, memory).
SYNTHETIC = {
    "tiny-base": ("tiny", "base", "0.6b"),
    "tiny-customvoice": ("tiny", "customvoice", "0.6b"),
    "full-base": ("full", "base", "0.6b"),
    "full-customvoice": ("full", "customvoice", "0.6b"),
    "tiny-1.7b-base": ("tiny", "base", "1.7b"),
    "tiny-1.7b-customvoice": ("tiny", "customvoice", "1.7b"),
    "tiny-voicedesign": ("tiny", "voicedesign", "1.7b"),
    "full-1.7b-base": ("full", "base", "1.7b"),
    "full-1.7b-customvoice": ("full", "customvoice", "1.7b"),
    "full-1.7b-voicedesign": ("full", "voicedesign", "1.7b"),
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


def is_path(ckpt: str | Path) -> bool:
    """A checkpoint given as a directory path (`qtts export DIR`), not a name under models/."""
    return isinstance(ckpt, Path) or "/" in ckpt or ckpt.startswith(".")


def model_dir(ckpt: str | Path) -> Path:
    """models/<name>, or the directory itself when `ckpt` is a path."""
    return Path(ckpt) if is_path(ckpt) else MODELS / ckpt


def checkpoint_dir(name_or_dir: str) -> Path:
    """A command line's `--checkpoint`: an existing directory as it is, else a name under models/."""
    return Path(name_or_dir) if Path(name_or_dir).is_dir() else model_dir(name_or_dir)


def ncnn_dir(ckpt: str | Path) -> Path:
    return model_dir(ckpt) / "ncnn"


def _name(ckpt: str | Path) -> str:
    return model_dir(ckpt).resolve().name if is_path(ckpt) else ckpt


def golden_dir(ckpt: str | Path) -> Path:
    return DATA / "golden" / _name(ckpt)


def reports_dir(ckpt: str | Path) -> Path:
    return DATA / "reports" / _name(ckpt)


def outputs_dir(ckpt: str | Path) -> Path:
    return DATA / "outputs" / _name(ckpt)


def voice_wav() -> Path:
    return INPUTS / "voice.wav"
