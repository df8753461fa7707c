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
# > Same graphs, same tokens, another device: prove it, then find out what a GPU buys.
#
# **You will:** run every exported graph and the KV-cache steps on a Vulkan device against the CPU, generate on
# Vulkan token for token against chapter 03's goldens (x-vector and ICL), test two of ncnn's layer conventions live,
# measure fp16 instead of assuming it, count the GPU calls a frame makes, and read where a GPU frame's time goes on
# one reference GPU (an NVIDIA H200, committed in `data/bench/`).
#
# **You will learn:** why fp16 is off by default; what a GPU step through the Python binding costs (ncnn's Vulkan
# `Gemm` on one row, then per-call host work) and the GPU forms that cut both; what only ncnn's C++ API would add.
#
# **You need:** a Vulkan device ncnn can see (a GPU, or Mesa's lavapipe on any CPU: `apt-get install
# mesa-vulkan-drivers libvulkan1`; without one the live sections record a skip, and fail where `QTTS_REQUIRE_VULKAN`
# is set); chapter 03's goldens; the graphs of chapters 04–05 (exported here if missing). `QTTS_DEVICE=vulkan:N`
# picks a device. **Leaves behind:** `data/outputs/<ckpt>/10_vulkan.wav`, `data/reports/<ckpt>/10_run_on_vulkan.json`.

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
from qtts_lib.runtime.binding.net import Net, gpu_names
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.pipeline.loop import Loop, gpu_talker
from qtts_lib.runtime.pipeline.sampling import Sampler
from qtts_lib.runtime.rewrites import gpu_layers

ckpt = settings.checkpoint()
THREADS = settings.threads()
DEVICE = settings.device() if settings.device().startswith("vulkan") else "vulkan"
torch.set_num_threads(THREADS)
report = check.begin("10_run_on_vulkan", ckpt)
model_dir = checkpoint.ensure(ckpt)
out_dir = paths.ncnn_dir(ckpt)
BENCH = paths.ROOT / "data" / "bench"

# %% [markdown]
# ## 1. Find a Vulkan device
# The pip `ncnn` wheel has Vulkan compiled in; whether it finds a device depends on the Vulkan loader and a driver.
# `lab.vulkan_or_skip` is the gate. It asks ncnn once (`runtime.binding.net.vulkan_devices`, which keeps what ncnn's
# loader writes to stderr and turns it into a reason), and no device means a recorded skip, except where the
# environment variable `QTTS_REQUIRE_VULKAN` is set: there it raises `VulkanRequired`. `.ci/run` installs lavapipe and
# sets it, so a skip there would hide a broken set-up. Set it yourself on a machine that must have a GPU.

# %%
gpu, why = lab.vulkan_or_skip()
if gpu:
    print(f"ncnn {ncnn.__version__} sees: {why}")
    check.equal(f"{DEVICE} is a device ncnn sees", "devices", len(gpu_names()) > 0, True)
else:
    check.current().record("chapter 10 on Vulkan", "skipped", why, "needs a Vulkan device", True, "--")

# %% [markdown]
# ## 2. Run every graph on Vulkan at two lengths
# The same inputs as chapter 04 (seeded, both lengths of each module) go through the CPU graph and the Vulkan graph;
# each pair is compared with the metric and tolerance of that module's spec (`spec.check`, as in 02 and 04).
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
    fig, ax = plt.subplots(figsize=(9, 3))
    frame = pd.DataFrame(results).pivot(index="module", columns="length", values="rel").clip(lower=1e-10)
    frame.plot.bar(ax=ax, logy=True, rot=30, ylabel="relative L2 error", title=f"{DEVICE} vs CPU, fp32 ({ckpt})")
    ax.axhline(1e-5, color="crimson", ls="--", lw=1)

# %% [markdown]
# ## 3. Step the KV caches on Vulkan
# Prefill 9 positions, then 16 cached steps, for both decoders, against the CPU decoder (`precision.decoder`), at
# chapter 05's threshold. Three GPU decoders: the **exported** graphs of chapter 05 as they are (every layer's K and V
# a separate output), the **packed** one (`rewrites.gpu.packed_cache_params`: all caches as one blob), and for the
# talker the GPU loop's own (`pipeline.loop.gpu_talker`, section 7), stepping from its cache up to 16 positions and
# running the full sequence after, so both of its ways are checked.

