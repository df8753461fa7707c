import numpy as np
import pytest

from qtts_lib import artifacts, paths, settings


def test_default_and_unknown_checkpoint(monkeypatch):
    monkeypatch.delenv("QTTS_CHECKPOINT", raising=False)
    assert settings.checkpoint() == "tiny-base"
    monkeypatch.setenv("QTTS_CHECKPOINT", "no-such-model")
    with pytest.raises(settings.UnknownCheckpoint) as e:
        settings.checkpoint()
    msg = str(e.value)
    assert "tiny-base" in msg and "full-customvoice" in msg and "models/" in msg


def test_real_checkpoint_dir_is_a_valid_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "MODELS", tmp_path)
    real = tmp_path / "Qwen3-TTS-12Hz-0.6B-Base"
    real.mkdir()
    (real / "config.json").write_text("{}")
    (real / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("QTTS_CHECKPOINT", real.name)
    assert settings.checkpoint() == real.name


def test_manifest_detects_stale_and_foreign(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "checkpoint_fingerprint", lambda ckpt: f"fp-{ckpt}")
    p = artifacts.save_npz(tmp_path / "g.npz", "03_make_golden", "tiny-base", {"text": "x"}, codes=np.arange(6))
    arrays, entry = artifacts.load_npz(p, "tiny-base")
    assert arrays["codes"].tolist() == list(range(6)) and entry["producer"] == "03_make_golden"
    with pytest.raises(artifacts.StaleArtifact, match="03_make_golden"):
        artifacts.load_npz(p, "full-base")  # another checkpoint's fingerprint
    np.savez(p, codes=np.arange(7))  # changed behind the manifest's back
    with pytest.raises(artifacts.StaleArtifact, match="re-run notebooks/03_make_golden.py"):
        artifacts.load_npz(p, "tiny-base")
    with pytest.raises(artifacts.StaleArtifact, match="missing"):
        artifacts.verify(tmp_path / "absent.npz", "tiny-base")
