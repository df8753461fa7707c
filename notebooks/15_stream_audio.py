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
# **You will:** measure how much left context the causal codec decoder needs, stream `Synthesizer` output piece by
# piece and check it against `synthesize`, time the first audio, and pipe the stream out of `qtts say`.
#
# **You will learn:** what "causal" buys (a sample depends on a bounded window of frames) and how to use it well
# (each frame decoded once: a KV cache for the transformer, kept left context for the convolutions); which decode
# a stream should reproduce (the reference's own `chunked_decode(300, 25)`, not a one-shot decode); why a program
# that runs ncnn in a second thread must release the first thread's OpenMP workers.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip.
# Timings on `tiny-*` are mostly call overhead; the full-size ones are read from `data/bench/stream/`.
# **Leaves behind:** `data/outputs/<ckpt>/15_stream.wav`, `data/reports/<ckpt>/15_stream_audio.json`.

# %%
import inspect
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench import stream as bench_stream
from qtts_lib.isolation import PRELUDE
from qtts_lib.runtime import InputError, Synthesizer
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav, pcm16, save_wav, wav_header
from qtts_lib.runtime.binding.net import release_threads
from qtts_lib.runtime.codec import stream
from qtts_lib.runtime.codec.decoder import CHUNK_FRAMES, LEFT_CONTEXT_FRAMES, IncrementalDecode
from qtts_lib.runtime.pipeline import precision

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("15_stream_audio", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # chapters 04-05's graphs, reused when current
synth = Synthesizer(model_dir, threads=THREADS)
codec = synth.codec
voice_wav = load_wav(paths.voice_wav())
voice_text = (paths.INPUTS / "voice.txt").read_text().strip()
voice = synth.voice(speaker=synth.speakers[0]) if synth.kind == "custom_voice" else synth.voice(wav=voice_wav)
TEXT = "Streaming sends the first words while the rest of the sentence is still being generated."
REFERENCE = json.loads((paths.DATA / "bench" / "stream" / "dev-2core-xeon-amx-full-base.json").read_text())
POOLS = json.loads((paths.DATA / "bench" / "stream" / "dev-2core-epyc-full-base.json").read_text())
print({k: codec.config[k] for k in ("num_hidden_layers", "sliding_window", "upsampling_ratios", "upsample_rates")})

# %% [markdown]
# ## 1. Bound the decoder's reach from its structure
# Every layer of the codec decoder looks only left: causal convolutions (left padding), transposed convolutions
# whose right overhang is cut, and a transformer whose mask is causal with a sliding window of 72 (each layer sees
# itself and 71 frames back). Adding each layer's left reach, in frames, gives the receptive field *R*: the
# transformer's `layers × 71` dominates, the conv stack adds about 10 frames.

# %%
print(inspect.getsource(stream.receptive_field))
R = stream.receptive_field(codec.config)
layers = codec.config["num_hidden_layers"]
print(f"R = {R} frames ({layers} layers x 71 + 12); the full-size decoder (8 layers): 2 + 568 + 10 = 580")
check.equal("receptive field = pre-conv 2 + layers x 71 + conv stack 10", "frames", R, 2 + layers * 71 + 10)

# %% [markdown]
# ## 2. Measure the context a piece needs
# Decode frames [a, a+8) from `codes[a−c : a+8]`, drop the first c·1920 samples, and compare with the same frames
# of a one-shot decode of [0, a+8). Random codes (every codebook entry equally likely) are the hard case: no
# silence to hide differences. The curve is the worst of three windows. The measuring helpers live in
# `qtts_lib.bench.stream`: the runtime streams exactly and needs none of them.

# %%
codes = np.random.default_rng(0).integers(0, 2048, size=(R + 40, 16))
contexts = [0, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, R]
starts = [R, R + 16, R + 32]
curves = np.array([bench_stream.context_snr(codec, codes, a, a + 8, contexts) for a in starts])  # (3, contexts)
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
print(f"smallest context with every larger one >= 60 dB: {c60} frames; at R: {worst[-1]:.1f} dB")
check.at_least(f"context R = {R} frames: piece = one-shot", "snr_db", float(worst[-1]), 100.0)
check.at_most("no context: far from one-shot (the test is sensitive)", "snr_db", float(worst[0]), 40.0)
check.at_most("measured reach: 60 dB from a context shorter than R", "frames", c60, contexts[-2])

# %% [markdown]
# Measured, the reach is shorter than the bound (far frames get tiny attention weights), but the bound is what a
# stream can rely on with any weights: a stream that decodes each piece again with left context (the way on a GPU,
# section 4) uses `context_frames = R`. A smaller c trades exactness for speed; the product streams exactly.
#
# ## 3. Stream the decode, and match what `Codec.decode` does
# `Codec.decode` copies the reference's `chunked_decode(300, 25)`: up to 300 frames it is one graph call (the
# one-shot decode); past 300 frames each chunk of 300 gets only 25 frames of left context, so it is not the one-shot
# decode. The stream reproduces `Codec.decode`, both parts: it never reaches further left than the current reference
# chunk's context. Re-decoding, each piece [a, b) comes from `codes[max(a − c, chunk context start) : b]`, which is
# either the reference's decode of its chunk cut at b (causality makes the cut exact) or leaves out only frames
# beyond every sample's reach. Incrementally (the default on the CPU, section 4), one decode per reference chunk
# starts at the chunk's context start and is fed each piece once.

# %%
print(inspect.getsource(stream.StreamDecoder._decode))
T = CHUNK_FRAMES + 16
long_codes = np.random.default_rng(1).integers(0, 2048, size=(T, 16))
chunked, one_shot = codec.decode(long_codes), codec.decode_once(long_codes)
dec = stream.StreamDecoder(codec, chunk_frames=36)
streamed = np.concatenate([p for f in long_codes for p in dec.push(f)] + [dec.finish()])
head, tail = slice(0, CHUNK_FRAMES * SAMPLES_PER_FRAME), slice(CHUNK_FRAMES * SAMPLES_PER_FRAME, None)
check.snr("reference chunking, frames < 300: = one-shot", chunked[head], one_shot[head], 100.0)
check.at_most(f"reference chunking, frames 300..{T}: != one-shot ({LEFT_CONTEXT_FRAMES} frames of context)",
              "snr_db", check.snr_db(chunked[tail], one_shot[tail]), 90.0)
check.snr(f"stream (chunks of 36) = Codec.decode, all {T} frames", streamed, chunked, 100.0)

# %% [markdown]
# ## 4. Decode every frame once
# Re-decoding is simple and exact, but expensive: inside a reference chunk a piece's left context is everything
# from the chunk's context start, up to 325 frames, so a stream of small pieces decodes dozens of times more frames
# than it plays. The codec's CPU form (chapter 12) is cut in parts, and every part can continue where it stopped:
# part 0 (codebooks, pre_conv) reruns only its 3 frames of left context; the transformer runs the new positions with
# a KV cache (chapter 05's `add_kv_cache` on its graph, the mask keeping the sliding window); every causal
# convolution of the upsampling stages keeps the last input samples it reads from the call before, a state blob in
# and out of its graph (`rewrites.codec_cpu.stateful_convolutions`), as a KV cache keeps positions, so a stage never
# computes an output sample twice however small the pieces. `Codec.incremental()` returns that decode,
# an `IncrementalDecode` fed a few frames at a time. To count what each way decodes, the `StreamDecoder` below gets
# a codec that hands every call on to the real one and adds up the frames each decode is given.

# %%
print(inspect.getsource(IncrementalDecode.push))


class Counted:
    """Hands every call on to `inner` (a codec, or its incremental decode), counting the frames each decode gets."""

    def __init__(self, inner, tally: list[int]):
        self.inner, self.tally = inner, tally

    def __getattr__(self, name):  # config, groups, parts: the codec's own
        return getattr(self.inner, name)

    def decode_once(self, codes):
        self.tally[0] += len(codes)
        return self.inner.decode_once(codes)

    def push(self, codes):
        self.tally[0] += len(codes)
        return self.inner.push(codes)

    def pieces(self, codes):  # a push handed out in pieces (a stream's first piece)
        self.tally[0] += len(codes)
        return self.inner.pieces(codes)

    def incremental(self):
        return Counted(self.inner.incremental(), self.tally)


few = long_codes[:120]  # streamed in pieces of 4 both ways, against one decode_once
once, per_frame = codec.decode_once(few), {}
for label, context in (("incremental (default)", None), (f"re-decode, context R = {R}", R)):
    tally = [0]
    dec = stream.StreamDecoder(Counted(codec, tally), chunk_frames=4, context_frames=context)
    out = np.concatenate([p for f in few for p in dec.push(f)] + [dec.finish()])
    check.snr(f"stream, {label}, pieces of 4 = decode_once", out, once, 100.0)
    per_frame[label] = tally[0] / len(few)
print("frames decoded per frame played:", per_frame)
incremental, redecode = per_frame.values()
check.equal("incremental stream: every frame decoded once", "frames per frame", incremental, 1.0)
check.at_least("re-decode stream: frames decoded per frame played", "frames per frame", redecode, 2.0)

# %% [markdown]
# Re-decoding n frames in pieces of 4 decodes about n/8 frames per frame played (inside one reference chunk every
# piece starts from the chunk's context start). The incremental decode costs a little more than one whole decode
# (each part reruns its context; more calls of fewer frames): section 6 reads how much at full size. On a GPU the
# codec runs the exported graph whole (no parts), so the stream re-decodes there.
#
# ## 5. Stream the synthesizer
# `synthesize` and `stream` are one path: the generation loop's frames are pushed into a decoder, a `WholeDecoder`
# (the reference's whole decode at the end) or a `StreamDecoder`. `stream` returns a `Stream`; iterating it runs the
# generation in your thread, a frame at a time, and yields pieces of `chunk_frames` frames; once it is exhausted,
# `.result` holds the `Result` (codes, why it stopped, seconds per stage; no `wav`). Both sample with
# `synth.sampling` unless given a `Sampling`; without a seed each call draws a fresh one, so the comparison below
# gives both the same seed, and then the stream makes `synthesize`'s codes and wav.
# With an ICL voice the clip's codes are decoded in front of the new frames and never emitted, as the reference
# does; one quirk is the reference's: `synthesize` cuts the clip's share by a float ratio, which now and then keeps
# one sample of the clip in front of the wav, while the stream starts exactly at the first generated frame.

# %%
seeded = synth.sampling.replace(seed=7)
print(seeded)
whole = synth.synthesize(TEXT, "english", voice, seeded, max_frames=60)
for chunk in (4, 12):
    streaming = synth.stream(TEXT, "english", voice, seeded, max_frames=60, chunk_frames=chunk)
    pieces = list(streaming)
    check.tokens_equal(f"stream's codes = synthesize's, chunks of {chunk}", streaming.result.codes, whole.codes)
    check.snr(f"stream = synthesize, {voice.mode}, chunks of {chunk} frames ({len(pieces)} pieces)",
              np.concatenate(pieces), whole.wav, 60.0)
save_wav(paths.outputs_dir(ckpt) / "15_stream.wav", np.concatenate(pieces))
try:  # bad input is refused when `stream` is called, before any frame: before anything reached a listener
    synth.stream(TEXT, "klingon", voice)
    refused = "nothing"
except InputError as e:
    refused = type(e).__name__
    print(e)
check.equal("an unknown language: refused by stream() itself", "raised", refused, "InputError")
if synth.kind != "custom_voice":
    icl = synth.voice(wav=voice_wav, text=voice_text)
    whole_icl = synth.synthesize(TEXT, "english", icl, seeded, max_frames=30)
    ours = np.concatenate(list(synth.stream(TEXT, "english", icl, seeded, max_frames=30, chunk_frames=4)))
    extra = len(whole_icl.wav) - len(ours)
    check.at_most("ICL: synthesize's extra leading samples (float-ratio cut)", "samples", extra, 1)
    check.snr("stream = synthesize, ICL, chunks of 4 frames", ours, whole_icl.wav[extra:], 60.0)


# %% [markdown]
# ## 6. Time the first audio
# Frames generated, audio emitted and what a player that starts at the first piece would play, against wall time.
# The player stalls whenever it has played everything emitted so far.

# %%
t0, gen, out = time.perf_counter(), [], []  # (time, frames generated), (time, audio emitted in seconds)
for piece in synth.stream(TEXT, "english", voice, max_frames=60, chunk_frames=4,
                          on_frame=lambda n: gen.append((time.perf_counter() - t0, n))):
    out.append((time.perf_counter() - t0, len(piece) / SAMPLE_RATE + (out[-1][1] if out else 0.0)))
gen, out = np.array(gen), np.array(out)
end, played, stalls, playback = out[0, 0], 0.0, 0, []  # a player: plays what is there, stalls when it runs out
for t, emitted in out:
    stalls += t > end
    start, end = max(end, t), max(end, t) + emitted - played
    playback += [(start, played), (end, emitted)]
    played = emitted
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.plot(gen[:, 0], gen[:, 1] * SAMPLES_PER_FRAME / SAMPLE_RATE, label="frames generated (as audio)")
ax.step(out[:, 0], out[:, 1], where="post", label="audio emitted (pieces of 4 frames)")
ax.plot(*np.array(playback).T, ls="--", label=f"playback ({stalls} stalls)")
ax.axvline(out[0, 0], color="gray", ls=":", label=f"first audio {out[0, 0] * 1000:.0f} ms")
ax.set(xlabel="wall time (s)", ylabel="audio (s)", title=f"Streaming timeline ({ckpt}, {THREADS} threads)")
ax.legend(fontsize=8)
plt.show()
check.at_most("first audio early in the run (streaming, not batch)", "ttfa / total", out[0, 0] / out[-1, 0], 0.5)

# %% [markdown]
# Times are measurements, not checks. What the first piece waits for can be counted instead: because the stream
# runs in the caller's thread, a frame per step of the iteration, exactly `chunk` frames exist when the first piece
# arrives, and closing the stream then generates no more.
#
# The first piece does not come whole. The codec's decoder stages cost mostly per sample, not per call, so the
# stream hands out the first eighth of a frame (10 ms of audio) as soon as it is decoded, then the rest of that piece
# in pieces, each as long as all the audio before it, before the loop makes another frame (`codec.stream`'s
# docstring). A player can start on the first 10 ms and has audio queued while each later piece decodes.

# %%
for chunk in (1, 16):
    generated, seen = [], []  # (samples, frames generated by then) of each piece until the first chunk is out
    with synth.stream(TEXT, "english", voice, max_frames=40, chunk_frames=chunk, on_frame=generated.append) as pieces:
        while sum(n for n, _ in seen) < chunk * SAMPLES_PER_FRAME:
            seen.append((len(next(pieces)), len(generated)))
    print(f"chunks of {chunk}: the first piece's pieces (samples, frames made) {seen}")
    check.equal(f"chunks of {chunk}: the first audio, in frames", "frames", seen[0][0] / SAMPLES_PER_FRAME, 0.125)
    check.equal(f"chunks of {chunk}: frames made while the first piece comes out / after close()", "frames",
                f"{sorted({f for _, f in seen})} / {len(generated)}", f"{[chunk]} / {chunk}")

# %% [markdown]
# Most of the prompt is the voice, not the text. Its head (the role, the codec tags, the speaker row; `Prompt.head`)
# is the same for every text in this voice and language, so it goes into the talker as a call of its own and the
# synthesizer keeps its cache (`pipeline.scheduler.Prefixes`): the next stream in this voice copies it and prefills
# only its text. Always a call of its own, kept or not, so a stream's numbers do not depend on what was said before.

# %%
p = synth.prompt(TEXT, "english", voice)
print(f"prompt: {len(p.embeds)} positions, the first {p.head} the voice's head; a stream after the first prefills "
      f"{len(p.embeds) - p.head}")
check.equal("this voice's head is kept after its streams", "kept", synth.prefixes.get(p.embeds[:p.head]) is not None,
            True)

# %% [markdown]
# So the first audio costs the prompt, its prefill (the text, once the voice's head is kept), `chunk` frames (the loop
# hands a frame out before the talker step that feeds the next one, so a one-frame piece does not wait for that step),
# and the codec's decode of them up to its decoder stages plus an eighth of a frame through those. Smaller chunks start
# sooner but make more codec calls, and every call reads all of the codec's weights: pieces of one frame read them once
# a frame. The stream keeps up with playback only if a piece is generated and decoded faster than its audio lasts (RTF <
# 1); a stream that falls behind makes the listener wait between pieces, so what a player can promise is *gapless
# playback from*: the earliest moment after the call from which no piece arrives after the audio in front of it has
# played (`bench.stream.gapless_from_ms`). It equals the first audio when the stream keeps up, and grows with the
# utterance when it does not. A committed run (`python -m qtts_lib.bench stream`) at full size, medians of fresh
# processes: first audio and its parts, gapless playback from, then whole streams against `synthesize` (ms per frame; 80
# ms is real time):

# %%
rows = {}
for r in REFERENCE["rows"]:
    if r["commit"] != REFERENCE["rows"][0]["commit"]:
        continue  # the file also holds an older runtime measured beside this one (the results page shows both)
    ms = r["ms_per_frame"]
    rows[f"{r['precision']} / {r['codec_precision']}" + (", huge pages" if r["huge_pages"] else "")] = {
        **{f"first audio, pieces of {k}": v for k, v in r["ttfa_ms"].items()},
        **{f"first audio: {k}": v for k, v in r["first_audio_parts_ms"].items()},
        **{f"gapless playback from, pieces of {k}": v for k, v in r["gapless_from_ms"].items()},
        "synthesize": ms["synthesize"], **{f"stream, pieces of {k}": ms[f"stream_{k}"] for k in (1, 2, 4)},
        "codec whole": ms["codec_whole"], "codec, pieces of 1": ms["codec_pieces_of_1"]}
print(REFERENCE["machine"]["cpu"], "(loop tier / codec tier; ms, and ms per frame)")
pd.DataFrame(rows)

# %% [markdown]
# ## 7. Hand ncnn work to another thread
# The stream runs in the caller's thread, but a program around it may hand ncnn to another: `qtts serve` loads the
# model in its main thread and runs every ncnn call on one engine thread. GNU OpenMP keeps a pool of workers *for
# each thread that ran a parallel region*, and the first thread's pool stays alive after the hand-over. Once the
# process holds more OpenMP workers than CPUs, libgomp parks each worker in the kernel between parallel regions, so
# each of the ~1000 small layers of a decoder step pays a wake-up. `release_threads()` (`omp_pause_resource_all`
# in each OpenMP runtime loaded) frees the calling thread's pool; the server's `Engine` calls it before its engine
# thread takes over. Counted, not timed, as `tests/test_threads.py` does: the talker decoder with one thread per
# CPU (so two pools outnumber the CPUs) runs a prefill here, then 60 decode steps here or in a new thread, with this
# thread's pool kept or released; the count is the voluntary context switches of the thread that runs the steps.
# Below it, what a kept pool cost in time at full size, from a committed run on a 2-core AMD EPYC VM.

# %%
cores = os.cpu_count() or 1
talker = synth.config.talker
net = precision.decoder(synth.config.ncnn_dir, "talker_decoder", talker["head_dim"], talker["rope_theta"], cores)


def step_switches(in_worker: bool, release: bool, steps: int = 60) -> int:
    rng = np.random.default_rng(0)
    embeds = [rng.standard_normal((1, n, talker["hidden_size"])).astype(np.float32) for n in [8] + [1] * steps]
    _, cache = net.prefill(embeds[0])  # this thread has run ncnn: its OpenMP pool exists
    if release:
        release_threads()

    def run_steps() -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        for x in embeds[1:]:
            net.forward(x, cache)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before

    if not in_worker:
        return run_steps()
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(run_steps).result()


if cores < 2:
    print("skipped: with one CPU ncnn starts no OpenMP workers, so there is no pool to release")
else:
    switches = {"this thread": step_switches(False, False),
                "a worker thread, this thread's pool kept": step_switches(True, False),
                "a worker thread, after release_threads()": step_switches(True, True)}
    display(pd.DataFrame({f"voluntary context switches, 60 steps ({cores} threads)": switches}))
    kept, released = (switches[f"a worker thread, {k}"] for k in ("this thread's pool kept", "after release_threads()"))
    check.at_least("a kept pool parks the worker thread's OpenMP workers (switches kept / released)", "ratio",
                   kept / max(released, 10), 4.0)
for r in POOLS["runs"]:  # the stream's loop in a worker thread, the caller's pool kept and released, full size
    ms = r["ms_per_frame"]
    print(f"{r['threads']} threads: stream {ms['stream']:.0f} ms per frame, pool kept {ms['stream_pool_kept']:.0f} "
          f"({ms['stream_pool_kept'] / ms['stream']:.2f}x)")

# %% [markdown]
# ## 8. Pipe it from the command line
# `qtts say --stream -o out.wav` writes a complete wav after each piece; `-o -` writes 16-bit PCM behind a WAV header
# of unknown length to stdout as the pieces come, for a player reading a pipe:
#
# ```
# qtts say --checkpoint tiny-base --voice data/inputs/voice.wav --text "Hello." -o - | ffplay -nodisp -autoexit -
# ```
#
# Here the command runs in a process where torch cannot be imported, with a seed, so that its take can be compared
# with `Synthesizer.stream`'s in this process: the pipe carries the same pieces, rounded to 16 bits. Serving the
# stream over HTTP, to many listeners at once, is chapter 18.

# %%
cli = "from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))"
voice_args = ["--speaker", synth.speakers[0]] if synth.kind == "custom_voice" else ["--voice", str(paths.voice_wav())]
piped = subprocess.run([sys.executable, "-c", PRELUDE + cli, "say", "--checkpoint", str(model_dir), *voice_args,
                        "--text", TEXT, "--language", "english", "--seed", "7", "--max-frames", "20",
                        "--threads", str(THREADS), "-o", "-"], capture_output=True)
print(piped.stderr.decode().strip().splitlines()[-1])
header, body = piped.stdout[:44], np.frombuffer(piped.stdout[44:], "<i2").astype(int)
pieces = synth.stream(TEXT, "english", voice, seeded, max_frames=20, chunk_frames=4)
expected = np.frombuffer(pcm16(np.concatenate(list(pieces))), "<i2").astype(int)
check.equal("qtts say -o -: a WAV header of unknown length first", "equal", header == wav_header(), True)
check.equal("qtts say -o - = Synthesizer.stream, same seed, 16-bit PCM", "max |diff| (LSB)",
            int(np.abs(body - expected).max()) if len(body) == len(expected) else f"{len(body)} samples", 0)

# %% [markdown]
# ## Summary
# - The codec decoder's reach is bounded (R = pre-conv 2 + layers × 71 + 10 frames), and a piece decoded with R
#   frames of left context is the one-shot decode to float rounding; the measured reach is shorter.
# - The stream reproduces `Codec.decode`, the reference's `chunked_decode(300, 25)`, by never reaching left of a
#   reference chunk's context; on the CPU it decodes every frame once (`IncrementalDecode`).
# - `Synthesizer.stream` generates in the caller's thread and makes `synthesize`'s codes and wav, x-vector and ICL;
#   first audio costs the prompt, `chunk` frames and their decode, whose last stages hand out an eighth of a frame
#   first (the rest of the first piece follows before the next frame). A voice's prompt head is prefilled once and
#   kept: later streams in that voice prefill only their text, with the same numbers.
# - Running ncnn in a second thread needs `release_threads()` in the first, or the two OpenMP pools park each
#   other's workers (`qtts serve` runs every ncnn call on one engine thread).
# - `qtts say -o -` pipes the same stream as 16-bit PCM behind a WAV header of unknown length.
#
# **Artifacts left:** `data/outputs/<ckpt>/15_stream.wav`, the chapter report.
#
# **If your numbers differ**
# - *Stream far from `Codec.decode` past frame 300* → a context reaching left of `chunk_start − 25`: that is the
#   one-shot decode, not the reference's. *SNR near 0 dB* → context samples not dropped (`(a − lo) · 1920`).
# - *ICL stream one sample short of `synthesize`* → expected: the reference's float-ratio cut (section 5).
# - *Stream codes differ from `synthesize`'s* → not the same `Sampling` (seed included), or one random stream shared
#   between sequences instead of one per sequence (`pipeline.sampling.Sampler`).
# - *Incremental stream off from its second piece on, or the context curve never reaching 60 dB* → mask or rope
#   positions not absolute across calls (`rope.causal_mask(L, past, window)`), or a part's kept context shorter
#   than its measured reach (`codec_decoder.json`).
# - *`qtts say -o -` differs from the stream* → another seed, language (the CLI's default is `auto`) or frame cap.
# - *Released and kept pools count the same switches* → `release_threads()` found no OpenMP runtime (it returns
#   False): ncnn without OpenMP, or an OpenMP other than GNU's, which may not park its workers this way.

# %%
check.table()
