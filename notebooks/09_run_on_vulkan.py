# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Run the port on Vulkan
# > Same graphs, same tokens, another device: prove it, then find out what a GPU buys.
#
# **You will:** run every exported graph and the KV-cache steps on a Vulkan device against the CPU, generate on
# Vulkan token for token against chapter 03's goldens (x-vector and ICL), test ncnn's rope and mask conventions
# live, measure fp16 instead of assuming it, and read the H200 timings of `qtts_lib.bench`.
#
# **You will learn:** which conventions the Vulkan kernels share with the CPU ones on this ncnn version; why fp16 is
# off by default; where the time goes on a GPU through the Python binding (ncnn's Vulkan Gemm on one row, then per-call
# host work) and the GPU forms that cut both: fewer layers, GEMV steps, one upload and one download per call.
#
# **You need:** a Vulkan device ncnn can see (a GPU, or Mesa's lavapipe on any CPU: `apt-get install
# mesa-vulkan-drivers libvulkan1`; without one this chapter records a skip, and fails where `QTTS_REQUIRE_VULKAN` is
# set); chapter 03's
# goldens; the graphs of chapters 04–05 (exported here if missing). `QTTS_DEVICE=vulkan:N` picks a device.
# **Leaves behind:** `data/outputs/<ckpt>/09_vulkan.wav`, `data/reports/<ckpt>/09_run_on_vulkan.json`.

# %%
import inspect
import json

import matplotlib.pyplot as plt
import ncnn
import numpy as np
import pandas as pd
import torch
from IPython.display import display

from qtts_lib import artifacts, check, checkpoint, export, inputs, modules, paths, reference, settings
from qtts_lib.lab import vulkan as lab
from qtts_lib.runtime import Sampling, Synthesizer
from qtts_lib.runtime.audio.wav import load_wav, save_wav
from qtts_lib.runtime.binding.cached import KvCacheNet
from qtts_lib.runtime.binding.net import Net, gpu_names, net_from_text
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.pipeline.loop import Loop, gpu_talker
from qtts_lib.runtime.pipeline.sampling import Sampler
from qtts_lib.runtime.rewrites import gpu as gpu_forms
from qtts_lib.runtime.rewrites import gpu_layers

ckpt = settings.checkpoint()
THREADS = settings.threads()
DEVICE = settings.device() if settings.device().startswith("vulkan") else "vulkan"
torch.set_num_threads(THREADS)
report = check.begin("09_run_on_vulkan", ckpt)
model_dir = checkpoint.ensure(ckpt)
out_dir = paths.ncnn_dir(ckpt)

# %% [markdown]
# ## 1. Find a Vulkan device
# The pip `ncnn` wheel has Vulkan compiled in; whether it finds a device depends on the Vulkan loader and a driver.
# `lab.vulkan_or_skip` (`qtts_lib.lab.vulkan`, this chapter's probes) is the gate: no device means a recorded skip,
# except where the environment variable `QTTS_REQUIRE_VULKAN` is set, where it raises `VulkanRequired`. `.ci/run`
# installs lavapipe and sets it, so a skip there would hide a broken set-up; `tests/test_chapter_skips.py` checks
# that rule. Set it yourself (`export QTTS_REQUIRE_VULKAN=1`) on a machine that must have a GPU.

# %%
gpu, why = lab.vulkan_or_skip()
print(f"ncnn {ncnn.__version__}: {ncnn.get_gpu_count()} Vulkan device(s): {why}")
if gpu:
    check.equal(f"{DEVICE} is a device ncnn sees", "devices", len(gpu_names()) > 0, True)
else:
    check.current().record("chapter 09 on Vulkan", "skipped", why, "needs a Vulkan device", True, "--")

# %% [markdown]
# ## 2. Run every graph on Vulkan at two lengths
# The same inputs as chapter 04 (seeded, both lengths of each module) go through the CPU graph and the Vulkan graph;
# each pair is compared with the metric and tolerance that module's spec carries (`spec.check`, as in 02 and 04).
# fp16 is off on both (`runtime.binding.net.make_net`), so the differences are summation order only.

# %%
results = []
if gpu:
    tts = reference.load(model_dir, threads=THREADS)
    export.ensure(tts, ckpt)
    for name in modules.MODULES:
        spec = modules.get(name)
        cpu, gpu_net = Net(out_dir, name, THREADS), Net(out_dir, name, THREADS, DEVICE)
        for length in spec.lengths:
            arrays = [t.numpy() for t in spec.inputs(tts, length, seed=1000 + length).values()]
            ref = np.concatenate([o.ravel() for o in cpu(*arrays)])
            ours = np.concatenate([o.ravel() for o in gpu_net(*arrays)])
            spec.check(f"{name} @ {length}: Vulkan vs CPU", ours, ref)
            results.append({"module": name, "length": f"length {spec.lengths.index(length) + 1}",
                            "rel": check.rel_err(ours, ref)})

