"""Precision tiers (runtime.pipeline.precision, runtime.rewrites.int8; chapter 13): the int8 arithmetic against a
numpy model of it, the tiers on tiny-base against fp32, the cached int8 files, the runtime and CLI options."""
import json
import os

import numpy as np
import pytest
import soundfile as sf

from qtts_lib import paths
from qtts_lib.runtime.binding import weights
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.errors import PrecisionError
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.rewrites import int8

RNG = np.random.default_rng(0)
CKPT = "tiny-base"


def test_quantize_rows_error_is_half_a_step():
    w = RNG.standard_normal((64, 96)).astype(np.float32) * RNG.uniform(0.01, 3, (64, 1)).astype(np.float32)
    w[5] = 0
    q, scale = int8.quantize_rows(w)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    err = np.abs(int8.dequantize_rows(q, scale) - w)
    assert (err <= 0.5 / 127 * scale[:, None] * (1 + 1e-5)).all()
    assert (int8.dequantize_rows(q, scale)[5] == 0).all()


GEMM = """7767517
2 2
Input                    in                       0 1 in
Gemm                     gemm_0                   1 1 in out 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=24 9=40
"""


def test_int8_gemm_is_what_we_think_it_is(tmp_path):
    """ncnn's int8 Gemm over constant A (the weights, a scale per row) against a numpy model: the activations
    quantized with one scale per call (absmax -> 127), int8 products summed exactly, then both scales undone; no
    layer but the Gemm."""
    w = RNG.standard_normal((24, 40)).astype(np.float32)
    text, data, stats = int8.int8_graph(GEMM, weights.FP32_TAG + w.tobytes())
    assert stats["gemms"] == 1 and "18=2" in text and "4=1" in text and "MemoryData" not in text
    (tmp_path / "g.param").write_text(text)
    (tmp_path / "g.bin").write_bytes(data)
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    net = make_net(tmp_path / "g.param", tmp_path / "g.bin", 2)
    (y,) = run(net, {"in": x}, ["out"])
    q, scale = int8.quantize_rows(w)
    a_scale = 127 / np.abs(x).max()
    xq = np.clip(np.rint(x * a_scale), -127, 127)
    model = (xq @ q.T.astype(np.float64)) / (a_scale * 127) * scale
    np.testing.assert_allclose(y, model, rtol=1e-5, atol=1e-5)
    exact = x @ w.T
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert 1e-4 < rel < 3e-2, rel  # quantized (not exact), and not garbage


def test_int8_bin_walks_like_any_other():
    """weights.split_bin knows the int8 Gemm's loads (int8-tagged weights padded to 4 bytes, then a raw scale per
    row of A), so an int8 .bin splits and joins back to the same bytes; odd N*K exercises the padding."""
    w = RNG.standard_normal((7, 5)).astype(np.float32)
    text, data, _ = int8.int8_graph(GEMM.replace("8=24 9=40", "8=7 9=5"), weights.FP32_TAG + w.tobytes())
    segs = weights.split_bin(text, data)
    gemm = next(name for name, s in segs.items() if s[0].data[:4] == weights.INT8_TAG)
    assert [(s.count, s.tagged, len(s.data)) for s in segs[gemm]] == [(35, True, 4 + 36), (7, False, 28)]
    assert weights.join_bin(text, segs) == data
    with pytest.raises(ValueError, match="weight blocks"):
        weights.split_bin(text.replace("18=2", "18=802"), data)


def test_bad_tiers_are_refused():
    with pytest.raises(PrecisionError, match="fp32, fp16, int8"):
        precision.check_tier("int4")
    with pytest.raises(PrecisionError, match="CPU only"):
        precision.check_tier("int8", "vulkan")
    assert precision.check_tier(" INT8 ") == "int8"


def _decoder(model_dir, tier):
    cfg = json.loads((model_dir / "config.json").read_text())["talker_config"]
    return cfg["hidden_size"], precision.decoder(model_dir / "ncnn", "talker_decoder", cfg["head_dim"],
                                                 cfg["rope_theta"], 2, precision=tier)


@pytest.mark.parametrize("tier,low,high", [("fp16", 1e-6, 5e-3), ("int8", 1e-4, 0.1)])
def test_tiers_stay_close_to_fp32(exported, tier, low, high):
    hidden, ref = _decoder(exported, "fp32")
    _, net = _decoder(exported, tier)
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((1, 9, hidden)).astype(np.float32)
    (a, ref_cache), (b, cache) = ref.prefill(x0), net.prefill(x0)
    outs = [(a, b)]
    for _ in range(6):
        x = rng.standard_normal((1, 1, hidden)).astype(np.float32)
        outs.append((ref.forward(x, ref_cache), net.forward(x, cache)))
    rel = [np.linalg.norm(b - a) / np.linalg.norm(a) for a, b in outs[1:]]   # the steps
    assert max(rel) < high, rel
    assert min(rel) > low, rel                                              # the tier really is another graph
    if tier == "fp16":   # fp16 prefill runs the fp32 graph; only the steps are fp16
        np.testing.assert_array_equal(outs[0][0], outs[0][1])


