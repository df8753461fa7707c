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
# # Appendix C · What a GPU buys
# > Where a frame's time goes on a GPU through ncnn's Python binding, the graph forms that cut it, and how ncnn on
# > Vulkan compares with PyTorch on CUDA.
#
# Chapter 10 proves the port gives the CPU's answers on a Vulkan device. This appendix asks what that costs and
# buys. Its live sections run on whatever Vulkan device ncnn sees (CI: Mesa's lavapipe, a Vulkan driver on the CPU,
# where timings mean nothing, so the live sections count calls and layers instead); its timed sections read what
# probes (small timing programs in `qtts_lib.lab`) measured at full size on one GPU host, an NVIDIA H200, committed
# in `data/bench/`.
#
# **You will:** count the GPU calls one generated frame makes, live; read what one more layer and one projection
# cost on the H200; see the GPU forms of the decoders (fewer layers, GEMV steps, one blob in and out) and check
# every graph the GPU loop runs; then read the loop against PyTorch on CUDA, and what ncnn's C++ API would add.
#
# **You will learn:** why a GPU step through the binding costs per-call host work (the CPU's share of a call:
# recording the layers' commands, uploading, submitting, waiting, downloading) plus the weights read at ncnn's
# one-row `Gemm` speed; what `runtime.rewrites.gpu_layers` does about both; where the Python binding stops.
#
# **You need:** chapter 10 run first (the graphs of chapters 04–05 and chapter 03's goldens); a Vulkan device for the
# live sections (without one they record a skip, and fail where `QTTS_REQUIRE_VULKAN` is set).
#
# **Leaves behind:** `data/reports/<ckpt>/appendix_c_what_a_gpu_buys.json`.

# %%
import json

import ncnn
import pandas as pd
from IPython.display import display

from qtts_lib import artifacts, check, checkpoint, paths, settings
from qtts_lib.lab import vulkan as lab

ckpt = settings.checkpoint()  # QTTS_CHECKPOINT, default tiny-base
THREADS = settings.threads()
DEVICE = settings.device() if settings.device().startswith("vulkan") else "vulkan"
report = check.begin("appendix_c_what_a_gpu_buys", ckpt)
model_dir, out_dir = checkpoint.ensure(ckpt), paths.ncnn_dir(ckpt)
BENCH = paths.DATA / "bench"
gpu, why = lab.vulkan_or_skip()  # chapter 10, section 1
if not gpu:
    check.current().record("appendix C on Vulkan", "skipped", why,
                           "needs a Vulkan device", True, "--")

# %% [markdown]
# ## 1. Count the calls a frame makes
# On Vulkan the CPU records each layer's GPU work into a command buffer and submits it; the GPU runs it. The pip
# binding has no `VkMat` (ncnn's Mat in GPU memory): each `extract` records, submits, waits for the GPU and
# downloads, each CPU Mat given to `input` is an upload, and nothing stays on the GPU between calls. So the first
# cost to know is how many extracts a frame makes. To count them without touching the runtime, the cell below swaps
# `ncnn.Net` for a subclass whose extractors count their `extract` calls, for the nets made inside the `with` (as
# chapter 10 forced fp16):

# %%
import contextlib


@contextlib.contextmanager
def counting_extracts(counter: list):
    """Nets made inside add 1 to counter[0] on every extract."""
    real = ncnn.Net

    class Counted:
        def __init__(self, ex):
            self.ex = ex

        def input(self, *args):
            return self.ex.input(*args)

        def extract(self, *args):
            counter[0] += 1
            return self.ex.extract(*args)

    class CountingNet(real):
        def create_extractor(self):
            return Counted(super().create_extractor())

    ncnn.Net = CountingNet
    try:
        yield
    finally:
        ncnn.Net = real

# %% [markdown]
# What each loop's structure says a frame costs. The exported talker (chapter 05) extracts its output and every
# layer's K and V (1 + 2·layers) and reads its codec head; the exported predictor makes a prefill and 14 steps, each
# the same extracts plus one of its 15 heads. The GPU loop makes one talker call (hidden and caches in one blob),
# the codec head, and 16 predictor calls (the talker's hidden state builds its cache, then one call per codebook
# 1..15, each with its head fused in). The embedding tables are numpy on every device, so no lookup is a call.

