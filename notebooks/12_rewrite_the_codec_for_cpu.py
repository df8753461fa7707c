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
# **You will:** rewrite the exported codec graph step by step (1-D convolutions as 2-D ones, transposed convolutions
# as polyphase stride-1 convolutions, fewer reshapes, long convolutions cut along time and wide ones along channels),
# check every step equal to the exported graph and time it; cut the graph in parts, **measure** how far back each
# part looks, and run the parts chunk by chunk; then hold the result against PyTorch's codec and the machine's peak.
#
# **You will learn:** that a graph rewrite is a pure function of the `.param` text (and, when weights move, of the
# `.bin`); why polyphase upsampling does no work on inserted zeros; why cutting along time keeps ncnn's im2col
# matrix small; how to measure a receptive field instead of adding up kernel sizes; why chunking changes memory, not
# speed.
#
# **You need:** `models/<ckpt>/ncnn/codec_decoder.*` (chapter 04; exported here if missing). Timings on `tiny-*`
# mean little (overhead dominates); the full-size numbers are the committed ones (`data/bench/codec/`).
# **Leaves behind:** `models/<ckpt>/ncnn/fast/` (the codec's CPU form, in parts),
# `data/reports/<ckpt>/12_rewrite_the_codec_for_cpu.json`.

# %%
import inspect
import json
import resource
import tempfile
import time
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench.codec import codec_rounds
from qtts_lib.runtime.binding import rope
from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.codec import cpu_form
from qtts_lib.runtime.codec.decoder import Codec
from qtts_lib.runtime.codec.parts import pack_codes
from qtts_lib.runtime.rewrites import codec_cpu

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("12_rewrite_the_codec_for_cpu", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)
ncnn_dir = paths.ncnn_dir(ckpt)
st_cfg = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
full = ckpt.startswith("full") or not ckpt.startswith("tiny")
T = 100 if full else 40  # frames per decode in the timings below

# %% [markdown]
# ## 1. Read the exported graph
# pnnx wrote the codec as 1-D layers: `Convolution1D` for every convolution, `Deconvolution1D` for each upsampling
# stage (a strided transposed convolution), `ConvolutionDepthWise1D` in the ConvNeXt upsampler. On x86, ncnn's 1-D
# layers have no packed GEMM path, while its 2-D `Convolution` has im2col + sgemm and packed direct kernels. The
# layer types of the graph:

# %%
text, data = (ncnn_dir / "codec_decoder.param").read_text(), (ncnn_dir / "codec_decoder.bin").read_bytes()
types = Counter(lyr.type for lyr in parse_param(text).layers)
display(pd.Series(dict(types.most_common(12)), name="layers").to_frame().T)

# %% [markdown]
# ## 2. Rewrite it step by step, each step equal
# Every rewrite in `runtime.rewrites.codec_cpu` takes the graph's text (and bytes) and returns an equivalent graph:
# - `conv1d_as_conv2d` / `deconv1d_as_deconv2d`: the same weight bytes as a 2-D layer with kernel height 1 between
#   two Reshapes (a zero left padding in front is folded into the layer's own `pad_left`);
# - `deconv_polyphase`: each upsampling transposed convolution as a stride-1 convolution over `stride` phases,
#   interleaved afterwards (new weights, section 3);
# - `keep_3d` and `self_mul_as_square`: the Reshape pairs between consecutive convolutions dropped (blobs stay 3-D),
#   and Snake's `sin(x)·sin(x)` as one in-place square;
# - `conv_split_input` / `conv_tile_time`: wide convolutions cut along input channels, long ones along time
#   (section 4).
#
# Each step below is the previous one plus one more rewrite; each runs on the same random codes through
# `Net(..., files=...)` (the export's inputs and outputs, another graph), its waveform compared with the exported
# graph's, and its time taken (median of five calls).

