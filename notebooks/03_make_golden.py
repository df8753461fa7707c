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
# # 03 · Make golden references
# > The port is judged against files, not against memory:
# > greedy fp32 CPU outputs of the original, saved with a manifest.
#
# **You will:** run the original greedily (talker and code predictor `do_sample=False`) on CPU fp32 on one thread,
# save the codes `(T, 16)`, the EOS step, the waveform and the prompt embeddings of an x-vector clone;
# make an early-stop case and an ICL clone; then see why "token for token" only means something inside one numeric
# domain.
#
# **You will learn:** what a golden file must carry to be trusted later (manifest: producer, inputs, sha256,
# versions, threads, checkpoint fingerprint); how small the argmax margins are and what that means for parity.
#
# **You need:** `models/<ckpt>/` (chapter 00; synthesized here if missing), the committed `data/inputs/voice.wav`
# and `voice.txt`. **Leaves behind:** `data/golden/<ckpt>/*.npz` + `manifest.json`,
# `data/reports/<ckpt>/03_make_golden.json`.

# %% [markdown]
# A **golden** is a reference output of the original model saved to disk, which every later chapter compares the
# port against. The set-up loads the original and asks the library which goldens this checkpoint kind has
# (`golden.cases`: the name of each, and the voice arguments of its run; chapter 09 has the other kinds').
# The main golden's name starts with the voice mode (`golden.mode_of`): `xvec` on Base (an x-vector clone),
# `speaker` on CustomVoice, `design` on VoiceDesign; `voice` holds its arguments:

# %%
import torch

from qtts_lib import check, checkpoint, golden, reference, settings

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("03_make_golden", ckpt)
tts = reference.load(checkpoint.ensure(ckpt), threads=THREADS)
cfg = checkpoint.load_config(ckpt)
EOS, kind = cfg["talker_config"]["codec_eos_token_id"], cfg["tts_model_type"]
cases = golden.cases(tts)  # every greedy golden: name -> the reference's voice args
mode = golden.mode_of(tts)  # the main golden's stem: xvec on Base
voice = cases[f"{mode}_greedy"]
print(f"{ckpt} ({kind}); goldens on {golden.THREADS} thread, the port on {THREADS}")
print({name: sorted(args) for name, args in cases.items()})

# %% [markdown]
# ## 1. Generate the main golden: greedy, fp32, CPU, one thread
# One run of the original, with everything a later chapter compares against. `reference.capture_generation`
# wraps three methods of the loaded model for one call to capture the prompt embeddings going into the talker, the
# x-vector, and the codes going into the codec. A forward hook on `codec_head` adds the talker's logits at every
# step: they tell us later how close each argmax decision was. The run takes one thread (`golden.THREADS`;
# section 3 shows why) and gives the thread count back after. The text is `inputs.TARGET_TEXT`, chapter 00's
# sentence; on Base the voice is the x-vector of `data/inputs/voice.wav`:

# %%
from qtts_lib import inputs


def run_with_logits(tts, voice: dict, threads: int = golden.THREADS, **kw) -> dict:
    """A greedy run of the golden text on `threads` threads, with the talker logits."""
    logits = []  # codec_head's output at the last position, one (vocab,) row per step
    hook = tts.model.talker.codec_head.register_forward_hook(
        lambda m, a, out: logits.append(out[0, -1].detach().clone()))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = reference.capture_generation(
            tts, inputs.TARGET_TEXT, inputs.LANGUAGE, voice.get("voice_wav"),
            voice.get("voice_text"), speaker=voice.get("speaker"),
            instruct=voice.get("instruct"), **kw)
    finally:
        torch.set_num_threads(before)
        hook.remove()
    out["logits"] = torch.stack(logits).numpy()  # (steps, vocab)
    return out

# %% [markdown]
# The main golden, and how it ended. `talker_sequences` is the talker's token at every step, EOS included if it
# picked it; `eos_step` is where, or -1. The checks: the run made one frame per step before EOS (or
# `max_new_tokens - 1` without it), and it is long enough to test a port on, at least 40 frames unless an EOS
# ended it:

# %%
import time

import numpy as np

MAX_NEW = inputs.GOLDEN_MAX_NEW_TOKENS
t0 = time.perf_counter()
main = run_with_logits(tts, voice, max_new_tokens=MAX_NEW)
codes = main["codes"]  # (T, 16)
hits = np.flatnonzero(main["talker_sequences"] == EOS)
eos_step = int(hits[0]) if hits.size else -1
print(f"{codes.shape[0]} frames x 16 = {codes.size} tokens, EOS step {eos_step} "
      f"({time.perf_counter() - t0:.1f} s)")