# %%
def extracts_per_frame(talker_layers: int, pred_layers: int, gpu_forms: bool) -> int:
    if gpu_forms:
        return 1 + 1 + 16  # talker, codec head, predictor's first position and 15 steps
    talker = 1 + 2 * talker_layers + 1  # output, K and V per layer, codec head
    return talker + 15 * (1 + 2 * pred_layers + 1)  # prefill + 14 steps, a head each


tc = checkpoint.load_config(ckpt)["talker_config"]
layers = tc["num_hidden_layers"], tc["code_predictor_config"]["num_hidden_layers"]
for forms in (False, True):
    print(f"gpu_forms={forms}: {extracts_per_frame(*layers, forms)} extracts per frame "
          f"here, {extracts_per_frame(28, 5, forms)} at full size (28 and 5 layers)")

# %% [markdown]
# Counted live: both loops on this device, over two runs of different lengths, so that prefill and prompt drop out
# of the difference.

# %%
from qtts_lib import inputs
from qtts_lib.runtime import Sampling, Synthesizer
from qtts_lib.runtime.pipeline.loop import Loop
from qtts_lib.runtime.pipeline.sampling import Sampler

if gpu:
    golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "xvec_greedy.npz", ckpt)
    synth = Synthesizer(model_dir, THREADS, DEVICE)
    counter = [0]
    with counting_extracts(counter):
        args = synth.config, synth.embeddings, THREADS, DEVICE
        loops = {"exported graphs'": Loop.load(*args, gpu_forms=False),
                 "GPU forms": Loop.load(*args)}
    voice, greedy = synth.voice(xvector=golden["xvector"]), Sampling(greedy=True)
    prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
    for variant, loop in loops.items():
        counts = []
        for frames in (6, 12):
            counter[0] = 0
            loop.run(prompt, Sampler(greedy, synth.config.talker), frames)
            counts.append(counter[0])
        per_frame = (counts[1] - counts[0]) // 6
        check.equal(f"{variant} loop: extracts per frame on {ckpt}", "count", per_frame,
                    extracts_per_frame(*layers, variant == "GPU forms"))

# %% [markdown]
# ## 2. Where a GPU step's time goes
# A probe (`python -m qtts_lib.lab.vulkan_probe`) timed on the H200 what each piece costs: chains of N layers of one
# type (`wall`: ms per extract; the slope from 1 to N layers is the cost of one more layer; a `ReshapePermute` link
# is 4 layers, `Gemm64` a 64-wide projection), and one projection in each of ncnn's forms, with the fp32 weight
# bytes it reads per second. First the layers, in microseconds per extra layer:

# %%
forms = json.loads((BENCH / "gpu" / "h200-vulkan-forms.json").read_text())
ch, pf = forms["layer_chains"]["chains"], forms["projection_forms"]
chains = {"AbsVal": (400, 1), "Split": (400, 1), "BinaryOp": (200, 1),  # (N, per link)
          "RMSNorm": (200, 1), "ReshapePermute": (100, 4), "Gemm64": (200, 1),
          "Gemm1024": (100, 1)}
per_layer = {kind: round(1e3 * (ch[f"{kind} x{n}"]["wall"] - ch[f"{kind} x1"]["wall"])
                         / (n - 1) / k, 1) for kind, (n, k) in chains.items()}
pd.Series(per_layer, name="µs per extra layer (ReshapePermute: of 4)").to_frame()

# %% [markdown]
# Then one projection (a square weight of side 1024) in each form ncnn offers, named by layer and input shape
# (`Gemm` with the weight as B, transposed, on a `(1, 1024)` row; `InnerProduct` on a 1-D `(1024,)` vector; ...),
# and the weight bytes it reads per second:

# %%
timed = pd.DataFrame({k: v for k, v in pf.items() if "wall" in v}).T
display(timed[["wall", "fp32 weight GB/s"]])
gbs = timed["fp32 weight GB/s"]
gemv = gbs["innerproduct, input (1024,)"] / gbs["gemm B transB=1, input (1, 1024)"]
check.at_least("H200: a projection on one row, InnerProduct on 1-D vs Gemm",
               "weight-read speed-up", gemv, 4.0)
check.at_least("H200: one more Gemm 1024x1024 vs one more AbsVal "
               "(the cost is the Gemm, not the layer)", "time ratio",
               per_layer["Gemm1024"] / per_layer["AbsVal"], 10.0)

