"""Where a frame's time goes, graph call by graph call: each call's time against the time its weights take to read.
Introduced in 13.

    python -m qtts_lib.bench calls --checkpoint full-base --precision int8 --repeats 3 -o data/bench/calls/NAME.json

On the CPU the generation loop is memory-bound: a call of a graph reads every weight of it once. Two measures of
what reading them takes, both in the same process, every 8 frames between frames: (weight bytes) / (the numpy read
bandwidth, `machine.Probe`, as the loop benchmark's floor), and, for the int8 decoders, the same weights read by
the same kernels with nothing else: the decoder's projections alone, one graph (`projections.projections_graph`;
the predictor's with one head, as each of its calls runs one), called as a frame calls them (the predictor's 15
times in a row: where the last-level cache is large, its 81 MB of int8 weights partly stay there). What a call
takes beyond its projections alone (or, for a graph without them, beyond the probe's read time) is its *rest*,
what a runtime can still remove: layer calls, blobs in and out, the caches, activation quantization; between the
calls Python (`glue`: a frame's time less its calls'). Every call of the ncnn graphs is timed where it is made
(`binding.net.run`, which every graph of the loop goes through), in a fresh process per repeat.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import child
from .machine import Probe, describe
from .workload import LANGUAGE, TEXT
from .workload import voice as workload_voice

GRAPHS = ("talker_decoder", "talker_codec_head", "predictor_decoder", "predictor_heads")
PER_FRAME = {"predictor_decoder": 15}  # calls a frame makes in a row (a cache as large as 81 MB keeps some of them)


def weight_bytes_per_call(ncnn_dir: Path, precision: str, groups: int = 16) -> dict[str, int]:
    """The weight bytes one call of each loop graph reads in `precision`'s files (one predictor head per call)."""
    tier = ncnn_dir / "int8" if precision == "int8" else ncnn_dir
    size = lambda d, name: (d / f"{name}.bin").stat().st_size  # noqa: E731
    return {"talker_decoder": size(tier, "talker_decoder"), "talker_codec_head": size(ncnn_dir, "talker_codec_head"),
            "predictor_decoder": size(tier, "predictor_decoder"),
            "predictor_heads": size(tier, "predictor_heads") // (groups - 1)}


def profile(model_dir: str, frames: int, threads: int, precision: str = "int8") -> dict:
    """One process: `frames` greedy frames of the workload after a warm-up utterance, every graph call timed by
    graph (decoder calls of one position only: the steps, not the prefill), each frame timed whole."""
    from ..runtime import Sampling, Synthesizer
    from ..runtime.binding import cached, net

    synth = Synthesizer(model_dir, threads=threads, precision=precision)
    voice = workload_voice(synth)  # Base: the clip's x-vector; CustomVoice: a speaker; VoiceDesign: a description
    greedy = Sampling(greedy=True)
    synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=8)  # warm: first-touch memory, thread pools
    spent: dict[str, list[float]] = defaultdict(list)
    timing = [False]

    def timed(original):
        def wrapper(graph, inputs, outputs, **kwargs):
            t0 = time.perf_counter()
            out = original(graph, inputs, outputs, **kwargs)
            if timing[0]:
                spent[kwargs.get("name", "graph")].append(time.perf_counter() - t0)
            return out
        return wrapper

    kernels = projection_nets(Path(model_dir) / "ncnn", threads, precision)
    kernel_s: dict[str, list[float]] = defaultdict(list)
    saved = net.run, cached.run
    net.run, cached.run = timed(net.run), timed(cached.run)
    probe = Probe(threads)
    try:
        loop = synth.loop
        job = synth.jobs.build(TEXT, LANGUAGE, voice, greedy, frames)
        seq = loop.start(job.prompt, job.sampler, frames)
        frame_s = []
        for n in range(frames):
            probe(n)
            if n % 8 == 0:  # a frame of projections alone: the talker's once, the predictor's 15 times in a row
                for name, (graph, inputs) in kernels.items():
                    took = []
                    for _ in range(PER_FRAME.get(name, 1)):
                        t0 = time.perf_counter()
                        saved[0](graph, inputs, ["out0"])
                        took.append(time.perf_counter() - t0)
                    kernel_s[name].append(sum(took) / len(took))  # the first cold, as a frame's first call
            timing[0] = True
            t0 = time.perf_counter()
            made = loop.step(seq)
            frame_s.append(time.perf_counter() - t0)
            timing[0] = False
            if made is None:
                break
        probe()
    finally:
        net.run, cached.run = saved
    made = len(frame_s)
    return {"frames": made, "frame_ms": 1000 * statistics.mean(frame_s),
            "frame_median_ms": 1000 * statistics.median(frame_s),
            "calls": {k: {"calls_per_frame": len(v) / made, "ms_per_call": 1000 * statistics.median(v),
                          "ms_per_frame": 1000 * sum(v) / made} for k, v in spent.items()},
            "projections_ms_per_call": {k: 1000 * statistics.median(v) for k, v in kernel_s.items()},
            "read_bandwidth_gbs": probe.gbs}


