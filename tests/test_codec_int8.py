"""The codec's int8 tier (runtime.rewrites.codec_int8, runtime.codec.int8_form; chapter 14): ncnn's int8
Convolution against a numpy model of it, the .bin it reads, the tier on tiny-base against fp32, its cached files."""
import json

import numpy as np
import pytest
import soundfile as sf

from qtts_lib import check, paths
from qtts_lib.runtime.binding import weights
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.rewrites import codec_int8

RNG = np.random.default_rng(0)
CKPT = "tiny-base"

# a causal dilated convolution on an h = 1 blob, as the codec's CPU form writes its residual units
CONV = """7767517
2 2
Input                    in                       0 1 in
Convolution conv_0 1 1 in out 0=12 1=7 11=1 2=3 12=1 3=1 13=1 4=18 15=0 14=0 16=0 5=1 6=1344
"""


def _conv(tmp_path, absmax):
    w = RNG.standard_normal((12, 16, 7)).astype(np.float32) * RNG.uniform(0.1, 2, (12, 1, 1)).astype(np.float32)
    bias = RNG.standard_normal(12).astype(np.float32)
    data = weights.FP32_TAG + w.tobytes() + bias.tobytes()
    text, out, stats = codec_int8.int8_convolutions(CONV, data, {"conv_0": absmax})
    (tmp_path / "c.param").write_text(text)
    (tmp_path / "c.bin").write_bytes(out)
    return w, bias, text, out, stats


def _conv_model(x, w, bias, dilation=3):
    """Causal dilated 1-D convolution of x (c_in, T) in float64."""
    k = w.shape[2]
    pad = dilation * (k - 1)
    xp = np.concatenate([np.zeros((x.shape[0], pad)), x], axis=1)
    y = np.zeros((w.shape[0], x.shape[1]))
    for j in range(k):
        y += w[:, :, j].astype(np.float64) @ xp[:, j * dilation : j * dilation + x.shape[1]]
    return y + bias[:, None]


def test_int8_convolution_is_what_we_think_it_is(tmp_path):
    """ncnn's int8 Convolution with our scales against a numpy model: the input rounded with the static scale
    127 / absmax and clipped, each output channel's weights rounded with 127 / their |max|, exact integer sums, both
    scales undone, then the bias; and close to the fp32 convolution, not equal to it."""
    x = RNG.standard_normal((16, 1, 50)).astype(np.float32)
    absmax = float(np.abs(x).max())
    w, bias, text, data, stats = _conv(tmp_path, absmax)
    assert stats["convolutions"] == 1 and stats["weights"] == w.size and " 8=1" in text
    (y,) = run(make_net(tmp_path / "c.param", tmp_path / "c.bin", 2), {"in": x}, ["out"])
    s = 127 / absmax
    ws = np.frombuffer(weights.split_bin(text, data)["conv_0"][2].data, np.float32)  # the scales written
    np.testing.assert_allclose(ws, 127 / np.abs(w).reshape(12, -1).max(axis=1), rtol=1e-6)
    xq = np.clip(np.rint(x[:, 0] * s), -127, 127)
    wq = np.clip(np.rint(w * ws[:, None, None]), -127, 127)
    model = _conv_model(xq, wq, np.zeros(12)) / (s * ws[:, None]) + bias[:, None]
    np.testing.assert_allclose(y[:, 0], model, rtol=1e-4, atol=1e-4)
    exact = _conv_model(x[:, 0], w, bias)
    rel = np.linalg.norm(y[:, 0] - exact) / np.linalg.norm(exact)
    assert 1e-4 < rel < 3e-2, rel


def test_int8_convolution_clips_what_calibration_did_not_see(tmp_path):
    """The input scale is static: an input larger than the calibrated absmax is clipped to ±127 steps, so the
    result is wrong where it exceeds it. What the calibration measures matters."""
    x = RNG.standard_normal((16, 1, 50)).astype(np.float32)
    w, bias, *_ = _conv(tmp_path, float(np.abs(x).max()) / 4)
    (y,) = run(make_net(tmp_path / "c.param", tmp_path / "c.bin", 2), {"in": x}, ["out"])
    exact = _conv_model(x[:, 0], w, bias)
    assert np.linalg.norm(y[:, 0] - exact) / np.linalg.norm(exact) > 0.05


def test_int8_convolution_bin_walks_like_any_other(tmp_path):
    """`weights.split_bin` knows the int8 Convolution's loads (fp32 weights, bias, per-output scales, input scale)."""
    w, bias, text, data, _ = _conv(tmp_path, 2.0)
    segs = weights.split_bin(text, data)["conv_0"]
    assert [s.count for s in segs] == [w.size, 12, 12, 1]
    assert weights.join_bin(text, weights.split_bin(text, data)) == data
    assert np.frombuffer(segs[3].data, np.float32)[0] == pytest.approx(127 / 2.0)
    with pytest.raises(ValueError, match="absmax"):
        codec_int8.int8_convolutions(CONV, weights.FP32_TAG + w.tobytes() + bias.tobytes(), {"conv_0": 0.0})