# %% [markdown]
# A layer costs microseconds; a projection on one row costs what ncnn's Vulkan `Gemm` reads per second, far below
# the GPU's memory bandwidth. The same projection as an `InnerProduct` on a **1-D** input runs ncnn's GEMV kernel
# (general matrix-vector product, the input axis summed in 8 partial sums) several times faster. fp16 storage speeds a
# `Gemm`, but changes codes (chapter 10, section 6).
#
# ## 3. The GPU forms
# So `runtime.rewrites.gpu_layers` rewrites each decoder three ways (`.param` text; the weights only regrouped), all
# of which the GPU loop runs (`pipeline.loop.GpuDecoder`, `GemvCodePredictor`: what `Synthesizer` runs on a GPU):
# - **full** (`gpu_decoder`): as few layers as the same arithmetic allows (q/k/v and gate/up fused into one Gemm
#   each, one Reshape + Permute + Slice for the head split, the residual adds folded into the Gemm before them);
# - **kv**: the same with caches, for the prompt's prefill;
# - **step** (`gemv_step`, below): one position on 1-D blobs, every projection an InnerProduct, and `one_blob_io`:
#   the caches as one flat blob, row + cos + sin as one input, no mask: one upload and one download per call.

# %%
import inspect

from qtts_lib.runtime.rewrites import gpu_layers

print(inspect.getsource(gpu_layers.gemv_step))

# %% [markdown]
# The talker steps from its cache only while it is short: past `loop.TALKER_MAX_CACHED` positions each step runs the
# full sequence instead. Without `VkMat` the flat cache goes down to host memory and back up every call, a trip that
# grows with it, while a full forward hardly does. The probe timed both ways at each length (ms per call; the flat
# cache in MB):

# %%
ms = forms["gpu_forms"]["ms_per_call"]
step_ms = "talker GEMV step at past {}, caches in and out"
pasts = [16, 32, 64, 128, 256, 512]
steps = pd.DataFrame(
    [{"cached GEMV step": ms[step_ms.format(p)]["wall"],
      "full sequence": ms[f"talker full sequence, {p + 1} rows"]["wall"],
      "flat cache MB": ms[f"flat cache MB at past {p}"]} for p in pasts],
    index=pd.Index(pasts, name="past"))
display(steps)
check.at_least("H200: talker at 128 cached positions, cached step vs full sequence",
               "time ratio", steps.loc[128, "cached GEMV step"]
               / steps.loc[128, "full sequence"], 1.0)

# %% [markdown]
# ## 4. Check every graph the GPU loop runs
# Each graph the GPU loop runs, on this device, against the exported graph it replaces: its ncnn layers may number
# at most the exported graph's plus what one-blob I/O adds (the third number of each entry below: a prefill adds a
# flatten per cache blob and one Concat; a step adds per cache blob a Slice part, a reshape and a flatten, one Split
# and one Concat, and per output, 1 for the talker and 15 heads for the predictor, a Split, a flatten and a Concat).
# The full-sequence talker must also shed over a quarter of the exported layers (at most 0.72 of them: the
# fusions of section 3). And no layer may lack a Vulkan kernel: such a layer would be a download, a CPU op and an
# upload inside the extract (`support_vulkan` on each of `net.layers()`). The codec's exported
# graph has such layers; its GPU form (`codec.gpu_form`, what `Synthesizer` decodes with on a GPU) rewrites them
# into layers that have a kernel (polyphase stride-1 and 2-D convolutions, chapter 12's rewrites without the CPU's
# cuts) and runs the codebook sums (a gather and a few MFLOP a frame) on the CPU before the Vulkan graph.

# %%
from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.binding.param import parse_param

if gpu:
    gl, both = loops["GPU forms"], "predictor (cached decoder + heads)"
    tk, pk = 2 * layers[0], 2 * layers[1]  # cache blobs (K and V a layer)
    graphs = {  # label: (ncnn.Net, exported graph it replaces, one-blob I/O layers)
        "talker prefill (kv)": (gl.talker.prefill_net, "talker_decoder_kv", tk + 1),
        "talker step (GEMV, one blob)": (gl.talker.step_net, "talker_decoder_kv",
                                         3 * tk + 2 + 3),
        "talker full sequence": (gl.talker.full, "talker_decoder", 0),
        "codec head": (gl.head.net, "talker_codec_head", 0),
        "predictor first position": (gl.predictor.first, both, pk + 1),
        "predictor step (GEMV, one blob)": (gl.predictor.step, both,
                                            3 * pk + 2 + 3 * 15),
        "codec (GPU form, after the codebooks)": (synth.codec.net, "codec_decoder", 0)}
    names = ("talker_decoder", "talker_decoder_kv", "talker_codec_head",
             "predictor_decoder_kv", "predictor_heads", "codec_decoder")
    exported = {n: len(parse_param((out_dir / f"{n}.param").read_text()).layers)
                for n in names}
    exported[both] = exported["predictor_decoder_kv"] + exported["predictor_heads"]
    codec_net = Net(out_dir, "codec_decoder", THREADS, DEVICE).net
    print("layer types of the exported codec graph without a Vulkan kernel:",
          sorted({lyr.type for lyr in codec_net.layers() if not lyr.support_vulkan}))

