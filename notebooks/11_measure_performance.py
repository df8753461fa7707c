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
# **You will:** describe the machine (CPU, cores, memory, read bandwidth measured now); count the bytes of weights
# one frame must read and turn them into a floor no fp32 runtime can beat; run the benchmark harness
# (`python -m qtts_lib.bench loop`, `make bench`) on the current checkpoint — PyTorch and the ncnn runtime in fresh
# processes, repeats interleaved; then read one reference machine's committed full-size result the same way, and
# run the harness again with the weights in huge pages.
#
# **You will learn:** why the generation loop is memory-bound and how far from its floor it runs; how to report
# speed so that it means something (medians, ratios from one run, the machine, its load and its bandwidth while the
# run ran); how to decide whether a rewrite stays (it must measure faster, not look faster).
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip.
# Timings on `tiny-*` mean little (microseconds of work per call; overhead dominates): the method is the same at
# full size, and the full-size numbers are the committed ones. **Leaves behind:** `data/outputs/<ckpt>/11_bench.json`,
# `data/reports/<ckpt>/11_measure_performance.json`.

# %%
import json
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench.loop import benchmark
from qtts_lib.bench.machine import describe
from qtts_lib.bench.results import check_schema
from qtts_lib.bench.workload import weight_bytes_per_frame
from qtts_lib.runtime.app import hugepages
from qtts_lib.runtime.pipeline import precision

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("11_measure_performance", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
del tts  # the harness loads each runtime in its own process
full = ckpt.startswith("full") or not ckpt.startswith("tiny")
FRAMES, REPEATS = (40, 3) if full else (8, 1)
thread_counts = sorted({1, THREADS})

# %% [markdown]
# ## 1. Describe the machine
# A number without its machine is not a result. `bench.machine.describe` reads the CPU's name, family, model, SIMD
# extensions and caches (one name such as "AMD EPYC" covers generations with and without AVX-512), cores, memory, the
# load average and the versions, and **measures** the streaming-read bandwidth at each thread count: threads take the
# max of their slice of a 1 GiB array (numpy releases the GIL inside the reduction), median of five passes.

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
# per frame, compute-bound. Its yardsticks are PyTorch's codec on the same codes and the machine's arithmetic peak
# (chapter 12, which rewrites it for the CPU).
#
# ## 3. Run the harness
# `bench.loop.benchmark(model_dir, frames, thread_counts, repeats)` runs every (runtime, threads) pair in a fresh
# Python (`bench.child`: its own load and peak memory, no thread pool left over from the other runtime), repeat 1 of
# all pairs, then repeat 2, ... so a slow minute hits every row alike, and reports medians per frame: talker (decoder
# step, head, sampling), predictor (15 steps), codec (decoding the frames made), plus prefill, model load, real-time
# factor (RTF: seconds of compute per second of audio; below 1 is faster than real time) and peak resident memory.
# Both sides speak one prompt, `bench.workload`'s (an x-vector clone of the committed voice clip, greedy, at most
# `frames` frames), and the ncnn side runs the product's own `Synthesizer.synthesize`. A VM's bandwidth drifts from
# minute to minute, so every run also probes it every few frames (`bench.machine.Probe`, outside the timed code) and
# is held against the floor of what it measured: a row's floor and its ratio are the medians over its runs.

# %%
result = benchmark(model_dir, FRAMES, thread_counts, REPEATS, progress=False)
check_schema(result)
out = paths.outputs_dir(ckpt) / "11_bench.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(result, indent=1))
check.equal("harness result has the data/bench schema", "rows", len(result["rows"]), 2 * len(thread_counts))
check.equal("both runtimes made the same number of frames", "frames",
            len({r["frames"] for r in result["raw"]}), 1)


def table(res: dict) -> pd.DataFrame:
    rows = [{"runtime": r["runtime"], "precision": r["precision"], "threads": r["threads"],
             **{f"{k} ms": v for k, v in r["ms_per_frame"].items()}, "prefill ms": r["prefill_ms"], "RTF": r["rtf"],
             "floor ms": r["floor_ms_per_frame"], "loop / floor": r["floor_ratio"], "peak GB": r["peak_rss_gb"]}
            for r in res["rows"]]
    return pd.DataFrame(rows).sort_values(["threads", "runtime"]).reset_index(drop=True)


def component_bars(res: dict, title: str):
    """Talker, predictor and codec stacked per row, the row's floor as a black bar, real time as a red line."""
    rows = sorted(res["rows"], key=lambda r: (r["threads"], r["runtime"], r["precision"]))
    labels = [r["runtime"] + (f" {r['precision']}" if r["precision"] != "fp32" else "") + f"\n{r['threads']} thr"
              for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(rows)), 3.4))
    bottom = np.zeros(len(rows))
    for part, color in (("talker", "tab:blue"), ("predictor", "tab:orange"), ("codec", "tab:green")):
        vals = np.array([r["ms_per_frame"][part] for r in rows])
        ax.bar(labels, vals, bottom=bottom, label=part, color=color)
        bottom += vals
    for n, (i, r) in enumerate((i, r) for i, r in enumerate(rows) if r["floor_ms_per_frame"] is not None):
        ax.plot([i - 0.4, i + 0.4], [r["floor_ms_per_frame"]] * 2, color="black", lw=2,
                label="generation floor" if n == 0 else None)
    ax.axhline(80, color="crimson", ls="--", lw=1, label="real time (80 ms of audio per frame)")
    ax.set(ylabel="ms per frame", title=title)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


