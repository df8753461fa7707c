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
# # 13 · Quantize the loop: fewer bytes per weight
# > The generation loop is memory-bound, so the only way below its fp32 floor is fewer bytes per weight.
#
# Chapter 11's *floor* is the time to read once, at the measured memory bandwidth, every weight a frame needs. A
# *precision tier* stores the decoders' weights in fewer bytes: fp32 (4 bytes, the export), fp16 (2 bytes, IEEE half
# precision, widened to fp32 for the arithmetic) or int8 (1 byte: an 8-bit integer times a float scale).
#
# **You will:** turn each tier's bytes per frame into a floor; write fp16 as a `.param` rewrite and int8 as new weights
# from numpy, checked against a numpy model of ncnn's arithmetic; time every tier; measure its cost in quality; count
# the int8 loop's graph calls per frame.
#
# **You will learn:** why fp32 cannot reach real time on two cores; how ncnn's int8 Gemm wants its weights; why
# agreement with fp32's codes, on random weights, is a pessimistic proxy.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; made here if missing). **Leaves behind:** `ncnn/int8/`,
# `data/outputs/<ckpt>/13_quality.json` and `13_one_gemm/`, `data/reports/<ckpt>/13_quantize_the_loop.json`.

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.runtime.pipeline import precision

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("13_quantize_the_loop", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)
ncnn_dir = paths.ncnn_dir(ckpt)
full = not ckpt.startswith("tiny")
BENCH = paths.DATA / "bench"
REFERENCE = "dev-2core-epyc"  # chapter 11's reference machine (2 cores, AMD EPYC)
committed = lambda name: json.loads((BENCH / name).read_text())  # noqa: E731

# %% [markdown]
# ## 1. Bytes per frame, per tier
# Chapter 11 counted the weights a frame reads: the talker decoder and its `codec_head` once, the code predictor's
# decoder and one of its 15 heads 15 times. A tier stores the decoders' projections (int8: the predictor's heads too)
# in fewer bytes; the codec head stays fp32, embeddings are read a few rows at a time, the codec has its own tiers
# (chapter 14). Over the bandwidth read now:

# %%
from qtts_lib.bench.machine import describe
from qtts_lib.bench.workload import weight_bytes_per_frame

bandwidth = describe([THREADS])["read_bandwidth_gbs"][str(THREADS)]
tiers = ["fp32", "fp16", "int8"]  # precision.TIERS adds int8 in blocks of K too
bytes_per_frame = {t: weight_bytes_per_frame(ncnn_dir, precision=t) for t in tiers}
mb = {t: bytes_per_frame[t] / 1e6 for t in tiers}  # MB per frame; MB / (GB/s) = ms
floors = pd.DataFrame({"bytes per weight": [precision.weight_bytes(t) for t in tiers],
                       "MB read per frame": [round(mb[t], 2) for t in tiers],
                       f"floor ms/frame at {bandwidth} GB/s":
                       [round(mb[t] / bandwidth, 2) for t in tiers]}, index=tiers)
order = " < ".join(sorted(tiers, key=bytes_per_frame.get))
check.equal("tiers by bytes read per frame", "order", order, "int8 < fp16 < fp32")
display(floors)

# %% [markdown]
# ## 2. fp16: a `.param` rewrite
# fp16 needs no new weights. ncnn has two layers for a projection: `Gemm` (a matrix product, what pnnx wrote) and
# `InnerProduct` (torch's `Linear`). On x86 only InnerProduct keeps fp16 weights, when the net's `use_fp16_storage` is
# on, widening them while reading (the CPU's F16C instructions) for fp32 arithmetic. The option would round every
# activation too, so `rewrites.decode_step.fp16_step` rewrites a *step graph* (the one-position graph of a decode step)
# into InnerProducts and masks every other layer back to fp32 (`31=2`, the *featmask* param turning fp16 off per
# layer); prefill keeps the fp32 Gemm graph, so the tier holds the weights 1.5 times.

# %%
from qtts_lib.runtime.rewrites.decode_step import fp16_step

fp16_lines = fp16_step((ncnn_dir / "talker_decoder_kv.param").read_text()).splitlines()
masked = sum("31=2" in line for line in fp16_lines)
inner = sum(line.startswith("InnerProduct") for line in fp16_lines)
print(f"fp16 step graph: {inner} InnerProducts with fp16 weights, "
      f"{masked} layers masked back to fp32")