# %% [markdown]
# Every graph's layers counted, and those without a Vulkan kernel named:

# %%
if gpu:
    layer_rows = []
    for label, (net, was, added) in graphs.items():
        on_cpu = [lyr.name for lyr in net.layers() if not lyr.support_vulkan]
        check.equal(f"GPU loop, {label}: layers without a Vulkan kernel", "count",
                    len(on_cpu), 0)
        check.at_most(f"GPU loop, {label}: ncnn layers "
                      f"(at most {was}'s + {added} of one-blob I/O)",
                      "layers", len(net.layers()), exported[was] + added)
        layer_rows.append({"graph": label, "ncnn layers": len(net.layers()),
                           "exported graph": was, "its layers": exported[was],
                           "no Vulkan kernel": len(on_cpu)})
    check.at_most("GPU loop, talker full sequence: layers vs the exported graph",
                  "ratio", len(gl.talker.full.layers()) / exported["talker_decoder"],
                  0.72)
    display(pd.DataFrame(layer_rows))

# %% [markdown]
# ## 5. Read what a GPU buys
# The benchmark harness of chapter 11 (`python -m qtts_lib.bench loop`) ran on the H200 host at full size, on
# zero-filled weights of the real sizes (fp32 kernels take the same time whatever the values): one prompt, runs
# interleaved, each in a fresh process: ncnn on Vulkan (the GPU forms), PyTorch on the same GPU (qwen-tts's
# generate, CUDA, fp32), and both on the host's CPU cores. A frame is 80 ms of audio: a bar past the red line is
# slower than real time.

# %%
doc = json.loads((BENCH / "h200-vulkan-loop.json").read_text())
row = {(r["runtime"], r["device"]): r["ms_per_frame"] for r in doc["rows"]}
gpu_table = pd.DataFrame([{"runtime": r["runtime"], "device": r["device"],
                           "threads": r["threads"], **r["ms_per_frame"],
                           "rtf": r["rtf"]} for r in doc["rows"]])
gpu_table = gpu_table.set_index(["runtime", "device"])
host = doc["machine"]
print(f"{host['gpu']} ({host['gpu_memory']}), {host['cpu']} with {host['cores']} "
      f"cores; {doc['frames']} frames")
display(gpu_table.round(1))
ax = gpu_table[["talker", "predictor", "codec"]].plot.barh(
    stacked=True, figsize=(9, 2.8), title="full size on the H200 host: ms per frame")
ax.axvline(80, color="crimson", ls="--", lw=1)
ax.set_xlabel("ms per frame (80 = real time)");

# %% [markdown]
# The same rows as ratios. The loop is talker + predictor; "the packed/fused forms" are the GPU loop before
# `gpu_layers` (packed caches, chapter 10 section 3, and the predictor fused with its heads), measured on the same
# host kind (`h200-vulkan.json`):

# %%
ours, cuda = row["ncnn", "vulkan"], row["pytorch", "cuda"]
loop_ms = lambda m: m["talker"] + m["predictor"]  # noqa: E731
check.at_most("H200: ncnn Vulkan vs PyTorch CUDA, generation loop (talker + predictor)",
              "time ratio", loop_ms(ours) / loop_ms(cuda), 1.0)
check.at_most("H200: ncnn Vulkan vs PyTorch CUDA, the whole frame "
              "(prompt, loop, codec)", "time ratio", ours["total"] / cuda["total"], 1.0)
check.at_most("H200: the codec's GPU form on Vulkan vs PyTorch's codec on CUDA",
              "time ratio", ours["codec"] / cuda["codec"], 1.0)
check.at_least("H200: ncnn Vulkan vs the host's 16 CPU cores (ncnn)", "speed-up",
               row["ncnn", "cpu"]["total"] / ours["total"], 2.0)
packed = json.loads((BENCH / "h200-vulkan.json").read_text())
before = next(r["ms_per_frame"] for r in packed["rows"]
              if r["device"] == "vulkan" and r["variant"] == "rewritten")
