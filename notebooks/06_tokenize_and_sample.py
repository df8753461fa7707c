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
# # 06 · Tokenize the text and sample the codes
# > Text becomes ids by byte-level BPE; the talker's scores become codes through a chain of processors.
#
# **You will:** write Qwen2's text tokenizer in steps (pre-tokenizer, byte map, merge loop) and the **logits
# processors** (functions that edit the talker's scores before a code is picked); check both against the reference.
#
# **You will learn:** how byte-level BPE turns any text into ids; which word-splitting regex the reference runs; the
# processors' order; that `min_new_tokens` hides EOS at first (no second draw); that a checkpoint samples by default.
#
# **You need:** the checkpoint (chapter 00) and `data/golden/<ckpt>/` (chapter 03: its greedy golden).
# **Leaves behind:** `data/reports/<ckpt>/06_tokenize_and_sample.json`.

# %%
import torch

from qtts_lib import check, checkpoint, reference, settings

ckpt = settings.checkpoint()          # QTTS_CHECKPOINT, default tiny-base
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("06_tokenize_and_sample", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)  # for its tokenizer and its processors
theirs = tts.processor.tokenizer                  # the reference's tokenizer

# %% [markdown]
# ## 1. Split the text into words
# The talker reads **token ids**, integers that index its text embedding table. Qwen2's tokenizer is a **byte-level
# BPE** (byte-pair encoding): it starts from the text's UTF-8 bytes, so any string has a spelling, and repeatedly
# glues adjacent pieces together following a learned list of pairs, word by word. A **pre-tokenizer** first cuts the
# text into words: a regex split (each match one word), then section 2's byte map. The regex is not Qwen2's: qwen-tts
# loads its tokenizer with `fix_mistral_regex=True`, a transformers option (written for Mistral's tokenizers) that
# swaps Qwen2's pattern (with contraction rules, `'s|'t|'re|...`) for this one, read from the reference's tokenizer:

# %%
import json

import regex  # the `regex` package: Python's `re` has no \p{L} (any letter) classes

spec = json.loads(theirs.backend_tokenizer.to_str())["pre_tokenizer"]
source = spec["pretokenizers"][0]["pattern"]["Regex"]
PATTERN = regex.compile(source)
print(*source.split("|"), sep="\n")  # one alternative a line; the first match wins


def pretokenize(text: str) -> list[str]:
    """Text -> words, in order, covering every character (each match one word)."""
    return PATTERN.findall(text)

# %% [markdown]
# Letter runs split at case changes (`\p{Lu}` upper, `\p{Ll}` lower case), one non-letter may ride in front of a
# word (the space of " from", the apostrophe of "'T"), digits go one a word, and a whitespace run leaves its last
# space to the next word. The library's `text.bpe.pretokenize` does the same with a hand-written scanner and no
# regex engine (the form a C port follows). On the chapter's strings they agree:

# %%
from qtts_lib import inputs
from qtts_lib.runtime.text import bpe

strings = [inputs.TARGET_TEXT, "DON'T SHOUT, I'm fine!", "camelCaseVariable x2 = 1234;",
           "  two  spaces\n\nand lines", "café 東京 😀"]
for s in strings:
    print(pretokenize(s))
scanned = [bpe.pretokenize(s) for s in strings]
check.equal("pre-tokenizer regex = library scanner (chapter strings)", "equal",
            [pretokenize(s) for s in strings] == scanned, True)

# %% [markdown]
# ## 2. Map bytes to printable characters
# "Byte-level": the alphabet is the 256 byte values; the token files are text, so GPT-2's table gives each a printable
# character: the 188 printable Latin-1 bytes map to themselves, the other 68 to `U+0100` onwards (a space becomes
# `Ġ`, a newline `Ċ`), one character per UTF-8 byte ("é" is two). The reference's `pre_tokenize_str` splits and maps:

# %%
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> character table."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


