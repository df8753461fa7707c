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
# # 06 · Generate end to end with ncnn
# > Tokenizer, prompt, sampler, talker loop, code predictor, codec: all numpy + ncnn, every token checked.
#
# **You will:** assemble the torch-free runtime (`qtts_lib.runtime`) — a pure-Python Qwen2 BPE tokenizer
# (`text.bpe`), the prompt builder (`pipeline.prompt`), a numpy sampler in Hugging Face's processor order
# (`pipeline.sampling`), the generation loop over the cached graphs (`pipeline.loop`), and the chunked codec decode
# (`codec`) — then match chapter 03's greedy golden references token for token, and use the `qtts` CLI.
#
# **You will learn:** the exact semantics of the generation loop (dual-track prompt, the 15-step MTP with its
# table/head offset, the frame assembled one step late, EOS on codebook 0); why the processor order matters; why
# the runtime counts frames where the reference counts tokens; that the runtime samples like the checkpoint unless
# told to be greedy; why the codec must be decoded in the reference's chunks.
#
# **You need:** `data/golden/<ckpt>/` (chapter 03: this chapter stops without it; its main golden and early-stop
# golden, `xvec_*`, `speaker_*` or `design_*` by the checkpoint's kind); `models/<ckpt>/ncnn/` (chapters 04–05;
# exported here if missing or stale).
# **Leaves behind:** `data/outputs/<ckpt>/06_ncnn.wav`, `data/reports/<ckpt>/06_generate_end_to_end.json`.

# %%
import inspect
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Audio, display

from qtts_lib import artifacts, check, checkpoint, export, inputs, paths, plots, reference, settings
from qtts_lib.golden import mode_of, voice_of
from qtts_lib.isolation import qtts_without_torch
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, save_wav
from qtts_lib.runtime.pipeline import sampling
from qtts_lib.runtime.pipeline.loop import CodePredictor, Loop
from qtts_lib.runtime.pipeline.sampling import Sampler, SamplerConfig, Sampling
from qtts_lib.runtime.pipeline.synthesizer import Result, Synthesizer
from qtts_lib.runtime.text import bpe

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("06_generate_end_to_end", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)  # the reference, for the tokenizer and sampler comparisons only
export.ensure(tts, ckpt)                          # chapters 04-05's graphs, reused when current
kind = tts.model.tts_model_type    # base | custom_voice | voice_design
mode = mode_of(tts)                # the main golden's stem: xvec, speaker or design
voice_args = voice_of(tts)         # the voice chapter 03 gave the reference for it
golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode}_greedy.npz", ckpt)
early, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode}_eos.npz", ckpt)
print(f"{ckpt} ({kind}): goldens {mode}_greedy and {mode}_eos, voice",
      {k: v if isinstance(v, str) else "data/inputs/voice.wav" for k, v in voice_args.items()})

# %% [markdown]
# ## 1. Tokenize without a tokenizer library
# `runtime.text.bpe` is Qwen2's byte-level BPE in plain Python: special tokens split out first, a hand-written
# pre-tokenizer scanner (no regex library: this is the spec a C/C++ port follows), bytes mapped to printable
# characters, then merges by rank. It must reproduce what the reference pipeline's tokenizer does, including the
# pre-tokenizer change that `fix_mistral_regex=True` selects (qwen-tts loads its processor that way).

# %%
ours = bpe.Tokenizer.from_dir(model_dir)
theirs = tts.processor.tokenizer
prompt_text = f"<|im_start|>assistant\n{inputs.TARGET_TEXT}<|im_end|>\n<|im_start|>assistant\n"
print(ours.encode(prompt_text))
check.equal("prompt ids = reference tokenizer", "equal",
            ours.encode(prompt_text) == theirs(prompt_text)["input_ids"], True)
corpus = (paths.INPUTS / "tokenizer_corpus.txt").read_text(encoding="utf-8").splitlines()
bad = [line for line in corpus if ours.encode(line) != theirs(line)["input_ids"]]
check.equal(f"committed corpus ({len(corpus)} lines: CJK, kana, hangul, emoji, contractions, digits, spaces, specials)",
            "mismatched lines", len(bad), 0)

# %% [markdown]
# ## 2. Process logits in Hugging Face's order
# The reference's `generate` builds, for the talker: repetition penalty (over the codebook-0 tokens generated so
# far; the prompt is embeddings only) → min-length and min-new-tokens EOS masks (EOS = −inf at steps 0 and 1) →
# suppress the control range `[vocab−1024, vocab)` except EOS → (when sampling) temperature → top-k → top-p. Greedy
# is the argmax of the processed scores. The code predictor gets no penalty, no EOS and no suppression.
#
# `pipeline.sampling` has three objects. `Sampling` is what a user chooses: greedy or not, temperature, top-k,
# top-p, repetition penalty, seed. `SamplerConfig` is what one of the reference's two generate() calls does to its
# logits (the talker's, the code predictor's). `Sampler` is one sequence's sampling in the loop: both configs and
# the sequence's own random stream. The processors:

# %%
print(inspect.getsource(sampling.process))

# %% [markdown]
# A checkpoint's defaults come from its `generation_config.json`: `Sampling.from_generation_config` reads the same
# file the reference reads (`tts.model.generate_config`), and they **sample** (`do_sample: true`). Parity with a
# greedy golden needs `greedy=True`, set on top of those defaults:

# %%
cfg = checkpoint.load_config(ckpt)
gen_cfg = tts.model.generate_config
defaults = Sampling.from_generation_config(gen_cfg)
print(defaults)
talker_sc = SamplerConfig.talker(defaults.replace(greedy=True), cfg)
hist = list(golden["talker_sequences"][:6])
logits = golden["logits"][6]
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

hf = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(talker_sc.repetition_penalty),
                          MinNewTokensLengthLogitsProcessor(0, talker_sc.min_new_tokens, talker_sc.eos_id),
                          SuppressTokensLogitsProcessor(list(talker_sc.suppress_ids))])
ref_scores = hf(torch.tensor([hist]), torch.from_numpy(logits)[None].clone())[0].numpy()
ours_scores = sampling.process(logits, hist, 6, talker_sc)
finite = np.isfinite(ref_scores)
check.equal("same -inf positions as HF (suppressed range)", "equal",
            bool((np.isfinite(ours_scores) == finite).all()), True)
check.close("processed talker logits = HF processors (step 6 of the golden)", ours_scores[finite], ref_scores[finite],
            max_abs=1e-6)
check.equal("greedy token = golden token at step 6", "token",
            sampling.sample(logits, hist, 6, talker_sc, np.random.default_rng(0)), int(golden["talker_sequences"][6]))

# %% [markdown]
# ## 3. Build the prompt: two tracks summed position by position
# The text track carries the role prefix, `tts_pad`s, `tts_bos` and the first text token; the codec track carries the
# think/language tags, the speaker row (the x-vector, or a built-in speaker's codec embedding; a designed voice has
# none) and `codec_pad`, `codec_bos`. The rest of the text, then `tts_eos`, waits as *trailing text*, one position
# per frame. An instruction (a VoiceDesign description, or a CustomVoice style) is a user turn of its own in front,
# text rows only. Built-in speakers and designed voices use the **non-streaming** layout by default, as the
# reference's entry points do: the whole text rides on `codec_pad` rows in the prompt and the trailing text is only
# `tts_pad` (chapter 07).
# `Synthesizer.prompt` builds it (`pipeline.prompt.PromptBuilder`); the synthesizer's other parts are its config,
# tokenizer, embeddings (`pipeline.embeddings`), voice encoders (`pipeline.voices`), loop and codec.

# %%
synth = Synthesizer(model_dir, threads=THREADS)
if synth.kind == "base":            # the golden's x-vector: chapter 07 computes it from the clip with ncnn
    voice = synth.voice(xvector=golden["xvector"])
elif synth.kind == "custom_voice":
    voice = synth.voice(speaker=voice_args["speaker"])
else:                               # voice_design: the voice is the description
    voice = synth.voice(instruct=voice_args["instruct"])
prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
print(f"prompt {prompt.embeds.shape}, trailing text {prompt.trailing.shape}")
check.close("prompt embeddings = reference", prompt.embeds, golden["inputs_embeds"], rel=1e-5)
check.close("trailing text embeddings = reference", prompt.trailing, golden["trailing_text_hidden"], rel=1e-5)

# %% [markdown]
# ## 4. Run the loop and compare every token
# Per frame: the talker's logits give codebook 0; the code predictor prefills `[talker hidden, embed(c0)]` and reads
# head 0 for codebook 1, then takes 14 cached steps, embedding with table *s−1* and reading head *s*; the frame is
# complete only then, so the talker's next input — `embed(c0) + Σ tables(c1..c15) + trailing text` — is one step late.
# The code predictor's part of a frame is `pipeline.loop.CodePredictor.frame`:

# %%
print(inspect.getsource(CodePredictor.frame))

# %% [markdown]
# The loop (`pipeline.loop.Loop`) holds only the graphs. Everything one utterance carries from frame to frame, its
# prompt, its `Sampler`, the talker's `KvCache` (chapter 05), the last hidden state and the codes so far, lives in
# its `Sequence`: `start` prefills the prompt, and each `step` makes one frame, or ends the sequence on EOS or at its
# frame cap. `frames` is the same loop as a generator; `synthesize`, `stream`, the server and long texts all consume
# it.

