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
# convolutions calibrated once, each measured against fp32's audio; pick a tier from a table of speed beside quality.
#
# **You will learn:** why the codec's tiers are not the loop's; what a *static* input scale (fixed once from sample
# inputs, not measured per call) is and where it breaks; why the fastest codec tier is the CPU's business.
#
# **You need:** `models/<ckpt>/ncnn/` with the codec's CPU form (chapters 04, 12; made here if missing). **Leaves
# behind:** `models/<ckpt>/ncnn/fast_int8/` (the int8 codec), `data/reports/<ckpt>/14_quantize_the_codec.json`.

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Audio, display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench.results import check_schema

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("14_quantize_the_codec", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)
ncnn_dir = paths.ncnn_dir(ckpt)
BENCH = paths.DATA / "bench"
REFERENCE = "dev-2core-epyc"  # chapter 11's reference machine (2 cores, AMD EPYC)
committed = lambda name: json.loads((BENCH / name).read_text())  # noqa: E731

# %% [markdown]
# ## 1. Where a frame of the int8 loop goes
# Chapter 13 left the loop in int8 and the codec in fp32. Its *weight-read floor* (bytes per frame over the probed
# bandwidth) is under real time, yet the loop runs above it; the [lab notes](../lab_notes.md) ("What bounds the
# loop?") take the gap apart with committed files, and this cell holds their findings. The *projections alone* files
# time only a frame's int8 Gemms, in several forms: chapter 13's (weights as A, one tile over K) is the fastest, and
# even it stays above the floor. A *calls* file times a frame call by call: its *rest*, the time beyond reading the
# weights (norms, attention, caches, Python), is a small share. End to end the loop stays above its floor:

# %%
int8_runs = [committed(f"{REFERENCE}-full-base-int8-weights-as-a{s}.json")
             for s in ("", "-run2")]
over_floor = []
for f in sorted((BENCH / "int8").glob(f"{REFERENCE}-full-base-projections*.json")):
    doc = json.loads(f.read_text())
    forms = (doc.get("forms") or {"weights_as_b_row_scales": doc}) | (
        {"second call": doc["second_run"]} if "second_run" in doc else {})
    over_floor += [v["projections_over_floor"] for v in forms.values()]
    if "forms" in doc:
        t = {k: v["projections_ms_per_frame"] for k, v in doc["forms"].items()}
        others = min(v for k, v in t.items() if k != "weights_as_a")
        check.at_most(f"{f.stem}: weights as A with one K tile, against the other "
                      "forms", "ms/frame", t["weights_as_a"], others)
check.at_least("int8 projections alone vs the weight-read floor (idle EPYC VM, "
               "2 threads)", "ratio", min(over_floor), 1.15)
per = committed("calls/dev-2core-xeon-amx-full-base-int8.json")["per_frame"]
check.at_most("int8 loop: a frame's rest beyond its weights, share of the frame "
              "(committed run)", "share", per["rest_ms"] / per["frame_ms"], 0.2)
e2e = min(r["floor_ratio"] for doc in int8_runs for r in doc["rows"])
check.at_least("int8 loop end to end, at or above its weight-read floor", "ratio",
               e2e, 1.0)

# %% [markdown]
# The codec comes on top: its share of each frame in the same runs, and the codec alone (chapter 12's benchmark),
# the arithmetic a frame needs against the machine's measured peak (a large fp32 matrix product) at the same threads.

# %%
fp32_codec = [r for doc in int8_runs for r in doc["rows"]
              if r["codec_precision"] == "fp32"]
codec_ms = [r["ms_per_frame"]["codec"] for r in fp32_codec]
shares = [r["ms_per_frame"]["codec"] / r["ms_per_frame"]["total"] for r in fp32_codec]
alone = committed(f"codec/{REFERENCE}-full-base.json")["runs"]
alone = next(r for r in alone if r["threads"] == 2)
print(f"int8 loop + fp32 codec, 2 threads: the codec {min(codec_ms)}-{max(codec_ms)} "
      f"ms of each frame ({min(shares):.0%}-{max(shares):.0%})")
