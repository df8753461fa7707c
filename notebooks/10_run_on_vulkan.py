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
# # 10 · Run the port on Vulkan
# > Same graphs, same tokens, another device: prove it before trusting it.
#
# **Vulkan** is the cross-vendor GPU API ncnn uses as its GPU backend: the same graphs run on an NVIDIA, AMD or Intel
# GPU, or on Mesa's **lavapipe** (a Vulkan driver that runs on the CPU: how CI runs this chapter). Every layer has a
# second kernel there (a compute shader), so a port checked on the CPU is not yet one on a GPU. `ex.input` **uploads**
# an array to GPU memory; `ex.extract` runs the graph there and **downloads** the blob; the CPU waits for each.
#
# **You will:** find a Vulkan device; run every exported graph on it at two lengths against the CPU; step the KV
# caches on it; generate on it token for token against chapter 03's goldens (x-vector and ICL); test two of ncnn's
# layer conventions (the input shapes a layer accepts) live; and measure what fp16 does instead of assuming it.
#
# **You will learn:** how to trust a port on a new device (per graph, cached step, code, waveform); which forms of
# ncnn's rope and attention layers its tests pin down; why the runtime turns off ncnn's fp16 (16-bit float) paths.
#
# **You need:** a Vulkan device ncnn can see (a GPU, or lavapipe on any CPU: `apt-get install mesa-vulkan-drivers
# libvulkan1`; without one the live sections record a skip, and fail where `QTTS_REQUIRE_VULKAN` is set); chapter
# 03's goldens; the graphs of chapters 04–05 (exported here if missing). `QTTS_DEVICE=vulkan:N` picks a device.
# **Leaves behind:** `data/outputs/<ckpt>/10_vulkan.wav`, `data/reports/<ckpt>/10_run_on_vulkan.json`.

# %%
import numpy as np
import pandas as pd

from qtts_lib import check, checkpoint, paths, settings

ckpt = settings.checkpoint()  # QTTS_CHECKPOINT, default tiny-base
THREADS = settings.threads()
DEVICE = settings.device() if settings.device().startswith("vulkan") else "vulkan"
report = check.begin("10_run_on_vulkan", ckpt)
model_dir, out_dir = checkpoint.ensure(ckpt), paths.ncnn_dir(ckpt)

# %% [markdown]
# ## 1. Find a Vulkan device
# The pip `ncnn` wheel has Vulkan compiled in; whether it finds a device depends on the Vulkan loader (`libvulkan`)
# and a driver (an **ICD**, installable client driver: a JSON file in `/usr/share/vulkan/icd.d/` naming a driver
# library). `lab.vulkan_or_skip` asks ncnn once (and turns what its loader writes to stderr into a reason); no device
# means a recorded skip, or `VulkanRequired` where `QTTS_REQUIRE_VULKAN` is set (as CI does, with lavapipe).

# %%
import ncnn

from qtts_lib.lab import vulkan as lab
from qtts_lib.runtime.binding.net import gpu_names

gpu, why = lab.vulkan_or_skip()
if gpu:
    print(f"ncnn {ncnn.__version__} sees: {why}")
    check.equal(f"{DEVICE} is a device ncnn sees", "devices", bool(gpu_names()), True)
else:
    check.current().record("chapter 10 on Vulkan", "skipped", why,
                           "needs a Vulkan device", True, "--")

# %% [markdown]
# ## 2. Run every graph on Vulkan at two lengths
# Chapter 04's seeded inputs (both lengths of each module) go through the CPU graph and the Vulkan graph (`Net`: the
# runtime's loaded graph, called with numpy arrays); each pair is compared with the metric and tolerance of that
# module's spec (`spec.check`, as in 02 and 04). fp16 is off on both (`runtime.binding.net.make_net`; section 6 says
# why), so the differences are summation order only. The plot: each module's relative L2 error at its two lengths
# (an exact match drawn at 1e-10, the axis' floor), the dashed line at 1e-5 for scale.

