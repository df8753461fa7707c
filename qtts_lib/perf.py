"""The performance harness: PyTorch vs the ncnn runtime, side by side, with the machine described. Introduced in 09.

    python -m qtts_lib.perf --checkpoint full-base --threads 1,2 --frames 40 --repeats 3 -o data/bench/NAME.json
    python -m qtts_lib.perf --codec --checkpoint full-base --threads 1,2 --rounds 9 -o data/bench/codec/NAME.json
    python -m qtts_lib.perf --stream --checkpoint full-base --threads 1,2 --repeats 3 -o data/bench/stream/NAME.json

Every measurement runs in a fresh child process (its own model load, its own peak RSS, no thread
pool left over from the other runtime), and the runs are interleaved: repeat 1 of every
(runtime, threads), then repeat 2, ... so a slow minute on the machine hits every row alike.
Reported numbers are medians. Both sides generate greedily from the same prompt (an x-vector
clone of data/inputs/voice.wav) for at most `frames` frames (random weights practically never emit
EOS; a real checkpoint stops earlier and every time is divided by the frames made) and decode them
with their own codec.

Per frame: talker (the decoder step + head + sampling), predictor (the 15 code-predictor steps),
codec (decoding the generated codes: the first decode in the process, what `qtts say` pays), total (their
sum); prefill, model load and a second decode of the same codes (`codec_warm_ms_per_frame`, what a server
that has decoded before pays) on their own.
The generation loop is memory-bound: every frame reads the talker's weights once and the code
predictor's 15 times, so (those bytes) / (measured read bandwidth) is the floor no fp32 runtime can
beat; each row reports it and its ratio to it. Every run measures the bandwidth while it runs (`Probe`: every
8 frames, between frames, outside the timed code) and is held against the floor of that bandwidth (on a VM it
drifts by 20% from minute to minute, so a bandwidth measured once at the start says little about a run ten
minutes later).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .runtime.audio import FRAME_RATE, SAMPLE_RATE

DEFAULT_TEXT = "Hello from ncnn. Every token of this sentence is checked against PyTorch."
SCHEMA_KEYS = ("runtime", "device", "precision", "threads", "ms_per_frame", "prefill_ms", "rtf", "peak_rss_gb",
               "floor_ms_per_frame", "floor_ratio", "repeats")


# ---------------------------------------------------------------- the machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return float("nan")


def read_bandwidth_gbs(threads: int, gib: float = 1.0, repeats: int = 5, array: np.ndarray | None = None) -> float:
    """Streaming-read bandwidth in GB/s: `threads` threads each take the max of their slice of a `gib` GiB
    array (numpy releases the GIL in the reduction). Max, not sum: numpy's pairwise float sum is
    compute-bound at about half this machine's bandwidth, its SIMD max is not. Median of `repeats`;
    the first pass warms the pages. `array`: read this one instead (a probe that runs again and again)."""
    a = np.ones(int(gib * 2**30 / 4), np.float32) if array is None else array
    parts = np.array_split(a, threads)
    a.max()

    def once() -> float:
        workers = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - t0

    seconds = statistics.median(once() for _ in range(repeats))
    return a.nbytes / seconds / 1e9


def describe_machine(thread_counts: list[int]) -> dict:
    """CPU, cores, memory, load, and the read bandwidth at each thread count (measured now)."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": memory_gb(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "read_bandwidth_gbs": {str(t): round(read_bandwidth_gbs(t), 1) for t in thread_counts},
    }


def weight_bytes_per_frame(ncnn_dir: Path, groups: int = 16, precision: str = "fp32") -> int:
    """Weights one frame reads: the talker decoder and codec head once, the code predictor's decoder
    and one of its heads per predicted codebook (15). Embedding lookups read a few rows only. A precision
    tier (chapter 10) stores the two decoders in fewer bytes per weight; the heads stay fp32."""
    from .runtime.precision import weight_bytes

    size = lambda name: (ncnn_dir / f"{name}.bin").stat().st_size  # noqa: E731
    shrink = weight_bytes(precision) / 4.0
    per_head = size("predictor_heads") / (groups - 1)
    return int(shrink * size("talker_decoder") + size("talker_codec_head")
               + (groups - 1) * (shrink * size("predictor_decoder") + per_head))