print(f"the codec alone: {alone['gflop_per_frame']} GFLOP per frame at "
      f"{alone['fraction_of_peak']['ncnn']:.0%} of the machine's sgemm peak "
      f"({alone['peak_gflops']} GFLOP/s): compute-bound")

# %% [markdown]
# The loop reads every weight per frame and does little arithmetic with it; the codec reuses each weight at every
# sample (chapter 12): fewer bytes per weight would not help it, cheaper arithmetic can (more products per instruction).
#
# ## 2. The codec in bf16
# ncnn's *bf16 storage* keeps weights and the activations between layers as bfloat16 (fp32's exponent, 8 bits of
# mantissa); on a CPU with AVX512-BF16 (AMD Zen 4 has it) its convolutions multiply bf16 pairs into fp32, twice the
# products per instruction. `Codec(precision="bf16")` (`qtts say --codec-precision bf16`) turns it on for the
# upsampling parts, nearly all of the arithmetic. An approximation, so its audio is measured against fp32's on random
# codes, three ways, as each misses something: **SNR** counts every sample's error (a tiny phase shift is a large
# error); the **log-spectral distance** (LSD) is the RMS difference of the two power spectra in dB, frame by frame
# (closer to what the ear weighs); re-encoding both audios with the checkpoint's Mimi encoder asks whether the *codes*
# survive, codebook by codebook:

# %%
from qtts_lib.bench.codec import tier_rounds

cpu_flags = open("/proc/cpuinfo").read()
print("this CPU has AVX512-BF16:", "avx512_bf16" in cpu_flags,
      "| VNNI:", "avx512_vnni" in cpu_flags)
here = tier_rounds(model_dir, THREADS, ["fp32", "bf16"], rounds=3, progress=False)
vs = here["vs_fp32"]["bf16"]
display(pd.DataFrame({"ms per frame, here and now": here["median_ms_per_frame"]}).T)
mimi = vs["mimi_codes_agree"]
print(f"bf16 against fp32: SNR {vs['snr_db']} dB, log-spectral distance "
      f"{vs['log_spectral_distance_db']} dB; codes the Mimi encoder hears in both, "
      f"codebook 0: {mimi[0]:.2f}, mean of 1-15: {np.mean(mimi[1:]):.2f}")
check.at_least("codec bf16 vs fp32: SNR", "dB", vs["snr_db"], 25.0)
check.at_most("codec bf16 vs fp32: log-spectral distance", "dB",
              vs["log_spectral_distance_db"], 2.0)
check.at_most("codec bf16 is another computation (not fp32's samples)", "SNR dB",
              vs["snr_db"], 80.0)
ax = plt.subplots(figsize=(9, 2.6), layout="tight")[1]
ax.bar(range(16), mimi, color="tab:purple")
ax.set(xlabel="codebook", ylabel="agreement", ylim=(0, 1.05), xticks=range(16),
       title="codes the Mimi encoder gets back from bf16 audio as from fp32 audio")
plt.show()

# %% [markdown]
# Codebook 0 (coarse content) survives nearly always, the fine codebooks less. Random weights: noise. Listen to both:

# %%
from qtts_lib.runtime.audio.wav import SAMPLE_RATE
from qtts_lib.runtime.codec.decoder import Codec
from qtts_lib.runtime.pipeline.config import ModelConfig

codes40 = np.random.default_rng(10).integers(0, 2048, (40, 16))  # (T, 16)
codec_fp32 = Codec(ncnn_dir, ModelConfig.load(model_dir).codec, THREADS)
codec_bf16 = Codec(ncnn_dir, codec_fp32.config, THREADS, precision="bf16")
display(Audio(codec_fp32.decode(codes40), rate=SAMPLE_RATE),
        Audio(codec_bf16.decode(codes40), rate=SAMPLE_RATE))