# %%
def prefill_and_step(net, x: np.ndarray) -> list[np.ndarray]:
    hidden, cache = net.prefill(x[:, :9])  # (1, 9, hidden), the cache of 9 positions
    return [hidden] + [net.forward(x[:, t : t + 1], cache) for t in range(9, 9 + STEPS)]


STEPS = 16
step_errors = {}
if gpu:
    cfg = checkpoint.load_config(ckpt)["talker_config"]
    for name, c in (("talker_decoder", cfg), ("predictor_decoder", cfg["code_predictor_config"])):
        x = np.random.default_rng(8).standard_normal((1, 9 + STEPS, c["hidden_size"])).astype(np.float32)
        nets = {"cpu": precision.decoder(out_dir, name, c["head_dim"], c["rope_theta"], THREADS),
                "exported": precision.decoder(out_dir, name, c["head_dim"], c["rope_theta"], THREADS, DEVICE),
                "packed": lab.packed_decoder(out_dir, name, c, THREADS, DEVICE)}
        if name == "talker_decoder":
            nets["GPU forms"] = gpu_talker(out_dir, c, THREADS, DEVICE, max_cached=16)
        outs = {k: prefill_and_step(n, x) for k, n in nets.items()}
        for kind in [k for k in nets if k != "cpu"]:
            errs = [check.rel_err(o, r) for o, r in zip(outs[kind], outs["cpu"])]
            step_errors[f"{name} ({kind})"] = errs
            check.at_most(f"{name}: Vulkan {kind} caches, prefill + {STEPS} steps", "worst rel", max(errs), 1e-5)
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for label, errs in step_errors.items():
        ax.semilogy(range(STEPS + 1), np.maximum(errs, 1e-10), marker="o", ms=3, label=label)
    ax.axhline(1e-5, color="crimson", ls="--", lw=1)
    ax.set(xlabel="call (0 = prefill)", ylabel="rel vs CPU", title="cached decoding on Vulkan vs CPU")
    ax.legend(fontsize=8)

# %% [markdown]
# ## 4. Generate on Vulkan, token for token
# `Synthesizer(model_dir, device=...)` is the product's pipeline on the GPU, and on a GPU it runs the GPU forms of
# section 7. The exported graphs on the GPU are `Loop.load(..., gpu_forms=False)` over the same config and embedding
# tables. Both must give every code of chapter 03's CPU goldens (PyTorch, greedy, fp32): x-vector and ICL (the voice
# clip encoded by Mimi and the speaker encoder on Vulkan too). A parity run asks for `Sampling(greedy=True)` and
# counts frames, where the goldens were made with HF's `max_new_tokens` (N tokens give N - 1 frames).

# %%
GREEDY, FRAMES = Sampling(greedy=True), inputs.GOLDEN_MAX_NEW_TOKENS - 1
if gpu:
    xvec_golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "xvec_greedy.npz", ckpt)
    icl_golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "icl_greedy.npz", ckpt)
    voice_wav, voice_text = load_wav(paths.voice_wav()), (paths.INPUTS / "voice.txt").read_text().strip()
    synth = Synthesizer(model_dir, THREADS, DEVICE)
    exported_loop = Loop.load(synth.config, synth.embeddings, THREADS, DEVICE, gpu_forms=False)
    runs = {}
    for mode, golden, voice in (("x-vector", xvec_golden, synth.voice(xvector=xvec_golden["xvector"])),
                                ("ICL", icl_golden, synth.voice(wav=voice_wav, text=voice_text))):
        result = synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, GREEDY, max_frames=FRAMES)
        check.tokens_equal(f"{mode}, rewritten loop on Vulkan: codes = CPU golden", result.codes, golden["codes"])
        seq = exported_loop.run(synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice),
                                Sampler(GREEDY, synth.config.talker), FRAMES)
        check.tokens_equal(f"{mode}, exported graphs' loop on Vulkan: codes = CPU golden", np.stack(seq.codes),
                           golden["codes"])
        runs[mode] = (result, voice)

