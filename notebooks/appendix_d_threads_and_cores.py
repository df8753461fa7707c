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
# # Appendix D · Threads and cores
# > ncnn's OpenMP workers (the threads that share a layer's work) belong to the thread that started them: a
# > program that hands ncnn to another thread must let the first thread's workers go.
#
# Chapter 15 streams in the caller's thread. A program around the runtime may instead hand ncnn to a thread of its
# own: `qtts serve` loads the model in its main thread and runs every ncnn call on one engine thread (chapter 18).
# ncnn parallelizes a layer with OpenMP, the compiler's shared-memory threading runtime: a *parallel region* (a loop
# split over threads) runs on a pool of worker threads that the runtime starts the first time a thread enters one.
#
# **You will:** list the OpenMP runtimes loaded in this process; run 60 decoder steps in this thread and in a new
# one, with this thread's pool kept or released, counting how often the stepping thread sleeps; read what a kept
# pool cost per frame at full size; read what two processes on the same cores cost each other.
#
# **You will learn:** why GNU OpenMP (libgomp, the runtime ncnn's wheel bundles) slows a second ncnn thread down
# when the first thread's pool stays alive, and what `runtime.binding.net.release_threads()` does about it; what
# the workers' spin and `--threads auto` do for processes that share the cores.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing) and at least two CPUs (with one,
# ncnn starts no workers and the count is skipped). The full-size timings are read from `data/bench/stream/`.
#
# **Leaves behind:** `data/reports/<ckpt>/appendix_d_threads_and_cores.json`.
#
# The set-up loads the talker decoder (chapter 05's cached graph) with one OpenMP thread per CPU, so that two
# pools together hold more workers than the machine has CPUs:

# %%
import os

import numpy as np

