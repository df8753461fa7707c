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
# %% [markdown]
# # 06 · Tokenize the text and sample the codes
# > A byte-level BPE tokenizer and a numpy sampler, each held to the reference's.
#
# **You will:** check a pure-Python BPE tokenizer (`text.bpe`) against the reference pipeline's tokenizer; check a
# numpy sampler that processes logits in Hugging Face's order (`pipeline.sampling`).
#
# **You will learn:** how Qwen2's byte-level BPE turns text into ids; the order in which the reference processes
# the talker's logits and why it matters; that a checkpoint samples unless told to be greedy.
#
# **You need:** `data/golden/<ckpt>/` (chapter 03: `xvec_greedy`).
# **Leaves behind:** the report.

# %%
import inspect

import numpy as np
import torch

from qtts_lib import artifacts, check, checkpoint, inputs, paths, reference, settings
from qtts_lib.golden import mode_of
from qtts_lib.runtime.pipeline import sampling
from qtts_lib.runtime.pipeline.sampling import SamplerConfig, Sampling
from qtts_lib.runtime.text import bpe

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("06_tokenize_and_sample", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)  # the reference, for its tokenizer and logits processors
golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode_of(tts)}_greedy.npz", ckpt)

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
# `pipeline.sampling` has three objects: `Sampling`, what a user chooses (greedy, temperature, top-k, top-p,
# repetition penalty, seed); `SamplerConfig`, what one of the reference's two generate() calls does to its logits
# (the talker's, the code predictor's); `Sampler`, both configs and one sequence's random stream. The processors:

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
from transformers.generation import logits_process as lp

hf = lp.LogitsProcessorList([lp.RepetitionPenaltyLogitsProcessor(talker_sc.repetition_penalty),
                             lp.MinNewTokensLengthLogitsProcessor(0, talker_sc.min_new_tokens, talker_sc.eos_id),
                             lp.SuppressTokensLogitsProcessor(list(talker_sc.suppress_ids))])
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
# ## Summary
# - A pure-Python BPE reproduces the reference tokenizer on the prompt and on a committed multilingual corpus.
# - The talker's logits are processed in Hugging Face's order: repetition penalty, the EOS masks, the suppressed
#   control range, then (when sampling) temperature, top-k, top-p; the code predictor gets none of the first three.
# - A checkpoint samples by default; parity with a greedy golden passes `Sampling(greedy=True)`.
#
# **Artifacts left:** the chapter report.
#
# **If your numbers differ**
# - *A line of the corpus tokenizes differently* → the pre-tokenizer (contractions, digits, whitespace runs) or NFC.
# - *Processed logits differ at the EOS id only* → the min-new-tokens mask (−inf at steps 0 and 1).

# %%
check.table()