BYTE_TO_CHAR = bytes_to_unicode()
as_chars = lambda w: "".join(BYTE_TO_CHAR[b] for b in w.encode("utf-8"))  # noqa: E731
print([as_chars(w) for w in pretokenize("café 東京 😀")])
words = [[as_chars(w) for w in pretokenize(s)] for s in strings]
ref_words = [[w for w, _ in theirs.backend_tokenizer.pre_tokenizer.pre_tokenize_str(s)]
             for s in strings]
check.equal("byte-level words = reference pre-tokenizer (chapter strings)", "equal",
            words == ref_words, True)

# %% [markdown]
# ## 3. Merge by rank
# The **merges** (`merges.txt`) are the pairs BPE learned, one a line; a pair's **rank** is its line number, lower
# merging first. The loop finds a word's adjacent pair of lowest rank, joins it everywhere left to right, and
# repeats until no pair is listed. The pieces left are **tokens**, looked up in `vocab.json`:

# %%
vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
lines = (model_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
ranks = {tuple(ln.split()): r for r, ln in enumerate(lines[1:])}  # line 0: "#version"
print(f"{len(vocab)} tokens, {len(ranks)} merges; the first three: {lines[1:4]}")


def bpe_merge(word: str, ranks: dict, trace: list | None = None) -> list[str]:
    """A byte-level word -> its tokens: merge lowest-ranked pairs while any is left."""
    symbols = list(word)
    while len(symbols) > 1:
        best = min(zip(symbols, symbols[1:]), key=lambda p: ranks.get(p, len(ranks)))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(symbols):
            if tuple(symbols[i:i + 2]) == best:
                merged, i = merged + [best[0] + best[1]], i + 2
            else:
                merged, i = merged + [symbols[i]], i + 1
        symbols = merged
        if trace is not None:
            trace.append(f"rank {ranks[best]:>6} {best}: {symbols}")
    return symbols

# %% [markdown]
# The word " ncnn" of `inputs.TARGET_TEXT` (the sentence every chapter speaks), merge by merge (`Ġ`: its space):

# %%
trace: list[str] = []
print(bpe_merge(as_chars(" ncnn"), ranks, trace))
print(*trace, sep="\n")

# %% [markdown]
# ## 4. Encode, and hold it to the library and the reference
# Two steps come first. **Added tokens** (`<|im_start|>`, `<tts_pad>`, ... in `tokenizer_config.json`) are cut out
# of the raw text, leftmost and longest first, one id each. The text between them is NFC-normalized (Unicode's
# canonical composition: "e" + combining acute becomes "é"). Then each word is mapped and merged:

# %%
import unicodedata

added_spec = json.loads((model_dir / "tokenizer_config.json").read_text())
added = {t["content"]: int(i) for i, t in added_spec["added_tokens_decoder"].items()}
longest_first = sorted(added, key=len, reverse=True)
ADDED = regex.compile("(" + "|".join(map(regex.escape, longest_first)) + ")")
nfc = lambda s: unicodedata.normalize("NFC", s)  # noqa: E731


def encode(text: str, normalize=nfc) -> list[int]:
    ids: list[int] = []
    for n, piece in enumerate(ADDED.split(text)):  # odd pieces are the added tokens
        if n % 2:
            ids.append(added[piece])
            continue
        for word in pretokenize(normalize(piece)):
            ids += [vocab[token] for token in bpe_merge(as_chars(word), ranks)]
    return ids

# %% [markdown]
# The library's `Tokenizer.from_dir` reads the same three files. The talker's text is a chat turn (Qwen's template:
# `<|im_start|>assistant\n`, the text, `<|im_end|>\n`, then the next turn opened); on it and on the chapter's strings
# the cells, the library and the reference give the same ids:

# %%
ours = bpe.Tokenizer.from_dir(model_dir)
prompt_text = (f"<|im_start|>assistant\n{inputs.TARGET_TEXT}<|im_end|>\n"
               "<|im_start|>assistant\n")
strings.append(prompt_text)
print(encode(prompt_text))
cells = [encode(s) for s in strings]
check.equal("cells' BPE = library tokenizer (chapter strings)", "equal",
            cells == [ours.encode(s) for s in strings], True)
check.equal("cells' BPE = reference tokenizer (chapter strings)", "equal",
            cells == [theirs(s)["input_ids"] for s in strings], True)
check.equal("prompt ids = reference tokenizer", "equal",
            ours.encode(prompt_text) == theirs(prompt_text)["input_ids"], True)

# %% [markdown]
# A committed corpus pushes harder (caseless scripts, marks, emoji, contractions, digit and whitespace runs, added
# tokens inside words); the library matches it line for line. The cells miss the lines printed: the reference's NFC
# knows only Unicode 9.0 and leaves alone marks that Python's composes. With the library's `bpe.nfc` they match too:

# %%
from qtts_lib import paths

corpus = (paths.INPUTS / "tokenizer_corpus.txt").read_text("utf-8").splitlines()
bad = [line for line in corpus if ours.encode(line) != theirs(line)["input_ids"]]
check.equal(f"committed corpus ({len(corpus)} lines: CJK, kana, hangul, emoji, "
            "contractions, digits, spaces, specials)", "mismatched lines", len(bad), 0)
refs = [theirs(line)["input_ids"] for line in corpus]
print("cells, Python's NFC, miss:", [c for c, r in zip(corpus, refs) if encode(c) != r])
missed = sum(encode(c, bpe.nfc) != r for c, r in zip(corpus, refs))
check.equal("cells' BPE with the library's NFC = reference (committed corpus)",
            "mismatched lines", missed, 0)

# %% [markdown]
# ## 5. Process the talker's scores: penalty, EOS mask, suppression
# Each generation step, the talker's output layer (`codec_head`) gives **logits**: one raw score per id of its
# vocabulary (codebook 0's 2048 codes, then control ids), which softmax turns into probabilities. Before picking, the
# reference runs Hugging Face's logits processors in a fixed order. The first three always run:
# - the **repetition penalty** (1.05, `generation_config.json`): each id already generated in this sequence becomes
#   less likely, once however often it occurred: a positive score divided by it, a negative one multiplied;
# - the **EOS mask**: EOS, the codec id that ends the speech, gets `-inf` (probability 0) while fewer than
#   `min_new_tokens` codes exist (the reference's `generate` sets it to 2 for the talker: the cell reads its source);
# - **suppression**: the last 1024 ids, the control range, get `-inf` at every step, EOS spared.

# %%
import inspect

import numpy as np

NEG_INF = np.float32(-np.inf)  # the first two processors here; suppression in section 7


def penalize(x: np.ndarray, generated: list[int], penalty: float) -> np.ndarray:
    ids = np.unique(np.asarray(generated, np.int64))
    s, p = x[ids], np.float32(penalty)
    x[ids] = np.where(s < 0, s * p, s / p)
    return x


def mask_eos(x: np.ndarray, step: int, eos_id: int, min_new_tokens: int) -> np.ndarray:
    if step < min_new_tokens:
        x[eos_id] = NEG_INF
    return x


source = inspect.getsource(type(tts.model).generate)
check.equal("qwen_tts generate sets min_new_tokens=2", "found in source",
            '"min_new_tokens": 2' in source, True)

# %% [markdown]
# ## 6. `min_new_tokens` masks EOS, it does not resample
# HF's processor sets the EOS logit to `-inf` for the first two new tokens, before the argmax or the draw, so the
# runner-up wins; a port that draws, sees EOS and draws again samples another distribution. HF's and `mask_eos`,
# on random logits with EOS on top, for new tokens 0, 1, 2 (HF counts them past the prompt, 12 ids here):

# %%
from transformers.generation import logits_process as lp

talker_cfg = tts.model.talker.config
eos, prompt_len = talker_cfg.codec_eos_token_id, 12
g = torch.Generator().manual_seed(0)
logits = torch.randn(1, talker_cfg.vocab_size, generator=g)
logits[0, eos] = logits.max() + 3.0
runner_up = int(torch.topk(logits[0], 2).indices[1])
proc = lp.MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=prompt_len,
                                            min_new_tokens=2, eos_token_id=eos)
