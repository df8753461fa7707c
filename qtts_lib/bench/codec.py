"""The codec alone, ncnn against PyTorch, in one process. Introduced in 12.

    python -m qtts_lib.bench codec --checkpoint full-base --threads 1,2 --rounds 9 -o data/bench/codec/NAME.json
    python -m qtts_lib.bench codec --tiers fp32,bf16 --checkpoint full-base --threads 1,2 -o data/bench/codec/NAME.json

A generation run's codec time is one decode per process, which process-to-process spread swamps; here both codecs
decode the same random codes in one process, in alternating rounds, and the codec's FLOPs per frame (PyTorch's
`FlopCounterMode` on the reference's decode) are held against the machine's measured sgemm peak: the codec is
compute-bound, so that ratio says how much better any runtime could do.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from .machine import describe


def codec_rounds(model_dir: Path, threads: int, frames: int = 40, rounds: int = 9, seed: int = 0,
                 progress: bool = True) -> dict:
    """The codec alone: the runtime's `Codec` (its CPU form, `codec.cpu_form`) against the reference's
    `speech_tokenizer.decode` on the same random codes and thread count, in this one process, `rounds` rounds
    with the order alternating (ncnn first in even rounds). A generation run's codec time is one decode per
    process, which process-to-process spread swamps; this holds everything else still. ms per frame; the wav SNR
    of ncnn against PyTorch is measured on the same call, the fresh memory each side's first decode touches
    (minor page faults: on a VM, first touches are slow), and the codec's FLOPs per frame against the machine's
    measured peak (`codec_flops_per_frame`, `peak_gflops`)."""
    import torch
    from tqdm.auto import tqdm

    from .. import check, reference
    from ..runtime.codec.decoder import Codec

    model_dir = Path(model_dir)
    config = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    torch.set_num_threads(threads)
    tokenizer = reference.load(model_dir, threads=threads).model.speech_tokenizer
    t0 = time.perf_counter()
    codec = Codec(model_dir / "ncnn", config, threads)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, config["codebook_size"], (frames, config["num_quantizers"]))  # what the loop emits
    sides = {"ncnn": lambda: codec.decode(codes),
             "pytorch": lambda: tokenizer.decode([{"audio_codes": torch.from_numpy(codes)}])[0][0]}
    wavs, fresh = {}, {}
    for k, fn in sides.items():  # warm-up and the parity; the first decode's fresh pages (what it first touches)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wavs[k] = np.asarray(fn(), np.float32).reshape(-1)
        fresh[k] = round((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / 2**20)
    times: dict[str, list[float]] = {k: [] for k in sides}
    load_before = [round(x, 2) for x in os.getloadavg()]
    for r in tqdm(range(rounds), desc=f"codec {threads} threads", unit="round", disable=not progress):
        for k in (("ncnn", "pytorch") if r % 2 == 0 else ("pytorch", "ncnn")):
            t = time.perf_counter()
            sides[k]()
            times[k].append(1000 * (time.perf_counter() - t) / frames)
    med = {k: statistics.median(v) for k, v in times.items()}
    flops = codec_flops_per_frame(tokenizer, codes)
    peak = peak_gflops(threads)
    return {"threads": threads, "frames": frames, "rounds": rounds, "load_before": load_before,
            "gflop_per_frame": round(flops / 1e9, 3), "peak_gflops": round(peak, 1),
            "achieved_gflops": {k: round(flops / (v / 1000) / 1e9, 1) for k, v in med.items()},
            "fraction_of_peak": {k: round(flops / (v / 1000) / 1e9 / peak, 3) for k, v in med.items()},
            "load_after": [round(x, 2) for x in os.getloadavg()], "ncnn_load_s": round(load_s, 2),
            "snr_ncnn_vs_pytorch_db": round(float(check.snr_db(wavs["ncnn"], wavs["pytorch"])), 1),
            "first_decode_fresh_mb": fresh, "median_ms_per_frame": {k: round(v, 1) for k, v in med.items()},
            "ratio_ncnn_pytorch": round(med["ncnn"] / med["pytorch"], 3),
            "ratio_per_round": [round(a / b, 3) for a, b in zip(times["ncnn"], times["pytorch"])],
            "ms_per_frame": {k: [round(x, 1) for x in v] for k, v in times.items()}}


def codec_flops_per_frame(tokenizer, codes: np.ndarray) -> float:
    """Floating-point operations per frame of the reference's decode of `codes` (T, 16), counted by PyTorch's
    `FlopCounterMode` (convolutions, transposed convolutions, matrix products and attention: 2 per multiply-add;
    elementwise work is not counted). The codec is compute-bound: this over its time is the rate it computes at."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        tokenizer.decode([{"audio_codes": torch.from_numpy(np.asarray(codes))}])
    return counter.get_total_flops() / len(codes)