# %%
if gpu:
    fig, ax = plt.subplots(figsize=(9, 3))
    frame = pd.DataFrame(results).pivot(index="module", columns="length", values="rel").clip(lower=1e-10)
    frame.plot.bar(ax=ax, logy=True, rot=30, ylabel="relative L2 error", title=f"{DEVICE} vs CPU, fp32 ({ckpt})")
    ax.axhline(1e-5, color="crimson", ls="--", lw=1)

# %% [markdown]
# ## 3. Step the KV caches on Vulkan
# Prefill 9 positions, then 16 cached steps, for both decoders, each against the CPU decoder the runtime loads
# (`precision.decoder`): the landed decoder on Vulkan (the same call with `device=DEVICE`: every layer's K and V
# extracted separately) and the packed one (`KvCacheNet(packed=True)` over the two graphs of
# `rewrites.gpu.packed_cache_params`: all caches as one blob), and for the talker the GPU loop's own decoder
# (`pipeline.loop.gpu_talker`, section 7: the GPU forms, one-position GEMV steps, one flat cache blob), told here to
# step from its cache up to 16 positions and to run the full sequence after, so both of its ways are checked. A
# decoder holds no state: `prefill` returns the hidden states and a new cache, `forward(x, cache)` grows it.
# Threshold as chapter 05: relative error 1e-5 at every step.

# %%
def packed_decoder(name: str, c: dict) -> KvCacheNet:
    prefill, step = gpu_forms.packed_cache_params((out_dir / f"{name}_kv.param").read_text())
    nets = [net_from_text(text, out_dir / f"{name}.bin", THREADS, DEVICE) for text in (prefill, step)]
    return KvCacheNet(nets[0], precision.cached_layers(out_dir, name), c["head_dim"], c["rope_theta"], step=nets[1],
                      packed=True, name=name)


def prefill_and_step(net: KvCacheNet, x: np.ndarray) -> list[np.ndarray]:
    hidden, cache = net.prefill(x[:, :9])  # (1, 9, hidden), the cache of 9 positions
    return [hidden] + [net.forward(x[:, t : t + 1], cache) for t in range(9, 9 + STEPS)]


STEPS = 16
step_errors = {}
if gpu:
    cfg = checkpoint.load_config(ckpt)["talker_config"]
    for name, c in (("talker_decoder", cfg), ("predictor_decoder", cfg["code_predictor_config"])):
        x = np.random.default_rng(8).standard_normal((1, 9 + STEPS, c["hidden_size"])).astype(np.float32)
        nets = {dev: precision.decoder(out_dir, name, c["head_dim"], c["rope_theta"], THREADS, device)
                for dev, device in (("cpu", "cpu"), ("landed", DEVICE))} | {"packed": packed_decoder(name, c)}
        if name == "talker_decoder":
            nets["GPU forms"] = gpu_talker(out_dir, c, THREADS, DEVICE, max_cached=16)
        outs = {k: prefill_and_step(n, x) for k, n in nets.items()}
        for kind in [k for k in nets if k != "cpu"]:
            errs = [check.rel_err(o, r) for o, r in zip(outs[kind], outs["cpu"])]
            step_errors[f"{name} ({kind})"] = errs
            check.at_most(f"{name}: Vulkan {kind} caches, prefill + {STEPS} steps", "worst rel", max(errs), 1e-5)

# %%
if gpu:
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for label, errs in step_errors.items():
        ax.semilogy(range(STEPS + 1), np.maximum(errs, 1e-10), marker="o", ms=3, label=label)
    ax.axhline(1e-5, color="crimson", ls="--", lw=1)
    ax.set(xlabel="call (0 = prefill)", ylabel="rel vs CPU", title="cached decoding on Vulkan vs CPU")
    ax.legend(fontsize=8)

# %% [markdown]
# ## 4. Generate on Vulkan, token for token
# `Synthesizer(model_dir, device=...)` is the product's pipeline on the GPU, and on a GPU it always runs the rewritten
# graphs of section 7. The landed loop, the CPU's graphs on the GPU, is `Loop.load(..., gpu_forms=False)` over the
# same config and embedding tables. Both must give every code of chapter 03's CPU goldens (PyTorch, greedy, fp32):
# x-vector and ICL (the voice clip encoded by Mimi and the speaker encoder on Vulkan too). The runtime samples by
# default (the checkpoint's generation config), so a parity run asks for `Sampling(greedy=True)`; and it counts
# frames, where the goldens were made with HF's `max_new_tokens` (N tokens give N - 1 frames).

