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
# # 12 · Rewrite the codec for the CPU
# > The same arithmetic through faster kernels: rewrite the graph's text, prove it equal, measure it.
#
# The codec decoder (chapter 01): codebook sums, a `pre_conv`, a small transformer, then upsampling stages to 1920
# samples a frame (two ConvNeXt stages; four decoder stages, each a transposed convolution and *residual units*, skip
# connections around convolutions and the Snake activation `x + sin²(αx)/β`). Unlike the loop it is *compute-bound*:
# each weight is reused at every sample, so a faster codec needs faster kernels, not fewer bytes (chapter 11).
#
# **You will:** rewrite the exported codec graph step by step, each step checked equal and timed; cut it in parts,
# **measure** how far back each part looks, run them chunk by chunk; hold it against PyTorch's codec and the peak.
#
# **You will learn:** that a graph rewrite is a pure function of the `.param` text (and `.bin`); why *polyphase*
# upsampling (one small convolution per output phase) skips the inserted zeros; why time tiles keep ncnn's *im2col*
# matrix (the input unrolled so that one matrix product convolves it) small; how to measure a receptive field (the
# input samples an output depends on); why chunking changes memory, not speed.
#
# **You need:** `models/<ckpt>/ncnn/codec_decoder.*` (chapter 04; exported here if missing). Timings on `tiny-*`
# mean little (call overhead dominates); the full-size numbers are the committed ones (`data/bench/codec/`).
# **Leaves behind:** `models/<ckpt>/ncnn/fast/` (the codec's CPU form, in parts),
# `data/reports/<ckpt>/12_rewrite_the_codec_for_cpu.json`.

# %%
import json

import numpy as np
import pandas as pd
import torch
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)  # PyTorch at ncnn's thread count
report = check.begin("12_rewrite_the_codec_for_cpu", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)
ncnn_dir = paths.ncnn_dir(ckpt)
st_file = model_dir / "speech_tokenizer/config.json"
st_cfg = json.loads(st_file.read_text())["decoder_config"]  # the codec decoder's config
full = ckpt.startswith("full") or not ckpt.startswith("tiny")
T = 100 if full else 40  # frames per decode in the timings below

# %% [markdown]
# ## 1. Read the exported graph
# pnnx wrote the codec as 1-D layers (`Convolution1D`; `Deconvolution1D`, each upsampling stage's strided transposed
# convolution; `ConvolutionDepthWise1D` in the ConvNeXt stages). On x86 ncnn's 1-D layers loop over plain arrays, while
# its 2-D `Convolution` has fast kernels: im2col + sgemm (single-precision matrix product) and direct kernels over
# *packed* data (channels interleaved by 4, 8 or 16, one SIMD register each). The graph's layer types:

# %%
from collections import Counter

from qtts_lib.runtime.binding.param import parse_param

text = (ncnn_dir / "codec_decoder.param").read_text()
data = (ncnn_dir / "codec_decoder.bin").read_bytes()
types = Counter(lyr.type for lyr in parse_param(text).layers)
display(pd.Series(dict(types.most_common(12)), name="layers").to_frame().T)

# %% [markdown]
# ## 2. Rewrite it step by step, each step equal
# Every rewrite in `runtime.rewrites.codec_cpu` maps the graph's text (and bytes) to an equivalent graph; each step
# below is the previous one plus one more:
# 1. *2-D kernels* (`conv1d_as_conv2d`, `deconv1d_as_deconv2d`): the same weights as a 2-D layer of height 1, with a
#    Reshape to 2-D before it and one back after;
# 2. *polyphase* (`deconv_polyphase`): each upsampling transposed convolution as a stride-1 convolution (section 3);
# 3. *3-D blobs* (`keep_3d`, `self_mul_as_square`): no Reshape pairs between consecutive convolutions; Snake's sin²;
# 4. *cuts* (`conv_tile_time`, `conv_split_input`): long convolutions cut along time, wide ones along channels.
#
# The cell builds the five (text, bytes) pairs and the graph's inputs for random codes (the codes packed for its
# embedding lookups, the transformer's mask and rope tables); `force` moves step 4's cuts to a tiny checkpoint's widths:

# %%
from qtts_lib.runtime.binding import rope
from qtts_lib.runtime.codec import cpu_form
from qtts_lib.runtime.codec.parts import pack_codes
from qtts_lib.runtime.rewrites import codec_cpu