# %% [markdown]
# The waveform: `synthesize`'s audio, decoded by the codec's GPU form on Vulkan (`codec.gpu_form`: the codebook sums
# on the CPU, everything after them one Vulkan graph; section 7), against chapter 03's wav (PyTorch on the CPU) and
# against the ncnn CPU decode of the same codes, at chapter 07's threshold.

# %%
if gpu:
    cpu_codec = Synthesizer(model_dir, THREADS).codec
    for mode, golden in (("x-vector", xvec_golden), ("ICL", icl_golden)):
        result, voice = runs[mode]
        check.snr(f"{mode}: Vulkan wav vs PyTorch CPU golden", result.wav, golden["wav"], 60.0)
        cpu_wav = cpu_codec.decode_with_voice(result.codes, voice.codes)
        check.snr(f"{mode}: Vulkan wav vs ncnn CPU wav", result.wav, cpu_wav, 60.0)
    save_wav(paths.outputs_dir(ckpt) / "10_vulkan.wav", result.wav)

# %% [markdown]
# ## 5. Check ncnn's conventions on this device
# A port made for one backend can meet other conventions on another. Two matter here, and ncnn's own tests say
# what the layers are meant to take (Tencent/ncnn, `tests/`):
#
# | layer | ncnn's test | the convention it tests |
# |---|---|---|
# | `RotaryEmbed` | `tests/test_rotaryembed.cpp` | `cos_cache = RandomMat(embed_dim / 2, seqlen)`: **half width** |
# | `SDPA` | `tests/test_sdpa.cpp` | masks `(dst_seqlen, src_seqlen)` 2-D; `(dst, src, 1)`, `(dst, src, q.c)` 3-D |
#
# Tiny hand-written graphs feed both layers the forms the tests pin down and the forms they do not (full-width
# tables), on the CPU and on this device, against a numpy reference:

# %%
conventions = lab.convention_rows(["cpu", DEVICE] if gpu else [], THREADS)  # small hand-written graphs
for row in conventions:
    check.at_most(f"{row['test']} on {row['device']} = numpy", "max_abs", row["max_abs"], 1e-5)
pd.DataFrame(conventions).pivot(index="test", columns="device", values="max_abs") if gpu else None

# %% [markdown]
# On this ncnn version full-width tables (the layer reads the first half of each row) and all three mask ranks give
# the same answer on both devices. The runtime still feeds half-width tables and 2-D masks: the forms ncnn's tests
# pin down, so the forms a future version keeps.
#
# ## 6. Measure fp16 on Vulkan
# Vulkan devices usually offer fp16 storage and arithmetic, and ncnn turns them on by default. First the
# corruption: int32 token ids that pass through a GPU layer such as `Reshape` are stored as fp16, so the `Embed` after
# it reads other rows. Fed straight into `Embed` (which runs them as ids), they survive:

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
# Then the whole loop with fp16 on for every graph (`lab.patched_ncnn` forces it back on at load time), against the
# fp32 golden: how many codes agree, and where the first one differs.

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
# fp16 flips argmax decisions whose margin is below its rounding (chapter 03's margin histogram shows how many are
# that close), and one changed code changes every frame after it. So fp32 is the default on Vulkan; fp16 is a speed
# option to be judged by listening, not by parity.
#
# ## 7. Where a GPU frame's time goes, and the GPU forms
# The pip binding has no `VkMat`: each `extract` is a blocking submission followed by a download, each CPU Mat given
# to `input` an upload. A probe (`python -m qtts_lib.lab.vulkan_probe`) timed on the reference H200 what each piece
# costs: chains of N layers of one type (the slope is the cost of one more layer), and one projection in each of
# ncnn's forms, with the fp32 weights it reads per second:

# %%
forms = json.loads((BENCH / "gpu" / "h200-vulkan-forms.json").read_text())
ch, pf = forms["layer_chains"]["chains"], forms["projection_forms"]
per_layer = {kind: round(1e3 * (ch[f"{kind} x{n}"]["wall"] - ch[f"{kind} x1"]["wall"]) / (n - 1) / k, 1)
             for kind, n, k in (("AbsVal", 400, 1), ("Split", 400, 1), ("BinaryOp", 200, 1), ("RMSNorm", 200, 1),
                                ("ReshapePermute", 100, 4), ("Gemm64", 200, 1), ("Gemm1024", 100, 1))}
display(pd.Series(per_layer, name="µs per extra layer (ReshapePermute: per layer of 4)").to_frame())
display(pd.DataFrame({k: v for k, v in pf.items() if "wall" in v}).T[["wall", "fp32 weight GB/s"]])
gbs = {k: v["fp32 weight GB/s"] for k, v in pf.items() if "wall" in v}
gemv = gbs["innerproduct, input (1024,)"] / gbs["gemm B transB=1, input (1, 1024)"]
check.at_least("H200: a projection on one row, InnerProduct on 1-D vs Gemm", "weight-read speed-up", gemv, 4.0)
check.at_least("H200: one more Gemm 1024x1024 vs one more AbsVal (the cost is the Gemm, not the layer)",
               "time ratio", per_layer["Gemm1024"] / per_layer["AbsVal"], 10.0)

# %% [markdown]
# A layer costs microseconds; a projection on one row costs what ncnn's Vulkan `Gemm` reads per second, far below the
# GPU's memory bandwidth. The same projection as an `InnerProduct` on a **1-D** input runs ncnn's GEMV kernel (the K
# axis in 8 partial sums) several times faster. fp16 storage also speeds a `Gemm`, but changes codes (section 6).
# So `runtime.rewrites.gpu_layers` rewrites each decoder three ways (text; the weights only regrouped), all of which
# the GPU loop runs (`pipeline.loop.GpuDecoder`, `GemvCodePredictor`, what `Synthesizer` runs on a GPU):
# - **full** (`gpu_decoder`): as few layers as the same arithmetic allows (q/k/v and gate/up fused into one Gemm
#   each, one Reshape + Permute + Slice for the head split, the residual adds folded into the Gemm before them);
# - **kv**: the same with caches, for the prompt's prefill;
# - **step** (`gemv_step`, below): one position on 1-D blobs, every projection an InnerProduct, and `one_blob_io`:
#   the caches as one flat blob, row + cos + sin as one input, no mask: one upload and one download per call.

# %%
print(inspect.getsource(gpu_layers.gemv_step))

# %% [markdown]
# The talker steps from its cache only while it is short: past `loop.TALKER_MAX_CACHED` positions each step runs the
# full sequence instead, because the flat cache's trip through host memory grows with it and a full forward hardly
# does. The probe timed both ways at each length. The predictor (at most 17 positions) always steps from its cache.

# %%
ms = forms["gpu_forms"]["ms_per_call"]
pasts = [16, 32, 64, 128, 256, 512]
steps = pd.DataFrame([{"cached GEMV step": ms[f"talker GEMV step at past {p}, caches in and out"]["wall"],
                       "full sequence": ms[f"talker full sequence, {p + 1} rows"]["wall"],
                       "flat cache MB": ms[f"flat cache MB at past {p}"]} for p in pasts],
                     index=pd.Index(pasts, name="past"))
display(steps)
check.at_least("H200: talker at 128 cached positions, cached step vs full sequence", "time ratio",
               steps.loc[128, "cached GEMV step"] / steps.loc[128, "full sequence"], 1.0)

# %% [markdown]
# Counted live: every extract of both loops on this device, per generated frame (two runs of different lengths, so
# prefill and prompt drop out of the difference), against what each loop's structure says (`lab.submissions_per_frame`):
# the exported talker extracts its output and every layer's K and V (1 + 2·layers) and reads its codec head, the
# exported predictor makes a prefill and 14 steps and reads 15 heads; the GPU loop makes one talker call, the codec
# head, and 16 predictor calls. The embedding tables are numpy on every device, so no lookup is a call.

