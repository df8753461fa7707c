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
# **You will:** rewrite the exported codec graph step by step (2-D kernels, polyphase upsampling, fewer reshapes,
# long convolutions cut along time and wide ones along channels), check every step equal to the exported graph and
# time it; cut the graph in parts, **measure** how far back each part looks, and run the parts chunk by chunk; then
# hold the result against PyTorch's codec and the machine's peak.
#
# **You will learn:** that a graph rewrite is a pure function of the `.param` text (and of the `.bin` when weights
# move); why polyphase upsampling does no work on inserted zeros; why time tiles keep ncnn's im2col matrix small; how
# to measure a receptive field instead of adding up kernel sizes; why chunking changes memory, not speed.
#
# **You need:** `models/<ckpt>/ncnn/codec_decoder.*` (chapter 04; exported here if missing). Timings on `tiny-*`
# mean little (overhead dominates); the full-size numbers are the committed ones (`data/bench/codec/`).
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
# pnnx wrote the codec as 1-D layers: `Convolution1D` for every convolution, `Deconvolution1D` for each upsampling
# stage (a strided transposed convolution), `ConvolutionDepthWise1D` in the ConvNeXt upsampler. On x86, ncnn's 1-D
# layers have no packed GEMM path, while its 2-D `Convolution` has im2col + sgemm and packed direct kernels. The
# layer types of the graph:

# %%
from collections import Counter

from qtts_lib.runtime.binding.param import parse_param

text = (ncnn_dir / "codec_decoder.param").read_text()
data = (ncnn_dir / "codec_decoder.bin").read_bytes()
types = Counter(lyr.type for lyr in parse_param(text).layers)
display(pd.Series(dict(types.most_common(12)), name="layers").to_frame().T)

# %% [markdown]
# ## 2. Rewrite it step by step, each step equal
# Every rewrite in `runtime.rewrites.codec_cpu` takes the graph's text (and bytes) and returns an equivalent graph:
# `conv1d_as_conv2d` / `deconv1d_as_deconv2d` (the same weights as a 2-D layer of kernel height 1 between two
# Reshapes, a zero left padding folded into its `pad_left`); `deconv_polyphase` (each upsampling transposed
# convolution as a stride-1 convolution over `stride` phases, interleaved: new weights, section 3); `keep_3d` and
# `self_mul_as_square` (no Reshape pairs between consecutive convolutions, Snake's `sin(x)·sin(x)` one square);
# `conv_split_input` / `conv_tile_time` (wide convolutions cut along input channels, long ones along time: section 4).
# Each step below is the previous one plus one more rewrite. First the five graphs, as (text, bytes) pairs, and
# the graph's inputs for one set of random codes; `force` picks where the last step cuts (see below the table):

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
# Each graph runs on those inputs through `Net(..., files=...)` (the export's inputs and outputs, another
# graph), its waveform compared with the exported graph's, and its time taken (median of five calls):

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
    kinds = Counter(lyr.type for lyr in parse_param(t).layers)
    step_rows.append({"step": k, "layers": sum(kinds.values()),
                      "1-D (de)convolutions": sum(kinds[x] for x in ONE_D),
                      "Deconvolution(1D)": kinds["Deconvolution"]
                      + kinds["Deconvolution1D"],
                      "Reshape": kinds["Reshape"],
                      "ms per frame": round(float(np.median(times)), 3)})
    if k != "as exported":
        check.snr(f"codec CPU rewrite, {k}: wav vs the exported graph",
                  step_wavs[k], step_wavs["as exported"], 100.0)
display(pd.DataFrame(step_rows).set_index("step"))