check.at_least("H200: the GPU forms vs the packed/fused forms before them "
               "(h200-vulkan.json)", "loop speed-up",
               loop_ms(before) / loop_ms(ours), 1.5)
print(f"the loop with packed caches and a fused predictor: {loop_ms(before):.0f} ms "
      f"per frame, with the GPU forms {loop_ms(ours):.0f}")

# %% [markdown]
# ## 6. What only C++ would buy
# What is left is per-call host work (recording, upload, download) and the talker's cache crossing the bus. ncnn's
# C++ API keeps a cache on the GPU between calls (`VkMat`) and records several calls into one command
# (`VkCompute`). `python -m qtts_lib.lab.cpp_probe` builds a probe (`qtts_lib/lab/cpp/`) against ncnn's source and
# times the GPU loop's one-position graphs, in ms per call: through the binding, every cache a Mat in and out
# (`binding_ms`) or the runtime's one-blob graph (`binding_one_blob_ms`); in C++ with host Mats (`host_ms`), with
# the caches kept on the GPU as `VkMat` between calls (`resident_ms`), and with four calls recorded into one command
# (`chained_ms_per_call`); `submit_floor_ms` is one command moving 4 bytes up and down:

# %%
cpp = json.loads((BENCH / "gpu" / "h200-cpp-probe.json").read_text())["rows"]
cpp = pd.DataFrame(cpp).set_index(["graph", "past"])
display(cpp[["binding_ms", "binding_one_blob_ms", "host_ms", "resident_ms",
             "chained_ms_per_call", "submit_floor_ms", "layers"]])
talker, pred = cpp.loc["talker step"], cpp.loc["predictor step"]
one_blob = talker["binding_one_blob_ms"], pred["binding_one_blob_ms"]
check.at_least("H200, C++: talker step at 128 positions, the runtime's one-blob call "
               "vs caches resident on the GPU", "time ratio",
               one_blob[0].loc[128] / talker.loc[128, "resident_ms"], 2.0)
check.at_least("H200, C++: predictor step, the runtime's one-blob call vs caches "
               "resident on the GPU", "time ratio",
               (one_blob[1] / pred["resident_ms"]).median(), 1.1)
frame_now = one_blob[0].loc[64] + 16 * one_blob[1].median()
frame_cpp = talker.loc[64, "resident_ms"] + 16 * pred["chained_ms_per_call"].median()
print(f"a frame's loop at 64 positions, from these calls: {frame_now:.0f} ms through "
      f"the binding, {frame_cpp:.0f} ms in C++ (caches resident, calls chained): "
      f"{1 - frame_cpp / frame_now:.0%} less")

# %% [markdown]
# Resident, the talker's step no longer grows with its cache; the predictor gains less (its floor is recording its
# layers plus the submit). Using this means a C++ extension beside the wheel, or a binding that exposes `VkMat` and
# `VkCompute`; the probe's ncnn is built from source, so these numbers estimate the runtime's rather than measure it.
#
# ## Summary
# - Through the pip binding every `extract` is a submission and a download: the exported graphs make one per cache
#   blob, the GPU forms a fixed 18 per frame (counted live above).
# - A GPU step costs the weights read at ncnn's one-row `Gemm` speed, then per-call host work; a layer alone costs
#   microseconds.
# - The GPU forms (`runtime.rewrites.gpu_layers`, what `Synthesizer` runs on a GPU) cut both: fewer layers, GEMV
#   steps on 1-D blobs, one upload and one download per call, no layer without a Vulkan kernel (the codec too).
# - On the H200, same harness and prompt, ncnn on Vulkan beats PyTorch on CUDA for the loop, the codec and the
#   whole frame; C++ would take a further share off. Every machine side by side: the results page.
#
# **Artifacts left:** the report only.
#
# **If your numbers differ**
# - *One "skipped" row, or `VulkanRequired`* → ncnn saw no Vulkan device: chapter 10's section 1 says why.
# - *More extracts per frame than the formula* → a graph ran on the CPU path or a lookup became a graph call; the
#   embedding tables are numpy (`pipeline.embeddings`) on every device.
# - *A GPU-form graph with a layer lacking a Vulkan kernel* → the rewrite met a layer form it does not know (a new
#   pnnx or ncnn version): the table of section 4 names the graph.
# - *Timings on lavapipe* → it is a CPU driver: the live sections count calls and layers, the H200 files give time.

# %%
check.table()