def peak_gflops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """The machine's measured fp32 peak at `threads` threads: GFLOP/s of a large square matrix product (PyTorch's
    sgemm, which runs near the CPU's FMA throughput), median of `repeats` after a warm-up."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    seconds = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(seconds) / 1e9


def codec_benchmark(model_dir: Path, thread_counts: list[int], frames: int = 40, rounds: int = 9) -> dict:
    """`codec_rounds` at each thread count, the machine described (data/bench/codec/)."""
    return {"what": "the codec alone: ncnn runtime Codec vs PyTorch speech_tokenizer.decode, same random codes, "
                    "one process, alternating rounds, ms per frame (python -m qtts_lib.bench codec)",
            "checkpoint": Path(model_dir).name, "machine": describe(thread_counts),
            "runs": [codec_rounds(model_dir, t, frames, rounds) for t in thread_counts]}


def tier_rounds(model_dir: Path, threads: int, tiers: list[str], frames: int = 40, rounds: int = 9, seed: int = 0,
                progress: bool = True) -> dict:
    """The runtime's codec in each of `tiers` (`codec.decoder.CODEC_TIERS`) on the same random codes in one
    process, rounds alternating the order: ms per frame, and each tier's audio against fp32's (SNR, log-spectral
    distance in dB, and how many of the codes the Mimi encoder gets back from fp32's audio it also gets back from
    this tier's, per codebook: a listening-free check that the sound, not just the samples, is kept). No torch."""
    from tqdm.auto import tqdm

    from .. import check
    from ..runtime.codec.decoder import Codec
    from ..runtime.pipeline.config import ModelConfig
    from ..runtime.pipeline.voices import VoiceEncoder

    model_dir = Path(model_dir)
    cfg = ModelConfig.load(model_dir)
    codecs = {t: Codec(model_dir / "ncnn", cfg.codec, threads, precision=t) for t in tiers}
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, cfg.codec["codebook_size"], (frames, cfg.codec["num_quantizers"]))
    wavs = {t: c.decode(codes) for t, c in codecs.items()}  # warm-up, and the audio compared below
    times: dict[str, list[float]] = {t: [] for t in tiers}
    load_before = [round(x, 2) for x in os.getloadavg()]
    for r in tqdm(range(rounds), desc=f"codec tiers {threads} threads", unit="round", disable=not progress):
        for t in (tiers if r % 2 == 0 else tiers[::-1]):
            t0 = time.perf_counter()
            codecs[t].decode(codes)
            times[t].append(1000 * (time.perf_counter() - t0) / frames)
    mimi = VoiceEncoder(cfg, threads)
    heard = {t: mimi.codes(w) for t, w in wavs.items()}
    ref = "fp32"
    quality = {t: {"snr_db": round(check.snr_db(wavs[t], wavs[ref]), 1),
                   "log_spectral_distance_db": round(check.log_spectral_distance(wavs[t], wavs[ref]), 2),
                   "mimi_codes_agree": [round(float(x), 3) for x in (heard[t] == heard[ref]).mean(axis=0)]}
               for t in tiers if t != ref}
    return {"threads": threads, "frames": frames, "rounds": rounds, "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "median_ms_per_frame": {t: round(statistics.median(v), 1) for t, v in times.items()},
            "ratio_to_fp32_per_round": {t: [round(a / b, 3) for a, b in zip(times[t], times[ref])]
                                        for t in tiers if t != ref},
            "vs_fp32": quality, "ms_per_frame": {t: [round(x, 1) for x in v] for t, v in times.items()}}


def tier_benchmark(model_dir: Path, thread_counts: list[int], tiers: list[str], frames: int = 40,
                   rounds: int = 9) -> dict:
    """`tier_rounds` at each thread count, the machine described (data/bench/codec/)."""
    if "fp32" not in tiers:
        tiers = ["fp32", *tiers]
    return {"what": "the runtime's codec per precision tier, same random codes, one process, alternating rounds, ms "
                    "per frame, and each tier's audio against fp32's (python -m qtts_lib.bench codec --tiers)",
            "checkpoint": Path(model_dir).name, "machine": describe(thread_counts),
            "runs": [tier_rounds(model_dir, t, tiers, frames, rounds) for t in thread_counts]}
