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
# # 12 · Go past fp32: precision tiers and what they cost
# > The generation loop is memory-bound, so the only way below its fp32 floor is fewer bytes per weight.
#
# **You will:** count the bytes a frame reads in each precision tier and turn them into floors; see how each tier is
# written (a `.param` rewrite for fp16, int8 weights written from numpy for int8) and check ncnn's int8 arithmetic
# against a numpy model of it; time the decoders in every tier; measure the quality cost against fp32 —
# teacher-forced agreement per codebook, the first divergent frame, per-layer error — and read the full-size results;
# then try decoding on the second core, an experiment the product does not ship; make the codec cheaper in bf16
# and in int8, with what each costs in sound; and take the int8 loop apart against its floor.
#
# **You will learn:** why fp32 cannot reach real time on two cores; what fp16 storage and int8 weights buy on this
# CPU; why agreement on random weights is a pessimistic proxy; what real time on two cores would still need; why the
# codec process stayed an experiment.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing). **Leaves behind:**
# `models/<ckpt>/ncnn/int8/` (the int8 tier, written once), `models/<ckpt>/ncnn/fast_int8/` (the codec's int8 tier),
# `data/outputs/<ckpt>/12_quality.json`,
# `data/outputs/<ckpt>/12_one_gemm/`, `data/reports/<ckpt>/12_quantize_the_loop.json`.

