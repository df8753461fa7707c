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
# # Results: how fast, on every machine
# > Every committed full-size measurement side by side, read from `data/bench/` by the cells of this page.
#
# Each file in `data/bench/` is one run of the benchmark harness (`make bench`, `python -m qtts_lib.bench loop`) on
# one named machine, written in the schema `qtts_lib.bench.results.check_schema` enforces. Chapter 11 teaches how a
# run is made and read (fresh processes, interleaved repeats, medians, the machine described and its read bandwidth
# probed during the run); this page only gathers the runs. Rules for reading it:
# - A frame is 80 ms of audio; **RTF** is seconds of compute per second of audio (below 1 is faster than real time).
# - **× PyTorch** compares a row with PyTorch's row of the same file (same threads; on a GPU, PyTorch on CUDA):
#   ratios are only made within one run, never across files.
# - **loop / floor** is the generation loop (talker + predictor) against the time the weights it must read take at
#   the bandwidth measured in that run (chapter 11); GPU rows have no floor.
# - The precision tiers are chapters 13 and 14; the batch rows (many utterances at once) chapter 17; the GPU chapter 10.

# %%
import json
import re

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from qtts_lib import check, paths, settings
from qtts_lib.bench.results import check_schema

ckpt = settings.checkpoint()
report = check.begin("results", ckpt)
BENCH = paths.DATA / "bench"


def machine_name(stem: str) -> str:
    """The machine a file was made on, from its name (`<machine>-<checkpoint>...`)."""
    return re.sub(r"-vulkan(-loop)?$", "", stem.split("-full")[0])


files = {f: json.loads(f.read_text()) for f in sorted(BENCH.glob("*.json")) + sorted(BENCH.glob("batch/*.json"))}
results = {}
for f, doc in files.items():
    if "rows" not in doc:  # batch parity files: codes, not speed (chapter 17)
        continue
    check_schema(doc)
    results[f] = doc
top = [f for f in files if f.parent == BENCH]
check.equal("every top-level file of data/bench parses in the schema", "files", len([f for f in results if f in top]),
            len(top))
print(f"{len(results)} result files ({len(top)} end to end, {len(results) - len(top)} batched)")

# %% [markdown]
# ## 1. The machines
# What each machine is, as its files describe it (the first file's description; the read bandwidth is what the
# harness measured at the start of each run, so it varies from file to file on a shared virtual machine). The SIMD
# extensions are listed by files written since the harness began recording them.

# %%
machines = {}
for f, doc in results.items():
    m = doc["machine"]
    name = machine_name(f.stem)
    entry = machines.setdefault(name, {"CPU": m.get("cpu"), "SIMD": " ".join(m.get("simd", [])),
                                       "cores": m.get("cores"), "memory GB": m.get("memory_gb"),
                                       "GPU": m.get("gpu", ""), "ncnn": m.get("ncnn", ""), "bandwidth GB/s": [],
                                       "files": 0})
    entry["files"] += 1
    entry["bandwidth GB/s"] += [(int(t), bw) for t, bw in m.get("read_bandwidth_gbs", {}).items()]
for entry in machines.values():  # per thread count, the range over the machine's files
    by_threads = {t: [b for u, b in entry["bandwidth GB/s"] if u == t] for t, _ in sorted(entry["bandwidth GB/s"])}
    entry["bandwidth GB/s"] = "; ".join(f"{t} thr {min(b)}-{max(b)}" for t, b in by_threads.items())
pd.DataFrame(machines).T.rename_axis("machine")

# %% [markdown]
# ## 2. Every run, end to end
# One row per (runtime, device, tier, threads) of each file; milliseconds per frame by part, RTF, the ratio to
# PyTorch in the same file, and the loop against its floor. A tier marked "huge pages" ran with its weights in 2 MB
# pages, as `qtts serve` runs (`qtts_lib.runtime.app.hugepages`).

# %%
FORMS = {"landed": "exported graphs", "rewritten": "packed caches"}  # h200-vulkan.json: the GPU loop's other forms


def tier(r: dict) -> str:
    codec, form = r.get("codec_precision", "fp32"), FORMS.get(r.get("variant"))
    return (r["precision"] + (f", codec {codec}" if codec != "fp32" else "") + (f" ({form})" if form else "")
            + (", huge pages" if r.get("huge_pages") else ""))


def pytorch_total(doc: dict, r: dict) -> float | None:
    """PyTorch's ms per frame in the same file at the same threads (CUDA for a GPU row), where the harness made it
    in the same call (a row with a `variant` was added from another call: no ratio)."""
    device = "cuda" if r["device"] != "cpu" else "cpu"
    same = [p for p in doc["rows"] if p["runtime"] == "pytorch" and p["device"] == device
            and p["threads"] == r["threads"] and p.get("batch", 1) == r.get("batch", 1) and "variant" not in p]
    return same[0]["ms_per_frame"]["total"] if same else None


rows = []
for f, doc in results.items():
    for r in doc["rows"]:
        torch_ms = pytorch_total(doc, r)
        rows.append({"machine": machine_name(f.stem), "file": f.relative_to(BENCH).as_posix(),
                     "checkpoint": doc["checkpoint"], "runtime": r["runtime"], "device": r["device"],
                     "tier": tier(r), "threads": r["threads"], "batch": r.get("batch", 1),
                     **{f"{k} ms": v for k, v in r["ms_per_frame"].items()}, "RTF": r["rtf"],
                     "× PyTorch": None if torch_ms is None or r["runtime"] == "pytorch"
                     else round(torch_ms / r["ms_per_frame"]["total"], 2),
                     "floor ms": r["floor_ms_per_frame"], "loop / floor": r["floor_ratio"],
                     "frames/s": r.get("frames_per_s"), "one utterance ms": r.get("sequence_ms_per_frame")})
