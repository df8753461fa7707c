"""Sharing the cores: `qtts say` alone, two at once, and beside a CPU-bound neighbour, and `qtts serve` beside that
neighbour, for each way ncnn's OpenMP workers wait and each thread count. Introduced in 11.

    python -m qtts_lib.bench cores --checkpoint full-base --precision int8 --codec-precision int8 \\
        -o data/bench/cores/NAME.json

The pip wheel of ncnn bundles GNU libgomp, whose workers spin for GOMP_SPINCOUNT rounds at the end of each parallel
region before they sleep (ncnn's own `openmp_blocktime` does nothing with it). The runtime sets 3000 before ncnn
loads (`runtime.binding`, unless the variable is set); libgomp's own default, with no wait policy set, is 300000.
A spinning worker holds its core while its process waits for the next layer: alone that buys a quicker start of the
next parallel region, beside another process it takes the core that process needs. Each setting (`--settings`,
`SPIN:THREADS`) is passed to every process as GOMP_SPINCOUNT and `--threads`, and every run is a fresh process, as
a user's would be:

- `alone`: one `qtts say` of `--frames` frames (`--max-frames`, a text long enough to reach it), its wall time;
- `pair`: two of them started together, each one's wall time (and the ratio to alone: a fair share of two cores
  for two processes of two threads is 2x);
- `beside`: one of them while a neighbour process spins on one core (a Python busy loop);
- `server`: `qtts serve` with one streaming client, alone and beside that neighbour: first audio, the audio
  delivered per second, and how long a client playing from its first byte waited (`serve.ran_dry`).

The settings take turns within each repeat (interleaved), and each row is the median over `--repeats`.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .machine import describe
from .serve import SENTENCES, scenario, start_server, stop_server
from .workload import voice_wav

SETTINGS = ((3000, 2), (300000, 2), (3000, 1), (3000, "auto"))  # (GOMP_SPINCOUNT, threads)
FRAMES = 120
REPEATS = 3
TEXT = " ".join(SENTENCES[:3])  # about 70 tokens: one segment reaches 120 frames


def _env(spin: int) -> dict:
    return dict(os.environ, GOMP_SPINCOUNT=str(spin))


def say(model_dir: Path, out: Path, spin: int, threads: int, precision: str, codec_precision: str,
        frames: int) -> subprocess.Popen:
    """A `qtts say` process of this interpreter, as a user starts one."""
    args = [sys.executable, "-m", "qtts_lib.runtime.app.cli", "say", "--checkpoint", str(model_dir), "--text", TEXT,
            "--voice", str(voice_wav()), "--threads", str(threads), "--precision", precision, "--codec-precision",
            codec_precision, "--max-frames", str(frames), "--seed", "1", "-o", str(out)]
    return subprocess.Popen(args, env=_env(spin), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def walls(procs: list[subprocess.Popen]) -> list[float]:
    """Each process's wall time from now (they were just started) to its exit; a failure raises with its stderr."""
    start, done = time.perf_counter(), {}
    while len(done) < len(procs):
        for i, p in enumerate(procs):
            if i not in done and p.poll() is not None:
                done[i] = time.perf_counter() - start
                if p.returncode:
                    raise RuntimeError(f"qtts say exited {p.returncode}: {p.stderr.read().decode()[-2000:]}")
        time.sleep(0.01)
    return [round(done[i], 2) for i in range(len(procs))]