# ---------------------------------------------------------------- one run per child process
def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it does not carry the parent's peak
    across fork + exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    return float("nan")


PROBE_EVERY = 8     # frames between two bandwidth probes inside a run
PROBE_GIB = 0.125   # the probe's array: four times this CPU's 32 MB L3, so it reads memory


class Probe:
    """Bandwidth probes inside a run, between frames (outside the timed code): a VM's bandwidth drifts by
    20% from minute to minute, so each run is held against what the memory gave while it ran. The probe's
    array lives for the whole run; `peak_rss_gb` leaves it out."""

    def __init__(self, threads: int):
        self.threads, self.gbs, self.seconds = threads, [], 0.0
        self.array = np.ones(int(PROBE_GIB * 2**30 / 4), np.float32)

    def __call__(self, frame: int = 0) -> None:
        if frame % PROBE_EVERY == 0:
            t = time.perf_counter()
            self.gbs.append(round(read_bandwidth_gbs(self.threads, repeats=3, array=self.array), 1))
            self.seconds += time.perf_counter() - t

    def peak_rss_gb(self) -> float:
        return peak_rss_gb() - self.array.nbytes / 2**30


def run_ncnn(model_dir: Path, voice_wav: Path, text: str, frames: int, threads: int, device: str = "cpu",
             precision: str = "fp32") -> dict:
    """Generate exactly `frames` frames with the ncnn runtime and decode them; seconds per component."""
    from .runtime.audio import load_wav
    from .runtime.synthesizer import Synthesizer

    probe = Probe(threads)

    t0 = time.perf_counter()
    synth = Synthesizer(model_dir, threads=threads, device=device, precision=precision)
    load_s = time.perf_counter() - t0
    voice = synth.voice(wav=load_wav(voice_wav))
    prompt = synth.build_prompt(text, "english", voice)
    probe()
    result = synth.generate(prompt, frames + 1, greedy=True, on_frame=probe)  # random weights: EOS is rare
    probe()
    codec_s = []
    for _ in range(2):  # the first decode is what `qtts say` sees, the second what a server sees
        t0 = time.perf_counter()
        synth.codec.decode(result.codes)
        codec_s.append(time.perf_counter() - t0)
    return {"frames": len(result.codes), "load_s": load_s, "prefill_s": result.seconds["prefill"],
            "talker_s": result.seconds["talker"], "predictor_s": result.seconds["predictor"], "codec_s": codec_s[0],
            "codec_warm_s": codec_s[1], "peak_rss_gb": probe.peak_rss_gb(), "read_bandwidth_gbs": probe.gbs}