# %% [markdown]
# ## 3. int8: the projections written from numpy
# ncnn's `Gemm` computes A·B. `rewrites.int8.int8_graph` rewrites every projection (a Gemm whose B is a constant
# weight) as ncnn's int8 Gemm with the weights as its constant **A**, with *per-row scales*: each row (one output
# feature) is stored as 8-bit integers times its own scale, its largest |weight| / 127. ncnn allows a scale per row
# of a constant A but one per *tensor* of a constant B (`Gemm::load_model` in ncnn's `src/layer/gemm.cpp`), which
# would waste most of the 8 bits on rows of small weights. The activations become B, quantized as it runs (largest
# |value| → 127, one scale per call, shared by the rows of a prefill or a batch), multiplied in int32 on VNNI (the
# CPU's 8-bit dot-product instructions). Projections sharing an input are fused (q/k/v, gate/up), then cut apart by a
# `Slice`. Layer 0's attention, exported and int8 (`4=1` constant A, `7` its rows, `9` K, the inputs per row, `14=1`
# output back to rows × features, `18=2` int8 with run-time scales, `22` one tile over K):

# %%
precision.ensure_int8_tier(ncnn_dir, log=print)
exported = (ncnn_dir / "talker_decoder_kv.param").read_text().splitlines()
written = precision.int8_paths(ncnn_dir, "talker_decoder")[0].read_text().splitlines()
gemms = [" ".join(x.split()) for x in exported if x.startswith("Gemm")]  # unpadded
int8s = [" ".join(x.split()) for x in written if x.split()[0] in ("Gemm", "Slice")]
print("exported:", *gemms[:3], "int8:", *int8s[:2], sep="\n  ")
stamps = json.loads((ncnn_dir / "int8" / "stamp.json").read_text())
for name in precision.INT8_GRAPHS:  # int8 weights, fp32 row scales, norms: ~1 byte each
    size = precision.int8_paths(ncnn_dir, name)[1].stat().st_size
    check.at_most(f"{name}: int8 .bin bytes per quantized weight", "bytes",
                  size / stamps[name]["weights"], 1.05)
pd.DataFrame({n: {"int8 Gemms": stamps[n]["gemms"],
                  "Gemms fused away": stamps[n].get("fused_away", 0),
                  "weights": stamps[n]["weights"],
                  "weight error (rel. RMS)": round(stamps[n]["weight_rel_rms"], 4)}
              for n in precision.INT8_GRAPHS}).transpose()

# %% [markdown]
# The predictor's heads are rewritten the same way, not fused (a step needs one of the 15), and run inside its graph.
# Does ncnn compute what we think? One talker projection in int8, run by ncnn, against a numpy model: `quantize_rows`
# gives `w ≈ q / 127 · scale` per row, the input is `x ≈ x_q / a_scale`, so `y ≈ x_q · qᵀ / (127 · a_scale) · scale`,
# the integer sums exact. It must match to float rounding; the fp32 product it only approximates:

# %%
from qtts_lib.runtime.binding.graph import Graph, params_dict
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.binding.weights import FP32_TAG, split_bin
from qtts_lib.runtime.rewrites.int8 import int8_graph, quantize_rows

text = (ncnn_dir / "talker_decoder.param").read_text()
gemm = next(layer for layer in Graph(text).layers if layer.type == "Gemm")
n, k = (int(params_dict(gemm)[key]) for key in ("8", "9"))
blobs = split_bin(text, (ncnn_dir / "talker_decoder.bin").read_bytes())
w = blobs[gemm.name][0].array().reshape(n, k)  # (out, in)
one = f"7767517\n2 2\nInput in 0 1 in\nGemm g 1 1 in out {' '.join(gemm.params)}\n"
q_text, q_bin, _ = int8_graph(one, FP32_TAG + w.tobytes())
work = paths.outputs_dir(ckpt) / "13_one_gemm"
work.mkdir(parents=True, exist_ok=True)
(work / "g.param").write_text(q_text), (work / "g.bin").write_bytes(q_bin)
x = np.random.default_rng(0).standard_normal((4, k)).astype(np.float32)
net = make_net(work / "g.param", work / "g.bin", THREADS)
y = run(net, {"in": x}, ["out"], name="one int8 Gemm")[0]  # (4, n)
q, scale = quantize_rows(w)
a_scale = 127 / np.abs(x).max()
x_q = np.clip(np.rint(x * a_scale), -127, 127)
model = (x_q @ q.T.astype(np.float64)) / (a_scale * 127) * scale
check.close(f"ncnn int8 Gemm ({gemm.name}, {n}x{k}) vs the numpy model of its "
            "arithmetic", y, model, rel=1e-5)
check.within("the same int8 Gemm vs the fp32 product", "rel", y, x @ w.T, 0.03)