# %%
import json
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Audio, display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench import quality
from qtts_lib.bench.machine import describe
from qtts_lib.bench.results import check_schema
from qtts_lib.bench.workload import LANGUAGE, TEXT, weight_bytes_per_frame
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.binding.graph import Graph, params_dict
from qtts_lib.runtime.binding.net import make_net, run
from qtts_lib.runtime.binding.weights import FP32_TAG, split_bin
from qtts_lib.runtime.experimental.codec_process import CodecProcess
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.rewrites.decode_step import fp16_step
from qtts_lib.runtime.rewrites.int8 import int8_graph, quantize_rows

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("12_quantize_the_loop", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
del tts
ncnn_dir = paths.ncnn_dir(ckpt)
full = not ckpt.startswith("tiny")

# %% [markdown]
# ## 1. Bytes per frame, per tier
# Chapter 10 counted the weights one frame reads: the talker decoder once, the code predictor's decoder 15 times,
# plus the two heads. A tier stores the two decoders' projections in fewer bytes, and int8 the code predictor's 15
# heads too (one is read per codebook: 126 MB of fp32 a frame at full size, as much as two of the predictor's five
# layers). The talker's codec head stays fp32 in every tier: it picks codebook 0 and the end of speech once a frame
# for 13 MB. The embeddings are read a few rows at a time, so shrinking them would save memory, not time, and the
# codec has tiers of its own (section 7). Divided by the read bandwidth measured now, each tier has its own floor:

# %%
machine = describe([THREADS])
bandwidth = machine["read_bandwidth_gbs"][str(THREADS)]
tiers = list(precision.TIERS)
bytes_per_frame = {t: weight_bytes_per_frame(ncnn_dir, precision=t) for t in tiers}
floors = pd.DataFrame({"bytes per weight": [precision.weight_bytes(t) for t in tiers],
                       "GB read per frame": [round(bytes_per_frame[t] / 1e9, 3) for t in tiers],
                       f"floor ms/frame at {bandwidth} GB/s": [round(bytes_per_frame[t] / bandwidth / 1e6, 1)
                                                               for t in tiers]}, index=tiers)
check.equal("tiers by bytes read per frame", "order", " < ".join(sorted(tiers, key=bytes_per_frame.get)),
            "int8 < fp16 < fp32")
display(floors)

# %% [markdown]
# At full size that is 6.6 GB per frame in fp32, 3.4 GB in fp16 and 1.8 GB in int8; on this 2-core machine's
# ~22 GB/s the int8 floor is about 80 ms per frame — exactly real time (one frame is 80 ms of audio), before the codec
# has decoded a sample. Keep that arithmetic in mind when you read the timings.
#
# ## 2. How each tier is written
# **fp16** needs no new file: ncnn's x86 InnerProduct keeps its weights as fp16 when `use_fp16_storage` is on and
# converts them while reading (F16C); the arithmetic stays fp32. Turning the option on for a whole net would round
# every activation too, so `rewrites.decode_step.fp16_step` masks every other layer back to fp32 with the per-layer
# feature mask `31=2`. **int8** (`rewrites.int8.int8_graph`) rewrites every projection (a constant-weight Gemm) as
# ncnn's int8 Gemm, with the weights as its constant **A**: int8, one scale per row (per output feature) kept inside
# the Gemm; the activations are its B, quantized at run time (absmax → 127, one scale per call: a step's one row,
# or shared by the rows of a prefill or a batch) and multiplied in int32 on VNNI; the output is transposed back to
# rows × features (`14=1`), and each Gemm reads its whole K as one tile (`22=K`). Why A: ncnn's int8 Gemm keeps
# one scale per row of a constant A but one per *tensor* of a constant B, which would waste most of the 8 bits on
# rows with small weights. The first int8 form here kept the weights as B, normalised each row to |max| = 1 and
# applied the row scales after every Gemm with a `BinaryOp` and a `MemoryData` table: 40 more layers in every
# predictor call and 224 in every talker step (section 10 measures both forms).
# The predictor's heads are rewritten the same way, but not fused: they share one input, and one fused Gemm would
# compute all 15 where a step needs one. `pipeline.precision` decides which graphs a tier loads and writes the int8
# files once (`ensure_int8`; `ensure_int8_tier` all of them).

# %%
fp16_text = fp16_step((ncnn_dir / "talker_decoder_kv.param").read_text())
masked = sum("31=2" in line for line in fp16_text.splitlines())
precision.ensure_int8_tier(ncnn_dir, log=print)
print(f"fp16 step graph: {masked} layers masked back to fp32 storage")
stamps = json.loads((ncnn_dir / "int8" / "stamp.json").read_text())
for name in precision.INT8_GRAPHS:  # int8 weights + fp32 row scales and norms: about one byte per weight
    check.at_most(f"{name}: int8 .bin bytes per quantized weight", "bytes",
                  precision.int8_paths(ncnn_dir, name)[1].stat().st_size / stamps[name]["weights"], 1.05)
pd.DataFrame({n: {"Gemms made int8": stamps[n]["gemms"], "weights": stamps[n]["weights"],
                  "weight error (rel. RMS)": round(stamps[n]["weight_rel_rms"], 4)}
              for n in precision.INT8_GRAPHS}).transpose()

# %% [markdown]
# Before trusting a tier, check that ncnn computes what we think it computes. One projection of the talker, its int8
# form run by ncnn, against a numpy model of the same arithmetic (one activation scale for the call, exact integer
# sums, both scales undone) — they must agree to float rounding — and against the fp32 product, which it only
# approximates:

# %%
text = (ncnn_dir / "talker_decoder.param").read_text()
gemm = next(layer for layer in Graph(text).layers if layer.type == "Gemm")
n, k = (int(params_dict(gemm)[key]) for key in ("8", "9"))
w = split_bin(text, (ncnn_dir / "talker_decoder.bin").read_bytes())[gemm.name][0].array().reshape(n, k)
one = f"7767517\n2 2\nInput in 0 1 in\nGemm g 1 1 in out {' '.join(gemm.params)}\n"
q_text, q_bin, _ = int8_graph(one, FP32_TAG + w.tobytes())
work = paths.outputs_dir(ckpt) / "12_one_gemm"
work.mkdir(parents=True, exist_ok=True)
(work / "g.param").write_text(q_text)
(work / "g.bin").write_bytes(q_bin)
x = np.random.default_rng(0).standard_normal((4, k)).astype(np.float32)
y = run(make_net(work / "g.param", work / "g.bin", THREADS), {"in": x}, ["out"], name="one int8 Gemm")[0]  # (4, n)
q, scale = quantize_rows(w)
a_scale = 127 / np.abs(x).max()
model = (np.clip(np.rint(x * a_scale), -127, 127) @ q.T.astype(np.float64)) / (a_scale * 127) * scale
check.close(f"ncnn int8 Gemm ({gemm.name}, {n}x{k}) vs the numpy model of its arithmetic", y, model, rel=1e-5)
check.within("the same int8 Gemm vs the fp32 product", "rel", y, x @ w.T, 0.03)

# %% [markdown]
# ## 3. Time the decoders in every tier
# One talker and one predictor decoder per tier, as the runtime loads them (`precision.decoder`), the same prefill
# and decode steps, tiers interleaved, medians; each tier keeps its own cache (`prefill` returns it, `forward` grows
# it). On a tiny checkpoint this measures call overhead (the weights fit in cache); the full-size numbers are in
# section 5.

# %%
talker_cfg = checkpoint.load_config(ckpt)["talker_config"]
decoders = {"talker_decoder": talker_cfg, "predictor_decoder": talker_cfg["code_predictor_config"]}
rng = np.random.default_rng(4)
steps_ms, outputs = {}, {}
for name, c in decoders.items():
    nets = {t: precision.decoder(ncnn_dir, name, c["head_dim"], c["rope_theta"], THREADS, precision=t)
            for t in tiers}
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
# ## 4. What a tier costs in quality
# Faster is worthless if the codes change. `qtts_lib.bench.quality.measure` measures, on the same prompt and greedy:
# - **teacher-forced agreement**: fp32's codes are fed to the tier, frame by frame and code by code, and at every
#   position we ask whether the tier would have picked the same code; one number per codebook. The feeding is a
#   `Sampler` (`quality.TeacherForced`) handed to the runtime's own generation loop. fp32 against itself gives 1.0
#   everywhere, which checks the harness;
# - the **first divergent frame** when the tier runs free on its own picks;
# - the **per-layer error** of one decode step of each decoder, fp32 step graph against the tier's.
#
# Random weights make near-ties between the top two logits common, so a tiny rounding flips a pick far more often
# than it would on a trained checkpoint: read these numbers as a pessimistic proxy. `python -m qtts_lib.bench quality
# --checkpoint <your real checkpoint>` makes the same measurement on real weights.

# %%
live = quality.measure(model_dir, tiers, frames=200 if full else 40, threads=THREADS, progress=False)
(paths.outputs_dir(ckpt) / "12_quality.json").write_text(json.dumps(live, indent=1))
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
    fig, ax = plt.subplots(figsize=(9, 3))
    for t, r in res["tiers"].items():
        ax.plot(range(res["codebooks"]), r["agreement"], marker="o", label=t)
    ax.set_xlabel("codebook (0 = talker, 1-15 = code predictor)")
    ax.set_ylabel("teacher-forced top-1 agreement")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    fig.tight_layout()


display(quality_table(live))
agreement_plot(live, f"{ckpt}: {live['frames']} frames, random weights (near-ties make this pessimistic)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for ax, name in zip(axes, precision.DECODERS):
    for t in ("fp16", "int8"):
        e = live["tiers"][t]["layer_errors"][name]
        ax.semilogy(np.maximum(e["rel"], 1e-9), label=t, lw=1)
    ax.set_title(f"{name}: one decode step, tier vs fp32", fontsize=9)
    ax.set_xlabel("layer (forward order)")
    ax.set_ylabel("relative error")
    ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 5. Full size, on this machine
# `make bench BENCH_PRECISION=fp32,fp16,int8` times PyTorch and every ncnn tier on `full-base` (chapter 10's harness,
# a `precision` per row) and `make quality` (`python -m qtts_lib.bench quality`) measures agreement over 200 frames.
# The committed results:

# %%
def frame_bars(labels: list[str], rows: list[dict], title: str) -> None:
    """Where each run's frame goes: talker, predictor and codec stacked (ms per frame), the loop's floor as a bar
    across each, and real time (80 ms) as a line. `rows` are bench rows (`data/bench/README.md`)."""
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 3.6))
    bottom = np.zeros(len(rows))
    for part, color in (("talker", "tab:blue"), ("predictor", "tab:orange"), ("codec", "tab:green")):
        vals = np.array([r["ms_per_frame"][part] for r in rows])
        ax.bar(labels, vals, bottom=bottom, label=part, color=color)
        bottom += vals
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [r["floor_ms_per_frame"]] * 2, color="black", lw=2,
                label="loop floor" if i == 0 else None)
    ax.axhline(80, color="crimson", ls="--", lw=1, label="real time (80 ms)")
    ax.set_ylabel("ms per frame")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    fig.tight_layout()


