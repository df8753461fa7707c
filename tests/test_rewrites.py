"""Graph rewrites (qtts_lib.runtime.rewrites) and the `.bin` format (runtime.binding.weights): text shape of each
rewrite, numeric equality against numpy on hand-written one-layer graphs, and equality against the original graph on
tiny-base exports; the codec's CPU form on disk (runtime.codec.cpu_form) and in parts."""
import json

import numpy as np
import pytest

from qtts_lib import export
from qtts_lib.runtime.binding import graph, weights
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.rewrites import codec_cpu as speed
from qtts_lib.runtime.rewrites import decode_step

RNG = np.random.default_rng(0)


def _run(tmp_path, text, data, x, out="out", threads=1, tag="g"):
    (tmp_path / f"{tag}.param").write_text(text)
    (tmp_path / f"{tag}.bin").write_bytes(data)
    net = make_net(tmp_path / f"{tag}.param", tmp_path / f"{tag}.bin", threads)
    return run(net, {"in": x}, [out])[0]


def _conv1d_numpy(x, w, b, left, dilation=1):
    """x (Ci, T), w (Co, Ci, K): causal conv with `left` zeros in front."""
    co, ci, k = w.shape
    xp = np.pad(x, ((0, 0), (left, 0)))
    t_out = xp.shape[1] - dilation * (k - 1)
    y = np.zeros((co, t_out), np.float64)
    for j in range(k):
        y += w[:, :, j].astype(np.float64) @ xp[:, j * dilation : j * dilation + t_out]
    return y + b[:, None]


def _deconv_numpy(x, w, b, stride):
    """x (Ci, T), w in ncnn's (Co, Ci, K) layout: ConvTranspose1d, no padding."""
    co, ci, k = w.shape
    t = x.shape[1]
    y = np.zeros((co, (t - 1) * stride + k), np.float64)
    for q in range(t):
        for j in range(k):
            y[:, q * stride + j] += w[:, :, j].astype(np.float64) @ x[:, q]
    return y + b[:, None]


def _tagged(*arrays):
    return b"".join(weights.FP32_TAG + a.astype(np.float32).tobytes() for a in arrays)


# ---------------------------------------------------------------- text rewrites
CONV = """7767517
3 3
Input                    in                       0 1 in
Padding                  pad_0                    1 1 in 1 0=0 1=0 2=12 3=0 4=0 5=0.0 6=0
Convolution1D            conv_0                   1 1 1 out 0=5 1=7 2=2 3=1 4=0 5=1 6=140
"""


def test_conv1d_as_conv2d_text():
    text = speed.conv1d_as_conv2d(CONV)
    layers = export.parse_param(text).layers
    assert [lyr.type for lyr in layers] == ["Input", "Reshape", "Convolution", "Reshape"]
    conv = graph.params_dict(layers[2])
    assert conv["11"] == "1" and conv["12"] == "1" and conv["13"] == "1"     # kernel/dilation/stride h = 1
    assert conv["4"] == "12" and conv["15"] == "0" and conv["14"] == "0" and conv["16"] == "0"  # pad folded
    assert conv["2"] == "2" and conv["6"] == "140"
    assert layers[1].params == ["0=-1", "1=1", "2=4"] and layers[3].params == ["0=-1", "1=5"]
    assert layers[3].outputs == ["out"]
    only_pad = export.parse_param(speed.conv1d_as_conv2d(CONV, to_2d=False)).layers
    assert [lyr.type for lyr in only_pad] == ["Input", "Convolution1D"]
    assert graph.params_dict(only_pad[1])["4"] == "12"


def test_conv1d_as_conv2d_keeps_a_shared_padding():
    shared = CONV.replace("3 3\n", "4 4\n") + "UnaryOp                  u                        1 1 1 other 0=9\n"
    # the Padding output feeds two layers (format drops the Split pnnx would write; fine for text tests)
    layers = export.parse_param(speed.conv1d_as_conv2d(shared)).layers
    assert "Padding" in [lyr.type for lyr in layers]