# %% [markdown]
# ## 4. Time the decoders in every tier
# One talker and one predictor decoder per tier as the runtime loads them (`precision.decoder`), the same prefill and
# steps, tiers interleaved, each with its own cache; on a tiny checkpoint this is call overhead (section 6: full size).

# %%
import time

talker_cfg = checkpoint.load_config(ckpt)["talker_config"]
decoders = {"talker_decoder": talker_cfg,
            "predictor_decoder": talker_cfg["code_predictor_config"]}
rng = np.random.default_rng(4)
steps_ms = {}
for name, c in decoders.items():
    nets = {t: precision.decoder(ncnn_dir, name, c["head_dim"], c["rope_theta"],
                                 THREADS, precision=t) for t in tiers}
    x0, *xs = [rng.standard_normal((1, n, c["hidden_size"])).astype(np.float32)
               for n in [8] + [1] * 12]  # a prefill of 8 positions, 12 steps
    times = {t: [] for t in tiers}
    prefilled = {t: net.prefill(x0) for t, net in nets.items()}  # ((1, 8, H), cache)
    outs = {t: [hidden] for t, (hidden, _) in prefilled.items()}
    for x in xs:
        for t, net in nets.items():
            t0 = time.perf_counter()
            outs[t].append(net.forward(x, prefilled[t][1]))
            times[t].append((time.perf_counter() - t0) * 1e3)
    steps_ms[name] = {t: float(np.median(v[2:])) for t, v in times.items()}
    got = {t: np.concatenate([o.reshape(-1, o.shape[-1]) for o in v])
           for t, v in outs.items()}
    del nets
    for t in ("fp16", "int8"):
        check.within(f"{name}: {t} vs fp32 over a prefill and 12 steps", "rel",
                     got[t], got["fp32"], 5e-3 if t == "fp16" else 0.1)
pd.DataFrame(steps_ms).round(2).rename_axis("step ms (median)")

# %% [markdown]
# ## 5. What a tier costs in quality
# Faster is worthless if the codes change. `bench.quality.measure` measures, on one prompt, greedy (random weights
# make near-ties between the top two logits common, so a tiny rounding flips a pick far more often than on a trained
# checkpoint: a pessimistic proxy):
# - **teacher-forced agreement**: at every step the tier is fed fp32's code, not its own (*teacher forcing*: the
#   runtime's loop driven by `quality.TeacherForced`, a `Sampler` that returns fp32's code), and we count how often it
#   would have picked that code; one share per codebook (fp32 against itself gives 1.0, which checks the harness);
# - the **first divergent frame**, where the tier running free on its own codes first leaves fp32's;
# - the **per-layer error** of one decode step against fp32 (drawn below).

# %%
from qtts_lib.bench import quality

live = quality.measure(model_dir, tiers, frames=200 if full else 40, threads=THREADS,
                       progress=False)
(paths.outputs_dir(ckpt) / "13_quality.json").write_text(json.dumps(live, indent=1))
check.equal("teacher forcing reproduces fp32's own greedy codes (lowest agreement)",
            "agreement", min(live["tiers"]["fp32"]["agreement"]), 1.0)
check.at_least("fp16: teacher-forced agreement, mean over codebooks", "agreement",
               float(np.mean(live["tiers"]["fp16"]["agreement"])), 0.9)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), layout="tight")  # the per-layer error
for ax, name in zip(axes, precision.DECODERS):
    for t in ("fp16", "int8"):
        rel = live["tiers"][t]["layer_errors"][name]["rel"]
        ax.semilogy(np.maximum(rel, 1e-9), label=t, lw=1)
    ax.set(xlabel="layer (forward order)", ylabel="relative error",
           title=f"{name}: one decode step vs fp32")
    ax.legend(fontsize=8)

# %% [markdown]
# Two helpers read such a measurement (here and below): a table per tier, and the agreement per codebook as lines:

# %%
def quality_table(res: dict) -> pd.DataFrame:
    return pd.DataFrame({t: {
        "codebook 0": r["agreement_codebook0"],
        "codebooks 1-15 (mean)": r["agreement_predictor_mean"],
        "first divergent frame": r["first_divergent_frame"],
        "talker step: output rel. error":
        (r["layer_errors"] or {}).get("talker_decoder", {}).get("output_rel", 0.0)}
        for t, r in res["tiers"].items()}).T


