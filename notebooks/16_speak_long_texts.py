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
# # 16 · Speak long texts
# > One generation per segment, one voice for all of them, a frame cap that scales with each segment's text.
#
# **You will:** cut text into sentences in the checkpoint's ten languages and pack them into segments bounded in
# BPE tokens; speak a two-minute text segment by segment with one voice; check that the joined wav is exactly its
# segments plus the pauses.
#
# **You will learn:** why a long text is not one generation; where a sentence ends (and where a period does not end
# one: 3.14, "Dr.", URLs, "3. Oktober"); how a per-segment frame cap keeps one runaway segment from eating the rest.
# (A voice clip is checked before use in chapter 08.)
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip and
# `data/inputs/segment_corpus.txt`. **Leaves behind:** `data/outputs/<ckpt>/16_long.wav`,
# `data/reports/<ckpt>/16_speak_long_texts.json`.

# %%
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.runtime import Sampling, Synthesizer

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("16_speak_long_texts", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
random_weights = checkpoint.is_synthetic(ckpt)  # every checkpoint this project makes
print(f"{ckpt} ({synth.kind}), {'random' if random_weights else 'trained'} weights")

# %% [markdown]
# ## 1. Cut text into sentences, in ten languages
# `runtime.text.segment` splits at sentence ends (`. ! ?` before a space, the full-width `。！？` anywhere, blank
# lines) and refuses the periods that do not end a sentence. When unsure it does not split: a missed split only
# makes a segment longer, a wrong one puts a pause inside a phrase. The committed corpus holds the cases: each names
# its language, the function it tests (`sentences`, or `clauses`, the finer cut of section 2), a note and the pieces
# expected. One row a case, red where the pieces differ; then every language the checkpoint knows (its config's
# `codec_language_id`, the language tags) must have cases, and each language's cases must all pass:

# %%
import pandas as pd

from qtts_lib.runtime.text import segment

rows = []
for c in segment.read_cases(paths.INPUTS / "segment_corpus.txt"):
    got = getattr(segment, c["kind"])(c["text"])  # sentences(...) or clauses(...)
    rows.append({"language": c["language"], "kind": c["kind"], "tests": c["note"],
                 "pieces": len(c["expected"]), "ok": got == c["expected"],
                 "first piece": got[0][:40]})
corpus = pd.DataFrame(rows)
display(corpus.style.map(lambda ok: "" if ok else "background: #f99", subset=["ok"]))
missing = set(synth.config.talker["codec_language_id"]) - set(corpus.language)
check.equal("corpus covers the checkpoint's languages", "languages missing",
            len(missing), 0)
for language, group in corpus.groupby("language"):
    wrong = int((~group.ok).sum())
    check.equal(f"segmenter on the {language} corpus", "cases wrong", wrong, 0)

# %% [markdown]
# ## 2. Pack sentences into segments bounded in tokens
# The bound is in BPE tokens, what the model reads: `longform.MAX_SEGMENT_TOKENS` is about a paragraph. A sentence
# longer than that is cut at clause punctuation (`, ; :` before a space, so 1,000 stays whole; `，；：、`), then at
# spaces, then — Chinese or Japanese without punctuation — between characters. Segments never span two paragraphs
# (a heading without a period must not be read into the next sentence). Each segment gets its own frame cap,
# `pipeline.prompt.frame_cap(tokens) = FRAMES_PER_TOKEN·tokens + MARGIN_FRAMES`: speech takes 2.5–5 frames per
# token in these languages, so `FRAMES_PER_TOKEN` is about twice a slow narrator, and the margin covers the
# silences. `synthesize` applies the same cap to any text it is not given `max_frames` for.

# %%
import inspect

from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME
from qtts_lib.runtime.pipeline import longform
from qtts_lib.runtime.pipeline.prompt import FRAMES_PER_TOKEN, MARGIN_FRAMES, frame_cap

print(inspect.getsource(frame_cap))
print(f"MAX_SEGMENT_TOKENS = {longform.MAX_SEGMENT_TOKENS}, "
      f"FRAMES_PER_TOKEN = {FRAMES_PER_TOKEN}, MARGIN_FRAMES = {MARGIN_FRAMES} "
      f"({MARGIN_FRAMES * SAMPLES_PER_FRAME / SAMPLE_RATE:g} s)")

# %% [markdown]
# `longform.plan` cuts a text into `TextSegment`s, each with its text, token count and cap, before anything is
# spoken; speaking fills in the rest (frames made, `stopped` at "eos" or "cap", where its samples sit in the joined
# wav). The text below, which also explains the method in its own words, reads in about two minutes:

# %%
TEXT = """Chapter 16. On reading aloud.

A text longer than a few sentences is not one generation. The talker's context grows by
12.5 frames a second, and after a few minutes of one run, users of every port report the
same thing: the voice drifts, repeats itself, or never stops. So we do what a person
reading aloud does: one sentence at a time, a short breath between them.

Where does a sentence end? Not at every period. Dr. Smith paid $3.14 for 1,000 apples,
e.g. the red ones, and wrote it all down at https://example.com/notes.html before 9 a.m.
None of those periods ends anything. An ellipsis... is a pause, not an end. In German,
"am 3. Oktober" is a date, not two sentences! In Chinese, 句号后面不需要空格。 The rules are
small, and when they are unsure they do not split: a missed split costs a longer
segment, while a wrong one puts a pause in the middle of a phrase.

Then the sentences are packed into segments of at most sixty tokens, and each segment is
spoken with the same voice. The speaker's x-vector is computed once; in ICL mode, the
clip's codes are computed once as well and sit in every prompt. Each segment has its own
cap on frames, eight per token plus two seconds, so a segment that never says its
end-of-speech token stops after about twice its natural length, instead of running on
for minutes.

Finally the pieces are joined. Between two segments we put three tenths of a second of
silence, which is about the pause a reader makes between sentences, and each segment
fades in and out over ten milliseconds, so that a waveform cut mid-cycle does not click.
Nothing else changes: the length of the result is exactly the sum of the segments plus
the pauses, which is the first thing this chapter checks. The second is that no segment
ran into its cap unless it had to. The third is that you can listen to it, though with
random weights you will hear only noise."""

# %% [markdown]
# Planned, shown and checked: the text long enough, every segment within the token bound, every cap on the formula:

# %%
minutes = len(TEXT.split()) / 150
check.at_least("the long text reads in about two minutes (150 words a minute)",
               "minutes", minutes, 1.8)
todo = longform.plan(synth, TEXT)
display(pd.DataFrame([{"tokens": s.tokens, "cap (frames)": s.cap, "text": s.text[:70]}
                      for s in todo]))
check.at_most("every segment within the token bound", "most tokens",
              max(s.tokens for s in todo), longform.MAX_SEGMENT_TOKENS)
check.equal(f"caps scale with tokens ({FRAMES_PER_TOKEN} per token + {MARGIN_FRAMES})",
            "caps off the formula",
            sum(s.cap != FRAMES_PER_TOKEN * s.tokens + MARGIN_FRAMES for s in todo), 0)

# %% [markdown]
# ## 3. Speak it, one segment at a time
# `longform.synthesize_long` speaks each planned segment with `Synthesizer.synthesize` and the same `Voice`, made
# once by the caller. To show that the x-vector is computed once and not per segment, the synthesizer's voice
# encoders (`synth.voices`) are wrapped in a counter for the length of the run (and put back after it, even on an
# error). A CustomVoice checkpoint speaks with its first built-in speaker (no x-vector); any other, from the voice
# clip (x-vector mode). `on_segment` is called after each segment, here to log progress.
#
# The run is greedy (`Sampling(greedy=True)`), so its outcome is fixed. What the cap check expects depends on the
# weights, not on the checkpoint's size. With **random weights** (every checkpoint this project makes, `tiny-*` and
# `full-*` alike) nothing taught the model to end speech: EOS is one of the 2049 ids it may pick, with no reason to
# win the argmax, so every segment runs to its cap. We shrink the caps (1 frame per token + 4) to keep the run
# short and *expect* all segments at their cap; a random checkpoint that stopped early would show here. With
# trained weights the default caps apply and every segment should stop at EOS: one that hits its cap ran away.

# %%
class CountingVoices:
    """A synthesizer's voice encoders (`synth.voices`), counting the x-vectors made."""

    def __init__(self, voices):
        self.voices, self.xvectors = voices, 0

    def xvector(self, wav):
        self.xvectors += 1
        return self.voices.xvector(wav)

    def codes(self, wav):
        return self.voices.codes(wav)


from qtts_lib.runtime.audio.wav import load_wav

custom = synth.kind == "custom_voice"  # built-in speakers, no x-vector to compute
caps = {"frames_per_token": 1, "margin": 4} if random_weights else {}
progress = []
synth.voices = counting = CountingVoices(synth.voices)
try:
    voice = (synth.voice(speaker=synth.speakers[0]) if custom
             else synth.voice(wav=load_wav(paths.voice_wav())))
    long = longform.synthesize_long(
        synth, TEXT, "english", voice, sampling=Sampling(greedy=True), **caps,
        on_segment=lambda i, n, seg, wav: progress.append(f"{i + 1}/{n}"))
finally:
    synth.voices = counting.voices
segs = long.segments
print(" ".join(progress))
print(f"{len(segs)} segments, {sum(s.frames for s in segs)} frames, "
      f"{len(long.wav) / SAMPLE_RATE:.1f} s of audio, "
      f"{sum(s.seconds for s in segs):.1f} s wall")

# %% [markdown]
# The run's checks: one x-vector, the plan followed, the caps held (and hit only where the weights say they must),
# the joined wav exactly its segments plus the pauses, and each segment exactly 1920 samples a frame (x-vector mode
# decodes no clip codes in front, so nothing is cut off):

# %%
from IPython.display import Audio

from qtts_lib.runtime.audio.wav import save_wav

check.equal("x-vector computed once for all segments", "calls", counting.xvectors,
            0 if custom else 1)
check.equal("segments spoken = segments planned", "segments", len(segs), len(todo))
check.equal("every segment within its cap", "segments over",
            sum(s.frames > s.cap for s in segs), 0)
check.equal("segments that hit their cap"
            + (" (random weights: all)" if random_weights else " (ran away)"),
            "segments", sum(s.stopped == "cap" for s in segs),
            len(segs) if random_weights else 0)
check.equal("wav = sum of segments + pauses", "samples", len(long.wav),
            sum(s.samples for s in segs) + (len(segs) - 1) * long.pause_samples)
check.equal("each segment = its frames x 1920 samples", "segments off",
            sum(s.samples != s.frames * SAMPLES_PER_FRAME for s in segs), 0)
save_wav(paths.outputs_dir(ckpt) / "16_long.wav", long.wav)
display(Audio(long.wav, rate=SAMPLE_RATE))

# %% [markdown]
# Where each segment sits in the wav (top: the waveform, each segment shaded and numbered, the pauses between them
# unshaded), and how close each came to its cap (bottom: the cap in grey, the frames made in blue; with random weights
# the blue fills the grey):

# %%
import matplotlib.pyplot as plt
import numpy as np

fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 4.5), height_ratios=[2, 1])
ax.plot(np.arange(len(long.wav)) / SAMPLE_RATE, long.wav, lw=0.3, color="0.3")
for i, s in enumerate(segs):
    start, end = s.start / SAMPLE_RATE, (s.start + s.samples) / SAMPLE_RATE
    ax.axvspan(start, end, color=f"C{i % 2}", alpha=0.15)
    top = ax.get_ylim()[1] * 0.8
    ax.text((start + end) / 2, top, str(i + 1), ha="center", fontsize=8)
