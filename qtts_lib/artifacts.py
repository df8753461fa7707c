"""Artifacts with manifests: golden .npz files, baselines, exports. Introduced in 00.

Every artifact directory holds `manifest.json`: for each file, the chapter that
produced it, its inputs, sha256, library versions, thread count, seed and the
fingerprint of the checkpoint it came from. A consumer loads through `load_npz`,
which refuses a stale or foreign file and names the chapter to re-run.
"""
from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

import numpy as np

from . import paths


class StaleArtifact(RuntimeError):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "qwen-tts", "pnnx", "ncnn", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def checkpoint_fingerprint(ckpt: str) -> str:
    """Changes whenever the checkpoint's weights or config change."""
    d = paths.model_dir(ckpt)
    mf = d / "qtts_manifest.json"
    if mf.is_file():
        m = json.loads(mf.read_text())
        return f"{m['spec_hash']}:{m['model.safetensors'][:16]}"
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        st = (d / f).stat()
        h.update(f"{f}:{st.st_size}:{int(st.st_mtime)}".encode())
    return "real:" + h.hexdigest()[:16]


def _manifest_path(directory: Path) -> Path:
    return directory / "manifest.json"


def read_manifest(directory: Path) -> dict:
    p = _manifest_path(directory)
    return json.loads(p.read_text()) if p.is_file() else {}


def record(path: Path, producer: str, ckpt: str, inputs: dict | None = None, **extra) -> dict:
    """Add/replace the manifest entry of an artifact file that was just written."""
    path = Path(path)
    entry = {
        "producer": producer,
        "checkpoint": str(ckpt),
        "checkpoint_fingerprint": checkpoint_fingerprint(ckpt),
        "inputs": inputs or {},
        "sha256": sha256(path),
        "versions": versions(),
        **extra,
    }
    m = read_manifest(path.parent)
    m[path.name] = entry
    _manifest_path(path.parent).write_text(json.dumps(m, indent=1, sort_keys=True))
    return entry


def save_npz(path: Path, producer: str, ckpt: str, inputs: dict | None = None, extra: dict | None = None,
             **arrays) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    record(path, producer, ckpt, inputs, **(extra or {}))
    return path


def verify(path: Path, ckpt: str) -> dict:
    """The manifest entry of `path` if it is present, intact and made from this checkpoint."""
    path = Path(path)
    m = read_manifest(path.parent)
    entry = m.get(path.name)
    if entry is None or not path.is_file():
        raise StaleArtifact(f"{path} is missing; run the chapter that makes it first")
    producer = entry["producer"]
    if entry["sha256"] != sha256(path):
        raise StaleArtifact(f"{path} changed since {producer} wrote it; re-run notebooks/{producer}.py")
    if entry["checkpoint_fingerprint"] != checkpoint_fingerprint(ckpt):
        raise StaleArtifact(
            f"{path} was made from another version of checkpoint {ckpt}; re-run notebooks/{producer}.py"
        )
    return entry


def load_npz(path: Path, ckpt: str) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays of a verified .npz and its manifest entry."""
    entry = verify(path, ckpt)
    with np.load(path) as z:
        return {k: z[k] for k in z.files}, entry