# %%
import matplotlib.pyplot as plt
import torch

from qtts_lib import export, modules, reference
from qtts_lib.runtime.binding.net import Net

results = []
if gpu:
    torch.set_num_threads(THREADS)
    tts = reference.load(model_dir, threads=THREADS)
    export.ensure(tts, ckpt)
    for name in modules.MODULES:
        spec = modules.get(name)
        cpu, gpu_net = Net(out_dir, name, THREADS), Net(out_dir, name, THREADS, DEVICE)
        for n, length in enumerate(spec.lengths, 1):
            feed = spec.inputs(tts, length, seed=1000 + length)  # chapter 04's inputs
            arrays = [t.numpy() for t in feed.values()]
            ref = np.concatenate([o.ravel() for o in cpu(*arrays)])
            ours = np.concatenate([o.ravel() for o in gpu_net(*arrays)])
            spec.check(f"{name} @ {length}: Vulkan vs CPU", ours, ref)
            results.append({"module": name, "length": f"length {n}",
                            "rel": check.rel_err(ours, ref)})
    rel = pd.DataFrame(results).pivot(index="module", columns="length", values="rel")
    ax = rel.clip(lower=1e-10).plot.bar(figsize=(9, 3), logy=True, rot=30,
                                        title=f"{DEVICE} vs CPU, fp32 ({ckpt}): rel L2")
    ax.axhline(1e-5, color="crimson", ls="--", lw=1)

# %% [markdown]
# ## 3. Step the KV caches on Vulkan
# Prefill 9 positions, then 16 cached steps, for both decoders, against the CPU decoder (`precision.decoder`), at
# chapter 05's threshold. Each download is a wait, and the GPU decoders differ in how many a step makes: the
# **exported** graphs of chapter 05 output every layer's K and V apart (2·layers + 1 downloads); the **packed** one
# its caches as one blob (two); and, for the talker, the **GPU forms** (`pipeline.loop.gpu_talker`, built in appendix
# C) are graphs rewritten for the GPU, with fewer layers and one upload and one download a call, which step from the
# cache up to 16 positions and past that rerun the whole sequence (cheaper than moving a long cache through the host).
#
# The packed form rewrites the `_kv` graph's text (`rewrites.gpu.packed_cache_params`): a `Concat` at the end gathers
# every K and V into `cache_all_out`; in the step graph a `Slice` splits `cache_all_in` back into per-layer caches.
# Same `.bin`; the same `KvCacheNet` drives it, told its cache is one blob. The cell prints the step graph's new lines:

# %%
from qtts_lib.runtime.binding.cached import KvCacheNet
from qtts_lib.runtime.binding.net import net_from_text
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.rewrites.gpu import packed_cache_params


def packed_decoder(name: str, c: dict) -> KvCacheNet:
    """Decoder `name` on DEVICE with its caches as one blob in and one blob out."""
    prefill, step = packed_cache_params((out_dir / f"{name}_kv.param").read_text())
    bin_ = out_dir / f"{name}.bin"
    nets = [net_from_text(t, bin_, THREADS, DEVICE) for t in (prefill, step)]
    return KvCacheNet(nets[0], precision.cached_layers(out_dir, name), c["head_dim"],
                      c["rope_theta"], step=nets[1], packed=True, name=name)


_, step_text = packed_cache_params((out_dir / "talker_decoder_kv.param").read_text())
print(*[line[:84] for line in step_text.splitlines() if "cache_all" in line], sep="\n")

# %% [markdown]
# Each decoder gets the same random rows `x` `(1, 25, hidden)` standing in for embeddings; `prefill` returns the
# hidden states and the cache, `forward` steps one row and grows the cache in place. Each call is compared with the
# CPU's same call:

# %%
from qtts_lib.runtime.pipeline.loop import gpu_talker

STEPS = 16


