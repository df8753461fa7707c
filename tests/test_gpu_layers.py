"""The GPU forms of the decoders (`rewrites.gpu_layers`) and the GPU loop that runs them (`pipeline.loop`:
`GpuDecoder`, `GemvCodePredictor`), on tiny-base: the rewrite's structure, its parity with the exported graphs on the
CPU and on Vulkan (lavapipe in CI; skipped without a device, a failure where QTTS_REQUIRE_VULKAN is set), and no
layer of the GPU loop without a Vulkan kernel."""
import json

import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.runtime.binding import rope
from qtts_lib.runtime.binding.net import net_from_text, run
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.pipeline.loop import CodePredictor, Loop
from qtts_lib.runtime.rewrites import gpu_layers

CKPT = "tiny-base"


@pytest.fixture(scope="module")
def ncnn_dir(synth):
    return paths.model_dir(CKPT) / "ncnn"


@pytest.fixture(scope="module")
def talker_cfg():
    return json.loads((paths.model_dir(CKPT) / "config.json").read_text())["talker_config"]


def _vulkan():
    from qtts_lib.lab.vulkan import vulkan_or_skip

    found, why = vulkan_or_skip()
    if not found:
        pytest.skip(why)
    return "vulkan"


def _texts(ncnn_dir, name):
    return (ncnn_dir / f"{name}.param").read_text(), (ncnn_dir / f"{name}_kv.param").read_text()


@pytest.mark.parametrize("name", ["predictor_decoder", "talker_decoder"])
def test_gpu_form_folds_every_block(ncnn_dir, talker_cfg, name):
    """Per transformer layer: q/k/v and gate/up fused (3 Gemms fewer), one head split, two residuals into Gemm C;
    the three forms read the weights in the same order; the one-position form has no Gemm left, only InnerProducts."""
    layers = precision.cached_layers(ncnn_dir, name)
    text, kv = _texts(ncnn_dir, name)
    texts, blob, stats = gpu_layers.gpu_decoder(text, (ncnn_dir / f"{name}.bin").read_bytes(), kv)
    assert stats["fused_gemms"] == 3 * layers
    assert stats["attention_blocks"] == layers
    assert stats["residuals"] == 2 * layers
    before, after = parse_param(text).counts, parse_param(texts["full"]).counts
    assert after["Gemm"] == before["Gemm"] - 3 * layers
    assert after["RotaryEmbed"] == layers and after["Permute"] == 2 * layers and after["BinaryOp"] == layers
    assert sum(after.values()) < 0.72 * sum(before.values())
    step = parse_param(texts["step"]).counts
    assert step["Gemm"] == 0 and step["InnerProduct"] == before["Gemm"] - 3 * layers
    # the same weights, rows regrouped: a fused Gemm has one storage tag for what were two or three
    assert len(blob) == (ncnn_dir / f"{name}.bin").stat().st_size - 4 * 3 * layers


def test_unequal_norms_keep_one_norm_each(ncnn_dir):
    """Where q's and k's RMSNorm differ (a real checkpoint's norms carry weights), each keeps its own norm and rope;
    the head split is still one Reshape, one Permute and one Slice in three."""
    text, _ = _texts(ncnn_dir, "predictor_decoder")
    lines = text.splitlines()
    norms = [i for i, ln in enumerate(lines) if ln.startswith("RMSNorm") and "0=32 " in ln]
    lines[norms[1]] = lines[norms[1]].replace("1=1.000000e-6", "1=2.000000e-6")  # k's norm of the first layer
    texts, _, stats = gpu_layers.gpu_decoder("\n".join(lines) + "\n", (ncnn_dir / "predictor_decoder.bin").read_bytes())
    assert stats["attention_blocks"] == 2
    full = texts["full"]
    assert sum(ln.startswith("Slice") and "-23300=3," in ln for ln in full.splitlines()) == 1
    assert parse_param(full).counts["RotaryEmbed"] == 3


def test_a_pattern_it_does_not_know_is_left_alone(ncnn_dir):
    text, _ = _texts(ncnn_dir, "predictor_decoder")
    odd = text.replace("0=2\n", "0=1\n", 1)  # the first head Permute is another permutation now
    texts, _, stats = gpu_layers.gpu_decoder(odd, (ncnn_dir / "predictor_decoder.bin").read_bytes())
    assert stats["attention_blocks"] == 1