# %%
GREEDY, FRAMES = Sampling(greedy=True), inputs.GOLDEN_MAX_NEW_TOKENS - 1
if gpu:
    xvec_golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "xvec_greedy.npz", ckpt)
    icl_golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "icl_greedy.npz", ckpt)
    voice_wav, voice_text = load_wav(paths.voice_wav()), (paths.INPUTS / "voice.txt").read_text().strip()
    synth = Synthesizer(model_dir, THREADS, DEVICE)
    landed = Loop.load(synth.config, synth.embeddings, THREADS, DEVICE, gpu_forms=False)
    runs = {}
    for mode, golden, voice in (("x-vector", xvec_golden, synth.voice(xvector=xvec_golden["xvector"])),
                                ("ICL", icl_golden, synth.voice(wav=voice_wav, text=voice_text))):
        result = synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, GREEDY, max_frames=FRAMES)
        check.tokens_equal(f"{mode}, rewritten loop on Vulkan: codes = CPU golden", result.codes, golden["codes"])
        seq = landed.run(synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice), Sampler(GREEDY, synth.config.talker),
                         FRAMES)
        check.tokens_equal(f"{mode}, landed loop on Vulkan: codes = CPU golden", np.stack(seq.codes), golden["codes"])
        runs[mode] = (result, voice)

# %% [markdown]
# The waveform: `synthesize`'s audio, decoded by the codec's GPU form on Vulkan (`codec.gpu_form`: the codebook sums on
# the CPU, everything after them one Vulkan graph; section 7 counts its layers), against chapter 03's wav (PyTorch on
# the CPU) and against the ncnn CPU decode of the same codes. Chapter 06's threshold, 60 dB.

# %%
if gpu:
    cpu_codec = Synthesizer(model_dir, THREADS).codec
    for mode, golden in (("x-vector", xvec_golden), ("ICL", icl_golden)):
        result, voice = runs[mode]
        wav = result.wav
        check.snr(f"{mode}: Vulkan wav vs PyTorch CPU golden", wav, golden["wav"], 60.0)
        cpu_wav = cpu_codec.decode_with_voice(result.codes, voice.codes)
        check.snr(f"{mode}: Vulkan wav vs ncnn CPU wav", wav, cpu_wav, 60.0)
    save_wav(paths.outputs_dir(ckpt) / "09_vulkan.wav", wav)

# %% [markdown]
# ## 5. Check ncnn's conventions on this device
# A port made for one ncnn can meet different conventions on another backend. Two matter here, and ncnn's own tests
# say what the layers are meant to take (Tencent/ncnn, read at commit `3dc2be0` and `0676810`):
#
# | layer | ncnn's test | the convention it tests |
# |---|---|---|
# | `RotaryEmbed` | `tests/test_rotaryembed.cpp` | `cos_cache = RandomMat(embed_dim / 2, seqlen)`: **half width** |
# | `SDPA` | `tests/test_sdpa.cpp` | masks `(dst_seqlen, src_seqlen)` 2-D; `(dst, src, 1)`, `(dst, src, q.c)` 3-D |
#
# Earlier ncnn versions were reported (by the write-up this project started from) to mis-read full-width rope tables
# and 3-D masks on Vulkan while the CPU accepted them. Tiny hand-written graphs test both, on both devices, against a
# numpy reference:

# %%
conventions = lab.convention_rows(["cpu", DEVICE] if gpu else [], THREADS)  # small hand-written graphs
for row in conventions:
    check.at_most(f"{row['test']} on {row['device']} = numpy", "max_abs", row["max_abs"], 1e-5)
pd.DataFrame(conventions).pivot(index="test", columns="device", values="max_abs") if gpu else None

# %% [markdown]
# On ncnn 1.0.20261020 the convention lesson **no longer reproduces**: full-width tables (the layer reads the first
# half of each row) and all three mask ranks give the same answer on the CPU and on this Vulkan device. The runtime
# still feeds half-width tables and 2-D masks: the forms ncnn's tests pin down, so the forms a future version keeps.

# %% [markdown]
# ## 6. Measure fp16 on Vulkan
# Vulkan devices usually offer fp16 storage and arithmetic, and ncnn turns them on by default. First the known
# corruption (FACTS): int32 token ids are stored as fp16 when they pass through a GPU layer such as `Reshape`, so
# the `Embed` after it reads other rows. Fed straight into `Embed` (which runs them as ids), they survive:

# %%
V, E = 300, 4
table = np.random.default_rng(0).standard_normal((V, E)).astype(np.float32)
weights = np.uint32(0).tobytes() + table.tobytes()  # a 4-byte tag 0 (raw fp32), then the table
EMBED = f"Embed emb 1 1 {{}} out 0={E} 1={V} 2=0 3={V * E}\n"
direct = "2 2\nInput ids 0 1 ids\n" + EMBED.format("ids")
reshaped = "3 3\nInput ids 0 1 ids\nReshape r 1 1 ids r0 0=-1\n" + EMBED.format("r0")
ids = np.array([1, 7, 255, 299, 42, 3], np.int32)
if gpu:
    for label, text in (("straight into Embed", direct), ("through Reshape", reshaped)):
        for fp16 in (False, True):
            err = check.max_abs_err(lab.run_graph(lab.small_graph(text, DEVICE, THREADS, weights, fp16), ids=ids),
                                    table[ids])
            name = f"int32 ids {label}, fp16 {'on' if fp16 else 'off'}, on {DEVICE}"
            if fp16 and label == "through Reshape":  # the corruption: ids rounded to fp16 read other rows
                check.at_least(name + ": rows corrupted", "max_abs", err, 1e-3)
            else:
                check.equal(name + ": rows exact", "max_abs", err, 0.0)