ax.set(xlabel="seconds",
       title=f"{len(segs)} segments (shaded), {longform.PAUSE_SECONDS} s pauses")
n = range(1, len(segs) + 1)
bx.bar(n, [s.cap for s in segs], color="0.85", label="cap")
bx.bar(n, [s.frames for s in segs], color="C0", width=0.5, label="frames generated")
bx.set_xlabel("segment")
bx.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 4. Stream it: how fast the pieces may grow
# Streamed (`stream_long(..., chunk_frames=4)`), a text's first piece is one frame (`longform.FIRST_FRAMES`), so its
# first audio waits for one frame only; the pieces after it grow to `chunk_frames`. How fast? A player that starts
# at the first piece needs piece k once the audio in front of it has played. If a frame takes r times its 80 ms to
# make (r: the *real-time factor* of the loop and its decode), and S_k frames are in pieces 1..k, piece k is ready
# at S_k·r frame-lengths and due at s_1·r + S_(k-1): it may hold s_1 + S_(k-1)·(1/r − 1) frames, no more.
# Doubling (1, 2, 4) is that rule at r = 0.5. `codec.stream.piece_frames` is the rule; the server passes the step
# it measured (chapter 18). With a simulated clock at r = 0.9:

# %%
from qtts_lib.runtime.codec.stream import piece_frames