# %% [markdown]
# ## 3. The codec in int8, calibrated once
# bf16 storage rounds what is stored; the products still run in floating point. ncnn's *int8 Convolution* multiplies
# 8-bit integers (VNNI's `vpdpbusd`, four products per lane per instruction) into int32: one scale per output channel
# for the weights (127 / that channel's |max|) and one *static* scale for the input (127 / the largest |input| the
# layer is expected to get), fixed in the `.bin`, where the loop's int8 Gemm measures its activations on every call.
# That scale is a calibration: `codec.int8_form` decodes random codes through the fp32 CPU form once, chunk by chunk,
# records the largest |input| of the residual units' convolutions (chapter 12) in decoder stages 2-4 (the rest stays
# fp32; the module's docstring lists the cuts measured), writes those parts under `ncnn/fast_int8/` (an int8 layer
# has `8=1` in its `.param` line). `Codec(precision="int8")`, `qtts say --codec-precision int8`. What it wrote:

# %%
from qtts_lib.runtime.codec.int8_form import INT8_DIR

codec_int8 = Codec(ncnn_dir, codec_fp32.config, THREADS, precision="int8", log=print)
int8_desc = json.loads((ncnn_dir / INT8_DIR / "codec_decoder.json").read_text())
calibrated = {k: max(v.values()) for k, v in int8_desc["calibration"].items()}
display(pd.DataFrame([{"part": k, **v, "largest calibrated |input|": calibrated[k]}
                      for k, v in int8_desc["stats"].items()]).set_index("part"))
int8_layers = sum(v["convolutions"] for v in int8_desc["stats"].values())
written = [f for p in int8_desc["parts"] for f in p["files"]
           if f.endswith(".param") and not f.startswith("..")]
marked = sum((ncnn_dir / INT8_DIR / f).read_text().count(" 8=1") for f in written)
check.equal("codec int8: layers marked int8 in the written parts", "layers", marked,
            int8_layers)
check.at_least("codec int8: layers made int8", "layers", int8_layers, 1)
here = tier_rounds(model_dir, THREADS, ["fp32", "int8"], rounds=3, progress=False)
vq = here["vs_fp32"]["int8"]
display(pd.DataFrame({"ms per frame, here and now": here["median_ms_per_frame"]}).T)
mimi = vq["mimi_codes_agree"]
print(f"int8 against fp32: SNR {vq['snr_db']} dB, log-spectral distance "
      f"{vq['log_spectral_distance_db']} dB; Mimi codebook 0: {mimi[0]:.2f}, "
      f"mean of 1-15: {np.mean(mimi[1:]):.2f}")
check.at_least("codec int8 vs fp32: SNR", "dB", vq["snr_db"], 20.0)
check.at_most("codec int8 vs fp32: log-spectral distance", "dB",
              vq["log_spectral_distance_db"], 2.0)
check.at_most("codec int8 is another computation (not fp32's samples)", "SNR dB",
              vq["snr_db"], 80.0)
display(Audio(codec_int8.decode(codes40), rate=SAMPLE_RATE))

# %% [markdown]
# The calibration is the weak point: an input beyond the calibrated |max| is clipped to ±127 steps, and random codes
# are not speech. On a real checkpoint, measure the tier on your codes (`python -m qtts_lib.bench codec --tiers`).
#
# A stream (chapter 15) pushes a frame or a few at a time; each push runs the codec's transformer one position through
# its KV cache, reading all its weights (the loop's memory-bound case). So the tier gives that cached form the loop's
# int8 projections (chapter 13), all but its input and output projections (those alone cost the stream several dB);
# a whole decode runs the fp32 transformer. The ConvNeXt stages' pointwise projections (a `Linear` per sample) get the
# same int8 Gemm in both. The check: streamed a frame at a time, the int8 tier stays as close to fp32 as a whole decode:

# %%
kv_stats = int8_desc["transformer_kv_stats"]
print(f"the stream's transformer: {kv_stats['gemms']} int8 projections; "
      f"fp32: {', '.join(kv_stats['kept_fp32'])}")
up_gemms = sum(v["gemms"] for v in int8_desc["gemm_stats"].values())
print(f"the upsampler: {up_gemms} int8 projections in parts "
      f"{', '.join(int8_desc['gemm_stats'])}")
