"""What a precision tier costs in quality, measured against fp32. Introduced in 10.

    python -m qtts_lib.quality --checkpoint full-base --frames 200 -o data/bench/quality-full-base.json

For every tier, on the same prompt (an x-vector clone of data/inputs/voice.wav), greedy:
- teacher-forced top-1 agreement: fp32's greedy codes are fed to the tier frame by frame and code by
  code; at every position we record whether the tier would have picked the same code. One number per
  codebook (0 from the talker, 1..15 from the code predictor). fp32 against itself must give 1.0
  everywhere, which checks the harness.
- the first divergent frame when the tier runs free (its own picks fed back).
- per-layer relative error of one decode step of each decoder (`probe.probe_ncnn`, the fp32 step graph
  against the tier's), from the same input.
The codec and the embeddings are fp32 in every tier, so the waveform of a given set of codes does not
change with the tier; what changes is which codes are generated.

Random weights make near-ties between the top logits common, so agreement measured on a random-init
checkpoint is a pessimistic proxy for a trained one; the same command runs on a real checkpoint.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import numpy as np

from .perf import DEFAULT_TEXT, write_result

LANGUAGE = "english"


def first_divergence(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first frame where two code sequences differ (a length difference counts), or None."""
    n = min(len(a), len(b))
    diff = np.nonzero((np.asarray(a[:n]) != np.asarray(b[:n])).any(axis=1))[0]
    if len(diff):
        return int(diff[0])
    return None if len(a) == len(b) else n


def agreement(chosen: np.ndarray, fed: np.ndarray) -> np.ndarray:
    """Per codebook, the fraction of frames where the model's pick equals the fed (fp32) code."""
    return (np.asarray(chosen) == np.asarray(fed)).mean(axis=0)


def layer_errors(ncnn_dir: Path, tier: str, embed: np.ndarray, threads: int) -> dict:
    """Per-layer relative error of one decode step (position 0, empty cache) of each decoder: the fp32
    step graph (`speed.decode_step`) against the tier's step graph, from the same input row."""
    from . import probe
    from .runtime import precision, rope

    out = {}
    for name, head_dim, theta in _decoders(ncnn_dir.parent):
        cos, sin = rope.tables(head_dim, theta, 0, 1)
        inputs = [embed[None, None].astype(np.float32), np.zeros((1, 1), np.float32), cos, sin]
        a, b = (precision.step_graph(ncnn_dir, name, t).probe_options(ncnn_dir, threads) for t in ("fp32", tier))
        res = probe.probe_ncnn(ncnn_dir, name, inputs, a, b)
        out[name] = {"labels": res.labels, "types": [r["type"] for r in res.rows],
                     "rel": [float(x) for x in res.errors], "worst": res.worst["label"],
                     "worst_rel": float(res.worst["rel"]), "output_rel": float(res.errors[-1])}
    return out


def _decoders(model_dir: Path) -> list[tuple[str, int, float]]:
    talker = json.loads((model_dir / "config.json").read_text())["talker_config"]
    pred = talker["code_predictor_config"]
    return [("talker_decoder", talker["head_dim"], talker["rope_theta"]),
            ("predictor_decoder", pred["head_dim"], pred["rope_theta"])]


def measure(model_dir: Path, tiers=("fp32", "fp16", "int8"), frames: int = 200, threads: int = 2,
            text: str = DEFAULT_TEXT, voice_wav: Path | None = None, progress: bool = True) -> dict:
    """Teacher-forced agreement, first divergent frame and per-layer error of each tier against fp32."""
    from tqdm.auto import tqdm

    from . import paths
    from .runtime.audio import load_wav
    from .runtime.synthesizer import Synthesizer

    model_dir = Path(model_dir)
    clip = load_wav(voice_wav or paths.voice_wav())

    def bar(desc):
        b = tqdm(total=frames, desc=desc, unit="frame", disable=not progress, leave=False)
        return b, (lambda n: b.update(1))

    synth = Synthesizer(model_dir, threads=threads)
    voice = synth.voice(wav=clip)
    prompt = synth.build_prompt(text, LANGUAGE, voice)
    b, tick = bar("fp32 greedy")
    reference = synth.generate(prompt, frames + 1, greedy=True, on_frame=tick).codes
    b.close()
    embed = prompt.embeds[-1]
    del synth
    gc.collect()
    result = {"checkpoint": model_dir.name, "frames": int(len(reference)), "threads": threads, "text": text,
              "codebooks": int(reference.shape[1]), "tiers": {}}
    for tier in tiers:
        synth = Synthesizer(model_dir, threads=threads, precision=tier)
        b, tick = bar(f"{tier} teacher-forced")
        forced = synth.generate(prompt, frames + 1, greedy=True, teacher=reference, on_frame=tick)
        b.close()
        if tier == "fp32":
            own = reference
        else:
            b, tick = bar(f"{tier} free-running")
            own = synth.generate(prompt, frames + 1, greedy=True, on_frame=tick).codes
            b.close()
        del synth
        gc.collect()
        agree = agreement(forced.chosen, reference)
        result["tiers"][tier] = {
            "agreement": [round(float(x), 4) for x in agree],
            "agreement_codebook0": round(float(agree[0]), 4),
            "agreement_predictor_mean": round(float(agree[1:].mean()), 4),
            "first_divergent_frame": first_divergence(own, reference),
            "layer_errors": None if tier == "fp32" else layer_errors(model_dir / "ncnn", tier, embed, threads),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    from . import paths

    p = argparse.ArgumentParser(prog="python -m qtts_lib.quality", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="full-base", help="a name under models/ or a checkpoint directory")
    p.add_argument("--precision", default="fp32,fp16,int8", help="comma-separated tiers")
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-o", "--output", type=Path)
    args = p.parse_args(argv)
    model_dir = paths.checkpoint_dir(args.checkpoint)
    tiers = tuple(t.strip() for t in args.precision.split(","))
    result = measure(model_dir, tiers, args.frames, args.threads)
    write_result(result, args.output)
    summary = {t: {k: v for k, v in r.items() if k != "layer_errors"} for t, r in result["tiers"].items()}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
