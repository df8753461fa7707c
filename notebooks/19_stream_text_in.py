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
# # 19 · Stream text in
# > A language model writes its answer a token at a time; speak it as it comes, and still give the whole text's
# > audio, sample for sample.
#
# **You will:** speak a text that arrives in pieces, as a language model writes it; decide segments and tokens from
# the text so far; get its first audio before most of the text has come, and the whole text's audio in the end.
#
# **You will learn:** why an x-vector prompt can start before its text is complete; which rule of the segmenter
# waits for what; why tokenizing each piece on its own gives other tokens; why the audio is the whole text's.
#
# **You need:** a Base checkpoint (an x-vector voice, chapter 08), the exported graphs (chapters 04–05; made here if
# missing). **Leaves behind:** `data/outputs/<ckpt>/19_streamed.wav`, the chapter report. Chapter 20 sends the same
# text to `qtts serve` over a WebSocket.

# %%
import random

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Audio, display

from qtts_lib import check, checkpoint, export, inputs, paths, reference, settings
from qtts_lib.inputs import words  # `text` in deltas of n words, as a model writes
from qtts_lib.runtime import InputError, Sampling, Synthesizer, load_wav
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, save_wav
from qtts_lib.runtime.pipeline import longform
from qtts_lib.runtime.pipeline.longform import MAX_SEGMENT_TOKENS
from qtts_lib.runtime.pipeline.textstream import TextStream, stream_text
from qtts_lib.runtime.text import segment_stream
from qtts_lib.runtime.text.bpe_stream import TokenStream
from qtts_lib.runtime.text.segment import segments

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("19_stream_text_in", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
check.equal("a Base checkpoint: voices cloned from a clip (x-vector)", "kind",
            synth.kind, "base")
voice = synth.voice(wav=load_wav(paths.voice_wav()))  # the committed clip's x-vector
builder = synth.prompts  # the PromptBuilder behind synth.prompt (chapter 07)
tok, count = synth.tokenizer, builder.text_tokens  # count: a text's BPE tokens
MAX_FRAMES, SEED = 24, 7  # a small frame cap per segment keeps random weights short

# %% [markdown]
# ## 1. Speak an answer while it is written
# A voice agent is a language model with a mouth, writing its answer token by token over seconds; a server that wants
# the whole `input` first ("fake streaming": audio out, text not in) keeps the listener waiting for the last word.
# `pipeline.textstream.stream_text` takes the text as an iterable of pieces (**deltas**) and yields audio as made,
# taking a delta only when it has nothing else to do: as late as it can. An answer, a word a delta, and the deltas taken
# by the first audio:

# %%
TEXT = inputs.ANSWER_TEXT  # a language model's answer (`qtts_lib.inputs`)
print(TEXT)


def noted(deltas: list[str], taken: list[str]):  # yields each delta, noting it in taken
    for delta in deltas:
        taken.append(delta)
        yield delta


FIRST = "Sure, here is the plan for tomorrow."  # the first sentence
deltas, taken = words(TEXT), []
audio = stream_text(synth, noted(deltas, taken), "english", voice, Sampling(seed=SEED),
                    max_frames=MAX_FRAMES)
first = next(audio)  # the stream runs, taking deltas, until its first audio
at = len(taken)  # the deltas taken by then
print(f"first audio after {at} of {len(deltas)} deltas ({at / len(deltas):.0%}): "
      f"{''.join(taken)!r}")
streamed = np.concatenate([first, *audio])  # the rest, as the text keeps coming
check.at_most("first audio once the first sentence and the word after it are in",
              "deltas taken", at, len(words(FIRST)) + 1)

# %% [markdown]
# The bound is the first sentence's words plus one: audio came once the word after the first sentence decided that
# the sentence ends there. Sections 2–5 take this apart.
#
# ## 2. Read the text a token a frame
# Chapter 07 built the x-vector clone's prompt: the first text token rides on `codec_bos` in the prompt, and the
# rest of the text, then `tts_eos`, is the **trailing text**, one row added to the talker's input per frame, then
# `tts_pad` for ever. So the input that makes frame t holds text token t (frame 0's in the prompt, frame t's in
# the row added after frame t-1), and no later one. One sentence's rows, frame by frame:

# %%
ids = tok.encode(FIRST, added_tokens=False)
prompt = synth.prompt(FIRST, "english", voice)  # PromptBuilder.build's prompt
e, top = synth.embeddings, synth.config.config
eos = e.text([top["tts_eos_token_id"]])
check.equal("x-vector prompt: trailing text = tokens 1.. then tts_eos", "bitwise equal",
            np.array_equal(prompt.trailing, np.vstack([e.text(ids[1:]), eos])), True)
reads = [tok.decode([i]) for i in ids] + ["tts_eos", "tts_pad", "tts_pad"]
display(pd.DataFrame({"text token it reads": reads, "text token": [*range(len(ids)),
                      "-", "-", "-"]}).rename_axis("frame").T)

# %% [markdown]
# So the prompt need not wait for the text: `PromptBuilder.open_prompt` builds it from the first tokens known,
# `extend_prompt` appends rows as tokens come. `Prompt.text_at(t)` is the row added after frame t, text token t+1 (the
# one frame t+1 reads), and None while that token has not come: the talker waits there. Completed (`last=True` adds
# `tts_eos` and the chat template's end), the open prompt must be the one `PromptBuilder.build` makes from the whole
# sentence (what `synth.prompt` gave above), to the byte. Other prompts cannot be opened: ICL, a built-in speaker and
# a described voice hold a segment's whole text in the prefill (chapters 08–09), so `open_prompt` refuses them, and
# there a segment starts once its text is complete. The cell ends by trying chapter 08's ICL clone:

# %%
def waits_at(p) -> int:  # the first frame whose text token has not come
    return next(t + 1 for t in range(len(ids)) if p.text_at(t) is None)


opened = builder.open_prompt(ids[:3], "english", voice)  # 3 tokens known
first_waiting = [waits_at(opened)]
builder.extend_prompt(opened, ids[3:6], last=False)     # 3 more come
first_waiting.append(waits_at(opened))
builder.extend_prompt(opened, ids[6:], last=True)       # the rest: the text is complete
check.equal("open prompt: frame t waits for text token t", "first frame waiting, "
            "3 then 6 tokens in", first_waiting, [3, 6])
for part in ("embeds", "trailing", "text_ids"):  # extended token by token, then closed
    check.equal(f"open prompt's {part} = build()'s", "bitwise equal",
                np.array_equal(getattr(opened, part), getattr(prompt, part)), True)
check.equal("open prompt, completed: no longer open", "open", opened.open, False)
icl = synth.voice(wav=load_wav(paths.voice_wav()),  # ICL: codes and transcript
                  text=(paths.INPUTS / "voice.txt").read_text().strip())
try:
    builder.open_prompt(ids[:3], "english", icl)
    refused = "nothing"
except InputError as err:
    refused = type(err).__name__
check.equal("open_prompt refuses an ICL voice", "raised", refused, "InputError")

# %% [markdown]
# ## 3. Decide segments from the text so far
# Chapter 16 packed a long text's sentences into **segments** of at most `MAX_SEGMENT_TOKENS` tokens. Some rules read
# past a position: "3." ends a sentence or not by what follows (3.14?). `text.segment_stream.SegmentStream` takes deltas
# (`feed`) and gives out a segment once the text deciding it is in; its docstring lists what each rule waits for. Below
# it, for a few texts so far: `segment_stream.decided_until` (the first place where text still to come could change
# whether a sentence ends), what each waits for, and the shortest text after it that decides it. Each example's text
# that decides is typed beside it and checked: every shorter start of it leaves the text undecided, and it decides:

# %%
rows = [[c.strip() for c in line.strip()[1:-1].split(" | ")]
        for line in segment_stream.__doc__.splitlines() if line.startswith("| ")]
with pd.option_context("display.max_colwidth", 80):
    display(pd.DataFrame(rows[1:], columns=rows[0]).set_index(rows[0][0]))
examples = {  # text so far: (what it waits for, the shortest text after that decides)
    "It costs 3.": ("a next character, not a space (3.14: no end)", "1"),
    "It costs 3. Then": ("the word's end, the space after it (an ordinal?)", " "),
    "Ask Dr.": ("the whole next word, to the space after it", " Lee "),
    "Wait...": ("a character after the run and its spaces (...! goes on)", " a"),
    "Go! Now ": ("nothing: the word after it is in, to its space", ""),
}
until = segment_stream.decided_until


def decided_by(text: str, more: str) -> str | None:
    """The shortest start of `more` after which `text` is decided (None: none)."""
    return next((more[:k] for k in range(len(more) + 1)
                 if until(text + more[:k]) >= len(text)), None)


table = [{"text so far": t, "decided until": until(t), "of": len(t), "waits for": w,
          "decided by": repr(decided_by(t, m))} for t, (w, m) in examples.items()]
with pd.option_context("display.max_colwidth", 80):
    display(pd.DataFrame(table))
check.equal("each example waits for exactly the text typed beside it", "examples wrong",
            sum(decided_by(t, m) != m for t, (_, m) in examples.items()), 0)

# %% [markdown]
# Fed a word at a time, the segmenter gives a segment out once it is closed (the next sentence does not fit; `given`
# counts them); long before, `open_text` holds the decided start of the segment being filled: what section 1 spoke on.
# After `finish`, the segments given are `segment.segments` of the whole text, however cut; 200 random cuts hold it:

# %%
whole = segments(TEXT, MAX_SEGMENT_TOKENS, count)
segmenter, opened_at = segment_stream.SegmentStream(MAX_SEGMENT_TOKENS, count), None
for i, delta in enumerate(deltas, 1):
    for seg in segmenter.feed(delta):
        print(f"word {i} ({delta!r}) closes segment {segmenter.given}: {seg[:40]!r}...")
    if segmenter.open_text and opened_at is None:
        opened_at = i
        print(f"word {i} ({delta!r}) decides the open start {segmenter.open_text!r}")
print(f"finish gives {len(segmenter.finish())} more: {segmenter.given} of {len(whole)}")
check.equal("the first segment's start is decided when section 1 spoke", "word",
            opened_at, at)


def cuts(text: str, rng: random.Random, n: int) -> list[str]:
    """`text` cut at n random places (pieces of any length, mid-word too)."""
    places = sorted(rng.sample(range(1, len(text)), n))
    return [text[a:b] for a, b in zip([0, *places], [*places, len(text)])]


rng, wrong = random.Random(0), 0
for _ in range(200):
    segmenter = segment_stream.SegmentStream(MAX_SEGMENT_TOKENS, count)
    got = [s for p in cuts(TEXT, rng, rng.randint(1, 60)) for s in segmenter.feed(p)]
    got += segmenter.finish()
    wrong += got != whole
check.equal(f"SegmentStream over 200 random cuts = segments() of the whole text "
            f"({len(whole)} segments)", "cuts wrong", wrong, 0)

# %% [markdown]
# ## 4. Tokenize across deltas
# A segment's tokens must be the whole text's; tokenizing deltas apart does not give them: byte-level BPE (chapter 06)
# merges inside a word, and the **pre-tokenizer** (its word-splitting regex) reads past a word's end. A word cut in two
# becomes two words; a delta ending in a space leaves the space a word, which the whole text gives to the next word:

# %%
names = lambda token_ids: [tok.decode([i]) for i in token_ids]  # noqa: E731
encode = lambda text: tok.encode(text, added_tokens=False)  # noqa: E731
splits = [("Hello wor", "ld."), ("Hello ", "world."), ("New York", "ers")]
for a, b in splits:
    print(f"{a!r} + {b!r}: apart {names(encode(a) + encode(b))}, whole "
          f"{names(encode(a + b))}")
check.equal("deltas tokenized apart ≠ the whole text's tokens", "splits that agree",
            sum(encode(a) + encode(b) == encode(a + b) for a, b in splits), 0)

# %% [markdown]
# `text.bpe_stream.TokenStream` gives out the ids no later text can change, holding the rest (`pending`). NFC holds back
# a last character that a later accent may compose with; the pre-tokenizer holds back the last word when its run
# reaches the text's end ("wor" may go on) and a space at the end (it may start the next word); BPE holds back nothing
# more, as it merges inside one word. Cut at random, its ids must be the whole text's:

# %%
tokens = TokenStream(tok)
for piece in ["Hello wor", "ld. New York", "ers"]:
    print(f"feed {piece!r}: gives {names(tokens.feed(piece))}, "
          f"holds {tokens.pending!r}")
print("finish:", names(tokens.finish()))
rng, wrong, want = random.Random(1), 0, encode(TEXT)
for _ in range(200):
    tokens = TokenStream(tok)
    got = [i for p in cuts(TEXT, rng, rng.randint(1, 80)) for i in tokens.feed(p)]
    wrong += got + tokens.finish() != want
check.equal("TokenStream over 200 random cuts = encode() of the whole text",
            "cuts wrong", wrong, 0)

# %% [markdown]
# ## 5. Speak text that streams in
# `pipeline.textstream.TextStream` puts them together. Each closed segment joins the text's `longform.LongText`
# (the queue of segments behind chapter 16's `stream_long`: seeds, frame caps, fades, pauses); the segment being
# filled starts on its `open_text` as an open prompt, and each token `TokenStream` gives out extends it (`early=`, on
# by default for an x-vector voice, checked below; `early=False` waits for each segment's whole text); once closed,
# `tts_eos` follows and its frame cap is set. While the next frame's token has not come, the stream is `idle`. By
# hand four words a delta, section 1's `stream_text`, and `stream_text` over random cuts must each give
# `stream_long`'s audio, sample for sample:

# %%
spoken = longform.stream_long(synth, TEXT, "english", voice, Sampling(seed=SEED),
                              max_frames=MAX_FRAMES)  # the whole text's (chapter 16)
reference_wav = np.concatenate(list(spoken))
stream = TextStream(synth, "english", voice, Sampling(seed=SEED), max_frames=MAX_FRAMES)
check.equal("early= on by default for an x-vector voice", "early", stream.early, True)
chunks = []  # the audio, as the stream makes it
for delta in words(TEXT, 4):
    stream.feed(delta)
    while not stream.idle:  # what the text so far allows
        chunks += stream.step()
stream.finish()
while not stream.done:
    chunks += stream.step()
wav, spans, rng = np.concatenate(chunks), stream.spans, random.Random(2)
runs = {"TextStream, 4 words a delta": wav, "stream_text, a word a delta": streamed}
for k in (5, 40):
    runs[f"stream_text, {k} random cuts"] = np.concatenate(list(stream_text(
        synth, cuts(TEXT, rng, k), "english", voice, Sampling(seed=SEED),
        max_frames=MAX_FRAMES)))
for name, got in runs.items():
    check.equal(f"{name} = stream_long of the whole text", "bitwise equal",
                got.tobytes() == reference_wav.tobytes(), True)

# %% [markdown]
# As each segment's audio completes, the stream adds a `Span` (its text, its audio's start and end in seconds), a
# player's captions: one per segment, in order. The plot shades each span, its text above it; the pauses between
# spans are silent (random weights speak noise):

# %%
fig, ax = plt.subplots(figsize=(11, 2.5))
ax.plot(np.arange(len(wav)) / SAMPLE_RATE, wav, lw=0.3, color="0.3")
for i, s in enumerate(spans):
    ax.axvspan(s.start, s.end, color=f"C{i % 2}", alpha=0.2)
    ax.text((s.start + s.end) / 2, 1.03, s.text[:30] + "…", ha="center", fontsize=8,
            transform=ax.get_xaxis_transform())  # above the axes, in seconds
ax.set_xlabel("seconds")
plt.show()
check.equal("one span per segment, in order", "texts equal",
            [s.text for s in spans] == whole, True)
gaps = [wav[round(a.end * SAMPLE_RATE):round(b.start * SAMPLE_RATE)]
        for a, b in zip(spans, spans[1:])]
check.equal("the first span starts the audio", "start (s)", spans[0].start, 0)
check.at_most("the last span ends the audio", "|end - audio's length| (s)",
              abs(spans[-1].end - len(wav) / SAMPLE_RATE), 1e-6)
check.equal("pauses between spans silent", "loud gaps", sum(g.any() for g in gaps), 0)
save_wav(paths.outputs_dir(ckpt) / "19_streamed.wav", wav)
display(Audio(wav, rate=SAMPLE_RATE))

# %% [markdown]
# ## Summary
# - An x-vector prompt reads its text a token a frame (the trailing text), so a segment can start on its first
#   decided sentence and grow as tokens come (`open_prompt`, `extend_prompt`); the completed prompt is the one
#   `PromptBuilder.build` makes from the whole text.
# - `SegmentStream` gives a segment once the text that decides it is in (each rule waits for what it reads);
#   `TokenStream` gives a token once no later text can change it. Both equal the whole text's, however it is cut.
# - `TextStream` / `stream_text` speak text as it comes: `stream_long`'s audio for the whole text, sample for sample,
#   with a span per segment where its audio lies. Chapter 20 serves them over `qtts serve`'s WebSocket.
#
# **Artifacts left:** `data/outputs/<ckpt>/19_streamed.wav`, the chapter report.
#
# **If your numbers differ**
# - *The first check fails* → not a Base checkpoint: run on `tiny-base` (only a cloned voice has an x-vector prompt).
# - *First audio late* → `early=False`, or the first sentence decided late (no space or word after its end).
# - *Streamed audio ≠ `stream_long`* → another seed, `max_frames`, piece size or `max_batch` (several at once equal
#   it only to float rounding, chapter 17); or a rule that reads past the text so far (sections 3–4 fail first).

# %%
check.table()
