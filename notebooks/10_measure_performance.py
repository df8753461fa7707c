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
# # 10 · Measure performance honestly
# > Side by side in one run, medians of interleaved repeats, and against what the memory bus allows.
#
# **You will:** describe the machine (CPU, cores, memory, read bandwidth measured now); count the bytes of weights
# one frame must read and turn them into a floor no fp32 runtime can beat; run the benchmark harness
# (`qtts_lib.bench`: `python -m qtts_lib.bench loop`, `make bench`) on the current checkpoint — PyTorch and the ncnn
# runtime in fresh processes, repeats interleaved; then read the committed full-size results of named machines in
# `data/bench/`.
#
# **You will learn:** why the generation loop is memory-bound and the codec compute-bound; how to report speed so
# that it means something (medians, ratios from one run, the machine and its load); where ncnn's time goes.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip.
# Timings on `tiny-*` mean little (microseconds of work per call; overhead dominates) — the full-size numbers
# are the committed ones. **Leaves behind:** `data/outputs/<ckpt>/10_bench.json`,
# `data/reports/<ckpt>/10_measure_performance.json`.

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench.codec import codec_rounds
from qtts_lib.bench.loop import benchmark
from qtts_lib.bench.machine import describe
from qtts_lib.bench.results import check_schema
from qtts_lib.bench.workload import weight_bytes_per_frame

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("10_measure_performance", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
del tts  # the harness loads each runtime in its own process
full = ckpt.startswith("full") or not ckpt.startswith("tiny")
FRAMES, REPEATS = (40, 3) if full else (8, 1)
thread_counts = sorted({1, THREADS})

# %% [markdown]
# ## 1. Describe the machine
# A number without its machine is not a result. `bench.machine.describe` reads the CPU model, cores, memory, the load
# average and the versions, and **measures** the streaming-read bandwidth at each thread count: threads take the max
# of their slice of a 1 GiB array (numpy releases the GIL inside the reduction), median of five passes.

# %%
machine = describe(thread_counts)
pd.Series(machine, dtype=object).to_frame("this machine")

# %% [markdown]
# ## 2. Count the bytes a frame must read: the floor
# Each generated frame runs the talker once and the code predictor 15 times (one step per codebook 1..15), and a
# decode step at batch 1 reads every weight of the graph it runs. So the weights read per frame are the talker
# decoder and its codec head, plus 15 × (the predictor decoder and one of its 15 heads). Divided by the measured
# read bandwidth, that is the time no fp32 runtime can beat on this machine. We count the bytes from the `.bin`
# files and, independently, from the parameter counts in `config.json`:

# %%
cfg = checkpoint.load_config(ckpt)["talker_config"]
pred = cfg["code_predictor_config"]


def decoder_params(c: dict, hidden_in: int) -> int:
    h, hd, heads, kv, inter = (c["hidden_size"], c["head_dim"], c["num_attention_heads"],
                               c["num_key_value_heads"], c["intermediate_size"])
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd  # q, k, v, o, q/k norms
    mlp = 3 * h * inter
    return c["num_hidden_layers"] * (attn + mlp + 2 * h) + h


h, ph = cfg["hidden_size"], pred["hidden_size"]
proj = h * ph + ph if ph != h else 0  # small_to_mtp_projection when the widths differ
from_config = 4 * (decoder_params(cfg, h) + h * cfg["vocab_size"]
                   + 15 * (decoder_params(pred, h) + proj + ph * pred["vocab_size"]))
from_files = weight_bytes_per_frame(paths.ncnn_dir(ckpt))
print(f"weights read per frame: {from_files / 1e9:.3f} GB from the .bin files, "
      f"{from_config / 1e9:.3f} GB from config.json")
check.at_most("weight bytes per frame: .bin files vs config.json", "rel",
              abs(from_files - from_config) / from_config, 0.01)
floors = {t: from_files / (machine["read_bandwidth_gbs"][str(t)] * 1e9) * 1e3 for t in thread_counts}
pd.DataFrame({"read bandwidth GB/s": machine["read_bandwidth_gbs"], "floor ms/frame": {str(t): round(f, 1) for t, f
                                                                                        in floors.items()}})

# %% [markdown]
# The codec is the other half of the time and a different kind of work: a stack of convolutions over 1920 samples
# per frame, compute-bound. Its yardstick is PyTorch's codec on the same codes and threads.
#
# ## 3. Run the harness
# `bench.loop.benchmark(model_dir, frames, thread_counts, repeats)` runs every (runtime, threads) pair in a fresh
# Python (`bench.child`: its own load and peak memory, no thread pool left over from the other runtime), repeat 1 of
# all pairs, then repeat 2, ... and reports medians per frame: talker (decoder step, head, sampling), predictor (15
# steps), codec (decoding the frames made), plus prefill, model load, real-time factor (RTF: seconds of compute per
# second of audio; below 1 is faster than real time) and peak resident memory. Both sides speak one prompt,
# `bench.workload`'s (an x-vector clone of the committed voice clip, greedy, at most `frames` frames), and the ncnn
# side runs the product's own `Synthesizer.synthesize`. `make bench` (`python -m qtts_lib.bench loop`) runs the same
# function on `full-base` and writes `data/bench/<machine>.json`.

# %%
result = benchmark(model_dir, FRAMES, thread_counts, REPEATS, progress=False)
check_schema(result)
out = paths.outputs_dir(ckpt) / "10_bench.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(result, indent=1))
check.equal("harness result has the data/bench schema", "rows", len(result["rows"]), 2 * len(thread_counts))
check.equal("both runtimes made the same number of frames", "frames",
            len({r["frames"] for r in result["raw"]}), 1)


def table(res: dict) -> pd.DataFrame:
    rows = [{"runtime": r["runtime"], "device": r["device"], "precision": r["precision"], "threads": r["threads"],
             **{f"{k} ms": v for k, v in r["ms_per_frame"].items()}, "prefill ms": r["prefill_ms"], "RTF": r["rtf"],
             "floor ms": r["floor_ms_per_frame"], "loop / floor": r["floor_ratio"], "peak GB": r["peak_rss_gb"],
             "codec warm ms": r.get("codec_warm_ms_per_frame")}
            for r in res["rows"]]
    return pd.DataFrame(rows).sort_values(["threads", "runtime"]).reset_index(drop=True)


print(f"{result['checkpoint']}: {result['frames']} frames, {REPEATS} repeat(s); load average before/after "
      f"{machine['load_average']} / {result['machine']['load_average_after']}")
table(result)


# %%
def component_bars(res: dict, title: str):
    rows = sorted(res["rows"], key=lambda r: (r["threads"], r["device"], r["runtime"], r["precision"]))
    labels = [f"{r['runtime']}" + (f" {r['precision']}" if r["precision"] != "fp32" else "")
              + f"\n{r['device']} {r['threads']}t" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 3.6))
    bottom = np.zeros(len(rows))
    for part, color in (("talker", "tab:blue"), ("predictor", "tab:orange"), ("codec", "tab:green")):
        vals = np.array([r["ms_per_frame"][part] for r in rows])
        ax.bar(labels, vals, bottom=bottom, label=part, color=color)
        bottom += vals
    floors = [(i, r["floor_ms_per_frame"]) for i, r in enumerate(rows) if r["floor_ms_per_frame"] is not None]
    for n, (i, floor) in enumerate(floors):
        ax.plot([i - 0.4, i + 0.4], [floor] * 2, color="black", lw=2, label="generation floor" if n == 0 else None)
    ax.axhline(80, color="crimson", ls="--", lw=1, label="real time (80 ms of audio per frame)")
    ax.set_ylabel("ms per frame")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