poly_text, poly_data = codec_cpu.deconv_polyphase(text, data)
conv2d, deconv2d = codec_cpu.conv1d_as_conv2d, codec_cpu.deconv1d_as_deconv2d

if full:  # the widths the runtime tiles
    force = {"tiles_of": lambda c: 4 if c in cpu_form.TILE_SAMPLES else 0}
else:  # a tiny checkpoint's own widths
    force = {"part_of": lambda c: c // 2 if c >= 64 else 0,
             "tiles_of": lambda c: 4 if c in (32, 64) else 0}
steps = {"as exported": (text, data),
         "2-D kernels": (deconv2d(conv2d(text)), data),
         "+ polyphase upsampling": (deconv2d(conv2d(poly_text)), poly_data),
         "+ 3-D blobs, one square": codec_cpu.codec_rewritten(text, data),
         "+ cut along time and channels": codec_cpu.codec_fast_bin(text, data, **force)}
n_q, cb_size = st_cfg["num_quantizers"], st_cfg["codebook_size"]
codes = np.random.default_rng(9).integers(0, cb_size, (T, n_q))  # (T, 16)
cos, sin = rope.tables(st_cfg["head_dim"], st_cfg["rope_theta"], 0, T)
mask = rope.causal_mask(T, window=st_cfg["sliding_window"])
graph_inputs = (*pack_codes(codes, cb_size), mask, cos, sin)

# %% [markdown]
# Each graph is written to a scratch folder and run by the runtime's `Net` (`files=` swaps in those files, keeping
# the export's input and output names); its waveform is compared with the exported graph's by SNR, where 100 dB
# means float rounding only, and its time is the median of five calls:

# %%
import tempfile
import time
from pathlib import Path

from qtts_lib.runtime.binding.net import Net

scratch = Path(tempfile.mkdtemp())
ONE_D = ("Convolution1D", "Deconvolution1D", "ConvolutionDepthWise1D")
step_rows, step_wavs = [], {}
for i, (k, (t, b)) in enumerate(steps.items()):
    files = (scratch / f"step{i}.param", scratch / f"step{i}.bin")
    files[0].write_text(t), files[1].write_bytes(b)
    net = Net(ncnn_dir, "codec_decoder", THREADS, files=files)
    step_wavs[k] = net(*graph_inputs)[0].reshape(-1)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        net(*graph_inputs)
        times.append((time.perf_counter() - t0) / T * 1e3)
    n = Counter(lyr.type for lyr in parse_param(t).layers)
    step_rows.append({"step": k, "layers": n.total(), "1-D (de)convolutions":
                      sum(n[x] for x in ONE_D), "Deconvolution(1D)": n["Deconvolution"]
                      + n["Deconvolution1D"], "Reshape": n["Reshape"],
                      "ms per frame": round(float(np.median(times)), 3)})
    if k != "as exported":
        check.snr(f"codec CPU rewrite, {k}: wav vs the exported graph",
                  step_wavs[k], step_wavs["as exported"], 100.0)
display(pd.DataFrame(step_rows).set_index("step"))

# %% [markdown]
# Equal is the point of this table; the speed that counts is the full-size one (section 7). The runtime picks the
# tile count from each part's chunk (`cpu_form.TILE_SAMPLES`).
#
# ## 3. Upsample without the zeros: polyphase
# A transposed convolution with stride s inserts s - 1 zeros between input samples and convolves: most of its
# multiplications are by those zeros. Output phase r (every s-th sample, starting at r) only ever meets every s-th
# kernel tap, so it is a plain stride-1 convolution over the input with those taps. Stack the s phases as output
# channels, convolve once, interleave:

# %%
import inspect

print(inspect.getsource(codec_cpu.polyphase_weights))

# %% [markdown]
# Checked against PyTorch's transposed convolution on a small example: kernel size K = 2s, the output trimmed on the
# right by K - s samples as the codec's causal upsampling is; the phases' input padded on the left, so causal too:

# %%
import torch.nn.functional as F