# %% [markdown]
# Then the whole loop with fp16 turned on for every graph (the runtime turns it off in `make_net`;
# `lab.patched_ncnn` forces it back on at load time), against the fp32 golden: how many codes agree, and where the
# first one differs.

# %%
if gpu:
    with lab.patched_ncnn(fp16=True):
        synth16 = Synthesizer(model_dir, THREADS, DEVICE)
    prompt = synth16.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, synth16.voice(xvector=xvec_golden["xvector"]))
    codes16 = np.stack(synth16.loop.run(prompt, Sampler(GREEDY, synth16.config.talker), FRAMES).codes)
    n = min(len(codes16), len(xvec_golden["codes"]))
    same = codes16[:n] == xvec_golden["codes"][:n]
    first = int(np.argmin(same.all(1))) if not same.all() else n
    print(f"fp16 on {DEVICE}: {same.mean():.1%} of codes equal; frames equal up to frame {first} of {n}")
    check.at_most("fp16 on Vulkan changes codes: fraction equal to the fp32 golden", "fraction", float(same.mean()),
                  0.99)

# %% [markdown]
# fp16 changes argmax decisions whose margin is below its rounding (2–4% of decisions have margins under 1e-2 with
# these weights, as with real ones), and one changed code changes every frame after it. That is why fp32 is the
# default on Vulkan; fp16 is a speed option to be judged by listening, not by parity.

# %% [markdown]
# ## 7. Where a GPU frame's time goes, and the GPU forms
# The pip binding has no `VkMat`: each `extract` is a blocking submission followed by a download, each CPU Mat given to
# `input` an upload. So the first guess was per-call and per-layer overhead. Measured on the H200 (section 8,
# `qtts_lib.bench.vulkan_probe`), chains of N layers of one type say otherwise: one more `AbsVal`, `Reshape`,
# `Permute` or `Split` costs 0.3–6 µs, one `RMSNorm` ~19 µs, but one 1024×1024 `Gemm` on one row ~108 µs: ncnn's
# Vulkan Gemm reads fp32 weights at ~60 GB/s on one row (a 4.8 TB/s GPU). The same projection as an `InnerProduct`
# on a **1-D** input runs ncnn's GEMV kernel (the K axis in 8 partial sums) at ~350 GB/s. None of ncnn's options
# (CPU threads of the Vulkan net, lightmode, packing, own blob/staging allocators, subgroup ops, tensor storage)
# moved a layer's cost beyond noise; fp16 storage halves a Gemm's time but changes codes (section 6).
#
# So `runtime.rewrites.gpu_layers` rewrites each decoder three ways (text; the weights only regrouped), all of which
# the GPU loop runs (`pipeline.loop.GpuDecoder`, `GemvCodePredictor`, what `Synthesizer` runs on a GPU):
# - **full** (`gpu_decoder`): as few layers as the same arithmetic allows: q/k/v and gate/up fused into one Gemm
#   each, one Reshape + Permute + Slice for the head split (q and k share one RMSNorm and one RotaryEmbed when their
#   norms are the same op), the residual adds folded into the Gemm before them as its C: 852 → 568 layers (talker);
# - **kv**: the same with caches, for the prompt's prefill;
# - **step** (`gemv_step`): one position on 1-D blobs, every projection an InnerProduct (a Gemm's B is an
#   InnerProduct's weight byte for byte), and `one_blob_io`: the caches as one flat blob, row + cos + sin as one
#   input, no mask (one query), output and caches one download: one upload and one download per call.
#
# The talker steps from its cache while the cache is short; past `loop.TALKER_MAX_CACHED` positions every step is
# the full sequence without a cache (the flat cache's trip through host memory grows with it, a full forward hardly
# does). The predictor (at most 17 positions, ~0.7 MB of cache) steps from its cache always: 16 one-position calls
# per frame. The step form:

# %%
print(inspect.getsource(gpu_layers.gemv_step))

# %% [markdown]
# Counted live: every extract of both loops on this device, per generated frame (two runs of different lengths, so
# prefill and prompt drop out of the difference), against what each loop's structure says (`lab.submissions_per_frame`):
# the landed talker extracts its output and every layer's K and V (1 + 2·layers) and reads its codec head, the landed
# predictor makes a prefill and 14 steps and reads 15 heads; the GPU loop makes one talker call, the codec head, and
# 16 predictor calls. The embedding tables are numpy on every device (`pipeline.embeddings`), so no lookup is a call.

