"""The int8 loop's projections alone against its floor: how much of the loop's distance to the floor is ncnn's int8
GEMV itself. Introduced in 13.

    python -m qtts_lib.bench projections [--checkpoint full-base] [--threads 2] [--repeats 9] [-o OUT.json]

For each cached decoder of the int8 tier, one graph holds only its projections (every int8 Gemm, `rewrites.int8`),
each fed from one input row of its width, their outputs gathered by one
Concat: the same weights the loop reads, the same kernels, none of the loop's other layers, one call per decoder
call. A frame is the talker's call once and the predictor's 15 times (each predictor call also reads one of its 15
int8 heads, put in its graph), timed in the same process as the streaming-read probe (`machine.read_bandwidth_gbs`),
interleaved, medians. `projections / floor` near 1 says the kernel streams at the probe's rate; the loop's own
`loop / floor` (`bench loop`) minus it is what everything else costs. The same weights are timed in the tier's
earlier forms too (`FORMS`, `as_earlier_form`), interleaved with it: what writing the weights as the Gemm's A bought;
and as ncnn's int8 InnerProduct (`as_innerproduct`), its other int8 GEMV, to see whether it streams faster.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from ..runtime.binding.graph import Graph, params_dict, set_params
from ..runtime.binding.param import ParamLayer
from ..runtime.binding.weights import Segment, join_bin, split_bin


def projections_graph(text: str, data: bytes, extra: tuple[str, bytes] | None = None) -> tuple[str, bytes, int]:
    """An int8 decoder graph -> (its projections alone, their .bin, bytes of weights they read: int8 weights and
    row scales). `extra`: another int8 graph (a head) whose first int8 projection joins them."""
    layers, segs = [], {}
    for t, d in [(text, data)] + ([extra] if extra else []):
        g, s = Graph(t), split_bin(t, d)
        gemms = [lyr for lyr in g.layers if lyr.type == "Gemm" and params_dict(lyr).get("18") == "2"]
        if extra and t is extra[0]:
            gemms = gemms[:1]
        for gemm in gemms:
            prefix = f"p{len(layers)}_"
            k = int(params_dict(gemm)["9"])
            layers.append((k, ParamLayer("Gemm", prefix + gemm.name, [f"x{k}"], [prefix + "o"], list(gemm.params))))
            segs[prefix + gemm.name] = s[gemm.name]
    widths = sorted({k for k, _ in layers})
    users = {k: [i for i, (kk, _) in enumerate(layers) if kk == k] for k in widths}
    out = [ParamLayer("Input", f"in{k}", [], [f"in{k}"], []) for k in widths]
    out += [ParamLayer("Split", f"split{k}", [f"in{k}"], [f"x{k}_{i}" for i in users[k]], []) for k in widths]
    for i, (k, gemm) in enumerate(layers):
        gemm.inputs = [f"x{k}_{i}"]
        out.append(gemm)
    out.append(ParamLayer("Concat", "gather", [f"p{i}_o" for i in range(len(layers))], ["out0"], ["0=1"]))
    g = Graph("7767517\n0 0\n")
    g.layers = out
    new = g.text()
    weight_bytes = sum(len(seg.data) for ss in segs.values() for seg in ss)
    return new, join_bin(new, segs), weight_bytes


def as_earlier_form(text: str, data: bytes, tiles: bool = False) -> tuple[str, bytes]:
    """A projections graph (int8 Gemms with the weights as A, `rewrites.int8`) in another form over the same int8
    weights, for the side-by-side of `measure`: `tiles=True` the same Gemms with ncnn's own K tiles (no `22=K`);
    otherwise the tier's first form, the weights as the Gemm's constant B with one scale for the tensor (127: rows
    normalised to |max| = 1) and the row scales applied after it by a BinaryOp with a MemoryData table."""
    g, segs = Graph(text), split_bin(text, data)
    out = {}
    for gemm in [lyr for lyr in g.layers if lyr.type == "Gemm"]:
        d = params_dict(gemm)
        if tiles:
            d.pop("22", None)
            set_params(gemm, d)
            out[gemm.name] = segs[gemm.name]
            continue
        n = int(d["7"])
        weights, a_scales = segs[gemm.name]
        rows = 127.0 / np.frombuffer(a_scales.data, np.float32)
        d.update({"4": "0", "5": "1", "7": "0", "8": str(n)})
        for key in ("14", "22"):
            d.pop(key, None)
        set_params(gemm, d)
        table, scaled = gemm.name + "_rows", gemm.name + "_q"
        final, gemm.outputs = gemm.outputs[0], [scaled]
        i = g.layers.index(gemm)
        g.layers[i + 1 : i + 1] = [ParamLayer("MemoryData", table, [], [table], [f"0={n}"]),
                                   ParamLayer("BinaryOp", gemm.name + "_mul", [scaled, table], [final], ["0=2"])]
        out[gemm.name] = [weights, Segment(1, False, np.float32(127.0).tobytes())]
        out[table] = [Segment.of(rows, False)]
    new = g.text()
    return new, join_bin(new, out | {k: v for k, v in segs.items() if k not in out})


def as_innerproduct(text: str, data: bytes, input_scales: dict[int, float] | None = None) -> tuple[str, bytes]:
    """The same projections graph as ncnn's int8 InnerProduct over the same int8 weights and row scales: ncnn's
    other int8 GEMV, each input reshaped to 1-D in the graph (at one 2-D row InnerProduct runs on one thread), with a
    *static* input scale per input width, `input_scales` (127 / absmax of that input; default 127 / 4, which the
    kernel's time does not depend on). Not a product form: a step's activations have no fixed range to calibrate
    without a real checkpoint. Outputs are one 1-D blob, the same numbers in the same order as the Gemms'."""
    g, segs = Graph(text), split_bin(text, data)
    out, layers = {}, []
    for layer in g.layers:
        if layer.type == "Input":
            k = int(layer.outputs[0][2:])
            flat = f"{layer.outputs[0]}_1d"
            layers += [layer, ParamLayer("Reshape", f"flat{k}", [layer.outputs[0]], [flat], [f"0={k}"])]
            continue
        if layer.type == "Split":
            layer.inputs = [f"{layer.inputs[0]}_1d"]
        elif layer.type == "Concat":
            set_params(layer, {"0": "0"})
        elif layer.type == "Gemm":
            d = params_dict(layer)
            n, k = int(d["7"]), int(d["9"])
            weights, row_scales = segs[layer.name]
            scale = (input_scales or {}).get(k, 127.0 / 4)
            layer = ParamLayer("InnerProduct", layer.name, layer.inputs, layer.outputs,
                               [f"0={n}", "1=0", f"2={n * k}", "8=1"])
            out[layer.name] = [weights, row_scales, Segment(1, False, np.float32(scale).tobytes())]
        layers.append(layer)
    g.layers = layers
    new = g.text()
    return new, join_bin(new, out | {k: v for k, v in segs.items() if k not in out})


FORMS = {"weights_as_a": None,                       # the tier as written (`rewrites.int8`)
         "weights_as_a_ncnn_tiles": partial(as_earlier_form, tiles=True),
         "weights_as_b_row_scales": as_earlier_form,  # the tier's first form (the lab notes)
         "innerproduct_static_scale": as_innerproduct}  # ncnn's other int8 GEMV (timing only)


def decoder_projections(ncnn_dir: Path, name: str, rng: np.random.Generator) -> tuple[str, bytes, int, dict]:
    """The int8 tier's `name` decoder as `projections_graph` (the predictor's with its first head: each of its calls
    runs one), and one random input row per width: (text, .bin bytes, weight bytes, inputs)."""
    from ..runtime.pipeline.precision import int8_paths

    param, bin_ = int8_paths(ncnn_dir, name)
    extra = None
    if name == "predictor_decoder":
        hp, hb = int8_paths(ncnn_dir, "predictor_heads")
        extra = (hp.read_text(), hb.read_bytes())
    text, data, nbytes = projections_graph(param.read_text(), bin_.read_bytes(), extra)
    widths = [int(line.split()[1][2:]) for line in text.splitlines() if line.startswith("Input")]
    return text, data, nbytes, {f"in{k}": rng.standard_normal((1, k)).astype(np.float32) for k in widths}


def measure(ncnn_dir: Path, threads: int = 2, repeats: int = 9, groups: int = 16) -> dict:
    from ..runtime.binding.net import net_from_text, run
    from ..runtime.pipeline.precision import ensure_int8_tier
    from .machine import read_bandwidth_gbs

    ensure_int8_tier(ncnn_dir, log=print)
    nets, bytes_, inputs = {}, {}, {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("talker_decoder", "predictor_decoder"):
            text, data, nbytes, inputs[name] = decoder_projections(ncnn_dir, name, rng)
            bytes_[name] = nbytes
            for form, rewrite in FORMS.items():
                t, dd = (text, data) if rewrite is None else rewrite(text, data)
                f = Path(tmp) / f"{name}_{form}.bin"
                f.write_bytes(dd)
                nets[form, name] = net_from_text(t, f, threads)
    calls = {"talker_decoder": 1, "predictor_decoder": groups - 1}
    frame_bytes = sum(calls[n] * bytes_[n] for n in calls)
    probe = np.ones(2**28, np.float32)

    def frame(form: str) -> float:
        t0 = time.perf_counter()
        for name, n in calls.items():
            for _ in range(n):
                run(nets[form, name], inputs[name], ["out0"])
        return time.perf_counter() - t0

    forms = list(FORMS)
    for form in forms:
        frame(form)
    times, rates = {f: [] for f in forms}, []
    for r in range(repeats):  # the forms interleaved, each round starting with the next one
        rates.append(read_bandwidth_gbs(threads, array=probe))
        for form in forms[r % len(forms):] + forms[:r % len(forms)]:
            times[form].append(frame(form))
    gbs = statistics.median(rates)
    floor = frame_bytes / (gbs * 1e9) * 1e3
    result = {form: {"projections_ms_per_frame": round(statistics.median(t) * 1e3, 1),
                     "projections_over_floor": round(statistics.median(t) * 1e3 / floor, 3),
                     "projections_gbs": round(frame_bytes / statistics.median(t) / 1e9, 1)}
              for form, t in times.items()}
    return {"threads": threads, "repeats": repeats, "projection_bytes_per_frame": frame_bytes,
            **result["weights_as_a"], "read_bandwidth_gbs": round(gbs, 1), "floor_ms_per_frame": round(floor, 1),
            "forms": result}
