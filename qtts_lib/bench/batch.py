"""Many utterances at once: throughput of the batched loop against the batch size. Introduced in 17.

    python -m qtts_lib.bench batch --checkpoint full-base --batch 1,2,4,8,16 --precision fp32,int8 --threads 2 \\
        --frames 40 --repeats 3 [--codec-precision fp32,bf16] -o data/bench/NAME.json

Each run, in a fresh process (`bench.child`), speaks B utterances of `frames` frames (the workload's voice and
text with a different last sentence each, greedy) through one `Scheduler` of B places, each with a whole decode
at its end, as `Synthesizer.synthesize_many` does. Runs are interleaved over (precision, B) and repeated; rows hold
medians. A row is data/bench's schema with `batch` = B, its times per *aggregate* frame (every sequence's frames
counted): talker and predictor are the loop's calls, shared by the B sequences; codec the B decodes, one after
another; `rtf` the aggregate real-time factor (wall time over the audio of all B utterances). Besides:
`frames_per_s` (aggregate), `sequence_ms_per_frame` (how fast each utterance advances: the wall time over its own
frames), `codec_share` (of the wall time), and the floor: the bytes one step reads over the measured bandwidth,
shared by the B frames it makes.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from ..runtime.audio.wav import FRAME_RATE, load_wav
from . import child
from .machine import Probe, describe
from .results import check_schema
from .workload import LANGUAGE, TEXT, voice_wav, weight_bytes_per_frame
from .workload import voice as workload_voice


def texts(batch: int) -> list[str]:
    """B different texts (the workload's, each with its own last sentence), so no two sequences are alike."""
    return [f"{TEXT} This is sentence number {i + 1}." for i in range(batch)]


def run_batch(model_dir: str, frames: int, threads: int, batch: int, precision: str = "fp32",
              codec_precision: str = "fp32", device: str = "cpu") -> dict:
    """One measurement: B utterances through a Scheduler of B places (module docstring); on a GPU the loop's
    graphs that batch (`gpu_batches`) at every B."""
    from ..runtime import Sampling, Synthesizer
    from ..runtime.pipeline.synthesizer import Scheduler, Utterance

    probe = Probe(threads)
    synth = Synthesizer(model_dir, threads=threads, precision=precision, codec_precision=codec_precision,
                        device=device, gpu_batches=device != "cpu")
    voice = workload_voice(synth)  # Base: the clip's x-vector; CustomVoice: a speaker; VoiceDesign: a description
    scheduler = Scheduler(synth, batch)
    tickets = [scheduler.submit(Utterance(t, LANGUAGE, voice, Sampling(greedy=True), max_frames=frames))
               for t in texts(batch)]
    probe()
    steps, probed, t0 = 0, probe.seconds, time.perf_counter()
    while scheduler:
        scheduler.step()
        steps += 1
        probe(steps)  # every PROBE_EVERY steps, between them; its time is taken off below
    wall = time.perf_counter() - t0 - (probe.seconds - probed)
    probe()
    results = [t.result for t in tickets]
    return {"batch": batch, "frames": sum(len(r.codes) for r in results), "steps": steps, "wall_s": wall,
            "prefill_s": sum(r.seconds["prefill"] for r in results),
            "talker_s": max(r.seconds["talker"] for r in results),
            "predictor_s": max(r.seconds["predictor"] for r in results),
            "codec_s": sum(r.seconds["codec"] for r in results),
            "peak_rss_gb": probe.peak_rss_gb(), "read_bandwidth_gbs": probe.gbs}


def row(precision: str, threads: int, batch: int, runs: list[dict], step_bytes: int, codec: str = "fp32",
        device: str = "cpu") -> dict:
    """A schema row (times per aggregate frame) from repeated runs: medians."""
    med = lambda f: statistics.median(f(r) for r in runs)  # noqa: E731
    per = lambda key: med(lambda r: 1000 * r[key] / r["frames"])  # noqa: E731
    ms = {k: per(f"{k}_s") for k in ("talker", "predictor", "codec")}
    ms["total"] = med(lambda r: 1000 * r["wall_s"] / r["frames"])
    floors = [step_bytes / (statistics.median(r["read_bandwidth_gbs"]) * 1e9) * 1000 / batch for r in runs]
    return {
        "runtime": "ncnn", "device": device, "precision": precision, "codec_precision": codec, "threads": threads,
        "batch": batch,
        "ms_per_frame": {k: round(v, 1) for k, v in ms.items()},
        "prefill_ms": round(med(lambda r: 1000 * r["prefill_s"] / batch), 1),
        "rtf": round(ms["total"] * FRAME_RATE / 1000, 3),
        "frames_per_s": round(med(lambda r: r["frames"] / r["wall_s"]), 2),
        "sequence_ms_per_frame": round(med(lambda r: 1000 * r["wall_s"] / (r["frames"] / batch)), 1),
        "codec_share": round(med(lambda r: r["codec_s"] / r["wall_s"]), 3),
        "peak_rss_gb": round(max(r["peak_rss_gb"] for r in runs), 2),
        "floor_ms_per_frame": round(statistics.median(floors), 1) if device == "cpu" else None,
        "floor_ratio": round(statistics.median((ms["talker"] + ms["predictor"]) / f for f in floors), 2)
        if device == "cpu" else None,  # a GPU loop is bound by round trips, not by the host's memory
        "repeats": len(runs),
    }


def benchmark(model_dir: Path, frames: int, batches: list[int], precisions: list[str], threads: int,
              repeats: int, progress: bool = True, codecs: list[str] = ("fp32",), device: str = "cpu") -> dict:
    """Interleaved repeats of every (precision, codec precision, B); the result in data/bench's schema, a row
    each."""
    from tqdm.auto import tqdm

    machine = describe([threads])
    ncnn_dir = Path(model_dir) / "ncnn"
    from ..runtime.pipeline.precision import ensure_int8_tier

    for p in precisions:  # each int8 tier's files written before anything is timed (the others have none)
        ensure_int8_tier(ncnn_dir, log=print, tier=p)
    runs: dict[tuple, list[dict]] = {(p, c, b): [] for p in precisions for c in codecs for b in batches}
    with tqdm(total=repeats * len(runs), desc="batch bench", unit="run", disable=not progress) as bar:
        for _ in range(repeats):
            for (precision, codec, batch), done in runs.items():
                bar.set_postfix_str(f"{precision} codec {codec} B={batch}")
                done.append(child.run("batch", "run_batch", threads, model_dir=str(model_dir), frames=frames,
                                      threads=threads, batch=batch, precision=precision, codec_precision=codec,
                                      device=device))
                bar.update(1)
    machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    rows = [row(p, threads, b, done, weight_bytes_per_frame(ncnn_dir, precision=p), c, device)
            for (p, c, b), done in runs.items()]
    raw = [{"precision": p, "codec_precision": c, "threads": threads, **run} for (p, c, b), done in runs.items()
           for run in done]
    result = {"machine": machine, "checkpoint": Path(model_dir).name, "frames": frames, "text": TEXT,
              "rows": rows, "raw": raw}
    check_schema(result)
    return result


def parity(model_dir: Path, frames: int = 200, batch: int = 4, precision: str = "fp32", threads: int = 2) -> dict:
    """Each of `batch` different prompts (x-vector and ICL clones, text trailing and in the prompt: four lengths,
    so the batch pads) run alone and in one batch, greedy, `frames` frames: per sequence, whether the codes are
    equal, and the first frame where they differ (float reassociation: M-row kernels, attention over padding)."""
    import numpy as np

    from .. import paths
    from ..runtime import Sampling, Synthesizer
    from ..runtime.pipeline.loop import Batch
    from ..runtime.pipeline.sampling import Sampler

    synth = Synthesizer(model_dir, threads=threads, precision=precision)
    clip = load_wav(voice_wav())
    xvec = synth.voice(wav=clip)
    icl = synth.voice(wav=clip, text=(paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip())
    kinds = [(xvec, False, "x-vector, text trailing"), (xvec, True, "x-vector, text in the prompt"),
             (icl, False, "ICL, text trailing"), (icl, True, "ICL, text in the prompt")]
    prompts, labels = [], []
    for i, text in enumerate(texts(batch)):
        voice, non_streaming, label = kinds[i % len(kinds)]
        prompts.append(synth.prompt(text, LANGUAGE, voice, non_streaming=non_streaming))
        labels.append(label)
    greedy = lambda: Sampler(Sampling(greedy=True), synth.config.talker)  # noqa: E731
    alone = [synth.loop.run(p, greedy(), frames) for p in prompts]
    together = Batch(synth.loop, batch)
    seqs = [together.add(p, greedy(), frames) for p in prompts]
    while together:
        together.step()
    out = []
    for label, p, a, b in zip(labels, prompts, alone, seqs):
        ca, cb = np.stack(a.codes), np.stack(b.codes)
        n = min(len(ca), len(cb))
        diff = [f for f in range(n) if not np.array_equal(ca[f], cb[f])]
        out.append({"prompt": label, "prompt_rows": int(p.embeds.shape[0]), "frames_alone": len(ca),
                    "frames_batched": len(cb), "equal": len(ca) == len(cb) and not diff,
                    "first_differing_frame": diff[0] if diff else None,
                    "codes_equal_fraction": round(float((ca[:n] == cb[:n]).mean()), 4)})
    return {"machine": describe([threads]), "checkpoint": Path(model_dir).name, "precision": precision,
            "frames": frames, "batch": batch, "sequences": out}
