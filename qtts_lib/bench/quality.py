"""What a precision tier costs in quality, measured against fp32. Introduced in 13.

    python -m qtts_lib.bench quality --checkpoint full-base --frames 200 -o data/bench/quality/NAME.json

For every tier, on the same prompt (`workload.voice`: an x-vector clone of data/inputs/voice.wav on Base), greedy:
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

import gc
import json
from pathlib import Path

import numpy as np

from ..runtime.pipeline.sampling import Sampler, Sampling
from .machine import describe
from .workload import LANGUAGE, TEXT, voice


class TeacherForced(Sampler):
    """A sampler that feeds the loop the `teacher`'s codes (T, groups) and records the model's own greedy picks
    beside them (`chosen`, (T, groups)): each decision is then judged from the same history."""

    def __init__(self, teacher: np.ndarray, talker_cfg: dict):
        super().__init__(Sampling(greedy=True), talker_cfg)
        self.teacher, self.chosen = np.asarray(teacher, np.int64), []

    def first(self, logits, generated):
        self.chosen.append([super().first(logits, generated)])
        return int(self.teacher[len(generated), 0])

    def code(self, logits, codes, s):
        self.chosen[-1].append(super().code(logits, codes, s))
        return int(self.teacher[len(self.chosen) - 1, s + 1])


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
    step graph (`rewrites.decode_step`) against the tier's step graph, from the same input row."""
    from .. import probe
    from ..runtime.binding import rope
    from ..runtime.pipeline import precision

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
            progress: bool = True) -> dict:
    """Teacher-forced agreement, first divergent frame and per-layer error of each tier against fp32."""
    from tqdm.auto import tqdm

    from ..runtime import Synthesizer

    model_dir = Path(model_dir)
    greedy = Sampling(greedy=True)

    def run(synth, prompt, sampler, desc):
        bar = tqdm(total=frames, desc=desc, unit="frame", disable=not progress, leave=False)
        seq = synth.loop.start(prompt, sampler, frames)
        while synth.loop.step(seq) is not None:
            bar.update(1)
        bar.close()
        return np.stack(seq.codes).astype(np.int64)

    synth = Synthesizer(model_dir, threads=threads)
    prompt = synth.prompt(TEXT, LANGUAGE, voice(synth))
    talker_cfg = synth.config.talker
    reference = run(synth, prompt, Sampler(greedy, talker_cfg), "fp32 greedy")
    embed = prompt.embeds[-1]
    del synth
    gc.collect()
    result = {"checkpoint": model_dir.name, "machine": describe([threads]), "frames": int(len(reference)),
              "threads": threads, "text": TEXT, "codebooks": int(reference.shape[1]), "tiers": {}}
    for tier in tiers:
        synth = Synthesizer(model_dir, threads=threads, precision=tier)
        forced = TeacherForced(reference, talker_cfg)
        run(synth, prompt, forced, f"{tier} teacher-forced")
        own = reference if tier == "fp32" else run(synth, prompt, Sampler(greedy, talker_cfg), f"{tier} free-running")
        del synth
        gc.collect()
        agree = agreement(np.array(forced.chosen, np.int64), reference)
        result["tiers"][tier] = {
            "agreement": [round(float(x), 4) for x in agree],
            "agreement_codebook0": round(float(agree[0]), 4),
            "agreement_predictor_mean": round(float(agree[1:].mean()), 4),
            "first_divergent_frame": first_divergence(own, reference),
            "layer_errors": None if tier == "fp32" else layer_errors(model_dir / "ncnn", tier, embed, threads),
        }
    return result
