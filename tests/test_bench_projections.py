"""`bench.projections`: the int8 tier's projections alone (issue 24's kernel floor), on tiny-base."""
from functools import partial

import numpy as np

from qtts_lib import paths
from qtts_lib.bench.projections import projections_graph
from qtts_lib.runtime.binding.net import net_from_text, run
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.pipeline.precision import ensure_int8_tier, int8_paths


def test_projections_graph_holds_every_int8_gemm_and_nothing_else(synth, tmp_path):
    ncnn_dir = paths.model_dir("tiny-base") / "ncnn"
    ensure_int8_tier(ncnn_dir)
    param, bin_ = int8_paths(ncnn_dir, "predictor_decoder")
    hp, hb = int8_paths(ncnn_dir, "predictor_heads")
    text, data, nbytes = projections_graph(param.read_text(), bin_.read_bytes(), (hp.read_text(), hb.read_bytes()))
    source = parse_param(param.read_text())
    gemms = [lyr for lyr in source.layers if lyr.type == "Gemm" and "18=2" in lyr.params]
    gemms.append(next(lyr for lyr in parse_param(hp.read_text()).layers if lyr.type == "Gemm" and "18=2" in lyr.params))
    counts = parse_param(text).counts
    assert counts["Gemm"] == len(gemms)  # the decoder's projections and one head
    assert set(counts) == {"Input", "Split", "Gemm", "Concat"}
    # the int8 weights of those Gemms (weights as A: K = 9, M = 7) with their tags and fp32 row scales
    k_n = [(int(d["9"]), int(d["7"])) for d in (dict(p.split("=", 1) for p in lyr.params) for lyr in gemms)]
    assert nbytes >= sum(k * n + 4 * n for k, n in k_n)
    assert nbytes < 1.1 * sum(k * n for k, n in k_n) + 1e5
    f = tmp_path / "p.bin"
    f.write_bytes(data)
    net = net_from_text(text, f, 1)
    widths = [int(lyr.outputs[0][2:]) for lyr in parse_param(text).layers if lyr.type == "Input"]
    out = run(net, {f"in{k}": np.ones((1, k), np.float32) for k in widths}, ["out0"])[0]
    assert out.size == sum(n for _, n in k_n)
    assert np.isfinite(out).all() and np.abs(out).max() > 0


def test_earlier_forms_compute_the_same_projections(synth, tmp_path):
    """`bench.projections` times the tier beside its earlier forms over the same int8 weights: with ncnn's own K
    tiles, the weights as B with a row-scale BinaryOp after each Gemm, and ncnn's int8 InnerProduct with static input
    scales. At one input row (one activation scale either way; the InnerProduct's given the Gemms' own) all four
    compute the same numbers to float rounding; the earlier form has two more layers a Gemm."""
    from qtts_lib.bench.projections import FORMS

    ncnn_dir = paths.model_dir("tiny-base") / "ncnn"
    ensure_int8_tier(ncnn_dir)
    param, bin_ = int8_paths(ncnn_dir, "talker_decoder")
    text, data, _ = projections_graph(param.read_text(), bin_.read_bytes())
    widths = [int(lyr.outputs[0][2:]) for lyr in parse_param(text).layers if lyr.type == "Input"]
    x = {f"in{k}": np.random.default_rng(3).standard_normal((1, k)).astype(np.float32) for k in widths}
    outs = {}
    gemms = parse_param(text).counts["Gemm"]
    for form, rewrite in FORMS.items():
        if form == "innerproduct_static_scale":  # static input scales: the ones the Gemms compute from these inputs
            rewrite = partial(rewrite, input_scales={int(k[2:]): 127 / np.abs(v).max() for k, v in x.items()})
        t, d = (text, data) if rewrite is None else rewrite(text, data)
        f = tmp_path / f"{form}.bin"
        f.write_bytes(d)
        outs[form] = run(net_from_text(t, f, 1), x, ["out0"])[0].reshape(1, -1)
        counts = parse_param(t).counts
        if form == "weights_as_b_row_scales":
            assert counts["BinaryOp"] == counts["MemoryData"] == counts["Gemm"] and " 5=1" in t
        elif form == "innerproduct_static_scale":
            assert "Gemm" not in counts and counts["InnerProduct"] == gemms and " 8=1" in t
        else:
            assert "BinaryOp" not in counts and " 4=1" in t and (" 22=" in t) == (form == "weights_as_a")
    ref = outs["weights_as_a"]
    for form, y in outs.items():
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=form)