check.equal("main golden: frames", "frames", int(codes.shape[0]),
            MAX_NEW - 1 if eos_step < 0 else eos_step)
check.at_least("main golden: at least 40 frames or an EOS", "frames",
               int(codes.shape[0]) if eos_step < 0 else 40, 40)

# %% [markdown]
# Tests and later chapters make the same files when this chapter has not run yet, so the library holds this
# function as `golden.run_with_logits`. It must give the same run, bit for bit; a short run of it against the
# first steps of ours:

# %%
lib = golden.run_with_logits(tts, voice, max_new_tokens=8)
steps = len(lib["logits"])
check.equal("run_with_logits == golden.run_with_logits: logits of the first steps",
            "max_abs", float(np.abs(lib["logits"] - main["logits"][:steps]).max()), 0.0)

# %% [markdown]
# With random weights the talker practically never picks the real EOS (the reference masks every control id but
# EOS, so 2048 codes and EOS compete, and EOS wins about 1 step in 2049), so the run ends at `max_new_tokens`. To
# exercise the EOS branch of the port, make a second golden that *declares* an ordinary code EOS: take the code the
# greedy path emits at step *k* (past the middle of the run, so the stop follows real steps) and nowhere before.
# Told that this code is EOS, the original takes the same path until step *k* and stops there, so it must give
# exactly *k* frames, identical to the main golden's first *k*. (A code that also appeared earlier would stop the
# run there instead; `min_new_tokens=2` masks EOS at steps 0 and 1, so the search starts at step 2.)

