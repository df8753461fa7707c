"""What a precision tier costs in quality, measured against fp32. Introduced in 13.

    python -m qtts_lib.bench quality --checkpoint full-base --frames 200 -o data/bench/quality/NAME.json

For every tier, on the same prompt (`workload.voice`: an x-vector clone of data/inputs/voice.wav on Base), greedy:
- teacher-forced top-1 agreement: fp32's greedy codes are fed to the tier frame by frame and code by
  code; at every position we record whether the tier would have picked the same code. One number per
  codebook (0 from the talker, 1..15 from the code predictor). fp32 against itself must give 1.0
  everywhere, which checks the harness.
- the first divergent frame when the tier runs free (its own picks fed back; the run stops there).
- per-layer relative error of one decode step of each decoder the tier changes (`probe.probe_ncnn`, the fp32 step
  graph against the tier's), from the same input.
- the weight bytes a frame reads in the tier (`precision.frame_bytes`).
And once per int8 form the tiers use, each projection's own error (`projection_errors`): the fp32 step's input to
every projection through the form's arithmetic (`rewrites.int8.int8_matmul`) against fp32, by class (q, k, v, o,
gate, up, down, the predictor's input projection): which projection loses most, not where the error has piled up.

The split tiers (`precision.SPLIT_TIERS`: `int8-talker`, `int8-predictor`) make one decoder int8 and leave the
other fp32, so the agreement says which decoder loses the codes. The code predictor reads the talker's hidden
state, so an int8 talker also moves the predictor's picks (codebooks 1-15), while an int8 predictor leaves
codebook 0 alone.
The codec and the embeddings are fp32 in every tier, so the waveform of a given set of codes does not
change with the tier; what changes is which codes are generated.

Random weights make near-ties between the top logits common, so agreement measured on a random-init
checkpoint is a pessimistic proxy for a trained one; the same command runs on a real checkpoint.
"""
from __future__ import annotations

