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
# # 11 · Measure performance honestly
# > Side by side in one run, medians of interleaved repeats, and against what the memory bus allows.
#
# **You will:** describe the machine (CPU, cores, memory, read bandwidth: the bytes per second its cores stream from
# memory, measured now); count the bytes of weights one frame must read and turn them into a **floor** (weight-read
# floor: those bytes over that bandwidth) no fp32 runtime can beat; run the benchmark harness (`python -m
# qtts_lib.bench loop`, `make bench`) on the current checkpoint — PyTorch and the ncnn runtime in fresh processes,
# repeats interleaved (taking turns; written first as a short function); then read the reference machine's committed
# full-size result the same way, and run the harness again with the weights in huge pages (larger memory pages).
#
# **You will learn:** why the generation loop is memory-bound (its time set by the bytes it reads) and how far from
# its floor it runs; how to report speed so it means something (interleaved medians, ratios from one run, the
# machine and its bandwidth during the run); that a rewrite stays only if it measures faster.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip. The
# `tiny-*` weights are so small that their timings measure per-call overhead, not weight reads: the method is the
# same at full size, and the full-size numbers are the committed ones.
# **Leaves behind:** `data/outputs/<ckpt>/11_bench.json`, `data/reports/<ckpt>/11_measure_performance.json`.

# %%
import json

import numpy as np
import pandas as pd

from qtts_lib import check, checkpoint, export, paths, reference, settings