# %%
if gpu:
    tc = checkpoint.load_config(ckpt)["talker_config"]
    layers = tc["num_hidden_layers"], tc["code_predictor_config"]["num_hidden_layers"]
    counter = [0]
    with lab.patched_ncnn(counter=counter):  # nets made inside count their extracts
        loops = {"landed": Loop.load(synth.config, synth.embeddings, THREADS, DEVICE, gpu_forms=False),
                 "GPU forms": Loop.load(synth.config, synth.embeddings, THREADS, DEVICE)}
    prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, synth.voice(xvector=xvec_golden["xvector"]))
    expected = {"landed": lab.submissions_per_frame,
                "GPU forms": lambda *n: lab.submissions_per_frame(*n, rewritten=True)}
    for variant, loop in loops.items():
        counts = []
        for frames in (6, 12):
            counter[0] = 0
            loop.run(prompt, Sampler(GREEDY, synth.config.talker), frames)
            counts.append(counter[0])
        per_frame = (counts[1] - counts[0]) // 6
        check.equal(f"{variant} loop: extracts per frame on {ckpt}", "count", per_frame, expected[variant](*layers))
        print(f"{variant}: {per_frame} per frame here, {expected[variant](28, 5)} at full size")

# %% [markdown]
# Every graph the GPU loop runs, on this device: its ncnn layers against the exported graph it replaces (the
# landed predictor's per step: its cached decoder and its heads; the one-blob I/O's own Reshape/Split/Concat
# layers, a few µs each, allowed on top), and the layers that have no Vulkan kernel (each would be a download, a CPU
# op and an upload inside the extract). The check is that there are none. At full size (section 8's file): talker
# full sequence 568 layers (exported 852), prefill 626, step 798 (its kv graph 853); predictor first position 148,
# step 213 (of which one head's chain runs per call); codec head 2. The codec's exported graph has Deconvolution1D,
# ConvolutionDepthWise1D, Embed and MatMul, which have no Vulkan kernel and would run on the CPU inside a Vulkan decode:
# its GPU form (`codec.gpu_form`, what `Synthesizer` decodes with on a GPU) rewrites the first two into layers that
# have one (polyphase stride-1 convolutions, 2-D convolutions with h = 1, chapter 10's rewrites without its CPU-only
# cuts) and runs the codebook sums (a gather and the pre_conv, a few MFLOP a frame) on the CPU before the Vulkan graph.

# %%
if gpu:
    gl = loops["GPU forms"]
    exported = {n: len(parse_param((out_dir / f"{n}.param").read_text()).layers)
                for n in ("talker_decoder", "talker_decoder_kv", "talker_codec_head", "predictor_decoder_kv",
                          "predictor_heads")}
    exported["predictor (cached decoder + heads)"] = exported["predictor_decoder_kv"] + exported["predictor_heads"]
    # what one_blob_io adds at most: per cache blob a flatten out (and for a step a Split, a Slice part and a reshape
    # in), the Concat, and per step output a Split, a flatten and a Concat
    blobs = {"talker": 2 * layers[0], "predictor": 2 * layers[1]}
    io = {"prefill": lambda n: n + 1, "step": lambda n, outs: 3 * n + 2 + 3 * outs}
    graphs = {"talker prefill (kv)": (gl.talker.prefill_net, "talker_decoder_kv", io["prefill"](blobs["talker"])),
              "talker step (GEMV, one blob)": (gl.talker.step_net, "talker_decoder_kv", io["step"](blobs["talker"], 1)),
              "talker full sequence": (gl.talker.full, "talker_decoder", 0),
              "codec head": (gl.head.net, "talker_codec_head", 0),
              "predictor first position": (gl.predictor.first, "predictor (cached decoder + heads)",
                                           io["prefill"](blobs["predictor"])),
              "predictor step (GEMV, one blob)": (gl.predictor.step, "predictor (cached decoder + heads)",
                                                  io["step"](blobs["predictor"], 15)),
              "codec (GPU form, after the codebooks)": (synth.codec.net, "codec_decoder", 0)}
    exported["codec_decoder"] = len(parse_param((out_dir / "codec_decoder.param").read_text()).layers)
    exported_codec = Net(out_dir, "codec_decoder", THREADS, DEVICE).net
    exported_on_cpu = sorted({lyr.type for lyr in exported_codec.layers() if not lyr.support_vulkan})
    print("layer types of the exported codec graph without a Vulkan kernel:", exported_on_cpu)
    layer_rows = []
    for label, (net, was, added) in graphs.items():
        on_cpu = [lyr.name for lyr in net.layers() if not lyr.support_vulkan]
        check.equal(f"GPU loop, {label}: layers without a Vulkan kernel", "count", len(on_cpu), 0)
        check.at_most(f"GPU loop, {label}: ncnn layers (at most {was}'s + {added} of one-blob I/O)", "layers",
                      len(net.layers()), exported[was] + added)
        layer_rows.append({"graph": label, "ncnn layers": len(net.layers()), "exported graph": was,
                           "its layers": exported[was], "no Vulkan kernel": len(on_cpu)})
    check.at_most("GPU loop, talker full sequence: layers vs the exported graph", "ratio",
                  len(gl.talker.full.layers()) / exported["talker_decoder"], 0.72)
    display(pd.DataFrame(layer_rows))