component_bars(result, f"live run on {ckpt} ({machine['cpu']}) — tiny checkpoints measure overhead, not speed");

# %% [markdown]
# ## 4. Read the committed full-size results
# Full-size runs take tens of minutes and a quiet machine, so they are committed as data: one JSON file per named
# machine and run in `data/bench/`, in the schema `bench.results.check_schema` enforces.

# %%
bench_files = sorted((paths.DATA / "bench").glob("*.json"))
committed = {}
for f in bench_files:
    res = json.loads(f.read_text())
    check_schema(res)
    committed[f.stem] = res
    print(f"{f.name}: {res['checkpoint']}, {res['frames']} frames, {res['machine'].get('cpu', '?')}")
if not committed:
    print("no committed results in data/bench/ yet: run `make bench` on a quiet machine")
check.equal("every committed result follows the schema", "files checked", len(committed), len(bench_files))

# %%
for name, res in committed.items():
    display(table(res).style.set_caption(name))
    component_bars(res, f"{name}: {res['checkpoint']}, {res['frames']} frames")

# %% [markdown]
# How each runtime scales with threads, in the committed results: the generation loop against its floor (it cannot
# go below it; it gets closer as more threads pull from memory), and the codec, which is compute-bound.

# %%
for name, res in committed.items():
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for runtime, marker in (("pytorch", "o"), ("ncnn", "s")):
        rows = sorted((r for r in res["rows"] if r["runtime"] == runtime and r["device"] == "cpu"
                       and r["precision"] == "fp32"), key=lambda r: r["threads"])  # other tiers: chapter 12
        if not rows:
            continue
        t = [r["threads"] for r in rows]
        axes[0].plot(t, [r["ms_per_frame"]["talker"] + r["ms_per_frame"]["predictor"] for r in rows],
                     marker=marker, label=runtime)
        axes[1].plot(t, [r["ms_per_frame"]["codec"] for r in rows], marker=marker, label=runtime)
    floor_rows = sorted({(r["threads"], r["floor_ms_per_frame"]) for r in res["rows"]
                         if r["device"] == "cpu" and r["precision"] == "fp32" and r["floor_ms_per_frame"] is not None})
    if floor_rows:
        axes[0].plot(*zip(*floor_rows), color="black", ls="--", label="floor (bytes / bandwidth)")
    axes[0].set_title(f"{name}: generation loop", fontsize=9)
    axes[1].set_title(f"{name}: codec", fontsize=9)
    for ax in axes:
        ax.set_xlabel("threads")
        ax.set_ylabel("ms per frame")
        ax.legend(fontsize=8)
    fig.tight_layout()