def run_pytorch(model_dir: Path, voice_wav: Path, text: str, frames: int, threads: int) -> dict:
    """The same with the qwen_tts package (greedy generate_voice_clone, x-vector), timed by wrapping the
    talker's generate, the code predictor's generate, the talker's first forward (prefill) and the codec."""
    import torch

    from . import reference
    from .runtime.audio import load_wav

    torch.set_num_threads(threads)
    probe = Probe(threads)
    t0 = time.perf_counter()
    tts = reference.load(model_dir, threads=threads)
    load_s = time.perf_counter() - t0
    model = tts.model
    spent = {"talker_generate": 0.0, "predictor": 0.0, "codec": 0.0, "prefill": None}

    def timed(key, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[key] += time.perf_counter() - t
            return out
        return wrapper

    started = []  # hooks, not a wrapper: HF validates generate's kwargs against forward's signature
    model.talker.register_forward_pre_hook(lambda m, a: started.append(time.perf_counter()))
    model.talker.register_forward_hook(
        lambda m, a, o: spent.update(prefill=time.perf_counter() - started[0]) if spent["prefill"] is None else None)
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
    clip = load_wav(voice_wav)
    with torch.inference_mode():
        tts.generate_voice_clone(text=text, language="english", ref_audio=(clip, SAMPLE_RATE), x_vector_only_mode=True,
                                 max_new_tokens=frames + 1, **reference.GREEDY)
        inside = probe.seconds  # every probe so far ran inside the talker's generate
        cold = spent["codec"]
        decode(spent["codes"])  # the same codes again: the warm decode
    probe()
    talker_s = spent["talker_generate"] - spent["predictor"] - spent["prefill"] - inside
    return {"frames": spent["frames"], "load_s": load_s, "prefill_s": spent["prefill"], "talker_s": talker_s,
            "predictor_s": spent["predictor"], "codec_s": cold, "codec_warm_s": spent["codec"] - cold,
            "peak_rss_gb": probe.peak_rss_gb(), "read_bandwidth_gbs": probe.gbs}


def _child(args: argparse.Namespace) -> None:
    if args.child == "stream":
        out = stream_rounds(Path(args.model_dir), Path(args.voice), args.text, args.frames, args.threads,
                            args.repeats)
        print("QTTS_PERF " + json.dumps(out))
        return
    common = (Path(args.model_dir), Path(args.voice), args.text, args.frames, args.threads)
    out = run_ncnn(*common, precision=args.precision) if args.child == "ncnn" else run_pytorch(*common)
    print("QTTS_PERF " + json.dumps(out))


def measure_once(runtime: str, model_dir: Path, voice_wav: Path, text: str, frames: int, threads: int,
                 precision: str = "fp32") -> dict:
    """One run in a fresh Python; raises with its stderr if the child fails."""
    return _run_child(runtime, model_dir, voice_wav, text, frames, threads, "--precision", precision)


def _run_child(child: str, model_dir: Path, voice_wav: Path, text: str, frames: int, threads: int, *extra) -> dict:
    """`python -m qtts_lib.perf --child CHILD ...` at `threads` threads: the dict it prints."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "qtts_lib.perf", "--child", child, "--model-dir", str(model_dir),
           "--voice", str(voice_wav), "--text", text, "--frames", str(frames), "--threads", str(threads), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("QTTS_PERF ")), None)  # noqa: E741
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{child} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line.split(" ", 1)[1])


# ---------------------------------------------------------------- the benchmark
def row(runtime: str, threads: int, runs: list[dict], floor_ms: float, precision: str = "fp32",
        weight_bytes: int | None = None) -> dict:
    """One schema row from repeated runs: medians per component, per frame. With `weight_bytes` and runs that
    measured the read bandwidth while they ran (`read_bandwidth_gbs`: `Probe`), each run is held against its own
    floor (from the median of its probes): the row's floor is the median of the runs' floors and its ratio the
    median of the runs' ratios. Otherwise `floor_ms` is the floor."""
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    frames = runs[0]["frames"]
    ms = {k: 1000 * med(f"{k}_s") / frames for k in ("talker", "predictor", "codec")}
    ms["total"] = sum(ms.values())
    total_s = ms["total"] * frames / 1000
    ratio = (ms["talker"] + ms["predictor"]) / floor_ms
    if weight_bytes and all(r.get("read_bandwidth_gbs") for r in runs):
        floors = [weight_bytes / (statistics.median(r["read_bandwidth_gbs"]) * 1e9) * 1000 for r in runs]
        floor_ms = statistics.median(floors)
        ratio = statistics.median(1000 * (r["talker_s"] + r["predictor_s"]) / r["frames"] / f
                                  for r, f in zip(runs, floors))
    return {
        "runtime": runtime, "device": "cpu", "precision": precision, "threads": threads,
        "ms_per_frame": {k: round(v, 1) for k, v in ms.items()},
        "prefill_ms": round(1000 * med("prefill_s"), 1), "load_s": round(med("load_s"), 2),
        **({"codec_warm_ms_per_frame": round(1000 * med("codec_warm_s") / frames, 1)}
           if all("codec_warm_s" in r for r in runs) else {}),
        "rtf": round(total_s / (frames / FRAME_RATE), 3), "peak_rss_gb": round(max(r["peak_rss_gb"] for r in runs), 2),
        "floor_ms_per_frame": round(floor_ms, 1),
        "floor_ratio": round(ratio, 2),
        "repeats": len(runs),
    }


def benchmark(model_dir: Path, voice_wav: Path, text: str, frames: int, thread_counts: list[int], repeats: int,
              runtimes=("pytorch", "ncnn"), progress: bool = True, precisions=("fp32",)) -> dict:
    """Interleaved repeats of every (runtime, precision, threads); the result in data/bench's schema.
    PyTorch runs fp32 only; the ncnn runtime runs every tier in `precisions` (chapter 10)."""
    from tqdm.auto import tqdm

    machine = describe_machine(thread_counts)
    ncnn_dir = Path(model_dir) / "ncnn"
    weights = {p: weight_bytes_per_frame(ncnn_dir, precision=p) for p in {"fp32", *precisions}}
    if "int8" in precisions:  # write the tier's files before anything is timed
        from .runtime.precision import ensure_int8

        for name in ("talker_decoder", "predictor_decoder"):
            ensure_int8(ncnn_dir, name, log=print)
    keys = [(r, p, t) for t in thread_counts for r in runtimes for p in (precisions if r == "ncnn" else ("fp32",))]
    runs: dict[tuple[str, str, int], list[dict]] = {k: [] for k in keys}
    with tqdm(total=repeats * len(runs), desc="bench", unit="run", disable=not progress) as bar:
        for _ in range(repeats):
            for (runtime, precision, threads), done in runs.items():
                bar.set_postfix_str(f"{runtime} {precision} {threads} threads")
                done.append(measure_once(runtime, model_dir, voice_wav, text, frames, threads, precision))
                bar.update(1)
    machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    machine["read_bandwidth_gbs_runs"] = {  # every run measured it before and after itself (row() uses them)
        str(t): [b for (_, _, th), done in runs.items() if th == t for r in done for b in r["read_bandwidth_gbs"]]
        for t in thread_counts}
    rows = []
    for (runtime, precision, threads), done in runs.items():
        floor_ms = weights[precision] / (machine["read_bandwidth_gbs"][str(threads)] * 1e9) * 1000
        rows.append(row(runtime, threads, done, floor_ms, precision, weights[precision]))
    raw = [{"runtime": r, "precision": p, "threads": t, **run} for (r, p, t), done in runs.items() for run in done]
    return {"machine": machine, "checkpoint": Path(model_dir).name, "frames": frames,
            "weight_bytes_per_frame": weights["fp32"], "weight_bytes_per_frame_by_precision": weights,
            "text": text, "rows": rows, "raw": raw}


def check_schema(result: dict) -> None:
    """Raise if `result` does not have data/bench's shape (the perf chapter and the tests use this)."""
    for key in ("machine", "checkpoint", "frames", "rows"):
        if key not in result:
            raise ValueError(f"bench result has no {key!r}")
    if not result["rows"]:
        raise ValueError("bench result has no rows")
    for r in result["rows"]:
        missing = [k for k in SCHEMA_KEYS if k not in r]
        if missing:
            raise ValueError(f"a row lacks {missing}")
        if set(r["ms_per_frame"]) != {"talker", "predictor", "codec", "total"}:
            raise ValueError(f"ms_per_frame keys {sorted(r['ms_per_frame'])}")


# ---------------------------------------------------------------- the codec alone, both runtimes in one process
def codec_rounds(model_dir: Path, threads: int, frames: int = 40, rounds: int = 9, seed: int = 0,
                 progress: bool = True) -> dict:
    """The codec alone: the runtime's `Codec` (its CPU form, `speed.codec_fast_parts`) against the reference's
    `speech_tokenizer.decode` on the same random codes and thread count, in this one process, `rounds` rounds
    with the order alternating (ncnn first in even rounds). A generation run's codec time is one decode per
    process, which process-to-process spread swamps; this holds everything else still. ms per frame; the wav SNR
    of ncnn against PyTorch is measured on the same call, the fresh memory each side's first decode touches
    (minor page faults: on a VM, first touches are slow), and the codec's FLOPs per frame against the machine's
    measured peak (`codec_flops_per_frame`, `peak_gflops`)."""
    import torch
    from tqdm.auto import tqdm

    from . import check, reference
    from .runtime.codec import Codec

    model_dir = Path(model_dir)
    config = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    torch.set_num_threads(threads)
    tokenizer = reference.load(model_dir, threads=threads).model.speech_tokenizer
    t0 = time.perf_counter()
    codec = Codec(model_dir / "ncnn", config, threads)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, config["codebook_size"], (frames, 16))  # what the talker and predictor emit
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
                    "one process, alternating rounds, ms per frame (python -m qtts_lib.perf --codec)",
            "checkpoint": Path(model_dir).name, "machine": describe_machine(thread_counts),
            "runs": [codec_rounds(model_dir, t, frames, rounds) for t in thread_counts]}