def agreement_plot(res: dict, title: str):
    ax = plt.subplots(figsize=(9, 3), layout="tight")[1]
    for t, r in res["tiers"].items():
        ax.plot(range(res["codebooks"]), r["agreement"], marker="o", label=t)
    ax.set(xlabel="codebook (0 = talker, 1-15 = code predictor)",
           ylabel="teacher-forced top-1 agreement", ylim=(-0.02, 1.02), title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside


display(quality_table(live))
agreement_plot(live, f"{ckpt}: {live['frames']} frames, random weights "
               "(near-ties make this pessimistic)")

# %% [markdown]
# At full size (`make quality`), committed: `full-base` on the reference machine (int8, section 3's form, from its
# `-weights-as-a` file); `full-1.7b-customvoice` on a larger host, as its talker's export needs more memory. The 1.7B
# loses more: appendix E finds where, and what wins the codes back.

# %%
n_files = len(list((BENCH / "quality").glob("*.json")))
check.at_least("committed full-size quality measurements", "files", n_files, 2)
q_tiers = committed(f"quality/{REFERENCE}-full-base.json")
q_int8 = committed(f"quality/{REFERENCE}-full-base-weights-as-a.json")
full_q = q_int8 | {"tiers": {t: (q_int8 if t == "int8" else q_tiers)["tiers"][t]
                             for t in tiers}}
q17 = committed("quality/h100-host-cpu-full-1.7b-customvoice.json")
q17["tiers"] = {t: q17["tiers"][t] for t in ("fp32", "int8")}  # the rest: appendix E
check.equal("1.7B: teacher forcing gives fp32 its own codes", "agreement",
            min(q17["tiers"]["fp32"]["agreement"]), 1.0)
both = pd.concat({"full-base": quality_table(full_q),
                  q17["checkpoint"]: quality_table(q17)})
display(both.style.set_caption(f"{full_q['frames']} frames, random weights; the 1.7B "
                               f"on the CPU of an {q17['machine']['gpu']} host"))
with_17 = full_q["tiers"] | {"int8, 1.7B": q17["tiers"]["int8"]}
agreement_plot(full_q | {"tiers": with_17}, "full-base; int8 at 1.7B")

# %% [markdown]
# ## 6. Full size, on the reference machine
# `make bench BENCH_PRECISION=fp32,fp16,int8` (chapter 11's harness): PyTorch, fp32 and fp16 from one run, int8 from
# two runs of section 3's form, the fp32 codec everywhere; every machine is on the [results page](results.ipynb). Each
# row's floor comes from the bandwidth its run's *probe* (a timed read of a large buffer) measured; `loop / floor` is
# talker + predictor over it. A frame is 80 ms of audio, so real time allows that much per frame, and only int8's
# floor is under it. The 2-thread rows as bars:

# %%
from qtts_lib.bench.results import check_schema

tier_run = committed(f"{REFERENCE}-full-base-tiers.json")
int8_runs = [committed(f"{REFERENCE}-full-base-int8-weights-as-a{s}.json")
             for s in ("", "-run2")]
tiered = [f for f in BENCH.glob("*.json")
          if len({r["precision"] for r in json.loads(f.read_text())["rows"]}) > 1]
check.at_least("committed full-size runs with precision tiers", "files", len(tiered), 1)
for doc in [tier_run, *int8_runs]:
    check_schema(doc)
full_rows = [r for r in tier_run["rows"] if r["precision"] != "int8"] + [
    r | {"runtime": f"ncnn (run {i})"} for i, doc in enumerate(int8_runs, 1)
    for r in doc["rows"] if r["codec_precision"] == "fp32"]
sized = pd.DataFrame([{"runtime": r["runtime"], "precision": r["precision"],
                       "threads": r["threads"], **r["ms_per_frame"], "RTF": r["rtf"],
                       "floor": r["floor_ms_per_frame"],
                       "loop / floor": r["floor_ratio"], "peak GB": r["peak_rss_gb"]}
                      for r in full_rows])
sized = sized.sort_values(["threads", "total"], ascending=[True, False])
sized = sized.set_index(["threads", "runtime", "precision"])
display(sized.style.set_caption(f"full-base, {tier_run['machine']['cpu']}, "
                                f"{tier_run['frames']} frames, ms per frame"))
two = sized.loc[2]  # the 2-thread rows as bars, beside the loop's floor
bars = two[["talker", "predictor", "codec"]]
bars = bars.set_axis([f"{r}\n{p}" for r, p in two.index])  # runtime, precision
ax = bars.plot.bar(stacked=True, figsize=(8, 3.4), rot=0)
ax.scatter(range(len(two)), two["floor"], marker="_", s=900, c="k", label="loop floor")
ax.axhline(80, color="crimson", ls="--", lw=1, label="real time")
ax.set(ylabel="ms per frame", xlabel="",
       title="full-base, reference machine, 2 threads: where a frame goes")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), markerscale=0.3)