# %% [markdown]
# ## 5. Make ncnn's codec as fast as PyTorch's
# The landed codec spent most of its time in `Convolution1D` and `Deconvolution1D` (FACTS.md: 43% and 36%), which on
# x86 have no packed GEMM path. The runtime loads the codec on the CPU in an equivalent form: the rewrites are
# `runtime.rewrites.codec_cpu`, pure functions of the graph's text and weights, and `runtime.codec.cpu_form` writes
# their result once under `ncnn/fast/` (rewritten when the exports or `cpu_form.FORM_VERSION` change):
# - the same weights run as a 2-D `Convolution` with kernel height 1, which reaches ncnn's packed kernels (blobs stay
#   3-D between consecutive convolutions, so no Reshape copies); Snake's `sin(x)·sin(x)` becomes one in-place square;
# - each strided transposed convolution (the upsampling) becomes a stride-1 convolution over `stride` phases that are
#   interleaved afterwards (`deconv_polyphase`: new weights, same arithmetic, no multiplications by inserted zeros);
# - long convolutions are cut along time (`conv_tile_time`: each tile carries its few samples of left context, so the
#   sums are the same, but ncnn's im2col matrix stays small), the other wide ones along input channels
#   (`conv_split_input`: smaller weight matrices per GEMM);
# - and the graph is cut in **parts** (`codec_cpu.codec_fast_parts`): part 0 (the codebooks and the pre_conv), part 1
#   (the transformer), then one part per upsampling stage (the ConvNeXt upsampler's two, the decoder's four). Parts
#   0 and 1 run over all frames. The stages after them are causal convolutions that look only a few input samples
#   back, so the runtime runs each over chunks of a few frames with that much left context, and hands each chunk on
#   to the next stage at once (`codec.parts.run_parts`). A decode of any length then never holds a whole stage in
#   memory.
#   (Chapter 14 uses the same parts to stream without decoding anything twice.)
#
# How far back is "a few samples"? Rather than adding up kernel sizes by hand, `codec.parts.reach` *measures* it when
# the cache is written: change one input sample, and see which output samples change at all (bitwise). Convolutions are
# shift-invariant, so one position tells the reach everywhere. Here is that experiment on the last part (the highest
# rate), and what the cache recorded for every part:

# %%
import resource  # noqa: E402
import time  # noqa: E402

from qtts_lib.runtime.codec import cpu_form
from qtts_lib.runtime.codec.decoder import Codec

st_cfg = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
fast_dir, desc = cpu_form.fast_graph(paths.ncnn_dir(ckpt), st_cfg)
runtime_form = Codec(paths.ncnn_dir(ckpt), st_cfg, THREADS)  # on the CPU: form="cpu", in parts
last = runtime_form.parts[-1]
probe_codes = np.random.default_rng(2).integers(0, st_cfg["codebook_size"], (4, 16))
x = runtime_form.transformer_output(probe_codes)
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
ax.set_xlabel("output sample")
ax.set_yticks([0, 1], ["same", "changed"])
ax.set_title(f"last codec part: changing input sample {p} changes output samples {first}..{final}", fontsize=9)
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
# The chunk length is set so that the left context costs about `cpu_form.PART_OVERHEAD` of each chunk's work. Now the
# same
# codes through the exported graph, the runtime's parts over whole inputs, and the parts chunk by chunk (the runtime):
# the waveforms compared, then the time and the fresh memory each touches (the first decode in a process pays for
# every page it touches for the first time; on a VM that is slow).