# %% [markdown]
# ## 8. Read what a GPU buys (NVIDIA H200)
# `qtts_lib.bench` ran on an H200 host at full size (`python -m qtts_lib.bench zeros` gives zero-filled weights of the
# real sizes: fp32 kernels take the same time whatever the values). One table, like for like: the same harness
# (`python -m qtts_lib.bench loop`), the same text, voice clip (an x-vector clone on both sides) and 40 greedy frames,
# runs interleaved, each in a fresh process: ncnn on Vulkan (the GPU forms), PyTorch on the same GPU (qwen-tts's own
# generate, CUDA, fp32, on a random checkpoint of the real architecture), and both on that host's 16 CPU cores, all in
# one call. Milliseconds per frame; a frame is 80 ms of audio.

# %%
loop_file = paths.ROOT / "data" / "bench" / "h200-vulkan-loop.json"
forms_file = paths.ROOT / "data" / "bench" / "gpu" / "h200-vulkan-forms.json"
if gpu and loop_file.is_file():
    doc = json.loads(loop_file.read_text())
    table = pd.DataFrame([{"runtime": r["runtime"], "device": r["device"], "threads": r["threads"],
                           **r["ms_per_frame"], "loop": r["ms_per_frame"]["talker"] + r["ms_per_frame"]["predictor"],
                           "rtf": r["rtf"]} for r in doc["rows"]])
    print(json.dumps(doc["machine"]))
    display(table.round(1))
    ax = table.assign(label=table.runtime + " " + table.device).set_index("label")[
        ["talker", "predictor", "codec"]].plot.barh(stacked=True, figsize=(9, 2.8),
                                                    title="full size on the H200 host: ms per frame")
    ax.axvline(80, color="crimson", ls="--", lw=1)
    ax.set_xlabel("ms per frame (80 = real time)")
    row = {(r["runtime"], r["device"]): r["ms_per_frame"] for r in doc["rows"]}
    ours, cuda = row["ncnn", "vulkan"], row["pytorch", "cuda"]
    loop_ms = lambda m: m["talker"] + m["predictor"]  # noqa: E731
    check.at_most("H200: ncnn Vulkan vs PyTorch CUDA, generation loop (talker + predictor)", "time ratio",
                  loop_ms(ours) / loop_ms(cuda), 1.0)
    check.at_most("H200: ncnn Vulkan vs PyTorch CUDA, the whole frame (prompt, loop, codec)", "time ratio",
                  ours["total"] / cuda["total"], 1.0)
    check.at_most("H200: the codec's GPU form on Vulkan vs PyTorch's codec on CUDA", "time ratio",
                  ours["codec"] / cuda["codec"], 1.0)
    check.at_least("H200: ncnn Vulkan vs the host's 16 CPU cores (ncnn)", "speed-up",
                   row["ncnn", "cpu"]["total"] / ours["total"], 2.0)
    old = json.loads((paths.ROOT / "data" / "bench" / "h200-vulkan.json").read_text())
    before = next(r for r in old["rows"] if r["device"] == "vulkan" and r["variant"] == "rewritten")["ms_per_frame"]
    check.at_least("H200: the GPU forms vs the packed/fused forms before them (h200-vulkan.json)", "loop speed-up",
                   loop_ms(before) / loop_ms(ours), 1.5)
elif gpu:
    print(f"{loop_file} is not there: no H200 measurement committed yet (python -m qtts_lib.bench loop there)")

# %% [markdown]
# Where the time goes (`python -m qtts_lib.bench.vulkan_probe`, `data/bench/gpu/h200-vulkan-forms.json`, ms per extract,
# medians): the cost of one more layer of each type, one projection in each of ncnn's forms, and the talker's two ways
# of stepping at each length.