@pytest.mark.parametrize("to_2d", [False, True])
def test_conv1d_rewrite_numeric(tmp_path, to_2d):
    w = RNG.standard_normal((5, 4, 7)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    x = RNG.standard_normal((4, 50)).astype(np.float32)
    data = _tagged(w) + b.tobytes()
    ref = _conv1d_numpy(x, w, b, 12, dilation=2)
    orig = _run(tmp_path, CONV, data, x, tag="a")
    new = _run(tmp_path, speed.conv1d_as_conv2d(CONV, to_2d=to_2d), data, x, tag="b")
    assert orig.shape == new.shape == ref.shape
    np.testing.assert_allclose(orig, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new, ref, rtol=1e-4, atol=1e-4)


DWCONV = """7767517
3 3
Input                    in                       0 1 in
Padding                  pad_0                    1 1 in 1 0=0 1=0 2=6 3=0 4=0 5=0.0 6=0
ConvolutionDepthWise1D   dw_0                     1 1 1 out 0=16 1=7 2=1 3=1 4=0 5=1 6=112 7=16
"""


def test_depthwise_rewrite_numeric(tmp_path):
    w = RNG.standard_normal((16, 1, 7)).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    x = RNG.standard_normal((16, 40)).astype(np.float32)
    data = _tagged(w) + b.tobytes()
    text = speed.conv1d_as_conv2d(DWCONV)
    assert [lyr.type for lyr in export.parse_param(text).layers][2] == "ConvolutionDepthWise"
    xp = np.pad(x, ((0, 0), (6, 0)))
    ref = np.stack([np.convolve(xp[c], w[c, 0, ::-1], "valid") for c in range(16)]) + b[:, None]
    np.testing.assert_allclose(_run(tmp_path, text, data, x), ref, rtol=1e-4, atol=1e-4)


def _deconv_text(co, k, s, trim):
    crop = (f"Crop                     crop_0                   1 1 1 out -23310=1,-{trim} -23311=1,-1 -23309=1,0\n"
            if trim else "")
    top = "1" if trim else "out"
    n = 3 if trim else 2
    return (f"7767517\n{n} {n}\nInput                    in                       0 1 in\n"
            f"Deconvolution1D          deconv_0                 1 1 in {top} 0={co} 1={k} 18=0 2=1 3={s} 4=0 5=1 "
            f"6={co * 6 * k}\n" + crop)


@pytest.mark.parametrize("k,s", [(16, 8), (10, 5), (6, 3), (2, 2), (7, 3)])
def test_deconv_rewrites_numeric(tmp_path, k, s):
    co, ci, t = 5, 6, 9
    trim = k - s
    text = _deconv_text(co, k, s, trim)
    w = RNG.standard_normal((co, ci, k)).astype(np.float32)
    b = RNG.standard_normal(co).astype(np.float32)
    x = RNG.standard_normal((ci, t)).astype(np.float32)
    data = _tagged(w) + b.tobytes()
    ref = _deconv_numpy(x, w, b, s)[:, : t * s]
    np.testing.assert_allclose(_run(tmp_path, text, data, x, tag="o"), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(tmp_path, speed.deconv1d_as_deconv2d(text), data, x, tag="d"), ref,
                               rtol=1e-4, atol=1e-4)
    for conv2d in (False, True):
        ptext, pdata = speed.deconv_polyphase(text, data, conv2d=conv2d)
        types = [lyr.type for lyr in export.parse_param(ptext).layers]
        assert "Deconvolution1D" not in types and "Crop" not in types and "Permute" in types
        y = _run(tmp_path, ptext, pdata, x, tag=f"p{int(conv2d)}")
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_polyphase_leaves_other_trims_alone():
    text = _deconv_text(5, 16, 8, 8).replace("-23310=1,-8", "-23310=1,-3")
    data = _tagged(np.zeros((5, 6, 16))) + np.zeros(5, np.float32).tobytes()
    ptext, pdata = speed.deconv_polyphase(text, data)
    assert ptext == export.format_param(7767517, export.parse_param(text).layers) and pdata == data


def test_polyphase_weights_against_deconv():
    w = RNG.standard_normal((3, 2, 12))
    b = RNG.standard_normal(3)
    x = RNG.standard_normal((2, 10))
    wc, bc = speed.polyphase_weights(w, b, 4)
    assert wc.shape == (12, 2, 3)
    phases = _conv1d_numpy(x, wc, bc, 2)                       # (12, T), channel o*4 + r
    y = phases.reshape(3, 4, -1).transpose(0, 2, 1).reshape(3, -1)
    np.testing.assert_allclose(y, _deconv_numpy(x, w, b, 4)[:, :40], rtol=1e-5, atol=1e-5)


GEMM = """7767517
3 3
Input                    in                       0 1 in
Gemm                     gemm_0                   1 1 in 1 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=24 9=16
Gemm                     gemm_1                   1 1 1 out 10=4 2=0 3=1 4=0 5=1 6=1 7=0 8=8 9=24
"""


def test_gemm_decode_as_innerproduct(tmp_path):
    text = decode_step.gemm_decode_as_innerproduct(GEMM)
    types = [lyr.type for lyr in export.parse_param(text).layers]
    assert types == ["Input", "Reshape", "InnerProduct", "Reshape", "Gemm"]  # the biased Gemm stays
    w0 = RNG.standard_normal((24, 16)).astype(np.float32)
    w1 = RNG.standard_normal((8, 24)).astype(np.float32)
    c1 = RNG.standard_normal(8).astype(np.float32)
    data = _tagged(w0, w1, c1)                                  # Gemm's C carries a storage tag
    assert weights.join_bin(text, weights.split_bin(GEMM, data)) == data
    x = RNG.standard_normal((1, 16)).astype(np.float32)
    ref = (x @ w0.T) @ w1.T + c1
    for t, tag in ((GEMM, "g"), (text, "i")):
        y = _run(tmp_path, t, data, x, tag=tag)
        np.testing.assert_allclose(y.reshape(1, 8), ref, rtol=1e-4, atol=1e-4)


def test_split_bin_rejects_wrong_size():
    data = _tagged(np.zeros((24, 16)), np.zeros((8, 24)), np.zeros(8))
    with pytest.raises(ValueError):
        weights.split_bin(GEMM, data + b"\0\0\0\0")


# ---------------------------------------------------------------- tiny real graphs
@pytest.fixture(scope="module")
def tiny_ncnn(tts):
    from qtts_lib import export as ex
    from qtts_lib import paths

    ex.ensure(tts, "tiny-base")
    return paths.ncnn_dir("tiny-base")


def _codec_inputs(model_dir, T):
    from qtts_lib.runtime.binding import rope

    cfg = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    codes = np.random.default_rng(3).integers(0, cfg["codebook_size"], (T, 16))
    semantic = codes[:, 0].astype(np.int32)
    acoustic = (codes[:, 1:].T + np.arange(15)[:, None] * cfg["codebook_size"]).reshape(-1).astype(np.int32)
    cos, sin = rope.tables(cfg["head_dim"], cfg["rope_theta"], 0, T)
    return [semantic[None], acoustic, rope.causal_mask(T, window=cfg["sliding_window"]), cos, sin]


def _codec(path_param, path_bin, ins):
    net = make_net(path_param, path_bin, 2)
    (y,) = run(net, {f"in{i}": a for i, a in enumerate(ins)}, ["out0"], axes={"in0": 0})
    return y.reshape(-1).astype(np.float64)


def _TINY_PARTS(c):
    return {128: 64, 64: 16, 32: 16, 16: 16}.get(c, 0)  # 64-wide parts keep sgemm, <= 48 run direct


def _TINY_TILES(c):
    return {32: 40, 16: 16, 8: 3}.get(c, 0)  # 32 channels run at 160 samples per frame: 4-sample tiles at T=1


def test_tiny_codec_time_tiles_at_one_frame(tiny_ncnn, tmp_path):
    text = (tiny_ncnn / "codec_decoder.param").read_text()
    data = (tiny_ncnn / "codec_decoder.bin").read_bytes()
    t, b = speed.codec_fast_bin(text, data, tiles_of=_TINY_TILES)
    (tmp_path / "t.param").write_text(t)
    (tmp_path / "t.bin").write_bytes(b)
    for T in (1, 2):
        ins = _codec_inputs(tiny_ncnn.parent, T)
        ref = _codec(tiny_ncnn / "codec_decoder.param", tiny_ncnn / "codec_decoder.bin", ins)
        y = _codec(tmp_path / "t.param", tmp_path / "t.bin", ins)
        assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2)) >= 100, T


