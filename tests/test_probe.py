"""The layer-by-layer probe on a small hand-made module exported with pnnx, and its figure."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pnnx")
pytest.importorskip("ncnn")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from qtts_lib import export, plots, probe  # noqa: E402

NAME = "tiny"
LABELS = [f"layers.{i}.{m}" for i in range(3) for m in ("norm", "fc1", "fc2")] + ["conv", "output 0"]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)


class Tiny(nn.Module):
    """Three pre-norm MLP blocks on a residual stream (1, T, 8), then a Conv1d whose ReLU ncnn fuses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.conv = nn.Conv1d(8, 4, 3)

    def forward(self, x):
        for b in self.layers:
            x = x + b.fc2(F.gelu(b.fc1(b.norm(x))))
        return F.relu(self.conv(x.transpose(1, 2)))


def _inputs(length: int, seed: int) -> dict:
    return {"x": torch.randn(1, length, 8, generator=torch.Generator().manual_seed(seed))}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    model = Tiny().eval()
    info = export.export_module(model, NAME, _inputs(7, 0), _inputs(5, 1), out)
    (out / "manifest.json").write_text(json.dumps({f"{NAME}.param": {"input_batch_axes": info["input_batch_axes"]}}))
    # the same graph with the second Linear (layers.0.fc2) scaled by 1.01: Gemm's 0=alpha
    text = (out / f"{NAME}.param").read_text().splitlines()
    gemms = [i for i, line in enumerate(text) if line.startswith("Gemm")]
    text[gemms[1]] += " 0=1.010000e+00"
    (out / "perturbed.param").write_text("\n".join(text) + "\n")
    return out, model


def test_equal_graphs_pair_in_order_at_fp32_rounding(exported):
    out, model = exported
    r = probe.probe(model, out, NAME, _inputs(9, 2), threads=1)
    assert r.labels == LABELS
    assert [row["type"] for row in r.rows][:3] == ["LayerNorm", "Gemm", "Gemm"]
    assert r.rows[-2]["type"] == "Convolution1D"  # the fused ReLU is applied to torch's conv output
    assert r.errors.max() < 1e-5, r.summary()
    assert r.stages()[0]["stage"] == "layers.0" and r.rows[-1]["stage"] == "output"


def test_perturbed_weight_shows_at_its_layer(exported):
    out, model = exported
    (out / f"{NAME}.param").rename(out / "orig.param")
    (out / "perturbed.param").rename(out / f"{NAME}.param")
    try:
        r = probe.probe(model, out, NAME, _inputs(9, 2), threads=1)
    finally:
        (out / f"{NAME}.param").rename(out / "perturbed.param")
        (out / "orig.param").rename(out / f"{NAME}.param")
    assert r.first_above(1e-4)["label"] == "layers.0.fc2"
    assert r.errors[:2].max() < 1e-5
    assert 1e-3 < r.rows[2]["rel"] < 2e-2


def test_probe_ncnn_two_configurations(exported):
    out, _ = exported
    x = _inputs(6, 3)["x"].numpy()
    same = probe.probe_ncnn(out, NAME, [x], {"threads": 1}, {"threads": 2})
    assert same.errors.max() < 1e-6
    assert same.b == "ncnn cpu, 2 threads"
    r = probe.probe_ncnn(out, NAME, [x], {}, {"param": "perturbed"})
    second_gemm = [i for i, row in enumerate(r.rows) if row["type"] == "Gemm"][1]
    assert r.errors[:second_gemm].max() == 0.0
    assert r.first_above(1e-4) is r.rows[second_gemm]


def test_pairing_refuses_a_count_mismatch(exported):
    out, _ = exported
    bigger = Tiny().eval()
    bigger.layers.append(Block())
    with pytest.raises(probe.PairingError, match="Linear"):
        probe.probe(bigger, out, NAME, _inputs(6, 0), threads=1)


def test_layer_errors_figure_has_threshold_and_worst(exported):
    out, model = exported
    r = probe.probe(model, out, NAME, _inputs(6, 4), threads=1)
    fig = plots.layer_errors(r, threshold=1e-5, title="tiny: ncnn vs torch")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert any(np.allclose(line.get_ydata(), 1e-5) for line in ax.lines)
    assert fig._suptitle.get_text() == "tiny: ncnn vs torch"
    fig2 = plots.step_errors({"talker": [1e-7, 2e-7], "predictor": {0: 0.0, 3: 1e-6}}, threshold=1e-5, title="t")
    assert any(np.allclose(line.get_ydata(), 1e-5) for line in fig2.axes[0].lines)


def test_ncnn_side_runs_without_torch(exported):
    from qtts_lib.isolation import run_without_torch

    out, _ = exported
    code = ("import numpy as np\nfrom qtts_lib import probe\n"
            "r = probe.probe_ncnn(sys.argv[1], 'tiny', [np.ones((1, 4, 8), np.float32)])\n"
            "print('max', r.errors.max())")
    r = run_without_torch(code, str(out))
    assert r.returncode == 0, r.stderr
    assert "max 0.0" in r.stdout


def test_probe_ncnn_through_a_text_rewrite(exported):
    out, _ = exported

    def scale_third_gemm(text: str) -> str:
        lines = text.splitlines()
        third = [i for i, line in enumerate(lines) if line.startswith("Gemm")][2]
        lines[third] += " 0=9.000000e-01"
        return "\n".join(lines) + "\n"

    r = probe.probe_ncnn(out, NAME, [_inputs(6, 5)["x"].numpy()], {}, {"rewrite": scale_third_gemm})
    gemms = [row for row in r.rows if row["type"] == "Gemm"]
    assert r.first_above(1e-4) is gemms[2]
    assert r.b.startswith("ncnn scale_third_gemm")