def prefill_and_step(net, x: np.ndarray) -> list[np.ndarray]:
    hidden, cache = net.prefill(x[:, :9])  # (1, 9, hidden), the cache of 9 positions
    return [hidden] + [net.forward(x[:, t : t + 1], cache) for t in range(9, 9 + STEPS)]


step_errors = {}
if gpu:
    cfg = checkpoint.load_config(ckpt)["talker_config"]
    pred_cfg = cfg["code_predictor_config"]
    for name, c in (("talker_decoder", cfg), ("predictor_decoder", pred_cfg)):
        x = np.random.default_rng(8).standard_normal((1, 9 + STEPS, c["hidden_size"]))
        x = x.astype(np.float32)
        args = out_dir, name, c["head_dim"], c["rope_theta"], THREADS
        nets = {"cpu": precision.decoder(*args),
                "exported": precision.decoder(*args, DEVICE),
                "packed": packed_decoder(name, c)}
        if name == "talker_decoder":
            nets["GPU forms"] = gpu_talker(out_dir, c, THREADS, DEVICE, max_cached=16)
        outs = {k: prefill_and_step(n, x) for k, n in nets.items()}
        for kind in [k for k in nets if k != "cpu"]:
            errs = [check.rel_err(o, r) for o, r in zip(outs[kind], outs["cpu"])]
            step_errors[f"{name} ({kind})"] = errs
            check.at_most(f"{name}: Vulkan {kind} caches, prefill + {STEPS} steps",
                          "worst rel", max(errs), 1e-5)

# %% [markdown]
# Every call of every decoder, against the CPU's (the red line is chapter 05's threshold):

# %%
if gpu:
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for label, errs in step_errors.items():
        ax.semilogy(np.maximum(errs, 1e-10), marker="o", ms=3, label=label)
    ax.axhline(1e-5, color="crimson", ls="--", lw=1)
    ax.set(xlabel="call (0 = prefill)", ylabel="rel vs CPU", title="cached decoding")
    ax.legend(fontsize=8)

# %% [markdown]
# ## 4. Generate on Vulkan, token for token
# `Synthesizer(model_dir, device=...)`, the product's pipeline, runs the GPU forms on a GPU; `Loop.load(...,
# gpu_forms=False)` runs the exported graphs. Both must give every code of chapter 03's CPU goldens (PyTorch, greedy,
# fp32): x-vector (the voice as one speaker vector) and ICL (the clip's codes and transcript in the prompt, encoded
# by Mimi and the speaker encoder on Vulkan too). `FRAMES` is `max_new_tokens` − 1 (the last token has no frame: 07).

# %%
from qtts_lib import artifacts, inputs
from qtts_lib.runtime import Sampling, Synthesizer
from qtts_lib.runtime.audio.wav import load_wav
from qtts_lib.runtime.pipeline.loop import Loop
from qtts_lib.runtime.pipeline.sampling import Sampler

GREEDY, FRAMES = Sampling(greedy=True), inputs.GOLDEN_MAX_NEW_TOKENS - 1
TEXT, LANG = inputs.TARGET_TEXT, inputs.LANGUAGE
if gpu:
    golden = {m: artifacts.load_npz(paths.golden_dir(ckpt) / f"{f}_greedy.npz", ckpt)[0]
              for m, f in (("x-vector", "xvec"), ("ICL", "icl"))}
    clip = load_wav(paths.voice_wav())
    clip_text = (paths.INPUTS / "voice.txt").read_text()
    synth = Synthesizer(model_dir, THREADS, DEVICE)
    exported_loop = Loop.load(synth.config, synth.embeddings, THREADS, DEVICE,
                              gpu_forms=False)
    voices = {"x-vector": synth.voice(xvector=golden["x-vector"]["xvector"]),
              "ICL": synth.voice(wav=clip, text=clip_text.strip())}
    runs = {}
    for mode, voice in voices.items():
        want = golden[mode]["codes"]
        runs[mode] = synth.synthesize(TEXT, LANG, voice, GREEDY, max_frames=FRAMES)
        check.tokens_equal(f"{mode}, rewritten loop on Vulkan: codes = CPU golden",
                           runs[mode].codes, want)
        seq = exported_loop.run(synth.prompt(TEXT, LANG, voice),
                                Sampler(GREEDY, synth.config.talker), FRAMES)
        name = f"{mode}, exported graphs' loop on Vulkan: codes = CPU golden"
        check.tokens_equal(name, np.stack(seq.codes), want)