import gc
import json
from contextlib import contextmanager
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
    step graph (`rewrites.decode_step`) against the tier's step graph, from the same input row. None for a decoder
    the tier leaves fp32 (a split tier's other decoder)."""
    from .. import probe
    from ..runtime.binding import rope
    from ..runtime.pipeline import precision

    out = {}
    for name, head_dim, theta in _decoders(ncnn_dir.parent):
        if tier != "fp16" and precision.int8_form(tier, name) is None:
            out[name] = None
            continue
        cos, sin = rope.tables(head_dim, theta, 0, 1)
        inputs = [embed[None, None].astype(np.float32), np.zeros((1, 1), np.float32), cos, sin]
        a, b = (precision.step_graph(ncnn_dir, name, t).probe_options(ncnn_dir, threads) for t in ("fp32", tier))
        res = probe.probe_ncnn(ncnn_dir, name, inputs, a, b)
        out[name] = {"labels": res.labels, "types": [r["type"] for r in res.rows],
                     "rel": [float(x) for x in res.errors], "worst": res.worst["label"],
                     "worst_rel": float(res.worst["rel"]), "output_rel": float(res.errors[-1])}
    return out


PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # a decoder layer's Gemms, in .param (forward) order


def projection_classes(text: str, cfg: dict) -> list[tuple[str, str]]:
    """(Gemm name, class) of every projection of a decoder graph: a Gemm with a bias is the predictor's input
    projection (`in_proj`), the others come seven a layer in `PROJECTIONS` order; each class's shape is checked
    against the decoder's config `cfg` (heads, head_dim, intermediate), so a graph in another order is refused."""
    from ..runtime.binding.graph import params_dict
    from ..runtime.rewrites.int8 import eligible_gemms, has_bias

    gemms = eligible_gemms(text)
    plain = [g for g in gemms if not has_bias(g)]
    if len(plain) != len(PROJECTIONS) * cfg["num_hidden_layers"]:
        raise ValueError(f"{len(plain)} projections, not {len(PROJECTIONS)} per layer")
    q_width, kv_width = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    want = {"q": (q_width, None), "k": (kv_width, None), "v": (kv_width, None), "o": (None, q_width),
            "gate": (cfg["intermediate_size"], None), "up": (cfg["intermediate_size"], None),
            "down": (None, cfg["intermediate_size"])}
    out = []
    for g in gemms:
        if has_bias(g):
            out.append((g.name, "in_proj"))
            continue
        cls = PROJECTIONS[plain.index(g) % len(PROJECTIONS)]
        d = params_dict(g)
        n, k = want[cls]
        if (n is not None and int(d["8"]) != n) or (k is not None and int(d["9"]) != k):
            raise ValueError(f"{g.name} ({d['8']} x {d['9']}) is not a {cls} projection")
        out.append((g.name, cls))
    return out


@contextmanager
def kept_fp32(model_dir: Path, cls: str):
    """A probe, for this harness alone (no tier of the runtime): inside it, every int8 decoder graph is written with
    the projections of class `cls` (`projection_classes`: q, k, v, o, gate, up, down, in_proj) left fp32, into
    folders of their own (`ncnn/int8-<form>-keep-<cls>/`), so the int8 tiers measured inside say what keeping one
    class wider buys. Yields {decoder: projections kept}."""
    from ..runtime.pipeline import precision

    if cls not in (*PROJECTIONS, "in_proj"):
        raise ValueError(f"no projection class {cls!r}; there are {', '.join((*PROJECTIONS, 'in_proj'))}")
    talker = json.loads((Path(model_dir) / "config.json").read_text())["talker_config"]
    configs = {"talker_decoder": talker, "predictor_decoder": talker["code_predictor_config"]}
    kept: dict[str, int] = {}
    graph, paths = precision.int8_graph, precision.int8_paths

    def keeping(text, data, fuse=True, keep=(), form="rows"):
        for name, cfg in configs.items():
            try:  # a graph of the other decoder (another layer count) or a head is refused here
                names = [g for g, c in projection_classes(text, cfg) if c == cls]
            except ValueError:
                continue
            kept[name] = len(names)
            return graph(text, data, fuse=fuse, keep=(*keep, *names), form=form)
        return graph(text, data, fuse=fuse, keep=keep, form=form)

    def own_folder(ncnn_dir, name, form="rows"):
        param, bin_ = paths(ncnn_dir, name, form)
        folder = param.parent.with_name(f"{param.parent.name}-keep-{cls}")
        return folder / param.name, folder / bin_.name

    precision.int8_graph, precision.int8_paths = keeping, own_folder
    try:
        yield kept
    finally:
        precision.int8_graph, precision.int8_paths = graph, paths


def projection_errors(ncnn_dir: Path, forms, embed: np.ndarray, threads: int) -> dict:
    """Each projection's own relative error in each int8 form of `forms`, for one decode step (position 0, empty
    cache) of each decoder from the same input row as `layer_errors`: the fp32 graph's input to every projection,
    through `rewrites.int8.int8_matmul` against the fp32 product. Per decoder and form: mean and max by class, and
    the worst projection."""
    from concurrent.futures import ThreadPoolExecutor

    from .. import probe
    from ..runtime.binding import rope
    from ..runtime.binding.param import parse_param
    from ..runtime.binding.weights import split_bin

    ncnn_dir = Path(ncnn_dir)
    model_cfg = json.loads((ncnn_dir.parent / "config.json").read_text())["talker_config"]
    cfgs = {"talker_decoder": model_cfg, "predictor_decoder": model_cfg["code_predictor_config"]}
    out = {form: {} for form in forms}
    for name, head_dim, theta in _decoders(ncnn_dir.parent):
        param = ncnn_dir / f"{name}_kv.param"
        text = param.read_text()
        classes = projection_classes(text, cfgs[name])
        layers = {layer.name: layer for layer in parse_param(text).layers}
        cos, sin = rope.tables(head_dim, theta, 0, 1)
        inputs = [embed[None, None].astype(np.float32), np.zeros((1, 1), np.float32), cos, sin]
        net = probe.load_net(param, ncnn_dir / f"{name}.bin", threads)
        blobs = list(dict.fromkeys(layers[g].inputs[0] for g, _ in classes))
        acts = probe.extract_blobs(net, inputs, blobs, probe.input_axes(ncnn_dir, name)[:4])
        del net
        rows = {form: [] for form in forms}
        segs = split_bin(text, (ncnn_dir / f"{name}.bin").read_bytes())
        jobs = [(layers[g], segs[g][0], acts[layers[g].inputs[0]], forms) for g, _ in classes]
        with ThreadPoolExecutor(max(1, threads)) as pool:  # numpy's array work runs outside the GIL
            for (g, cls), errs in zip(classes, pool.map(_projection_error, *zip(*jobs))):
                for form, err in zip(forms, errs):
                    rows[form].append((g, cls, err))
        del jobs, segs
        for form in forms:
            by_class = {}
            for _, cls, err in rows[form]:
                by_class.setdefault(cls, []).append(err)
            worst = max(rows[form], key=lambda r: r[2])
            out[form][name] = {
                "classes": {c: {"count": len(e), "mean": round(float(np.mean(e)), 5), "max": round(max(e), 5)}
                            for c, e in by_class.items()},
                "worst": {"gemm": worst[0], "class": worst[1], "rel": round(worst[2], 5)},
                "worst_class": max(by_class, key=lambda c: np.mean(by_class[c]))}
    return out


def _projection_error(layer, weights, x: np.ndarray, forms) -> list[float]:
    """One projection's relative error in each of `forms` on input x, against its fp32 product."""
    from ..runtime.binding.graph import params_dict
    from ..runtime.rewrites.int8 import int8_matmul

    d = params_dict(layer)
    w = weights.array().reshape(int(d["8"]), int(d["9"]))
    x = x.reshape(-1, w.shape[1])
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    norm = max(np.linalg.norm(exact), 1e-30)
    return [float(np.linalg.norm(int8_matmul(x, w, form) - exact) / norm) for form in forms]


def _decoders(model_dir: Path) -> list[tuple[str, int, float]]:
    talker = json.loads((model_dir / "config.json").read_text())["talker_config"]
    pred = talker["code_predictor_config"]
    return [("talker_decoder", talker["head_dim"], talker["rope_theta"]),
            ("predictor_decoder", pred["head_dim"], pred["rope_theta"])]


def measure(model_dir: Path, tiers=("fp32", "fp16", "int8"), frames: int = 200, threads: int = 2,
            progress: bool = True, on_tier=None) -> dict:
    """Teacher-forced agreement, first divergent frame, per-layer error and weight bytes per frame of each tier
    against fp32, and each projection's own error in every int8 form the tiers use. `on_tier(result)` is called
    after each tier with what is measured so far (a long run cut off still leaves its finished tiers)."""
    import time

    from tqdm.auto import tqdm

    from ..runtime import Synthesizer
    from ..runtime.pipeline import precision

    model_dir = Path(model_dir)
    greedy = Sampling(greedy=True)

    def run(synth, prompt, sampler, desc):
        bar = tqdm(total=frames, desc=desc, unit="frame", disable=not progress, leave=False)
        seq = synth.loop.start(prompt, sampler, frames)
        while synth.loop.step(seq) is not None:
            bar.update(1)
        bar.close()
        return np.stack(seq.codes).astype(np.int64)

    def run_free(synth, prompt, desc):
        """Free-running greedy until its first frame that differs from the reference (None: none does)."""
        bar = tqdm(total=frames, desc=desc, unit="frame", disable=not progress, leave=False)
        seq = synth.loop.start(prompt, Sampler(greedy, talker_cfg), frames)
        while synth.loop.step(seq) is not None:
            bar.update(1)
            i = len(seq.codes) - 1
            if i >= len(reference) or not np.array_equal(seq.codes[i], reference[i]):
                bar.close()
                return i
        bar.close()
        return first_divergence(np.stack(seq.codes).astype(np.int64), reference)

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
        t0 = time.perf_counter()
        synth = Synthesizer(model_dir, threads=threads, precision=tier)
        forced = TeacherForced(reference, talker_cfg)
        run(synth, prompt, forced, f"{tier} teacher-forced")
        diverged = None if tier == "fp32" else run_free(synth, prompt, f"{tier} free-running")
        del synth
        gc.collect()
        agree = agreement(np.array(forced.chosen, np.int64), reference)
        result["tiers"][tier] = {
            "decoders": {n: precision.int8_form(tier, n) or ("fp16" if tier == "fp16" else "fp32")
                         for n in precision.INT8_GRAPHS},
            "agreement": [round(float(x), 4) for x in agree],
            "agreement_codebook0": round(float(agree[0]), 4),
            "agreement_predictor_mean": round(float(agree[1:].mean()), 4),
            "first_divergent_frame": diverged,
            "weight_bytes_per_frame": precision.frame_bytes(model_dir / "ncnn", tier),
            "layer_errors": None if tier == "fp32" else layer_errors(model_dir / "ncnn", tier, embed, threads),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if on_tier:
            on_tier(result)
    forms = sorted({f for t in tiers for n in precision.INT8_GRAPHS if (f := precision.int8_form(t, n))})
    if forms:
        t0 = time.perf_counter()
        result["projection_errors"] = projection_errors(model_dir / "ncnn", forms, embed, threads)
        result["projection_errors_seconds"] = round(time.perf_counter() - t0, 1)
    return result