bench = {f.stem: json.loads(f.read_text()) for f in sorted((paths.DATA / "bench").glob("*.json"))}
tiered = {k: v for k, v in bench.items() if len({r["precision"] for r in v["rows"]}) > 1}
for name, res in tiered.items():
    check_schema(res)
    rows = sorted(res["rows"], key=lambda r: (r["threads"], r["runtime"], r["precision"]))
    display(pd.DataFrame([{"runtime": r["runtime"], "precision": r["precision"], "threads": r["threads"],
                           **{f"{k} ms": v for k, v in r["ms_per_frame"].items()}, "RTF": r["rtf"],
                           "floor ms": r["floor_ms_per_frame"], "loop / floor": r["floor_ratio"],
                           "peak GB": r["peak_rss_gb"]} for r in rows]).style.set_caption(name))
    frame_bars([f"{r['runtime']}\n{r['precision']} {r['threads']}t" for r in rows], rows,
               f"{name}: {res['checkpoint']}, {res['frames']} frames")
check.at_least("committed full-size runs with precision tiers", "files", len(tiered), 1)

# %%
quality_files = sorted((paths.DATA / "bench" / "quality").glob("*.json"))
committed_quality = {f.stem: json.loads(f.read_text()) for f in quality_files}
for name, res in committed_quality.items():
    display(quality_table(res).style.set_caption(f"{name}: {res['frames']} frames"))
    agreement_plot(res, f"{name}: {res['checkpoint']}, {res['frames']} frames, random weights")
check.at_least("committed full-size quality measurements", "files", len(committed_quality), 1)

# %% [markdown]
# ## 6. Decode on the second core?
# The codec could decode chunk k in a second process while the loop generates chunk k+1 (keeping the reference's
# chunk boundaries). `python -m qtts_lib.bench overlap` measures whether that pays: generation then codec on all cores
# (sequential), generation on one thread while the other decodes (split: a pipeline runs at the slower of the two),
# and generation on all cores with the decoder squeezed in (oversubscribed). The committed full-size run:

# %%
overlap_runs = {f.stem: json.loads(f.read_text()) for f in sorted((paths.DATA / "bench" / "overlap").glob("*.json"))}
for name, res in overlap_runs.items():
    t = res["ms_per_frame"]
    display(pd.DataFrame(t).T.style.set_caption(
        f"{name}: {res['checkpoint']} {res['precision']}, {res.get('machine', {}).get('cpu', '?')}, {res['cores']} "
        "cores, ms per frame (80 = real time)"))
    best = min(t, key=lambda k: t[k]["per_frame"])
    lost = t["split"]["generate"] - t["sequential"]["generate"]  # what the loop loses by giving up a core
    print(f"{name}: fastest {best}; the codec on all cores {t['sequential']['codec']} ms/frame, the loop loses "
          f"{lost:.1f} ms/frame on one thread")
    check.equal(f"{name}: oversubscribed is the slowest", "arrangement", max(t, key=lambda k: t[k]["per_frame"]),
                "oversubscribed")
check.at_least("committed overlap measurements", "files", len(overlap_runs), 1)

# %% [markdown]
# A split pipeline runs at the slower of its two halves, so it beats sequential when the codec's time on all cores
# is more than what the loop loses by running on one thread. The two committed machines fall on opposite sides.
# On the Intel VM one thread reads memory at about half the two-thread rate, the loop loses 54 ms per frame on one
# thread and the codec only costs 49: split 179 vs sequential 174 ms per frame. On the EPYC VM one thread reads 26-31
# of 32-39 GB/s, the loop loses 23 ms and the codec costs 44: split 89 vs sequential 111 (int8). Squeezing the decoder
# beside a two-thread loop is the slowest on both: ncnn's OpenMP threads wait on a busy core (FACTS.md).
# Measured again on the Intel Xeon VM of 2026-12-02 with the int8 codec (`--codec-precision int8`, the file ending
# `-int8-codec`): one thread reads 14.7 of 28.9 GB/s, the loop loses 51 ms per frame on one thread and the cheaper
# codec costs 27 on two: split 121 and pipeline 124 against sequential 96. A cheaper codec makes the second core worth
# less, not more.
#
# The EPYC numbers asked for a pipeline, so we built one, as an experiment: `runtime.experimental.codec_process`.
# `CodecProcess` starts a child Python that loads the codec and runs chapter 14's incremental `StreamDecoder` on the
# frames this process sends as the loop makes them (threads would not overlap: the binding holds the GIL inside
# `extract`); a synthesizer given it as its `decoders` pushes its frames there instead of into its own codec. For
# `synthesize` the child decodes adaptively: whenever it is free, every frame that has arrived (at least 2) in one
# incremental piece, so it keeps pace and little is left after the last frame. The `pipeline` row above (files that
# have it) is that arrangement timed whole: on the EPYC VM, int8, 91.7 ms per frame against 111.1 sequential (RTF 1.15
# instead of 1.39), of which 5.5 ms per frame is the decode left after the loop; but fp16 in the run right after was
# slower with it (185.4 vs 172.1), and a second pair of runs gave int8 97.1 vs 97.3 and fp16 150.8 vs 163.0.
#
# That gain is within this VM's noise between runs, so the codec process stays out of the product: only a caller that
# builds one and passes it as `decoders` gets it, and `qtts say` and `qtts serve` have no flag for it. It lives under
# `experimental/` for the measurement (`python -m qtts_lib.bench overlap`); measure it where you run. Here it is held
# to the in-process synthesizer on this checkpoint, greedy, 40 frames: the same codes, the same audio.

# %%
GREEDY = Sampling(greedy=True)
in_process = Synthesizer(model_dir, threads=1)
piped = Synthesizer(model_dir, threads=1, decoders=CodecProcess.for_checkpoint(model_dir))
rows = {}
for name, s in (("in process", in_process), ("codec process", piped)):
    voice = s.voice(wav=load_wav(paths.voice_wav()))
    t0 = time.perf_counter()
    r = s.synthesize(TEXT, LANGUAGE, voice, GREEDY, max_frames=40)
    rows[name] = {"result": r, "ms per frame (this run)": 1000 * (time.perf_counter() - t0) / len(r.codes)}
piped.close()  # stops the child
a, b = rows["in process"]["result"], rows["codec process"]["result"]
display(pd.DataFrame({k: {"frames": len(v["result"].codes), "ms per frame (this run)": v["ms per frame (this run)"],
                          "codec not hidden (ms)": 1000 * v["result"].seconds["codec"]} for k, v in rows.items()}))
check.equal("codec process: the same codes as in process", "frames equal", int((a.codes == b.codes).all(1).sum()),
            len(a.codes))
check.snr("codec process: the same audio as in process", b.wav, a.wav, 100.0)