# %% [markdown]
# The waveform, decoded by the codec's GPU form (`codec.gpu_form`: RVQ's codebook sums on the CPU, the rest one
# Vulkan graph), against chapter 03's wav (PyTorch, CPU) and the ncnn CPU decode of the same codes (for ICL with the
# clip's codes leading as context, as in 08), at chapter 07's threshold (signal-to-noise ratio in dB).

# %%
from qtts_lib.runtime.audio.wav import save_wav

if gpu:
    cpu_codec = Synthesizer(model_dir, THREADS).codec
    for mode, result in runs.items():
        check.snr(f"{mode}: Vulkan wav vs PyTorch CPU golden", result.wav,
                  golden[mode]["wav"], 60.0)
        cpu_wav = cpu_codec.decode_with_voice(result.codes, voices[mode].codes)
        check.snr(f"{mode}: Vulkan wav vs ncnn CPU wav", result.wav, cpu_wav, 60.0)
    save_wav(paths.outputs_dir(ckpt) / "10_vulkan.wav", result.wav)

# %% [markdown]
# ## 5. Check ncnn's conventions on this device
# A layer's convention is the shapes and layouts of the inputs it accepts; another backend's kernel can accept
# other ones. Two matter here; ncnn's tests (`tests/` in its source) say what the layers take:
# - `RotaryEmbed` applies rope (each pair of a head's channels rotated by an angle that grows with the position)
#   from cos and sin tables; `tests/test_rotaryembed.cpp` makes them `RandomMat(embed_dim / 2, seqlen)`: **half
#   width**, one column per pair.
# - `SDPA` is scaled dot-product attention, `softmax(q·kᵀ/√d + mask)·v`; `tests/test_sdpa.cpp` feeds masks
#   `(dst_seqlen, src_seqlen)` (2-D) and `(dst, src, 1)` or `(dst, src, q.c)` (3-D, one per head).
#
# Each gets a graph of its own, written as `.param` text: a count line (layers, blobs), then one line per layer
# (type, name, input and output counts, blobs, `key=value` parameters: `0=0` rotates halves rather than adjacent
# pairs, `5=1` says SDPA has a mask input). `lab.small_graph` loads such text (prefixing ncnn's magic number line)
# on a device, fp16 on or off; `lab.run_graph` feeds named arrays and returns the blob `out`. First rope, with the
# half-width tables the test uses and with full-width ones (each row repeated), against numpy:

# %%
ROPE = ("4 4\nInput x 0 1 x\nInput cos 0 1 cos\nInput sin 0 1 sin\n"
        "RotaryEmbed rope 3 1 x cos sin out 0=0\n")
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 5, 8)).astype(np.float32)  # (heads, seq, head_dim): c, h, w
pos, freq = np.arange(5.0)[:, None], 10000 ** (np.arange(0, 8, 2) / 8)
cos, sin = np.cos(pos / freq).astype(np.float32), np.sin(pos / freq).astype(np.float32)
rope_ref = np.concatenate([x[..., :4] * cos - x[..., 4:] * sin,
                           x[..., 4:] * cos + x[..., :4] * sin], -1)  # rotate halves
conventions = []
for dev in ["cpu", DEVICE] if gpu else []:
    for width, c, s in (("half", cos, sin), ("full", np.tile(cos, 2), np.tile(sin, 2))):
        y = lab.run_graph(lab.small_graph(ROPE, dev, THREADS), x=x, cos=c, sin=s)
        conventions.append({"test": f"rope, {width}-width tables", "device": dev,
                            "max_abs": float(np.abs(y - rope_ref).max())})

