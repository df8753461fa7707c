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
# # 15 · Stream audio
# > First audio after a few frames, and exactly the waveform of the whole-utterance decode.
#
# **You will:** measure how much *left context* (earlier frames decoded along with a piece, their samples dropped) the
# causal codec decoder needs, stream `Synthesizer` output *piece* by piece (a few frames' audio, handed out as soon as
# it is decoded) and check it against `synthesize`, time the *first audio* (request to first samples), pipe `qtts say`.
#
# **You will learn:** what "causal" buys (a sample depends on a bounded window of frames) and how to use it well (each
# frame decoded once: a KV cache for the transformer, kept context for the convolutions); which decode a stream should
# reproduce: the reference's `chunked_decode(300, 25)` (chapter 07). A thread of its own: appendix D.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip. Timings on
# `tiny-*` are mostly call overhead; the full-size ones are read from `data/bench/stream/`.
# **Leaves behind:** `data/outputs/<ckpt>/15_stream.wav`, `data/reports/<ckpt>/15_stream_audio.json`.
#
# The set-up loads the checkpoint's `Synthesizer` (chapter 07) and a voice: the committed clip's x-vector (its speaker
# embedding, chapter 08), or a built-in speaker on a CustomVoice checkpoint. Its config bounds the codec's *reach* (how
# many frames back a sample can depend on).

# %%
import inspect