for new in range(3):
    out = proc(torch.zeros(1, prompt_len + new, dtype=torch.long), logits.clone())
    mine = mask_eos(logits[0].numpy().copy(), new, eos, 2)
    print(f"new token {new}: eos logit {out[0, eos].item():>8.3f}  "
          f"argmax {int(out.argmax())}  (mask_eos: {int(mine.argmax())})")
    if new < 2:
        check.equal(f"step {new}: eos logit masked to -inf", "logit",
                    float(out[0, eos]), float("-inf"))
        check.equal(f"step {new}: argmax is the runner-up", "token",
                    int(out.argmax()), runner_up)
    else:
        check.equal("step 2: eos allowed again", "token", int(out.argmax()), eos)

# %% [markdown]
# ## 7. Warp the scores when sampling: temperature, top-k, top-p
# **Greedy** decoding takes the argmax of the processed scores. **Sampling** draws an id from their softmax after
# three more processors (HF's warpers): **temperature** divides the scores (below 1 sharpens the distribution);
# **top-k** keeps the k highest scores (ties with the k-th too); **top-p** keeps the fewest most likely ids whose
# probabilities add up to p, dropping the low tail whose cumulative probability is at most 1 - p.

# %%
def top_k(x: np.ndarray, k: int) -> np.ndarray:
    return np.where(x < np.sort(x)[-k], NEG_INF, x)