def projection_nets(ncnn_dir: Path, threads: int, precision: str) -> dict:
    """The int8 decoders' projections alone (`projections.projections_graph`; the predictor's with one head), as
    nets with their inputs: graph name -> (net, inputs). Empty for another tier."""
    if precision != "int8":
        return {}
    from ..runtime.binding.net import net_from_text
    from .projections import decoder_projections

    rng, out = np.random.default_rng(0), {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("talker_decoder", "predictor_decoder"):
            text, data, _, inputs = decoder_projections(ncnn_dir, name, rng)
            f = Path(tmp) / f"{name}.bin"
            f.write_bytes(data)
            out[name] = (net_from_text(text, f, threads), inputs)
    return out


def report(runs: list[dict], weights: dict[str, int]) -> dict:
    """Medians over runs, per graph: ms per call; the weight-read ms at the runs' probed bandwidth; the projections
    alone where measured; the rest (beyond the projections alone, else beyond the probe's read); and per frame: the
    calls, their reads, the rest and the glue (a frame less its calls). Per frame is a run's mean over its frames, for
    the frame as for its calls, so that the glue is what the calls leave of the same frames. A predictor run with its
    heads in its graph (no `predictor_heads` calls) reads one head per decoder call."""
    gbs = statistics.median(statistics.median(r["read_bandwidth_gbs"]) for r in runs)
    med = statistics.median
    weights = dict(weights)
    if not any("predictor_heads" in r["calls"] for r in runs):
        weights["predictor_decoder"] += weights.pop("predictor_heads")
    graphs, floor, calls_ms = {}, 0.0, 0.0
    for g in sorted({k for r in runs for k in r["calls"]}, key=lambda k: (k not in GRAPHS, k)):
        per_frame = med([r["calls"].get(g, {}).get("ms_per_frame", 0.0) for r in runs])
        n = med([r["calls"].get(g, {}).get("calls_per_frame", 0.0) for r in runs])
        ms = med([r["calls"][g]["ms_per_call"] for r in runs if g in r["calls"]])
        read = weights.get(g, 0) / (gbs * 1e9) * 1000
        kernel = [r["projections_ms_per_call"][g] for r in runs if g in r.get("projections_ms_per_call", {})]
        least = med(kernel) if kernel else read
        graphs[g] = {"calls_per_frame": round(n, 2), "ms_per_call": round(ms, 3),
                     "weight_mb": round(weights.get(g, 0) / 1e6, 1), "probe_read_ms_per_call": round(read, 3),
                     "projections_ms_per_call": round(med(kernel), 3) if kernel else None,
                     "rest_ms_per_call": round(ms - least, 3), "ms_per_frame": round(per_frame, 2),
                     "rest_ms_per_frame": round(per_frame - n * least, 2)}
        floor += n * least
        calls_ms += per_frame
    frame = med([r["frame_ms"] for r in runs])
    return {"read_bandwidth_gbs": round(gbs, 1), "frame_ms": round(frame, 1), "calls_ms": round(calls_ms, 1),
            "weights_ms": round(floor, 1), "rest_ms": round(frame - floor, 1),
            "rest_in_calls_ms": round(calls_ms - floor, 1), "glue_ms": round(frame - calls_ms, 1), "graphs": graphs}


def calls_benchmark(model_dir: Path, frames: int, threads: int, repeats: int = 3, precision: str = "int8",
                    progress: bool = True, against: Path | None = None) -> dict:
    """`profile` in `repeats` fresh processes and their `report` (data/bench/calls/). `against`: another source tree
    (a worktree of an older commit holding this module) measured the same way, its processes taken in turn with
    this tree's, reported beside it (`against`)."""
    from tqdm.auto import tqdm

    from ..runtime.pipeline.precision import ensure_int8_tier
    from .serve import tree_commit

    ncnn_dir = Path(model_dir) / "ncnn"
    ensure_int8_tier(ncnn_dir, log=print, tier=precision)  # an int8 tier's files, before anything is timed
    trees = [None] + ([str(Path(against).resolve())] if against else [])
    runs: dict = {t: [] for t in trees}
    with tqdm(total=repeats * len(trees), desc="calls", unit="run", disable=not progress) as bar:
        for _ in range(repeats):
            for tree in trees:
                runs[tree].append(child.run("calls", "profile", threads, tree=tree, model_dir=str(Path(model_dir)
                                            .resolve()), frames=frames, threads=threads, precision=precision))
                bar.update(1)
    weights = weight_bytes_per_call(ncnn_dir, precision)
    here = Path(__file__).resolve().parents[2]
    result = {"what": "the generation loop's graph calls, one position each (the talker's step, its codec head, the "
                      "predictor's 15 steps, with their heads or apart), against the time their weights take to "
                      "read: the int8 decoders' projections alone (same weights, same kernels, one graph), else the "
                      "weight bytes at the numpy read bandwidth measured while they ran; rest = a call's time beyond "
                      "that; weights_ms = a frame's sum of those; glue = a frame less its calls "
                      "(python -m qtts_lib.bench calls)",
              "checkpoint": Path(model_dir).name, "precision": precision, "threads": threads, "frames": frames,
              "machine": describe([threads]), "text": TEXT, "commit": tree_commit(here),
              "per_frame": report(runs[None], weights), "runs": runs[None]}
    if against:
        result["against"] = {"tree": trees[1], "commit": tree_commit(Path(trees[1])),
                             "per_frame": report(runs[trees[1]], weights), "runs": runs[trees[1]]}
    return result
