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
# # 14 · Stream speech and serve it over HTTP
# > First audio after a few frames, and exactly the waveform of the whole-utterance decode.
#
# **You will:** measure how much left context the causal codec decoder needs, build a streaming decoder on it,
# stream `Synthesizer` output piece by piece and check it against `synthesize`, time the first audio and the
# chunk-size trade-off, see what handing ncnn work to another thread costs, and serve it all as OpenAI's
# `/v1/audio/speech` with `qtts serve`.
#
# **You will learn:** what "causal" buys (a sample depends on a bounded window of frames) and what it costs to use
# naively (each piece decoded again with its left context) or well (each frame decoded once: a KV cache for the
# transformer, kept left context for the convolutions); how the reference's own `chunked_decode(300, 25)` relates
# to a one-shot decode, and which of the two a stream should reproduce; why a program that runs ncnn in a second
# thread must release the first thread's OpenMP workers.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip.
# Timings on `tiny-*` mean little (a few ms per frame; overhead dominates); run with a full-size checkpoint for
# real ones. **Leaves behind:** `data/outputs/<ckpt>/14_stream.wav`, `data/reports/<ckpt>/14_stream_and_serve.json`.

# %%
import inspect
import json
import os
import resource
import threading
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display
from starlette.testclient import TestClient

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench import stream as bench_stream
from qtts_lib.runtime import InputError, Synthesizer
from qtts_lib.runtime.app import server
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav, pcm16, save_wav
from qtts_lib.runtime.binding.net import release_threads
from qtts_lib.runtime.codec import stream
from qtts_lib.runtime.codec.decoder import CHUNK_FRAMES, LEFT_CONTEXT_FRAMES, IncrementalDecode
from qtts_lib.runtime.pipeline import longform, precision

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("14_stream_and_serve", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # chapters 04-05's graphs, reused when current
synth = Synthesizer(model_dir, threads=THREADS)
codec = synth.codec
voice_wav = load_wav(paths.voice_wav())
voice_text = (paths.INPUTS / "voice.txt").read_text().strip()
voice = synth.voice(speaker=synth.speakers[0]) if synth.kind == "custom_voice" else synth.voice(wav=voice_wav)
TEXT = "Streaming sends the first words while the rest of the sentence is still being generated."
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
display(pd.DataFrame(curves.T.round(1), index=pd.Index(contexts, name="context frames"),
                     columns=[f"frames {a}..{a + 8}" for a in starts]).T)

# %%
fig, ax = plt.subplots(figsize=(8, 3.2))
for a, curve in zip(starts, curves):
    ax.plot(contexts, np.minimum(curve, 160), marker=".", label=f"frames {a}..{a + 8}")
ax.axhline(60, color="crimson", ls="--", label="60 dB")
ax.axvline(R, color="gray", ls=":", label=f"receptive field R = {R}")
ax.set_xlabel("left context c (frames)")
ax.set_ylabel("SNR vs one-shot (dB, capped at 160)")
ax.set_title(f"How much left context a piece needs ({ckpt})")
ax.legend(fontsize=8);

# %%
print(f"smallest context with every larger one >= 60 dB: {c60} frames; at R: {worst[-1]:.1f} dB")
check.at_least(f"context R = {R} frames: piece = one-shot", "snr_db", float(worst[-1]), 100.0)
check.at_most("no context: far from one-shot (the test is sensitive)", "snr_db", float(worst[0]), 40.0)
check.at_most("measured reach: 60 dB from a context shorter than R", "frames", c60, contexts[-2])

# %% [markdown]
# Measured, the reach is shorter than the bound: past some c the piece is equal to float rounding (the attention
# weights of far frames are tiny at these random weights). The same measurement on the full-size decoder (the
# PyTorch reference with full-base's random weights, frames 296..304) gave 57 dB at c = 48, 63 dB at 64 and 102 dB
# at 96, against a bound of R = 580. The bound is what a stream can rely on with any weights, so when a stream
# decodes each piece again with its left context (the way on a GPU, section 4), it uses `context_frames = R`.
# `StreamDecoder(codec, chunk_frames, context_frames=c)` with a smaller c trades exactness for speed (each piece
# costs c + chunk frames of codec); the product always streams with the exact default.

# %% [markdown]
# ## 3. Stream the decode, and match what `Codec.decode` does
# `Codec.decode` copies the reference's `chunked_decode(300, 25)`: up to 300 frames it is one graph call (the one-shot
# decode); past 300 frames each chunk of 300 gets only 25 frames of left context, so it is not the one-shot decode.
# The stream reproduces `Codec.decode`, both parts: it never reaches further left than the current reference chunk's
# context, so past frame 300 it decodes what the reference decodes. Re-decoding, each piece [a, b) comes from
# `codes[max(a − c, chunk context start) : b]`. Incrementally (the default on the CPU, section 4), one decode per
# reference chunk starts at the chunk's context start and is fed each piece once.

# %%
print(inspect.getsource(stream.StreamDecoder._decode))

# %%
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
# **What equality holds.** With `context_frames ≥ R` (the default) every piece is either the reference's decode of
# its chunk cut at the piece's end (causality makes the cut exact) or leaves out only frames beyond every sample's
# reach. So the stream equals `Codec.decode` to float rounding (≥ 100 dB above) at any length and chunk size.
# With a smaller context c the equality is approximate, within the SNR that section 2 measured for c. Past 300
# frames the reference itself departs from a one-shot decode, and the stream follows the reference.

# %% [markdown]
# ## 4. Decode every frame once
# Re-decoding is simple and exact, but expensive: inside a reference chunk a piece's left context is everything
# from the chunk's context start, up to 325 frames, so a stream of 4-frame pieces decodes dozens of times more
# frames than it plays. The codec's CPU form (chapter 11) is cut in parts, and every part can continue where it
# stopped: part 0 (codebooks, pre_conv) reruns only its 3 frames of left context; the transformer runs the new
# positions with a KV cache (chapter 05's `add_kv_cache` on its graph, the mask keeping the sliding window); each
# convolution stage keeps the few input samples of left context it measured (`PartChain`). `Codec.incremental()`
# returns that decode, an `IncrementalDecode` fed a few frames at a time:

# %%
print(inspect.getsource(IncrementalDecode.push))

# %% [markdown]
# To count what each way decodes, the `StreamDecoder` gets a codec that counts: it hands every call on to the real
# codec and adds up the frames it was given, both for a re-decode (`decode_once`) and for an incremental push.


# %%
class CountingCodec:
    """A codec for `StreamDecoder` that counts the frames each decode call is given, then decodes with `codec`."""

    def __init__(self, codec):
        self.codec, self.frames = codec, 0
        self.config, self.groups, self.parts = codec.config, codec.groups, codec.parts

    def decode_once(self, codes):
        self.frames += len(codes)
        return self.codec.decode_once(codes)

    def incremental(self):
        return CountedIncrementalDecode(self)


class CountedIncrementalDecode(IncrementalDecode):
    def __init__(self, counter: CountingCodec):
        super().__init__(counter.codec)
        self.counter = counter

    def push(self, codes):
        self.counter.frames += len(codes)
        return super().push(codes)


# %% [markdown]
# The same 120 frames streamed in pieces of 4 both ways, against one `decode_once`: equal, and what each costs
# (frames decoded per frame played, and time).

# %%
few = long_codes[:120]
once = codec.decode_once(few)
rows = []
for label, context in (("incremental (default)", None), (f"re-decode, context R = {R}", R)):
    counted = CountingCodec(codec)
    t0 = time.perf_counter()
    dec = stream.StreamDecoder(counted, chunk_frames=4, context_frames=context)
    out = np.concatenate([p for f in few for p in dec.push(f)] + [dec.finish()])
    seconds = time.perf_counter() - t0
    check.snr(f"stream, {label}, pieces of 4 = decode_once", out, once, 100.0)
    rows.append({"stream": label, "frames decoded per frame played": counted.frames / len(few),
                 "ms per frame (this run)": 1000 * seconds / len(few)})
cost = pd.DataFrame(rows).set_index("stream")
display(cost.style.format(precision=2))
check.equal("incremental stream: every frame decoded once", "frames per frame",
            cost["frames decoded per frame played"].iloc[0], 1.0)
check.at_least("re-decode stream: frames decoded per frame played", "frames per frame",
               cost["frames decoded per frame played"].iloc[1], 2.0)

# %% [markdown]
# Re-decoding n frames in pieces of 4 decodes about n/8 frames per frame played (inside one reference chunk every
# piece starts from the chunk's context start): about 38 at 300 frames. On `full-base` (1 thread, 40 frames, pieces
# of 4) the incremental stream cost 66 ms per frame against 57 for one whole decode (the contexts each part reruns,
# and more calls of fewer frames), at 111 dB from it. On a GPU the codec runs the exported graph whole (no parts), so
# the stream re-decodes there.

# %% [markdown]
# ## 5. Stream the synthesizer
# `Synthesizer.synthesize` and `Synthesizer.stream` are one path: the generation loop's frames are pushed into a
# decoder. `synthesize` uses a `WholeDecoder` (nothing until the end, then the reference's whole decode); `stream`
# uses a `StreamDecoder` and hands back a `Stream`. Iterating it yields pieces of `chunk_frames` frames (80 ms each).
# The generation runs in your thread, a frame at a time as you ask for the next piece. Once the stream is
# exhausted, `.result` holds the `Result` (codes, tokens, why it stopped, seconds per stage; its `wav` is None,
# since the audio went out in pieces).
#
# Both sample with the checkpoint's sampling (`synth.sampling`) unless given a `Sampling`. The sampler is seeded per
# sequence, so the stream makes the same codes as `synthesize`, and the pieces concatenate to its wav.

# %%
print(synth.sampling)
whole = synth.synthesize(TEXT, "english", voice, max_frames=60)
for chunk in (4, 12):
    streaming = synth.stream(TEXT, "english", voice, max_frames=60, chunk_frames=chunk)
    pieces = list(streaming)
    check.tokens_equal(f"stream's codes = synthesize's, chunks of {chunk}", streaming.result.codes, whole.codes)
    check.snr(f"stream = synthesize, {voice.mode}, chunks of {chunk} frames ({len(pieces)} pieces)",
              np.concatenate(pieces), whole.wav, 60.0)
save_wav(paths.outputs_dir(ckpt) / "14_stream.wav", np.concatenate(pieces))

# %% [markdown]
# Bad input is refused when `stream` is called, before any frame is generated: a caller learns of it before it
# has sent anything to a listener.

# %%
try:
    synth.stream(TEXT, "klingon", voice)
    refused = "nothing"
except InputError as e:
    refused = type(e).__name__
    print(e)
check.equal("an unknown language: refused by stream() itself", "raised", refused, "InputError")

# %% [markdown]
# With an ICL voice the clip's codes are decoded in front of the new frames and never emitted, as the reference does.
# One quirk is the reference's: `synthesize` cuts the clip's share by a float ratio, which now and then keeps one
# sample of the clip in front of the wav; the stream starts exactly at the first generated frame.

# %%
if synth.kind != "custom_voice":
    icl = synth.voice(wav=voice_wav, text=voice_text)
    whole_icl = synth.synthesize(TEXT, "english", icl, max_frames=30)
    ours = np.concatenate(list(synth.stream(TEXT, "english", icl, max_frames=30, chunk_frames=4)))
    extra = len(whole_icl.wav) - len(ours)
    check.at_most("ICL: synthesize's extra leading samples (float-ratio cut)", "samples", extra, 1)
    check.snr("stream = synthesize, ICL, chunks of 4 frames", ours, whole_icl.wav[extra:], 60.0)

# %% [markdown]
# ## 6. Watch it on a timeline
# Frames generated, audio emitted and what a player that starts at the first piece would play, against wall time.
# The player stalls whenever it has played everything emitted so far.

# %%
def timeline(chunk: int, frames: int = 60) -> dict:
    t0, gen, out = time.perf_counter(), [], []
    pieces = synth.stream(TEXT, "english", voice, max_frames=frames, chunk_frames=chunk,
                          on_frame=lambda n: gen.append((time.perf_counter() - t0, n)))
    audio = 0.0
    for piece in pieces:
        audio += len(piece) / SAMPLE_RATE
        out.append((time.perf_counter() - t0, audio))
    end, played, stalls, playback = out[0][0], 0.0, 0, []  # a player: plays what is there, stalls when it runs out
    for t, emitted in out:
        stalls += t > end
        start, end = max(end, t), max(end, t) + emitted - played
        playback += [(start, played), (end, emitted)]
        played = emitted
    return {"gen": np.array(gen), "out": np.array(out), "play": np.array(playback), "ttfa_s": out[0][0],
            "total_s": out[-1][0], "audio_s": audio, "stalls": stalls}


run = timeline(4)
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.plot(run["gen"][:, 0], run["gen"][:, 1] / 12.5, label="frames generated (as audio seconds)")
ax.step(run["out"][:, 0], run["out"][:, 1], where="post", label="audio emitted (pieces of 4 frames)")
ax.plot(run["play"][:, 0], run["play"][:, 1], ls="--", label=f"playback ({run['stalls']} stalls)")
ax.axvline(run["ttfa_s"], color="gray", ls=":", label=f"first audio {run['ttfa_s'] * 1000:.0f} ms")
ax.set_xlabel("wall time (s)")
ax.set_ylabel("audio (s)")
ax.set_title(f"Streaming timeline ({ckpt}, {THREADS} threads)")
ax.legend(fontsize=8);

# %%
check.at_most("first audio early in the run (streaming, not batch)", "ttfa / total", run["ttfa_s"] / run["total_s"],
              0.5)

# %% [markdown]
# ## 7. Time the first audio and the chunk-size trade-off
# `qtts_lib.bench.stream.ttfa_ms` measures from the call to the first piece (prompt, prefill, `chunk_frames` frames
# and one codec call; loading and building the voice are outside, as in a server). Smaller chunks mean earlier
# first audio but more codec calls, each with its parts' contexts to rerun: the total time grows as chunks shrink.

# %%
rows = []
for chunk in (1, 2, 4, 8, 16):
    t = bench_stream.ttfa_ms(synth, TEXT, "english", voice, chunk_frames=chunk, repeats=3, max_frames=40)
    r = timeline(chunk, frames=40)
    rows.append({"chunk frames": chunk, "chunk ms of audio": chunk * 80, "TTFA ms (median of 3)": t["ttfa_ms"],
                 "total s": r["total_s"], "RTF": r["total_s"] / r["audio_s"], "stalls": r["stalls"]})
trade = pd.DataFrame(rows).set_index("chunk frames")
display(trade.style.format(precision=2))

# %% [markdown]
# The times above are measurements, not checks. What the first piece waits for can be counted instead: because the
# stream runs in the caller's thread, a frame per step of the iteration, exactly `chunk` frames exist when the first
# piece arrives, and closing the stream then generates no more.

# %%
for chunk in (1, 16):
    generated = []
    pieces = synth.stream(TEXT, "english", voice, max_frames=40, chunk_frames=chunk, on_frame=generated.append)
    first = next(pieces)
    made = len(generated)
    pieces.close()
    check.equal(f"the first piece, chunks of {chunk}: frames of audio", "frames", len(first) / SAMPLES_PER_FRAME,
                float(chunk))
    check.equal(f"chunks of {chunk}: frames generated before the first piece / after close()", "frames",
                f"{made} / {len(generated)}", f"{chunk} / {chunk}")

# %% [markdown]
# On tiny these are milliseconds of overhead. On a full-size checkpoint the first piece costs the prefill plus
# `chunk` × (talker + code predictor) per frame plus one codec call, and the stream keeps up with playback only if
# a piece of `chunk` frames is generated and decoded faster than its `chunk × 80 ms` of audio (RTF < 1).
#
# The committed full-size runs (`python -m qtts_lib.bench stream`, `data/bench/stream/`) measure the same on a named
# machine: time to first audio per chunk size, then whole streams against `synthesize`, and the codec alone (one
# whole decode against incremental pieces of 4, the part of the stream's cost that `synthesize` does not pay).

# %%
stream_files = sorted((paths.DATA / "bench" / "stream").glob("*.json"))
for f in stream_files:
    res = json.loads(f.read_text())
    m = res["machine"]
    print(f"{f.name}: {res['checkpoint']}, {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB")
    display(pd.DataFrame({f"{r['threads']} threads": {f"first audio, pieces of {t['chunk_frames']} (ms)": t["ttfa_ms"]
                                                       for t in r["ttfa"]} for r in res["runs"]}))
    display(pd.DataFrame({f"{r['threads']} threads": r["ms_per_frame"] for r in res["runs"]})
            .rename_axis(f"ms per frame, {res['runs'][0]['frames']} frames, median of "
                         f"{len(res['runs'][0]['rounds_ms_per_frame']['stream'])}"))
if not stream_files:
    print("no committed streaming runs in data/bench/stream/: run `python -m qtts_lib.bench stream` on a quiet "
          "machine")

# %% [markdown]
# On the 2-core EPYC VM at 2 threads, a stream cost 253 ms per frame against 240 for `synthesize`: the 13 ms are the
# incremental codec's (49 against 40 ms per frame for the codec alone). At 1 thread the two agree within the codec's
# difference. First audio with pieces of 1 frame arrives in about 0.4–0.6 s: the prefill, one frame and one codec
# call. The row `stream_pool_kept` comes from an older `stream` that ran the loop in a worker thread: section 8 shows
# why it cost 416 ms per frame.

# %% [markdown]
# ## 8. Hand ncnn work to another thread
# The stream runs in the caller's thread, so nothing inside `Synthesizer` changes threads. A program around it
# may: `qtts serve` loads the model in its main thread and runs every ncnn call on one engine thread, and an
# application may load in one thread and speak from another. That hand-over has a cost you have to know about.
#
# ncnn parallelises with OpenMP, and GNU OpenMP keeps a pool of workers *for each thread that ran a parallel
# region*. The first thread's pool stays alive after it hands the work over. Once the process holds more OpenMP
# workers than there are CPUs, libgomp stops spinning between parallel regions and parks each worker in the kernel,
# so every one of the ~1000 small layers of a decoder step pays a wake-up. `release_threads()`
# (`omp_pause_resource_all` in each OpenMP runtime loaded) frees the calling thread's pool; the server's `Engine`
# calls it before its engine thread takes over.
#
# Counted, not timed, as `tests/test_threads.py` does: the talker decoder with one thread per CPU (so that two
# pools always outnumber the CPUs) runs a prefill in this thread, then 60 decode steps in this thread or in a new
# one, with this thread's pool kept or released; the count is the voluntary context switches of the thread that
# runs the steps.

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
    counted = {}

    def run_steps():
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        for x in embeds[1:]:
            net.forward(x, cache)
        counted["switches"] = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before

    if in_worker:
        worker = threading.Thread(target=run_steps)
        worker.start()
        worker.join()
    else:
        run_steps()
    return counted["switches"]


if cores < 2:
    print("skipped: with one CPU ncnn starts no OpenMP workers, so there is no pool to release")
else:
    switches = {"this thread": step_switches(False, False),
                "a worker thread, this thread's pool kept": step_switches(True, False),
                "a worker thread, after release_threads()": step_switches(True, True)}
    display(pd.DataFrame({f"voluntary context switches, 60 steps ({cores} threads)": switches}))
    kept, released = switches["a worker thread, this thread's pool kept"], switches[
        "a worker thread, after release_threads()"]
    check.at_least("a kept pool parks the worker thread's OpenMP workers (switches kept / released)", "ratio",
                   kept / max(released, 10), 4.0)

# %% [markdown]
# Released, the worker thread runs as this thread does. At full size on two cores a kept pool made decode steps about
# 2x slower, and whole streamed frames 1.6x slower: the 416 against 253 ms per frame of the committed runs above.

# %% [markdown]
# ## 9. Pipe it and serve it
# `qtts say --stream -o out.wav` writes the wav piece by piece, a complete file after each piece; `-o -` writes
# 16-bit PCM behind a WAV header of unknown length to stdout, which players reading a pipe accept. `qtts say`
# samples with the checkpoint's sampling; `--greedy`, `--seed`, `--temperature`, `--top-k`, `--top-p` and
# `--repetition-penalty` change it:
#
# ```
# qtts say --checkpoint tiny-base --voice data/inputs/voice.wav --text "Hello." -o - | ffplay -nodisp -autoexit -
# ```
#
# `qtts serve` (the `serve` extra: Starlette + uvicorn, pydantic, prometheus-client, PyAV) speaks OpenAI's speech
# API, streamed: wav, pcm, and mp3, Ogg Opus, ADTS AAC and FLAC encoded piece by piece as the pieces come
# (`audio.encode`). One engine thread runs every ncnn call, for a batch of requests (chapter 16); `--queue` more may
# wait, and past that the answer is 503. The request is a pydantic model (`app.schema`), described at
# `/openapi.json`; every bad request gets a 4xx with an OpenAI-style JSON error. A long input is spoken segment by
# segment with short pauses (`longform.stream_long`, chapter 15). The server samples by default too; a request may
# set `temperature`, `top_k`, `top_p`, `repetition_penalty`, `seed` or `greedy`. `/` is a page to try the voices,
# `/metrics` Prometheus's metrics, and `--api-key` asks clients for a bearer token. `tests/test_server.py` runs a
# real server and a 200-request soak from 4 clients in every format against it; `tests/test_server_sdk.py` speaks to
# it with OpenAI's own SDK, `tests/test_server_page.py` drives its page in headless Chromium.
#
# ```
# qtts serve --checkpoint tiny-base --voices voices/ --port 8000       # voices/alice.wav (+ alice.txt: ICL)
# curl -sN localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \
#      -d '{"input": "Hello from a stream.", "voice": "alice"}' | ffplay -nodisp -autoexit -
# curl -sN localhost:8000/v1/audio/speech -d '{"input": "Hi.", "voice": "alice", "response_format": "pcm",
#      "greedy": true}' | aplay -f S16_LE -r 24000 -c 1
# ```

# %% [markdown]
# The same app, in process (Starlette's test client instead of a socket). The good request sets two sampling
# fields, `temperature` and `seed`; its audio must be `stream_long`'s with the same sampling, and not the audio of
# the checkpoint's default sampling.

# %%
voices_dir = paths.outputs_dir(ckpt) / "14_voices"
voices_dir.mkdir(parents=True, exist_ok=True)
save_wav(voices_dir / "alice.wav", voice_wav)
name = synth.speakers[0] if synth.kind == "custom_voice" else "alice"
engine = server.Engine(synth, voices_dir, max_frames=20, chunk_frames=4, queue_places=4)
client = TestClient(server.build_app(engine, ckpt))
answer = client.post("/v1/audio/speech", json={"input": TEXT, "voice": name, "language": "english",
                                               "temperature": 0.7, "seed": 7})
served = np.frombuffer(answer.content[44:], "<i2").astype(int)
print(answer.status_code, answer.headers["content-type"], answer.content[:4], f"{len(served)} samples")


def spoken(sampling) -> np.ndarray:
    """What the server streams for TEXT (longform.stream_long, segments faded), as 16-bit samples."""
    wav = np.concatenate(list(longform.stream_long(synth, TEXT, "english", voice, sampling, max_frames=20,
                                                   chunk_frames=4)))
    return np.frombuffer(pcm16(wav), "<i2").astype(int)


asked, default = spoken(synth.sampling.replace(temperature=0.7, seed=7)), spoken(synth.sampling)
check.equal("served wav = stream_long with the request's sampling, 16-bit PCM", "max |diff| (LSB)",
            int(np.abs(served - asked).max()), 0)
check.at_least("the request's sampling reached the sampler (vs the default sampling)", "max |diff| (LSB)",
               int(np.abs(served - default).max()), 1)

# %% [markdown]
# Two bad requests: an unknown voice, and a temperature the sampler refuses. Both are answered 400 with an
# OpenAI-style error naming the field, before any audio.

# %%
bad_voice = client.post("/v1/audio/speech", json={"input": TEXT, "voice": "nobody"})
bad_temperature = client.post("/v1/audio/speech", json={"input": TEXT, "voice": name, "temperature": 0})
for bad, field in ((bad_voice, "voice"), (bad_temperature, "temperature")):
    print(bad.status_code, bad.json())
    check.equal(f"bad {field}: 400 naming `{field}`", "status param",
                f"{bad.status_code} {bad.json()['error']['param']}", f"400 {field}")
engine.stop()

# %% [markdown]
# ## Summary
# - The codec decoder's reach is bounded: R = pre-conv 2 + layers × 71 + 10 frames (154 tiny, 580 full size);
#   decoding a piece with R frames of left context reproduces the one-shot samples to float rounding.
# - The stream reproduces `Codec.decode` (one-shot up to 300 frames, the reference's `chunked_decode(300, 25)`
#   beyond) by never reaching left of the reference chunk's context. On the CPU it decodes every frame once
#   (`IncrementalDecode`); re-decoding each piece with its context, the GPU's way, costs about n/8 frames per frame.
# - `Synthesizer.stream` returns a `Stream` that generates in the caller's thread, a frame at a time; it makes
#   `synthesize`'s codes and wav at every chunk size tested, x-vector and ICL, and `.result` holds the `Result`.
# - First audio costs the prompt, `chunk` frames and one codec call; smaller chunks start sooner and cost more codec.
# - Running ncnn in a second thread needs `release_threads()` in the first, or the two OpenMP pools park each
#   other's workers. `qtts serve` runs ncnn on one engine thread, samples by default and takes sampling fields.
#
# **Artifacts left:** `data/outputs/<ckpt>/14_stream.wav`, `data/outputs/<ckpt>/14_voices/alice.wav`, the chapter
# report.
#
# **If your numbers differ**
# - *Stream ≈ 60 dB, not ≥ 100, past frame 300* → a context reaching left of the reference chunk's context
#   (`chunk_start − 25`): that is the one-shot decode, not what `Codec.decode` (and the reference) computes.
# - *Stream off by a whole piece, or SNR near 0 dB* → context samples not dropped (`(a − lo) · 1920`).
# - *ICL stream one sample short of `synthesize`* → expected: the reference's float-ratio cut (section 5).
# - *Stream codes differ from `synthesize`'s* → the two did not get the same `Sampling` (seed included), or the
#   sampler's random stream is shared between sequences instead of made per sequence (`pipeline.sampling.Sampler`).
# - *Incremental stream far from `decode_once` (say 40 dB) from its second piece on* → the transformer's mask or
#   rope rows not at the absolute positions after the cache (`rope.causal_mask(L, past, window)`), or a part's kept
#   context shorter than its measured reach (`codec_decoder.json`).
# - *Context curve never reaches 60 dB* → the mask's window or rope positions differ between calls of different
#   lengths (`rope.causal_mask(T, window=72)`, positions from 0 in every call).
# - *Released and kept pools count the same switches* → `release_threads()` found no OpenMP runtime (it returns
#   False): ncnn built without OpenMP, or an OpenMP other than GNU's, which may not park its workers this way.

# %%
check.table()
