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
# > Every committed full-size measurement side by side, read from `data/bench/` by the (folded) cells of this page.
#
# Each file in `data/bench/` is one run of a benchmark harness (`make bench`, `python -m qtts_lib.bench loop`) on one
# named machine, in the schema `qtts_lib.bench.results.check_schema` enforces. Chapter 11 teaches how a run is made
# and read (fresh processes, interleaved repeats, medians, the machine described, its read bandwidth probed during
# the run) and names the reference machine; this page only gathers the runs. Rules for reading it:
# - A frame is 80 ms of audio; **RTF** is seconds of compute per second of audio (below 1 is faster than real time).
# - **× PyTorch** compares a row with PyTorch's row of the same file (same threads; on a GPU, PyTorch on CUDA):
#   ratios are only made within one run, never across files.
# - **loop / floor** is the generation loop (talker + predictor) against the time the weights it must read take at
#   the bandwidth measured in that run (chapter 11); GPU rows have no floor.
# - A **tier** is the precision the weights run in (fp32, fp16, int8; the loop's and the codec's chosen apart),
#   "huge pages" added where the weights sat in huge memory pages (chapter 11, section 7).
# - The precision tiers are chapters 13 and 14; the batch rows chapter 17; the GPU appendix C; streaming chapter 15.
#
# The cell below reads every file (its code is folded: click to show it) and checks each against the schema.

# %% tags=["hide-input"]
import json
import re

from qtts_lib import check, paths, settings
from qtts_lib.bench.results import check_schema

ckpt = settings.checkpoint()
report = check.begin("results", ckpt)
BENCH = paths.DATA / "bench"


def machine_name(stem: str) -> str:
    """The machine a file was made on, from its name (`<machine>-<checkpoint>...`)."""
    return re.sub(r"-vulkan(-loop)?$", "", stem.split("-full")[0])


names = sorted(BENCH.glob("*.json")) + sorted(BENCH.glob("batch/*.json"))
files = {f: json.loads(f.read_text()) for f in names}
results = {f: doc for f, doc in files.items() if "rows" in doc}  # parity: no speed
for doc in results.values():
    check_schema(doc)
top = [f for f in files if f.parent == BENCH]
check.equal("every top-level file of data/bench parses in the schema", "files",
            len([f for f in results if f in top]), len(top))
print(f"{len(results)} result files ({len(top)} end to end, "
      f"{len(results) - len(top)} batched)")

# %% [markdown]
# Every end-to-end row into one table: its machine, its tier (loop precision, the codec's where it differs, huge
# pages), its milliseconds per frame, RTF, the ratio to PyTorch in the same file and the loop against its floor. One
# GPU file (`h200-vulkan.json`) times two forms of the loop, named in its rows' `variant`: chapter 10's exported
# graphs and its packed caches; the picture below leaves those rows out.

# %% tags=["hide-input"]
import pandas as pd

FORMS = {"landed": "exported graphs", "rewritten": "packed caches"}  # h200-vulkan.json


def tier(r: dict) -> str:
    codec, form = r.get("codec_precision", "fp32"), FORMS.get(r.get("variant"))
    return (r["precision"] + (f", codec {codec}" if codec != "fp32" else "")
            + (f" ({form})" if form else "")
            + (", huge pages" if r.get("huge_pages") else ""))


def pytorch_total(doc: dict, r: dict) -> float | None:
    """PyTorch's ms per frame in the same file, same threads (CUDA for a GPU row), where
    the harness made it in the same call (a row with a `variant` came from another)."""
    device = "cuda" if r["device"] != "cpu" else "cpu"
    same = [p for p in doc["rows"]
            if p["runtime"] == "pytorch" and p["device"] == device
            and p["threads"] == r["threads"] and p.get("batch", 1) == r.get("batch", 1)
            and "variant" not in p]
    return same[0]["ms_per_frame"]["total"] if same else None


rows = []
for f, doc in results.items():
    for r in doc["rows"]:
        torch_ms = None if r["runtime"] == "pytorch" else pytorch_total(doc, r)
        rows.append({"machine": machine_name(f.stem),
                     "file": f.relative_to(BENCH).as_posix(),
                     "checkpoint": doc["checkpoint"], "runtime": r["runtime"],
                     "device": r["device"], "tier": tier(r),
                     "variant": r.get("variant"),
                     "threads": r["threads"], "batch": r.get("batch", 1),
                     **{f"{k} ms": v for k, v in r["ms_per_frame"].items()},
                     "RTF": r["rtf"],
                     "× PyTorch": torch_ms
                     and round(torch_ms / r["ms_per_frame"]["total"], 2),
                     "floor ms": r["floor_ms_per_frame"],
                     "loop / floor": r["floor_ratio"],
                     "frames/s": r.get("frames_per_s"),
                     "one utterance ms": r.get("sequence_ms_per_frame")})
table = pd.DataFrame(rows)
batched = table.file.str.startswith("batch/")