def pieces_for(rtf: float, frames: int = 60) -> np.ndarray:
    sizes = []
    while sum(sizes) < frames:
        sizes.append(piece_frames(sum(sizes), first=1, chunk=4, rtf=rtf))
    return np.array(sizes)


def waits_ms(sizes: np.ndarray, r: float) -> np.ndarray:
    out = np.cumsum(sizes)
    ready, due = out * r, out[0] * r + np.concatenate([[0], out[:-1]])
    return np.maximum(ready - due, 0) * 80


R = 0.9
fig, ax = plt.subplots(figsize=(8, 3))
for label, grow in (("doubled (r = 0.5)", 0.5), (f"grown for r = {R}", R)):
    sizes = pieces_for(grow)
    ax.step(np.cumsum(sizes), waits_ms(sizes, R), where="post",
            label=f"{label}: {sizes[:10].tolist()} ...")
ax.set(xlabel="frames out", ylabel="listener waits (ms)",
       title=f"a stream made at r = {R}")
ax.legend()
plt.show()
check.equal(f"pieces grown for r = {R}: a listener never waits", "longest wait (ms)",
            float(waits_ms(pieces_for(R), R).max()), 0.0)
check.at_least(f"pieces doubled at r = {R}: the listener waits", "longest wait (ms)",
               float(waits_ms(pieces_for(0.5), R).max()), 1.0)