# %%
whole_parts = Codec(paths.ncnn_dir(ckpt), st_cfg, THREADS)
for part in whole_parts.parts:
    part.chunk_frames = None
forms = {"as exported": Codec(paths.ncnn_dir(ckpt), st_cfg, THREADS, form="exported"),
         "parts, whole inputs": whole_parts, "parts, chunked (runtime)": runtime_form}
T = 100 if full else 40
codes = np.random.default_rng(9).integers(0, st_cfg["codebook_size"], (T, 16))
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
# Once warm, chunked and whole inputs run at the same speed; what chunking changes is memory. At full size a whole
# stage 4 is 0.74 MB per frame per blob, and a 300-frame call (the reference's chunk) held about 3.7 GB resident;
# in parts it peaks near 1.3 GB, and the first decode in a process touches a fraction of the fresh pages
# (`data/bench/codec/` records both for the committed machines).
#
# ## 6. The codec alone against PyTorch's, and against the machine's peak
# A generation run decodes once per process, and the difference between two processes is often larger than the
# difference between the codecs. `bench.codec.codec_rounds` holds everything else still: both codecs in this process,
# the same random codes, the same threads, rounds alternating which goes first. The codec is compute-bound, so its
# yardstick besides PyTorch is the machine's arithmetic peak: `codec_flops_per_frame` counts the reference decode's
# floating-point operations (PyTorch's `FlopCounterMode`: convolutions and matrix products, 2 per multiply-add) and
# `peak_gflops` measures a large matrix product at the same threads. The committed files in `data/bench/codec/` are
# the full-size runs (`python -m qtts_lib.bench codec`).

# %%
live_codec = codec_rounds(model_dir, THREADS, frames=T, rounds=3 if full else 5, progress=False)
check.at_least("codec alone: ncnn vs PyTorch on the same codes", "SNR dB", live_codec["snr_ncnn_vs_pytorch_db"], 100.0)


def codec_row(machine: str, checkpoint_name: str, run: dict) -> dict:
    """One row of the codec-alone table, from a run of `bench.codec.codec_rounds`."""
    row = {"machine": machine, "checkpoint": checkpoint_name, "threads": run["threads"], "frames": run["frames"],
           "rounds": run["rounds"], **{f"{k} ms/frame": v for k, v in run["median_ms_per_frame"].items()},
           "ncnn / PyTorch": run["ratio_ncnn_pytorch"]}
    if "gflop_per_frame" in run:  # the Xeon file has no FLOP count
        row |= {"GFLOP/frame": run["gflop_per_frame"], "peak GFLOP/s": run["peak_gflops"],
                **{f"{k} % of peak": round(100 * v, 1) for k, v in run["fraction_of_peak"].items()}}
    return row


def older_run(run: dict) -> dict:
    """data/bench/codec/dev-2core-full-base.json predates the harness (a script with its own key names)."""
    if "median_ms_per_frame" in run:
        return run
    return run | {"frames": run["T"], "ratio_ncnn_pytorch": run["ratio_fast_torch_median"],
                  "median_ms_per_frame": {"ncnn": run["median"]["ncnn fast"], "pytorch": run["median"]["torch"]}}


rows = [codec_row("this one (live)", ckpt, live_codec)]
for f in sorted((paths.DATA / "bench" / "codec").glob("*.json")):
    if f.stem.endswith("-tiers"):  # the codec's precision tiers against each other: chapter 12
        continue
    res = json.loads(f.read_text())
    cpu = res["machine"]["cpu"] if isinstance(res["machine"], dict) else res["machine"]
    rows += [codec_row(f"{f.stem} ({cpu})", res["checkpoint"], older_run(run)) for run in res["runs"]]
pd.DataFrame(rows)

# %% [markdown]
# ## 7. Step the decoders through the threaded GEMV: Gemm → InnerProduct
# Every projection of the exported decoders is a `Gemm`. `rewrites.decode_step.decode_step` rewrites each
# constant-weight Gemm of a `_kv.param` as an `InnerProduct` on a 1-D input, ncnn's threaded GEMV path, over the same
# `.bin`: a graph for one-position steps only. The fp32 runtime used to step through that form (prefill kept the
# exported graph). It no longer does. Measured on full-base at 2 threads, the two forms ran within this VM's noise of
# each other (56.4 and 53.2 ms per talker step, 10.3 ms per code-predictor step both ways), while the step graph is a
# second net holding a second copy of every weight: loading the talker both ways took 3.88 GB of RSS against 1.89 GB
# for the one graph. So fp32 runs the exported graph for prefill and steps, each weight held once. The **fp16** tier
# (chapter 12) still steps through the InnerProduct form, with fp16 weight storage on it: ncnn's x86 Gemm has no fp16
# storage (with it switched on, its outputs were bitwise the fp32 ones). `precision.decoder(..., fast_steps=True)`
# still builds the step graph for comparison; `fast_steps=False` is what fp32 runs. What each tier loads:

# %%
from qtts_lib.runtime.pipeline import precision

c = cfg
loaded = {tier: precision.decoder(paths.ncnn_dir(ckpt), "talker_decoder", c["head_dim"], c["rope_theta"], THREADS,
                                  precision=tier) for tier in ("fp32", "fp16")}
for tier, kv in loaded.items():
    print(f"{tier}: prefill net + {'an InnerProduct step net' if kv.step_net is not None else 'no step net'}")
check.equal("fp32 runtime decoder: one graph for prefill and steps", "step net", loaded["fp32"].step_net is None, True)
check.equal("fp16 runtime decoder: steps through the InnerProduct graph", "step net",
            loaded["fp16"].step_net is not None, True)
del loaded

# %% [markdown]
# Same inputs through both forms, in fp32 (timings on a tiny checkpoint are overhead, not a result; the numbers above
# are the full-size ones):

# %%
step_ms, outs = {}, {}
for label, fast in (("Gemm (as exported; fp32 runtime)", False), ("InnerProduct steps (fp16's form)", True)):
    kv = precision.decoder(paths.ncnn_dir(ckpt), "talker_decoder", c["head_dim"], c["rope_theta"], THREADS,
                           fast_steps=fast)
    rng = np.random.default_rng(4)
    _, kv_cache = kv.prefill(rng.standard_normal((1, 12, c["hidden_size"])).astype(np.float32))
    outs[label], times = [], []
    for _ in range(16):
        x = rng.standard_normal((1, 1, c["hidden_size"])).astype(np.float32)
        t0 = time.perf_counter()
        outs[label].append(kv.forward(x, kv_cache))  # one position after kv_cache.past: a step
        times.append((time.perf_counter() - t0) * 1e3)
    step_ms[label] = float(np.median(times[2:]))
    del kv
a, b = (np.concatenate(v) for v in outs.values())
check.close("talker steps: InnerProduct form vs Gemm form (16 steps)", b, a, rel=1e-5)
pd.Series({k: round(v, 2) for k, v in step_ms.items()}, name="talker step ms (median)").to_frame()

# %% [markdown]
# ## Summary
# - Speed is reported as medians of interleaved repeats, every run in its own process, the machine described and
#   its read bandwidth measured in the same run; ratios only between rows of one run.
# - The generation loop reads every weight of the talker once and of the code predictor 15 times per frame: those
#   bytes over the measured bandwidth are its floor, and each row says how far it is from it.
# - The codec is compute-bound; its yardstick is PyTorch's codec on the same codes and threads.
# - `make bench` writes the same measurement on `full-base` to `data/bench/`; this chapter plots what is there.
# - The runtime loads the codec in a faster equivalent form on the CPU: 2-D kernels, polyphase
#   upsampling, convolutions cut along time and channels (`rewrites.codec_cpu`), in parts whose upsampling stages run
#   chunk by chunk with a measured left context (cached in `ncnn/fast/` by `codec.cpu_form`); it is checked equal
#   here, and chapters 06-07 (which run the runtime) hold token parity with it. fp32 decode steps run the exported
#   graph: the InnerProduct step form (`rewrites.decode_step`) measured no faster at full size and held every weight
#   twice, so only the fp16 tier keeps it; both forms are checked equal here.
# - The codec is timed twice per run: the first decode in a process (what `qtts say` pays, fresh memory included) and
#   a second one (what a server pays); `python -m qtts_lib.bench codec` compares the two codecs with everything else
#   held still.
#
# **Artifacts left:** `data/outputs/<ckpt>/10_bench.json`, the chapter report.
#
# **If your numbers differ**
# - *ncnn much slower at 2 threads than at 1* → another process is using the CPU: ncnn's OpenMP threads spin while
#   they wait (FACTS); look at the load average printed with the table and rerun on a quiet machine.
# - *Loop far above its floor at full size* → check that the fp16/bf16 paths are off and the right threads are set
#   (`runtime.binding.net.make_net`); a 2-D InnerProduct at one row runs one thread.
# - *Bandwidth much lower than your hardware's datasheet* → a VM or a busy neighbour; the floor is what this
#   machine delivers now, which is the honest yardstick.

# %%
check.table()