# %% [markdown]
# ## The picture
# Left: each machine's best real-time factor per runtime and tier (one utterance of `full-base`, any thread count),
# PyTorch in black, each ncnn tier with its floor as a dash of the same colour (the RTF the generation loop alone
# would have at the floor: no runtime of that tier on that machine can beat it). Right: the streaming runs (chapter
# 15: audio handed out piece by piece, here pieces of one frame), their time from the request to the first piece,
# per machine and tier; rows of an earlier runtime timed beside the current one (`--against`) are left out. The red
# lines are real time and one frame.

# %% tags=["hide-input"]
import matplotlib.pyplot as plt


def earlier(stem: str, commit: str | None) -> bool:
    """A row of an older runtime timed in turn with the newer (`--against`)."""
    m = re.search(r"-against-([0-9a-f]+)$", stem)
    return bool(m and commit and commit.startswith(m.group(1)))


one = table[~batched & (table.checkpoint == "full-base") & table.variant.isna()]
one = one.assign(who=one.runtime + " " + one.tier.str.split(",").str[0]
                 + one.device.map(lambda d: "" if d == "cpu" else " (GPU)"))
best = one.loc[one.groupby(["machine", "who"]).RTF.idxmin()]
machines = sorted(best.machine.unique())
colors = {"pytorch fp32": "black", "pytorch fp32 (GPU)": "dimgray",
          "ncnn fp32": "tab:blue", "ncnn fp16": "tab:orange", "ncnn int8": "tab:green",
          "ncnn fp32 (GPU)": "tab:purple"}
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), width_ratios=(3, 2))
for n, (who, part) in enumerate(best.groupby("who")):
    x = [machines.index(m) + 0.1 * (n - 2.5) for m in part.machine]
    left.scatter(x, part.RTF, color=colors.get(who), label=who, zorder=3)
    left.scatter(x, part["floor ms"] / 80, color=colors.get(who), marker="_", s=200)
left.axhline(1, color="crimson", ls="--", lw=1)
left.set(yscale="log", ylabel="RTF (dash: its floor)",
         title="one utterance, best of each tier")
left.set_xticks(range(len(machines)), machines, rotation=15, fontsize=8)
left.set_ylim(top=best.RTF.max() * 4)  # room for the legend above the dots
left.legend(fontsize=7, ncol=3, loc="upper center")
streams = []
for f in sorted((BENCH / "stream").glob("*.json")):
    for r in json.loads(f.read_text()).get("rows", []):  # the oldest file predates rows
        if not earlier(f.stem, r.get("commit")):
            streams.append({"machine": machine_name(f.stem),
                            "first audio ms": r["ttfa_ms"]["1"],
                            "tier": f"{r['precision']} / {r['codec_precision']}"
                            + (", huge pages" if r.get("huge_pages") else "")})
streams = pd.DataFrame(streams)
for tier_name, part in streams.groupby("tier"):
    right.scatter(part.machine, part["first audio ms"], label=tier_name, zorder=3)
right.axhline(80, color="crimson", ls="--", lw=1, label="one frame of audio")
right.set(ylabel="ms to first audio", title="streaming, pieces of one frame",
          ylim=(0, None))
right.tick_params(axis="x", labelsize=8)
right.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# ## 1. The machines
# What each machine is, as its files describe it (the first file's description; the read bandwidth is what the
# harness measured at the start of each run, so it varies from file to file on a shared virtual machine). The SIMD
# extensions are listed by files written since the harness began recording them.

# %% tags=["hide-input"]
machines = {}
for f, doc in results.items():
    m = doc["machine"]
    entry = machines.setdefault(machine_name(f.stem), {
        "CPU": m.get("cpu"), "SIMD": " ".join(m.get("simd", [])),
        "cores": m.get("cores"), "memory GB": m.get("memory_gb"),
        "GPU": m.get("gpu", ""), "ncnn": m.get("ncnn", ""),
        "bandwidth GB/s": [], "files": 0})
    entry["files"] += 1
    bandwidth = m.get("read_bandwidth_gbs", {})
    entry["bandwidth GB/s"] += [(int(t), bw) for t, bw in bandwidth.items()]
for entry in machines.values():  # per thread count, the range over the machine's files
    pairs = entry["bandwidth GB/s"]
    by_threads = {t: [b for u, b in pairs if u == t] for t, _ in sorted(pairs)}
    entry["bandwidth GB/s"] = "; ".join(f"{t} thr {min(b)}-{max(b)}"
                                        for t, b in by_threads.items())
pd.DataFrame(machines).T.rename_axis("machine")

# %% [markdown]
# ## 2. Every run, end to end
# One row per (runtime, device, tier, threads) of each file; milliseconds per frame by part, RTF (coloured green
# when fast, red when slow), the ratio to PyTorch in the same file, and the loop against its floor. A tier marked
# "huge pages" ran with its weights in 2 MB pages, as `qtts serve` runs (`qtts_lib.runtime.app.hugepages`).

# %% tags=["hide-input"]
from IPython.display import display

single = table[~batched].drop(columns=["batch", "frames/s", "one utterance ms",
                                      "variant"])