def test_part_time_tiles():
    from qtts_lib.runtime.codec.cpu_form import part_time_tiles

    full = {"decoder_dim": 1536, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2]}
    assert part_time_tiles(full, 0, 384, None) == 0                       # the head runs whole: never tiled
    assert part_time_tiles(full, 4, 96, 2) == 2                           # 2 frames x 1920 samples / 2400
    assert part_time_tiles(full, 4, 96, 40) == 32                         # 76,800 / 2400
    assert part_time_tiles(full, 4, 192, 40) == 8                         # the stage's input conv: at 640 per frame
    assert part_time_tiles(full, 3, 192, 40) == 8 and part_time_tiles(full, 3, 96, 40) == 0  # 96 is not stage 3's
    assert part_time_tiles(full, 4, 96, 3000) == 1920                     # never more tiles than samples per frame
    assert part_time_tiles({**full, "decoder_dim": 128}, 4, 8, 40) == 0   # widths TILE_SAMPLES does not list


def test_tiny_codec_rewrites_keep_the_waveform(tiny_ncnn, tmp_path):
    text = (tiny_ncnn / "codec_decoder.param").read_text()
    data = (tiny_ncnn / "codec_decoder.bin").read_bytes()
    assert weights.join_bin(text, weights.split_bin(text, data)) == data
    ins = _codec_inputs(tiny_ncnn.parent, 30)
    ref = _codec(tiny_ncnn / "codec_decoder.param", tiny_ncnn / "codec_decoder.bin", ins)
    ptext, pdata = speed.deconv_polyphase(speed.conv1d_as_conv2d(text), data)
    variants = {"conv2d": (speed.conv1d_as_conv2d(text), data),
                "conv2d+deconv2d": (speed.deconv1d_as_deconv2d(speed.conv1d_as_conv2d(text)), data),
                "conv2d+poly": (ptext, pdata), "codec_rewritten": speed.codec_rewritten(text, data),
                "codec_fast_bin (whole graph)": speed.codec_fast_bin(text, data),
                # tiny's widths (8..128) are below full-size's split points: cut them with a rule that fires here
                "codec_fast_bin, every split": speed.codec_fast_bin(text, data, _TINY_PARTS),
                "codec_fast_bin, time tiles": speed.codec_fast_bin(text, data, _TINY_PARTS, _TINY_TILES)}
    tile_types = [lyr.type for lyr in export.parse_param(variants["codec_fast_bin, time tiles"][0]).layers]
    assert tile_types.count("Concat") > 100
    runtime_text = variants["codec_fast_bin (whole graph)"][0]
    fast = [(lyr.type, lyr.params) for lyr in export.parse_param(runtime_text).layers]
    assert 0 < fast.count(("UnaryOp", ["0=4"])) == fast.count(("UnaryOp", ["0=9"]))  # each Snake's sin^2: one square
    split_types = [lyr.type for lyr in export.parse_param(variants["codec_fast_bin, every split"][0]).layers]
    assert "Slice" in split_types and "Deconvolution1D" not in split_types
    for name, (t, b) in variants.items():
        (tmp_path / f"{name}.param").write_text(t)
        (tmp_path / f"{name}.bin").write_bytes(b)
        y = _codec(tmp_path / f"{name}.param", tmp_path / f"{name}.bin", ins)
        assert y.shape == ref.shape
        snr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2))
        assert snr >= 100, (name, snr)


