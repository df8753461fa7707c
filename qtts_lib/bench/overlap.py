"""Does decoding on one core while the other generates pay off? A measurement. Introduced in 14.

    python -m qtts_lib.bench overlap --checkpoint full-base --precision int8 [--codec-precision int8] -o OUT.json

The codec could run in a second process, decoding chunk k while the loop generates chunk k+1 (the Python binding
holds the GIL inside `extract`, so threads would not overlap). That pays only if the two together beat running them
one after the other on all cores. Four arrangements, each in fresh processes, repeated:
- sequential: generation on every core, then the codec on every core (what `Synthesizer.synthesize` does);
- split: generation on one thread while a second process decodes continuously on one thread (a pipeline's
  throughput is the slower of the two);
- oversubscribed: generation on every core while the codec process runs on one;
- pipeline: the experiment's own form of split, `Synthesizer(threads=cores - 1, decoders=CodecProcess(...))`
  (`runtime.experimental.codec_process`: the codec process decodes whatever frames have come whenever it is free;
  its "codec" is the tail the loop did not hide), timed whole.
Numbers are ms per frame; a frame is 80 ms of audio.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from . import child
from .machine import describe
from .workload import LANGUAGE, TEXT, voice_wav

FRAMES = 40


def decode_forever(model_dir: str, frames: int, codec_precision: str = "fp32") -> dict:
    """Decode `frames`-frame chunks of random codes until killed, one `CODEC ms_per_frame end_time` line each."""
    from ..runtime.codec.decoder import Codec

    cfg = json.loads((Path(model_dir) / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    codec = Codec(Path(model_dir) / "ncnn", cfg, 1, precision=codec_precision)
    codes = np.random.default_rng(0).integers(0, cfg["codebook_size"], (frames, cfg["num_quantizers"]))
    codec.decode(codes)
    print("READY", flush=True)
    while True:
        t0 = time.perf_counter()
        codec.decode(codes)
        print(f"CODEC {1000 * (time.perf_counter() - t0) / frames:.2f} {time.time():.3f}", flush=True)


def generate(model_dir: str, threads: int, precision: str, frames: int, then_decode: bool,
             codec_precision: str = "fp32") -> dict:
    """Generate `frames` frames (greedy) on `threads` threads; with `then_decode`, decode them after (sequential)."""
    from ..runtime import Sampling, Synthesizer, load_wav
    from ..runtime.pipeline.sampling import Sampler

    synth = Synthesizer(model_dir, threads=threads, precision=precision, codec_precision=codec_precision)
    prompt = synth.prompt(TEXT, LANGUAGE, synth.voice(wav=load_wav(voice_wav())))
    synth.loop.run(prompt, Sampler(Sampling(greedy=True), synth.config.talker), 2)
    wall0, t0 = time.time(), time.perf_counter()
    codes = np.stack(synth.loop.run(prompt, Sampler(Sampling(greedy=True), synth.config.talker), frames).codes)
    out = {"generate": 1000 * (time.perf_counter() - t0) / len(codes), "from": wall0, "to": time.time()}
    if then_decode:
        t0 = time.perf_counter()
        synth.codec.decode(codes)
        out["codec"] = 1000 * (time.perf_counter() - t0) / len(codes)
    return out


def pipeline(model_dir: str, threads: int, precision: str, frames: int, codec_precision: str = "fp32") -> dict:
    """`synthesize` with the codec in a second process, timed whole."""
    from ..runtime import Sampling, Synthesizer, load_wav
    from ..runtime.experimental.codec_process import CodecProcess

    with Synthesizer(model_dir, threads=threads, precision=precision,
                     decoders=CodecProcess.for_checkpoint(model_dir, precision=codec_precision)) as synth:
        voice = synth.voice(wav=load_wav(voice_wav()))
        greedy = Sampling(greedy=True)
        synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=2)
        t0 = time.perf_counter()
        result = synth.synthesize(TEXT, LANGUAGE, voice, greedy, max_frames=frames)
        n, s = len(result.codes), result.seconds
        return {"generate": 1000 * (s["talker"] + s["predictor"] + s["prefill"]) / n, "codec": 1000 * s["codec"] / n,
                "per_frame": 1000 * (time.perf_counter() - t0) / n}


def measure(model_dir: Path, precision: str = "int8", cores: int | None = None, frames: int = FRAMES,
            repeats: int = 2, codec_precision: str = "fp32") -> dict:
    """The four arrangements (module docstring), `repeats` rounds interleaved, medians; the codec in
    `codec_precision` in each."""
    cores = cores or os.cpu_count()
    model_dir = str(model_dir)
    runs: dict[str, list[dict]] = {"sequential": [], "split": [], "oversubscribed": [], "pipeline": []}
    for _ in range(repeats):
        runs["sequential"].append(child.run("overlap", "generate", cores, model_dir=model_dir, threads=cores,
                                            precision=precision, frames=frames, then_decode=True,
                                            codec_precision=codec_precision))
        runs["pipeline"].append(child.run("overlap", "pipeline", max(cores - 1, 1), model_dir=model_dir,
                                          threads=max(cores - 1, 1), precision=precision, frames=frames,
                                          codec_precision=codec_precision))
        for name, gen_threads in (("split", 1), ("oversubscribed", cores)):
            codec = child.spawn("overlap", "decode_forever", 1, model_dir=model_dir, frames=frames,
                                codec_precision=codec_precision)
            if codec.stdout.readline().strip() != "READY":
                raise RuntimeError("the codec process did not start")
            gen = child.run("overlap", "generate", gen_threads, model_dir=model_dir, threads=gen_threads,
                            precision=precision, frames=frames, then_decode=False)
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
    return {"machine": describe(sorted({1, cores})), "checkpoint": Path(model_dir).name, "precision": precision,
            "codec_precision": codec_precision,
            "cores": cores, "frames": frames, "repeats": repeats,
            "load_average": [round(x, 2) for x in os.getloadavg()], "ms_per_frame": med}
