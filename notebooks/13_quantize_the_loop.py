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
# **You will:** turn each precision tier's bytes per frame into a floor; write fp16 as a `.param` rewrite and int8 as
# new weights from numpy, checked against a numpy model of ncnn's int8 arithmetic; time the decoders in every tier;
# measure what a tier costs against fp32; take the int8 loop apart against its floor, counting its graph calls live.
#
# **You will learn:** why fp32 cannot reach real time on two cores; how ncnn's int8 Gemm wants its weights; why
# agreement on random weights is a pessimistic proxy; what stands between the int8 loop and its floor.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing). **Leaves behind:**
# `models/<ckpt>/ncnn/int8/` (the int8 tier, written once), `data/outputs/<ckpt>/13_quality.json`,
# `data/outputs/<ckpt>/13_one_gemm/`, `data/reports/<ckpt>/13_quantize_the_loop.json`.

# %%
import json
import time

import matplotlib.pyplot as plt
import ncnn
import numpy as np
import pandas as pd
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench import quality
from qtts_lib.bench.machine import describe
from qtts_lib.bench.results import check_schema
from qtts_lib.bench.workload import LANGUAGE, TEXT, weight_bytes_per_frame
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.binding.graph import Graph, params_dict
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.binding.weights import FP32_TAG, split_bin
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.pipeline.sampling import Sampler
from qtts_lib.runtime.rewrites.decode_step import fp16_step
from qtts_lib.runtime.rewrites.int8 import int8_graph, quantize_rows

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("13_quantize_the_loop", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
del tts
ncnn_dir = paths.ncnn_dir(ckpt)
full = not ckpt.startswith("tiny")
BENCH = paths.DATA / "bench"
REFERENCE = "dev-2core-epyc"  # the reference machine of the committed full-size files (2 cores, AMD EPYC)
committed = lambda name: json.loads((BENCH / name).read_text())

# %% [markdown]
# ## 1. Bytes per frame, per tier
# Chapter 11 counted the weights one frame reads: the talker decoder once, the code predictor's decoder 15 times,
# plus the heads. A tier stores the two decoders' projections in fewer bytes, and int8 the predictor's 15 heads too.
# The talker's codec head stays fp32 (it picks codebook 0 and the end of speech once a frame), the embeddings are read
# a few rows at a time (shrinking them saves memory, not time), and the codec has tiers of its own (chapter 14).
# Divided by the read bandwidth measured now, each tier has its floor:

# %%
machine = describe([THREADS])
bandwidth = machine["read_bandwidth_gbs"][str(THREADS)]
tiers = list(precision.TIERS)
bytes_per_frame = {t: weight_bytes_per_frame(ncnn_dir, precision=t) for t in tiers}
floors = pd.DataFrame({"bytes per weight": [precision.weight_bytes(t) for t in tiers],
                       "MB read per frame": [round(bytes_per_frame[t] / 1e6, 2) for t in tiers],
                       f"floor ms/frame at {bandwidth} GB/s": [round(bytes_per_frame[t] / bandwidth / 1e6, 2)
                                                               for t in tiers]}, index=tiers)
check.equal("tiers by bytes read per frame", "order", " < ".join(sorted(tiers, key=bytes_per_frame.get)),
            "int8 < fp16 < fp32")
display(floors)

# %% [markdown]
# At full size, the count the reference machine's committed runs recorded, over their probe's read bandwidth. One
# frame is 80 ms of audio (12.5 frames a second):

# %%
tier_run = committed(f"{REFERENCE}-full-base-tiers.json")
int8_runs = [committed(f"{REFERENCE}-full-base-int8-weights-as-a{s}.json") for s in ("", "-run2")]
full_bytes = tier_run["weight_bytes_per_frame_by_precision"] | int8_runs[0]["weight_bytes_per_frame_by_precision"]
ref_bw = int8_runs[0]["machine"]["read_bandwidth_gbs"]["2"]
print(f"full-base, {int8_runs[0]['machine']['cpu']}, 2 threads reading {ref_bw} GB/s: " + "; ".join(
    f"{t} {full_bytes[t] / 1e9:.2f} GB per frame, floor {full_bytes[t] / ref_bw / 1e6:.0f} ms" for t in tiers))
print(f"real time needs at most 80 ms per frame: only int8's floor is under it "
      f"({full_bytes['int8'] / ref_bw / 1e6 / 80:.2f} of a frame), before the codec has decoded a sample")

# %% [markdown]
# ## 2. fp16: a `.param` rewrite
# fp16 needs no new weights: ncnn's x86 InnerProduct keeps its weights as fp16 when `use_fp16_storage` is on and
# converts them while reading (F16C), arithmetic in fp32. On a whole net the option would round every activation too,
# so `rewrites.decode_step.fp16_step` rewrites a step graph into InnerProducts and masks every other layer back to
# fp32 (`31=2`). Prefill keeps the exported fp32 graph (ncnn's x86 Gemm has no fp16 storage): the tier holds the
# decoders' weights one and a half times.

# %%
fp16_text = fp16_step((ncnn_dir / "talker_decoder_kv.param").read_text())
masked = sum("31=2" in line for line in fp16_text.splitlines())
inner = sum(line.startswith("InnerProduct") for line in fp16_text.splitlines())
print(f"fp16 step graph: {inner} InnerProducts with fp16 weights, {masked} layers masked back to fp32")

# %% [markdown]
# ## 3. int8: the projections written from numpy
# `rewrites.int8.int8_graph` rewrites every projection (a Gemm whose B is a constant weight) as ncnn's int8 Gemm with
# the weights as its constant **A**, int8 with one scale per row (per output feature): ncnn keeps a scale per row of
# a constant A but one per *tensor* of a constant B (`Gemm::load_model` in ncnn's `src/layer/gemm.cpp`), which would
# waste most of the 8 bits on rows with small weights. The activations become B, quantized as it runs (absmax → 127,
# one scale per call, shared by the rows of a prefill or a batch) and multiplied in int32 on VNNI. Projections that
# share an input are fused first (q/k/v, gate/up) and split after by a `Slice`. Layer 0's attention projections,
# exported and in the int8 graph (`4=1` constant A, `7` its rows, `9` K, `14=1` output transposed back to rows ×
# features, `18=2` int8 with run-time activation scales, `22` one tile over K: a thread streams its rows in one pass):

# %%
precision.ensure_int8_tier(ncnn_dir, log=print)
exported = (ncnn_dir / "talker_decoder_kv.param").read_text().splitlines()
written = precision.int8_paths(ncnn_dir, "talker_decoder")[0].read_text().splitlines()
squeeze = lambda line: " ".join(line.split())  # noqa: E731  (ncnn pads the columns)
print("exported:", *[squeeze(x) for x in exported if x.startswith("Gemm")][:3], sep="\n  ")
print("int8:", *[squeeze(x) for x in written if x.split()[0] in ("Gemm", "Slice")][:2], sep="\n  ")
stamps = json.loads((ncnn_dir / "int8" / "stamp.json").read_text())
for name in precision.INT8_GRAPHS:  # int8 weights + fp32 row scales and norms: about one byte per weight
    check.at_most(f"{name}: int8 .bin bytes per quantized weight", "bytes",
                  precision.int8_paths(ncnn_dir, name)[1].stat().st_size / stamps[name]["weights"], 1.05)
pd.DataFrame({n: {"int8 Gemms": stamps[n]["gemms"], "Gemms fused away": stamps[n].get("fused_away", 0),
                  "weights": stamps[n]["weights"], "weight error (rel. RMS)": round(stamps[n]["weight_rel_rms"], 4)}
              for n in precision.INT8_GRAPHS}).transpose()

# %% [markdown]
# The predictor's heads are rewritten the same way but not fused (one fused Gemm would compute all 15 where a step
# needs one); the loop runs them inside the predictor's graph (`precision.predictor_with_heads`). `pipeline.precision`
# writes the files once per export (`ensure_int8`). Before trusting them, check that ncnn computes what we think: one
# talker projection in its int8 form, run by ncnn, against a numpy model of the same arithmetic (one activation
# scale for the call, exact integer sums, both scales undone) must agree to float rounding; the fp32 product it only
# approximates:

# %%
text = (ncnn_dir / "talker_decoder.param").read_text()
gemm = next(layer for layer in Graph(text).layers if layer.type == "Gemm")
n, k = (int(params_dict(gemm)[key]) for key in ("8", "9"))
w = split_bin(text, (ncnn_dir / "talker_decoder.bin").read_bytes())[gemm.name][0].array().reshape(n, k)
one = f"7767517\n2 2\nInput in 0 1 in\nGemm g 1 1 in out {' '.join(gemm.params)}\n"
q_text, q_bin, _ = int8_graph(one, FP32_TAG + w.tobytes())
work = paths.outputs_dir(ckpt) / "13_one_gemm"
work.mkdir(parents=True, exist_ok=True)
(work / "g.param").write_text(q_text), (work / "g.bin").write_bytes(q_bin)
x = np.random.default_rng(0).standard_normal((4, k)).astype(np.float32)
y = run(make_net(work / "g.param", work / "g.bin", THREADS), {"in": x}, ["out"], name="one int8 Gemm")[0]  # (4, n)
q, scale = quantize_rows(w)
a_scale = 127 / np.abs(x).max()
model = (np.clip(np.rint(x * a_scale), -127, 127) @ q.T.astype(np.float64)) / (a_scale * 127) * scale
check.close(f"ncnn int8 Gemm ({gemm.name}, {n}x{k}) vs the numpy model of its arithmetic", y, model, rel=1e-5)
check.within("the same int8 Gemm vs the fp32 product", "rel", y, x @ w.T, 0.03)

# %% [markdown]
# ## 4. Time the decoders in every tier
# One talker and one predictor decoder per tier, as the runtime loads them (`precision.decoder`), the same prefill
# and decode steps, tiers interleaved, medians; each tier keeps its own cache (`prefill` returns it, `forward` grows
# it). On a tiny checkpoint this measures call overhead (the weights fit in cache); section 6 has full size.

# %%
talker_cfg = checkpoint.load_config(ckpt)["talker_config"]
decoders = {"talker_decoder": talker_cfg, "predictor_decoder": talker_cfg["code_predictor_config"]}
rng = np.random.default_rng(4)
steps_ms, outputs = {}, {}
for name, c in decoders.items():
    nets = {t: precision.decoder(ncnn_dir, name, c["head_dim"], c["rope_theta"], THREADS, precision=t) for t in tiers}
    x0 = rng.standard_normal((1, 8, c["hidden_size"])).astype(np.float32)
    xs = [rng.standard_normal((1, 1, c["hidden_size"])).astype(np.float32) for _ in range(12)]
    times = {t: [] for t in tiers}
    prefilled = {t: net.prefill(x0) for t, net in nets.items()}  # (hidden (1, 8, H), the tier's cache)
    outs = {t: [hidden] for t, (hidden, _) in prefilled.items()}
    for x in xs:
        for t, net in nets.items():
            t0 = time.perf_counter()
            outs[t].append(net.forward(x, prefilled[t][1]))
            times[t].append((time.perf_counter() - t0) * 1e3)
    steps_ms[name] = {t: float(np.median(v[2:])) for t, v in times.items()}
    outputs[name] = {t: np.concatenate([o.reshape(-1, o.shape[-1]) for o in v]) for t, v in outs.items()}
    del nets
    for t in ("fp16", "int8"):
        check.within(f"{name}: {t} vs fp32 over a prefill and 12 steps", "rel", outputs[name][t],
                     outputs[name]["fp32"], 5e-3 if t == "fp16" else 0.1)
pd.DataFrame(steps_ms).round(2).rename_axis("step ms (median)")

# %% [markdown]
# ## 5. What a tier costs in quality
# Faster is worthless if the codes change. `qtts_lib.bench.quality.measure` measures, on the same prompt and greedy:
# - **teacher-forced agreement**: fp32's codes are fed to the tier code by code (a `Sampler`, `quality.TeacherForced`,
#   handed to the runtime's own loop), and at every position we ask whether the tier would have picked the same code;
#   one number per codebook. fp32 against itself gives 1.0 everywhere, which checks the harness;
# - the **first divergent frame** when the tier runs free on its own picks;
# - the **per-layer error** of one decode step of each decoder, fp32 step graph against the tier's.
#
# Random weights make near-ties between the top two logits common, so a tiny rounding flips a pick far more often than
# on a trained checkpoint (a pessimistic proxy); `python -m qtts_lib.bench quality --checkpoint <yours>` measures yours.

# %%
live = quality.measure(model_dir, tiers, frames=200 if full else 40, threads=THREADS, progress=False)
(paths.outputs_dir(ckpt) / "13_quality.json").write_text(json.dumps(live, indent=1))
check.equal("teacher forcing reproduces fp32's own greedy codes (lowest agreement)", "agreement",
            min(live["tiers"]["fp32"]["agreement"]), 1.0)
check.at_least("fp16: teacher-forced agreement, mean over codebooks", "agreement",
               float(np.mean(live["tiers"]["fp16"]["agreement"])), 0.9)


def quality_table(res: dict) -> pd.DataFrame:
    return pd.DataFrame({t: {"codebook 0": r["agreement_codebook0"], "codebooks 1-15 (mean)":
                             r["agreement_predictor_mean"], "first divergent frame": r["first_divergent_frame"],
                             "talker step: output rel. error": (r["layer_errors"] or {}).get(
                                 "talker_decoder", {}).get("output_rel", 0.0)}
                         for t, r in res["tiers"].items()}).T


def agreement_plot(res: dict, title: str):
    ax = plt.subplots(figsize=(9, 3), layout="tight")[1]
    for t, r in res["tiers"].items():
        ax.plot(range(res["codebooks"]), r["agreement"], marker="o", label=t)
    ax.set(xlabel="codebook (0 = talker, 1-15 = code predictor)", ylabel="teacher-forced top-1 agreement",
           ylim=(-0.02, 1.02), title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the lines, not over them


display(quality_table(live))
agreement_plot(live, f"{ckpt}: {live['frames']} frames, random weights (near-ties make this pessimistic)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), layout="tight")
for ax, name in zip(axes, precision.DECODERS):
    for t in ("fp16", "int8"):
        ax.semilogy(np.maximum(live["tiers"][t]["layer_errors"][name]["rel"], 1e-9), label=t, lw=1)
    ax.set(xlabel="layer (forward order)", ylabel="relative error", title=f"{name}: one decode step vs fp32")
    ax.legend(fontsize=8)

# %% [markdown]
# At full size (`make quality`, 200 frames), committed: `full-base` on the reference machine (fp16 from the run of every
# tier, int8 from section 3's form); `full-1.7b-customvoice` on a larger host, as its talker's export needs more memory.

# %%
check.at_least("committed full-size quality measurements", "files", len(list((BENCH / "quality").glob("*.json"))), 2)
q_tiers, q_int8 = committed(f"quality/{REFERENCE}-full-base.json"), committed(
    f"quality/{REFERENCE}-full-base-weights-as-a.json")
full_q = q_int8 | {"tiers": {t: (q_int8 if t == "int8" else q_tiers)["tiers"][t] for t in tiers}}
q17 = committed("quality/h200-host-cpu-full-1.7b-customvoice.json")
check.equal("1.7B: teacher forcing gives fp32 its own codes", "agreement", min(q17["tiers"]["fp32"]["agreement"]), 1.0)
display(pd.concat({"full-base": quality_table(full_q), q17["checkpoint"]: quality_table(q17)}).style.set_caption(
    f"{full_q['frames']} frames, random weights; the 1.7B on the CPU of an {q17['machine']['gpu']} host"))
agreement_plot(full_q | {"tiers": full_q["tiers"] | {"int8, 1.7B": q17["tiers"]["int8"]}}, "full-base; int8 at 1.7B")

# %% [markdown]
# ## 6. Full size, on the reference machine
# `make bench BENCH_PRECISION=fp32,fp16,int8` times PyTorch and every ncnn tier on `full-base` (chapter 11's harness).
# The reference machine's runs: PyTorch, fp32 and fp16 from one run of every tier, int8 from two runs of section 3's
# int8 form (the fp32 codec everywhere); each row's floor is the bandwidth probed in its own run. Every committed
# machine is on the [results page](results.ipynb).

# %%
tiered = [f for f in BENCH.glob("*.json") if len({r["precision"] for r in json.loads(f.read_text())["rows"]}) > 1]
check.at_least("committed full-size runs with precision tiers", "files", len(tiered), 1)
for doc in [tier_run, *int8_runs]:
    check_schema(doc)
full_rows = [r for r in tier_run["rows"] if r["precision"] != "int8"] + [
    r | {"runtime": f"ncnn (run {i})"} for i, doc in enumerate(int8_runs, 1) for r in doc["rows"]
    if r["codec_precision"] == "fp32"]
sized = pd.DataFrame([{"runtime": r["runtime"], "precision": r["precision"], "threads": r["threads"],
                      **r["ms_per_frame"], "RTF": r["rtf"], "floor": r["floor_ms_per_frame"],
                      "loop / floor": r["floor_ratio"], "peak GB": r["peak_rss_gb"]} for r in full_rows])
sized = sized.sort_values(["threads", "total"], ascending=[True, False]).set_index(["threads", "runtime", "precision"])
display(sized.style.set_caption(f"full-base, {tier_run['machine']['cpu']}, {tier_run['frames']} frames, ms per frame"))
two = sized.loc[2]
ax = two[["talker", "predictor", "codec"]].set_axis([f"{r}\n{p}" for r, p in two.index]).plot.bar(
    stacked=True, figsize=(8, 3.4), rot=0)
ax.scatter(range(len(two)), two["floor"], marker="_", s=900, color="black", label="loop floor")
ax.axhline(80, color="crimson", ls="--", lw=1, label="real time")
ax.set(ylabel="ms per frame", xlabel="", title="full-base, reference machine, 2 threads: where a frame goes")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), markerscale=0.3)  # beside the bars
plt.show()

# %% [markdown]
# ## 7. The int8 loop against its floor
# Only the int8 loop's floor is under real time, yet the loop runs above it. First what a frame *does*, counted live:
# every `ncnn.Net` made while the counter is installed counts its extractors (one per graph call) and its `extract`s,
# and times what ncnn spends inside them.

# %%
tally = {"calls": 0, "extracts": 0, "caches": 0, "seconds": 0.0}


class Timed:
    """An extractor whose `extract` calls (ncnn runs the graph inside them) are counted and timed."""

    def __init__(self, ex):
        self.ex = ex

    def __getattr__(self, attr):
        return getattr(self.ex, attr)

    def extract(self, name, *args):
        t0 = time.perf_counter()
        out = self.ex.extract(name, *args)
        tally["extracts"], tally["seconds"] = tally["extracts"] + 1, tally["seconds"] + time.perf_counter() - t0
        tally["caches"] += name.startswith("cache_")
        return out


class CountedNet(ncnn.Net):
    def create_extractor(self):  # one extractor per graph call
        tally["calls"] += 1
        return Timed(super().create_extractor())


def calls_and_caches(predictor_layers: int, groups: int = 16) -> tuple[int, int]:
    """A frame of the CPU loop: codec head, the predictor's prefill and 14 steps (heads inside), a talker step, each a
    call with one output; only the prefill hands back caches (a step appends to those fed in: `appends_in_place`)."""
    return groups + 1, 2 * predictor_layers


real_net, ncnn.Net = ncnn.Net, CountedNet  # nets made now count themselves
try:
    synth = Synthesizer(model_dir, threads=THREADS, precision="int8")
finally:
    ncnn.Net = real_net
prompt = synth.prompt(TEXT, LANGUAGE, synth.voice(wav=load_wav(paths.voice_wav())))
spent = {}
for frames in (8, 16):  # two lengths: the prefill drops out of the difference
    tally.update(calls=0, extracts=0, caches=0, seconds=0.0)
    t0 = time.perf_counter()
    seq = synth.loop.run(prompt, Sampler(Sampling(greedy=True), synth.config.talker), frames)
    spent[len(seq.codes)] = dict(tally, wall=time.perf_counter() - t0)
(f1, a), (f2, b) = sorted(spent.items())
per_frame = {key: (b[key] - a[key]) / (f2 - f1) for key in a}
calls, caches = calls_and_caches(talker_cfg["code_predictor_config"]["num_hidden_layers"])
grown = 2 * talker_cfg["num_hidden_layers"] / (f2 - f1)  # the talker's caches outgrowing their room, once at most
check.equal(f"int8 loop: graph calls per frame on {ckpt}", "calls", round(per_frame["calls"]), calls)
outputs = round(per_frame["extracts"] - per_frame["caches"])
check.equal(f"int8 loop: outputs extracted per frame on {ckpt}", "outputs", outputs, calls)
check.at_most(f"int8 loop: caches extracted per frame on {ckpt}, beyond the predictor's prefill", "caches",
              per_frame["caches"] - caches, grown)
print(f"{ckpt}: {per_frame['calls']:.0f} calls, {per_frame['extracts']:.1f} extracts ({per_frame['caches']:.1f} "
      f"caches), {1e3 * per_frame['wall']:.2f} ms per frame, {per_frame['seconds'] / per_frame['wall']:.0%} in ncnn's "
      "extracts\nfull-base (5 predictor layers): {} calls and {} caches a frame".format(*calls_and_caches(5)))

# %% [markdown]
# On a tiny checkpoint a frame is mostly the cost of making those calls; at full size each call reads megabytes of
# weights. Three committed measurements of the reference machine separate the rest. The **projections alone**
# (`python -m qtts_lib.bench projections`): each decoder's int8 Gemms and nothing else, a frame's worth of calls,
# interleaved with the read probe in one process, in several forms side by side: the weights as A with one tile
# over K (section 3's), as A with ncnn's own tiles, as B with a row-scale layer after each Gemm (what B's one scale
# per tensor forces), and ncnn's int8 `InnerProduct` (a static input scale; timing only).

# %%
proj_rows = []
for f in sorted((BENCH / "int8").glob(f"{REFERENCE}-full-base-projections*.json")):
    doc = json.loads(f.read_text())
    forms = doc.get("forms") or {"weights_as_b_row_scales": doc}
    extra = {"weights_as_b_row_scales (2nd call)": doc["second_run"]} if "second_run" in doc else {}
    for k, v in (forms | extra).items():
        probe = v if "floor_ms_per_frame" in v else doc  # a form shares its file's probe
        proj_rows.append({"file": f.stem, "form": k, "ms/frame": v["projections_ms_per_frame"],
                          "GB/s": v.get("projections_gbs"), "probe GB/s": probe["read_bandwidth_gbs"],
                          "floor ms": probe["floor_ms_per_frame"], "over floor": v["projections_over_floor"]})
    if "forms" in doc:
        t = {k: v["projections_ms_per_frame"] for k, v in doc["forms"].items()}
        check.at_most(f"{f.stem}: weights as A with one K tile, against the other forms", "ms/frame",
                      t["weights_as_a"], min(v for k, v in t.items() if k != "weights_as_a"))
proj = pd.DataFrame(proj_rows)
display(proj.set_index(["file", "form"]).style.set_caption("full-base, reference machine, 2 threads: the int8 "
                                                           "projections alone, a frame's worth"))
check.at_least("int8 projections alone vs the weight-read floor (idle EPYC VM, 2 threads)", "ratio",
               float(proj["over floor"].min()), 1.15)
gemv = proj[proj["form"] == "weights_as_a"]
print(f"section 3's form alone: {gemv['over floor'].min():.2f}-{gemv['over floor'].max():.2f}x its floor, "
      f"reading {gemv['GB/s'].min()}-{gemv['GB/s'].max()} GB/s where the probe read "
      f"{gemv['probe GB/s'].min()}-{gemv['probe GB/s'].max()}")

# %% [markdown]
# **Call by call** (`python -m qtts_lib.bench calls`): every graph call of a frame timed where it is made, against
# the same weights read by the same kernels alone (each int8 decoder's projections as one graph, called as a frame
# calls them), in fresh processes. A call's *rest* is its time beyond that; the glue is the Python between calls:

# %%
calls = committed("calls/dev-2core-xeon-amx-full-base-int8.json")
per = calls["per_frame"]
cols = ["calls_per_frame", "ms_per_call", "projections_ms_per_call", "rest_ms_per_call", "rest_ms_per_frame"]
display(pd.DataFrame(per["graphs"]).T[cols].style.set_caption(f"full-base int8, 2 threads, {calls['machine']['cpu']}"))
print(f"a frame: {per['frame_ms']} ms = its weights {per['weights_ms']} + rest {per['rest_ms']} "
      f"(glue {per['glue_ms']})")
check.at_most("int8 loop: a frame's rest beyond its weights, share of the frame (committed run)", "share",
              per["rest_ms"] / per["frame_ms"], 0.2)

# %% [markdown]
# And the **loop end to end** as a user runs it (`python -m qtts_lib.bench loop --runtimes ncnn --precision int8
# --codec-precision fp32,bf16,int8 --threads 2 --repeats 5`), two runs; chapter 14 reads their codec columns.

# %%
e2e = pd.DataFrame([{"run": i, "codec tier": r["codec_precision"], "talker": r["ms_per_frame"]["talker"],
                     "predictor": r["ms_per_frame"]["predictor"], "floor": r["floor_ms_per_frame"],
                     "loop / floor": r["floor_ratio"]} for i, doc in enumerate(int8_runs, 1) for r in doc["rows"]])
display(e2e.set_index(["run", "codec tier"]).style.set_caption("full-base, reference machine, 2 threads, ms/frame"))
check.at_least("int8 loop end to end, at or above its weight-read floor", "ratio", e2e["loop / floor"].min(), 1.0)
print(f"the int8 loop at {e2e['loop / floor'].min()}-{e2e['loop / floor'].max()}x its floor; its projections alone "
      f"at {gemv['over floor'].min():.2f}-{gemv['over floor'].max():.2f}x")

# %% [markdown]
# Read the three together. Most of the loop's distance from its floor is in its projections alone: ncnn's int8 GEMV
# reads its weights slower than the probe streams memory, and no other form measured faster. The rest is all else a
# frame does (norms, RoPE, attention, the caches, the Python around the calls counted above), call by call in the
# table above. A GEMV that streams at the probe's rate, fewer bits per weight with a kernel
# that reads them as fast, or more bandwidth would close it. The codec comes on top: chapter 14 makes it cheaper.
#
# ## Summary
# - The loop's floor is bytes per frame over bandwidth, so it moves only with bytes per weight: fp16 halves it, int8
#   about quarters it (the predictor's heads too; the talker's codec head stays fp32).
# - fp16 is a `.param` rewrite (fp16 storage on the InnerProducts); int8 is a new `.param`/`.bin` written from numpy
#   (the weights as the Gemm's constant A with a scale per row, fused q/k/v and gate/up, one activation scale per
#   call), checked against a numpy model of ncnn's arithmetic. `Synthesizer(precision=...)` and `qtts say
#   --precision` pick the tier; fp32 stays the default and the one that holds token parity with PyTorch.
# - Quality is measured, not assumed: agreement per codebook under teacher forcing, the first divergent frame, the
#   per-layer error; on random weights they are pessimistic.
# - The int8 loop makes a fixed number of graph calls per frame (counted live in section 7); at full size its
#   distance from the floor is mostly ncnn's int8 GEMV itself, which reads slower than memory streams.
#
# **Artifacts left:** `models/<ckpt>/ncnn/int8/` (both decoders and the heads in int8, and `stamp.json`: rewritten
# only when the exports change), `data/outputs/<ckpt>/13_quality.json`, `data/outputs/<ckpt>/13_one_gemm/` (section
# 3's one projection), the chapter report. What was tried on the way, and how these numbers moved between machines:
# the [lab notes](../lab_notes.md).
#
# **If your numbers differ**
# - *int8 no faster than fp16* → check that your CPU has VNNI (`grep avx512_vnni /proc/cpuinfo`); without it ncnn's
#   int8 Gemm runs on plain AVX2 integer arithmetic.
# - *fp16 steps equal to fp32* → F16C is missing, or `use_fp16_storage` was not set before `load_param`.
# - *low agreement on a real checkpoint* → find the first layer that jumps in the per-layer plot: outlier activations
#   suffer from one activation scale per call (their absmax sets the step for every feature); keep that layer fp32.
# - *the int8 loop further from its floor than the committed runs* → compare within one run, not across files: the
#   floor is the bandwidth probed in that run, and a shared machine's bandwidth drifts between runs.

# %%
check.table()