def transposed_and_phases(w: np.ndarray, bias: np.ndarray, x: np.ndarray, s: int):
    """PyTorch's transposed convolution, trimmed as the codec's, the polyphase form
    interleaved, (1, out, T * s) both, and the phases before interleaving."""
    xt = torch.from_numpy(x)
    wt, bt = torch.from_numpy(w).transpose(0, 1), torch.from_numpy(bias)
    expected = F.conv_transpose1d(xt, wt, bt, stride=s)[..., :-s]
    wc, bc = codec_cpu.polyphase_weights(w, bias, s)  # (out * s, in, ceil(K / s))
    wc, bc = torch.from_numpy(wc), torch.from_numpy(bc)
    y = F.conv1d(F.pad(xt, (wc.shape[2] - 1, 0)), wc, bc)  # (1, out * s, T): the phases
    ours = y.reshape(1, w.shape[0], s, -1).transpose(2, 3).reshape(1, w.shape[0], -1)
    return expected.numpy(), ours.numpy(), y.numpy()


rng = np.random.default_rng(0)
out_c, in_c, s = 3, 4, 5
w = rng.standard_normal((out_c, in_c, 2 * s)).astype(np.float32)
bias = rng.standard_normal(out_c).astype(np.float32)
x = rng.standard_normal((1, in_c, 7)).astype(np.float32)
expected, ours, _ = transposed_and_phases(w, bias, x, s)
check.close("polyphase stride-1 conv + interleave == transposed conv (PyTorch)", ours,
            expected, rel=1e-6)
