"""Streaming, measured: how much left context a piece needs, time to first audio, a stream against `synthesize`.
Introduced in 15.

    python -m qtts_lib.bench stream --checkpoint full-base --threads 1,2 --repeats 3 -o data/bench/stream/NAME.json

The analysis helpers (`decode_with_context`, `context_snr`, `smallest_context`) are what chapter 15 draws its
context curve with; the runtime streams exactly (`runtime.codec.stream.StreamDecoder`) and needs none of them.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from ..check import snr_db
from ..runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav
from ..runtime.codec.stream import StreamDecoder
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


def gapless_from_ms(arrivals: list[tuple[float, int]]) -> float:
    """The earliest time (ms after `stream` was called) from which playback never waits for a piece: each piece
    must have arrived (its seconds since the call, its samples) before the audio in front of it has played. Pieces
    that come faster than they play give the first piece's arrival; a stream slower than playback pushes it later
    by its lag, which grows with the utterance's length."""
    start, played = 0.0, 0
    for seconds, samples in arrivals:
        start = max(start, seconds - played / SAMPLE_RATE)
        played += samples
    return 1000.0 * start


# ------------------------------------------------------------ whole streams
def first_audio_parts(synth, voice, sampling, frames: int) -> dict:
    """Time to first audio in its parts (ms), each timed alone in the order a stream runs them: the prompt, its
    prefill (from the voice's kept head, as a stream after an utterance in that voice prefills: only the text;
    `scheduler.Prefixes`), the first frame (codec head + the code predictor: the talker's step after it waits for
    the second frame), the first piece of a stream in pieces of one frame (an eighth of a frame where the first
    piece comes in pieces, `codec.stream.StreamDecoder.drain`)."""
    t0 = time.perf_counter()
    job = synth.jobs.build(TEXT, LANGUAGE, voice, sampling, frames)
    t1 = time.perf_counter()
    prefixes, head = getattr(synth, "prefixes", None), getattr(job.prompt, "head", 0)  # none in an older tree
    kept = prefixes.get(job.prompt.embeds[:head]) if prefixes is not None and head else None
    seq = synth.loop.start(job.prompt, job.sampler, frames, prefix=kept)
    t2 = time.perf_counter()
    frame = synth.loop.step(seq)
    t3 = time.perf_counter()
    StreamDecoder(synth.codec, chunk_frames=1).push(frame.codes)  # its first piece, as a stream's
    t4 = time.perf_counter()
    return {"prompt": 1000 * (t1 - t0), "prefill": 1000 * (t2 - t1), "first_frame": 1000 * (t3 - t2),
            "first_piece_decode": 1000 * (t4 - t3)}


def stream_rounds(model_dir: str, frames: int, threads: int, repeats: int = 3, chunks=STREAM_CHUNKS,
                  precision: str = "fp32", codec_precision: str = "fp32") -> dict:
    """In this process, one loaded Synthesizer (`precision`, `codec_precision`): after one utterance spoken to warm
    it, time to first audio per chunk size (`ttfa_ms`, median of `repeats`) and its parts (`first_audio_parts`),
    then `repeats` interleaved rounds of `synthesize` vs `stream` in pieces of 1 and of 4 frames, each `frames`
    greedy frames, whole ms per frame (loop + decode; the stream's decode is incremental); and, to tell the two
    apart, the codec alone on the codes made: one whole decode vs incremental ones fed 1 and 4 frames at a time."""
    from ..runtime import Sampling, Synthesizer

    synth = Synthesizer(model_dir, threads=threads, precision=precision, codec_precision=codec_precision)
    voice = synth.voice(wav=load_wav(voice_wav()))
    greedy = Sampling(greedy=True)
    codes = synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=frames).codes  # also warms the process
    ttfa = [ttfa_ms(synth, TEXT, LANGUAGE, voice, chunk_frames=c, repeats=repeats, sampling=greedy, max_frames=frames)
            for c in chunks]
    parts = [first_audio_parts(synth, voice, greedy, frames) for _ in range(repeats)]

    gapless: dict[str, list[float]] = {}

    def timed(kind: str) -> float:
        t0 = time.perf_counter()
        if kind == "synthesize":
            made = len(synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=frames).codes)
        elif kind.startswith("stream_"):
            stream = synth.stream(TEXT, LANGUAGE, voice, greedy, max_frames=frames, chunk_frames=int(kind[7:]))
            arrivals = [(time.perf_counter() - t0, len(piece)) for piece in stream]
            gapless.setdefault(kind[7:], []).append(round(gapless_from_ms(arrivals), 1))
            made = len(stream.result.codes)
        elif kind == "codec_whole":
            synth.codec.decode(codes)
            made = len(codes)
        else:
            piece = int(kind.rsplit("_", 1)[1])
            inc = synth.codec.incremental()
            for a in range(0, len(codes), piece):
                inc.push(codes[a:a + piece])
            made = len(codes)
        return (time.perf_counter() - t0) * 1000.0 / made

    kinds = ("synthesize", "stream_1", "stream_2", "stream_4", "codec_whole", "codec_pieces_of_1", "codec_pieces_of_4")
    rounds = {k: [] for k in kinds}
    for _ in range(repeats):
        for k in kinds:
            rounds[k].append(round(timed(k), 1))
    return {"threads": threads, "frames": frames, "precision": precision, "codec_precision": codec_precision,
            "ttfa": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in t.items() if k != "runs_ms"}
                     | {"runs_ms": [round(x, 1) for x in t["runs_ms"]]} for t in ttfa],
            "first_audio_parts_ms": {k: round(statistics.median(p[k] for p in parts), 1) for k in parts[0]},
            "ms_per_frame": {k: statistics.median(v) for k, v in rounds.items()}, "rounds_ms_per_frame": rounds,
            "gapless_from_ms": {k: statistics.median(v) for k, v in gapless.items()}, "gapless_rounds_ms": gapless}