# %%
print(inspect.getsource(Loop.step))

# %% [markdown]
# The runtime counts **frames**; the reference counts codebook-0 tokens (HF's `max_new_tokens`). The reference
# completes a frame in the forward call after its token, and the last token never gets one, so its 45 new tokens
# are at most 44 frames: the runtime's `max_frames` is `max_new_tokens - 1`. `loop.run` takes a sequence to its
# end; `Result.of` gathers it as `synthesize` reports it. Greedy, for the greedy golden:

# %%
greedy = Sampling(greedy=True)
frames = inputs.GOLDEN_MAX_NEW_TOKENS - 1
t0 = time.perf_counter()
seq = synth.loop.run(prompt, Sampler(greedy, synth.config.talker), frames)
seconds = time.perf_counter() - t0
result = Result.of(seq, synth.config.groups)
codes = result.codes
print(f"{len(codes)} frames in {seconds:.2f} s "
      f"(talker {result.seconds['talker']:.2f} s, code predictor {result.seconds['predictor']:.2f} s)")
check.tokens_equal("all codes = golden (greedy, fp32)", codes, golden["codes"])
check.equal("EOS step = golden", "eos_step", result.eos_step, int(golden["eos_step"]))
check.tokens_equal(f"codebook-0 tokens = the golden's first {frames} (its last has no frame)",
                   np.array(result.tokens), golden["talker_sequences"][:frames])

# %%
agree = (codes == golden["codes"]).sum(1) if codes.shape == golden["codes"].shape else np.zeros(len(golden["codes"]))
fig, ax = plt.subplots(figsize=(9, 2.6))
ax.bar(range(len(agree)), agree, color=np.where(agree == 16, "tab:green", "crimson"))
ax.set_ylim(0, 16.5)
ax.set_xlabel("frame")
ax.set_ylabel("codes equal (of 16)")
ax.set_title(f"ncnn runtime vs PyTorch golden, per frame ({ckpt})");

# %% [markdown]
# The early-stop golden uses an EOS id that the greedy path emits mid-run, so the loop's stop branch runs too. The
# stop id is the sampler's (`eos_token_id`, as generate(eos_token_id=...) sets it):

# %%
early_sampler = Sampler(greedy, synth.config.talker, eos_token_id=int(early["eos_id"]))
early_result = Result.of(synth.loop.run(prompt, early_sampler, frames), synth.config.groups)
print(f"eos id {int(early['eos_id'])}: stopped after {len(early_result.codes)} frames at step {early_result.eos_step}")
check.equal("early stop: EOS step = golden", "eos_step", early_result.eos_step, int(early["eos_step"]))
check.tokens_equal("early stop: codes = golden", early_result.codes, early["codes"])

# %% [markdown]
# ## 5. Decode the codes the way the reference does
# The reference decodes through `chunked_decode`: chunks of 300 frames, each with 25 frames of left context that are
# decoded and then dropped. The first chunk equals a one-shot decode, later ones do not (25 frames of context is far
# less than the transformer's reach), so a port that decodes in one shot disagrees with the reference on long outputs.

# %%
wav = synth.codec.decode(codes)
check.snr("waveform vs golden", wav, golden["wav"], 60.0)
out = save_wav(paths.outputs_dir(ckpt) / "06_ncnn.wav", wav)
display(Audio(wav, rate=SAMPLE_RATE))
plots.waveform({"PyTorch golden": golden["wav"], "ncnn runtime": wav});

# %%
T = 340  # past one chunk
long_codes = np.random.default_rng(3).integers(0, 2048, size=(T, 16))
with torch.inference_mode():
    ref_long = tts.model.speech_tokenizer.decode([{"audio_codes": torch.from_numpy(long_codes)}])[0][0]
ours_long = synth.codec.decode(long_codes)
one_shot = synth.codec.decode_once(long_codes)
tail = slice(300 * SAMPLES_PER_FRAME, None)
print(f"frames 300..{T}: chunked vs reference {check.snr_db(ours_long[tail], ref_long[tail]):.1f} dB, "
      f"one-shot vs reference {check.snr_db(one_shot[tail], ref_long[tail]):.1f} dB")
check.snr(f"chunked decode of {T} frames vs reference", ours_long, ref_long, 60.0)

# %% [markdown]
# Everything so far is what one call does, `Synthesizer.synthesize(text, language, voice, sampling, max_frames)`:
# prompt, loop, decode. It is the product's only pipeline; the CLI below runs exactly it.

# %%
product = synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, sampling=greedy, max_frames=frames)
check.tokens_equal("synthesize(): codes = golden", product.codes, golden["codes"])
check.snr("synthesize(): waveform vs golden", product.wav, golden["wav"], 60.0)