ckpt = settings.checkpoint()  # QTTS_CHECKPOINT, default tiny-base
THREADS = settings.threads()
report = check.begin("11_measure_performance", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # the graphs, once
full = ckpt.startswith("full") or not ckpt.startswith("tiny")
FRAMES, REPEATS = (40, 3) if full else (8, 2)
thread_counts = sorted({1, THREADS})

# %% [markdown]
# ## 1. Describe the machine
# A number without its machine is not a result. `bench.machine.describe` reads the CPU's name, family, model, SIMD
# extensions and caches, cores, memory, load average and versions, and **measures** the streaming-read bandwidth at
# each thread count: threads take the numpy max of their slice of a 1 GiB array (a max reads every byte and does
# next to no arithmetic), median of five passes.

# %%
from qtts_lib.bench.machine import describe

machine = describe(thread_counts)
pd.Series(machine, dtype=object).to_frame("this machine")

# %% [markdown]
# ## 2. Count the bytes a frame must read: the floor
# Each generated frame runs the talker once and the code predictor 15 times (one call per codebook 1..15). A call
# for one position multiplies one row by each weight matrix: every weight is read from memory and used once, so the
# bytes read set the time (the loop is **memory-bound**). Per frame: the talker decoder and its codec head, plus
# 15 × (the predictor decoder and one of its 15 heads); not the embedding tables (a lookup reads one row). Counted
# from the `.bin` files and, independently, from `config.json` (q, k, v, o, Qwen3's per-head q/k norms, SwiGLU's
# three projections, two RMSNorms a layer, 4 bytes a float):

# %%
from qtts_lib.bench.workload import weight_bytes_per_frame

cfg = checkpoint.load_config(ckpt)["talker_config"]
pred = cfg["code_predictor_config"]


def decoder_params(c: dict) -> int:
    h, hd, heads, kv = (c[k] for k in ("hidden_size", "head_dim", "num_attention_heads",
                                       "num_key_value_heads"))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd  # q k v o, norms
    mlp = 3 * h * c["intermediate_size"]
    return c["num_hidden_layers"] * (attn + mlp + 2 * h) + h


h, ph = cfg["hidden_size"], pred["hidden_size"]
proj = h * ph + ph if ph != h else 0  # small_to_mtp_projection when the widths differ
from_config = 4 * (decoder_params(cfg) + h * cfg["vocab_size"]
                   + 15 * (decoder_params(pred) + proj + ph * pred["vocab_size"]))
from_files = weight_bytes_per_frame(paths.ncnn_dir(ckpt))
print(f"weights read per frame: {from_files / 1e9:.3f} GB from the .bin files, "
      f"{from_config / 1e9:.3f} GB from config.json")
check.at_most("weight bytes per frame: .bin files vs config.json", "rel",
              abs(from_files - from_config) / from_config, 0.01)
bandwidth = machine["read_bandwidth_gbs"]
floors = {t: round(from_files / (gbs * 1e9) * 1e3, 1) for t, gbs in bandwidth.items()}
pd.DataFrame({"read bandwidth GB/s": bandwidth, "floor ms/frame": floors})

# %% [markdown]
# The codec is the other half of the time and **compute-bound**: its convolutions reuse each weight at every one of a
# frame's 1920 samples, so arithmetic sets its time; its yardsticks are PyTorch's and the arithmetic peak (chapter 12).
#
# ## 3. Interleave the repeats
# A virtual machine shares its host: its bandwidth and its cores' speed drift from minute to minute as neighbours
# come and go. Run A's repeats, then B's, and a slow minute lands on one of them: the ratio measures the minute,
# not the runtimes. Run them in turn instead (A, B, A, B, ...) and a slow minute hits both alike; the median of each
# then drops a stray slow run. That is the whole method, in one short function:

# %%
import statistics
import time


def interleaved(workloads: dict, rounds: int) -> dict:
    """Each workload (name -> function of no arguments) once per round, in one order;
    returns the order the runs ran in, every run's seconds, and each one's median."""
    order, runs = [], {name: [] for name in workloads}
    for _ in range(rounds):
        for name, work in workloads.items():
            t0 = time.perf_counter()
            work()
            runs[name].append(time.perf_counter() - t0)
            order.append(name)
    medians = {name: statistics.median(s) for name, s in runs.items()}
    return {"order": order, "runs": runs, "median": medians}

# %% [markdown]
# Tried on two identical workloads on a machine that gets twice as slow after the 16th call (a sleep that doubles,
# standing in for a neighbour): back to back (one workload at a time), B looks twice as slow as A; interleaved, equal.

# %%
calls = [0]


def drifting_work():  # the same work each call; the machine slows down after 16 calls
    calls[0] += 1
    time.sleep(0.002 if calls[0] <= 16 else 0.004)


fair = interleaved({"A": drifting_work, "B": drifting_work}, 20)
calls[0] = 0
unfair = {name: interleaved({name: drifting_work}, 20)["median"][name] for name in "AB"}
print("medians (s), interleaved:", fair["median"], "\nback to back:", unfair)
check.equal("interleaved: the runs ran A, B, A, B, ...", "order",
            fair["order"] == ["A", "B"] * 20, True)
ratio = fair["median"]["B"] / fair["median"]["A"]
check.at_most("interleaved: identical workloads on a drifting machine",
              "larger / smaller median", max(ratio, 1 / ratio), 1.25)
check.at_least("back to back: the same workloads, median B / A", "ratio",
               unfair["B"] / unfair["A"], 1.5)

# %% [markdown]
# ## 4. Run the harness
# `bench.loop.benchmark(model_dir, frames, thread_counts, repeats)` is that function at the scale of whole runs:
# each (runtime, threads) pair in a fresh Python (`bench.child.run`: its own load and peak memory), in rounds, with
# medians per frame of talker (step, head, sampling), predictor (15 steps) and codec, plus prefill, load, real-time
# factor (RTF: seconds of compute per second of audio; below 1 is faster than real time) and peak memory. Both sides
# speak `bench.workload`'s prompt (an x-vector clone of the voice clip, greedy); the ncnn side runs the product's
# `Synthesizer.synthesize`. Each run probes the bandwidth every few frames (`bench.machine.Probe`, outside the timed
# code) and is held against the floor of what it measured. To see the interleaving, the cell wraps `child.run`
# (`mock.patch`) to note each child as it starts, and writes the result in `data/bench/`'s schema to `data/outputs/`:

# %%
from unittest import mock

from qtts_lib.bench import child
from qtts_lib.bench.loop import benchmark
from qtts_lib.bench.results import check_schema

started, real_run = [], child.run


def noted_run(module, name, threads, /, **kwargs):  # child.run, noting who starts
    started.append(f"{name.removeprefix('run_')} {threads}")
    return real_run(module, name, threads, **kwargs)


with mock.patch.object(child, "run", noted_run):
    result = benchmark(model_dir, FRAMES, thread_counts, REPEATS, progress=False)
check_schema(result)
one_round = started[: len(started) // REPEATS]
print("children started in this order:", started)
same_rounds = started == one_round * REPEATS and len(set(one_round)) == len(one_round)
check.equal("benchmark() interleaves: every round runs every pair, in one order",
            "order", same_rounds, True)
out = paths.outputs_dir(ckpt) / "11_bench.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(result, indent=1))
check.equal("harness result has the data/bench schema", "rows", len(result["rows"]),
            2 * len(thread_counts))
check.equal("both runtimes made the same number of frames", "frames",
            len({r["frames"] for r in result["raw"]}), 1)

# %% [markdown]
# `table` reads any result of this schema into one row per runtime, tier (precision) and threads, `loop / floor`
# being talker + predictor over the floor (1 = at the floor); `plots.bench_components` draws it: talker, predictor
# and codec stacked per row, the floor as a black bar, real time as a red line. The live run, with the load average
# before and after it (a busy machine shows there first):

# %%
from IPython.display import display

from qtts_lib import plots


def table(res: dict) -> pd.DataFrame:
    rows = [{**{k: r[k] for k in ("runtime", "precision", "threads")},
             **{f"{k} ms": v for k, v in r["ms_per_frame"].items()},
             "prefill ms": r["prefill_ms"], "RTF": r["rtf"],
             "floor ms": r["floor_ms_per_frame"], "loop / floor": r["floor_ratio"],
             "peak GB": r["peak_rss_gb"]} for r in res["rows"]]
    return pd.DataFrame(rows).sort_values(["threads", "runtime"]).reset_index(drop=True)


print(f"{result['checkpoint']}: {result['frames']} frames, {REPEATS} repeats; load "
      f"average before/after {machine['load_average']} / "
      f"{result['machine']['load_average_after']}")
display(table(result))
plots.bench_components(result, f"live run on {ckpt}: tiny checkpoints time overhead");

# %% [markdown]
# ## 5. Read a full-size result on the reference machine
# Full-size runs take tens of minutes and a quiet machine, so they are committed as data: one JSON file per machine
# and run in `data/bench/` (named after its machine), in the schema `bench.results.check_schema` enforces (checked
# here for every file). Later chapters read **the reference machine**: a 2-core AMD EPYC virtual machine, files
# `dev-2core-epyc-*`. Its run with the precision tiers (the weights in fp32, fp16 or int8; `make bench`, five
# interleaved repeats) is read here in fp32 against PyTorch (the other tiers: chapter 13).

# %%
REFERENCE, BENCH = "dev-2core-epyc", paths.DATA / "bench"  # the reference machine
bench_files = sorted(BENCH.glob("*.json"))
parsed = [check_schema(json.loads(f.read_text())) or f for f in bench_files]  # or raise
check.equal("every committed result follows the schema", "files checked", len(parsed),
            len(bench_files))
ref = json.loads((BENCH / f"{REFERENCE}-full-base-tiers.json").read_text())
ref["rows"] = [r for r in ref["rows"] if r["precision"] == "fp32"]  # others: chapter 13
m = ref["machine"]
print(f"{m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; read bandwidth at the "
      f"start (GB/s by threads): {m['read_bandwidth_gbs']}; {ref['checkpoint']}, "
      f"{ref['frames']} frames, {ref['weight_bytes_per_frame'] / 1e9:.2f} GB a frame")
display(table(ref))
plots.bench_components(ref, f"the reference machine: {ref['checkpoint']}, fp32");

# %% [markdown]
# Read it row by row. The loop (talker + predictor) against the floor of the same threads: ncnn's `loop / floor` says
# how close to the memory bus its kernels run, PyTorch's how far it is from it; the codec does not count against the
# floor, and the ratios that matter are between rows of this one file, made in the same minutes.
#
# Why probe inside the run: left, every run's own probes (one dot per probe; the file's `raw` list holds a pair's
# repeats together, so `ran` puts each run back at its place in the interleaved order); right, each ncnn run's loop
# against the floor of its own probes and against the floor of the bandwidth measured once at the start of the file
# (the table: the range of each):

# %%
import matplotlib.pyplot as plt

raw, repeats, wpf = ref["raw"], ref["rows"][0]["repeats"], ref["weight_bytes_per_frame"]
ran = {id(r): j % repeats * (len(raw) // repeats) + j // repeats  # raw holds a pair's
       for j, r in enumerate(raw)}  # repeats together: when each ran, interleaved
ratios = {}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for threads, marker in ((1, "o"), (2, "s")):
    probes = [(ran[id(r)], g) for r in raw if r["threads"] == threads
              for g in r["read_bandwidth_gbs"]]
    axes[0].plot(*zip(*probes), marker, ms=3, alpha=0.6, label=f"{threads} thread(s)")
    mine = [r for r in raw if r["runtime"] == "ncnn" and r["precision"] == "fp32"
            and r["threads"] == threads]
    loop = np.array([(r["talker_s"] + r["predictor_s"]) / r["frames"] for r in mine])
    floor = np.array([wpf / (np.median(r["read_bandwidth_gbs"]) * 1e9) for r in mine])
    once = wpf / (m["read_bandwidth_gbs"][str(threads)] * 1e9)  # s, as loop and floor
    ratios[threads] = {"own probes": loop / floor, "start of the file": loop / once}
    for (how, r), ls in zip(ratios[threads].items(), ("-", ":")):
        axes[1].plot(range(len(mine)), r, marker=marker, ls=ls,
                     label=f"{threads} thread(s), floor from {how}")
axes[0].set(xlabel="run (in the order they ran)", ylabel="GB/s", title="probed GB/s")
axes[1].set(xlabel="ncnn fp32 repeat", ylabel="loop / floor", xticks=range(repeats),
            title="each run against a floor")
axes[1].axhline(1, color="black", lw=1)
for ax in axes:
    ax.legend(fontsize=7)
fig.tight_layout()
pd.DataFrame({(t, how): {"min": r.min(), "max": r.max()}
              for t, d in ratios.items() for how, r in d.items()}).round(2)

# %% [markdown]
# On a shared VM the bandwidth moves from probe to probe, so a floor taken once puts the same loop above or below it
# by the minute; against its own probes each run's ratio moves less (the row reports their median). A ratio a little
# under 1: ncnn reads memory a little faster than the probe's numpy max, a yardstick, not the hardware's limit.
#
# ## 6. Decide with the harness: a rewrite that did not stay
# Every projection of the exported decoders is a `Gemm` (ncnn's general matrix product). `rewrites.decode_step`
# rewrites each constant-weight Gemm of a `_kv.param` as an `InnerProduct` (a fully connected layer) on a 1-D input,
# ncnn's threaded GEMV path (matrix times one vector), over the same `.bin`: a graph for one-position steps only,
# which looks faster. At full size it ran within the noise of the exported graph (the lab notes keep the numbers),
# as a second net holding a second copy of every weight. So fp32 steps through the exported graph; the **fp16** tier
# (chapter 13) keeps the InnerProduct form, as ncnn's x86 `Gemm` has no fp16 weight storage. What each tier loads:

# %%
from qtts_lib.runtime.pipeline import precision

args = (paths.ncnn_dir(ckpt), "talker_decoder", cfg["head_dim"], cfg["rope_theta"],
        THREADS)
loaded = {tier: precision.decoder(*args, precision=tier) for tier in ("fp32", "fp16")}
for tier, kv in loaded.items():
    step = "an InnerProduct step net" if kv.step_net else "no step net"
    print(f"{tier}: prefill net + {step}")
check.equal("fp32 runtime decoder: one graph for prefill and steps", "step net",
            loaded["fp32"].step_net is None, True)
check.equal("fp16 runtime decoder: steps through the InnerProduct graph", "step net",
            loaded["fp16"].step_net is not None, True)
del loaded

# %% [markdown]
# Same inputs through both forms in fp32: equal first (a rewrite that changes the answer is not a speed-up), then
# timed side by side in one process, medians. On a tiny checkpoint this times overhead; `precision.decoder(...,
# fast_steps=True)` builds the step graph on any checkpoint, so the same cell at full size is the experiment.

# %%
step_ms, outs = {}, {}
for label, fast in (("Gemm (exported; fp32)", False), ("InnerProduct (fp16's)", True)):
    kv = precision.decoder(*args, fast_steps=fast)
    rng = np.random.default_rng(4)
    _, kv_cache = kv.prefill(rng.standard_normal((1, 12, h)).astype(np.float32))
    outs[label], times = [], []
    for _ in range(16):
        x = rng.standard_normal((1, 1, h)).astype(np.float32)
        t0 = time.perf_counter()
        outs[label].append(kv.forward(x, kv_cache))  # one position after the cache
        times.append((time.perf_counter() - t0) * 1e3)
    step_ms[label] = float(np.median(times[2:]))
    del kv
a, b = (np.concatenate(v) for v in outs.values())
check.close("talker steps: InnerProduct form vs Gemm form (16 steps)", b, a, rel=1e-5)
pd.Series(step_ms, name="talker step ms (median)").round(2).to_frame()

# %% [markdown]
# ## 7. Give the weights huge pages
# The floor counts bytes; the memory system also counts pages. ncnn keeps each weight matrix in a block of its own
# from glibc's malloc, in 4 KB pages, each a TLB entry (the CPU's cache of page addresses). Linux can back a block
# with 2 MB pages (transparent huge pages) where the program asks, and glibc's malloc asks when the process *starts*
# with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`. The harness takes it as one more axis (`huge_pages`), `qtts serve`
# restarts itself with it (`runtime.app.hugepages`). The kernel's THP mode is `always` (every process gets them),
# `madvise` (only where asked; the check needs it) or `never`. Each run reports its memory in huge pages:

# %%
from qtts_lib.runtime.app import hugepages

cannot = hugepages.why_not()
mode = hugepages.THP_MODE.read_text().strip() if hugepages.THP_MODE.exists() else "none"
print(f"transparent huge pages: {mode}; glibc's tunable usable here: {cannot or 'yes'}")
if cannot is None:
    pages = benchmark(model_dir, 8, [THREADS], 1, runtimes=("ncnn",), progress=False,
                      huge_pages=(False, True))
    mb = {("huge" if r["huge_pages"] else "4 KB") + " pages": r["huge_pages_mb"]
          for r in pages["rows"]}
    print("MB of the process in huge pages:", mb)
    if "[madvise]" in mode:  # in `always` mode every process gets them, asked or not
        check.at_least("the run that asked has more of its memory in huge pages", "MB",
                       mb["huge pages"] - mb["4 KB pages"], 1)

# %% [markdown]
# What it buys is a full-size question, answered on a 2-core Intel Xeon VM with AMX (Intel's matrix instructions;
# int8 tier, fresh processes in turn, 40 and 240 frames): the talker gains, the predictor (its weights partly in that
# VM's large cache) less or nothing, and loading is slower (that VM's kernel finds the huge pages in memory the host
# has not given it yet).

# %%
hp = {}
for frames in (40, 240):
    name = f"dev-2core-xeon-amx-full-base-int8-huge-pages-{frames}f.json"
    for r in json.loads((BENCH / name).read_text())["rows"]:
        hp[(frames, "huge" if r["huge_pages"] else "4 KB")] = {
            **r["ms_per_frame"], "RTF": r["rtf"], "load s": r["load_s"],
            "processes": r["repeats"], "GB in huge pages": r["huge_pages_mb"] / 1024}
hp = pd.DataFrame(hp).T.rename_axis(["frames", "pages"])
gain = hp.xs("4 KB", level="pages")["talker"] - hp.xs("huge", level="pages")["talker"]
print("talker ms per frame saved by huge pages:", gain.round(2).to_dict())
display(hp)

# %% [markdown]
# ## Summary
# - Speed is medians of interleaved repeats (`benchmark()`: whole runs, each its own process), the machine described
#   and its bandwidth measured in the same run; ratios only between rows of one run.
# - The loop is memory-bound: its weight bytes a frame over the measured bandwidth are its floor. The codec is not.
# - The reference machine (2-core AMD EPYC, `dev-2core-epyc-*`) is the one later chapters read.
# - A rewrite stays only if it measures faster; weights in huge pages cost the loop fewer TLB misses.
#
# **Artifacts left:** `data/outputs/<ckpt>/11_bench.json`, the chapter report.
#
# **If your numbers differ**
# - *ncnn much slower at 2 threads than at 1* → another process uses the CPU (a busy core stalls every parallel
#   region; appendix D measures it): read the printed load average; rerun on a quiet machine.
# - *Loop far above its floor at full size* → check that the fp16/bf16 paths are off and the threads set
#   (`runtime.binding.net.make_net`); a 2-D InnerProduct at one row runs one thread.
# - *Bandwidth far below your hardware's datasheet* → a VM or a busy neighbour: the floor is what it delivers now.

# %%
check.table()