from qtts_lib import check, checkpoint, export, reference, settings
from qtts_lib.runtime import Synthesizer
from qtts_lib.runtime.pipeline import precision

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("appendix_d_threads_and_cores", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
talker, cores = synth.config.talker, os.cpu_count() or 1
net = precision.decoder(synth.config.ncnn_dir, "talker_decoder", talker["head_dim"],
                        talker["rope_theta"], cores)
print(f"{ckpt}: talker decoder with {cores} OpenMP threads, one per CPU")

# %% [markdown]
# ## 1. Find the OpenMP runtime
# GNU OpenMP keeps a pool of workers *for each thread that ran a parallel region*, and a pool stays alive after its
# thread stops calling ncnn. Between regions a worker first spins, then sleeps; once the process holds more OpenMP
# workers than there are CPUs, libgomp skips the spinning and parks every worker in the kernel at the end of each
# region, so each of the ~1000 small layers of a decoder step pays a wake-up. OpenMP 5.0's
# `omp_pause_resource_all(omp_pause_soft)` frees the calling thread's pool (the next parallel region builds it
# again). The runtime is a shared library ncnn loaded; `/proc/self/maps` lists the files mapped into this process:

# %%
import inspect
from pathlib import Path

from qtts_lib.runtime.binding.net import release_threads

mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
runtimes = sorted(p for p in mapped if any(k in Path(p).name
                                           for k in ("libgomp", "libomp", "libiomp")))
print("OpenMP runtimes loaded:", runtimes or "none")
print(inspect.getsource(release_threads).split('"""')[0].strip(), "...")
print("release_threads() from this thread:", release_threads())

# %% [markdown]
# `release_threads()` finds those libraries the same way and calls `omp_pause_resource_all(1)` in each one that has
# it (PyTorch, where loaded first, may bring another runtime); it returns whether it found one. The server's
# `Engine` calls it before its engine thread takes over.
#
# ## 2. Count the wake-ups
# Counted, not timed, as `tests/test_threads.py` does, so that a loaded machine gives the same answer: this thread
# runs a prefill (its pool now exists), then 60 decode steps run here or in a new thread, with this thread's pool
# kept or released. The count is the stepping thread's *voluntary context switches* (`ru_nvcsw`: how often it gave
# up its CPU to wait, here for a sleeping worker to wake), read from `getrusage(RUSAGE_THREAD)`:

# %%
import resource
from concurrent.futures import ThreadPoolExecutor


def step_switches(in_worker: bool, release: bool, steps: int = 60) -> int:
    rng = np.random.default_rng(0)
    embeds = [rng.standard_normal((1, n, talker["hidden_size"])).astype(np.float32)
              for n in [8] + [1] * steps]
    _, cache = net.prefill(embeds[0])  # this thread has run ncnn: its pool exists
    if release:
        release_threads()

    def run_steps() -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        for x in embeds[1:]:
            net.forward(x, cache)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before

    if not in_worker:
        return run_steps()
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(run_steps).result()

# %% [markdown]
# The three ways, each counted once; a kept pool must cost the worker thread at least four times the switches of a
# released one (the floor of 10 keeps a near-zero count from making the ratio noise):

# %%
import pandas as pd
from IPython.display import display

if cores < 2:
    print("skipped: with one CPU ncnn starts no OpenMP workers, no pool to release")
else:
    switches = {"this thread": step_switches(False, False),
                "a worker thread, this thread's pool kept": step_switches(True, False),
                "a worker thread, after release_threads()": step_switches(True, True)}
    column = f"voluntary context switches, 60 steps ({cores} threads)"
    display(pd.DataFrame({column: switches}))
    kept, released = (switches[f"a worker thread, {k}"]
                      for k in ("this thread's pool kept", "after release_threads()"))
    check.at_least("a kept pool parks the worker thread's OpenMP workers "
                   "(switches kept / released)", "ratio", kept / max(released, 10), 4.0)

# %% [markdown]
# ## 3. What a kept pool costs at full size
# The count says the workers sleep; the clock says what that costs. `python -m qtts_lib.perf --stream` timed the
# stream's loop at full size in a worker thread, with the caller's pool kept and released, on a 2-core AMD EPYC VM
# (fresh processes, medians of five rounds):

# %%
import json

from qtts_lib import paths

POOLS = json.loads((paths.DATA / "bench" / "stream" / "dev-2core-epyc-full-base.json")
                   .read_text())
machine = POOLS["machine"]
print(POOLS["checkpoint"], "on", machine["cpu"], f"{machine['cores']} cores, ms/frame")
ms = {r["threads"]: r["ms_per_frame"] for r in POOLS["runs"]}
costs = pd.DataFrame({"pool released": {t: m["stream"] for t, m in ms.items()},
                      "pool kept": {t: m["stream_pool_kept"] for t, m in ms.items()}})
costs["kept / released"] = (costs["pool kept"] / costs["pool released"]).round(2)
display(costs.rename_axis("threads"))

# %% [markdown]
# With one OpenMP thread there is no second pool to outnumber the CPUs, and keeping the pool costs nothing; with one
# thread per CPU the kept pool makes every frame slower than one thread alone (the table's rows). Two processes
# that each run ncnn on every core meet the same parking from the outside: the [lab notes](../lab_notes.md) ("What
# does the second core buy?") measure it, with the other ways to share two cores between the loop and the codec.
#
# ## 4. Share the cores with another process
# Between two regions a libgomp worker first *spins* (polls for the next region) `GOMP_SPINCOUNT` rounds, then
# sleeps. libgomp reads the count once, when it loads; with no wait policy set it is 300,000. Spinning saves a
# wake-up per layer on a quiet machine; beside another busy process the spinning worker holds a core that process
# needs, and a worker whose core the other process holds stalls every region of its own. So the runtime sets 3000
# before ncnn loads, unless the environment sets it (`runtime.binding`), and `qtts say` and `qtts serve` choose
# their thread count when they start (`--threads auto`, the default, `runtime.binding.cores`): two at most, less
# the CPUs other processes keep busy, and at most their share with the other qtts processes running ncnn there.

# %%
from qtts_lib.runtime.binding import cores as ncnn_cores

print("GOMP_SPINCOUNT in this process:", os.environ.get("GOMP_SPINCOUNT"))
print("--threads auto here, now: {} (busy elsewhere {:.2f} CPUs, {} qtts peers)"
      .format(*ncnn_cores.auto_threads()))

# %% [markdown]
# `python -m qtts_lib.bench cores` runs `qtts say` (full-base int8, 120 frames, fresh processes) alone, two at
# once, and beside a neighbour that spins on one core, then `qtts serve` with one streaming client alone and beside
# that neighbour, for each spin and thread count, on the 2-core Xeon VM (its file's note has libgomp's own spin,
# from a run stopped after its first repeat):

# %%
SHARE_FILE = "dev-2core-xeon-amx-full-base-int8.json"
SHARE = json.loads((paths.DATA / "bench" / "cores" / SHARE_FILE).read_text())
rows = {f"spin {r['gomp_spincount']}, threads {r['threads']}": {
    "alone s": r["alone_s"], "two at once s": r["pair_s"],
    "two at once / default alone": r["pair_over_first_alone"],
    "beside a busy core s": r["beside_s"],
    "alone / default alone": r["alone_over_first_alone"],
    "server audio s/s alone": r["server"]["alone"]["delivered_audio_per_s"],
    "server audio s/s beside": r["server"]["beside_neighbour"]["delivered_audio_per_s"]}
    for r in SHARE["rows"]}
print(SHARE["machine"]["cpu"], "load before", SHARE["load_average_start"])
print(SHARE.get("note", ""))
display(pd.DataFrame(rows).T)

# %% [markdown]
# Two processes of two threads on two cores each take several times as long as one alone, where a fair share is
# twice: their workers wait for cores the other holds at every layer; with libgomp's own spin it is worse still
# (the note). One thread each costs one alone a good part of its speed but shares the cores well. `auto` is both:
# two threads alone, one beside another qtts process or a busy core it sees when it starts. A server started on a
# quiet machine keeps its two threads when a neighbour comes later (its rows): `--threads 1` on a shared machine.
# The checks hold the file's rows to that:

# %%
by = {(r["gomp_spincount"], r["threads"]): r for r in SHARE["rows"]}
two, auto = by[(3000, 2)], by[(3000, "auto")]
check.at_least("two at once, 2 threads each: over a fair share", "x alone",
               two["pair_over_alone"], 2.5)
check.at_most("two at once, --threads auto: within 2.5x one alone", "x default alone",
              auto["pair_over_first_alone"], 2.5)
check.at_most("one alone, --threads auto: within 5% of 2 threads", "x default alone",
              auto["alone_over_first_alone"], 1.05)
check.at_most("beside a busy core, --threads auto: faster than 2 threads", "x 2",
              auto["beside_s"] / two["beside_s"], 1.0)

# %% [markdown]
# ## Summary
# - GNU OpenMP keeps a worker pool per thread that ran a parallel region; with more workers than CPUs it parks them
#   in the kernel between regions, and a decoder step of many small layers pays a wake-up for each.
# - A program that hands ncnn to another thread calls `release_threads()` (`omp_pause_resource_all`) in the first
#   thread; `qtts serve`'s engine does.
# - Counted as voluntary context switches, a kept pool shows without a clock; at full size it cost more than the
#   second core bought.
# - Between processes, spinning workers and a thread count fixed at load make two ncnn processes on the same cores
#   slow each other several times over: the runtime spins 3000 rounds and `--threads auto` takes the cores others
#   leave it when it starts.
#
# **Artifacts left:** the appendix's report.
#
# **If your numbers differ**
# - *Released and kept pools count the same switches* → `release_threads()` found no OpenMP runtime (section 1
#   prints none, and it returns False): ncnn without OpenMP, or an OpenMP other than GNU's, which may not park its
#   workers this way.
# - *Every count is high, this thread's too* → the machine is busy: other processes' threads take the CPUs, and
#   the stepping thread waits for them whatever the pools do.
# - *Skipped* → one CPU (`os.cpu_count()`): no workers, nothing to release.

# %%
check.table()