# %%
if gpu:
    tc = checkpoint.load_config(ckpt)["talker_config"]
    layers = tc["num_hidden_layers"], tc["code_predictor_config"]["num_hidden_layers"]
    counter = [0]
    with lab.patched_ncnn(counter=counter):  # nets made inside count their extracts
        loops = {"exported graphs'": Loop.load(synth.config, synth.embeddings, THREADS, DEVICE, gpu_forms=False),
                 "GPU forms": Loop.load(synth.config, synth.embeddings, THREADS, DEVICE)}
    prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, synth.voice(xvector=xvec_golden["xvector"]))
    expected = {"exported graphs'": lab.submissions_per_frame,
                "GPU forms": lambda *n: lab.submissions_per_frame(*n, rewritten=True)}
    for variant, loop in loops.items():
        counts = []
        for frames in (6, 12):
            counter[0] = 0
            loop.run(prompt, Sampler(GREEDY, synth.config.talker), frames)
            counts.append(counter[0])
        per_frame = (counts[1] - counts[0]) // 6
        check.equal(f"{variant} loop: extracts per frame on {ckpt}", "count", per_frame, expected[variant](*layers))
        print(f"{variant} loop: {per_frame} per frame here, {expected[variant](28, 5)} at full size")

# %% [markdown]
# Every graph the GPU loop runs, on this device: its ncnn layers against the exported graph it replaces (the one-blob
# I/O's own Reshape/Split/Concat layers allowed on top), and the layers that have no Vulkan kernel (each would be a
# download, a CPU op and an upload inside the extract). The check is that there are none. The codec's exported graph
# has such layers; its GPU form (`codec.gpu_form`, what `Synthesizer` decodes with on a GPU) rewrites them into
# layers that have a kernel (polyphase stride-1 convolutions and 2-D convolutions, chapter 12's rewrites without the
# CPU's cuts) and runs the codebook sums (a gather and a few MFLOP a frame) on the CPU before the Vulkan graph.

# %%
if gpu:
    gl = loops["GPU forms"]
    exported = {n: len(parse_param((out_dir / f"{n}.param").read_text()).layers)
                for n in ("talker_decoder", "talker_decoder_kv", "talker_codec_head", "predictor_decoder_kv",
                          "predictor_heads", "codec_decoder")}
    exported["predictor (cached decoder + heads)"] = exported["predictor_decoder_kv"] + exported["predictor_heads"]
    graphs = lab.gpu_loop_graphs(gl, synth.codec.net, layers)  # label -> (net, exported graph, one-blob I/O layers)
    exported_codec = Net(out_dir, "codec_decoder", THREADS, DEVICE).net
    print("layer types of the exported codec graph without a Vulkan kernel:",
          sorted({lyr.type for lyr in exported_codec.layers() if not lyr.support_vulkan}))
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
# ## 8. Read what a GPU buys
# The benchmark harness of chapter 11 (`python -m qtts_lib.bench loop`) ran on the H200 host at full size, on
# zero-filled weights of the real sizes (fp32 kernels take the same time whatever the values): one prompt, runs
# interleaved, each in a fresh process: ncnn on Vulkan (the GPU forms), PyTorch on the same GPU (qwen-tts's generate,
# CUDA, fp32), and both on the host's CPU cores. A frame is 80 ms of audio: a bar past that line is slower than real
# time.

# %%
doc = json.loads((BENCH / "h200-vulkan-loop.json").read_text())
row = {(r["runtime"], r["device"]): r["ms_per_frame"] for r in doc["rows"]}
gpu_table = pd.DataFrame([{"runtime": r["runtime"], "device": r["device"], "threads": r["threads"], **r["ms_per_frame"],
                           "rtf": r["rtf"]} for r in doc["rows"]]).set_index(["runtime", "device"])