# %%
if gpu and forms_file.is_file():
    forms = json.loads(forms_file.read_text())
    ch = forms["layer_chains"]["chains"]
    per_layer = {kind: round(1e3 * (ch[f"{kind} x{n}"]["wall"] - ch[f"{kind} x1"]["wall"]) / (n - 1) / k, 1)
                 for kind, n, k in (("AbsVal", 400, 1), ("Split", 400, 1), ("BinaryOp", 200, 1), ("RMSNorm", 200, 1),
                                    ("ReshapePermute", 100, 4), ("Gemm64", 200, 1), ("Gemm1024", 100, 1))}
    display(pd.Series(per_layer, name="µs per extra layer (ReshapePermute: per layer of 4)"))
    pf = forms["projection_forms"]
    display(pd.DataFrame({k: v for k, v in pf.items() if "wall" in v}).T[["wall", "fp32 weight GB/s"]])
    ms = forms["gpu_forms"]["ms_per_call"]
    steps = pd.DataFrame([{"cached GEMV step": ms[f"talker GEMV step at past {p}, caches in and out"]["wall"],
                           "full sequence": ms[f"talker full sequence, {p + 1} rows"]["wall"],
                           "flat cache MB": ms[f"flat cache MB at past {p}"]} for p in (16, 32, 64, 128, 256, 512)],
                         index=pd.Index([16, 32, 64, 128, 256, 512], name="past"))
    display(steps)
    gemv = (pf["innerproduct, input (1024,)"]["fp32 weight GB/s"]
            / pf["gemm B transB=1, input (1, 1024)"]["fp32 weight GB/s"])
    check.at_least("H200: a projection on one row, InnerProduct on 1-D vs Gemm", "weight-read speed-up", gemv, 4.0)
    check.at_least("H200: one more Gemm 1024x1024 vs one more AbsVal (the cost is the Gemm, not the layer)",
                   "time ratio", per_layer["Gemm1024"] / per_layer["AbsVal"], 10.0)
    check.at_least("H200: talker at 128 cached positions, cached step vs full sequence", "time ratio",
                   steps.loc[128, "cached GEMV step"] / steps.loc[128, "full sequence"], 1.0)

# %% [markdown]
# What the numbers say:
# - On the same GPU, the same prompt, through the same harness, ncnn on Vulkan takes less than PyTorch CUDA for the
#   whole frame: 112.3 against 134.6 ms per frame (talker 32.0 vs 37.6, code predictor 79.0 vs 92.5, codec 1.2 vs
#   4.6), and 98.6 against 116.0 in a call minutes earlier on the same machine when it was quieter (the file's
#   `earlier_call`). Before this chapter's GPU forms the loop took 181 (200 with the codec). The codec's GPU form
#   (section 7) costs 1.2 ms per frame where the exported graph with its CPU-fallback layers cost 16.6. On the host's 16
#   CPU cores ncnn takes 295 and PyTorch 217: on a 16-core Xeon PyTorch's CPU kernels win, where on the 2-core EPYC VM
#   ncnn is 2.8× faster (chapter 10).
# - The cost on a GPU through the binding is the weights read at ncnn's Vulkan Gemm's one-row speed, not the number
#   of layers: a GEMV on a 1-D blob reads them ~6× faster, so every one-position call is an InnerProduct graph.
#   Layer count still matters a little (an extract's host-side recording is a few µs per layer): the full form has a
#   third fewer layers than the exported graph.
# - What is left is per-call host work: a predictor call costs 3.3–4.3 ms of which ~2–3 ms is the calling thread's
#   CPU (extractor, upload, recording ~150 layers, download), 16 calls a frame; and the talker's cache crosses the bus
#   every step (7 MB at 32 positions, ~2 GB/s through the binding's staging), which is why it steps from its cache
#   only up to 64 positions (`loop.TALKER_MAX_CACHED`) and runs the full sequence after (29–33 ms up to 129 rows, 39
#   at 257, 61 at 513).
# - What only C++ would buy, measured next.

# %% [markdown]
# ### What only C++ would buy
# The pip binding has no `VkMat`: every call's caches go up and come back through host memory, and every call is its
# own submission. ncnn's C++ API has both (`Extractor::input(name, VkMat)`, `extract(name, VkMat&, VkCompute&)`).
# `python -m qtts_lib.bench.cpp_probe` builds a small probe (`qtts_lib/bench/cpp/vulkan_probe.cpp`) against ncnn's
# source beside the wheel (43 s on the H200 host's 16 cores) and times the GPU loop's one-position graphs, with their
# caches as separate blobs, at several cache lengths: through the binding (as they are, and as the runtime runs them,
# `one_blob_io`), and in C++ with host Mats, with the caches kept on the GPU from call to call (`resident`), and with
# four calls recorded into one command (`chained`). ms per call, medians of 20
# (`data/bench/gpu/h200-cpp-probe.json`; the probe ran right after its build, the host's load average 6.9).

