"""Does decoding on one core while the other generates pay off? A measurement. Introduced in 10.

    python -m qtts_lib.overlap --checkpoint full-base --precision int8 -o data/bench/overlap/NAME.json

The codec could run in a second process, decoding chunk k while the loop generates chunk k+1 (the Python
binding holds the GIL inside `extract`, so threads would not overlap). That pays only if the two together beat
running them one after the other on all cores. Four arrangements, each in fresh processes, repeated:
- sequential: generation on every core, then the codec on every core (what `Synthesizer.synthesize` does);
- split: generation on one thread while a second process decodes continuously on one thread (a pipeline's
  throughput is the slower of the two);
- oversubscribed: generation on every core while the codec process runs on one;
- pipeline: the product's form of split, `Synthesizer(threads=cores - 1, codec_process=True).synthesize` timed whole
  (`runtime.pipeline`: the codec process decodes whatever frames have come whenever it is free; its "codec" is
  the tail the loop did not hide).
Numbers are ms per frame; a frame is 80 ms of audio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FRAMES = 40


def _child(mode: str, model_dir: Path, threads: int, precision: str, frames: int) -> None:
    from . import paths, perf
    from .runtime.audio import load_wav
    from .runtime.codec import Codec
    from .runtime.synthesizer import Synthesizer

    if mode == "codec":  # decode `frames`-frame chunks until killed; one line per chunk
        cfg = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
        codec = Codec(model_dir / "ncnn", cfg, threads)
        codes = np.random.default_rng(0).integers(0, cfg["codebook_size"], (frames, 16))
        codec.decode(codes)
        print("READY", flush=True)
        while True:
            t0 = time.perf_counter()
            codec.decode(codes)
            print(f"CODEC {1000 * (time.perf_counter() - t0) / frames:.2f} {time.time():.3f}", flush=True)
    if mode == "pipeline":  # the product's form of split: Synthesizer(codec_process=True).synthesize
        synth = Synthesizer(model_dir, threads=threads, precision=precision, codec_process=True)
        voice = synth.voice(wav=load_wav(paths.voice_wav()))
        synth.synthesize(perf.DEFAULT_TEXT, "english", voice, max_new_tokens=3)
        t0 = time.perf_counter()
        result = synth.synthesize(perf.DEFAULT_TEXT, "english", voice, max_new_tokens=frames + 1)
        n = len(result.codes)
        out = {"generate": 1000 * (result.seconds["talker"] + result.seconds["predictor"] + result.seconds["prefill"])
               / n, "codec": 1000 * result.seconds["codec"] / n, "per_frame": 1000 * (time.perf_counter() - t0) / n}
        synth.close()
        print("QTTS_OVERLAP " + json.dumps(out), flush=True)
        return
    synth = Synthesizer(model_dir, threads=threads, precision=precision)
    prompt = synth.build_prompt(perf.DEFAULT_TEXT, "english", synth.voice(wav=load_wav(paths.voice_wav())))
    synth.generate(prompt, 3)
    wall0, t0 = time.time(), time.perf_counter()
    codes = synth.generate(prompt, frames + 1).codes
    out = {"generate": 1000 * (time.perf_counter() - t0) / len(codes), "from": wall0, "to": time.time()}
    if mode == "sequential":
        t0 = time.perf_counter()
        synth.codec.decode(codes)
        out["codec"] = 1000 * (time.perf_counter() - t0) / len(codes)
    print("QTTS_OVERLAP " + json.dumps(out), flush=True)


def _spawn(mode: str, model_dir: Path, threads: int, precision: str, frames: int, **kw):
    cmd = [sys.executable, "-m", "qtts_lib.overlap", "--child", mode, "--checkpoint", str(model_dir),
           "--threads", str(threads), "--precision", precision, "--frames", str(frames)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, **kw)


def _result(proc) -> dict:
    out, _ = proc.communicate()
    line = next((x for x in out.splitlines() if x.startswith("QTTS_OVERLAP ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"overlap child failed (exit {proc.returncode})")
    return json.loads(line.split(" ", 1)[1])


def measure(model_dir: Path, precision: str = "int8", cores: int | None = None, frames: int = FRAMES,
            repeats: int = 2) -> dict:
    """The four arrangements (module docstring), `repeats` rounds interleaved, medians."""
    cores = cores or os.cpu_count()
    runs: dict[str, list[dict]] = {"sequential": [], "split": [], "oversubscribed": [], "pipeline": []}
    for _ in range(repeats):
        runs["sequential"].append(_result(_spawn("sequential", model_dir, cores, precision, frames)))
        runs["pipeline"].append(_result(_spawn("pipeline", model_dir, max(cores - 1, 1), precision, frames)))
        for name, gen_threads in (("split", 1), ("oversubscribed", cores)):
            codec = _spawn("codec", model_dir, 1, precision, frames)
            assert codec.stdout.readline().strip() == "READY"
            gen = _result(_spawn("generate", model_dir, gen_threads, precision, frames))
            codec.kill()
            rows = [line.split() for line in codec.communicate()[0].splitlines() if line.startswith("CODEC ")]
            during = [float(ms) for _, ms, end in rows if gen["from"] < float(end) <= gen["to"]]  # overlapping
            runs[name].append({"generate": gen["generate"], "codec": statistics.median(during or [float("nan")])})
    med = {name: {k: round(statistics.median(r[k] for r in rs), 1) for k in ("generate", "codec")}
           for name, rs in runs.items()}
    med["pipeline"]["per_frame"] = round(statistics.median(r["per_frame"] for r in runs["pipeline"]), 1)
    med["sequential"]["per_frame"] = round(med["sequential"]["generate"] + med["sequential"]["codec"], 1)
    for name in ("split", "oversubscribed"):
        med[name]["per_frame"] = max(med[name]["generate"], med[name]["codec"])  # a pipeline's throughput
    from .perf import describe_machine

    return {"machine": describe_machine(sorted({1, cores})), "checkpoint": model_dir.name, "precision": precision,
            "cores": cores, "frames": frames,
            "repeats": repeats, "load_average": [round(x, 2) for x in os.getloadavg()], "ms_per_frame": med}


def main(argv: list[str] | None = None) -> int:
    from . import paths
    from .perf import write_result

    p = argparse.ArgumentParser(prog="python -m qtts_lib.overlap", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="full-base")
    p.add_argument("--precision", default="int8")
    p.add_argument("--threads", type=int, default=0, help="cores for the sequential run (default: all)")
    p.add_argument("--frames", type=int, default=FRAMES)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--child", choices=["sequential", "generate", "codec", "pipeline"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    model_dir = paths.checkpoint_dir(args.checkpoint)
    if args.child:
        _child(args.child, model_dir, args.threads or 1, args.precision, args.frames)
        return 0
    result = measure(model_dir, args.precision, args.threads or None, args.frames, args.repeats)
    print(write_result(result, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