check.at_least("codec int8: the upsampler's projections made int8", "layers",
               up_gemms, 1)
inc = codec_int8.incremental()
streamed = np.concatenate([inc.push(codes40[i : i + 1]) for i in range(len(codes40))])
whole_fp32 = codec_fp32.decode(codes40)
stream_snr = check.snr_db(streamed, whole_fp32)
whole_snr = check.snr_db(codec_int8.decode(codes40), whole_fp32)
print(f"against fp32's whole decode: int8 streamed {stream_snr:.1f} dB, "
      f"int8 whole {whole_snr:.1f} dB")
check.at_least("codec int8: the stream's transformer projections made int8", "layers",
               kv_stats["gemms"], 1)
check.at_most("codec int8: streamed vs whole, distance to fp32", "dB",
              abs(stream_snr - whole_snr), 3.0)

# %% [markdown]
# ## 4. Both tiers at full size
# Every codec tier in one process, alternating rounds (`python -m qtts_lib.bench codec --tiers fp32,bf16,int8`), on
# the reference machine at 1 and 2 threads, each against fp32's audio of the same codes:

# %%
ref_tiers = committed(f"codec/{REFERENCE}-full-base-int8-tiers.json")
rows = []
for r in ref_tiers["runs"]:
    ms = r["median_ms_per_frame"]
    for t, v in ms.items():
        q = r["vs_fp32"].get(t)
        rows.append({"threads": r["threads"], "tier": t, "ms/frame": v,
                     "/ fp32": round(v / ms["fp32"], 2)} | ({
                         "SNR dB": q["snr_db"], "LSD dB": q["log_spectral_distance_db"],
                         "Mimi cb0": q["mimi_codes_agree"][0],
                         "Mimi cb1-15": round(np.mean(q["mimi_codes_agree"][1:]), 3)}
                        if q else {}))
display(pd.DataFrame(rows).set_index(["threads", "tier"]).style.set_caption(
    f"full-base, {ref_tiers['machine']['cpu']}: the codec alone per tier"))

# %% [markdown]
# Which tier is faster is the CPU's business: bf16 pays where the CPU multiplies bf16 pairs fast, int8 where VNNI
# does its work. Every committed codec-tiers file at 2 threads (side by side: the [results page](results.ipynb)):

# %%
for f in sorted((BENCH / "codec").glob("*-tiers.json")):
    run2 = next(r for r in json.loads(f.read_text())["runs"] if r["threads"] == 2)
    ms = run2["median_ms_per_frame"]
    print(f"{f.stem}: fastest {min(ms, key=ms.get)}; " + ", ".join(
        f"{t} {v / ms['fp32']:.2f}x fp32's time" for t, v in ms.items() if t != "fp32"))

# %% [markdown]
# End to end, the codec's share of a frame, in every committed run of the int8 loop with both fp32 and int8 codecs:

# %%
shares = {}
for f in sorted(BENCH.glob("*.json")):
    doc = json.loads(f.read_text())
    runs = [doc] + ([doc["second_run"]] if "second_run" in doc else [])
    for i, run in enumerate(runs):
        by_tier = {r.get("codec_precision"): r for r in run["rows"]
                   if r["precision"] == "int8" and r["threads"] == 2}
        if {"fp32", "int8"} <= set(by_tier):
            check_schema(run)
            label = f.stem + (f" (run {i + 1})" if len(runs) > 1 else "")
            share = {t: r["ms_per_frame"]["codec"] / r["ms_per_frame"]["total"]
                     for t, r in by_tier.items()}
            shares[label] = {t: round(v, 3) for t, v in share.items()}
            check.at_most(f"{label}: the int8 codec's share of the frame below the "
                          "fp32 codec's", "share", shares[label]["int8"],
                          shares[label]["fp32"])
display(pd.DataFrame(shares).T[["fp32", "bf16", "int8"]].style.set_caption(
    "the codec's share of one frame (int8 loop, 2 threads), per codec tier"))