def test_one_blob_step_takes_one_input_and_no_mask(ncnn_dir, talker_cfg):
    forms = gpu_layers.ensure_gpu_decoder(ncnn_dir, "talker_decoder")
    step = gpu_layers.one_blob_io(forms["step"].read_text(), talker_cfg["head_dim"],
                                  talker_cfg["num_key_value_heads"], row=talker_cfg["hidden_size"])
    info = parse_param(step)
    assert info.input_blobs == ["x", "cache_all_in"]
    assert all("5=0" in lyr.params for lyr in info.layers if lyr.type == "SDPA")
    outs = {b for lyr in info.layers for b in lyr.outputs}
    assert {"all_out0", "out0", "cache_all_out"} <= outs


def _decoder_parity(ncnn_dir, cfg, name, device):
    """The exported decoder on the CPU vs the GPU forms on `device`: the full graph at 9 rows, and `GpuDecoder`
    (prefill 9, cached steps to 12 positions, then the full sequence) for 8 more rows. The flat caches assume the
    plain cache layout of a Vulkan device (`binding.cache_layout`): on the CPU only the full sequence is run."""
    from qtts_lib.runtime.pipeline.loop import gpu_talker

    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 17, cfg["hidden_size"])).astype(np.float32)
    cpu = precision.decoder(ncnn_dir, name, cfg["head_dim"], cfg["rope_theta"], 2, "cpu")
    ref, cache = cpu.prefill(x[:, :9])
    refs = [ref] + [cpu.forward(x[:, t:t + 1], cache) for t in range(9, 17)]
    forms = gpu_layers.ensure_gpu_decoder(ncnn_dir, name)
    full = net_from_text(forms["full"].read_text(), forms["bin"], 2, device)
    cos, sin = rope.tables(cfg["head_dim"], cfg["rope_theta"], 0, 9)
    ours = run(full, {"in0": x[:, :9], "in1": rope.causal_mask(9), "in2": cos, "in3": sin}, ["out0"],
               axes={"in0": 0, "out0": 0})[0]
    errs = [np.linalg.norm(ours - ref) / np.linalg.norm(ref)]
    if name == "talker_decoder":
        gpu = gpu_talker(ncnn_dir, cfg, 2, device, max_cached=0 if device == "cpu" else 12)
        h, c = gpu.prefill(x[:, :9])
        outs = [h] + [gpu.forward(x[:, t:t + 1], c) for t in range(9, 17)]
        assert c.flat is None and c.past == 17  # it went over to the full sequence (on the CPU: began there)
        errs += [np.linalg.norm(o - r) / np.linalg.norm(r) for o, r in zip(outs, refs)]
    return errs


@pytest.mark.parametrize("name", ["predictor_decoder", "talker_decoder"])
def test_gpu_forms_match_the_exported_graph_on_the_cpu(ncnn_dir, talker_cfg, name):
    cfg = talker_cfg if name == "talker_decoder" else talker_cfg["code_predictor_config"]
    assert max(_decoder_parity(ncnn_dir, cfg, name, "cpu")) < 1e-5


@pytest.mark.parametrize("name", ["predictor_decoder", "talker_decoder"])
def test_gpu_forms_match_the_exported_graph_on_vulkan(ncnn_dir, talker_cfg, name):
    device = _vulkan()
    cfg = talker_cfg if name == "talker_decoder" else talker_cfg["code_predictor_config"]
    assert max(_decoder_parity(ncnn_dir, cfg, name, device)) < 1e-5


def test_gemv_predictor_gives_the_cpu_predictors_frame(synth):
    """Greedy: the GPU loop's code predictor (16 one-position calls) makes the CPU predictor's codes and embedding."""
    from qtts_lib.runtime import Sampling
    from qtts_lib.runtime.pipeline.sampling import Sampler

    device = _vulkan()
    gpu = Loop.load(synth.config, synth.embeddings, 2, device)
    cpu = synth.loop.predictor
    assert isinstance(cpu, CodePredictor)
    h = np.random.default_rng(3).standard_normal(synth.config.talker["hidden_size"]).astype(np.float32)
    for c0 in (5, 77):
        a = cpu.frame(h, c0, Sampler(Sampling(greedy=True), synth.config.talker))
        b = gpu.predictor.frame(h, c0, Sampler(Sampling(greedy=True), synth.config.talker))
        np.testing.assert_array_equal(b.codes, a.codes)
        np.testing.assert_allclose(b.embed, a.embed, rtol=1e-5, atol=1e-6)