# %% [markdown]
# ## 7. The codec in bf16
# Every tier above changes the decoders' weights; the codec stayed fp32, and at int8 it is a third of the frame
# (chapter 10: 4.96 GFLOP per frame at full size). It is compute-bound, about 90% of the machine's sgemm peak, so
# fewer bytes would not help it; cheaper arithmetic can. ncnn's *bf16 storage* keeps weights and the activations
# between layers as bfloat16 (fp32's exponent, 8 bits of mantissa), and on a CPU with AVX512-BF16 (Zen 4 has it)
# its convolutions multiply bf16 pairs with fp32 accumulation, twice the products per instruction.
# `Codec(precision="bf16")` turns it on for the upsampling parts, nearly all of the arithmetic; the codebooks and
# the transformer stay fp32. `Synthesizer(codec_precision="bf16")`, `qtts say --codec-precision bf16`, `qtts serve`
# alike. It is an approximation, so first what it costs, on the same random codes as fp32:

# %%
from qtts_lib.bench.codec import tier_rounds  # noqa: E402
from qtts_lib.runtime.audio.wav import SAMPLE_RATE  # noqa: E402
from qtts_lib.runtime.codec.decoder import Codec  # noqa: E402
from qtts_lib.runtime.pipeline.config import ModelConfig  # noqa: E402

cpu_flags = open("/proc/cpuinfo").read()
print("this CPU has AVX512-BF16:", "avx512_bf16" in cpu_flags, "| VNNI:", "avx512_vnni" in cpu_flags)
tiers_here = tier_rounds(model_dir, THREADS, ["fp32", "bf16"], frames=40, rounds=3, progress=False)
vs = tiers_here["vs_fp32"]["bf16"]
display(pd.DataFrame({"ms per frame (this machine, now)": tiers_here["median_ms_per_frame"]}).T)
print(f"bf16 against fp32: SNR {vs['snr_db']} dB, log-spectral distance {vs['log_spectral_distance_db']} dB; "
      f"codes the Mimi encoder hears in both, codebook 0: {vs['mimi_codes_agree'][0]:.2f}, mean of 1-15: "
      f"{np.mean(vs['mimi_codes_agree'][1:]):.2f}")
check.at_least("codec bf16 vs fp32: SNR", "dB", vs["snr_db"], 25.0)
check.at_most("codec bf16 vs fp32: log-spectral distance", "dB", vs["log_spectral_distance_db"], 2.0)
check.at_most("codec bf16 is another computation (not fp32's samples)", "SNR dB", vs["snr_db"], 80.0)
fig, ax = plt.subplots(figsize=(9, 2.6))
ax.bar(range(16), vs["mimi_codes_agree"], color="tab:purple")
ax.set(xlabel="codebook", ylabel="agreement", ylim=(0, 1.05), xticks=range(16),
       title="codes the Mimi encoder gets back from bf16 audio that it gets from fp32 audio")
plt.show()

# %% [markdown]
# Three measures, because each misses something: SNR counts every sample's error (a pessimistic view: a tiny
# phase shift is a large error), the log-spectral distance compares what the ear weighs more (the spectrum, frame
# by frame), and re-encoding both audios with the checkpoint's own Mimi encoder asks whether the *codes* survive:
# codebook 0 (the coarse content) nearly always, the fine residual codebooks less, as expected of a small change
# in the waveform. On random weights the audio is noise, so these are a floor for what a real checkpoint shows.
# Listen to both:

# %%
codes40 = np.random.default_rng(10).integers(0, 2048, (40, 16))
codec_fp32 = Codec(ncnn_dir, ModelConfig.load(model_dir).codec, THREADS)
codec_bf16 = Codec(ncnn_dir, codec_fp32.config, THREADS, precision="bf16")
display(Audio(codec_fp32.decode(codes40), rate=SAMPLE_RATE), Audio(codec_bf16.decode(codes40), rate=SAMPLE_RATE))

# %% [markdown]
# ## 8. The codec in int8
# bf16 storage rounds what is stored; the products still run in floating point. ncnn's *int8 Convolution* runs the
# products themselves on 8-bit integers (VNNI's `vpdpbusd`, four products per lane per instruction) and
# accumulates in int32: one scale per output channel for the weights (127 / that channel's |max|), and for the
# input one *static* scale (127 / the largest |input| the layer is expected to get), fixed in the `.bin` (unlike the
# loop's int8 Gemm, which measures each row's absmax at run time: ncnn's Convolution has no such mode). The static
# scale is a calibration: `codec.int8_form` decodes 320 frames of random codes through the fp32 CPU form once, chunk
# by chunk as the runtime does, records the largest |input| of every chosen layer, and writes those parts again
# under `ncnn/fast_int8/`. The chosen layers are the residual units' convolutions of decoder stages 2-4 (the
# stage's upsampling convolution and the final output convolution stay fp32): stage 1 as well was faster but lost
# another 6 dB (the module docstring lists what was measured). `Codec(precision="int8")`,
# `qtts say --codec-precision int8`. What it wrote, per stage:

# %%
from qtts_lib.runtime.codec.int8_form import INT8_DIR  # noqa: E402

codec_int8 = Codec(ncnn_dir, codec_fp32.config, THREADS, precision="int8", log=print)
int8_desc = json.loads((ncnn_dir / INT8_DIR / "codec_decoder.json").read_text())
display(pd.DataFrame([{"part": k, **v, "largest calibrated |input|": max(int8_desc["calibration"][k].values())}
                      for k, v in int8_desc["stats"].items()]).set_index("part"))
int8_layers = sum(v["convolutions"] for v in int8_desc["stats"].values())
marked = sum((ncnn_dir / INT8_DIR / f).read_text().count(" 8=1") for p in int8_desc["parts"] for f in p["files"]
             if f.endswith(".param") and not f.startswith(".."))
check.equal("codec int8: layers marked int8 in the written parts", "layers", marked, int8_layers)
check.at_least("codec int8: layers made int8", "layers", int8_layers, 1)
tiers_q8 = tier_rounds(model_dir, THREADS, ["fp32", "int8"], frames=40, rounds=3, progress=False)
vq = tiers_q8["vs_fp32"]["int8"]
display(pd.DataFrame({"ms per frame (this machine, now)": tiers_q8["median_ms_per_frame"]}).T)
print(f"int8 against fp32: SNR {vq['snr_db']} dB, log-spectral distance {vq['log_spectral_distance_db']} dB; "
      f"Mimi codebook 0: {vq['mimi_codes_agree'][0]:.2f}, mean of 1-15: {np.mean(vq['mimi_codes_agree'][1:]):.2f}")