def top_p(x: np.ndarray, p: float) -> np.ndarray:
    order = np.argsort(x, kind="stable")  # ascending: the low tail first
    e = np.exp(x[order] - x.max())
    drop = np.cumsum(e / e.sum()) <= 1 - p
    drop[-1] = False  # the top id always survives
    x[order[drop]] = NEG_INF
    return x

# %% [markdown]
# In `pipeline.sampling`, a `Sampling` is what a user chooses (greedy, temperature, top-k, top-p, penalty, seed; its
# `subtalker_*` fields, the code predictor's), a `SamplerConfig` what one sampler applies: `.talker` (all the above)
# or `.subtalker` (no penalty, EOS or suppression). `process` is the whole chain in HF's order:

# %%
from qtts_lib.runtime.pipeline.sampling import SamplerConfig


def process(logits: np.ndarray, generated: list[int], step: int,
            sc: SamplerConfig) -> np.ndarray:
    x = np.array(logits, np.float32)  # a copy, as HF clones the logits
    if sc.repetition_penalty != 1.0:
        x = penalize(x, generated, sc.repetition_penalty)
    if sc.eos_id is not None:
        x = mask_eos(x, step, sc.eos_id, sc.min_new_tokens)
    x[list(sc.suppress_ids)] = NEG_INF
    if not sc.do_sample:
        return x  # HF builds the warpers only when sampling
    x = x / np.float32(sc.temperature)
    x = top_k(x, sc.top_k) if sc.top_k else x
    return top_p(x, sc.top_p) if sc.top_p < 1.0 else x

# %% [markdown]
# ## 8. Hold the processors to Hugging Face's and the library's
# A checkpoint's defaults (its `generation_config.json`, read by `Sampling.from_generation_config`) **sample**:
# parity with a greedy golden needs `greedy=True` on top. The golden (`mode_of` names its file) gives step 6's
# logits, past the EOS mask, and the 6 codes before as the penalty's history; HF's list is the reference's:

# %%
from qtts_lib import artifacts
from qtts_lib.golden import mode_of
from qtts_lib.runtime.pipeline.sampling import Sampling

cfg = checkpoint.load_config(ckpt)
golden_npz = paths.golden_dir(ckpt) / f"{mode_of(tts)}_greedy.npz"
golden, _ = artifacts.load_npz(golden_npz, ckpt)
defaults = Sampling.from_generation_config(tts.model.generate_config)
print(defaults)
hist, logits = list(golden["talker_sequences"][:6]), golden["logits"][6]