def neighbour() -> subprocess.Popen:
    """A process that keeps one core busy until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def audio_seconds(path: Path) -> float:
    import soundfile

    return round(soundfile.info(str(path)).duration, 2)


def server_rows(model_dir: Path, spin: int, threads: int, precision: str, codec_precision: str) -> dict:
    """One `qtts serve` (admitting by capacity) with GOMP_SPINCOUNT=spin: one streaming client alone, then one
    beside the neighbour, after a warm-up request."""
    tree = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        voices = Path(tmp) / "voices"
        voices.mkdir()
        shutil.copy(voice_wav(), voices / "bench.wav")
        log = Path(tmp) / "server.log"
        options = ["--voices", str(voices), "--threads", str(threads), "--precision", precision,
                   "--codec-precision", codec_precision, "--max-frames", "100"]
        saved = os.environ.get("GOMP_SPINCOUNT")
        os.environ["GOMP_SPINCOUNT"] = str(spin)  # start_server passes this process's environment on
        try:
            proc, port = start_server(model_dir, tree, sys.executable, options, log)
        finally:
            if saved is None:
                del os.environ["GOMP_SPINCOUNT"]
            else:
                os.environ["GOMP_SPINCOUNT"] = saved
        try:
            scenario("127.0.0.1", port, 1, 0.0, 4, seed0=100)  # the warm-up
            alone = scenario("127.0.0.1", port, 1, 0.0, 4)
            busy = neighbour()
            try:
                beside = scenario("127.0.0.1", port, 1, 0.0, 4)
            finally:
                stop(busy)
        finally:
            stop_server(proc)

    def row(r: dict) -> dict:
        return {"first_audio_ms": r["ttfa_ms"]["p50"], "delivered_audio_per_s": r["delivered_audio_per_s"],
                "underrun_ms": r["underrun_ms"]["max"], "errors": r["errors"]}

    return {"alone": row(alone), "beside_neighbour": row(beside)}


def benchmark(model_dir: Path, settings: tuple[tuple[int, int], ...] = SETTINGS, precision: str = "int8",
              codec_precision: str = "int8", frames: int = FRAMES, repeats: int = REPEATS,
              server: bool = True) -> dict:
    """Every (GOMP_SPINCOUNT, threads) setting in turn within each repeat (module docstring); the medians per
    setting, and each setting's ratios to the first setting's `alone` too (`*_over_first_alone`): the runtime's
    default alone is what a user compares with."""
    load_start = [round(x, 2) for x in os.getloadavg()]
    model_dir = Path(model_dir).resolve()
    runs = {s: {"alone": [], "pair": [], "beside": [], "audio": []} for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"{i}.wav" for i in range(2)]
        spin, threads = settings[0]
        say(model_dir, outs[0], spin, threads, precision, codec_precision, 8).wait()  # int8 files written once
        for r in range(repeats):
            for setting in settings:
                spin, threads = setting
                run = runs[setting]

                def one(out: Path, spin=spin, threads=threads) -> subprocess.Popen:
                    return say(model_dir, out, spin, threads, precision, codec_precision, frames)

                run["alone"] += walls([one(outs[0])])
                run["audio"].append(audio_seconds(outs[0]))
                run["pair"] += walls([one(o) for o in outs])
                busy = neighbour()
                try:
                    run["beside"] += walls([one(outs[0])])
                finally:
                    stop(busy)
                print(f"repeat {r + 1}/{repeats}, GOMP_SPINCOUNT={spin}, {threads} threads: alone {run['alone'][-1]} "
                      f"s, pair {run['pair'][-2:]} s, beside a neighbour {run['beside'][-1]} s",
                      file=sys.stderr, flush=True)
    rows, first = [], statistics.median(runs[settings[0]]["alone"])
    for setting in settings:
        spin, threads = setting
        alone, pair, beside = (statistics.median(runs[setting][k]) for k in ("alone", "pair", "beside"))
        row = {"gomp_spincount": spin, "threads": threads, "alone_s": alone, "pair_s": pair,
               "pair_over_alone": round(pair / alone, 2), "beside_s": beside,
               "beside_over_alone": round(beside / alone, 2), "alone_over_first_alone": round(alone / first, 2),
               "pair_over_first_alone": round(pair / first, 2), "audio_s": statistics.median(runs[setting]["audio"]),
               "runs": runs[setting]}
        if server:
            row["server"] = server_rows(model_dir, spin, threads, precision, codec_precision)
        rows.append(row)
    machine = describe(sorted({t for _, t in settings if isinstance(t, int)}) or [2])
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"machine": machine, "load_average_start": load_start, "checkpoint": model_dir.name,
            "precision": precision, "codec_precision": codec_precision, "frames": frames, "repeats": repeats,
            "text": TEXT, "rows": rows}


def table(result: dict) -> str:
    lines = [f"{result['checkpoint']} {result['precision']} (codec {result['codec_precision']}), "
             f"{result['frames']} frames; load before {result['load_average_start']}",
             f"{'GOMP_SPINCOUNT':>14} {'threads':>7} {'alone s':>8} {'pair s':>8} {'pair/alone':>10} "
             f"{'pair/first':>10} {'beside s':>9} {'beside/alone':>12}  server: first audio ms, audio s/s, underrun "
             "ms (alone -> beside)"]
    for r in result["rows"]:
        line = (f"{r['gomp_spincount']:>14} {r['threads']:>7} {r['alone_s']:>8.2f} {r['pair_s']:>8.2f} "
                f"{r['pair_over_alone']:>10.2f} {r['pair_over_first_alone']:>10.2f} {r['beside_s']:>9.2f} "
                f"{r['beside_over_alone']:>12.2f}")
        if "server" in r:
            a, b = r["server"]["alone"], r["server"]["beside_neighbour"]
            line += (f"  {a['first_audio_ms']} -> {b['first_audio_ms']}, {a['delivered_audio_per_s']} -> "
                     f"{b['delivered_audio_per_s']}, {a['underrun_ms']} -> {b['underrun_ms']}")
        lines.append(line)
    return "\n".join(lines)