check.at_least("codec int8 vs fp32: SNR", "dB", vq["snr_db"], 20.0)
check.at_most("codec int8 vs fp32: log-spectral distance", "dB", vq["log_spectral_distance_db"], 2.0)
check.at_most("codec int8 is another computation (not fp32's samples)", "SNR dB", vq["snr_db"], 80.0)
display(Audio(codec_int8.decode(codes40), rate=SAMPLE_RATE))

# %% [markdown]
# The calibration is the weak point, and worth knowing: an input beyond the calibrated |max| is clipped to ±127
# steps (tests/test_codec_int8.py shows the error it makes), and random codes are not speech. On a real checkpoint,
# measure the tier on your own codes before you ship it (`python -m qtts_lib.bench codec --tiers fp32,int8`).
#
# At full size, every codec tier in one process, alternating rounds (`python -m qtts_lib.bench codec --tiers`), on
# each machine that has a committed file:

# %%
tier_files = sorted((paths.DATA / "bench" / "codec").glob("*-tiers.json"))
for f in tier_files:
    res = json.loads(f.read_text())
    rows = []
    for r in res["runs"]:
        ms = r["median_ms_per_frame"]
        row = {"threads": r["threads"], **{f"{t} ms/frame": v for t, v in ms.items()}}
        for t, q in r["vs_fp32"].items():
            row |= {f"{t} / fp32": round(ms[t] / ms["fp32"], 2), f"{t} SNR dB": q["snr_db"],
                    f"{t} LSD dB": q["log_spectral_distance_db"], f"{t} Mimi cb0": q["mimi_codes_agree"][0]}
        rows.append(row)
    display(pd.DataFrame(rows).style.set_caption(f"{f.stem}: {res['checkpoint']}, {res['machine']['cpu']}"))
if not tier_files:
    print("skipped because data/bench/codec/ has no *-tiers.json (python -m qtts_lib.bench codec --tiers makes one)")

# %% [markdown]
# Which storage is faster is the CPU's business: on the EPYC VM bf16 ran at 0.55x fp32's time; on the Intel Xeon VM
# of 2026-12-02 (AVX512-BF16 and AMX listed, 480 MiB of L3 reported), bf16 was *slower* than fp32 and the int8 tier,
# which keeps fp32 storage, was the fastest. Measure on yours. The int8 loop end to end with each codec, on the EPYC
# VM (`python -m qtts_lib.bench batch --codec-precision fp32,bf16`):

# %%
e2e = paths.DATA / "bench" / "batch" / "dev-2core-epyc-full-base-codec-bf16.json"
if e2e.is_file():
    res = json.loads(e2e.read_text())
    display(pd.DataFrame([{"precision": r["precision"], "codec": r["codec_precision"], "B": r["batch"],
                           **r["ms_per_frame"], "RTF": r["rtf"]} for r in res["rows"]])
            .style.set_caption(f"{e2e.stem}: end to end, 2 threads, ms per (aggregate) frame"))
else:
    print(f"skipped because {e2e} is not there (python -m qtts_lib.bench batch --codec-precision fp32,bf16)")

# %% [markdown]
# ## 9. The tier to pick
# A tier is two choices, the loop's precision (`--precision`) and the codec's (`--codec-precision`), and each has a
# price in quality measured above: the codes the loop picks (agreement with fp32 under teacher forcing, and the frame
# where running free first leaves fp32's codes) and the audio the codec makes of the same codes (SNR, log-spectral
# distance, the codes Mimi hears back). Here the committed full-size results of the EPYC VM side by side, speed
# (one stream, end to end, 2 threads) beside both prices. The fastest pair is `--precision int8 --codec-precision bf16`.

# %%
machine_files = {"speed": paths.DATA / "bench" / "batch" / "dev-2core-epyc-full-base-codec-bf16.json",
                 "loop quality": paths.DATA / "bench" / "quality" / "dev-2core-epyc-full-base.json",
                 "codec quality": paths.DATA / "bench" / "codec" / "dev-2core-epyc-full-base-tiers.json"}
missing = [str(f) for f in machine_files.values() if not f.is_file()]
if missing:
    print("skipped because these committed results are not there:", ", ".join(missing))
else:
    speed, loop_q, codec_q = (json.loads(f.read_text()) for f in machine_files.values())
    two = next(r for r in codec_q["runs"] if r["threads"] == 2)["vs_fp32"]
    bf16 = two["bf16"]
    codec_price = {"fp32": {"codec SNR dB": None, "codec LSD dB": 0.0, "Mimi cb0": 1.0},
                   "bf16": {"codec SNR dB": bf16["snr_db"], "codec LSD dB": bf16["log_spectral_distance_db"],
                            "Mimi cb0": bf16["mimi_codes_agree"][0]}}
    pick = pd.DataFrame([{"loop": r["precision"], "codec": r["codec_precision"], "RTF": r["rtf"],
                          "ms/frame": r["ms_per_frame"]["total"],
                          "cb0 agreement": loop_q["tiers"][r["precision"]]["agreement_codebook0"],
                          "cb1-15 agreement": loop_q["tiers"][r["precision"]]["agreement_predictor_mean"],
                          "first divergent frame": loop_q["tiers"][r["precision"]]["first_divergent_frame"],
                          **codec_price[r["codec_precision"]]}
                         for r in speed["rows"] if r["batch"] == 1 and r["precision"] in loop_q["tiers"]])
    display(pick.style.set_caption("full-base, EPYC VM, one stream, 2 threads: speed beside quality"))
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for _, r in pick.iterrows():
        ax.scatter(r["RTF"], r["cb1-15 agreement"], s=60, color="tab:purple" if r["codec"] == "bf16" else "tab:blue")
        ax.annotate(f" {r['loop']} + {r['codec']} codec", (r["RTF"], r["cb1-15 agreement"]), fontsize=8)
    ax.axvline(1.0, color="gray", ls="--", lw=1)
    ax.set(xlabel="RTF (one stream; < 1 is faster than real time)", ylabel="codebook 1-15 agreement with fp32",
           title="each tier: what it saves and what it costs", ylim=(0.8, 1.02))
    plt.show()
    check.at_most("the fastest committed tier is int8 + bf16 codec", "RTF", float(pick["RTF"].min()),
                  float(pick[(pick["loop"] == "int8") & (pick["codec"] == "bf16")]["RTF"].iloc[0]))

# %% [markdown]
# The machine this project ran on changed on 2026-12-02 to an Intel Xeon VM (AVX-512 VNNI, BF16 and FP16 and AMX
# listed, 480 MiB of L3 reported). There, the int8 loop with each codec tier, end to end (one stream, 2 threads,
# 3 interleaved runs in fresh processes; `python -m qtts_lib.bench loop --runtimes ncnn --precision int8
# --codec-precision fp32,bf16,int8`), with the codec's share of the frame:

# %%
xeon_runs = {}
for f in sorted((paths.DATA / "bench").glob("dev-2core-xeon-amx-full-base-codec-tiers*.json")):
    doc = json.loads(f.read_text())
    for i, xrun in enumerate([doc] + ([doc["second_run"]] if "second_run" in doc else [])):
        check_schema(xrun)
        xeon_runs[f"{f.stem}" + (f" (run {i + 1})" if "second_run" in doc else "")] = xrun
for label, xrun in xeon_runs.items():
    xrows = pd.DataFrame([{"codec tier": r["codec_precision"], **r["ms_per_frame"], "RTF": r["rtf"],
                           "codec share": round(r["ms_per_frame"]["codec"] / r["ms_per_frame"]["total"], 3),
                           "codec (second decode)": r["codec_warm_ms_per_frame"], "floor": r["floor_ms_per_frame"],
                           "loop / floor": r["floor_ratio"]} for r in xrun["rows"]]).set_index("codec tier")
    display(xrows.style.set_caption(f"{label}: {xrun['machine']['cpu']}, int8 loop, ms per frame"))
    check.at_most(f"{label}: the int8 codec's share of the frame below the fp32 codec's", "share",
                  xrows.loc["int8", "codec share"], xrows.loc["fp32", "codec share"])
if xeon_runs:
    ratios = [r["floor_ratio"] for xr in xeon_runs.values() for r in xr["rows"] if r["codec_precision"] == "int8"]
    print(f"int8 loop over its floor across these runs: {min(ratios)}-{max(ratios)}")
else:
    print("skipped because data/bench/ has no dev-2core-xeon-amx-full-base-codec-tiers*.json")

# %% [markdown]
# Read these with care. In the first file, the int8 loop ran at 1.04-1.08x the floor and the whole frame at RTF 1.08
# with the int8 codec, 8% from real time. Forty minutes later the same loop ran at 1.16-1.22x, with the predictor
# 50-53 ms per frame where it had been 40-44. The floor is DRAM bandwidth, and the L3 of this VM (480 MiB reported,
# shared with the rest of the host) can keep part of the predictor's 77 MB of int8 weights between its 15 calls,
# or not, depending on its neighbours. So on this VM the floor is not a hard one (the projections alone, below, ran
# under it in the first hour) and the loop's ratio to it is the host's weather as much as the kernel's.
#
# The codec's share went from 34-36% (fp32) to 29% in the first file and 22-23% in the second: not half. The
# difference between the two is the first decode in a process, which touched about 160 MB of fresh memory (40
# thousand minor page faults, 0.5 s of system time in one 40-frame run) because each of the codec's parts kept its own
# ncnn memory pools. The parts now share one (`binding.net.memory_pool`), and the same first decode touches about
# 65 MB: 21-22 ms per frame against 25-27, with the second decode unchanged at 17-19.
#
# How close can the int8 loop get to its floor? Its projections alone answer it: `python -m qtts_lib.bench
# projections` builds, for each decoder, a graph of nothing but its int8 Gemms (in the form of that day, each with
# the BinaryOp that applies its row scales; the predictor's with one head), and times a frame's worth of calls (the
# talker's once, the predictor's 15 times) interleaved with the read probe in one process. The loop end to end
# (section 5's file) sits at 1.35-1.45x its floor; the projections alone on the same VM, idle:

# %%
proj_file = paths.DATA / "bench" / "int8" / "dev-2core-epyc-full-base-projections.json"
if proj_file.is_file():
    proj = json.loads(proj_file.read_text())
    runs = [proj, proj.get("second_run", proj)]
    display(pd.DataFrame([{k: r[k] for k in ("projections_ms_per_frame", "floor_ms_per_frame", "read_bandwidth_gbs",
                                             "projections_gbs", "projections_over_floor")} for r in runs]))
    check.at_least("int8 projections alone vs the weight-read floor (idle EPYC VM, 2 threads)", "ratio",
                   min(r["projections_over_floor"] for r in runs), 1.15)
else:
    print(f"skipped because {proj_file} is not there")
xeon_proj = paths.DATA / "bench" / "int8" / "dev-2core-xeon-amx-full-base-projections.json"
if xeon_proj.is_file():
    xp = json.loads(xeon_proj.read_text())
    print(f"Intel Xeon VM: projections {xp['projections_ms_per_frame']} ms per frame against a floor of "
          f"{xp['floor_ms_per_frame']} ({xp['projections_over_floor']}x): its L3 holds weights between calls")

# %% [markdown]
# On the EPYC VM ncnn's int8 GEMV reads its weights at about 25 GB/s where the probe reads 30: 1.18-1.21x the floor
# before any other layer, the sampling or Python. So there the loop's 1.15x is out of reach of this kernel (Gemm's
# explicit tile sizes, params 21/22, measured the same as ncnn's own choice); what would reach it is a GEMV that
# streams at the probe's rate, which the pip wheel does not have, or a cache that holds the predictor's weights, as
# the Xeon VM's does.

# %% [markdown]
# ## 10. The int8 loop against its floor
# Section 9 left the int8 loop at 1.35-1.45x its floor on the EPYC VM. What does a frame spend beyond reading its
# weights? Counted on the loop itself (full-base, int8, 2 threads, every `extract` of three 40-frame runs timed): a
# frame makes 32 graph calls (the talker step, the talker's codec head, 15 code-predictor steps, 15 head calls, and a
# text embedding every tenth frame) and 238 extracts (the talker's hidden state and its 56 cache blobs, 11 per
# predictor step). ncnn's extracts took 55-56 ms of the loop's 61 ms per frame in those runs, so what Python and the
# binding add around them is 4-6 ms; the rest is inside ncnn. Three things went, in the product:
#
# - **The row-scale layers.** With the weights as B, every Gemm was followed by a `BinaryOp` that multiplied its
#   output by a `MemoryData` table of row scales: 40 more layers in each of the 15 predictor calls and 224 in the
#   talker step, each reading and writing its activations once more. With the weights as A (section 2) the row scales
#   live inside the Gemm, and the layers are gone.
# - **Per-row activation quantization.** One scale per call, not one per row: a step has one row anyway, and a
#   prefill or a batch shares one scale (ncnn's int8 Gemm takes one scale for its B).
# - **Glue.** The position inputs of a step (RoPE tables, the attention mask) are cached per (past, length) in
#   `KvCacheNet` instead of built every call, and outputs are read from the Mat's bytes (`np.frombuffer`, then one
#   copy) instead of through `Mat.numpy()`, whose buffer description numpy parses in Python.
#
# First the projections alone (`python -m qtts_lib.bench projections`), the forms side by side in one process,
# interleaved with the read probe: the weights as A with one tile over the whole K (the product's form), the same
# with ncnn's own tile choice, the earlier form (weights as B, row scales after each Gemm), and in the later file
# ncnn's other int8 GEMV, `InnerProduct` (inputs reshaped to 1-D, a static input scale: a timing form only, since a
# step's activations have no range to calibrate on random weights).