# %%
cb0 = main["talker_sequences"]  # codebook 0 per step
k = next(i for i in range(max(2, len(cb0) // 2), len(cb0) - 1) if cb0[i] not in cb0[:i])
early_eos = int(cb0[k])
early = run_with_logits(tts, voice, max_new_tokens=MAX_NEW, eos_token_id=early_eos)
print(f"eos id {early_eos}: first emitted at step {k}; "
      f"the original stopped after {early['codes'].shape[0]} frames")
check.equal("early stop: frames = first emission step", "frames",
            int(early["codes"].shape[0]), k)
check.tokens_equal("early stop: codes = prefix of the main golden",
                   early["codes"], codes[:k])

# %% [markdown]
# ## 2. Save them with a manifest
# Each `.npz` gets an entry in `manifest.json`: producer chapter, inputs (text, language, sha256 of the
# voice clip, `max_new_tokens`, eos id), sha256 of the file, library versions, threads and the checkpoint
# fingerprint. `artifacts.load_npz` refuses a file whose entry does not match and names this chapter. `save`
# writes one golden through the library, reloads it that way at once, and prints its size and arrays:

# %%
from qtts_lib import artifacts


def save(name, run, eos_id, voice_args=voice):
    path = golden.save(ckpt, name, run, eos_id, voice_args)
    arrays, _ = artifacts.load_npz(path, ckpt)
    shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in arrays.items())
    print(f"{path.name:26} {path.stat().st_size / 1024:8.1f} KiB  {shapes}")


save(f"{mode}_greedy", main, EOS)
save(f"{mode}_eos", early, early_eos)

# %% [markdown]
# Then the checkpoint's other goldens, from the same function. On Base it is the **ICL** golden (in-context
# learning), which chapter 08 matches: the voice clip's transcript goes into the text track and its codes from the
# Mimi encoder into the codec track, so the prompt carries the clip itself, frame by frame. The original decodes
# the clip's codes together with the new ones and cuts the clip's share off the waveform, in proportion to its
# frames. The other kinds (chapter 09) have their own: the 1.7B CustomVoice a speaker with a style instruction,
# VoiceDesign a voice with an empty description. Each must run to `max_new_tokens`, and the ICL golden must carry
# at least one frame of the clip:

# %%
extra = {name: args for name, args in cases.items() if name != f"{mode}_greedy"}
if not extra:
    size = cfg.get("tts_model_size")
    print(f"no other golden for this {kind} checkpoint: it does not follow "
          f"instructions (tts_model_size {size!r}), so the reference has none to make")
made = {f"{mode}_greedy": main}
for name, args in extra.items():
    made[name] = run = run_with_logits(tts, args, max_new_tokens=MAX_NEW)
    save(name, run, EOS, args)
    frames = int(run["codes"].shape[0])
    print(f"{name}: prompt {run['inputs_embeds'].shape[0]} rows, "
          f"{run['voice_codes'].shape[0]} voice frames, {frames} generated frames")
    check.equal(f"{name}: generated frames", "frames", frames, MAX_NEW - 1)
if "icl_greedy" in made:
    check.at_least("icl_greedy: voice codes of the clip in the prompt", "frames",
                   int(made["icl_greedy"]["voice_codes"].shape[0]), 1)

# %% [markdown]
# Where a checkpoint kind has a golden with an instruction and one without, their prompts differ by exactly the
# instruction: one user turn of text rows in front of the prompt, as many rows as the turn has tokens. A turn is
# written in Qwen's chat markup, `<|im_start|>user` … `<|im_end|>`, each marker one token of the tokenizer
# (`tts.processor.tokenizer`). On Base there is no such pair and the cell checks nothing:

# %%
def instruct_rows(text: str) -> int:
    turn = f"<|im_start|>user\n{text}<|im_end|>\n"
    return len(tts.processor.tokenizer(turn)["input_ids"])


pairs = (("speaker_instruct_greedy", "speaker_greedy"),
         ("design_greedy", "design_plain_greedy"))
for with_it, without in pairs:
    if with_it in made and without in made:
        rows = len(made[with_it]["inputs_embeds"]) - len(made[without]["inputs_embeds"])
        check.equal(f"{with_it}: prompt rows - {without}'s = the instruction's tokens",
                    "rows", rows, instruct_rows(cases[with_it]["instruct"]))

# %% [markdown]
# Every golden file on disk reloads through its manifest entry, and the entry's sha256 is the file's:

# %%
from qtts_lib import paths

golden_dir = paths.golden_dir(ckpt)
for name in sorted(p.name for p in golden_dir.glob("*.npz")):
    arrays, entry = artifacts.load_npz(golden_dir / name, ckpt)
    check.equal(f"{name} reloads through its manifest", "sha256 ok",
                entry["sha256"] == artifacts.sha256(golden_dir / name), True)

# %% [markdown]
# The main golden, heard and seen: its waveform, and its codes as an image (one row per codebook, one column per
# frame):

# %%
import matplotlib.pyplot as plt
from IPython.display import Audio, display

from qtts_lib import plots
from qtts_lib.runtime.audio.wav import SAMPLE_RATE

display(Audio(main["wav"], rate=SAMPLE_RATE))
plots.waveform({f"main golden ({codes.shape[0]} frames)": main["wav"]})
fig, ax = plt.subplots(figsize=(11, 2.8))
ax.imshow(codes.T, aspect="auto", interpolation="nearest", cmap="viridis")
ax.set_xlabel("frame")
ax.set_ylabel("codebook")
ax.set_title("golden codes (T, 16): codebook 0 from the talker, "
             "1..15 from the code predictor");

# %% [markdown]
# ## 3. The numeric-domain lesson
# "Token for token" is a claim about one numeric domain: one device, precision, thread count and set of kernels.
# On one thread every sum of a matrix product runs in one order,
# so a rerun (same machine, same kernels) is bitwise identical. On more threads the BLAS splits those sums between
# threads as it sees fit: MKL, torch's BLAS, promises a bitwise rerun only under conditions it lists
# ([conditional numerical reproducibility](https://www.intel.com/content/www/us/en/docs/onemkl/developer-guide-linux/2025-1/reproducibility-conditions.html)),
# which is why the goldens take one thread. Change the thread count or the attention kernel and the low bits of the
# logits move. Whether a moved bit flips a token depends on how close the top two logits were. First the same
# domain: a rerun must be bitwise equal, logits and waveform.

# %%
rerun = run_with_logits(tts, voice, max_new_tokens=MAX_NEW)
check.equal("same domain rerun: logits bitwise equal", "max_abs",
            float(np.abs(rerun["logits"] - main["logits"]).max()), 0.0)
check.equal("same domain rerun: waveform bitwise equal", "max_abs",
            float(np.abs(rerun["wav"] - main["wav"]).max()), 0.0)

# %% [markdown]
# Then two other domains: two threads instead of one, and the eager attention kernel instead of torch's SDPA
# (scaled dot-product attention, the fused kernel the reference uses by default). `compare` measures the logit
# differences up to the first token where a run parts from the main golden (after that the inputs differ too, and
# the logits are no longer comparable), and counts the tokens that differ; each must agree to fp32 rounding:

# %%
def compare(name, other):
    """Logit differences up to the first diverging token, and token mismatches."""
    seq = other["talker_sequences"]
    parted = np.flatnonzero(seq[: len(cb0)] != cb0[: len(seq)])
    both = min(len(other["logits"]), len(main["logits"]))
    upto = int(parted[0]) + 1 if parted.size else both
    ours, ref = other["logits"][:upto], main["logits"][:upto]
    n = min(len(other["codes"]), len(codes))
    bad = int((other["codes"][:n] != codes[:n]).sum())
    bad += 16 * abs(len(other["codes"]) - len(codes))
    d = np.abs(ours - ref).max()
    rel = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
    print(f"{name:28} max |dlogit| {d:.3e}   rel {rel:.2e}   "
          f"tokens differing {bad}/{codes.size}")
    return d, rel, bad


more = max(THREADS, 2)
threaded = run_with_logits(tts, voice, threads=more, max_new_tokens=MAX_NEW)
eager_tts = reference.load(paths.model_dir(ckpt), threads=THREADS, attn="eager")
eager = run_with_logits(eager_tts, voice, max_new_tokens=MAX_NEW)
del eager_tts
domains = {f"{more} threads instead of 1": threaded,
           "eager attention instead of sdpa": eager}
results = {name: compare(name, run) for name, run in domains.items()}
for name, (_dmax, rel, _bad) in results.items():
    check.at_most(f"{name}: logits agree to fp32 rounding", "rel", rel, 1e-5)

# %% [markdown]
# The differences above are rounding: summation order changes with the thread count and the kernel. They matter
# only where the top two logits of a decision are closer than that. The margin of a decision is its top logit
# minus the runner-up, among the ids the reference lets compete (the 2048 codes and EOS: the last 1024 ids of the
# vocabulary are control ids it masks); the spread, the top minus the bottom. The margins of this run, and the
# red line where the largest cross-domain change above falls:

# %%
allowed = np.r_[np.arange(cfg["talker_config"]["vocab_size"] - 1024), EOS]
top2 = np.sort(main["logits"][:, allowed], axis=1)[:, -2:]
margin = top2[:, 1] - top2[:, 0]
spread = main["logits"][:, allowed].max(1) - main["logits"][:, allowed].min(1)
worst = max(r[0] for r in results.values())
print(f"talker decisions: {len(margin)}; median margin {np.median(margin):.3g} "
      f"({np.median(margin / spread):.2f} of the logit spread); "
      f"smallest {margin.min():.3g}; under 1e-2: {(margin < 1e-2).sum()}; "
      f"under the largest cross-domain change ({worst:.2g}): {(margin < worst).sum()}")
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.hist(np.log10(margin + 1e-12), bins=30, color="tab:blue")
ax.axvline(np.log10(max(worst, 1e-12)), color="crimson", ls="--",
           label="largest cross-domain logit change")
ax.set_xlabel("log10(top1 - top2) of the talker logits")
ax.set_ylabel("decisions")
ax.legend(fontsize=8)
ax.set_title("how close each greedy decision was");

# %% [markdown]
# With a few dozen decisions a near tie may or may not occur in this run; over a long generation it will, and a
# reference made in another domain (on a GPU, say) then parts from a CPU port at that frame, with no bug on either
# side. Hence the rule for the rest of the tutorial:
# **the oracle is generated in the domain the port is compared in** — CPU, fp32 — and the port's own numerics
# (ncnn's kernels, on any thread count) are judged by relative error first and by token equality only end to end.

# %% [markdown]
# ## Summary
# - Golden files: codes `(T, 16)`, EOS step, waveform, prompt embeddings, x-vector and talker logits, greedy on
#   CPU fp32 on one thread, each `.npz` with a manifest entry that consumers verify.
# - An early-stop golden (an EOS id the greedy path emits at step ≥ 2) exercises the stop branch; the ICL golden
#   carries the voice clip's codes and transcript in its prompt.
# - One thread ⇒ bitwise repeatable; another thread count or attention kernel moves the low bits, and a near-tie
#   argmax can flip. Compare only within one numeric domain.
#
# **Artifacts left:** `data/golden/<ckpt>/{xvec_greedy,xvec_eos,icl_greedy}.npz` (the other kinds' names:
# chapter 09) and `manifest.json`.
#
# **If your numbers differ**
# - *Rerun not bitwise equal* → something else in this process changed torch's thread count while a golden ran, or
#   the BLAS picks kernels by memory alignment: `MKL_CBWR=AUTO,STRICT` (the Makefile sets it; `reference.load` does
#   where it is unset) tells MKL not to, if set before torch's first matrix product.
# - *A later chapter says a golden is stale* → the checkpoint was rebuilt; re-run this chapter.
# - *Tokens differ across domains here* → a near tie; the histogram shows which margin was under the change.
# - *A prompt-rows check fails on another checkpoint kind* → the reference's prompt layout changed (qwen-tts
#   version); chapter 07 draws the layout the runtime's `pipeline.prompt` follows, chapter 09 each kind's.

# %%
check.table()