# %%
poly_text, poly_data = codec_cpu.deconv_polyphase(text, data)
force = ({"tiles_of": lambda c: 4 if c in cpu_form.TILE_SAMPLES else 0} if full  # the widths the runtime tiles
         else {"part_of": lambda c: c // 2 if c >= 64 else 0, "tiles_of": lambda c: 4 if c in (32, 64) else 0})
steps = {"as exported": (text, data),
         "2-D kernels": (codec_cpu.deconv1d_as_deconv2d(codec_cpu.conv1d_as_conv2d(text)), data),
         "+ polyphase upsampling": (codec_cpu.deconv1d_as_deconv2d(codec_cpu.conv1d_as_conv2d(poly_text)), poly_data),
         "+ 3-D blobs, one square": codec_cpu.codec_rewritten(text, data),
         "+ cut along time and channels": codec_cpu.codec_fast_bin(text, data, **force)}
codes = np.random.default_rng(9).integers(0, st_cfg["codebook_size"], (T, st_cfg["num_quantizers"]))
semantic, acoustic = pack_codes(codes, st_cfg["codebook_size"])
cos, sin = rope.tables(st_cfg["head_dim"], st_cfg["rope_theta"], 0, T)
graph_inputs = (semantic, acoustic, rope.causal_mask(T, window=st_cfg["sliding_window"]), cos, sin)
scratch = Path(tempfile.mkdtemp())
step_rows, step_wavs = [], {}
for k, (t, b) in steps.items():
    files = (scratch / f"step{len(step_rows)}.param", scratch / f"step{len(step_rows)}.bin")
    files[0].write_text(t)
    files[1].write_bytes(b)
    net = Net(ncnn_dir, "codec_decoder", THREADS, files=files)
    step_wavs[k] = net(*graph_inputs)[0].reshape(-1)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        net(*graph_inputs)
        times.append((time.perf_counter() - t0) / T * 1e3)
    kinds = Counter(lyr.type for lyr in parse_param(t).layers)
    step_rows.append({"step": k, "layers": sum(kinds.values()), "1-D (de)convolutions": sum(
        kinds[x] for x in ("Convolution1D", "Deconvolution1D", "ConvolutionDepthWise1D")),
        "Deconvolution(1D)": kinds["Deconvolution"] + kinds["Deconvolution1D"], "Reshape": kinds["Reshape"],
        "ms per frame": round(float(np.median(times)), 3)})
    if k != "as exported":
        check.snr(f"codec CPU rewrite, {k}: wav vs the exported graph", step_wavs[k], step_wavs["as exported"], 100.0)
display(pd.DataFrame(step_rows).set_index("step"))

# %% [markdown]
# The last step cuts four time tiles per convolution of the widths the runtime tiles (`cpu_form.TILE_SAMPLES`; in
# the runtime the count follows each part's chunk) and splits channels where `codec_cpu.split_part` says. Both are
# tuned to the full-size codec's widths, which a tiny checkpoint lacks, so on it `force` cuts at its own widths to
# show them equal. Equal is the point of this table: the speed that counts is the full-size one (section 7).
#
# ## 3. Upsample without the zeros: polyphase
# A transposed convolution with stride s inserts s - 1 zeros between input samples and convolves: most of its
# multiplications are by those zeros. Output phase r (every s-th sample, starting at r) only ever meets every s-th
# kernel tap, so it is a plain stride-1 convolution over the input with those taps. Stack the s phases as output
# channels, convolve once, interleave:

# %%
print(inspect.getsource(codec_cpu.polyphase_weights))

# %% [markdown]
# Checked against PyTorch's own transposed convolution on a small example (kernel 2s, the right trim of K - s that
# the codec's causal upsampling applies):

# %%
rng = np.random.default_rng(0)
out_c, in_c, s = 3, 4, 5
w, bias = rng.standard_normal((out_c, in_c, 2 * s)).astype(np.float32), rng.standard_normal(out_c).astype(np.float32)
x = torch.from_numpy(rng.standard_normal((1, in_c, 7)).astype(np.float32))
expected = F.conv_transpose1d(x, torch.from_numpy(w).transpose(0, 1), torch.from_numpy(bias), stride=s)[..., :-s]
wc, bc = codec_cpu.polyphase_weights(w, bias, s)  # (out * s, in, m) with m = ceil(K / s) taps
y = F.conv1d(F.pad(x, (wc.shape[2] - 1, 0)), torch.from_numpy(wc), torch.from_numpy(bc))  # (1, out * s, T)
ours = y.reshape(1, out_c, s, -1).transpose(2, 3).reshape(1, out_c, -1)  # interleave the phases
check.close("polyphase stride-1 conv + interleave == transposed conv (PyTorch)", ours.numpy(), expected.numpy(),
            rel=1e-6)
print(f"multiply-adds per output sample: transposed {in_c * 2 * s} (most on zeros), polyphase {in_c * wc.shape[2]}")

# %% [markdown]
# ## 4. Keep the im2col matrix small: cut along time and channels
# ncnn's im2col + sgemm convolution first writes the whole im2col matrix (kernel × channels rows, one column per
# output sample), then the sgemm reads it back. For a long input that matrix is far larger than the caches. A causal
# convolution cut into time tiles, each with its few samples of left context from the previous tile, computes the
# same sums with a small matrix per tile (`conv_tile_time`); a convolution with many input channels cut into groups
# of channels whose partial sums are added computes them with smaller weight matrices per GEMM (`conv_split_input`).
# One convolution of the graph before and after a cut into four tiles:

# %%
cut_text = steps["+ cut along time and channels"][0]
one = next(lyr.name for lyr in parse_param(cut_text).layers if "_tiles" in lyr.name).split("_tiles")[0]
layer_lines = lambda t, keep: "\n".join(ln for ln in t.splitlines()[2:] if keep(ln.split()))  # noqa: E731
print(layer_lines(steps["+ 3-D blobs, one square"][0], lambda w: w[1] == one), "\n->")
print(layer_lines(cut_text, lambda w: w[1].startswith(one) and w[0] in ("Slice", "Padding", "Crop", "Concat",
                                                                         "Convolution")))

# %% [markdown]
# ## 5. Cut the graph in parts, and measure how far back each part looks
# `codec_cpu.codec_fast_parts` cuts the rewritten graph in parts: part 0 (the codebooks and the pre_conv), part 1
# (the transformer), then one part per upsampling stage (the ConvNeXt upsampler's, then the decoder's). The stages
# after the transformer are causal convolutions that look only a few input samples back, so each can run over chunks
# of a few frames (`codec.parts.run_parts`), and a decode of any length never holds a whole stage in memory. A chunk
# can carry that much left context, computed again; the runtime instead gives every causal convolution a state, the
# last input samples it read, in and out of the part's graph (`rewrites.codec_cpu.stateful_convolutions`, as a KV
# cache keeps positions), so no sample is computed twice, which matters once the chunks are one frame (chapter 15).
#
# How far back is "a few samples"? Rather than adding up kernel sizes and dilations by hand, `codec.parts.reach`
# *measures* it when `codec.cpu_form` writes the parts: change one input sample and see which output samples change
# at all (bitwise). Convolutions are shift-invariant, so one position tells the reach everywhere. The experiment on
# the last part (the highest rate), and what was recorded for every part:

# %%
fast_dir, desc = cpu_form.fast_graph(ncnn_dir, st_cfg)
runtime_form = Codec(ncnn_dir, st_cfg, THREADS)  # on the CPU: form="cpu", in parts, chunked
last = runtime_form.parts[-1]
x = runtime_form.transformer_output(np.random.default_rng(2).integers(0, st_cfg["codebook_size"], (4, 16)))
for part in runtime_form.parts[2:-1]:
    x = part(x)  # what the last part is fed for 4 frames
p = x.shape[-1] // 2
y0 = last(x)
x1 = x.copy()
x1[..., p] += 1.0
changed = (last(x1) != y0).reshape(-1, y0.shape[-1]).any(axis=0)
first, final = np.flatnonzero(changed)[[0, -1]]
fig, ax = plt.subplots(figsize=(9, 1.8))
lo = p * last.up - 20
ax.plot(np.arange(lo, final + 40), changed[lo:final + 40], drawstyle="steps-mid")
ax.axvline(p * last.up, color="crimson", ls="--", lw=1, label=f"input sample {p} (x{last.up} = output {p * last.up})")
ax.set(xlabel="output sample", title=f"last codec part: changing input sample {p} changes outputs {first}..{final}")
ax.set_yticks([0, 1], ["same", "changed"])
ax.legend(fontsize=8)
fig.tight_layout()
check.equal("codec part is causal: nothing before the changed sample moves", "first changed output",
            int(first), p * last.up)
check.at_most("the measured reach is within the recorded context", "input samples",
              -(-(final - p * last.up) // last.up), desc["parts"][-1]["context"])
pd.DataFrame([{"part": k, "role": d["role"], "input samples per frame": d.get("spf", 1),
               "output samples per input sample": d.get("up", 1),
               "left context (input samples)": d.get("context", "KV cache"),
               "chunk (frames)": d.get("chunk_frames") or "all"}
              for k, d in enumerate(desc["parts"])]).set_index("part")

# %% [markdown]
# Each part's chunk is as long as makes its left context cost `cpu_form.PART_OVERHEAD` of the chunk's work.
#
# ## 6. Run the parts chunk by chunk
# The same codes through the exported graph, through the parts over whole inputs, and through the parts chunk by
# chunk (what the runtime runs): the waveforms compared, then the time and the fresh memory each first decode
# touches (the first decode in a process pays for every page it touches for the first time; on a VM that is slow).

# %%
whole_parts = Codec(ncnn_dir, st_cfg, THREADS)
for part in whole_parts.parts:
    part.chunk_frames = None
forms = {"as exported": Codec(ncnn_dir, st_cfg, THREADS, form="exported"),
         "parts, whole inputs": whole_parts, "parts, chunked (runtime)": runtime_form}
wavs, fresh_mb = {}, {}
for k, c in forms.items():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wavs[k] = c.decode_once(codes)
    fresh_mb[k] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / 2**20
check.snr("codec parts (runtime) vs the exported graph (same codes)", wavs["parts, chunked (runtime)"],
          wavs["as exported"], 100.0)
check.snr("codec parts: chunked vs whole inputs", wavs["parts, chunked (runtime)"], wavs["parts, whole inputs"],
          120.0)
codec_ms = {k: [] for k in forms}
for _ in range(3 if full else 5):
    for k, c in forms.items():
        t0 = time.perf_counter()
        c.decode_once(codes)
        codec_ms[k].append((time.perf_counter() - t0) / T * 1e3)
pd.DataFrame({"ms per frame (median)": {k: round(float(np.median(v)), 2) for k, v in codec_ms.items()},
              f"fresh memory of the first {T}-frame decode (MB)": {k: round(v) for k, v in fresh_mb.items()}})

# %% [markdown]
# What chunking changes is memory: a whole stage grows with the number of frames, a chunk does not, so the fresh
# memory of a first decode and the peak of a long one stay bounded (the committed file of section 7 records the first
# decode's fresh memory at full size). Its cost is the left context computed again per chunk, which the chunk length
# holds near `cpu_form.PART_OVERHEAD` of the work; on a tiny checkpoint a chunk is microseconds of work and the extra
# calls dominate instead, so chunked runs slower here.
# Chapter 15 runs the same parts incrementally to stream without decoding anything twice.
#
# ## 7. Against PyTorch's codec, and against the machine's peak
# A generation run decodes once per process, and the spread between two processes is often larger than the
# difference between two codecs. `bench.codec.codec_rounds` holds everything else still: both codecs in this process,
# the same random codes and threads, rounds alternating which goes first. The codec is compute-bound, so besides
# PyTorch its yardstick is the machine's arithmetic peak: `codec_flops_per_frame` counts the reference decode's
# floating-point operations (PyTorch's `FlopCounterMode`, 2 per multiply-add) and `peak_gflops` times a large matrix
# product at the same threads. Live, on this checkpoint:

# %%
live = codec_rounds(model_dir, THREADS, frames=T, rounds=3 if full else 5, progress=False)
check.at_least("codec alone: ncnn vs PyTorch on the same codes", "SNR dB", live["snr_ncnn_vs_pytorch_db"], 100.0)


def codec_row(run: dict) -> dict:
    """One row of the codec-alone table, from a run of `bench.codec.codec_rounds`."""
    return {"threads": run["threads"], "frames": run["frames"], "rounds": run["rounds"],
            **{f"{k} ms/frame": v for k, v in run["median_ms_per_frame"].items()},
            "ncnn / PyTorch": run["ratio_ncnn_pytorch"], "GFLOP/frame": run["gflop_per_frame"],
            "peak GFLOP/s": run["peak_gflops"], **{f"{k} of peak": v for k, v in run["fraction_of_peak"].items()},
            **{f"{k} first decode fresh MB": v for k, v in run["first_decode_fresh_mb"].items()}}


pd.DataFrame([codec_row(live)], index=[ckpt])

# %% [markdown]
# At full size, on the reference machine of chapter 11 (`python -m qtts_lib.bench codec`, committed):

# %%
ref = json.loads((paths.DATA / "bench" / "codec" / "dev-2core-epyc-full-base.json").read_text())
m = ref["machine"]
print(f"{ref['checkpoint']} on {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB")
committed = pd.DataFrame([codec_row(run) for run in ref["runs"]]).set_index("threads")
display(committed)
check.at_most("full size, reference machine: the codec's CPU form vs PyTorch (median of both thread counts)",
              "time ratio", float(committed["ncnn / PyTorch"].median()), 1.0)

# %% [markdown]
# ## Summary
# - Each CPU rewrite of the codec is a pure function of the graph's text (and bytes where weights move), checked
#   equal to the exported graph on the same codes: 2-D kernels, polyphase upsampling, 3-D blobs, time tiles and
#   channel splits (`runtime.rewrites.codec_cpu`).
# - Polyphase upsampling is a stride-1 convolution over the phases, interleaved: the same sums, none on zeros.
# - The graph runs in parts; each upsampling part's left context is *measured* (`codec.parts.reach`), sizes its
#   chunks, and the parts run chunk by chunk, each convolution keeping its state (`codec.parts.run_parts`): the same
#   waveform, bounded memory.
# - `codec.cpu_form` writes the result once under `ncnn/fast/` (rewritten when the exports change); it is what the
#   runtime decodes with on the CPU, and chapters 06-08 hold token and waveform parity through it.
# - At full size the CPU form is faster than PyTorch's codec on the reference machine, near its arithmetic peak.
#
# **Artifacts left:** `models/<ckpt>/ncnn/fast/`, the chapter report.
#
# **If your numbers differ**
# - *A rewrite step below 100 dB* → a rewrite met a layer variant it does not handle (dilation, a fused
#   activation, a padding mode): compare that step's `.param` lines with the previous step's for the layer.
# - *"the output does not depend causally on its input" when the parts are written* → a part is not causal:
#   the cut points (`codec_cpu.codec_cut_layers`) no longer fall at the upsampling stages.
# - *Chunked vs whole below 120 dB* → a part's recorded context is too short; delete `ncnn/fast/` to measure again.
# - *The CPU form slower than PyTorch at full size* → the tile and split thresholds (`cpu_form.TILE_SAMPLES`,
#   `codec_cpu.split_part`) are tuned to one CPU's caches; time the steps of section 2 on yours.

# %%
check.table()