# ---------------------------------------------------------------- streaming: first audio, and the whole stream
STREAM_CHUNKS = (1, 2, 4, 8)


def stream_rounds(model_dir: Path, voice_wav: Path, text: str, frames: int, threads: int, repeats: int = 3,
                  chunks=STREAM_CHUNKS) -> dict:
    """In this process, one loaded Synthesizer: time to first audio per chunk size (`stream.ttfa_ms`, median of
    `repeats`), then `repeats` interleaved rounds of `synthesize` vs `stream` with the caller's OpenMP pool kept
    (`release_threads` made a no-op: what streaming cost before it existed) vs `stream` (pieces of 4), each `frames`
    greedy frames, whole ms per frame (loop + decode; the stream's decode is incremental); and, to tell the two
    apart, the codec alone on the codes made: one whole decode vs an incremental one fed 4 frames at a time."""
    from .runtime import stream as stream_mod
    from .runtime.audio import load_wav
    from .runtime.synthesizer import Synthesizer

    synth = Synthesizer(model_dir, threads=threads)
    voice = synth.voice(wav=load_wav(voice_wav))
    ttfa = [stream_mod.ttfa_ms(synth, text, "english", voice, chunk_frames=c, repeats=repeats,
                               max_new_tokens=frames + 1) for c in chunks]
    released = stream_mod.release_threads

    def whole(kind: str) -> float:
        stream_mod.release_threads = released if kind == "stream" else (lambda: False)
        t0 = time.perf_counter()
        if kind == "synthesize":
            made = len(synth.synthesize(text, "english", voice, max_new_tokens=frames + 1).codes)
        else:
            pieces = synth.stream(text, "english", voice, max_new_tokens=frames + 1, chunk_frames=4)
            made = len(stream_mod.drain(pieces, lambda piece: None).codes)
        return (time.perf_counter() - t0) * 1000.0 / made

    codes = synth.synthesize(text, "english", voice, max_new_tokens=frames + 1).codes

    def codec_alone(kind: str) -> float:
        t0 = time.perf_counter()
        if kind == "codec_whole":
            synth.codec.decode(codes)
        else:
            inc = synth.codec.incremental()
            for a in range(0, len(codes), 4):
                inc.push(codes[a:a + 4])
        return (time.perf_counter() - t0) * 1000.0 / len(codes)

    # synthesize runs ncnn in this thread, so its pool exists when the kept-pool stream starts; `stream` pauses it
    kinds = ("synthesize", "stream_pool_kept", "stream", "codec_whole", "codec_pieces_of_4")
    rounds = {k: [] for k in kinds}
    try:
        for _ in range(repeats):
            for k in kinds:
                rounds[k].append(round(whole(k) if k in kinds[:3] else codec_alone(k), 1))
    finally:
        stream_mod.release_threads = released
    return {"threads": threads, "frames": frames,
            "ttfa": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in t.items() if k != "runs_ms"}
                     | {"runs_ms": [round(x, 1) for x in t["runs_ms"]]} for t in ttfa],
            "ms_per_frame": {k: statistics.median(v) for k, v in rounds.items()}, "rounds_ms_per_frame": rounds}