# %% [markdown]
# ## 5. From the command line
# `qtts say --text-file F` (or `-` for stdin) takes a text of any length; `--max-frames` is a ceiling on each
# segment's own cap. It samples with the checkpoint's sampling unless told otherwise; `--greedy` makes it
# greedy, as in section 3. With torch blocked, on the first three paragraphs with 3-frame caps. The CLI ends with one
# line, `OUT: N segments, M frames, ...`; the cell reads N and M from it and holds the wav's length to them:

# %%
from qtts_lib.isolation import qtts_without_torch

text_file = paths.outputs_dir(ckpt) / "16_long.txt"
cli_text = "\n\n".join(TEXT.split("\n\n")[:3])
cli_segments = len(longform.plan(synth, cli_text))
text_file.write_text(cli_text, encoding="utf-8")
out = paths.outputs_dir(ckpt) / "16_cli_long.wav"
voice_args = (["--speaker", synth.speakers[0]] if custom
              else ["--voice", str(paths.voice_wav())])
r = qtts_without_torch("say", "--checkpoint", str(model_dir), *voice_args,
                       "--text-file", str(text_file), "--language", "english",
                       "--greedy", "--max-frames", "3", "--threads", str(THREADS),
                       "-o", str(out))
print(r.stdout.strip() or r.stderr[-400:])
check.equal("qtts say --text-file with torch blocked", "exit status", r.returncode, 0)
frames = int(r.stdout.split(" segments, ")[1].split(" frames")[0])
check.equal("CLI wav = its frames + pauses", "samples", len(load_wav(out, quiet=True)),
            frames * SAMPLES_PER_FRAME + (cli_segments - 1) * long.pause_samples)
check.equal("CLI segments = the plan's", "segments",
            int(r.stdout.split(": ")[1].split(" segments")[0]), cli_segments)

# %% [markdown]
# ## Summary
# - The segmenter splits the corpus of all ten languages as expected: full-width ends without spaces, and no split
#   inside numbers, abbreviations, URLs, emails, ellipses or German ordinals.
# - A long text becomes segments bounded in tokens within a paragraph, each spoken with the same `Voice` (x-vector
#   computed once) under its own frame cap (`pipeline.prompt.frame_cap`, linear in its tokens), joined with short
#   pauses and fades.
# - The joined wav is exactly its segments plus the pauses, in the library and in `qtts say --text-file`.
# - Streamed, the first piece is one frame; a listener from the first piece never waits if piece k holds at most
#   s_1 + S_(k-1)·(1/r − 1) frames (`piece_frames`); doubling is that rule at r = 0.5.
# - With random weights every segment runs to its (shrunk) cap; with trained weights none should.
#
# **Artifacts left:** `data/outputs/<ckpt>/16_long.wav`, `16_long.txt`, `16_cli_long.wav`, the chapter report.
#
# **If your numbers differ**
# - *A corpus case fails* → an abbreviation list or rule changed in `runtime.text.segment`; the case's note says
#   which.
# - *More than one x-vector computed* → something builds the voice per segment; build one `Voice` and pass it to
#   every segment.
# - *A segment over the token bound* → the tokenizer is not the checkpoint's (`bpe.Tokenizer.from_dir`).
# - *With trained weights, a segment hits its cap* → it ran away (or the text is unusually slow to speak: digits,
#   spelled-out letters): listen to it; raise `frames_per_token` only if it was cut mid-word.
# - *wav ≠ segments + pauses* → something between `synthesize` and `join` changed a length (fades must not).

# %%
check.table()