def test_int8_files_are_written_once(exported):
    ncnn_dir = exported / "ncnn"
    param, bin_ = precision.ensure_int8(ncnn_dir, "predictor_decoder")
    before = bin_.stat().st_mtime_ns
    assert precision.ensure_int8(ncnn_dir, "predictor_decoder") == (param, bin_)
    assert bin_.stat().st_mtime_ns == before
    src = ncnn_dir / "predictor_decoder.bin"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))   # the export changed: write again
    try:
        notes = []
        precision.ensure_int8(ncnn_dir, "predictor_decoder", log=notes.append)
        assert notes and "int8" in notes[0]
    finally:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        precision.ensure_int8(ncnn_dir, "predictor_decoder")
    stamp = json.loads((ncnn_dir / "int8" / "stamp.json").read_text())["predictor_decoder"]
    assert 0 < stamp["weight_rel_rms"] < 0.02


def test_int8_heads_stay_apart_and_close_to_fp32(exported):
    """The predictor's heads in the int8 tier: each head its own int8 Gemm (fused, one call would compute all
    15), each close to its fp32 head; the loop runs each tier's heads inside the predictor decoder's graph
    (`precision.predictor_with_heads`), giving what the heads' own graph gives on the decoder's output, bit for bit."""
    from qtts_lib.runtime.binding.net import Net
    from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

    ncnn_dir = exported / "ncnn"
    param, _ = precision.ensure_int8(ncnn_dir, "predictor_heads")
    text = param.read_text()
    fp32_heads = Net(ncnn_dir, "predictor_heads")
    heads = fp32_heads.outputs
    assert text.count(" 18=2") == heads > 1 and "Slice" not in text
    q = precision.head(ncnn_dir, "predictor_heads", precision="int8")
    x = RNG.standard_normal((3, int(params_of_first_gemm(text)["9"]))).astype(np.float32)
    for s in range(heads):
        (a,), (b,) = fp32_heads.run([x], [s]), q.run([x], [s])
        rel = np.linalg.norm(b - a) / np.linalg.norm(a)
        assert 1e-4 < rel < 3e-2, (s, rel)
    for tier, own in (("int8", q), ("fp32", fp32_heads)):  # the loop runs them inside the predictor's graph
        with Synthesizer(exported, precision=tier) as synth:
            predictor = synth.loop.predictor
            assert predictor.heads is None and predictor.decoder.logits
            rows = RNG.standard_normal((1, 2, x.shape[1])).astype(np.float32)
            hidden, _ = predictor.decoder.prefill(rows)
            for s in (0, heads - 1):
                logits, _ = predictor.decoder.prefill(rows, f"logits_{s}")
                np.testing.assert_array_equal(logits[0], own.run([hidden[0]], [s])[0])


def params_of_first_gemm(text: str) -> dict:
    from qtts_lib.runtime.binding.graph import Graph, params_dict

    return params_dict(next(layer for layer in Graph(text).layers if layer.type == "Gemm"))


def test_the_synthesizer_refuses_an_unknown_precision(exported):
    from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

    with pytest.raises(PrecisionError):
        Synthesizer(exported, precision="fp8")


@pytest.mark.parametrize("tier, refused", [("int8", "int3"), ("int8-k128", "int8-talker")])
def test_the_cli_takes_a_precision(exported, tmp_path, capsys, tier, refused):
    """`qtts say` speaks in the runtime's tiers (the block ones too) and refuses others, the quality harness's
    split tiers included."""
    from qtts_lib.runtime.app.cli import main

    out = tmp_path / f"{tier}.wav"
    rc = main(["say", "--checkpoint", str(exported), "--voice", str(paths.voice_wav()), "--text", "Hello there.",
               "--language", "english", "--greedy", "--max-frames", "4", "--precision", tier, "-o", str(out)])
    assert rc == 0
    wav, sr = sf.read(out)
    assert sr == 24000 and len(wav) == 4 * 1920
    with pytest.raises(SystemExit) as e:
        main(["say", "--checkpoint", str(exported), "--text", "Hi.", "--precision", refused])
    assert e.value.code == 2
    assert refused in capsys.readouterr().err