# %% [markdown]
# Without `sampling=`, `synthesize` samples with the checkpoint's defaults (`synth.sampling`, the reference's
# `generate_config`), as `qtts say` and `qtts serve` do. Each sequence draws from its own random stream, seeded by
# `Sampling.seed`: the same seed repeats its codes exactly, another seed gives others (not the reference's:
# numpy's random stream is not torch's, so sampled runs are compared by seed, never with a golden).

# %%
check.equal("runtime's default sampling = the reference's generate_config", "equal", synth.sampling == defaults, True)
say = lambda **kw: synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, max_frames=20, **kw).codes
runs = [say(), say(), say(sampling=synth.sampling.replace(seed=1))]  # (20, 16) each, or fewer on EOS
same = lambda a, b: a.shape == b.shape and bool((a == b).all())
check.equal("sampled, seed 0 twice: the same codes", "equal", same(runs[0], runs[1]), True)
check.equal("sampled, seed 0 vs seed 1: other codes", "equal", same(runs[0], runs[2]), False)
check.equal("sampled vs greedy: other codes", "equal", same(runs[0], product.codes[: len(runs[0])]), False)

# %% [markdown]
# ## 6. The runtime imports no torch, and the CLI
# `qtts_lib.runtime` is the deployable product. The CLI runs it in a fresh process in which importing torch,
# transformers or qwen_tts raises — the same guard `tests/test_runtime_imports.py` uses. Like `synthesize`, `qtts say`
# samples by default; `--greedy` asks for the parity path.

# %%
cli_out = paths.outputs_dir(ckpt) / "06_cli.wav"
cli_voice = {"base": ["--voice", str(paths.voice_wav())], "custom_voice": ["--speaker", voice_args.get("speaker")],
             "voice_design": ["--instruct", voice_args.get("instruct")]}[synth.kind]
run = qtts_without_torch("say", "--checkpoint", str(model_dir), "--text", inputs.TARGET_TEXT,
                         "--language", inputs.LANGUAGE, "--greedy", "--max-frames", "20", "-o", str(cli_out),
                         "--threads", str(THREADS), *cli_voice)
print(run.stdout, run.stderr[-600:])
check.equal("qtts say with torch blocked", "exit status", run.returncode, 0)

# %% [markdown]
# Bad input ends in one clear line and a non-zero exit status, never a traceback from inside ncnn:

# %%
for label, extra in [("empty text", ["--text", "   "]),
                     ("unknown language", ["--text", "hi", "--language", "klingon"])]:
    args = ["say", "--checkpoint", str(model_dir), "-o", str(cli_out), "--language", "english"] + cli_voice + extra
    r = qtts_without_torch(*args)
    print(f"{label}: exit {r.returncode}: {r.stderr.strip()}")
    check.equal(f"CLI refuses {label}", "exit status", r.returncode, 2)

# %% [markdown]
# ## Summary
# - A pure-Python BPE (hand-written pre-tokenizer scanner), a numpy sampler in HF's processor order and the
#   generation loop over the cached ncnn graphs reproduce the reference: every code of the golden run, the EOS step,
#   and the waveform (SNR well above 60 dB).
# - The loop's semantics: dual-track prompt, trailing text one position per frame, MTP with table *s−1* / head *s*,
#   frames assembled one step late, EOS checked on codebook 0 only; one generator over per-sequence state
#   (`pipeline.loop`: a `Sequence` holds its prompt, `Sampler` and `KvCache`), counting frames: `max_frames` is the
#   reference's `max_new_tokens - 1`.
# - Sampling is one `Sampling` object, by default the checkpoint's (it samples, seeded per sequence); parity with
#   the goldens passes `Sampling(greedy=True)`.
# - Decode in the reference's chunks (300 + 25 left context) or long outputs differ from the reference.
# - `qtts say` runs the whole thing with torch unimportable.
#
# **Artifacts left:** `data/outputs/<ckpt>/06_ncnn.wav`, `06_cli.wav`, the chapter report.
#
# **If your numbers differ**
# - *Codes diverge at frame 0, codebook ≥ 1* → the MTP table/head offset (table *s−1*, head *s*).
# - *Codes diverge after the text runs out* → trailing text index (it starts at 0 on the first step)
#   or the `tts_pad` fallback.
# - *Diverge at step 0 or 1 only* → EOS masking by `min_new_tokens` (−inf, not "resample").
# - *`synthesize()` differs from the golden at frame 0 while the loop matches* → no `sampling=Sampling(greedy=True)`:
#   the default samples.
# - *One frame more or fewer than the golden* → `max_new_tokens` passed as `max_frames` (frames = tokens − 1).
# - *Waveform fine for 300 frames, then ~60 dB* → one-shot decode instead of the reference's chunks.

# %%
check.table()
