"""Streaming, measured: how much left context a piece needs, time to first audio, a stream against `synthesize`.
Introduced in 14.

    python -m qtts_lib.bench stream --checkpoint full-base --threads 1,2 --repeats 3 -o data/bench/stream/NAME.json

The analysis helpers (`decode_with_context`, `context_snr`, `smallest_context`) are what chapter 14 draws its
context curve with; the runtime streams exactly (`runtime.codec.stream.StreamDecoder`) and needs none of them.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from ..check import snr_db
from ..runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav
from . import child
from .machine import describe
from .workload import LANGUAGE, TEXT, voice_wav

STREAM_CHUNKS = (1, 2, 4, 8)


# ------------------------------------------------------------ how much left context
def decode_with_context(codec, codes: np.ndarray, start: int, stop: int, context: int) -> np.ndarray:
    """Samples of frames [start, stop) decoded from codes[start - context : stop] (context clipped at 0)."""
    lo = max(0, start - context)
    return codec.decode_once(codes[lo:stop])[(start - lo) * SAMPLES_PER_FRAME:]


def context_snr(codec, codes: np.ndarray, start: int, stop: int, contexts) -> list[float]:
    """SNR (dB) of frames [start, stop) decoded with each left context vs the one-shot decode of [0, stop)."""
    ref = codec.decode_once(codes[:stop])[start * SAMPLES_PER_FRAME:]
    return [snr_db(decode_with_context(codec, codes, start, stop, c), ref) for c in contexts]


def smallest_context(contexts, snrs, min_db: float = 60.0) -> int | None:
    """The smallest context from which every larger one measured reaches min_db (None if none does)."""
    ok = [c for i, c in enumerate(contexts) if all(s >= min_db for s in snrs[i:])]
    return min(ok) if ok else None


# ------------------------------------------------------------ time to first audio
def ttfa_ms(synth, text: str, language: str, voice, chunk_frames: int = 4, repeats: int = 3, **kwargs) -> dict:
    """Time to first audio: from calling `stream` to its first piece, median of `repeats` (ms).

    Each run stops after the first piece. The prompt, prefill, chunk_frames frames and one codec call are
    inside; loading the graphs and building the voice are not (a server does those once)."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with synth.stream(text, language, voice, chunk_frames=chunk_frames, **kwargs) as pieces:
            next(pieces)
            runs.append((time.perf_counter() - t0) * 1000.0)
    return {"ttfa_ms": float(np.median(runs)), "runs_ms": runs, "chunk_frames": chunk_frames,
            "ms_per_chunk_of_audio": chunk_frames * SAMPLES_PER_FRAME / SAMPLE_RATE * 1000.0}


# ------------------------------------------------------------ whole streams
def stream_rounds(model_dir: str, frames: int, threads: int, repeats: int = 3, chunks=STREAM_CHUNKS) -> dict:
    """In this process, one loaded Synthesizer: time to first audio per chunk size (`ttfa_ms`, median of
    `repeats`), then `repeats` interleaved rounds of `synthesize` vs `stream` (pieces of 4), each `frames` greedy
    frames, whole ms per frame (loop + decode; the stream's decode is incremental); and, to tell the two apart, the
    codec alone on the codes made: one whole decode vs an incremental one fed 4 frames at a time."""
    from ..runtime import Sampling, Synthesizer

    synth = Synthesizer(model_dir, threads=threads)
    voice = synth.voice(wav=load_wav(voice_wav()))
    greedy = Sampling(greedy=True)
    ttfa = [ttfa_ms(synth, TEXT, LANGUAGE, voice, chunk_frames=c, repeats=repeats, sampling=greedy, max_frames=frames)
            for c in chunks]
    codes = synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=frames).codes

    def timed(kind: str) -> float:
        t0 = time.perf_counter()
        if kind == "synthesize":
            made = len(synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=frames).codes)
        elif kind == "stream":
            stream = synth.stream(TEXT, LANGUAGE, voice, greedy, max_frames=frames, chunk_frames=4)
            for _ in stream:
                pass
            made = len(stream.result.codes)
        elif kind == "codec_whole":
            synth.codec.decode(codes)
            made = len(codes)
        else:
            inc = synth.codec.incremental()
            for a in range(0, len(codes), 4):
                inc.push(codes[a:a + 4])
            made = len(codes)
        return (time.perf_counter() - t0) * 1000.0 / made

    kinds = ("synthesize", "stream", "codec_whole", "codec_pieces_of_4")
    rounds = {k: [] for k in kinds}
    for _ in range(repeats):
        for k in kinds:
            rounds[k].append(round(timed(k), 1))
    return {"threads": threads, "frames": frames,
            "ttfa": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in t.items() if k != "runs_ms"}
                     | {"runs_ms": [round(x, 1) for x in t["runs_ms"]]} for t in ttfa],
            "ms_per_frame": {k: statistics.median(v) for k, v in rounds.items()}, "rounds_ms_per_frame": rounds}


def stream_benchmark(model_dir: Path, frames: int, thread_counts: list[int], repeats: int = 3) -> dict:
    """`stream_rounds` per thread count, each in a fresh child process (data/bench/stream/)."""
    runs = [child.run("stream", "stream_rounds", t, model_dir=str(model_dir), frames=frames, threads=t,
                      repeats=repeats) for t in thread_counts]
    return {"what": "streaming with the ncnn runtime, fp32, greedy, x-vector: time to first audio per chunk size "
                    "(Synthesizer.stream to its first piece; loading and the voice outside), whole ms per frame "
                    "of synthesize vs stream (pieces of 4), and the codec alone: one whole decode vs incremental "
                    "pieces of 4 (python -m qtts_lib.bench stream)",
            "checkpoint": Path(model_dir).name, "machine": describe(thread_counts), "text": TEXT, "runs": runs}
