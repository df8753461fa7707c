"""The int8 tiers split by decoder and the weight-block tiers (runtime.pipeline.precision, runtime.rewrites.int8,
bench.quality; chapter 13): each int8 form of ncnn's Gemm against its numpy model, the split tiers running one
decoder int8, the quality harness's split and projection errors on tiny-1.7b-customvoice, the CLI's choices."""
import json

import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.runtime.binding import weights
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.rewrites import int8

RNG = np.random.default_rng(5)
CKPT = "tiny-1.7b-customvoice"


def gemm(n: int, k: int) -> str:
    return f"7767517\n2 2\nInput in 0 1 in\nGemm gemm_0 1 1 in out 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8={n} 9={k}\n"


@pytest.mark.parametrize("form", list(int8.FORMS))
@pytest.mark.parametrize("k", [256, 192])   # 192: a last block of 64 in blocks of 128
def test_each_int8_form_is_its_numpy_model(tmp_path, form, k):
    """ncnn's int8 Gemm of each form against `int8_matmul`: rows (weights as A, a scale per row, one activation
    scale per call) and the weight-block forms (weights as B written raw, a scale per row and block, activations
    quantized per row and block by ncnn's kernel), on heavy-tailed rows like a down projection's input."""
    w = RNG.standard_normal((24, k)).astype(np.float32)
    text, data, stats = int8.int8_graph(gemm(24, k), weights.FP32_TAG + w.tobytes(), form=form)
    assert stats["gemms"] == 1 and f" 18={int8.FORMS[form]}" in text
    (tmp_path / "g.param").write_text(text)
    (tmp_path / "g.bin").write_bytes(data)
    x = (RNG.standard_normal((3, k)) * RNG.standard_normal((3, k))).astype(np.float32)
    (y,) = run(make_net(tmp_path / "g.param", tmp_path / "g.bin", 2), {"in": x}, ["out"])
    model = int8.int8_matmul(x, w, form)
    np.testing.assert_allclose(y, model, rtol=1e-5, atol=1e-5 * np.abs(model).max())
    exact = x @ w.T
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert 1e-4 < rel < 3e-2, rel   # quantized, and not garbage


def test_a_row_of_a_block_form_does_not_hear_its_batch_mates(tmp_path):
    """rows quantizes a call's activations with one scale, so a loud row in the batch moves a quiet row's result;
    the weight-block forms quantize per row and block: a row's result is the same alone or batched, bit for bit."""
    w = RNG.standard_normal((64, 256)).astype(np.float32)
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    x[2] *= 20
    moved = {}
    for form in int8.FORMS:
        text, data, _ = int8.int8_graph(gemm(64, 256), weights.FP32_TAG + w.tobytes(), form=form)
        (tmp_path / f"{form}.param").write_text(text)
        (tmp_path / f"{form}.bin").write_bytes(data)
        net = make_net(tmp_path / f"{form}.param", tmp_path / f"{form}.bin", 2)
        (batched,), (alone,) = run(net, {"in": x}, ["out"]), run(net, {"in": x[:1]}, ["out"])
        moved[form] = float(np.abs(batched[0] - alone[0]).max() / np.abs(alone).max())
    assert moved["rows"] > 1e-2 and moved["k128"] == moved["k32"] == 0.0, moved


def test_blocks_keep_a_heavy_tailed_input():
    """Why the weight-block tiers exist: on SiLU(gate) * up, 6144 wide (1.7B's down projection input), one activation
    scale per call loses about twice what a scale per block of 128 does; blocks of 32 lose less again."""
    x = RNG.standard_normal((1, 2048)).astype(np.float32)
    wg, wu = (RNG.standard_normal((6144, 2048)).astype(np.float32) * 0.02 for _ in range(2))
    g, u = x @ wg.T, x @ wu.T
    h = (g / (1 + np.exp(-g)) * u).astype(np.float32)
    wd = RNG.standard_normal((2048, 6144)).astype(np.float32) * 0.02
    exact = h.astype(np.float64) @ wd.T.astype(np.float64)
    err = {f: np.linalg.norm(int8.int8_matmul(h, wd, f) - exact) / np.linalg.norm(exact) for f in int8.FORMS}
    assert err["rows"] > 1.5 * err["k128"] > 1.5 * err["k32"] > 0, err


def test_weight_block_forms_refuse_what_ncnn_cannot_read():
    w = RNG.standard_normal((3, 5)).astype(np.float32)
    with pytest.raises(ValueError, match="4-byte"):
        int8.int8_graph(gemm(3, 5), weights.FP32_TAG + w.tobytes(), form="k32")
    with pytest.raises(ValueError, match="no int8 form"):
        int8.int8_graph(gemm(3, 5), weights.FP32_TAG + w.tobytes(), form="k16")


@pytest.fixture(scope="module")
def model():
    from qtts_lib import checkpoint, export, reference

    tts = reference.load(checkpoint.ensure(CKPT), threads=2)
    export.ensure(tts, CKPT)
    return paths.model_dir(CKPT)