# %% [markdown]
# ## 5. Check the second-core experiment against its files
# Could a second process decode chunk k while the loop makes chunk k+1? `python -m qtts_lib.bench overlap` times four
# arrangements of two cores: *sequential* (loop, then codec, each on both), *split* (loop on one, codec on the other),
# *oversubscribed* (loop on both, the codec squeezed in) and the *codec process*. Splitting pays only where one thread
# draws most of the bandwidth (lab notes, "What does the second core buy?"), so `runtime.experimental` keeps it.
# Checked here: oversubscribed is the slowest in every committed file;

# %%
overlap_files = sorted((BENCH / "overlap").glob("*.json"))
for f in overlap_files:
    t = json.loads(f.read_text())["ms_per_frame"]
    check.equal(f"{f.stem}: oversubscribed is the slowest", "arrangement",
                max(t, key=lambda k: t[k]["per_frame"]), "oversubscribed")
check.at_least("committed overlap measurements", "files", len(overlap_files), 1)

# %% [markdown]
# and the codec process (a child Python decoding, with chapter 15's incremental decoder, the frames this process
# sends it) gives the in-process synthesizer's codes and audio (this checkpoint, greedy, 40 frames):

# %%
from qtts_lib.bench.workload import LANGUAGE, TEXT
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.experimental.codec_process import CodecProcess

in_process = Synthesizer(model_dir, threads=1)
piped = Synthesizer(model_dir, threads=1,
                    decoders=CodecProcess.for_checkpoint(model_dir))
made = {}
for name, synth in (("in process", in_process), ("codec process", piped)):
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    made[name] = synth.synthesize(TEXT, LANGUAGE, voice, Sampling(greedy=True),
                                  max_frames=40)
piped.close()  # stops the child
a, b = made["in process"], made["codec process"]
check.equal("codec process: the same codes as in process", "frames equal",
            int((a.codes == b.codes).all(1).sum()), len(a.codes))
check.snr("codec process: the same audio as in process", b.wav, a.wav, 100.0)

# %% [markdown]
# ## 6. The tier to pick
# A tier is two choices, the loop's precision (`--precision`, chapter 13) and the codec's (`--codec-precision`), each
# with its price: the codes the loop picks (teacher-forced agreement, first divergent frame; chapter 13's committed
# quality files) and the audio the codec makes (SNR, log-spectral distance, Mimi's codes; section 4's file). One
# table, every pair the reference machine ran end to end (one stream, 2 threads; each pair's best and worst RTF over
# its runs), beside both prices. fp32 + fp32 is the only pair that keeps token parity with PyTorch.

# %%
SPEED = [f"{REFERENCE}-full-base-tiers.json", f"{REFERENCE}-full-base-codec-tiers.json",
         f"batch/{REFERENCE}-full-base-codec-bf16.json",
         f"{REFERENCE}-full-base-int8-weights-as-a.json",
         f"{REFERENCE}-full-base-int8-weights-as-a-run2.json"]
speed = pd.DataFrame([
    {"loop": r["precision"], "codec": r.get("codec_precision") or "fp32",
     "RTF": r["rtf"], "ms/frame": r["ms_per_frame"]["total"]}
    for name in SPEED for r in committed(name)["rows"]
    if r["runtime"] == "ncnn" and r["threads"] == 2 and r.get("batch") in (None, 1)
    and (r["precision"] != "int8" or "weights-as-a" in name)])  # int8: 13's form
q_all = committed(f"quality/{REFERENCE}-full-base.json")
q_int8 = committed(f"quality/{REFERENCE}-full-base-weights-as-a.json")
loop_q = {t: (q_int8 if t == "int8" else q_all)["tiers"][t]
          for t in ("fp32", "fp16", "int8")}
codec_q = next(r for r in ref_tiers["runs"] if r["threads"] == 2)["vs_fp32"]
codec_q["fp32"] = {"snr_db": float("inf"), "log_spectral_distance_db": 0.0,
                   "mimi_codes_agree": [1.0]}