import numpy as np

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.runtime import Synthesizer
from qtts_lib.runtime.audio.wav import load_wav, save_wav
from qtts_lib.runtime.codec import stream

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("15_stream_audio", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
codec = synth.codec
voice_wav = load_wav(paths.voice_wav())
voice_text = (paths.INPUTS / "voice.txt").read_text().strip()
voice = (synth.voice(speaker=synth.speakers[0]) if synth.kind == "custom_voice"
         else synth.voice(wav=voice_wav))
TEXT = ("Streaming sends the first words while the rest of the sentence is still "
        "being generated.")
keys = ("num_hidden_layers", "sliding_window", "upsampling_ratios", "upsample_rates")
print({k: codec.config[k] for k in keys})

# %% [markdown]
# ## 1. Bound the decoder's reach from its structure
# Every layer of the codec decoder looks only left: causal convolutions (left padding), transposed convolutions whose
# right overhang is cut, and a transformer whose mask is causal with a sliding window of 72 (each layer sees itself and
# 71 frames back). Adding each layer's left reach, in frames, gives the receptive field *R*: the transformer's `layers ×
# 71` dominates, the pre-conv before it adds 2 frames and the conv stack after it 10 (the printed "+ 12"). The same
# function gives the full-size decoder's, from the same config with its 8 layers:

# %%
print(inspect.getsource(stream.receptive_field))
R = stream.receptive_field(codec.config)
layers = codec.config["num_hidden_layers"]
full = stream.receptive_field(codec.config | {"num_hidden_layers": 8})
print(f"R = {R} frames ({layers} layers x 71 + 12); the full-size decoder (8 layers): "
      f"2 + {8 * 71} + {full - 2 - 8 * 71} = {full}")
check.equal("receptive field = pre-conv 2 + layers x 71 + conv stack 10", "frames", R,
            2 + layers * 71 + 10)

# %% [markdown]
# ## 2. Measure the context a piece needs
# Decode frames [a, a+8) from `codes[a−c : a+8]`, drop the first c·1920 samples (1920 a frame), and compare with the
# same frames of a *one-shot* decode (all of [0, a+8) in one graph call) as an SNR: 60 dB is an error a thousandth of
# the signal; identical audio gives infinity (capped at 160 in the plot). Random codes are the hard case: no silence to
# hide differences. Three starts a, the checks on the worst; the helpers are `qtts_lib.bench.stream`'s:

# %%
import matplotlib.pyplot as plt

from qtts_lib.bench import stream as bench_stream

codes = np.random.default_rng(0).integers(0, 2048, size=(R + 40, 16))
contexts = [0, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, R]
starts = [R, R + 16, R + 32]
curves = np.array([bench_stream.context_snr(codec, codes, a, a + 8, contexts)
                   for a in starts])  # (3, contexts)
worst = curves.min(0)
c60 = bench_stream.smallest_context(contexts, list(worst), 60.0)
fig, ax = plt.subplots(figsize=(8, 3.2))
for a, curve in zip(starts, curves):
    ax.plot(contexts, np.minimum(curve, 160), marker=".", label=f"frames {a}..{a + 8}")
ax.axhline(60, color="crimson", ls="--", label="60 dB")
ax.axvline(R, color="gray", ls=":", label=f"receptive field R = {R}")
ax.set(xlabel="left context c (frames)", ylabel="SNR vs one-shot (dB, capped at 160)",
       title=f"How much left context a piece needs ({ckpt})")
ax.legend(fontsize=8)
plt.show()
print(f"smallest context with every larger one >= 60 dB: {c60} frames; "
      f"at R: {worst[-1]:.1f} dB")
check.at_least(f"context R = {R} frames: piece = one-shot", "snr_db", float(worst[-1]),
               100.0)
check.at_most("no context: far from one-shot (the test is sensitive)", "snr_db",
              float(worst[0]), 40.0)
check.at_most("measured reach: 60 dB from a context shorter than R", "frames", c60,
              contexts[-2])

# %% [markdown]
# Measured, the reach is shorter than the bound (far frames get tiny attention weights), but only the bound holds for
# any weights: a stream that re-decodes each piece with left context (on a GPU, section 4) uses `context_frames = R`.
#
# ## 3. Stream the decode, and match what `Codec.decode` does
# Two sizes meet here: a *chunk* is the reference's 300 frames (a graph call, with 25 frames of left context past the
# first); a *piece* is what the stream hands out, `chunk_frames` frames. `Codec.decode` copies `chunked_decode(300,
# 25)`, so past 300 frames it is not the one-shot decode. The stream reproduces it by never reaching left of its chunk's
# *context start* (chunk start − 25): re-decoding, a piece [a, b) comes from `codes[max(a − c, context start) : b]`
# (causality makes the cut at b exact); incrementally (section 4), one decode per chunk starts at its context start and
# is fed each piece once. On 316 frames: chunked = one-shot in the first chunk, ≠ past it, and the stream = chunked:

# %%
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME
from qtts_lib.runtime.codec.decoder import CHUNK_FRAMES, LEFT_CONTEXT_FRAMES

print(inspect.getsource(stream.StreamDecoder._decode))
T = CHUNK_FRAMES + 16
long_codes = np.random.default_rng(1).integers(0, 2048, size=(T, 16))
chunked, one_shot = codec.decode(long_codes), codec.decode_once(long_codes)
dec = stream.StreamDecoder(codec, chunk_frames=36)
streamed = np.concatenate([p for f in long_codes for p in dec.push(f)] + [dec.finish()])
cut = CHUNK_FRAMES * SAMPLES_PER_FRAME
check.snr("reference chunking, frames < 300: = one-shot", chunked[:cut], one_shot[:cut],
          100.0)
check.at_most(f"reference chunking, frames 300..{T}: != one-shot "
              f"({LEFT_CONTEXT_FRAMES} frames of context)",
              "snr_db", check.snr_db(chunked[cut:], one_shot[cut:]), 90.0)
check.snr(f"stream (chunks of 36) = Codec.decode, all {T} frames", streamed, chunked,
          100.0)

# %% [markdown]
# ## 4. Decode every frame once
# Re-decoding is exact but expensive: a piece's left context reaches back to its chunk's context start, up to 325
# frames. The codec's CPU form (chapter 12) is cut in parts, graphs run in turn, that continue where they stopped: part
# 0 (codebooks, pre_conv) reruns its 3 frames of left context; the transformer runs new positions with a KV cache
# (chapter 05's `add_kv_cache`); every causal convolution keeps the last input samples it read, a state blob in and out
# of its graph (`rewrites.codec_cpu.stateful_convolutions`). `Codec.incremental()` returns that decode. To count what
# each way decodes, `Counted` wraps the codec, adds up the frames given to its decodes, passes all else through:

# %%
from qtts_lib.runtime.codec.decoder import IncrementalDecode

print(inspect.getsource(IncrementalDecode.push))


class Counted:
    """Hands every call on to `inner` (a codec, or its incremental decode), adding up
    the frames given to its decodes: `decode_once`, `push`, `pieces` (a first piece)."""

    def __init__(self, inner, tally: list[int]):
        self.inner, self.tally = inner, tally

    def __getattr__(self, name):  # config, groups, parts: the codec's own
        call = getattr(self.inner, name)
        if name not in ("decode_once", "push", "pieces"):
            return call
        return lambda codes: (self.tally.append(len(codes)), call(codes))[1]

    def incremental(self):
        return Counted(self.inner.incremental(), self.tally)

# %% [markdown]
# Both ways (incremental, `context_frames=None`; re-decoding with context R) stream 120 frames in pieces of 4, each
# checked against one `decode_once` of them, then the frames each decoded per frame played:

# %%
few = long_codes[:120]
once, per_frame = codec.decode_once(few), {}
ways = (("incremental (default)", None), (f"re-decode, context R = {R}", R))
for label, context in ways:
    tally = []
    dec = stream.StreamDecoder(Counted(codec, tally), chunk_frames=4,
                               context_frames=context)
    out = np.concatenate([p for f in few for p in dec.push(f)] + [dec.finish()])
    check.snr(f"stream, {label}, pieces of 4 = decode_once", out, once, 100.0)
    per_frame[label] = sum(tally) / len(few)
print("frames decoded per frame played:", per_frame)
incremental, redecode = per_frame.values()
check.equal("incremental stream: every frame decoded once", "frames per frame",
            incremental, 1.0)
check.at_least("re-decode stream: frames decoded per frame played", "frames per frame",
               redecode, 2.0)

# %% [markdown]
# R is longer than these 120 frames, so each re-decoded piece starts at frame 0: about n/2 frames decoded for 4 played.
# The incremental decode costs a little more than one whole decode (each part reruns its context; more calls of fewer
# frames), read at full size in section 6. On a GPU the codec runs whole (no parts), so the stream re-decodes.
#
# ## 5. Stream the synthesizer
# `synthesize` and `stream` are one path: the loop's frames go into a decoder, a `WholeDecoder` (the reference's whole
# decode at the end) or a `StreamDecoder`. Iterating the `Stream` that `stream` returns generates in your thread, a
# frame at a time, and yields pieces of `chunk_frames` frames; then `.result` holds the `Result` (codes, why it stopped,
# seconds per stage). With the same seed, the stream must make `synthesize`'s codes and wav:

# %%
seeded = synth.sampling.replace(seed=7)
whole = synth.synthesize(TEXT, "english", voice, seeded, max_frames=60)
for chunk in (4, 12):
    streaming = synth.stream(TEXT, "english", voice, seeded, max_frames=60,
                             chunk_frames=chunk)
    pieces = list(streaming)
    check.tokens_equal(f"stream's codes = synthesize's, chunks of {chunk}",
                       streaming.result.codes, whole.codes)
    check.snr(f"stream = synthesize, {voice.mode}, chunks of {chunk} frames "
              f"({len(pieces)} pieces)", np.concatenate(pieces), whole.wav, 60.0)
save_wav(paths.outputs_dir(ckpt) / "15_stream.wav", np.concatenate(pieces))

# %% [markdown]
# Bad input is refused when `stream` is called, before any frame reached a listener. With an ICL voice (the clip and its
# transcript, chapter 08) `synthesize` cuts the clip's share by a float ratio, as the reference does, which now and then
# keeps one sample of the clip in front of the wav; the stream starts at the first generated frame:

# %%
from qtts_lib.runtime import InputError

try:
    synth.stream(TEXT, "klingon", voice)
    refused = "nothing"
except InputError as e:
    refused = type(e).__name__
    print(e)
check.equal("an unknown language: refused by stream() itself", "raised", refused,
            "InputError")
if synth.kind != "custom_voice":
    icl = synth.voice(wav=voice_wav, text=voice_text)
    whole_icl = synth.synthesize(TEXT, "english", icl, seeded, max_frames=30)
    ours = np.concatenate(list(synth.stream(TEXT, "english", icl, seeded, max_frames=30,
                                            chunk_frames=4)))
    extra = len(whole_icl.wav) - len(ours)
    check.at_most("ICL: synthesize's extra leading samples (float-ratio cut)",
                  "samples", extra, 1)
    check.snr("stream = synthesize, ICL, chunks of 4 frames", ours,
              whole_icl.wav[extra:], 60.0)

# %% [markdown]
# ## 6. Time the first audio
# Frames generated, audio emitted, and what a player starting at the first piece plays (it *stalls* when it has played
# all emitted so far), against wall time; `on_frame` gets each frame's count. Checked: *ttfa* (time to 1st audio)/total:

# %%
import time

t0, gen, out = time.perf_counter(), [], []  # (time, frames made), (time, audio out, s)
for piece in synth.stream(TEXT, "english", voice, max_frames=60, chunk_frames=4,
                          on_frame=lambda n: gen.append((time.perf_counter() - t0, n))):
    so_far = out[-1][1] if out else 0.0
    out.append((time.perf_counter() - t0, len(piece) / SAMPLE_RATE + so_far))
gen, out = np.array(gen), np.array(out)
end, played, stalls, playback = out[0, 0], 0.0, 0, []  # end: when the player runs dry
for t, emitted in out:  # a piece arrives at t: a stall if the player ran dry before
    stalls += t > end
    start, end = max(end, t), max(end, t) + emitted - played
    playback += [(start, played), (end, emitted)]
    played = emitted
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.plot(gen[:, 0], gen[:, 1] * SAMPLES_PER_FRAME / SAMPLE_RATE,
        label="frames generated (as audio)")
ax.step(out[:, 0], out[:, 1], where="post", label="audio emitted (pieces of 4 frames)")
ax.plot(*np.array(playback).T, ls="--", label=f"playback ({stalls} stalls)")
ax.axvline(out[0, 0], color="gray", ls=":",
           label=f"first audio {out[0, 0] * 1000:.0f} ms")
ax.set(xlabel="wall time (s)", ylabel="audio (s)",
       title=f"Streaming timeline ({ckpt}, {THREADS} threads)")
ax.legend(fontsize=8)
plt.show()
check.at_most("first audio early in the run (streaming, not batch)", "ttfa / total",
              out[0, 0] / out[-1, 0], 0.5)

# %% [markdown]
# Times are measurements, not checks; what the first piece waits for can be counted. The stream runs in the caller's
# thread, a frame per step, so exactly `chunk` frames exist when the first piece arrives, and closing the stream
# generates no more. Nor does the first piece come whole: the decoder stages (the upsampling convolutions after the
# codec's transformer) cost per output sample, so the stream hands out the first eighth of a frame, then the rest in
# pieces each as long as all the audio before it: a player has audio queued while each later piece decodes.

# %%
for chunk in (1, 16):
    generated, seen = [], []  # seen: (samples, frames made by then) of each piece
    with synth.stream(TEXT, "english", voice, max_frames=40, chunk_frames=chunk,
                      on_frame=generated.append) as pieces:
        while sum(n for n, _ in seen) < chunk * SAMPLES_PER_FRAME:
            seen.append((len(next(pieces)), len(generated)))
    print(f"chunks of {chunk}: the first piece's pieces (samples, frames made) {seen}")
    check.equal(f"chunks of {chunk}: the first audio, in frames", "frames",
                seen[0][0] / SAMPLES_PER_FRAME, 0.125)
    made = f"{sorted({f for _, f in seen})} / {len(generated)}"
    check.equal(f"chunks of {chunk}: frames made while the first piece comes out "
                "/ after close()", "frames", made, f"{[chunk]} / {chunk}")

# %% [markdown]
# Most of the prompt is the voice. Its head (the role, the codec tags, the speaker row; `Prompt.head`) is the same for
# every text in this voice and language, so it is always prefilled as a call of its own and the synthesizer keeps its
# cache (`pipeline.scheduler.Prefixes`): the next stream in this voice prefills only its text.

# %%
p = synth.prompt(TEXT, "english", voice)
print(f"prompt: {len(p.embeds)} positions, the first {p.head} the voice's head; "
      f"a stream after the first prefills {len(p.embeds) - p.head}")
kept = synth.prefixes.get(p.embeds[:p.head]) is not None
check.equal("this voice's head is kept after its streams", "kept", kept, True)

# %% [markdown]
# So the first audio costs the prompt's prefill (its text, once the voice's head is kept), `chunk` frames and their
# decode up to the decoder stages plus an eighth of a frame through those. Smaller chunks start sooner but make more
# codec calls, each reading all of the codec's weights. A stream that is slower than its audio (RTF above 1) makes the
# listener wait between pieces, so what a player can promise is *gapless playback from*: the earliest moment from which
# no piece arrives after the audio in front of it has played (`bench.stream.gapless_from_ms`), the first audio when the
# stream keeps up. A committed run (`python -m qtts_lib.bench stream`) at full size on a 2-core Xeon with AMX, medians
# of fresh processes, a column per tier (loop / codec precision, chapters 13–14): first audio and its parts, gapless
# playback from, whole streams against `synthesize` (ms per frame):

# %%
import json

import pandas as pd

bench = paths.DATA / "bench" / "stream" / "dev-2core-xeon-amx-full-base.json"
REFERENCE = json.loads(bench.read_text())
newest = REFERENCE["rows"][0]["commit"]  # the newest runtime's rows (results page: all)
rows = {}
for r in (r for r in REFERENCE["rows"] if r["commit"] == newest):
    ms = r["ms_per_frame"]
    tier = f"{r['precision']} / {r['codec_precision']}"
    rows[tier + (", huge pages" if r["huge_pages"] else "")] = {
        **{f"first audio, pieces of {k}": v for k, v in r["ttfa_ms"].items()},
        **{f"first audio: {k}": v for k, v in r["first_audio_parts_ms"].items()},
        **{f"gapless playback from, pieces of {k}": v
           for k, v in r["gapless_from_ms"].items()},
        "synthesize": ms["synthesize"],
        **{f"stream, pieces of {k}": ms[f"stream_{k}"] for k in (1, 2, 4)},
        "codec whole": ms["codec_whole"], "codec, pieces of 1": ms["codec_pieces_of_1"]}
print(REFERENCE["machine"]["cpu"], "(loop tier / codec tier; ms, and ms per frame)")
pd.DataFrame(rows)

# %% [markdown]
# ## 7. Pipe it from the command line
# `qtts say --stream -o out.wav` writes a complete wav after each piece; `-o -` writes 16-bit PCM behind a 44-byte WAV
# header of unknown length to stdout as the pieces come, for a player reading a pipe (`qtts say ... -o - | ffplay -`).
# Here it runs in a process where torch cannot be imported, with a seed, to compare with `Synthesizer.stream`: the same
# pieces, rounded to 16 bits (an LSB is one step of a 16-bit sample). Over HTTP, to many listeners: chapter 18.

# %%
import subprocess
import sys

from qtts_lib.isolation import PRELUDE
from qtts_lib.runtime.audio.wav import pcm16, wav_header

cli = "from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))"
voice_args = (["--speaker", synth.speakers[0]] if synth.kind == "custom_voice"
              else ["--voice", str(paths.voice_wav())])
piped = subprocess.run([sys.executable, "-c", PRELUDE + cli, "say", "--checkpoint",
                        str(model_dir), *voice_args, "--text", TEXT, "--language",
                        "english", "--seed", "7", "--max-frames", "20",
                        "--threads", str(THREADS), "-o", "-"], capture_output=True)
print(piped.stderr.decode().strip().splitlines()[-1])
header, body = piped.stdout[:44], np.frombuffer(piped.stdout[44:], "<i2").astype(int)
pieces = synth.stream(TEXT, "english", voice, seeded, max_frames=20, chunk_frames=4)
expected = np.frombuffer(pcm16(np.concatenate(list(pieces))), "<i2").astype(int)
check.equal("qtts say -o -: a WAV header of unknown length first", "equal",
            header == wav_header(), True)
diff = (int(np.abs(body - expected).max()) if len(body) == len(expected)
        else f"{len(body)} samples")
check.equal("qtts say -o - = Synthesizer.stream, same seed, 16-bit PCM",
            "max |diff| (LSB)", diff, 0)

# %% [markdown]
# ## Summary
# - The codec decoder's reach is bounded (R = 2 + layers × 71 + 10 frames): a piece decoded with R frames of left
#   context is the one-shot decode to float rounding. The stream reproduces `Codec.decode` (`chunked_decode(300, 25)`)
#   by never reaching left of a chunk's context; on the CPU it decodes every frame once (`IncrementalDecode`).
# - `Synthesizer.stream` generates in the caller's thread and makes `synthesize`'s codes and wav; first audio costs
#   the text's prefill, `chunk` frames and their decode, an eighth of a frame first. `qtts say -o -` pipes it.
#
# **Artifacts left:** `data/outputs/<ckpt>/15_stream.wav`, the chapter report.
#
# **If your numbers differ**
# - *Stream far from `Codec.decode` past frame 300* → a context reaching left of `chunk_start − 25` (the one-shot
#   decode). *SNR near 0 dB* → context samples not dropped (`(a − lo) · 1920`).
# - *ICL stream one sample short of `synthesize`* → expected (section 5). *Stream codes differ* → another `Sampling`.
# - *Incremental stream off from its second piece on* → mask or rope positions not absolute across calls
#   (`rope.causal_mask(L, past, window)`), or a part's kept context shorter than its reach (`codec_decoder.json`).
# - *`qtts say -o -` differs from the stream* → another seed, language (the CLI's default is `auto`) or frame cap.

# %%
check.table()