# %%
forms_files = [f for f in sorted((paths.DATA / "bench" / "int8").glob("*projections*.json"))
               if "forms" in json.loads(f.read_text())]
for f in forms_files:
    forms = json.loads(f.read_text())
    display(pd.DataFrame(forms["forms"]).T.style.set_caption(
        f"{f.stem}: {forms['machine']['cpu']}, {forms['threads']} threads, the probe read "
        f"{forms['read_bandwidth_gbs']} GB/s in the run, floor {forms['floor_ms_per_frame']} ms per frame"))
    t = {k: v["projections_ms_per_frame"] for k, v in forms["forms"].items()}
    check.at_most(f"{f.stem}: weights as A with one K tile, against the other forms", "ms/frame",
                  t["weights_as_a"], min(v for k, v in t.items() if k != "weights_as_a"))
if not forms_files:
    print("skipped because data/bench/int8/ has no projections file with forms (python -m qtts_lib.bench projections)")

# %% [markdown]
# Did it pay end to end? The same export, the int8 files of each form written by its own commit, the loop run by
# fresh harness calls alternating between the earlier form (03b8583) and this one (c492500), four each, in the same
# hour, with the int8 codec. Over that hour the read probe inside each call moved between 26 and 39 GB/s, and each
# row's floor with it: compare milliseconds here, not the ratios.

# %%
ab_file = paths.DATA / "bench" / "int8" / "dev-2core-epyc-full-base-loop-before-after.json"
if ab_file.is_file():
    ab = json.loads(ab_file.read_text())
    ab_rows = []
    for side in ("before", "after"):
        check_schema(ab[side])
        for r in ab[side]["rows"]:
            ab_rows.append({"form": f"{side} ({ab[side]['commit']})", **r["ms_per_frame"],
                            "loop": round(r["ms_per_frame"]["talker"] + r["ms_per_frame"]["predictor"], 1),
                            "floor": r["floor_ms_per_frame"], "loop / floor": r["floor_ratio"]})
    ab_table = pd.DataFrame(ab_rows)
    display(ab_table.style.set_caption(f"{ab_file.stem}: {ab['before']['machine']['cpu']}, int8 loop and int8 codec, "
                                       "2 threads, fresh processes alternating, ms per frame"))
    med = ab_table.groupby("form")[["loop", "loop / floor"]].median()
    display(med.style.set_caption("medians"))
    check.at_most("int8 loop: weights as A against weights as B + row scales (medians, same hour)", "ms/frame",
                  float(med.loc[f"after ({ab['after']['commit']})", "loop"]),
                  float(med.loc[f"before ({ab['before']['commit']})", "loop"]))
else:
    print(f"skipped because {ab_file} is not there")

# %% [markdown]
# End to end, the product as a user runs it (`python -m qtts_lib.bench loop --runtimes ncnn --precision int8
# --codec-precision fp32,bf16,int8 --threads 2 --repeats 5`), each codec tier with the quality it costs beside it: the
# loop's (`python -m qtts_lib.bench quality`, 200 frames, the weights-as-A form) and the codec's (section 8's file).

# %%
e2e_files = sorted((paths.DATA / "bench").glob("dev-2core-epyc-full-base-int8-weights-as-a*.json"),
                   key=lambda f: (len(f.stem), f.stem))  # the first run, then -run2
q_file = paths.DATA / "bench" / "quality" / "dev-2core-epyc-full-base-weights-as-a.json"
cq_file = paths.DATA / "bench" / "codec" / "dev-2core-epyc-full-base-int8-tiers.json"
if e2e_files and q_file.is_file() and cq_file.is_file():
    q_now, cq_now = json.loads(q_file.read_text()), json.loads(cq_file.read_text())
    loop_q = q_now["tiers"]["int8"]
    codec_q = next(r for r in cq_now["runs"] if r["threads"] == 2)["vs_fp32"]
    e2e_rows, cpus = [], set()
    for i, f in enumerate(e2e_files, 1):
        doc = json.loads(f.read_text())
        check_schema(doc)
        cpus.add(doc["machine"]["cpu"])
        e2e_rows += [(f"run {i}", r) for r in doc["rows"]]
    cpu = " / ".join(sorted(cpus))
    display(pd.DataFrame([{"run": run_name, "codec tier": r["codec_precision"], **r["ms_per_frame"], "RTF": r["rtf"],
                           "codec (second decode)": r["codec_warm_ms_per_frame"], "floor": r["floor_ms_per_frame"],
                           "loop / floor": r["floor_ratio"], "cb0 agreement": loop_q["agreement_codebook0"],
                           "cb1-15 agreement": loop_q["agreement_predictor_mean"],
                           "codec SNR dB": codec_q.get(r["codec_precision"], {}).get("snr_db"),
                           "codec LSD dB": codec_q.get(r["codec_precision"], {}).get("log_spectral_distance_db", 0.0)}
                          for run_name, r in e2e_rows]).set_index(["run", "codec tier"]).style.set_caption(
        f"{', '.join(f.stem for f in e2e_files)}: {cpu}, full-base, int8 loop, one stream, "
        "2 threads, 5 repeats each, ms per frame; quality: the loop's against fp32 (200 frames), the codec's"))
    frame_bars([f"{run_name}\n{r['codec_precision']} codec" for run_name, r in e2e_rows], [r for _, r in e2e_rows],
               f"full-base, int8 loop, {cpu}, 2 threads: where a frame goes")
    plt.show()
    ratios = [r["floor_ratio"] for _, r in e2e_rows]
    best_run, best = min(e2e_rows, key=lambda x: x[1]["rtf"])
    print(f"fastest: int8 loop + {best['codec_precision']} codec ({best_run}), RTF {best['rtf']}; the loop at "
          f"{min(ratios)}-{max(ratios)}x its floor")
    check.at_least("int8 loop end to end, at or above its weight-read floor", "ratio", min(ratios), 1.0)