print(f"{result['checkpoint']}: {result['frames']} frames, {REPEATS} repeat(s); load average before/after "
      f"{machine['load_average']} / {result['machine']['load_average_after']}")
display(table(result))
component_bars(result, f"live run on {ckpt} — tiny checkpoints measure overhead, not speed");

# %% [markdown]
# ## 4. Read a full-size result: one reference machine
# Full-size runs take tens of minutes and a quiet machine, so they are committed as data: one JSON file per machine
# and run in `data/bench/`, each in the schema `bench.results.check_schema` enforces (checked here for every file).
# The method is read on one of them, the reference: `make bench` with the precision tiers on a 2-core AMD EPYC
# virtual machine, five interleaved repeats. Its other tiers are chapter 13's; here, fp32 against PyTorch. The
# results page of the book sets every committed machine side by side.

# %%
bench_files = sorted((paths.DATA / "bench").glob("*.json"))
parsed = [check_schema(json.loads(f.read_text())) or f for f in bench_files]  # check_schema raises on a bad file
check.equal("every committed result follows the schema", "files checked", len(parsed), len(bench_files))
ref = json.loads((paths.DATA / "bench" / "dev-2core-epyc-full-base-tiers.json").read_text())
ref["rows"] = [r for r in ref["rows"] if r["precision"] == "fp32"]  # the other tiers: chapter 13
m = ref["machine"]
print(f"{m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; read bandwidth at the start (GB/s per thread count): "
      f"{m['read_bandwidth_gbs']}; {ref['checkpoint']}, {ref['frames']} frames, "
      f"{ref['weight_bytes_per_frame'] / 1e9:.2f} GB of weights per frame")
display(table(ref))
component_bars(ref, f"reference machine ({m['cpu']}, {m['cores']} cores): {ref['checkpoint']}, fp32");

# %% [markdown]
# Read it row by row. The loop (talker + predictor) of each runtime against the floor of the same threads: ncnn's
# `loop / floor` says how close to the memory bus its kernels run, PyTorch's how far it is from it. The codec does not
# count against the floor. And the ratios that matter are between rows of this one file, made in the same minutes.
#
# Why probe inside the run: every run's own probes (one dot per probe, runs in the order they ran, interleaved), and
# each ncnn run's loop against the floor of its own probes and against the floor of the bandwidth measured once at
# the start of the file (the table: the range of each):