def stream_benchmark(model_dir: Path, frames: int, thread_counts: list[int], repeats: int = 3,
                     tiers=(("fp32", "fp32"),), against: Path | None = None, huge_pages=(False,)) -> dict:
    """`stream_rounds` per thread count and (loop tier, codec tier), each in `repeats` fresh child processes taken
    in turn (data/bench/stream/); per row the medians over the processes. `against`: another source tree (a
    worktree of an older commit holding this module), its processes taken in turn with this tree's, its rows marked
    with its commit. Each of `huge_pages` (False, True) is a row of its own (the children started with glibc's
    malloc asking for huge pages or not, `runtime.app.hugepages`: `qtts serve` runs with them)."""
    from .serve import tree_commit

    here = Path(__file__).resolve().parents[2]
    trees = [None] + ([str(Path(against).resolve())] if against else [])
    runs = {(tree, t, p, c, h): [] for tree in trees for t in thread_counts for p, c in tiers for h in huge_pages}
    for _ in range(repeats):
        for (tree, t, p, c, h), done in runs.items():
            done.append(child.run("stream", "stream_rounds", t, tree=tree, huge_pages=h,
                                  model_dir=str(Path(model_dir).resolve()), frames=frames, threads=t, repeats=repeats,
                                  precision=p, codec_precision=c))
    rows = []
    for (tree, t, p, c, h), done in runs.items():
        ms = {k: statistics.median(r["ms_per_frame"][k] for r in done) for k in done[0]["ms_per_frame"]}
        ttfa = {str(x["chunk_frames"]): statistics.median(r["ttfa"][i]["ttfa_ms"] for r in done)
                for i, x in enumerate(done[0]["ttfa"])}
        parts = {k: statistics.median(r["first_audio_parts_ms"][k] for r in done)
                 for k in done[0]["first_audio_parts_ms"]}
        gapless = {k: statistics.median(r["gapless_from_ms"][k] for r in done) for k in done[0]["gapless_from_ms"]}
        rows.append({"commit": tree_commit(Path(tree) if tree else here), "threads": t, "precision": p,
                     "codec_precision": c, "huge_pages": h, "processes": len(done),
                     "ms_per_frame": {k: round(v, 1) for k, v in ms.items()},
                     "rtf": {k: round(v / 80.0, 3) for k, v in ms.items() if not k.startswith("codec")},
                     "stream_1_over_synthesize": round(ms["stream_1"] / ms["synthesize"], 3),
                     "ttfa_ms": {k: round(v, 1) for k, v in ttfa.items()},
                     "first_audio_parts_ms": {k: round(v, 1) for k, v in parts.items()},
                     "gapless_from_ms": {k: round(v, 1) for k, v in gapless.items()}})
    return {"what": "streaming with the ncnn runtime, greedy, x-vector, after one utterance in the process: time to "
                    "first audio per chunk size (Synthesizer.stream to its first piece; loading and the voice "
                    "outside) and its parts, whole ms per frame of synthesize vs stream in pieces of 1, 2 and 4 "
                    "frames, the time from which playback of those streams never waits for a piece "
                    "(gapless_from_ms, from calling stream), and the codec alone: one whole decode vs "
                    "incremental pieces of 1 and 4; per row the medians of fresh processes "
                    "(python -m qtts_lib.bench stream)",
            "checkpoint": Path(model_dir).name, "machine": describe(thread_counts), "text": TEXT, "frames": frames,
            "rows": rows, "runs": [r | {"commit": row["commit"]} for row, done in zip(rows, runs.values())
                                   for r in done]}