m = -(-w.shape[2] // s)  # taps per phase
print(f"multiply-adds per output sample: transposed {in_c * 2 * s} (most on zeros), "
      f"polyphase {in_c * m}")

# %% [markdown]
# The same with one channel in and out and a stride of 3, small enough to draw. Top, what the transposed convolution
# sees: the input with two zeros after each sample, and its six taps; bottom, its output, and each phase's output
# placed at every third sample:

# %%
import matplotlib.pyplot as plt

from qtts_lib import plots

s1 = 3
w1 = rng.standard_normal((1, 1, 2 * s1)).astype(np.float32)
x1 = rng.standard_normal((1, 1, 6)).astype(np.float32)
expected1, _, phases1 = transposed_and_phases(w1, np.zeros(1, np.float32), x1, s1)
plots.polyphase(x1.reshape(-1), w1.reshape(-1), s1, expected1.reshape(-1),
                phases1.reshape(s1, -1), title="a transposed convolution, its 3 phases")
plt.show()

# %% [markdown]
# ## 4. Keep the im2col matrix small: cut along time and channels
# ncnn's im2col + sgemm convolution first writes the whole im2col matrix (kernel × channels rows, one column per
# output sample), then the sgemm reads it back; for a long input it is far larger than the CPU's caches. Cut into time
# tiles, each with its few samples of left context from the one before, a causal convolution computes the same sums
# with a small matrix per tile (`conv_tile_time`); cut into groups of input channels whose partial sums are added, a
# wide one uses smaller weight matrices per GEMM (`conv_split_input`). One convolution's `.param` line, then its four
# tiles: a `Slice` along time; each tile's left context (the last samples of the tile before, `Crop`; zeros for the
# first, `Padding`) put in front by a `Concat`; four `Convolution`s (each its own copy of the weights); a `Concat`:

# %%
cut_text = steps["+ cut along time and channels"][0]
tiled = next(lyr.name for lyr in parse_param(cut_text).layers if "_tiles" in lyr.name)
one = tiled.split("_tiles")[0]


def layer_lines(t: str, keep) -> str:
    """The .param lines (after the two header lines) whose words `keep` accepts."""
    return "\n".join(ln for ln in t.splitlines()[2:] if keep(ln.split()))


CUT_TYPES = ("Slice", "Padding", "Crop", "Concat", "Convolution")
print(layer_lines(steps["+ 3-D blobs, one square"][0], lambda w: w[1] == one), "\n->")
print(layer_lines(cut_text, lambda w: w[1].startswith(one) and w[0] in CUT_TYPES))

# %% [markdown]
# ## 5. Cut the graph in parts, and measure how far back each part looks
# `codec_cpu.codec_fast_parts` cuts the rewritten graph in parts: part 0 (the codebooks and the pre_conv), part 1
# (the transformer), then one part per upsampling stage, each only causal convolutions that look a few input samples
# back; so each runs over chunks of a few frames (`codec.parts.run_parts`) and no decode holds a whole stage in memory.
# Each causal convolution keeps a state, the last input samples it read, as an extra input and output of the part's
# graph (`codec_cpu.stateful_convolutions`, as a KV cache keeps positions): no sample is computed twice.
#
# How far back is "a few"? That is the part's *left context* (its receptive field to the left); `codec.parts.reach`
# *measures* it when `codec.cpu_form` writes the parts: change one input sample, see which output samples change at
# all (bitwise); convolutions are shift-invariant, so one position tells it everywhere. On the last part (the highest
# rate; `last.up`: its output samples per input sample):

# %%
from qtts_lib.runtime.codec.decoder import Codec

fast_dir, desc = cpu_form.fast_graph(ncnn_dir, st_cfg)
runtime_form = Codec(ncnn_dir, st_cfg, THREADS)  # form="cpu": in parts, chunked
last = runtime_form.parts[-1]
codes4 = np.random.default_rng(2).integers(0, cb_size, (4, n_q))
x = runtime_form.transformer_output(codes4)
for part in runtime_form.parts[2:-1]:
    x = part(x)  # what the last part is fed for 4 frames
p = x.shape[-1] // 2
y0 = last(x)
x1 = np.where(np.arange(x.shape[-1]) == p, x + 1.0, x)  # input sample p bumped
changed = (last(x1) != y0).reshape(-1, y0.shape[-1]).any(axis=0)
first, final = np.flatnonzero(changed)[[0, -1]]
at = p * last.up  # the output sample the changed input lands on
fig, ax = plt.subplots(figsize=(9, 1.8), layout="tight")
shown = np.arange(at - 20, final + 40)
ax.plot(shown, changed[shown], drawstyle="steps-mid")
ax.axvline(at, color="crimson", ls="--", label=f"input {p} (x{last.up}: output {at})")
ax.set(xlabel="output sample",
       title=f"last codec part: changing input {p} changes outputs {first}..{final}")
ax.set_yticks([0, 1], ["same", "changed"])
ax.legend(fontsize=8)
check.equal("codec part is causal: nothing before the changed sample moves",
            "first changed output", int(first), at)
check.at_most("the measured reach is within the recorded context", "input samples",
              -(-(final - at) // last.up), desc["parts"][-1]["context"])

# %% [markdown]
# The check holds the measured reach within the context recorded for the part. What `cpu_form` recorded for every
# part; each chunk is long enough that its left context (which a part without states recomputes per chunk) is
# `cpu_form.PART_OVERHEAD` of it:

# %%
pd.DataFrame([{"part": k, "role": d["role"], "input samples per frame": d.get("spf", 1),
               "output samples per input sample": d.get("up", 1),
               "left context (input samples)": d.get("context", "KV cache"),
               "chunk (frames)": d.get("chunk_frames") or "all"}
              for k, d in enumerate(desc["parts"])]).set_index("part")

# %% [markdown]
# ## 6. Run the parts chunk by chunk
# The same codes through the exported graph, the parts over whole inputs and the parts chunk by chunk (the runtime):
# the waveforms compared by SNR, and the *fresh memory* each first decode touches (pages the process had never used,
# counted as minor page faults: each costs a kernel trap, slow on a VM).

# %%
import resource

whole_parts = Codec(ncnn_dir, st_cfg, THREADS)
for part in whole_parts.parts:
    part.chunk_frames = None
forms = {"as exported": Codec(ncnn_dir, st_cfg, THREADS, form="exported"),
         "parts, whole inputs": whole_parts, "parts, chunked (runtime)": runtime_form}
wavs, fresh_mb = {}, {}
for k, c in forms.items():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # pages touched first
    wavs[k] = c.decode_once(codes)
    fresh = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    fresh_mb[k] = fresh * resource.getpagesize() / 2**20
chunked = wavs["parts, chunked (runtime)"]
check.snr("codec parts (runtime) vs the exported graph (same codes)", chunked,
          wavs["as exported"], 100.0)
check.snr("codec parts: chunked vs whole inputs", chunked, wavs["parts, whole inputs"],
          120.0)

# %% [markdown]
# Equal; now the time of each, rounds alternating, beside the fresh memory measured above:

# %%
codec_ms = {k: [] for k in forms}
for _ in range(3 if full else 5):
    for k, c in forms.items():
        t0 = time.perf_counter()
        c.decode_once(codes)
        codec_ms[k].append((time.perf_counter() - t0) / T * 1e3)
pd.DataFrame({"ms per frame (median)": {k: round(float(np.median(v)), 2)
                                        for k, v in codec_ms.items()},
              f"fresh memory of the first {T}-frame decode (MB)":
              {k: round(v) for k, v in fresh_mb.items()}})

# %% [markdown]
# What chunking changes is memory: a whole stage grows with the number of frames, a chunk does not, so the first
# decode's fresh memory and a long one's peak stay bounded (section 7's committed file has them at full size). On a
# tiny checkpoint a chunk is microseconds of work and the extra calls dominate: chunked runs slower here.
#
# ## 7. Against PyTorch's codec, and against the machine's peak
# Two processes often differ more than two codecs do, so `bench.codec.codec_rounds` runs both in one process on the
# same random codes and threads, rounds alternating. Being compute-bound, the codec's other yardstick is the arithmetic
# peak: `codec_flops_per_frame` counts the reference decode's floating-point operations (PyTorch's `FlopCounterMode`,
# 2 per multiply-add), `peak_gflops` times a large matrix product at the same threads. Live, on this checkpoint:

# %%
from qtts_lib.bench.codec import codec_rounds

live = codec_rounds(model_dir, THREADS, frames=T, rounds=3 if full else 5,
                    progress=False)
check.at_least("codec alone: ncnn vs PyTorch on the same codes", "SNR dB",
               live["snr_ncnn_vs_pytorch_db"], 100.0)


def codec_row(run: dict) -> dict:
    """One row of the codec-alone table, from a run of `bench.codec.codec_rounds`."""
    return {"threads": run["threads"], "frames": run["frames"], "rounds": run["rounds"],
            **{f"{k} ms/frame": v for k, v in run["median_ms_per_frame"].items()},
            "ncnn / PyTorch": run["ratio_ncnn_pytorch"],
            "GFLOP/frame": run["gflop_per_frame"], "peak GFLOP/s": run["peak_gflops"],
            **{f"{k} of peak": v for k, v in run["fraction_of_peak"].items()},
            **{f"{k} first decode fresh MB": v
               for k, v in run["first_decode_fresh_mb"].items()}}


pd.DataFrame([codec_row(live)], index=[ckpt])

# %% [markdown]
# At full size, on the reference machine of chapter 11 (`python -m qtts_lib.bench codec`, committed):

# %%
ref = json.loads((paths.DATA / "bench/codec/dev-2core-epyc-full-base.json").read_text())
m = ref["machine"]
print(f"{ref['checkpoint']} on {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB")
committed = pd.DataFrame([codec_row(run) for run in ref["runs"]]).set_index("threads")
display(committed)
check.at_most("full size, reference machine: the codec's CPU form vs PyTorch "
              "(median of both thread counts)", "time ratio",
              float(committed["ncnn / PyTorch"].median()), 1.0)

# %% [markdown]
# ## Summary
# - Each CPU rewrite of the codec is a pure function of the graph's text (and bytes), checked equal to the exported
#   graph: 2-D kernels, polyphase upsampling (the same sums, none on zeros), 3-D blobs, time tiles, channel splits.
# - The graph runs in parts, chunk by chunk, each convolution keeping its state; each part's left context is
#   *measured* (`codec.parts.reach`): the same waveform, bounded memory. `codec.cpu_form` writes it under
#   `ncnn/fast/`; the runtime decodes with it on the CPU. At full size it beats PyTorch's codec, near the peak.
#
# **Artifacts left:** `models/<ckpt>/ncnn/fast/`, the chapter report.
#
# **If your numbers differ**
# - *A rewrite step below 100 dB* → a rewrite met a layer variant it does not handle (dilation, a fused activation,
#   a padding mode): compare that step's `.param` lines with the previous step's.
# - *"the output does not depend causally on its input" when the parts are written* → a part is not causal:
#   the cut points (`codec_cpu.codec_cut_layers`) no longer fall at the upsampling stages.
# - *Chunked vs whole below 120 dB* → a part's recorded context is too short: delete `ncnn/fast/`, run again.
# - *The CPU form slower than PyTorch at full size* → the tile and split thresholds (`cpu_form.TILE_SAMPLES`,
#   `codec_cpu.split_part`) are tuned to one CPU's caches; time the steps of section 2 on yours.

# %%
check.table()
