"""The end-to-end benchmark: PyTorch vs the ncnn runtime, side by side, the machine described. Introduced in 11.

    python -m qtts_lib.bench loop --checkpoint full-base --threads 1,2 --frames 40 --repeats 3 -o data/bench/NAME.json
    python -m qtts_lib.bench loop --checkpoint full-base --devices vulkan,cpu --runtimes ncnn --threads 1,16 ...
    python -m qtts_lib.bench loop --checkpoint full-base --devices cuda --runtimes pytorch --threads 1 ...
    python -m qtts_lib.bench loop --runtimes ncnn --precision int8 --codec-precision fp32,bf16 ...

Every measurement runs in a fresh child process (`bench.child`: its own model load, its own peak RSS, no thread
pool left over from the other runtime), and the runs are interleaved: repeat 1 of every (runtime, device, precision,
threads), then repeat 2, ... so a slow minute on the machine hits every row alike. Reported numbers are medians.
Both sides speak `bench.workload`'s prompt (an x-vector clone, greedy) for at most `frames` frames and decode them
with their own codec; the ncnn side runs the product's own path, `Synthesizer.synthesize`.

Per frame: talker (the decoder step + head + sampling), predictor (the 15 code-predictor steps), codec (decoding the
generated codes: the first decode in the process, what `qtts say` pays), total (their sum); prefill, model load and a
second decode of the same codes (`codec_warm_ms_per_frame`, what a server that has decoded before pays) on their own.
On the CPU the generation loop is memory-bound: every frame reads the talker's weights once and the code predictor's
15 times, so (those bytes) / (measured read bandwidth) is the floor no fp32 runtime can beat; each CPU row reports it
and its ratio to it. Every run measures the bandwidth while it runs (`machine.Probe`: every 8 frames, between frames,
outside the timed code) and is held against the floor of that bandwidth.

ncnn CPU rows can also differ by the codec's tier (`codec_precision`, chapter 14): a tier end to end beside the
loop's floor in one file.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from ..runtime.audio.wav import FRAME_RATE, SAMPLE_RATE, load_wav
from . import child
from .machine import Probe, describe, huge_pages_mb
from .results import check_schema
from .workload import LANGUAGE, TEXT, voice_wav, weight_bytes_per_frame
from .workload import voice as workload_voice


def run_ncnn(model_dir: str, frames: int, threads: int, device: str = "cpu", precision: str = "fp32",
             codec_precision: str = "fp32") -> dict:
    """Speak exactly `frames` frames with `Synthesizer.synthesize` (greedy) and decode them once more; seconds per
    part, from the `Result` (`seconds`)."""
    from ..runtime import Sampling, Synthesizer

    probe = Probe(threads)
    t0 = time.perf_counter()
    synth = Synthesizer(model_dir, threads=threads, device=device, precision=precision,
                        codec_precision=codec_precision)
    load_s = time.perf_counter() - t0
    voice = workload_voice(synth)  # Base: the clip's x-vector; CustomVoice: a speaker; VoiceDesign: a description
    probe()
    result = synth.synthesize(TEXT, LANGUAGE, voice, Sampling(greedy=True), max_frames=frames, on_frame=probe)
    probe()
    t0 = time.perf_counter()
    synth.codec.decode(result.codes)  # the same codes again: what a server that has decoded before pays
    warm = time.perf_counter() - t0
    s = result.seconds
    return {"frames": len(result.codes), "device": device, "load_s": load_s, "prefill_s": s["prefill"],
            "talker_s": s["talker"], "predictor_s": s["predictor"], "codec_s": s["codec"], "codec_warm_s": warm,
            "peak_rss_gb": probe.peak_rss_gb(), "read_bandwidth_gbs": probe.gbs, "huge_pages_mb": huge_pages_mb()}


def run_pytorch(model_dir: str, frames: int, threads: int, device: str = "cpu") -> dict:
    """The same with the qwen_tts package (greedy generate_voice_clone, x-vector, fp32, sdpa) on `device` (cpu or
    cuda), timed by wrapping the talker's generate, the code predictor's generate, the talker's first forward
    (prefill) and the codec (synchronized around each on a GPU)."""
    from .gpu import stub_missing

    stub_missing("librosa", "soundfile")  # a GPU host may lack what the 12 Hz generate path never calls
    import torch

    from .. import reference

    torch.set_num_threads(threads)
    probe = Probe(threads)
    t0 = time.perf_counter()
    tts = reference.load(model_dir, threads=threads, device=device)
    load_s = time.perf_counter() - t0
    model = tts.model
    spent = {"talker_generate": 0.0, "predictor": 0.0, "codec": 0.0, "prefill": None}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(key, fn):
        def wrapper(*args, **kwargs):
            sync()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            spent[key] += time.perf_counter() - t
            return out
        return wrapper

    started = []  # hooks, not a wrapper: HF validates generate's kwargs against forward's signature

    def before_forward(module, args) -> None:
        sync()
        started.append(time.perf_counter())

    def after_forward(module, args, output) -> None:
        if spent["prefill"] is None:
            sync()
            spent["prefill"] = time.perf_counter() - started[0]

    model.talker.register_forward_pre_hook(before_forward)
    model.talker.register_forward_hook(after_forward)
    model.talker.generate = timed("talker_generate", model.talker.generate)
    predict = timed("predictor", model.talker.code_predictor.generate)

    def probed_predict(*args, **kwargs):  # one call per frame; the probe's time is taken off the talker's below
        probe(spent.setdefault("calls", 0))
        spent["calls"] += 1
        return predict(*args, **kwargs)

    model.talker.code_predictor.generate = probed_predict
    decode = timed("codec", model.speech_tokenizer.decode)

    def counting_decode(items):
        spent["frames"] = int(items[0]["audio_codes"].shape[0])
        spent["codes"] = items
        return decode(items)

    model.speech_tokenizer.decode = counting_decode
    clip = load_wav(voice_wav())
    with torch.inference_mode():
        tts.generate_voice_clone(text=TEXT, language=LANGUAGE, ref_audio=(clip, SAMPLE_RATE), x_vector_only_mode=True,
                                 max_new_tokens=frames + 1, **reference.GREEDY)
        inside = probe.seconds  # every probe so far ran inside the talker's generate
        cold = spent["codec"]
        decode(spent["codes"])  # the same codes again: the warm decode
    probe()
    talker_s = spent["talker_generate"] - spent["predictor"] - spent["prefill"] - inside
    return {"frames": spent["frames"], "device": device, "load_s": load_s, "prefill_s": spent["prefill"],
            "talker_s": talker_s, "predictor_s": spent["predictor"], "codec_s": cold,
            "codec_warm_s": spent["codec"] - cold,
            "peak_rss_gb": probe.peak_rss_gb(), "read_bandwidth_gbs": probe.gbs, "huge_pages_mb": huge_pages_mb()}


# ---------------------------------------------------------------- the benchmark
def row(runtime: str, threads: int, runs: list[dict], floor_ms: float | None, precision: str = "fp32",
        weight_bytes: int | None = None, device: str = "cpu", extra: dict | None = None) -> dict:
    """One schema row from repeated runs: medians per component, per frame. With `weight_bytes` and runs that
    measured the read bandwidth while they ran (`read_bandwidth_gbs`: `Probe`), each run is held against its own
    floor (from the median of its probes): the row's floor is the median of the runs' floors and its ratio the
    median of the runs' ratios. Otherwise `floor_ms` is the floor; None (a GPU: bound by round trips, not by
    reading memory) leaves the floor and its ratio out (None)."""
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    frames = runs[0]["frames"]
    ms = {k: 1000 * med(f"{k}_s") / frames for k in ("talker", "predictor", "codec")}
    ms["total"] = sum(ms.values())
    total_s = ms["total"] * frames / 1000
    ratio = None if floor_ms is None else (ms["talker"] + ms["predictor"]) / floor_ms
    if floor_ms is not None and weight_bytes and all(r.get("read_bandwidth_gbs") for r in runs):
        floors = [weight_bytes / (statistics.median(r["read_bandwidth_gbs"]) * 1e9) * 1000 for r in runs]
        floor_ms = statistics.median(floors)
        ratio = statistics.median(1000 * (r["talker_s"] + r["predictor_s"]) / r["frames"] / f
                                  for r, f in zip(runs, floors))
    return {
        "runtime": runtime, "device": device, "precision": precision, "threads": threads, **(extra or {}),
        "ms_per_frame": {k: round(v, 1) for k, v in ms.items()},
        "prefill_ms": round(1000 * med("prefill_s"), 1), "load_s": round(med("load_s"), 2),
        **({"codec_warm_ms_per_frame": round(1000 * med("codec_warm_s") / frames, 1)}
           if all("codec_warm_s" in r for r in runs) else {}),
        "rtf": round(total_s / (frames / FRAME_RATE), 3), "peak_rss_gb": round(max(r["peak_rss_gb"] for r in runs), 2),
        "floor_ms_per_frame": None if floor_ms is None else round(floor_ms, 1),
        "floor_ratio": None if ratio is None else round(ratio, 2),
        "repeats": len(runs),
    }


def benchmark(model_dir: Path, frames: int, thread_counts: list[int], repeats: int, runtimes=("pytorch", "ncnn"),
              precisions=("fp32",), devices=("cpu",), progress: bool = True, codecs=("fp32",),
              huge_pages=(False,)) -> dict:
    """Interleaved repeats of every (runtime, device, precision, threads); the result in data/bench's schema.
    PyTorch runs fp32 on cpu or cuda; the ncnn runtime every tier in `precisions` (chapter 13) on cpu, fp32 on
    vulkan, and on the cpu each of `codecs` (the codec's tiers). A device a runtime cannot use is left out. Each
    of `huge_pages` (False, True) is a row of its own: children started with glibc's malloc asking for transparent
    huge pages or not (`runtime.app.hugepages`); a row says how much of its memory the kernel gave in them."""
    from tqdm.auto import tqdm

    machine = describe(thread_counts)
    ncnn_dir = Path(model_dir) / "ncnn"
    weights = {p: weight_bytes_per_frame(ncnn_dir, precision=p) for p in {"fp32", *precisions}}
    from ..runtime.pipeline.precision import ensure_int8_tier

    for p in precisions:  # each int8 tier's files written before anything is timed (the others have none)
        ensure_int8_tier(ncnn_dir, log=print, tier=p)
    usable = {"pytorch": ("cpu", "cuda"), "ncnn": ("cpu", "vulkan")}
    ncnn_cpu = lambda r, d: r == "ncnn" and d == "cpu"  # noqa: E731
    keys = [(r, d, p, t, c, h) for t in thread_counts for r in runtimes for d in devices
            if d.split(":")[0] in usable[r]
            for p in (precisions if ncnn_cpu(r, d) else ("fp32",))
            for c in (codecs if ncnn_cpu(r, d) else ("fp32",)) for h in huge_pages]
    runs: dict[tuple, list[dict]] = {k: [] for k in keys}
    with tqdm(total=repeats * len(runs), desc="bench", unit="run", disable=not progress) as bar:
        for _ in range(repeats):
            for (runtime, device, precision, threads, codec, huge), done in runs.items():
                bar.set_postfix_str(f"{runtime} {device} {precision} {threads} threads" + (" huge" if huge else ""))
                kwargs = dict(model_dir=str(model_dir), frames=frames, threads=threads, device=device)
                if runtime == "ncnn":
                    kwargs |= dict(precision=precision, codec_precision=codec)
                done.append(child.run("loop", f"run_{runtime}", threads, huge_pages=huge, **kwargs))
                bar.update(1)
    machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for (runtime, device, precision, threads, codec, huge), done in runs.items():
        on_cpu = device == "cpu"
        floor_ms = weights[precision] / (machine["read_bandwidth_gbs"][str(threads)] * 1e9) * 1000 if on_cpu else None
        mb = [r["huge_pages_mb"] for r in done if r.get("huge_pages_mb") is not None]
        extra = ({"codec_precision": codec} if runtime == "ncnn" else {}) | {
            "huge_pages": huge, "huge_pages_mb": statistics.median(mb) if mb else None}
        rows.append(row(runtime, threads, done, floor_ms, precision, weights[precision] if on_cpu else None, device,
                        extra))
    raw = [{"runtime": r, "device": d, "precision": p, "threads": t, "codec_precision": c, "huge_pages": h, **run}
           for (r, d, p, t, c, h), done in runs.items() for run in done]
    result = {"machine": machine, "checkpoint": Path(model_dir).name, "frames": frames,
              "weight_bytes_per_frame": weights["fp32"], "weight_bytes_per_frame_by_precision": weights,
              "text": TEXT, "rows": rows, "raw": raw}
    check_schema(result)
    return result