# %% [markdown]
# Then attention with grouped-query heads (GQA: 4 query heads share 2 key/value heads, as the decoders do) and the
# three mask shapes, against numpy; every row of both tests is then checked:

# %%
SDPA = ("5 5\nInput q 0 1 q\nInput k 0 1 k\nInput v 0 1 v\nInput m 0 1 m\n"
        "SDPA sdpa 4 1 q k v m out 5=1\n")
shapes = (4, 3, 8), (2, 6, 8), (2, 6, 8)  # q: 4 heads, 3 rows; k, v: 2 heads, 6 rows
q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)


def sdpa_ref(mask: np.ndarray) -> np.ndarray:
    s = q @ np.repeat(k, 2, 0).transpose(0, 2, 1) / np.sqrt(8) + mask  # (4, 3, 6)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ np.repeat(v, 2, 0)


masks = {"2-D (L, S)": (3, 6), "3-D (1, L, S)": (1, 3, 6),
         "3-D (heads, L, S)": (4, 3, 6)}
masks = {label: rng.standard_normal(shape) for label, shape in masks.items()}
for dev in ["cpu", DEVICE] if gpu else []:
    for label, m in masks.items():
        y = lab.run_graph(lab.small_graph(SDPA, dev, THREADS), q=q, k=k, v=v,
                          m=m.astype(np.float32))
        conventions.append({"test": f"SDPA mask {label}", "device": dev,
                            "max_abs": float(np.abs(y - sdpa_ref(m)).max())})
for row in conventions:
    check.at_most(f"{row['test']} on {row['device']} = numpy", "max_abs",
                  row["max_abs"], 1e-5)
frame = pd.DataFrame(conventions)
frame.pivot(index="test", columns="device", values="max_abs") if gpu else None

# %% [markdown]
# On this ncnn version full-width tables (the layer reads each row's first half) and all three masks give the same
# answer on both devices; the runtime still feeds the forms the tests pin down, which a future version will keep.
#
# ## 6. Measure fp16 on Vulkan
# Vulkan devices usually offer **fp16 storage** (blobs and weights kept in GPU memory as 16-bit floats, rounded)
# and **fp16 arithmetic** (shaders computing in 16 bits), and ncnn turns both on by default. First the corruption:
# an ncnn Mat has no dtype, so int32 ids passing through a GPU layer such as `Reshape` are stored as if floats, in
# fp16, and the `Embed` after it reads other rows; fed straight into `Embed` (`0=` width, `1=` vocab), they survive:

# %%
V, E = 300, 4
table = np.random.default_rng(0).standard_normal((V, E)).astype(np.float32)
weights = np.uint32(0).tobytes() + table.tobytes()  # a tag 0 (raw fp32), then the table
EMBED = f"Embed emb 1 1 {{}} out 0={E} 1={V} 2=0 3={V * E}\n"
graphs = {"straight into Embed": "2 2\nInput ids 0 1 ids\n" + EMBED.format("ids"),
          "through Reshape": "3 3\nInput ids 0 1 ids\nReshape r 1 1 ids r0 0=-1\n"
                             + EMBED.format("r0")}
ids = np.array([1, 7, 255, 299, 42, 3], np.int32)
for label, text in graphs.items() if gpu else ():
    for fp16 in (False, True):
        net = lab.small_graph(text, DEVICE, THREADS, weights, fp16)
        err = check.max_abs_err(lab.run_graph(net, ids=ids), table[ids])
        name = f"int32 ids {label}, fp16 {'on' if fp16 else 'off'}, on {DEVICE}"
        if fp16 and label == "through Reshape":  # ids rounded to fp16 read other rows
            check.at_least(name + ": rows corrupted", "max_abs", err, 1e-3)
        else:
            check.equal(name + ": rows exact", "max_abs", err, 0.0)