host = doc["machine"]
print(f"{host['gpu']} ({host['gpu_memory']}), {host['cpu']} with {host['cores']} cores; {doc['frames']} frames")
display(gpu_table.round(1))
ax = gpu_table[["talker", "predictor", "codec"]].plot.barh(stacked=True, figsize=(9, 2.8),
                                                          title="full size on the H200 host: ms per frame")
ax.axvline(80, color="crimson", ls="--", lw=1)
ax.set_xlabel("ms per frame (80 = real time)")
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
packed = json.loads((BENCH / "h200-vulkan.json").read_text())  # the packed caches of section 3, on the same host kind
before = next(r for r in packed["rows"] if r["device"] == "vulkan" and r["variant"] == "rewritten")["ms_per_frame"]
check.at_least("H200: the GPU forms vs the packed/fused forms before them (h200-vulkan.json)", "loop speed-up",
               loop_ms(before) / loop_ms(ours), 1.5)
print(f"the loop with packed caches and a fused predictor instead: {loop_ms(before):.0f} ms per frame")


# %% [markdown]
# ### What only C++ would buy
# What is left is per-call host work (recording, upload, download) and the talker's cache crossing the bus. ncnn's C++
# API keeps a cache on the GPU between calls (`VkMat`) and records several calls into one command (`VkCompute`).
# `python -m qtts_lib.lab.cpp_probe` builds a probe (`qtts_lib/lab/cpp/`) against ncnn's source and times the GPU
# loop's one-position graphs through the binding and in C++ (host Mats; caches resident; four calls chained):

# %%
cpp = pd.DataFrame(json.loads((BENCH / "gpu" / "h200-cpp-probe.json").read_text())["rows"]).set_index(["graph", "past"])
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
      f"{frame_cpp:.0f} ms in C++ (caches resident, calls chained): {1 - frame_cpp / frame_now:.0%} less")

# %% [markdown]
# Resident, the talker's step no longer grows with its cache; the predictor gains less (its floor is recording its
# layers plus the submit). Using this means a C++ extension beside the wheel, or a binding that exposes `VkMat` and
# `VkCompute`; the probe's ncnn is built from source, so these numbers estimate the runtime's rather than measure it.
#
# ## Summary
# - Every graph, the cached decoders and the whole loop give the CPU's answers on Vulkan in fp32: every code of the
#   x-vector and ICL goldens, waveforms above chapter 07's threshold.
# - ncnn's tests define half-width rope tables and 2-D / 3-D masks; the runtime keeps to the half-width, 2-D forms.
# - fp16 on Vulkan corrupts int32 ids that pass through a GPU layer and changes codes: fp32 stays the default.
# - Through the binding a GPU step costs the weights read at ncnn's one-row `Gemm` speed, then per-call host work.
#   The GPU forms (`runtime.rewrites.gpu_layers`, what `Synthesizer` runs on a GPU) cut both: fewer layers, GEMV
#   steps on 1-D blobs, one upload and one download per call, no layer without a Vulkan kernel (the codec too).
# - On the reference H200, same harness and prompt, ncnn on Vulkan beats PyTorch on CUDA for the loop, the codec and
#   the whole frame (section 8); C++ would take a further share off. Every machine side by side: the results page.
#
# **Artifacts left:** `data/outputs/<ckpt>/10_vulkan.wav`, the chapter report.
#
# **If your numbers differ**
# - *One "skipped" row, or `VulkanRequired` where `QTTS_REQUIRE_VULKAN` is set* → ncnn saw no Vulkan device
#   (section 1 prints why): install `mesa-vulkan-drivers libvulkan1` (lavapipe) or a GPU driver.
# - *"the Vulkan loader found no driver"* → no ICD; on a container GPU host set `VK_DRIVER_FILES` to its json.
# - *Codes differ from the golden on Vulkan* → fp16 came back on (see 6): `net.opt.use_fp16_*` before `load_param`;
#   or a parity run without `Sampling(greedy=True)` (the runtime samples by default).
# - *Garbage embeddings only on the GPU, in a graph of your own* → int32 ids through a GPU layer with fp16 on (see
#   6); the runtime's lookups are numpy, or feed the ids straight into `Embed`.

# %%
check.table()