pairs = speed.groupby(["loop", "codec"]).agg(
    runs=("RTF", "size"), best_RTF=("RTF", "min"), worst_RTF=("RTF", "max"),
    best_ms_per_frame=("ms/frame", "min"))
pick = pairs.reset_index()
loops, codecs = [loop_q[t] for t in pick["loop"]], [codec_q[c] for c in pick["codec"]]
pick = pick.assign(**{
    "cb0 agreement": [q["agreement_codebook0"] for q in loops],
    "cb1-15 agreement": [q["agreement_predictor_mean"] for q in loops],
    "first divergent frame": [str(q["first_divergent_frame"]).replace("None", "never")
                              for q in loops],
    "codec SNR dB": [q["snr_db"] for q in codecs],
    "codec LSD dB": [q["log_spectral_distance_db"] for q in codecs],
    "Mimi cb0": [q["mimi_codes_agree"][0] for q in codecs],
}).sort_values("best_RTF")
display(pick.set_index(["loop", "codec"]).style.format(precision=3).set_caption(
    "full-base, reference machine, one stream, 2 threads: speed beside quality"))

# %% [markdown]
# The verdict, from the same rows: the fastest pair, the pairs within its spread, and its price.

# %%
best = pick.iloc[0]
near = pick[pick["best_RTF"] <= best["worst_RTF"]].iloc[1:]
int8_bf16 = pick.set_index(["loop", "codec"]).loc[("int8", "bf16"), "best_RTF"]
check.at_most("the fastest committed tier is int8 + bf16 codec", "RTF",
              float(pick["best_RTF"].min()), float(int8_bf16))
print(f"fastest: --precision {best['loop']} --codec-precision {best['codec']}, "
      f"RTF {best['best_RTF']}-{best['worst_RTF']} over {best['runs']} runs"
      + "".join(f"; within its spread: {r['loop']} + {r['codec']} codec "
                f"(RTF {r['best_RTF']}-{r['worst_RTF']})" for _, r in near.iterrows()))
print(f"its price: loop agreement {best['cb0 agreement']} (codebook 0) and "
      f"{best['cb1-15 agreement']} (1-15), free-running codes leave fp32's at frame "
      f"{best['first divergent frame']}; codec SNR {best['codec SNR dB']} dB, "
      f"log-spectral distance {best['codec LSD dB']} dB")
reached = pick["best_RTF"].min() < 1
print("real time (RTF < 1) on this machine:",
      "reached" if reached else "not reached by any pair")

# %% [markdown]
# ## Summary
# - The codec is compute-bound, so its tiers are cheaper arithmetic: bf16 storage on its upsampling parts, int8
#   convolutions with static input scales calibrated once (for streams, also the loop's int8 projections in the
#   transformer's cached form); each measured against fp32 by SNR, log-spectral distance and Mimi's codes.
# - Which codec tier is faster depends on the CPU: measure on yours (`python -m qtts_lib.bench codec --tiers`). The
#   codec process (a second core decoding) keeps the codes and audio; its gain varies by machine: an experiment.
# - The tier to pick is the last table: the fastest pair beside its price; fp32 + fp32 for parity.
#
# **Artifacts left:** `models/<ckpt>/ncnn/fast_int8/` (the int8 parts and their calibration, rewritten when the CPU
# form changes), the chapter report. Earlier forms, other machines, the second core: the [lab notes](../lab_notes.md).
#
# **If your numbers differ**
# - *bf16 slower than fp32* → no fast bf16 products (`grep avx512_bf16 /proc/cpuinfo`); use the int8 codec or fp32.
# - *int8 codec audio much worse on real speech* → the calibrated |max| was exceeded (inputs clipped at ±127 steps):
#   recalibrate on real codes or keep the codec fp32.
# - *codec process: "did not start"* → the child (`python -m qtts_lib.runtime.experimental.codec_process`, this
#   interpreter, this environment) could not import `qtts_lib` or load the codec; the error carries its reason.
# - *codec process faster (or slower) than the committed runs* → expected: run `python -m qtts_lib.bench overlap`.

# %%
check.table()