def test_split_tiers_make_one_decoder_int8(model):
    ncnn_dir = model / "ncnn"
    forms = {t: {n: precision.int8_form(t, n) for n in precision.INT8_GRAPHS}
             for t in ("int8-talker", "int8-predictor", "int8-k128")}
    assert forms["int8-talker"] == {"talker_decoder": "rows", "predictor_decoder": None, "predictor_heads": None}
    assert forms["int8-predictor"] == {"talker_decoder": None, "predictor_decoder": "rows", "predictor_heads": "rows"}
    assert set(forms["int8-k128"].values()) == {"k128"}
    fp32_bin = ncnn_dir / "predictor_decoder.bin"
    assert precision.step_graph(ncnn_dir, "predictor_decoder", "int8-talker").bin == fp32_bin
    assert precision.step_graph(ncnn_dir, "talker_decoder", "int8-talker").bin.parent == ncnn_dir / "int8"
    assert precision.step_graph(ncnn_dir, "talker_decoder", "int8-k128").bin.parent == ncnn_dir / "int8-k128"
    sizes = {t: precision.frame_bytes(ncnn_dir, t) for t in ("fp32", "int8", "int8-k128", "int8-k32")}
    assert sizes["int8"] < sizes["int8-k128"] < sizes["int8-k32"] < sizes["fp32"]
    assert sizes["int8-k128"] < 1.05 * sizes["int8"], sizes


def test_quality_harness_splits_by_decoder(model):
    """An fp32 talker picks codebook 0 exactly as fp32 does (int8-predictor), whatever the predictor; a split tier
    probes only its int8 decoder; the projection errors name a class of every decoder layer's seven."""
    from qtts_lib.bench import quality

    r = quality.measure(model, ("int8-talker", "int8-predictor", "int8-k128"), frames=6, progress=False)
    tiers = r["tiers"]
    assert tiers["int8-predictor"]["agreement_codebook0"] == 1.0
    assert tiers["int8-talker"]["layer_errors"]["predictor_decoder"] is None
    assert tiers["int8-predictor"]["layer_errors"]["talker_decoder"] is None
    assert tiers["int8-talker"]["layer_errors"]["talker_decoder"]["output_rel"] > 0
    assert tiers["int8-k128"]["decoders"] == dict.fromkeys(precision.INT8_GRAPHS, "k128")
    assert tiers["int8-k128"]["weight_bytes_per_frame"] == precision.frame_bytes(model / "ncnn", "int8-k128")
    assert sorted(r["projection_errors"]) == ["k128", "rows"]
    for decoders in r["projection_errors"].values():
        talker, predictor = decoders["talker_decoder"], decoders["predictor_decoder"]
        assert set(talker["classes"]) == set(quality.PROJECTIONS)
        assert set(predictor["classes"]) == {*quality.PROJECTIONS, "in_proj"}   # 1.7B's 2048 -> 1024 Linear
        assert 0 < talker["worst"]["rel"] < 0.1 and talker["worst_class"] in quality.PROJECTIONS


def test_projection_classes_refuse_another_layout(model):
    text = (model / "ncnn" / "talker_decoder_kv.param").read_text()
    cfg = json.loads((model / "config.json").read_text())["talker_config"]
    classes = quality_classes(text, cfg)
    assert [c for _, c in classes[:7]] == ["q", "k", "v", "o", "gate", "up", "down"]
    with pytest.raises(ValueError, match="is not a"):
        quality_classes(text, cfg | {"intermediate_size": cfg["intermediate_size"] + 1})


def quality_classes(text, cfg):
    from qtts_lib.bench.quality import projection_classes

    return projection_classes(text, cfg)


def test_a_class_kept_fp32_is_written_apart_and_left_out_of_int8(model):
    """`bench quality --keep-fp32 down`: inside `kept_fp32`, each decoder's int8 graph leaves its down projections
    fp32 (one a layer), in its own folder; outside, the tier's own files are as before."""
    from qtts_lib.bench import quality
    from qtts_lib.runtime.binding.graph import Graph, params_dict

    ncnn_dir = model / "ncnn"
    cfg = json.loads((model / "config.json").read_text())["talker_config"]
    plain = precision.ensure_int8(ncnn_dir, "talker_decoder", form="k32")[0]
    with quality.kept_fp32(model, "down") as kept:
        param, _ = precision.ensure_int8(ncnn_dir, "talker_decoder", form="k32")
        precision.ensure_int8(ncnn_dir, "predictor_decoder", form="k32")
    assert param.parent.name == "int8-k32-keep-down" and precision.int8_paths(ncnn_dir, "talker_decoder",
                                                                              "k32")[0] == plain
    assert kept == {"talker_decoder": cfg["num_hidden_layers"],
                    "predictor_decoder": cfg["code_predictor_config"]["num_hidden_layers"]}
    fp32_gemms = {layer.name for layer in Graph(param.read_text()).layers if layer.type == "Gemm"
                  and params_dict(layer).get("18", "0") == "0"}
    downs = {g for g, c in quality.projection_classes((ncnn_dir / "talker_decoder_kv.param").read_text(), cfg)
             if c == "down"}
    assert downs and downs <= fp32_gemms
    with pytest.raises(ValueError, match="no projection class"):
        with quality.kept_fp32(model, "mlp"):
            pass