# %% [markdown]
# The last step cuts four time tiles per convolution of the widths the runtime tiles (`cpu_form.TILE_SAMPLES`; the
# runtime's count follows each part's chunk) and splits channels where `codec_cpu.split_part` says, both tuned to the
# full-size codec's widths; on a tiny checkpoint `force` cuts at its own widths. Equal is the point of this table:
# the speed that counts is the full-size one (section 7).
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
# Checked against PyTorch's transposed convolution on a small example (kernel 2s, trimmed on the right by K - s as
# the codec's causal upsampling is):

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
# The same with one channel in and one out and a stride of 3, small enough to draw (the codec's strides are larger;
# the picture is the same). Top, what the transposed convolution sees: the input with two zeros stuffed after each
# sample, and its six taps; bottom, its output, and each phase's stride-1 output placed at every third sample:

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
# output sample), then the sgemm reads it back; for a long input it is far larger than the caches. Cut into time
# tiles, each with its few samples of left context from the one before, a causal convolution computes the same sums
# with a small matrix per tile (`conv_tile_time`); cut into groups of input channels whose partial sums are added, a
# wide one uses smaller weight matrices per GEMM (`conv_split_input`). One convolution before and after four tiles:

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
# (the transformer), then one part per upsampling stage. After the transformer every part is causal convolutions that
# look only a few input samples back, so each runs over chunks of a few frames (`codec.parts.run_parts`) and a decode
# of any length never holds a whole stage in memory. Each causal convolution keeps a state, the last input samples it
# read, in and out of the part's graph (`codec_cpu.stateful_convolutions`, as a KV cache keeps positions), so no
# sample is computed twice, which matters once the chunks are one frame (chapter 15).
#
# How far back is "a few samples"? `codec.parts.reach` *measures* it when `codec.cpu_form` writes the parts: change
# one input sample and see which output samples change at all (bitwise); convolutions are shift-invariant, so one
# position tells the reach everywhere. The experiment on the last part (the highest rate):

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
x1 = x.copy()
x1[..., p] += 1.0
changed = (last(x1) != y0).reshape(-1, y0.shape[-1]).any(axis=0)
first, final = np.flatnonzero(changed)[[0, -1]]
at = p * last.up  # the output sample the changed input lands on
fig, ax = plt.subplots(figsize=(9, 1.8))
shown = np.arange(at - 20, final + 40)
ax.plot(shown, changed[shown], drawstyle="steps-mid")
ax.axvline(at, color="crimson", ls="--", label=f"input {p} (x{last.up}: output {at})")
ax.set(xlabel="output sample",
       title=f"last codec part: changing input {p} changes outputs {first}..{final}")
ax.set_yticks([0, 1], ["same", "changed"])
ax.legend(fontsize=8)
fig.tight_layout()
check.equal("codec part is causal: nothing before the changed sample moves",
            "first changed output", int(first), at)
check.at_most("the measured reach is within the recorded context", "input samples",
              -(-(final - at) // last.up), desc["parts"][-1]["context"])

# %% [markdown]
# What was recorded for every part when `cpu_form` wrote them:

# %%
pd.DataFrame([{"part": k, "role": d["role"], "input samples per frame": d.get("spf", 1),
               "output samples per input sample": d.get("up", 1),
               "left context (input samples)": d.get("context", "KV cache"),
               "chunk (frames)": d.get("chunk_frames") or "all"}
              for k, d in enumerate(desc["parts"])]).set_index("part")

# %% [markdown]
# Each part's chunk is as long as makes its left context cost `cpu_form.PART_OVERHEAD` of the chunk's work.
#
# ## 6. Run the parts chunk by chunk
# The same codes through the exported graph, the parts over whole inputs and the parts chunk by chunk (the runtime):
# the waveforms compared, and the fresh memory each first decode touches (pages new to the process: slow on a VM).

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
# tiny checkpoint a chunk is microseconds of work and the extra calls dominate, so chunked runs slower here.
#
# ## 7. Against PyTorch's codec, and against the machine's peak
# The spread between two processes is often larger than the difference between two codecs, so
# `bench.codec.codec_rounds` runs both codecs in one process on the same random codes and threads, rounds alternating
# which goes first. The codec is compute-bound, so its other yardstick is the machine's arithmetic peak:
# `codec_flops_per_frame` counts the reference decode's floating-point operations (PyTorch's `FlopCounterMode`, 2 per
# multiply-add), `peak_gflops` times a large matrix product at the same threads. Live, on this checkpoint:

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
# - Each CPU rewrite of the codec is a pure function of the graph's text (and bytes where weights move), checked
#   equal to the exported graph: 2-D kernels, polyphase upsampling, 3-D blobs, time tiles, channel splits.
# - Polyphase upsampling is a stride-1 convolution over the phases, interleaved: the same sums, none on zeros.
# - The graph runs in parts, chunk by chunk, each convolution keeping its state; each part's left context is
#   *measured* (`codec.parts.reach`): the same waveform, bounded memory.
# - `codec.cpu_form` writes the result once under `ncnn/fast/`; the runtime decodes with it on the CPU, and chapters
#   07 and 08 hold token and waveform parity through it.
# - At full size the CPU form is faster than PyTorch's codec on the reference machine, near its arithmetic peak.
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