def test_the_gpu_loop_runs_no_layer_on_the_cpu(synth):
    """Every graph the GPU loop runs has a Vulkan kernel for every layer (none falls back to the CPU mid-graph)."""
    device = _vulkan()
    loop = Loop.load(synth.config, synth.embeddings, 2, device)
    nets = [loop.talker.prefill_net, loop.talker.step_net, loop.talker.full, loop.head.net, loop.predictor.first,
            loop.predictor.step]
    for net in nets:
        assert [lyr.name for lyr in net.layers() if not lyr.support_vulkan] == []


@pytest.fixture(scope="module")
def codec_cfg():
    return json.loads((paths.model_dir(CKPT) / "speech_tokenizer" / "config.json").read_text())["decoder_config"]


def test_the_codecs_gpu_form_leaves_the_cpu_only_the_codebooks(ncnn_dir, codec_cfg):
    """Part 0 holds every Embed and the MatMul (the codebook sums) and the pre_conv; part 1 none of the four layer
    types ncnn has no Vulkan kernel for, and no CPU-only cut (time tiles, channel splits)."""
    from qtts_lib.runtime.rewrites.codec_cpu import codec_gpu_parts

    text = (ncnn_dir / "codec_decoder.param").read_text()
    (t0, _), (t1, b1) = codec_gpu_parts(text, (ncnn_dir / "codec_decoder.bin").read_bytes(), codec_cfg)
    before, codes, rest = parse_param(text).counts, parse_param(t0).counts, parse_param(t1).counts
    assert codes["Embed"] == before["Embed"] == 2 and codes["MatMul"] == 1 and codes["Convolution"] == 1
    for kind in ("Embed", "MatMul", "Deconvolution1D", "ConvolutionDepthWise1D", "Convolution1D", "Deconvolution"):
        assert rest.get(kind, 0) == 0, kind
    assert rest["SDPA"] == before["SDPA"]
    assert rest["ConvolutionDepthWise"] == before["ConvolutionDepthWise1D"]
    # one Convolution per exported 1-D conv but the pre_conv, and one per transposed conv (polyphase)
    assert rest["Convolution"] == before["Convolution1D"] - 1 + before["Deconvolution1D"]
    assert codec_gpu_parts(text, (ncnn_dir / "codec_decoder.bin").read_bytes(), codec_cfg)[1] == (t1, b1)


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
def test_the_codecs_gpu_form_decodes_as_the_exported_graph(ncnn_dir, codec_cfg, device):
    """The same waveform as the exported graph on the CPU (to float rounding), and on Vulkan with every layer of
    its Vulkan graph on the GPU."""
    from qtts_lib.runtime.codec.decoder import Codec

    device = _vulkan() if device == "vulkan" else device
    codes = np.random.default_rng(4).integers(0, codec_cfg["codebook_size"], (20, 16))
    ref = Codec(ncnn_dir, codec_cfg, 2, form="exported").decode_once(codes)
    codec = Codec(ncnn_dir, codec_cfg, 2, device, form="gpu")
    wav = codec.decode_once(codes)
    assert wav.shape == ref.shape == (20 * 1920,)
    snr = 20 * np.log10(np.linalg.norm(ref) / np.linalg.norm(wav - ref))
    assert snr > 90, snr
    if device != "cpu":
        assert [lyr.name for lyr in codec.net.layers() if not lyr.support_vulkan] == []


def test_random_bins_follow_the_param(tmp_path):
    from qtts_lib.bench.gpu import write_random_bin

    (tmp_path / "g.param").write_text("7767517\n2 2\nInput in0 0 1 in0\n"
                                      "Gemm g 1 1 in0 out0 10=4 2=0 3=1 4=0 5=1 6=1 7=0 8=3 9=2\n")
    write_random_bin(tmp_path / "g.bin", 4 + 24 + 4 + 12)
    data = (tmp_path / "g.bin").read_bytes()
    assert data[:4] == b"\0\0\0\0" and data[28:32] == b"\0\0\0\0"
    assert np.abs(np.frombuffer(data[4:28], np.float32)).max() > 0
    with pytest.raises(ValueError):
        write_random_bin(tmp_path / "g.bin", 40)


def test_the_gpu_benchs_mel_stub_is_librosas():
    librosa = pytest.importorskip("librosa")
    from qtts_lib.bench.gpu import _librosa_mel

    a = _librosa_mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    np.testing.assert_array_equal(a, librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000))