table = pd.DataFrame(rows)
batched = table.file.str.startswith("batch/")
single = table[~batched].drop(columns=["batch", "frames/s", "one utterance ms"])
for name, part in single.groupby("machine", sort=False):
    display(part.drop(columns="machine").set_index(["file", "runtime", "device", "tier", "threads"])
            .style.set_caption(f"{name}: {machines[name]['CPU']}, {machines[name]['cores']} cores "
                               f"{machines[name]['GPU']}").format(precision=2, na_rep="")
            .background_gradient(subset=["RTF"], cmap="RdYlGn_r", vmin=0.5, vmax=4))

# %% [markdown]
# The same rows as one picture: each dot a row, per machine; the red line is real time.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
names = list(machines)
markers = {"fp32": "o", "fp16": "s", "int8": "^"}
colors = {("ncnn", "cpu"): "tab:blue", ("ncnn", "vulkan"): "tab:purple", ("pytorch", "cpu"): "tab:gray",
          ("pytorch", "cuda"): "black"}
precision_of = single.tier.str.split(",| ").str[0]
for (runtime, device, precision), part in single.assign(p=precision_of).groupby(["runtime", "device", "p"]):
    x = [names.index(n) + (0.15 if runtime == "ncnn" else -0.15) for n in part.machine]
    style = dict(marker=markers.get(precision, "o"), color=colors[runtime, device], alpha=0.7)
    axes[0].scatter(x, part.RTF, label=f"{runtime} {device} {precision}", **style)
    has_floor = part["loop / floor"].notna().to_numpy()
    axes[1].scatter([v for v, keep in zip(x, has_floor) if keep], part["loop / floor"][has_floor], **style)
axes[0].axhline(1, color="crimson", ls="--", lw=1)
axes[1].axhline(1, color="black", lw=1)
axes[0].set(ylabel="RTF (below 1: faster than real time)", yscale="log", title="every end-to-end row")
axes[1].set(ylabel="loop / floor", title="CPU rows against their floor")
for ax in axes:
    ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
axes[0].legend(fontsize=7, ncol=2)
fig.tight_layout()

# %% [markdown]
# ## 3. Many utterances at once
# The batched harness (`python -m qtts_lib.bench batch`, chapter 17): B utterances through one scheduler, times per
# *aggregate* frame (all B sequences' frames together), the frames made per second, and how fast each utterance
# advances on its own.

# %%
batch = table[batched]
display(batch[["machine", "file", "device", "tier", "threads", "batch", "total ms", "RTF", "frames/s",
               "one utterance ms"]].set_index(["machine", "file", "device", "tier", "threads", "batch"])
        .style.format(precision=2, na_rep=""))
fig, ax = plt.subplots(figsize=(11, 3.2))
for (f, t, d), part in batch.groupby(["file", "tier", "device"]):
    ax.plot(part.batch, part["frames/s"], marker="o", label=f"{f.removeprefix('batch/')} ({d}, {t})")
ax.axhline(12.5, color="crimson", ls="--", lw=1, label="one real-time stream (12.5 frames/s)")
ax.set(xscale="log", xlabel="utterances at once (B)", ylabel="frames per second, all B together")
ax.set_xticks(sorted(batch.batch.unique()), [str(b) for b in sorted(batch.batch.unique())])
ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
fig.tight_layout()

# %% [markdown]
# ## 4. Streaming, and a frame call by call
# `python -m qtts_lib.bench stream` (chapter 15): time to first audio with pieces of one frame, the time from which
# playback never waits for a piece (newer files), and whole streams against `synthesize`, medians of fresh
# processes, with the weights in huge pages (as `qtts serve` runs) or not. `python -m qtts_lib.bench calls` (chapter
# 12): a frame of the int8 loop, its graph calls against their weights read by the same kernels alone. A file may
# hold an older version of the runtime measured in turn with the newer one (`--against`), each row marked with its
# version.

# %%
streams, frames = [], []
for f in sorted((BENCH / "stream").glob("*.json")):
    for r in json.loads(f.read_text()).get("rows", []):  # the oldest file predates rows
        ms = r["ms_per_frame"]
        streams.append({"file": f.stem, "version": (r["commit"] or "")[:7], "loop / codec":
                        f"{r['precision']} / {r['codec_precision']}" + (", huge pages" if r.get("huge_pages") else ""),
                        "first audio ms": r["ttfa_ms"]["1"],
                        **{f"gapless from ms, pieces of {k}": v for k, v in r.get("gapless_from_ms", {}).items()},
                        "synthesize": ms["synthesize"], "stream, pieces of 1": ms["stream_1"],
                        "stream, pieces of 4": ms["stream_4"],
                        "pieces of 1 / synthesize": r["stream_1_over_synthesize"]})
for f in sorted((BENCH / "calls").glob("*.json")):
    doc = json.loads(f.read_text())
    for side in [doc] + ([doc["against"]] if "against" in doc else []):
        frames.append({"file": f.stem, "version": (side["commit"] or "")[:7],
                       **{k: side["per_frame"][k] for k in ("frame_ms", "weights_ms", "rest_ms", "glue_ms")}})
display(pd.DataFrame(streams).set_index(["file", "version", "loop / codec"]).style.format(precision=3)
        .set_caption("ms per frame (80 ms is real time)"))
display(pd.DataFrame(frames).set_index(["file", "version"]).style.set_caption("the int8 loop, ms per frame"))

# %% [markdown]
# To add a machine: `make bench BENCH_NAME=<machine>-full-base` on a quiet machine (and `python -m qtts_lib.bench
# batch` for the batched rows), add the file to `data/bench/` in the repository, and this page picks it up.
# `data/bench/README.md` says what each file holds.

# %%
check.table()
