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
# # 14 · Quantize the codec, and pick a tier
# > Once the loop is int8 the codec is a large share of every frame; it is compute-bound, so its tiers make the
# > arithmetic cheaper, not the bytes fewer.
#
# **You will:** see what the codec costs beside chapter 13's int8 loop; decode in bf16 storage and with int8
# convolutions calibrated once, and measure each against fp32 by SNR, log-spectral distance and the codes the Mimi
# encoder hears back; try decoding on the second core; and pick a tier from one table of speed beside quality.
#
# **You will learn:** why the codec's tiers are not the loop's; what a static input scale is and where it breaks;
# why the fastest codec tier is the CPU's business; why the codec process stayed an experiment.
#
# **You need:** `models/<ckpt>/ncnn/` with the codec's CPU form (chapters 04 and 12; exported here if missing).
# **Leaves behind:** `models/<ckpt>/ncnn/fast_int8/` (the codec's int8 tier, calibrated once),
# `data/reports/<ckpt>/14_quantize_the_codec.json`.

# %%
import json
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Audio, display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench.codec import tier_rounds
from qtts_lib.bench.results import check_schema
from qtts_lib.bench.workload import LANGUAGE, TEXT
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.audio.wav import SAMPLE_RATE
from qtts_lib.runtime.codec.decoder import Codec
from qtts_lib.runtime.codec.int8_form import INT8_DIR
from qtts_lib.runtime.experimental.codec_process import CodecProcess
from qtts_lib.runtime.pipeline.config import ModelConfig

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("14_quantize_the_codec", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
del tts
ncnn_dir = paths.ncnn_dir(ckpt)
BENCH = paths.DATA / "bench"
REFERENCE = "dev-2core-epyc"  # the reference machine of the committed full-size files (2 cores, AMD EPYC)
committed = lambda name: json.loads((BENCH / name).read_text())

# %% [markdown]
# ## 1. What the codec costs beside the int8 loop
# Chapter 13 left the loop in int8 and the codec in fp32. On the reference machine, the same runs, with the codec's
# share of each frame; and the codec alone (chapter 11's codec benchmark): the arithmetic one frame needs, against
# the machine's measured sgemm peak at the same threads.

# %%
int8_runs = [committed(f"{REFERENCE}-full-base-int8-weights-as-a{s}.json") for s in ("", "-run2")]
fp32_codec = [r for doc in int8_runs for r in doc["rows"] if r["codec_precision"] == "fp32"]
shares = [r["ms_per_frame"]["codec"] / r["ms_per_frame"]["total"] for r in fp32_codec]
codec_alone = next(r for r in committed(f"codec/{REFERENCE}-full-base.json")["runs"] if r["threads"] == 2)
print(f"int8 loop + fp32 codec, 2 threads: the codec {min(r['ms_per_frame']['codec'] for r in fp32_codec)}-"
      f"{max(r['ms_per_frame']['codec'] for r in fp32_codec)} ms of each frame ({min(shares):.0%}-{max(shares):.0%})")
print(f"the codec alone: {codec_alone['gflop_per_frame']} GFLOP per frame at "
      f"{codec_alone['fraction_of_peak']['ncnn']:.0%} of the machine's sgemm peak ({codec_alone['peak_gflops']} "
      "GFLOP/s): compute-bound")

# %% [markdown]
# The loop reads every weight per frame and does little arithmetic with it; the codec turns 16 codes into 1920
# samples through convolutions that reuse each weight at every sample, so it runs near the machine's arithmetic peak
# and fewer bytes per weight would not help it. Cheaper arithmetic can: products on narrower numbers, more per
# instruction.
#
# ## 2. The codec in bf16
# ncnn's *bf16 storage* keeps weights and the activations between layers as bfloat16 (fp32's exponent, 8 bits of
# mantissa), and on a CPU with AVX512-BF16 (AMD Zen 4 has it) its convolutions multiply bf16 pairs with fp32
# accumulation, twice the products per instruction. `Codec(precision="bf16")` turns it on for the upsampling parts,
# nearly all of the arithmetic; the codebooks and the transformer stay fp32. `Synthesizer(codec_precision="bf16")`,
# `qtts say --codec-precision bf16` and `qtts serve` alike. It is an approximation, so first what it costs, on the
# same random codes as fp32:

# %%
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
ax = plt.subplots(figsize=(9, 2.6), layout="tight")[1]
ax.bar(range(16), vs["mimi_codes_agree"], color="tab:purple")
ax.set(xlabel="codebook", ylabel="agreement", ylim=(0, 1.05), xticks=range(16),
       title="codes the Mimi encoder gets back from bf16 audio that it gets from fp32 audio")
plt.show()

# %% [markdown]
# Three measures, because each misses something: SNR counts every sample's error (a pessimistic view: a tiny phase
# shift is a large error), the log-spectral distance compares what the ear weighs more (the spectrum, frame by frame),
# and re-encoding both audios with the checkpoint's own Mimi encoder asks whether the *codes* survive: codebook 0 (the
# coarse content) nearly always, the fine residual codebooks less, as expected of a small change in the waveform. On
# random weights the audio is noise, so these are a floor for what a real checkpoint shows. Listen to both:

# %%
codes40 = np.random.default_rng(10).integers(0, 2048, (40, 16))
codec_fp32 = Codec(ncnn_dir, ModelConfig.load(model_dir).codec, THREADS)
codec_bf16 = Codec(ncnn_dir, codec_fp32.config, THREADS, precision="bf16")
display(Audio(codec_fp32.decode(codes40), rate=SAMPLE_RATE), Audio(codec_bf16.decode(codes40), rate=SAMPLE_RATE))

# %% [markdown]
# ## 3. The codec in int8, calibrated once
# bf16 storage rounds what is stored; the products still run in floating point. ncnn's *int8 Convolution* runs the
# products on 8-bit integers (VNNI's `vpdpbusd`, four products per lane per instruction) and accumulates in int32:
# one scale per output channel for the weights (127 / that channel's |max|), and for the input one *static* scale
# (127 / the largest |input| the layer is expected to get), fixed in the `.bin`. That is the difference from the
# loop's int8 Gemm, which measures its activations' absmax on every call: ncnn's Convolution has no such mode. The
# static scale is a calibration: `codec.int8_form` decodes random codes through the fp32 CPU form once, chunk by chunk
# as the runtime does, records the largest |input| of every chosen layer, and writes those parts again under
# `ncnn/fast_int8/`. The chosen layers are the residual units' convolutions of decoder stages 2-4; each stage's
# upsampling convolution, the first stage and the final output convolution stay fp32 (the module's docstring lists
# the cuts that were measured). `Codec(precision="int8")`, `qtts say --codec-precision int8`. What it wrote, per stage:

# %%
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
# steps (`tests/test_codec_int8.py` shows the error it makes), and random codes are not speech. On a real checkpoint,
# measure the tier on your own codes before you ship it (`python -m qtts_lib.bench codec --tiers fp32,int8`).
#
# A stream (chapter 15) decodes a frame or a few at a time, and each push runs the transformer one position
# through its KV cache, reading all of its weights for one frame. So the tier also gives that cached form the
# loop's int8 projections (chapter 13: per-row weight scales, each call's activations measured, no calibration),
# all but the transformer's input and output projections, which stay fp32 (made int8 too, they alone cost the
# stream several dB). A whole decode runs the fp32 transformer once over all frames. The ConvNeXt upsampler after
# the transformer has pointwise projections as well (1024 <-> 4096, two per upsampling part): they get the same int8
# Gemm, in the whole decode and the stream alike. The check: streamed one frame at a time, the int8 tier stays as
# close to fp32's audio as its whole decode does.

# %%
kv_stats = int8_desc["transformer_kv_stats"]
print(f"the stream's transformer: {kv_stats['gemms']} int8 projections; fp32: {', '.join(kv_stats['kept_fp32'])}")
up_gemms = sum(v["gemms"] for v in int8_desc["gemm_stats"].values())
print(f"the upsampler: {up_gemms} int8 projections in parts {', '.join(int8_desc['gemm_stats'])}")
check.at_least("codec int8: the upsampler's projections made int8", "layers", up_gemms, 1)
inc = codec_int8.incremental()
streamed = np.concatenate([inc.push(codes40[i : i + 1]) for i in range(len(codes40))])
whole_fp32 = codec_fp32.decode(codes40)
stream_snr, whole_snr = check.snr_db(streamed, whole_fp32), check.snr_db(codec_int8.decode(codes40), whole_fp32)
print(f"against fp32's whole decode: int8 streamed {stream_snr:.1f} dB, int8 whole {whole_snr:.1f} dB")
check.at_least("codec int8: the stream's transformer projections made int8", "layers", kv_stats["gemms"], 1)
check.at_most("codec int8: streamed vs whole, distance to fp32", "dB", abs(stream_snr - whole_snr), 3.0)
#
# ## 4. Both tiers at full size
# Every codec tier in one process, alternating rounds (`python -m qtts_lib.bench codec --tiers fp32,bf16,int8`), on
# the reference machine at 1 and 2 threads, each against fp32's audio of the same codes:

# %%
ref_tiers = committed(f"codec/{REFERENCE}-full-base-int8-tiers.json")
rows = []
for r in ref_tiers["runs"]:
    ms = r["median_ms_per_frame"]
    rows += [{"threads": r["threads"], "tier": t, "ms/frame": v, "/ fp32": round(v / ms["fp32"], 2),
              **({"SNR dB": q["snr_db"], "LSD dB": q["log_spectral_distance_db"], "Mimi cb0": q["mimi_codes_agree"][0],
                  "Mimi cb1-15": round(float(np.mean(q["mimi_codes_agree"][1:])), 3)}
                 if (q := r["vs_fp32"].get(t)) else {})} for t, v in ms.items()]
display(pd.DataFrame(rows).set_index(["threads", "tier"]).style.set_caption(
    f"full-base, {ref_tiers['machine']['cpu']}: the codec alone per tier"))

# %% [markdown]
# Which tier is faster is the CPU's business, not the format's: bf16 pays only where the CPU multiplies bf16 pairs
# fast, int8 where VNNI does its work. Every committed codec-tiers file, at 2 threads (the machines side by side are
# on the [results page](results.ipynb)):

# %%
for f in sorted((BENCH / "codec").glob("*-tiers.json")):
    run2 = next(r for r in json.loads(f.read_text())["runs"] if r["threads"] == 2)["median_ms_per_frame"]
    print(f"{f.stem}: fastest {min(run2, key=run2.get)}; " + ", ".join(
        f"{t} {v / run2['fp32']:.2f}x fp32's time" for t, v in run2.items() if t != "fp32"))

# %% [markdown]
# End to end, the codec tier moves the codec's share of a frame. Every committed run of the int8 loop with both the
# fp32 and the int8 codec:

# %%
shares = {}
for f in sorted(BENCH.glob("*.json")):
    doc = json.loads(f.read_text())
    runs = [doc] + ([doc["second_run"]] if "second_run" in doc else [])
    for i, run in enumerate(runs):
        by_tier = {r.get("codec_precision"): r for r in run["rows"] if r["precision"] == "int8" and r["threads"] == 2}
        if {"fp32", "int8"} <= set(by_tier):
            check_schema(run)
            label = f.stem + (f" (run {i + 1})" if len(runs) > 1 else "")
            shares[label] = {t: round(r["ms_per_frame"]["codec"] / r["ms_per_frame"]["total"], 3)
                             for t, r in by_tier.items()}
            check.at_most(f"{label}: the int8 codec's share of the frame below the fp32 codec's", "share",
                          shares[label]["int8"], shares[label]["fp32"])
display(pd.DataFrame(shares).T[["fp32", "bf16", "int8"]].style.set_caption(
    "the codec's share of one frame (int8 loop, 2 threads), per codec tier"))

# %% [markdown]
# ## 5. Decode on the second core?
# The codec could decode chunk k in a second process while the loop generates chunk k+1. `python -m qtts_lib.bench
# overlap` measures whether that pays: generation then codec on all cores (sequential), generation on one thread
# while the other decodes (split: a pipeline runs at the slower of the two), generation on all cores with the decoder
# squeezed in (oversubscribed), and, where the file has it, `pipeline`: `synthesize` with the codec in a second
# process, timed whole. A split beats sequential when the codec's time on all cores is more than what the loop loses
# by running on one thread; how much the loop loses depends on how much of the memory bandwidth one thread can draw.
# Every committed measurement:

# %%
overlap_rows = []
for f in sorted((BENCH / "overlap").glob("*.json")):
    res = json.loads(f.read_text())
    t = res["ms_per_frame"]
    lost = t["split"]["generate"] - t["sequential"]["generate"]  # what the loop loses by giving up a core
    bw = res.get("machine", {}).get("read_bandwidth_gbs")  # GB/s read by 1 and by 2 threads, where recorded
    overlap_rows.append({"file": f.stem, "loop": res["precision"], "codec": res.get("codec_precision") or "fp32",
                         **{k: v["per_frame"] for k, v in t.items()}, "loop loses on 1 thread": round(lost, 1),
                         "codec on all cores": t["sequential"]["codec"],
                         "1 thread reads (of 2)": round(bw["1"] / bw["2"], 2) if bw else None})
    check.equal(f"{f.stem}: oversubscribed is the slowest", "arrangement", max(t, key=lambda k: t[k]["per_frame"]),
                "oversubscribed")
check.at_least("committed overlap measurements", "files", len(overlap_rows), 1)
overlap = pd.DataFrame(overlap_rows).set_index("file")
display(overlap.style.set_caption("ms per frame (80 = real time), full-base, 2 cores"))
split_wins = overlap["split"] < overlap["sequential"]
rule = overlap["codec on all cores"] > overlap["loop loses on 1 thread"]  # the rule above, per run
piped_runs = overlap.dropna(subset=["pipeline"])
print(f"split faster than sequential in {split_wins.sum()} of {len(overlap)} runs, exactly where the rule says so: "
      f"{bool((rule == split_wins).all())}; the codec process faster than sequential in "
      f"{(piped_runs['pipeline'] < piped_runs['sequential']).sum()} of {len(piped_runs)}")

# %% [markdown]
# Squeezing the decoder beside a two-thread loop is the slowest everywhere: ncnn's OpenMP threads spin and wait on a
# core that the other process holds. The split and its product form, `runtime.experimental.codec_process`, win where
# one thread draws most of the bandwidth and lose where it draws about half, and a cheaper codec tier makes the second
# core worth less, not more. `CodecProcess` starts a child Python that loads the codec and runs chapter 15's
# incremental `StreamDecoder` on the frames this process sends as the loop makes them (threads would not overlap: the
# binding holds the GIL inside `extract`); a synthesizer given it as its `decoders` pushes its frames there. Because
# its gain comes and goes with the machine and the tiers, it stays out of the product: `qtts say` and `qtts serve`
# have no flag for it; measure it where you run. Here it is held to the in-process synthesizer on this checkpoint,
# greedy, 40 frames: the same codes, the same audio.

# %%
GREEDY = Sampling(greedy=True)
in_process = Synthesizer(model_dir, threads=1)
piped = Synthesizer(model_dir, threads=1, decoders=CodecProcess.for_checkpoint(model_dir))
made = {}
for name, s in (("in process", in_process), ("codec process", piped)):
    voice = s.voice(wav=load_wav(paths.voice_wav()))
    t0 = time.perf_counter()
    r = s.synthesize(TEXT, LANGUAGE, voice, GREEDY, max_frames=40)
    made[name] = {"result": r, "ms per frame (this run)": 1000 * (time.perf_counter() - t0) / len(r.codes)}
piped.close()  # stops the child
a, b = made["in process"]["result"], made["codec process"]["result"]
display(pd.DataFrame({k: {"frames": len(v["result"].codes), "ms per frame (this run)": v["ms per frame (this run)"],
                          "codec not hidden (ms)": 1000 * v["result"].seconds["codec"]} for k, v in made.items()}))
check.equal("codec process: the same codes as in process", "frames equal", int((a.codes == b.codes).all(1).sum()),
            len(a.codes))
check.snr("codec process: the same audio as in process", b.wav, a.wav, 100.0)

# %% [markdown]
# ## 6. The tier to pick
# A tier is two choices, the loop's precision (`--precision`, chapter 13) and the codec's (`--codec-precision`), and
# each has its price: the codes the loop picks (agreement with fp32 under teacher forcing, and the frame where
# running free first leaves fp32's codes) and the audio the codec makes of the same codes (SNR, log-spectral
# distance, the codes Mimi hears back). One table, every pair the reference machine ran end to end (one stream,
# 2 threads; a pair run more than once shows its best and worst run), each beside both prices: the loop's from
# chapter 13's committed quality files, the codec's from section 4's file. fp32 + fp32 is the only pair that keeps
# token parity with PyTorch. The verdict under the table is printed from the same rows.

# %%
SPEED = [f"{REFERENCE}-full-base-tiers.json", f"{REFERENCE}-full-base-codec-tiers.json",
         f"batch/{REFERENCE}-full-base-codec-bf16.json", f"{REFERENCE}-full-base-int8-weights-as-a.json",
         f"{REFERENCE}-full-base-int8-weights-as-a-run2.json"]
speed = pd.DataFrame([{"loop": r["precision"], "codec": r.get("codec_precision") or "fp32", "RTF": r["rtf"],
                       "ms/frame": r["ms_per_frame"]["total"]} for name in SPEED for r in committed(name)["rows"]
                      if r["runtime"] == "ncnn" and r["threads"] == 2 and r.get("batch") in (None, 1)
                      and (r["precision"] != "int8" or "weights-as-a" in name)])  # int8: chapter 13's form only
q_all, q_int8 = committed(f"quality/{REFERENCE}-full-base.json"), committed(
    f"quality/{REFERENCE}-full-base-weights-as-a.json")
loop_q = {t: (q_int8 if t == "int8" else q_all)["tiers"][t] for t in ("fp32", "fp16", "int8")}
codec_q = next(r for r in ref_tiers["runs"] if r["threads"] == 2)["vs_fp32"]
codec_q["fp32"] = {"snr_db": float("inf"), "log_spectral_distance_db": 0.0, "mimi_codes_agree": [1.0]}
pairs = speed.groupby(["loop", "codec"]).agg(runs=("RTF", "size"), best_RTF=("RTF", "min"), worst_RTF=("RTF", "max"),
                                             best_ms_per_frame=("ms/frame", "min"))
pick = pairs.reset_index().assign(
    **{"cb0 agreement": lambda d: [loop_q[t]["agreement_codebook0"] for t in d["loop"]],
       "cb1-15 agreement": lambda d: [loop_q[t]["agreement_predictor_mean"] for t in d["loop"]],
       "first divergent frame": lambda d: [str(loop_q[t]["first_divergent_frame"]).replace("None", "never")
                                           for t in d["loop"]],
       "codec SNR dB": lambda d: [codec_q[c]["snr_db"] for c in d["codec"]],
       "codec LSD dB": lambda d: [codec_q[c]["log_spectral_distance_db"] for c in d["codec"]],
       "Mimi cb0": lambda d: [codec_q[c]["mimi_codes_agree"][0] for c in d["codec"]]}).sort_values("best_RTF")
display(pick.set_index(["loop", "codec"]).style.format(precision=3).set_caption(
    "full-base, reference machine, one stream, 2 threads: speed beside quality"))
best = pick.iloc[0]
near = pick[pick["best_RTF"] <= best["worst_RTF"]].iloc[1:]
check.at_most("the fastest committed tier is int8 + bf16 codec", "RTF", float(pick["best_RTF"].min()),
              float(pick[(pick["loop"] == "int8") & (pick["codec"] == "bf16")]["best_RTF"].iloc[0]))
print(f"fastest: --precision {best['loop']} --codec-precision {best['codec']}, RTF {best['best_RTF']}-"
      f"{best['worst_RTF']} over {best['runs']} runs"
      + "".join(f"; within its spread: {r['loop']} + {r['codec']} codec (RTF {r['best_RTF']}-{r['worst_RTF']})"
                for _, r in near.iterrows()))
print(f"its price: loop agreement {best['cb0 agreement']} (codebook 0) and {best['cb1-15 agreement']} (1-15), "
      f"free-running codes leave fp32's at frame {best['first divergent frame']}; codec SNR {best['codec SNR dB']} "
      f"dB, log-spectral distance {best['codec LSD dB']} dB")
print("real time (RTF < 1) on this machine:", "reached" if pick["best_RTF"].min() < 1 else "not reached by any pair")

# %% [markdown]
# ## Summary
# - The codec is compute-bound, so its tiers are cheaper arithmetic: bf16 storage on its upsampling parts
#   (`--codec-precision bf16`) and int8 convolutions in the residual units of decoder stages 2-4 with static input
#   scales calibrated once (`--codec-precision int8`), plus, for streams, the loop's int8 projections in the
#   transformer's cached form; each measured against fp32 by SNR, log-spectral distance and the codes Mimi hears back.
# - Which codec tier is faster depends on the CPU; measure on yours (`python -m qtts_lib.bench codec --tiers`).
# - Decoding on the second core pays only where one thread draws most of the memory bandwidth; the codec process
#   (`runtime.experimental.codec_process`) gives the in-process synthesizer's codes and audio, but its gain comes and
#   goes, so it is an experiment, not a product option.
# - The tier to pick is the last table: the fastest pair on the reference machine, beside what it costs in codes and
#   in sound; fp32 + fp32 for parity with PyTorch.
#
# **Artifacts left:** `models/<ckpt>/ncnn/fast_int8/` (the codec's int8 parts and their calibration, rewritten when
# the CPU form changes), the chapter report. Earlier forms, earlier machines and the overlap experiment's history: the
# [lab notes](../lab_notes.md).
#
# **If your numbers differ**
# - *bf16 slower than fp32* → your CPU has no fast bf16 products (`grep avx512_bf16 /proc/cpuinfo`); use the int8
#   codec or fp32.
# - *int8 codec audio much worse on real speech* → the calibration's |max| was exceeded: inputs are clipped at ±127
#   steps; recalibrate on real codes or keep the codec fp32.
# - *codec process: "did not start"* → the child (`python -m qtts_lib.runtime.experimental.codec_process`, this
#   interpreter, this environment) could not import `qtts_lib` or load the codec; the error carries its reason.
# - *codec process faster (or slower) here than the committed runs* → expected: its gain depends on the machine;
#   compare against `python -m qtts_lib.bench overlap` run twice on your machine.

# %%
check.table()