# %%
cpp_file = paths.ROOT / "data" / "bench" / "gpu" / "h200-cpp-probe.json"
if gpu and cpp_file.is_file():
    cpp = pd.DataFrame(json.loads(cpp_file.read_text())["rows"]).set_index(["graph", "past"])
    display(cpp[["binding_ms", "binding_one_blob_ms", "host_ms", "resident_ms", "chained_ms_per_call",
                 "submit_floor_ms", "layers"]])
    talker, pred = cpp.loc["talker step"], cpp.loc["predictor step"]
    check.at_least("H200, C++: talker step at 128 positions, the runtime's one-blob call vs caches resident on the GPU",
                   "time ratio", talker.loc[128, "binding_one_blob_ms"] / talker.loc[128, "resident_ms"], 2.0)
    check.at_least("H200, C++: predictor step, the runtime's one-blob call vs caches resident on the GPU",
                   "time ratio", (pred["binding_one_blob_ms"] / pred["resident_ms"]).median(), 1.1)
    frame_now = talker.loc[64, "binding_one_blob_ms"] + 16 * pred["binding_one_blob_ms"].median()
    frame_cpp = talker.loc[64, "resident_ms"] + 16 * pred["chained_ms_per_call"].median()
    print(f"a frame's loop at 64 positions, from these calls: {frame_now:.0f} ms through the binding, "
          f"{frame_cpp:.0f} ms in C++ (caches resident, calls chained)")

# %% [markdown]
# What the probe says:
# - The cache trip is the talker's cost: with its caches resident the talker's step costs 13-15 ms at 64 and 128
#   positions, where the runtime's one-blob call costs 35-48 (and 26 at 16 positions, where the first resident calls
#   still paid for allocations). Past 64 positions the runtime runs the full sequence instead (29-33 ms); C++ would
#   step from the cache at any length.
# - The predictor gains less: 2.5-2.9 ms per call resident, 2.2-2.6 chained, against 3.2-3.4 through the binding.
#   Its floor is the host-side recording of ~140 layers per call (about 12 µs each) plus the submit (0.35 ms).
# - Together (the cell above): about 40% off a frame's loop. Using it means a C++ extension beside the wheel (ncnn and
#   glslang built from source, as the probe is), or a binding that exposes `VkMat` and `VkCompute`. The probe's ncnn
#   is the source of July 2026 with upstream glslang, not the wheel's build, so its numbers are an estimate of what the
#   runtime would get, not a measurement of it.

# %% [markdown]
# ## Summary
# - Every graph, the cached decoders and the whole generation loop give the CPU's answers on Vulkan in fp32: every
#   code of the x-vector and ICL goldens, waveforms far above 60 dB.
# - On ncnn 1.0.20261020 full-width rope tables and 3-D masks work on CPU and Vulkan alike; ncnn's tests define
#   half-width tables and 2-D / 3-D masks, and the runtime keeps to the half-width, 2-D forms.
# - fp16 on Vulkan corrupts int32 ids that pass through a GPU layer and changes codes: fp32 stays the default.
# - The GPU loop (`runtime.rewrites.gpu_layers`, what `Synthesizer` runs on a GPU) runs fewer layers (the talker's
#   full sequence 568 instead of 852), one-position steps as GEMVs on 1-D blobs, one upload and one download per
#   call (18 extracts per frame, as before, where the landed loop makes 238), and no layer without a Vulkan kernel.
# - The codec's GPU form: the codebook sums on the CPU, everything after them one Vulkan graph with every layer on the
#   GPU (the exported graph runs Deconvolution1D, ConvolutionDepthWise1D, Embed and MatMul on the CPU mid-graph).
# - On the H200, same harness, text, voice clip and frame count: the whole frame 112.3 ms on ncnn Vulkan against 134.6
#   on PyTorch CUDA (98.6 vs 116.0 in an earlier call; 200 before the GPU forms), the codec 1.2 vs 4.6. The cost was
#   ncnn's Vulkan Gemm on one row (~60 GB/s of weights), not per-layer overhead; what is left
#   is per-call host work and the talker's cache through host memory: C++ (`VkMat` caches, one command for several
#   calls) would take about 40% off the loop's time (the probe of section 8).
#
# **Artifacts left:** `data/outputs/<ckpt>/09_vulkan.wav`, the chapter report.
#
# **If your numbers differ**
# - *One "skipped" row* → ncnn saw no Vulkan device: install `mesa-vulkan-drivers libvulkan1` (lavapipe) or a GPU
#   driver; `python -c "import ncnn; print(ncnn.get_gpu_count())"` must print at least 1.
# - *`VulkanRequired` in section 1* → the same, where `QTTS_REQUIRE_VULKAN` is set (as `.ci/run` sets it): there a
#   missing device is a broken set-up, not a skip.
# - *`dlopen failed libvulkan.so.1`* → the loader is missing (`libvulkan1`); instance creation fails (-9) → no ICD,
#   or on a container GPU host set `VK_DRIVER_FILES` to the driver's ICD json.
# - *Codes differ from the golden on Vulkan* → fp16 came back on (see 6): `net.opt.use_fp16_*` before `load_param`;
#   or a parity run without `Sampling(greedy=True)` (the runtime samples by default).
# - *Garbage tokens or embeddings only on the GPU, in a graph of your own* → int32 ids through a GPU layer with fp16
#   on (see 6). The runtime's codec tables are read into numpy and its text embedding graph feeds the ids straight
#   into `Embed`, so its own lookups do not meet this.

# %%
check.table()