for name, part in single.groupby("machine", sort=False):
    m = machines[name]
    keys = ["file", "runtime", "device", "tier", "threads"]
    display(part.drop(columns="machine").set_index(keys)
            .style.set_caption(f"{name}: {m['CPU']}, {m['cores']} cores {m['GPU']}")
            .format(precision=2, na_rep="")
            .background_gradient(subset=["RTF"], cmap="RdYlGn_r", vmin=0.5, vmax=4))

# %% [markdown]
# ## 3. Many utterances at once
# The batched harness (`python -m qtts_lib.bench batch`, chapter 17): B utterances through one scheduler, times per
# *aggregate* frame (all B sequences' frames together), the frames made per second, and how fast each utterance
# advances on its own.

# %% tags=["hide-input"]
batch = table[batched]
index = ["machine", "file", "device", "tier", "threads", "batch"]
display(batch[index + ["total ms", "RTF", "frames/s", "one utterance ms"]]
        .set_index(index).style.format(precision=2, na_rep=""))
fig, ax = plt.subplots(figsize=(11, 3.2))
for (f, t, d), part in batch.groupby(["file", "tier", "device"]):
    label = f"{f.removeprefix('batch/')} ({d}, {t})"
    ax.plot(part.batch, part["frames/s"], marker="o", label=label)
ax.axhline(12.5, color="crimson", ls="--", lw=1,
           label="one real-time stream (12.5 frames/s)")
ax.set(xscale="log", xlabel="utterances at once (B)",
       ylabel="frames per second, all B together")
sizes = sorted(batch.batch.unique())
ax.set_xticks(sizes, [str(b) for b in sizes])
ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
fig.tight_layout()

# %% [markdown]
# ## 4. Streaming, and a frame call by call
# `python -m qtts_lib.bench stream` (chapter 15): time to first audio with pieces of one frame, the time from which
# playback never waits for a piece (newer files), and whole streams against `synthesize`, medians of fresh
# processes, with the weights in huge pages (as `qtts serve` runs) or not. `python -m qtts_lib.bench calls`
# (chapter 12): a frame of the int8 loop (`frame_ms`) split into `weights_ms` (its calls' weights read by the same
# kernels alone), `rest_ms` (the frame beyond that) and `glue_ms` (the frame outside its graph calls: Python and
# numpy between them). A file may also hold an earlier version of the runtime, timed in turn with the current one
# (`--against`): its rows are marked "earlier".

# %% tags=["hide-input"]
rows, frames = [], []
for f in sorted((BENCH / "stream").glob("*.json")):
    for r in json.loads(f.read_text()).get("rows", []):
        ms = r["ms_per_frame"]
        rows.append({"machine": machine_name(f.stem),
                     "runtime": "earlier" if earlier(f.stem, r["commit"])
                     else "current",
                     "loop / codec": f"{r['precision']} / {r['codec_precision']}"
                     + (", huge pages" if r.get("huge_pages") else ""),
                     "first audio ms": r["ttfa_ms"]["1"],
                     **{f"gapless from ms, pieces of {k}": v
                        for k, v in r.get("gapless_from_ms", {}).items()},
                     "synthesize": ms["synthesize"],
                     "stream, pieces of 1": ms["stream_1"],
                     "stream, pieces of 4": ms["stream_4"],
                     "pieces of 1 / synthesize": r["stream_1_over_synthesize"]})
for f in sorted((BENCH / "calls").glob("*.json")):
    doc = json.loads(f.read_text())
    sides = [(doc, "current")] + [(doc[k], "earlier") for k in ("against",) if k in doc]
    for side, when in sides:
        frames.append({"machine": machine_name(f.stem), "runtime": when,
                       **{k: side["per_frame"][k]
                          for k in ("frame_ms", "weights_ms", "rest_ms", "glue_ms")}})
display(pd.DataFrame(rows).set_index(["machine", "runtime", "loop / codec"])
        .style.format(precision=3).set_caption("ms per frame (80 ms is real time)"))
display(pd.DataFrame(frames).set_index(["machine", "runtime"])
        .style.set_caption("the int8 loop, ms per frame"))

# %% [markdown]
# ## 5. Parity at full size
# The chapters prove every code path on tiny checkpoints; the real widths and memory are proved by full-size runs
# of `python -m qtts_lib.bench parity` (reference and runtime on one machine, greedy), committed under
# `data/bench/parity/`. A row counts the codes that differ from the reference's and compares the waveforms.

# %% tags=["hide-input"]
PARITY = ["case", "frames", "codes_compared", "codes_mismatched", "eos_step",
          "prompt_rel_err", "wav_snr_db"]
for f in sorted((BENCH / "parity").glob("*.json")):
    doc = json.loads(f.read_text())
    machine = f"{doc['machine']['cpu']} ({doc['machine']['cores']} cores)"
    display(pd.DataFrame(doc["parity"]).reindex(columns=PARITY).set_index("case")
            .style.set_caption(f"{doc['checkpoint']} on {machine}"))

# %% [markdown]
# To add a machine: `make bench BENCH_NAME=<machine>-full-base` on a quiet machine (and `python -m qtts_lib.bench
# batch` for the batched rows), add the file to `data/bench/` in the repository, and this page picks it up.
# `data/bench/README.md` says what each file holds.

# %%
check.table()
