"""The int8 form of a decoder graph, written from numpy: pure text and bytes in, text and bytes out. Introduced in 10.

Every projection (constant-B Gemm) becomes ncnn's int8 Gemm (`18=2`): weights int8 with a per-row scale,
activations quantized per row at run time (dynamic, absmax) and multiplied on VNNI. ncnn's int8 Gemm has one scale
per weight tensor, so each row is normalised to |max| = 1 before rounding and its scale is applied by a BinaryOp
after the Gemm. Gemms that share an input (q/k/v; gate/up) are fused into one first (`fuse_shared_input`).
`pipeline.precision` writes the result once per export (`ensure_int8`).
"""
from __future__ import annotations

import numpy as np

from ..binding.graph import Graph, params_dict, set_params
from ..binding.param import ParamLayer
from ..binding.weights import INT8_TAG, Segment, join_bin, split_bin

INT8_GEMM = "2"          # Gemm param 18 (quantize_term): int8 weights, activations quantized at run time


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (N, K) fp32 -> (q (N, K) int8, row scale (N,) fp32) with w ≈ q / 127 * scale[:, None]."""
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None] * 127.0), -127, 127).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) / 127.0 * scale[:, None]


def _int8_eligible(layer: ParamLayer) -> bool:
    d = params_dict(layer)
    return (layer.type == "Gemm" and d.get("5") == "1" and d.get("3") == "1" and d.get("4", "0") == "0"
            and d.get("2", "0") == "0" and d.get("18", "0") == "0" and len(layer.inputs) == 1
            and (d.get("6", "0") == "0" or d.get("10", "-1") == "-1") and d.get("14", "0") == "0"
            and float(d.get("0", "1")) == 1.0)


def fuse_shared_input(g: Graph, weights: dict[str, np.ndarray]) -> int:
    """Gemms fed by the same Split (q/k/v; gate/up) -> one Gemm over their stacked weights and a Slice of its
    output. Exact under int8 too: the shared input is quantized once per row either way, and every weight row
    has its own scale. `weights` (layer name -> (N, K) fp32) is updated; returns the number of Gemms removed."""
    removed = 0
    for split in [lyr for lyr in g.layers if lyr.type == "Split"]:
        users = [next((c for c in g.consumers(b) if c.type == "Gemm" and c.name in weights), None)
                 for b in split.outputs]
        group = [(b, c) for b, c in zip(split.outputs, users) if c is not None and _int8_eligible(c)]
        if len(group) < 2 or len({weights[c.name].shape[1] for _, c in group}) != 1:
            continue
        first = group[0][1]
        stacked = np.concatenate([weights[c.name] for _, c in group])
        sizes = [weights[c.name].shape[0] for _, c in group]
        fused_out = g.fresh(first.name + "_fused")
        d = params_dict(first)
        d["8"] = str(stacked.shape[0])
        set_params(first, d)
        slice_ = ParamLayer("Slice", g.fresh(first.name + "_slice"), [fused_out], [c.outputs[0] for _, c in group],
                            [f"-23300={len(sizes)}," + ",".join(map(str, sizes)), "1=-1"])
        first.outputs = [fused_out]
        pos = min(g.layers.index(c) for _, c in group)  # before every consumer of the group's outputs
        for _, c in group:
            g.layers.remove(c)
            if c is not first:
                del weights[c.name]
        g.layers[pos:pos] = [first, slice_]
        weights[first.name] = stacked
        gone = {b for b, _ in group[1:]}
        split.outputs = [b for b in split.outputs if b not in gone]
        removed += len(group) - 1
    return removed


def int8_graph(text: str, data: bytes, fuse: bool = True) -> tuple[str, bytes, dict]:
    """The int8 form of a decoder graph and its .bin: Gemms sharing an input fused (`fuse_shared_input`), then
    each eligible Gemm -> int8 Gemm -> BinaryOp(mul, MemoryData row scales). Returns (param text, bin, stats)."""
    segs = split_bin(text, data)
    g = Graph(text)
    weights = {}
    for layer in g.layers:
        if _int8_eligible(layer):
            d = params_dict(layer)
            weights[layer.name] = segs[layer.name][0].array().reshape(int(d["8"]), int(d["9"]))
    stats = {"gemms": 0, "weights": 0, "rel_rms": [], "fused_away": fuse_shared_input(g, weights) if fuse else 0}
    out: dict[str, list[Segment]] = {}
    for layer in list(g.layers):
        if layer.name in segs:
            out[layer.name] = segs[layer.name]
        if not _int8_eligible(layer):
            continue
        d = params_dict(layer)
        n, k = int(d["8"]), int(d["9"])
        w = weights[layer.name]
        q, scale = quantize_rows(w)
        err = dequantize_rows(q, scale) - w
        stats["rel_rms"].append(float(np.sqrt((err**2).mean() / max((w**2).mean(), 1e-30))))
        stats["gemms"] += 1
        stats["weights"] += n * k
        d["18"] = INT8_GEMM
        set_params(layer, d)
        body = q.tobytes() + b"\0" * (-q.size % 4)
        out[layer.name] = [Segment(n * k, True, INT8_TAG + body), Segment(1, False, np.float32(127.0).tobytes())]
        scaled, table = g.fresh(layer.name + "_q"), g.fresh(layer.name + "_rows")
        final = layer.outputs[0]
        layer.outputs = [scaled]
        i = g.layers.index(layer)
        g.layers[i + 1 : i + 1] = [ParamLayer("MemoryData", table, [], [table], [f"0={n}"]),
                                   ParamLayer("BinaryOp", g.fresh(layer.name + "_mul"), [scaled, table], [final],
                                              ["0=2"])]
        out[table] = [Segment.of(scale, False)]
    new = g.text()
    return new, join_bin(new, out), stats