def test_fusing_shared_input_gemms_changes_nothing(exported, tmp_path):
    """q/k/v and gate/up fused into one int8 Gemm + Slice: the same numbers bit for bit, fewer layers."""
    from qtts_lib.runtime.binding.cached import KvCacheNet

    ncnn_dir = exported / "ncnn"
    cfg = json.loads((exported / "config.json").read_text())["talker_config"]
    text, data = (ncnn_dir / "talker_decoder_kv.param").read_text(), (ncnn_dir / "talker_decoder.bin").read_bytes()
    plain, plain_bin, plain_stats = int8.int8_graph(text, data, fuse=False)
    fused, _, stats = int8.int8_graph(text, data)
    layers = cfg["num_hidden_layers"]
    assert plain_stats["fused_away"] == 0 and stats["fused_away"] == 3 * layers   # q,k,v -> 1 and gate,up -> 1
    assert fused.count("Slice") == 2 * layers and len(fused.splitlines()) < len(plain.splitlines())
    (tmp_path / "p.param").write_text(plain)
    (tmp_path / "p.bin").write_bytes(plain_bin)
    a = precision.decoder(ncnn_dir, "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2, precision="int8")
    b = KvCacheNet(make_net(tmp_path / "p.param", tmp_path / "p.bin", 2), a.layers, cfg["head_dim"], cfg["rope_theta"])
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((1, 7, cfg["hidden_size"])).astype(np.float32)
    (ya, ca), (yb, cb) = a.prefill(x0), b.prefill(x0)
    np.testing.assert_array_equal(ya, yb)
    for _ in range(4):
        x = rng.standard_normal((1, 1, cfg["hidden_size"])).astype(np.float32)
        np.testing.assert_array_equal(a.forward(x, ca), b.forward(x, cb))


def test_a_gemm_with_a_bias_is_int8_and_keeps_its_bias(tmp_path):
    """1.7B's small_to_mtp_projection is a Linear with a bias (Gemm `6=1 10=4`): int8 weights, row scales, then the
    fp32 bias added; against the numpy model of the int8 Gemm plus the bias."""
    w = RNG.standard_normal((24, 40)).astype(np.float32)
    bias = RNG.standard_normal(24).astype(np.float32)
    text = GEMM.replace("10=-1", "10=4").replace("6=1", "6=1")
    text, data, stats = int8.int8_graph(text, weights.FP32_TAG + w.tobytes() + weights.FP32_TAG + bias.tobytes())
    assert stats["gemms"] == 1 and "18=2" in text and " 0=0" in text  # the add after the scales
    (tmp_path / "g.param").write_text(text)
    (tmp_path / "g.bin").write_bytes(data)
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    (y,) = run(make_net(tmp_path / "g.param", tmp_path / "g.bin", 2), {"in": x}, ["out"])
    q, scale = int8.quantize_rows(w)
    a_scale = 127 / np.abs(x).max()
    xq = np.clip(np.rint(x * a_scale), -127, 127)
    np.testing.assert_allclose(y, (xq @ q.T.astype(np.float64)) / (a_scale * 127) * scale + bias, rtol=1e-5, atol=1e-5)


def test_the_codec_bf16_tier_is_another_codec_close_to_fp32(exported, tmp_path):
    """bf16 storage on the codec's upsampling parts: not fp32's samples, but the same sound (SNR, spectra, the
    codes Mimi hears); refused where it cannot run; reachable from the Synthesizer and the CLI."""
    from qtts_lib import check
    from qtts_lib.runtime.app.cli import main
    from qtts_lib.runtime.codec.decoder import Codec, check_codec_tier
    from qtts_lib.runtime.pipeline.config import ModelConfig
    from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

    cfg = ModelConfig.load(exported)
    fp32, bf16 = (Codec(exported / "ncnn", cfg.codec, 2, precision=t) for t in ("fp32", "bf16"))
    codes = np.random.default_rng(3).integers(0, cfg.codec["codebook_size"], (24, cfg.codec["num_quantizers"]))
    a, b = fp32.decode(codes), bf16.decode(codes)
    assert a.shape == b.shape and not np.array_equal(a, b)            # really another graph
    assert 20 < check.snr_db(b, a) < 80, check.snr_db(b, a)
    assert check.log_spectral_distance(b, a) < 2.0
    assert check.log_spectral_distance(a, a) == 0.0
    with pytest.raises(PrecisionError, match="fp32, bf16"):
        check_codec_tier("fp8")
    with pytest.raises(PrecisionError, match="CPU form"):
        Codec(exported / "ncnn", cfg.codec, 2, form="exported", precision="bf16")
    with pytest.raises(PrecisionError):
        Synthesizer(exported, codec_precision="fp8")
    assert Synthesizer(exported, codec_precision="bf16").codec.precision == "bf16"
    out = tmp_path / "bf16.wav"
    assert main(["say", "--checkpoint", str(exported), "--voice", str(paths.voice_wav()), "--text", "Hello.",
                 "--greedy", "--max-frames", "4", "--codec-precision", "bf16", "-o", str(out)]) == 0
    assert len(sf.read(out)[0]) == 4 * 1920