else:
    print("skipped because a committed file is missing: data/bench/dev-2core-epyc-full-base-int8-weights-as-a*.json, "
          f"{q_file} or {cq_file}")

# %% [markdown]
# Where this leaves one stream on two cores: the loop (talker + predictor) ran 11% faster than the earlier form in the
# same hour (medians 69.4 against 77.7 ms per frame), and the projections alone took 4-16% less time as A than as B.
# In the two committed end-to-end runs the best pair is the int8 loop with the int8 codec (run 1, RTF 1.26) or the
# bf16 codec (run 2, RTF 1.18), the loop at 1.19-1.34x its floor. The quietest single call we saw, in the A/B above,
# came to 81.0 ms per frame (RTF 1.01): the VM at its best, not a median. Real time (RTF <= 1) with the loop within
# 1.15x of its floor, in one committed file, is **not** reached on this VM. What stands in the way, measured:
#
# - **The int8 GEMV kernel.** ncnn's int8 Gemm, with nothing else in the graph, read its weights at 25.6-27.2 GB/s
#   where the probe read 31.3-36.5 in the same process (1.22-1.34x; the forms tables above). The other Gemm forms
#   were slower, and ncnn's int8 InnerProduct slower still (2.3x the Gemm's time): a GEMV that streams at the probe's
#   rate is not in the pip wheel.
# - **Everything else in the loop.** Norms, RoPE, attention over a short cache, the residual adds, and 4-6 ms per
#   frame of Python and binding glue around 238 extracts.
# - **The codec.** 17-24 ms per frame in its cheapest tier (bf16 or int8: which is faster changes from run to run).
#
# What would close it: an int8 GEMV that streams at memory speed (ncnn built from source with such a kernel), fewer
# bits per weight with a fast kernel (ncnn's 4/6-bit blocks have none on x86: FACTS.md), or a machine that reads
# faster. Left as small, measured levers: the predictor's 15 head calls (0.9-1.3 ms per frame inside `extract`) fused
# into its step graph, and a step graph without the `Permute`s and single-output `Split`s pnnx leaves.

# %% [markdown]
# ## Summary
# - The loop's floor is bytes per frame over bandwidth, so it moves only with bytes per weight: fp16 halves it and
#   int8 quarters it (the predictor's heads too; the talker's codec head stays fp32).
# - fp16 is a `.param` rewrite (fp16 storage on the InnerProducts, every other layer masked to fp32); int8 is a new
#   `.param`/`.bin` written from numpy (`precision.ensure_int8`, once per export), checked against a numpy model of
#   ncnn's int8 arithmetic (`rewrites.decode_step`, `rewrites.int8`). `Synthesizer(precision=...)` and
#   `qtts say --precision` pick the tier; fp32 stays the default and the one that holds token parity with PyTorch.
# - Quality is measured, not assumed: agreement per codebook under teacher forcing, the first divergent frame, and
#   the per-layer error; on random weights they are pessimistic.
# - Decoding on the second core while the first generates pays where one thread reads memory at two thirds or more
#   of the two-thread rate (EPYC VM, int8: 89 vs 111 ms/frame) and not at about half (Intel VM: 179 vs 174;
#   section 6). `runtime.experimental.codec_process` is that pipeline, with the in-process synthesizer's codes and
#   audio; its measured gain on the EPYC VM (0-17% for int8, -8% to +7% for fp16 over two pairs of runs) is within the
#   VM's noise, so it is an experiment, not a product option (no CLI or server flag).
# - On two cores the int8 loop's floor alone is 54-84 ms per frame (the two committed machines read 32 and 21 GB/s),
#   so a faster-than-real-time loop *plus* codec needs fewer than 8 bits per weight (ncnn has no fast x86 kernel for
#   its 4- and 6-bit blocks: FACTS.md), a faster codec, or more bandwidth.
# - The int8 Gemms take the weights as constant A with ncnn's per-row scales inside, one activation scale per call:
#   no row-scale layers after them. On the EPYC VM that made the loop 11% faster than the earlier form in the same
#   hour, and one stream end to end ran at RTF 1.18-1.26 (best pair per run), the loop 1.19-1.34x its floor: not
#   real time. ncnn's int8 GEMV alone runs at 1.22-1.34x the read floor there, so the rest needs a faster kernel
#   (section 10).
# - The codec is compute-bound, so its tiers are cheaper arithmetic: bf16 storage on its upsampling parts
#   (`--codec-precision bf16`, section 7) and int8 convolutions in the residual units of decoder stages 2-4, with
#   static input scales calibrated once (`--codec-precision int8`, section 8), each measured against fp32 by SNR,
#   log-spectral distance and the codes Mimi hears back. Which is faster depends on the CPU: bf16 on the EPYC VM,
#   int8 (33.5 dB) on the Intel Xeon VM of 2026-12-02, where bf16 was slower than fp32.
# - On that Xeon VM the int8 loop with the int8 codec ran at RTF 1.08-1.22, the loop at 1.04-1.22x its DRAM floor
#   depending on the hour (its host's shared L3 holds the predictor's weights, or not; section 9).
#
# **Artifacts left:** `models/<ckpt>/ncnn/int8/` (the int8 tier's `.param`/`.bin` of both decoders and `stamp.json`,
# rewritten only when the exports change), `models/<ckpt>/ncnn/fast_int8/` (the codec's int8 parts and their
# calibration), `data/outputs/<ckpt>/12_quality.json` (this run's quality measurement),
# `data/outputs/<ckpt>/12_one_gemm/` (the one-projection int8 graph of section 2), the chapter report.
#
# **If your numbers differ**
# - *int8 no faster than fp16* → check that your CPU has VNNI (`grep avx512_vnni /proc/cpuinfo`); without it ncnn's
#   int8 Gemm runs on plain AVX2 integer arithmetic.
# - *fp16 steps equal to fp32* → F16C is missing, or `use_fp16_storage` was not set before `load_param`.
# - *low agreement on a real checkpoint* → look at the per-layer plot for the first layer that jumps: a layer with
#   outlier activations suffers from one activation scale per call (its absmax sets the step for every feature);
#   keep that layer fp32.
# - *codec process: "did not start"* → the child (`python -m qtts_lib.runtime.experimental.codec_process`, this
#   interpreter, this environment) could not import `qtts_lib` or load the codec; the error carries its reason.
# - *codec process faster (or slower) here than the committed run* → expected: its gain is within a VM's noise;
#   compare against `python -m qtts_lib.bench overlap` run twice on your machine.

# %%
check.table()