plt.show()

# %% [markdown]
# ## 7. Count what a frame of the int8 loop calls
# Only the int8 loop's floor is under real time, yet the loop runs above it (chapter 14 section 1). A frame makes a
# fixed set of graph calls, each extracting one output: the talker's codec head, the predictor's prefill and 14 steps
# (heads inside), a talker step; only the prefill hands back caches, as a step appends its keys and values into the
# cache Mats fed in. Counted live: nets made while `CountedNet` stands in for `ncnn.Net` count their extractors (one
# per graph call) and `extract`s.

# %%
import ncnn

tally = {"calls": 0, "outputs": 0, "caches": 0}


class Counted:
    """An extractor whose `extract` calls are counted: caches, and the other outputs."""

    def __init__(self, ex):
        self.ex = ex
    def __getattr__(self, attr):  # everything else: the real extractor's
        return getattr(self.ex, attr)
    def extract(self, name, *args):
        tally["caches" if name.startswith("cache_") else "outputs"] += 1
        return self.ex.extract(name, *args)


class CountedNet(ncnn.Net):
    def create_extractor(self):  # one extractor per graph call
        tally["calls"] += 1
        return Counted(super().create_extractor())

# %% [markdown]
# An int8 synthesizer made while `ncnn.Net` counts generates 8 and 16 frames; the difference drops the prompt's
# prefill. Per frame: a call and an output per codebook, plus the codec head's; as caches, the predictor prefill's K
# and V per layer, and the talker's when its steps outgrow their cache Mats (all its layers, once at most in 8 frames):

# %%
from qtts_lib.bench.workload import LANGUAGE, TEXT
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.pipeline.sampling import Sampler

real_net, ncnn.Net = ncnn.Net, CountedNet  # nets made now count themselves
try:
    synth = Synthesizer(model_dir, threads=THREADS, precision="int8")
finally:
    ncnn.Net = real_net
prompt = synth.prompt(TEXT, LANGUAGE, synth.voice(wav=load_wav(paths.voice_wav())))
spent = {}
for frames in (8, 16):
    tally.update(calls=0, outputs=0, caches=0)
    greedy = Sampler(Sampling(greedy=True), synth.config.talker)
    seq = synth.loop.run(prompt, greedy, frames)
    spent[len(seq.codes)] = dict(tally)
(f1, a), (f2, b) = sorted(spent.items())
per_frame = {key: (b[key] - a[key]) / (f2 - f1) for key in a}
calls = talker_cfg["num_code_groups"] + 1  # head, predictor prefill + 14 steps, talker
caches = 2 * talker_cfg["code_predictor_config"]["num_hidden_layers"]  # prefill's K, V
grown = 2 * talker_cfg["num_hidden_layers"] / (f2 - f1)  # talker K, V regrown once
check.equal(f"int8 loop: graph calls per frame on {ckpt}", "calls",
            round(per_frame["calls"]), calls)
check.equal(f"int8 loop: outputs extracted per frame on {ckpt}", "outputs",
            round(per_frame["outputs"]), calls)
check.at_most(f"int8 loop: caches extracted per frame on {ckpt}, beyond the "
              "predictor's prefill", "caches", per_frame["caches"] - caches, grown)

# %% [markdown]
# ## Summary
# - The loop's floor is bytes per frame over bandwidth: fp16 halves it, int8 about quarters it.
# - fp16 is a `.param` rewrite; int8 a new `.param`/`.bin` from numpy (weights as the Gemm's constant A, per-row
#   scales, one activation scale per call), checked against a numpy model of ncnn's arithmetic. `--precision` picks
#   the tier; fp32 stays the default, the one that holds token parity with PyTorch.
# - Quality is measured, not assumed: teacher-forced agreement, first divergent frame, per-layer error.
#
# **Artifacts left:** `models/<ckpt>/ncnn/int8/` (rewritten when the exports change), `13_quality.json`,
# `13_one_gemm/`, the report. What bounds the loop, what was tried: the [lab notes](../lab_notes.md).
#
# **If your numbers differ**
# - *int8 no faster than fp16* → no VNNI (`grep avx512_vnni /proc/cpuinfo`): ncnn's int8 Gemm runs on plain AVX2.
# - *fp16 steps equal to fp32* → F16C is missing, or `use_fp16_storage` was not set before `load_param`.
# - *low agreement on a real checkpoint* → the first layer that jumps in the per-layer plot has outlier activations
#   (their absmax sets one scale for every feature): keep it fp32.
# - *the int8 loop further from its floor than committed* → compare within one run: bandwidth drifts between runs.

# %%
check.table()