def hf_scores(sc: SamplerConfig) -> np.ndarray:
    hf = [lp.RepetitionPenaltyLogitsProcessor(sc.repetition_penalty),
          lp.MinNewTokensLengthLogitsProcessor(0, sc.min_new_tokens, sc.eos_id),
          lp.SuppressTokensLogitsProcessor(list(sc.suppress_ids))]
    if sc.do_sample:
        hf += [lp.TemperatureLogitsWarper(sc.temperature)]
        hf += [lp.TopKLogitsWarper(sc.top_k)] if sc.top_k else []
        hf += [lp.TopPLogitsWarper(sc.top_p)]
    x = torch.from_numpy(logits)[None].clone()
    return lp.LogitsProcessorList(hf)(torch.tensor([hist]), x)[0].numpy()

# %% [markdown]
# Greedy first: `sampling.sample(logits, generated, step, config, rng)` (process, then the argmax or, sampling, a
# draw) must give the golden's code. Three sampled settings then meet HF's `-inf` positions and the library's
# `sampling.process` (`nan_to_num` makes `-inf` finite, so that the values compare):

# %%
from qtts_lib.runtime.pipeline import sampling

talker_sc = SamplerConfig.talker(defaults.replace(greedy=True), cfg)
ref_scores, ours_scores = hf_scores(talker_sc), process(logits, hist, 6, talker_sc)
finite = np.isfinite(ref_scores)
check.equal("same -inf positions as HF (suppressed range)", "equal",
            bool((np.isfinite(ours_scores) == finite).all()), True)
check.close("processed talker logits = HF processors (step 6 of the golden)",
            ours_scores[finite], ref_scores[finite], max_abs=1e-6)
check.equal("greedy token = golden token at step 6", "token",
            sampling.sample(logits, hist, 6, talker_sc, np.random.default_rng(0)),
            int(golden["talker_sequences"][6]))
settings_ = {"defaults": defaults, "top-p 0.8": defaults.replace(top_k=0, top_p=0.8),
             "top-k 50, top-p 0.9": defaults.replace(top_p=0.9)}
for label, s in settings_.items():
    sc = SamplerConfig.talker(s, cfg)
    x, ref = process(logits, hist, 6, sc), hf_scores(sc)
    print(f"{label}: {np.isfinite(x).sum()} ids left of {x.size}")
    check.equal(f"cells' processors: -inf positions = HF ({label})", "equal",
                bool((np.isfinite(x) == np.isfinite(ref)).all()), True)
    check.close(f"cells' processors = library's process ({label})",
                np.nan_to_num(x), np.nan_to_num(sampling.process(logits, hist, 6, sc)),
                max_abs=1e-6)

# %% [markdown]
# To draw, the library's softmax sums in torch's float32 order (so top-p cuts where HF does) and `draw` picks one id
# with numpy's random Generator: repeatable for a seed, but not torch's random stream. Chapter 07 drives it.
#
# ## Summary
# - Byte-level BPE: cut out added tokens, NFC (Unicode 9.0's, as the reference), split into words with the regex
#   `fix_mistral_regex=True` installs, map each UTF-8 byte to a character, merge pairs by rank, look tokens up.
# - The talker's scores go through HF's order: repetition penalty, the EOS masks, the suppressed control range, then
#   (when sampling) temperature, top-k, top-p; the code predictor gets none of the first three.
# - `min_new_tokens` is an EOS mask (`-inf`) before the argmax or the draw, not a second draw. A checkpoint samples
#   by default; parity with a greedy golden passes `Sampling(greedy=True)`.
#
# **Artifacts left:** the chapter report.
#
# **If your numbers differ**
# - *A corpus line tokenizes differently* → the pre-tokenizer (case, digits, whitespace), the byte map, or NFC.
# - *Ids differ around `<|im_end|>`* → added tokens not cut out first, or not longest first.
# - *Processed logits differ at the EOS id only* → the min-new-tokens mask (`-inf` at steps 0, 1).
# - *Processed logits differ at ids already generated* → the penalty applied per occurrence, or after temperature.

# %%
check.table()