def stream_benchmark(model_dir: Path, voice_wav: Path, text: str, frames: int, thread_counts: list[int],
                     repeats: int = 3) -> dict:
    """`stream_rounds` per thread count, each in a fresh child process (data/bench/stream/)."""
    runs = [_run_child("stream", model_dir, voice_wav, text, frames, t, "--repeats", str(repeats))
            for t in thread_counts]
    return {"what": "streaming with the ncnn runtime, fp32, greedy, x-vector: time to first audio per chunk size "
                    "(Synthesizer.stream to its first piece; loading and the voice outside), whole ms per frame "
                    "of synthesize vs stream with the caller's OpenMP pool kept vs stream (pieces of 4), and the "
                    "codec alone: one whole decode vs incremental pieces of 4 (python -m qtts_lib.perf --stream)",
            "checkpoint": Path(model_dir).name, "machine": describe_machine(thread_counts), "text": text,
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    from . import paths

    p = argparse.ArgumentParser(prog="python -m qtts_lib.perf", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="full-base", help="a name under models/ or a checkpoint directory")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts; 'all' = every core")
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--voice", default=str(paths.voice_wav()))
    p.add_argument("--precision", default="fp32",
                   help="comma-separated ncnn tiers (fp32, fp16, int8; chapter 10); PyTorch runs fp32")
    p.add_argument("--runtimes", default="pytorch,ncnn", help="comma-separated: pytorch, ncnn")
    p.add_argument("--codec", action="store_true",
                   help="time the codec alone, ncnn vs PyTorch in one process (--rounds rounds per thread count)")
    p.add_argument("--rounds", type=int, default=9, help="with --codec: interleaved rounds per thread count")
    p.add_argument("--stream", action="store_true",
                   help="streaming: time to first audio per chunk size, stream vs synthesize (--repeats rounds)")
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--child", choices=["ncnn", "pytorch", "stream"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.threads = int(args.threads)
        _child(args)
        return 0
    model_dir = paths.checkpoint_dir(args.checkpoint)
    counts = sorted({os.cpu_count() if t == "all" else int(t) for t in args.threads.split(",")})
    if args.codec:
        print(write_result(codec_benchmark(model_dir, counts, args.frames, args.rounds), args.output))
        return 0
    if args.stream:
        print(write_result(stream_benchmark(model_dir, Path(args.voice), args.text, args.frames, counts,
                                            args.repeats), args.output))
        return 0
    tiers = tuple(t.strip() for t in args.precision.split(","))
    runtimes = tuple(r.strip() for r in args.runtimes.split(","))
    result = benchmark(model_dir, Path(args.voice), args.text, args.frames, counts, args.repeats, runtimes,
                       precisions=tiers)
    check_schema(result)
    print(write_result(result, args.output))
    return 0


def write_result(result: dict, output: Path | None) -> str:
    """`result` as indented JSON, written to `output` (folders made) when given; the text is returned."""
    text = json.dumps(result, indent=1)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    return text


if __name__ == "__main__":
    sys.exit(main())
