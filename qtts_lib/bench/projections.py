"""The int8 loop's projections alone against its floor: how much of the loop's distance to the floor is ncnn's int8
GEMV itself. Introduced in 10 (issue 24).

    python -m qtts_lib.bench projections [--checkpoint full-base] [--threads 2] [--repeats 9] [-o OUT.json]

For each cached decoder of the int8 tier, one graph holds only its projections (every int8 Gemm with the BinaryOp
that applies its row scales, `rewrites.int8`), each fed from one input row of its width, their outputs gathered by one
Concat: the same weights the loop reads, the same kernels, none of the loop's other layers, one call per decoder
call. A frame is the talker's call once and the predictor's 15 times (each predictor call also reads one of its 15
int8 heads, put in its graph), timed in the same process as the streaming-read probe (`machine.read_bandwidth_gbs`),
interleaved, medians. `projections / floor` near 1 says the kernel streams at the probe's rate; the loop's own
`loop / floor` (`bench loop`) minus it is what everything else costs.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..runtime.binding.graph import Graph, params_dict
from ..runtime.binding.param import ParamLayer
from ..runtime.binding.weights import join_bin, split_bin


def projections_graph(text: str, data: bytes, extra: tuple[str, bytes] | None = None) -> tuple[str, bytes, int]:
    """An int8 decoder graph -> (its projections alone, their .bin, bytes of weights they read). `extra`: another
    int8 graph (a head) whose first int8 projection joins them."""
    layers, segs = [], {}
    for t, d in [(text, data)] + ([extra] if extra else []):
        g, s = Graph(t), split_bin(t, d)
        gemms = [lyr for lyr in g.layers if lyr.type == "Gemm" and params_dict(lyr).get("18") == "2"]
        if extra and t is extra[0]:
            gemms = gemms[:1]
        for gemm in gemms:
            scale = g.consumers(gemm.outputs[0])[0]            # BinaryOp(mul) with the row scales
            table = g.producer(next(b for b in scale.inputs if b != gemm.outputs[0]))
            prefix = f"p{len(layers)}_"
            k = int(params_dict(gemm)["9"])
            layers.append((k, [ParamLayer("Gemm", prefix + gemm.name, [f"x{k}"], [prefix + "g"], list(gemm.params)),
                               ParamLayer("MemoryData", prefix + table.name, [], [prefix + "t"], list(table.params)),
                               ParamLayer("BinaryOp", prefix + scale.name, [prefix + "g", prefix + "t"],
                                          [prefix + "o"], list(scale.params))]))
            segs[prefix + gemm.name], segs[prefix + table.name] = s[gemm.name], s[table.name]
    widths = sorted({k for k, _ in layers})
    users = {k: [i for i, (kk, _) in enumerate(layers) if kk == k] for k in widths}
    out = [ParamLayer("Input", f"in{k}", [], [f"in{k}"], []) for k in widths]
    out += [ParamLayer("Split", f"split{k}", [f"in{k}"], [f"x{k}_{i}" for i in users[k]], []) for k in widths]
    for i, (k, trio) in enumerate(layers):
        trio[0].inputs = [f"x{k}_{i}"]
        out += trio
    out.append(ParamLayer("Concat", "gather", [f"p{i}_o" for i in range(len(layers))], ["out0"], ["0=1"]))
    g = Graph("7767517\n0 0\n")
    g.layers = out
    new = g.text()
    weight_bytes = sum(len(seg.data) for name, ss in segs.items() for seg in ss if "_rows" not in name)
    return new, join_bin(new, segs), weight_bytes


def measure(ncnn_dir: Path, threads: int = 2, repeats: int = 9, groups: int = 16) -> dict:
    from ..runtime.binding.net import net_from_text, run
    from ..runtime.pipeline.precision import ensure_int8_tier, int8_paths
    from .machine import read_bandwidth_gbs

    ensure_int8_tier(ncnn_dir, log=print)
    nets, bytes_, inputs = {}, {}, {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("talker_decoder", "predictor_decoder"):
            param, bin_ = int8_paths(ncnn_dir, name)
            extra = None
            if name == "predictor_decoder":
                hp, hb = int8_paths(ncnn_dir, "predictor_heads")
                extra = (hp.read_text(), hb.read_bytes())
            text, data, nbytes = projections_graph(param.read_text(), bin_.read_bytes(), extra)
            f = Path(tmp) / f"{name}.bin"
            f.write_bytes(data)
            nets[name], bytes_[name] = net_from_text(text, f, threads), nbytes
            widths = [int(lyr.split()[1][2:]) for lyr in text.splitlines() if lyr.startswith("Input")]
            inputs[name] = {f"in{k}": rng.standard_normal((1, k)).astype(np.float32) for k in widths}
    calls = {"talker_decoder": 1, "predictor_decoder": groups - 1}
    frame_bytes = sum(calls[n] * bytes_[n] for n in calls)
    probe = np.ones(2**28, np.float32)

    def frame() -> float:
        t0 = time.perf_counter()
        for name, n in calls.items():
            for _ in range(n):
                run(nets[name], inputs[name], ["out0"])
        return time.perf_counter() - t0

    frame()
    times, rates = [], []
    for _ in range(repeats):
        rates.append(read_bandwidth_gbs(threads, array=probe))
        times.append(frame())
    ms, gbs = statistics.median(times) * 1e3, statistics.median(rates)
    floor = frame_bytes / (gbs * 1e9) * 1e3
    return {"threads": threads, "repeats": repeats, "projection_bytes_per_frame": frame_bytes,
            "projections_ms_per_frame": round(ms, 1), "read_bandwidth_gbs": round(gbs, 1),
            "floor_ms_per_frame": round(floor, 1), "projections_over_floor": round(ms / floor, 3),
            "projections_gbs": round(frame_bytes / ms / 1e6, 1)}