# %% [markdown]
# Then the whole loop with fp16 on for every graph. The runtime sets ncnn's options in one place,
# `runtime.binding.net.net_from_text`, just before `load_param_mem` reads the graph (ncnn fixes a net's storage
# types when it loads): fp16 off. To measure fp16 without a second code path, the cell below swaps `ncnn.Net` for a
# subclass that turns the three fp16 options (storage, arithmetic, and `packed`: fp16 in ncnn's packed layouts of
# 4 or 8 values) back on at that moment, for the nets made inside the `with`:

# %%
import contextlib


@contextlib.contextmanager
def fp16_forced():
    """Every ncnn.Net made inside loads its graph with every fp16 option on."""
    real = ncnn.Net

    class Fp16Net(real):
        def load_param_mem(self, text):
            o = self.opt
            o.use_fp16_packed = o.use_fp16_storage = o.use_fp16_arithmetic = True
            return super().load_param_mem(text)

    ncnn.Net = Fp16Net
    try:
        yield
    finally:
        ncnn.Net = real

# %% [markdown]
# The fp16 loop against the fp32 golden: how many codes agree, and where the first one differs. The check asserts
# the harm (at most 0.99 of codes equal): if fp16 stopped changing codes, the reason to keep it off would be stale.

# %%
if gpu:
    with fp16_forced():
        synth16 = Synthesizer(model_dir, THREADS, DEVICE)
    voice16 = synth16.voice(xvector=golden["x-vector"]["xvector"])
    prompt = synth16.prompt(TEXT, LANG, voice16)
    seq = synth16.loop.run(prompt, Sampler(GREEDY, synth16.config.talker), FRAMES)
    codes16, codes32 = np.stack(seq.codes), golden["x-vector"]["codes"]
    n = min(len(codes16), len(codes32))
    same = codes16[:n] == codes32[:n]
    first = int(np.argmin(same.all(1))) if not same.all() else n
    print(f"fp16 on {DEVICE}: {same.mean():.1%} of codes equal; "
          f"frames equal up to frame {first} of {n}")
    check.at_most("fp16 on Vulkan changes codes: fraction equal to the fp32 golden",
                  "fraction", float(same.mean()), 0.99)

# %% [markdown]
# fp16 flips argmax decisions whose margin is below its rounding (chapter 03's margin histogram shows how many are
# that close), and one changed code changes every frame after it: fp32 is the default; fp16 is a speed option.
#
# ## Summary
# - Every graph, the cached decoders (exported, packed, GPU forms) and the whole loop give the CPU's answers on
#   Vulkan in fp32: every code of the x-vector and ICL goldens, waveforms above chapter 07's threshold.
# - ncnn's tests pin half-width rope tables and 2-D / 3-D masks; the runtime keeps to the half-width, 2-D forms.
# - fp16 on Vulkan corrupts int32 ids that pass through a GPU layer and changes codes: fp32 stays the default.
# - What a GPU buys (where a frame's time goes, the GPU forms, ncnn on Vulkan against PyTorch on CUDA): appendix C.
#
# **Artifacts left:** `data/outputs/<ckpt>/10_vulkan.wav`, the chapter report.
#
# **If your numbers differ**
# - *A "skipped" row, or `VulkanRequired`* → ncnn saw no Vulkan device (section 1 prints why): install lavapipe.
# - *"the Vulkan loader found no driver"* → no ICD; on a container GPU host set `VK_DRIVER_FILES` to its json.
# - *Codes differ from the golden on Vulkan* → fp16 came back on (set `net.opt.use_fp16_*` before `load_param`); or
#   a parity run without `Sampling(greedy=True)` (the runtime samples by default).
# - *Garbage embeddings only on the GPU, in a graph of your own* → int32 ids through a GPU layer with fp16 on (6).

# %%
check.table()