# %%
ncnn_runs = [r for r in ref["raw"] if r["runtime"] == "ncnn" and r["precision"] == "fp32"]
repeats = ref["rows"][0]["repeats"]  # raw holds each configuration's repeats together; they ran interleaved:
ran = {id(r): j % repeats * (len(ref["raw"]) // repeats) + j // repeats for j, r in enumerate(ref["raw"])}
ratios = {}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for threads, marker in ((1, "o"), (2, "s")):
    probes = [(ran[id(r)], g) for r in ref["raw"] if r["threads"] == threads for g in r["read_bandwidth_gbs"]]
    axes[0].plot(*zip(*probes), marker, ms=3, alpha=0.6, label=f"{threads} thread(s)")
    mine = [r for r in ncnn_runs if r["threads"] == threads]
    floor = [ref["weight_bytes_per_frame"] / (np.median(r["read_bandwidth_gbs"]) * 1e9) * 1e3 for r in mine]
    loop = [1e3 * (r["talker_s"] + r["predictor_s"]) / r["frames"] for r in mine]
    once = ref["weight_bytes_per_frame"] / (m["read_bandwidth_gbs"][str(threads)] * 1e9) * 1e3
    ratios[threads] = {"own probes": np.array(loop) / np.array(floor), "start of the file": np.array(loop) / once}
    for (how, r), ls in zip(ratios[threads].items(), ("-", ":")):
        axes[1].plot(range(len(mine)), r, marker=marker, ls=ls, label=f"{threads} thread(s), floor from {how}")
axes[0].set(xlabel="run (in the order they ran)", ylabel="GB/s", title="read bandwidth probed inside each run")
axes[1].set(xlabel="ncnn fp32 repeat", ylabel="loop / floor", title="each run against a floor",
            xticks=range(repeats))
axes[1].axhline(1, color="black", lw=1)
for ax in axes:
    ax.legend(fontsize=7)
fig.tight_layout()
pd.DataFrame({(t, how): {"min": r.min(), "max": r.max()} for t, d in ratios.items() for how, r in d.items()}).round(2)

# %% [markdown]
# The bandwidth moves from probe to probe on a shared VM, so a floor taken once at the start puts the same loop
# above or below it depending on the minute. Held against its own probes each run's ratio moves less, and the row
# reports their median. A ratio near 1 says the loop reads at the speed the probe reads; a little under 1 means ncnn's
# kernels read memory a little faster than numpy's reduction: the probe is a yardstick, not the hardware's limit.
#
# ## 5. Decide with the harness: a rewrite that did not stay
# Every projection of the exported decoders is a `Gemm`. `rewrites.decode_step.decode_step` rewrites each
# constant-weight Gemm of a `_kv.param` as an `InnerProduct` on a 1-D input, ncnn's threaded GEMV path, over the same
# `.bin`: a graph for one-position steps only. It looks faster for a one-row step. Measured at full size it ran within
# the noise of the exported graph (the lab notes appendix keeps the numbers), and it is a second net holding a second
# copy of every weight. So the fp32 runtime steps through the exported graph, each weight held once; the **fp16** tier
# (chapter 13) keeps the InnerProduct form, because ncnn's x86 `Gemm` has no fp16 weight storage. What each tier loads:

# %%
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
# Same inputs through both forms in fp32: equal first (a rewrite that changes the answer is not a speed-up), then
# timed side by side in one process, medians. On a tiny checkpoint this times overhead; `precision.decoder(...,
# fast_steps=True)` builds the step graph on any checkpoint, so the same cell at full size is the experiment.

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
# ## 6. Give the weights huge pages
# The floor counts bytes; the memory system also counts pages. ncnn keeps each weight matrix in a block of its own
# from glibc's malloc, in 4 KB pages, so a full-size int8 talker step walks about 110 thousand of them, each a TLB
# entry to look up. Linux can back a block with 2 MB pages instead (transparent huge pages) where the program asks
# for them, and glibc's malloc asks on its large blocks when the process *starts* with
# `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`. A tunable is read once at start, so it is a property of how a process is
# launched: the harness takes it as one more axis (`huge_pages`, a child started with or without it), and `qtts serve`
# starts itself again with it (`runtime.app.hugepages`). Each run reports how much of its memory the kernel gave in
# huge pages:

# %%
cannot = hugepages.why_not()
mode = hugepages.THP_MODE.read_text().strip() if hugepages.THP_MODE.exists() else "none"
print(f"transparent huge pages: {mode}; glibc's tunable usable here: {cannot or 'yes'}")
if cannot is None:
    pages = benchmark(model_dir, 8, [THREADS], 1, runtimes=("ncnn",), progress=False, huge_pages=(False, True))
    mb = {("huge pages" if r["huge_pages"] else "4 KB pages"): r["huge_pages_mb"] for r in pages["rows"]}
    print("MB of the process in huge pages:", mb)
    if "[madvise]" in mode:  # in `always` mode every process gets them, asked or not
        check.at_least("the run that asked has more of its memory in huge pages", "MB",
                       mb["huge pages"] - mb["4 KB pages"], 1)
else:
    print(f"skipped because {cannot}")

# %% [markdown]
# What it buys is a full-size question. The committed runs on the Intel Xeon VM (int8 loop and codec, fresh
# processes taken in turn, 40 and 240 frames): the talker's step gains about a millisecond, the code predictor, whose
# weights partly stay in that VM's large shared cache, less or nothing; loading is slower there, because that VM's
# kernel hands out huge pages from memory the host has not given it yet. A server loads once (and chapter 15's
# stream rows show a warm process gaining about 3%); `qtts say` starts without them.

# %%
hp = {}
for frames in (40, 240):
    doc = json.loads((paths.DATA / "bench" / f"dev-2core-xeon-amx-full-base-int8-huge-pages-{frames}f.json")
                     .read_text())
    for r in doc["rows"]:
        hp[f"{frames} frames, " + ("huge pages" if r["huge_pages"] else "4 KB pages")] = {
            **r["ms_per_frame"], "RTF": r["rtf"], "load s": r["load_s"], "processes": r["repeats"],
            "GB in huge pages": round(r["huge_pages_mb"] / 1024, 1)}
pd.DataFrame(hp)

# %% [markdown]
# ## Summary
# - Speed is reported as medians of interleaved repeats, every run in its own process, the machine described and
#   its read bandwidth measured in the same run; ratios only between rows of one run.
# - The generation loop reads every weight of the talker once and of the code predictor 15 times per frame: those
#   bytes over the measured bandwidth are its floor, and each run is held against the floor of its own probes.
# - The codec is compute-bound; its yardsticks are PyTorch's codec and the machine's peak (chapter 12).
# - `make bench` writes the same measurement on `full-base` to `data/bench/`; this chapter reads the reference
#   machine's file, and the results page sets every machine side by side.
# - A rewrite stays only if it measures faster: the InnerProduct step form is equal but was not faster in fp32, so
#   only the fp16 tier keeps it.
# - The weights in huge pages (glibc's tunable at process start) cost the loop fewer TLB misses; `qtts serve` runs
#   that way, and the harness measures both.
#
# **Artifacts left:** `data/outputs/<ckpt>/11_bench.json`, the chapter report.
#
# **If your numbers differ**
# - *ncnn much slower at 2 threads than at 1* → another process is using the CPU: GNU OpenMP's workers spin before
#   they sleep (`GOMP_SPINCOUNT`), so a busy core stalls every parallel region; look at the load average printed with
#   the table and rerun on a quiet machine.
# - *Loop far above its floor at full size* → check that the fp16/bf16 paths are off and the right threads are set
#   (`runtime.binding.net.make_net`); a 2-D InnerProduct at one row runs one thread.
# - *Bandwidth much lower than your hardware's datasheet* → a VM or a busy neighbour; the floor is what this
#   machine delivers now, which is the honest yardstick.

# %%
check.table()