def test_calibration_groups_join_the_time_tiles_of_a_layer():
    assert codec_int8.calibration_group("conv_7_tile3_sp12") == "conv_7"
    assert codec_int8.calibration_group("conv_7") == "conv_7"
    assert codec_int8.calibration_group("conv_7_part1_sp4") == "conv_7_part1_sp4"


def test_the_codec_int8_tier_is_another_codec_close_to_fp32(exported, tmp_path):
    """Int8 residual convolutions in the last decoder stages and int8 projections in the upsampler: not fp32's
    samples but the same sound; the calibration is recorded and the files are reused; reachable from the Synthesizer
    and the CLI."""
    from qtts_lib.runtime.app.cli import main
    from qtts_lib.runtime.codec.decoder import Codec
    from qtts_lib.runtime.codec.int8_form import INT8_DIR, INT8_STAGES
    from qtts_lib.runtime.pipeline.config import ModelConfig
    from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

    cfg = ModelConfig.load(exported)
    fp32, q8 = (Codec(exported / "ncnn", cfg.codec, 2, precision=t) for t in ("fp32", "int8"))
    desc = json.loads((exported / "ncnn" / INT8_DIR / "codec_decoder.json").read_text())
    stages = sorted(v["stage"] for v in desc["stats"].values())
    assert stages == sorted(s for s in INT8_STAGES if s <= len(cfg.codec["upsample_rates"]))
    assert all(v["convolutions"] > 0 for v in desc["stats"].values())
    assert all(a > 0 for c in desc["calibration"].values() for a in c.values())
    int8_params = {f: (exported / "ncnn" / INT8_DIR / f).read_text() for p in desc["parts"] for f in p["files"]
                   if not f.startswith("..") and f.endswith(".param")}
    assert sum(" 8=1" in t for t in int8_params.values()) == len(desc["stats"]) > 0   # int8 convolutions
    # the ConvNeXt upsampler's projections: the loop's int8 Gemm (run-time scales), every Gemm of the written parts
    gemms = {f: [line for line in t.splitlines() if line.startswith("Gemm")] for f, t in int8_params.items()}
    upsampler = {f"codec_decoder.part{k}.param": v["gemms"] for k, v in desc["gemm_stats"].items()}
    assert upsampler and all(len(gemms[f]) == n > 0 for f, n in upsampler.items())
    assert all(" 18=2 " in g + " " for lines in gemms.values() for g in lines)
    codes = np.random.default_rng(3).integers(0, cfg.codec["codebook_size"], (24, cfg.codec["num_quantizers"]))
    a, b = fp32.decode(codes), q8.decode(codes)
    assert a.shape == b.shape and not np.array_equal(a, b)
    assert 20 < check.snr_db(b, a) < 80, check.snr_db(b, a)
    assert check.log_spectral_distance(b, a) < 2.0
    meta = exported / "ncnn" / INT8_DIR / "codec_decoder.json"
    before = meta.stat().st_mtime_ns
    again = Codec(exported / "ncnn", cfg.codec, 2, precision="int8")
    assert meta.stat().st_mtime_ns == before                         # reused, not calibrated again
    np.testing.assert_array_equal(again.decode(codes), b)
    # a stream's transformer (the KV-cache form, one position a push) has int8 projections but its first and last
    kv = (exported / "ncnn" / INT8_DIR / desc["transformer_kv"]).read_text().splitlines()
    gemms = [line.split() for line in kv if line.startswith("Gemm")]
    assert [g[1] for g in gemms if "18=2" not in g] == desc["transformer_kv_stats"]["kept_fp32"]
    assert desc["transformer_kv_stats"]["gemms"] == len(gemms) - 2 > 0
    assert q8.transformer_net is not fp32.transformer_net
    inc, inc32 = q8.incremental(), fp32.incremental()
    streamed = np.concatenate([inc.push(codes[i : i + 1]) for i in range(24)])
    streamed32 = np.concatenate([inc32.push(codes[i : i + 1]) for i in range(24)])
    assert check.snr_db(streamed32, a) > 90                           # fp32: a stream is the whole decode
    # int8: the stream's transformer and a static int8 scale (which turns float rounding into a whole quantization
    # step now and then) make it another decode, as close to fp32 as the whole one
    assert check.snr_db(streamed, b) < 80
    assert abs(check.snr_db(streamed, a) - check.snr_db(b, a)) < 3, (check.snr_db(streamed, a), check.snr_db(b, a))
    assert Synthesizer(exported, codec_precision="int8").codec.precision == "int8"
    out = tmp_path / "int8.wav"
    assert main(["say", "--checkpoint", str(exported), "--voice", str(paths.voice_wav()), "--text", "Hello.",
                 "--greedy", "--max-frames", "4", "--codec-precision", "int8", "-o", str(out)]) == 0
    assert len(sf.read(out)[0]) == 4 * 1920
    assert sf.read(out)[0].std() > 0