def test_tiny_decode_step_graph_matches(tiny_ncnn, tmp_path):
    from qtts_lib.runtime.pipeline import precision

    cfg = json.loads((tiny_ncnn.parent / "config.json").read_text())["talker_config"]
    assert "InnerProduct" in decode_step.decode_step((tiny_ncnn / "talker_decoder_kv.param").read_text())
    a = precision.decoder(tiny_ncnn, "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2, fast_steps=False)
    b = precision.decoder(tiny_ncnn, "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2, fast_steps=True)
    assert a.step_net is None and b.step_net is not None
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((1, 12, cfg["hidden_size"])).astype(np.float32)
    (ya, ca), (yb, cb) = a.prefill(x0), b.prefill(x0)
    np.testing.assert_array_equal(ya, yb)  # prefill runs the same graph
    for _ in range(20):
        x = rng.standard_normal((1, 1, cfg["hidden_size"])).astype(np.float32)
        ya, yb = a.forward(x, ca), b.forward(x, cb)
        assert np.abs(ya - yb).max() <= 1e-5 * np.abs(ya).max()


# ---------------------------------------------------------------- input-channel split
def _conv3d_text(co, ci, k, dil, act=""):
    return ("7767517\n2 2\nInput                    in                       0 1 in\n"
            f"Convolution              conv_0                   1 1 in out 0={co} 1={k} 11=1 2={dil} 12=1 3=1 13=1 "
            f"4={(k - 1) * dil} 15=0 14=0 16=0 5=1 6={co * ci * k}{act}\n")


@pytest.mark.parametrize("ci,parts,nosgemm", [(96, [32, 32, 32], True), (128, [64, 64], False), (48, [48], True)])
def test_conv_split_input_numeric(tmp_path, ci, parts, nosgemm):
    co, k, dil, t = 24, 7, 3, 60
    text = _conv3d_text(co, ci, k, dil)
    w = (RNG.standard_normal((co, ci, k)) / np.sqrt(ci * k)).astype(np.float32)
    b = RNG.standard_normal(co).astype(np.float32)
    x = RNG.standard_normal((ci, 1, t)).astype(np.float32)
    data = _tagged(w) + b.tobytes()
    stext, sdata = speed.conv_split_input(text, data, lambda c: parts[0])
    layers = export.parse_param(stext).layers
    convs = [lyr for lyr in layers if lyr.type == "Convolution"]
    assert len(convs) == len(parts) and [lyr.type for lyr in layers].count("BinaryOp") == len(parts) - 1
    assert all(("31=32" in c.params) == nosgemm for c in convs)
    assert ("Slice" in [lyr.type for lyr in layers]) == (len(parts) > 1)
    ref = _conv1d_numpy(x[:, 0], w, b, (k - 1) * dil, dilation=dil)
    y = _run(tmp_path, stext, sdata, x, tag="s")[:, 0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,dil,t,n", [(7, 3, 60, 8), (7, 9, 200, 4), (7, 1, 7, 7), (1, 1, 50, 5)])
def test_conv_tile_time_numeric(tmp_path, k, dil, t, n):
    co, ci = 24, 32  # (7, 3, 60, 8): tiles of 7-8 samples, shorter than the 18-sample context
    text = _conv3d_text(co, ci, k, dil)
    w = (RNG.standard_normal((co, ci, k)) / np.sqrt(ci * k)).astype(np.float32)
    b = RNG.standard_normal(co).astype(np.float32)
    x = RNG.standard_normal((ci, 1, t)).astype(np.float32)
    data = _tagged(w) + b.tobytes()
    ttext, tdata = speed.conv_tile_time(text, data, lambda c: n if c == ci else 0)
    types = [lyr.type for lyr in export.parse_param(ttext).layers]
    assert types.count("Convolution") == n and types[1] == "Slice" and types[-1] == "Concat"
    assert all("4=0" in lyr.params for lyr in export.parse_param(ttext).layers if lyr.type == "Convolution")
    ref = _conv1d_numpy(x[:, 0], w, b, (k - 1) * dil, dilation=dil)
    y = _run(tmp_path, ttext, tdata, x, tag="t")[:, 0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    y1 = _run(tmp_path, text, data, x, tag="o")[:, 0]
    np.testing.assert_array_equal(y, y1)  # the same sums in the same order


def test_conv_split_input_leaves_fused_activations_whole():
    text = _conv3d_text(1, 96, 7, 1, act=" 9=3 -23310=2,-1.0,1.0")
    w = np.zeros((1, 96, 7), np.float32)
    data = _tagged(w) + np.zeros(1, np.float32).tobytes()
    stext, sdata = speed.conv_split_input(text, data, lambda c: 32)
    assert [lyr.type for lyr in export.parse_param(stext).layers] == ["Input", "Convolution"] and sdata == data


def test_codec_fast_graph_cache(tiny_ncnn, tmp_path):
    import shutil

    from qtts_lib.runtime.codec import cpu_form
    from qtts_lib.runtime.codec import decoder as codec

    src = tmp_path / "ncnn"
    src.mkdir()
    for f in ("codec_decoder.param", "codec_decoder.bin", "manifest.json"):
        shutil.copy2(tiny_ncnn / f, src / f)
    cfg = json.loads((tiny_ncnn.parent / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    (src / cpu_form.FAST_DIR).mkdir()
    (src / cpu_form.FAST_DIR / "codec_decoder.bin").write_bytes(b"left by an older version")
    out, desc = cpu_form.fast_graph(src, cfg)
    assert out == src / cpu_form.FAST_DIR and not (out / "codec_decoder.bin").exists()  # the stale file is gone
    assert desc["key"]["version"] == cpu_form.FORM_VERSION and "codec_decoder.bin" in desc["key"]
    rates = cfg["upsampling_ratios"] + cfg["upsample_rates"]
    assert [p["role"] for p in desc["parts"]] == ["codes", "transformer"] + ["upsample"] * len(rates)
    assert [p["up"] for p in desc["parts"][2:]] == rates and (out / desc["transformer_kv"]).is_file()
    assert desc["parts"][0]["context"] >= 3  # the pre_conv's kernel of 3 (+ 1 for safety)
    assert all(p["context"] > 0 and p["chunk_frames"] >= 1 for p in desc["parts"][2:])
    stamp = (out / "codec_decoder.part2.bin").stat().st_mtime_ns
    assert cpu_form.fast_graph(src, cfg) == (out, desc)
    assert (out / "codec_decoder.part2.bin").stat().st_mtime_ns == stamp  # reused
    (src / "codec_decoder.param").write_text((src / "codec_decoder.param").read_text() + "\n")  # source changed
    assert cpu_form.fast_graph(src, cfg)[1]["key"] != desc["key"]
    codes = np.random.default_rng(5).integers(0, cfg["codebook_size"], (20, 16))
    ref = codec.Codec(src, cfg, 2, form="exported").decode(codes).astype(np.float64)
    y = codec.Codec(src, cfg, 2, form="cpu").decode(codes)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2)) >= 100


def test_tiny_codec_parts_chunked_equal_whole(tiny_ncnn):
    """The parts chained over whole inputs equal the exported graph; chunked (the runtime's way) they equal the
    unchunked parts exactly, at lengths that are and are not multiples of the chunks, from one frame up."""
    from qtts_lib.runtime.codec import decoder as codec

    cfg = json.loads((tiny_ncnn.parent / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    fast, whole = codec.Codec(tiny_ncnn, cfg, 2), codec.Codec(tiny_ncnn, cfg, 2)
    for p in whole.parts:
        p.chunk_frames = None
    exported = codec.Codec(tiny_ncnn, cfg, 2, form="exported")
    assert min(p.chunk_frames for p in fast.parts[2:]) < 7  # the last parts run chunked from 7 frames on
    for T in (1, 2, 7, 40, 61):
        codes = np.random.default_rng(T).integers(0, cfg["codebook_size"], (T, 16))
        y = fast.decode_once(codes)
        assert y.shape == (T * 1920,)
        np.testing.assert_array_equal(y, whole.decode_once(codes))
        ref = exported.decode_once(codes).astype(np.float64)
        assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2)) >= 100, T


def test_tiny_codec_parts_share_one_memory_pool(tiny_ncnn):
    """Every part of a codec allocates from one ncnn pool (`binding.net.memory_pool`), held by each part; the samples
    are those of parts with their own pools, bit for bit, decode after decode."""
    from qtts_lib.runtime.codec import decoder as codec
    from qtts_lib.runtime.codec.cpu_form import fast_graph, load_parts
    from qtts_lib.runtime.codec.parts import run_parts

    cfg = json.loads((tiny_ncnn.parent / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    shared = codec.Codec(tiny_ncnn, cfg, 2)
    assert shared.parts[0].pool is not None and len({id(p.pool) for p in shared.parts}) == 1
    own = load_parts(*fast_graph(tiny_ncnn, cfg), 2)
    assert all(p.pool is None for p in own)
    for T in (40, 7, 40):
        codes = np.random.default_rng(T).integers(0, cfg["codebook_size"], (T, 16))
        x = shared.transformer_output(codes)
        np.testing.assert_array_equal(run_parts(shared.parts[2:], x), run_parts(own[2:], x))


def test_tiny_codec_stateful_parts_compute_each_sample_once(tiny_ncnn):
    """The upsampling parts with their convolutions' states (`rewrites.codec_cpu.stateful_convolutions`): from zero
    states, one call gives the samples of the part as written bit for bit; fed in pieces of one frame, with no left
    context, the samples of one call over them all; every state is a causal convolution's left padding."""
    from qtts_lib.runtime.codec.cpu_form import fast_graph, load_parts, manifest_axes
    from qtts_lib.runtime.codec.parts import PartChain, run_parts, transformer_output
    from qtts_lib.runtime.rewrites.codec_cpu import stateful_convolutions

    cfg = json.loads((tiny_ncnn.parent / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    directory, desc = fast_graph(tiny_ncnn, cfg)
    plain, stateful = load_parts(directory, desc, 2), load_parts(directory, desc, 2, stateful=True)
    assert [len(p.states) for p in plain] == [0] * len(plain)
    assert all(p.states for p in stateful[2:])
    text = (directory / desc["parts"][2]["files"][0]).read_text()
    _, states = stateful_convolutions(text)
    assert len(states) == text.count("Convolution") - sum(" 4=0" in line for line in text.splitlines()
                                                             if line.startswith("Convolution"))
    codes = np.random.default_rng(3).integers(0, cfg["codebook_size"], (24, 16))
    x = transformer_output(stateful, codes, cfg, manifest_axes(directory / "manifest.json"))
    whole = run_parts(stateful[2:], x)
    np.testing.assert_array_equal(whole, run_parts(plain[2:], x))
    chain = PartChain(stateful[2:])
    pieces = np.concatenate([chain.push(x[..., t:t + 1]) for t in range(x.shape[-1])], axis=-1)
    assert 10 * np.log10(np.sum(whole.astype(np.float64) ** 2) / np.sum((pieces - whole) ** 2 + 1e-30)) >= 100


# ---------------------------------------------------------------- cutting a graph
CHAIN = """7767517
4 4
Input                    in0                      0 1 in0
UnaryOp                  a                        1 1 in0 x 0=1
UnaryOp                  b                        1 1 x y 0=1
BinaryOp                 c                        2 1 x y out0 0=0
"""


def test_cut_graph_refuses_a_blob_that_does_not_cut():
    with pytest.raises(ValueError, match="does not cut"):
        graph.cut_graph(CHAIN, "y")   # the tail would need x as well
    with pytest.raises(ValueError, match="no layer"):
        graph.cut_graph(CHAIN, "nope")
    head, tail = graph.cut_graph(CHAIN.replace("2 1 x y out0", "1 1 y out0").replace("0=0", "0=0 1=1 2=1.0"), "y")
    assert [lyr.name for lyr in export.parse_param(head).layers] == ["in0", "a", "b"]
    assert export.parse_param(head).layers[-1].outputs == ["out0"]
    assert [(lyr.name, lyr.inputs) for lyr in export.parse_param(tail).layers] == [("in0", []), ("c", ["in0"])]


def test_reach_of_a_causal_convolution(tmp_path):
    """`codec.reach` finds a dilated causal convolution's left reach: dilation x (kernel - 1) input samples (plus
    the one the measurement adds for safety), through a stride-1 layer (up = 1)."""
    from qtts_lib.runtime.codec.parts import Part, reach

    ci, co, k, dil = 4, 3, 5, 3
    text = _conv3d_text(co, ci, k, dil).replace(" in ", " in0 ").replace(" out ", " out0 ").replace(" in\n", " in0\n")
    w = RNG.standard_normal((co, ci, k)).astype(np.float32)
    (tmp_path / "c.param").write_text(text)
    (tmp_path / "c.bin").write_bytes(_tagged(w) + np.zeros(co, np.float32).tobytes())
    part = Part(make_net(tmp_path / "c.param", tmp_path / "c.bin", 1), spf=1, up=1)
    assert reach(part, RNG.standard_normal((ci, 1, 200)).astype(np.float32)) == dil * (k - 1) + 1


def test_small_layers_run_on_one_thread_and_compute_the_same(tiny_ncnn):
    """`one_thread_small_layers`: ncnn's one-thread bit (128) joins each small layer's featmask (an fp16 mask kept),
    projections and attention keep every thread; the talker's cached graph gives the same numbers either way, and
    with its shapes made static as well (`cpu_graph`, what the runtime loads)."""
    from qtts_lib.runtime.binding.cached import KvCacheNet
    from qtts_lib.runtime.binding.graph import Graph, params_dict
    from qtts_lib.runtime.binding.net import make_net
    from qtts_lib.runtime.rewrites.decode_step import ONE_THREAD, SMALL_LAYERS, cpu_graph, one_thread_small_layers

    text = "7767517\n3 3\nInput in0 0 1 in0\nRMSNorm n 1 1 in0 a 0=4 31=2\nGemm g 1 1 a out0 7=4\n"
    masks = {lyr.type: params_dict(lyr).get("31") for lyr in Graph(one_thread_small_layers(text)).layers}
    assert masks == {"Input": None, "RMSNorm": str(2 | ONE_THREAD), "Gemm": None}
    param, bin_ = tiny_ncnn / "talker_decoder_kv.param", tiny_ncnn / "talker_decoder.bin"
    kinds = {lyr.type for lyr in Graph(param.read_text()).layers}
    assert {"RMSNorm", "Permute", "Split"} <= kinds & set(SMALL_LAYERS)
    cfg = json.loads((tiny_ncnn.parent / "config.json").read_text())["talker_config"]
    x = np.random.default_rng(5).standard_normal((1, 9, cfg["hidden_size"])).astype(np.float32)
    outs = []
    for rewrite in (None, one_thread_small_layers, cpu_graph):
        net = KvCacheNet(make_net(param, bin_, 2, rewrite=rewrite), cfg["num_hidden_layers"], cfg["head_dim"],
                         cfg["rope_theta"])
        h, cache = net.prefill(x[:, :6])
        outs.append(np.concatenate([h] + [net.forward(x[:, t:t + 1], cache) for t in range(6, 9)], axis=1))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    reshapes = [params_dict(lyr) for lyr in Graph(cpu_graph(param.read_text())).layers if lyr.type == "Reshape"]
    assert reshapes and not [d for d in reshapes if "6" in d]  # every shape of the exported graph made static


def test_one_position_graphs_drop_the_permutes_and_compute_the_same(tiny_ncnn):
    """`one_position`: the code predictor's graph with its heads (what the runtime loads, fp32 and int8) and the
    talker's lose every Permute; steps through them with ncnn's packed layouts off (`PACKING_OFF`) give what the
    graph with the Permutes gives with them on, bit for bit, and so does the runtime's predictor
    (`precision.predictor_with_heads`: prefill in one, steps in the other)."""
    from qtts_lib.runtime.binding.cached import KvCacheNet
    from qtts_lib.runtime.binding.graph import Graph
    from qtts_lib.runtime.binding.net import PACKING_OFF, nets_from_bins
    from qtts_lib.runtime.pipeline import precision
    from qtts_lib.runtime.rewrites.decode_step import cpu_graph, one_position, static_reshapes
    from qtts_lib.runtime.rewrites.gpu import fused_predictor_param

    cfg = json.loads((tiny_ncnn.parent / "config.json").read_text())["talker_config"]
    p = cfg["code_predictor_config"]
    talker = (tiny_ncnn / "talker_decoder_kv.param").read_text()
    assert "Permute" in talker and "Permute" not in one_position(static_reshapes(talker))
    with pytest.raises(ValueError, match="Permute"):
        one_position(one_position(static_reshapes(talker)))
    x = np.random.default_rng(6).standard_normal((1, 16, p["hidden_size"])).astype(np.float32)
    for tier in ("fp32", "int8"):
        if tier == "int8":
            (param, dec_bin), (heads_param, heads_bin) = (precision.ensure_int8(tiny_ncnn, n) for n in
                                                          ("predictor_decoder", "predictor_heads"))
        else:
            param, dec_bin = tiny_ncnn / "predictor_decoder_kv.param", tiny_ncnn / "predictor_decoder.bin"
            heads_param, heads_bin = tiny_ncnn / "predictor_heads.param", tiny_ncnn / "predictor_heads.bin"
        fused = cpu_graph(fused_predictor_param(param.read_text(), heads_param.read_text()))
        step_text = one_position(fused)
        assert {lyr.type for lyr in Graph(fused).layers} - {lyr.type for lyr in Graph(step_text).layers} == {"Permute"}
        nets = nets_from_bins([fused, step_text], [dec_bin, heads_bin], 2, options=[None, PACKING_OFF])
        runtime = precision.predictor_with_heads(tiny_ncnn, p["head_dim"], p["rope_theta"], precision=tier)
        assert runtime.step_net is not None
        outs = []
        for step in (None, nets[1]):  # the graph's own steps (packed layouts on); one-position steps (off)
            decoder = KvCacheNet(nets[0], p["num_hidden_layers"], p["head_dim"], p["rope_theta"], step=step,
                                 logits=True)
            logits, cache = decoder.prefill(x[:, :2], "logits_0")
            outs.append([logits] + [decoder.forward(x[:, s + 2:s + 3], cache, f"logits_{s + 1}") for s in range(14)])
        logits, cache = runtime.prefill(x[:, :2], "logits_0")
        outs.append([logits] + [runtime.forward(x[:, s + 2:s + 3], cache, f"logits_{s + 1}") for s in range(14)])
        for other in outs[1:]:
            for a, b in zip(outs[0], other):
                np.testing.assert_array_equal(a, b)


def test_static_reshapes_name_a_shape_with_one_input_dim_inferred():
    """`static_reshapes`: an expression of whole numbers and one of the input's dims becomes the same numbers with
    that dim -1 (w, h, c as 0, 1, 2; d as 11); an expression over two blobs or with arithmetic stays as it was."""
    from qtts_lib.runtime.binding.graph import Graph, params_dict
    from qtts_lib.runtime.rewrites.decode_step import static_reshapes

    shapes = ['6="128,16,0h"', '6="2048,0c"', '6="0w,4,2,3"', '6="0w,1h,//(0h,1h),0c"', '6="*(0w,0h),0c"', "0=7 1=-1"]
    text = "7767517\n" + f"{len(shapes) + 1} {len(shapes) + 1}\nInput in0 0 1 x0\n" + "".join(
        f"Reshape r{i} 1 1 x{i} x{i + 1} {p}\n" for i, p in enumerate(shapes))
    got = [params_dict(lyr) for lyr in Graph(static_reshapes(text)).layers[1:]]
    assert got == [{"0": "128", "1": "16", "2": "-1"}, {"0": "2048", "1": "-1"},
                   {"0": "-1", "1": "4", "11": "2", "2": "3"}, {"6": '"0w,1h,//(0h,1h),0c"'},
                   {"6": '"*(0w,0h),0c"'}, {"0": "7", "1": "-1"}]


def test_fresh_names_are_fresh_in_a_graph_an_earlier_rewrite_named():
    """A rewrite over a rewritten graph: `Graph.fresh` never hands out a layer or blob name the graph already has
    (an earlier rewrite's `x_sp1` included), else two blobs would share a name and ncnn refuse the graph."""
    text = "7767517\n2 2\nInput in 0 1 x_sp1\nReLU x_sp2 1 1 x_sp1 x_sp3\n"
    g = graph.Graph(text)
    names = [g.fresh("x") for _ in range(3)]
    assert names == ["x_sp4", "x_sp5", "x_sp6"]
