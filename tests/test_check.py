import json
import math

import numpy as np
import pytest

from qtts_lib import check


def test_metrics():
    ref = np.array([1.0, 2.0, 3.0])
    assert check.rel_err(ref, ref) == 0.0
    assert check.rel_err(ref * 1.01, ref) == pytest.approx(0.01)
    assert check.max_abs_err(ref + [0, 0.5, 0], ref) == 0.5
    assert check.snr_db(ref, ref) == math.inf
    assert check.snr_db(ref + 0.1 * ref, ref) == pytest.approx(20.0)
    assert check.cos_sim(ref, 2 * ref) == pytest.approx(1.0)
    assert check.mismatches([1, 2, 3], [1, 0, 3]) == (1, 3)
    with pytest.raises(ValueError):
        check.rel_err(np.zeros(3), np.zeros(4))


def test_report_records_and_fails_loudly(tmp_path, monkeypatch):
    monkeypatch.setattr(check.paths, "DATA", tmp_path)
    monkeypatch.setattr(check.paths, "reports_dir", lambda ckpt: tmp_path / ckpt)
    check.begin("99_test", "tiny-base")
    check.close("good", [1.0, 2.0], [1.0, 2.0 + 1e-9], rel=1e-6)
    with pytest.raises(check.CheckFailed):
        check.close("bad", [1.0, 2.0], [1.0, 3.0], rel=1e-6)
    rows = json.loads((tmp_path / "tiny-base" / "99_test.json").read_text())
    assert [(r["name"], r["ok"]) for r in rows] == [("good", True), ("bad", False)]
    assert not check.all_ok()
    check.tokens_equal("tokens", np.arange(4), np.arange(4))
    assert check.current().checks[-1]["value"] == "0/4"
