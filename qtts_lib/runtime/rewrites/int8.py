"""The int8 form of a decoder graph, written from numpy: pure text and bytes in, text and bytes out. Introduced in 13.

Every projection (constant-B Gemm) becomes ncnn's int8 Gemm (`18=2`) with the weights as its constant *A*: ncnn
keeps one int8 scale per row of a constant A, so each output feature has its own weight scale inside the Gemm (no
layer after it), and the activations, the Gemm's B, are quantized at run time (dynamic absmax, one scale per call:
the row's own for a one-position step, shared by the rows of a prefill or a batch), multiplied on VNNI, and the
output transposed back to rows x features (`14=1`). Each Gemm reads its whole K in one tile (`22=K`): a thread
streams its rows' weights in one pass. Gemms that share an input (q/k/v; gate/up) are fused into one first
(`fuse_shared_input`). `pipeline.precision` writes the result once per export (`ensure_int8`).

Two more forms keep the weights as B and give them a scale per block of K (ncnn's weight-block Gemm, `18=802` for
blocks of 128, `18=800` for blocks of 32): the int8 weights are written raw (no storage tag), then one raw fp32 scale
per row and block, and ncnn's x86 kernel quantizes the activations per row and block too (`int8_matmul` is the numpy
model of all three forms). A down projection's input (SiLU(gate) * up, 6144 wide at 1.7B) is heavy-tailed, so one
activation scale for its whole row loses most of its small values; a scale per block keeps them.

An earlier form kept the weights as B (ncnn's int8 B has one scale per tensor) with rows normalised to |max| = 1 and
a BinaryOp of row scales after every Gemm: 40 more layers per predictor call, the activations quantized per row.
Chapter 13 measures both.
"""
from __future__ import annotations

import numpy as np

from ..binding.graph import Graph, params_dict, set_params
from ..binding.param import ParamLayer, format_param, parse_param
from ..binding.weights import INT8_TAG, Segment, join_bin, split_bin

INT8_GEMM = "2"          # Gemm param 18 (quantize_term): int8 weights, activations quantized at run time
# the int8 forms: Gemm param 18 of each, and its block along K (None: one scale per row of weights, per call of
# activations)
FORMS = {"rows": INT8_GEMM, "k128": "802", "k32": "800"}
BLOCK = {"rows": None, "k128": 128, "k32": 32}


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (N, K) fp32 -> (q (N, K) int8, row scale (N,) fp32) with w ≈ q / 127 * scale[:, None]."""
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None] * 127.0), -127, 127).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) / 127.0 * scale[:, None]


def quantize_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """w (N, K) fp32 -> (q (N, K) int8, scale (N, ceil(K / block)) fp32) with w ≈ q / 127 * scale of its block."""
    n, k = w.shape
    nb = -(-k // block)
    padded = np.zeros((n, nb * block), np.float32)
    padded[:, :k] = w
    amax = np.abs(padded.reshape(n, nb, block)).max(axis=2)
    scale = np.where(amax > 0, amax, 1.0).astype(np.float32)
    q = np.clip(np.rint(padded.reshape(n, nb, block) / scale[:, :, None] * 127.0), -127, 127).astype(np.int8)
    return q.reshape(n, nb * block)[:, :k].copy(), scale


def dequantize_blocks(q: np.ndarray, scale: np.ndarray, block: int) -> np.ndarray:
    return q.astype(np.float32) / 127.0 * np.repeat(scale, block, axis=1)[:, : q.shape[1]]


def dequantize(w: np.ndarray, form: str) -> np.ndarray:
    """The weights as a form stores them (`quantize_rows` or `quantize_blocks`), back in fp32."""
    if BLOCK[form] is None:
        return dequantize_rows(*quantize_rows(w))
    return dequantize_blocks(*quantize_blocks(w, BLOCK[form]), BLOCK[form])


def _quantize_act(x: np.ndarray, axis) -> np.ndarray:
    amax = np.abs(x).max(axis=axis, keepdims=True)
    s = np.where(amax > 0, amax, 1.0) / 127.0
    return np.clip(np.rint(x / s), -127, 127) * s


def int8_matmul(x: np.ndarray, w: np.ndarray, form: str = "rows") -> np.ndarray:
    """What the int8 Gemm of `form` computes for rows x (M, K) and weights w (N, K), in numpy (float64): the weights
    as the form stores them, the activations quantized as ncnn does at run time (rows: one absmax scale for the
    whole call; blocks: one per row and block of K). The tests hold ncnn to it; the quality harness uses it to
    measure each projection's own error."""
    x = np.asarray(x, np.float64)
    block = BLOCK[form]
    if block is None:
        xq = _quantize_act(x, axis=None)
    else:
        m, k = x.shape
        nb = -(-k // block)
        padded = np.zeros((m, nb * block))
        padded[:, :k] = x
        xq = _quantize_act(padded.reshape(m, nb, block), axis=2).reshape(m, nb * block)[:, :k]
    return xq @ dequantize(w, form).astype(np.float64).T


def _has_bias(d: dict[str, str]) -> bool:
    """A constant C broadcast along N (`10=4`): a Linear's bias (1.7B's `small_to_mtp_projection`)."""
    return d.get("6", "0") == "1" and d.get("10", "-1") == "4"


def _int8_eligible(layer: ParamLayer) -> bool:
    d = params_dict(layer)
    return (layer.type == "Gemm" and d.get("5") == "1" and d.get("3") == "1" and d.get("4", "0") == "0"
            and d.get("2", "0") == "0" and d.get("18", "0") == "0" and len(layer.inputs) == 1
            and (d.get("6", "0") == "0" or d.get("10", "-1") == "-1" or _has_bias(d)) and d.get("14", "0") == "0"
            and float(d.get("0", "1")) == 1.0 and float(d.get("1", "1")) == 1.0)


def eligible_gemms(text: str) -> list[ParamLayer]:
    """The Gemms `int8_graph` makes int8 (constant-B projections, a Linear's bias allowed), in .param order."""
    return [layer for layer in Graph(text).layers if _int8_eligible(layer)]


def has_bias(layer: ParamLayer) -> bool:
    return _has_bias(params_dict(layer))


def _parts(w) -> tuple[np.ndarray, ...]:
    return w if isinstance(w, tuple) else (w,)


def fuse_shared_input(g: Graph, weights: dict[str, np.ndarray]) -> int:
    """Gemms fed by the same Split (q/k/v; gate/up) -> one Gemm over their stacked weights and a Slice of its
    output. Exact under int8 too: the shared input is quantized the same way either way, and every weight row
    has its own scale. `weights` (layer name -> (N, K) fp32, or a tuple of row blocks to stack) is updated; returns
    the number of Gemms removed."""
    removed = 0
    for split in [lyr for lyr in g.layers if lyr.type == "Split"]:
        users = [next((c for c in g.consumers(b) if c.type == "Gemm" and c.name in weights), None)
                 for b in split.outputs]
        group = [(b, c) for b, c in zip(split.outputs, users)
                 if c is not None and _int8_eligible(c) and not _has_bias(params_dict(c))]
        if len(group) < 2 or len({_parts(weights[c.name])[0].shape[1] for _, c in group}) != 1:
            continue
        first = group[0][1]
        parts = [p for _, c in group for p in _parts(weights[c.name])]
        stacked = tuple(parts)  # concatenated when quantized (`int8_graph`), one layer at a time
        sizes = [sum(p.shape[0] for p in _parts(weights[c.name])) for _, c in group]
        fused_out = g.fresh(first.name + "_fused")
        d = params_dict(first)
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
        d["8"] = str(sum(sizes))
        set_params(first, d)
        gone = {b for b, _ in group[1:]}
        split.outputs = [b for b in split.outputs if b not in gone]
        removed += len(group) - 1
    return removed


def int8_graph(text: str, data: bytes, fuse: bool = True, keep=(), form: str = "rows") -> tuple[str, bytes, dict]:
    """The int8 form of a decoder graph and its .bin: Gemms sharing an input fused (`fuse_shared_input`), then
    each eligible Gemm -> int8 Gemm of `form` (`FORMS`; module docstring): rows, over constant A with its row
    scales; k128 / k32, over constant B with a scale per row and block of K [-> BinaryOp(add, MemoryData bias) for a
    Gemm with a bias, whose bias stays fp32]. The Gemms named in `keep` stay fp32. Returns (param text, bin, stats)."""
    if form not in FORMS:
        raise ValueError(f"no int8 form {form!r}; there are {', '.join(FORMS)}")
    segs = split_bin(text, data)
    g = Graph(text)
    weights = {}
    for layer in g.layers:
        if _int8_eligible(layer) and layer.name not in keep:
            d = params_dict(layer)
            weights[layer.name] = segs[layer.name][0].array().reshape(int(d["8"]), int(d["9"]))
    stats = {"gemms": 0, "weights": 0, "rel_rms": [], "fused_away": fuse_shared_input(g, weights) if fuse else 0}
    out: dict[str, list[Segment]] = {}
    blocks: dict[str, list[tuple[int, bytes]]] = {}  # the weight-block Gemms' raw loads
    for layer in list(g.layers):
        if layer.name in segs:
            out[layer.name] = segs[layer.name]
        if not _int8_eligible(layer) or layer.name in keep:
            continue
        d = params_dict(layer)
        n, k = int(d["8"]), int(d["9"])
        w = np.concatenate(_parts(weights.pop(layer.name)))  # this layer's weights only, then freed
        bias = segs[layer.name][1].array() if _has_bias(d) else None
        if bias is not None:  # the int8 Gemm gets no C; the bias is added after the row scales
            d["6"] = "0"
            d.pop("10", None)
        stats["gemms"] += 1
        stats["weights"] += n * k
        if BLOCK[form] is None:
            q, scale = quantize_rows(w)
            err = dequantize_rows(q, scale) - w
            # the weights become the constant A (M = n output features, K = k): out = (A . x^T)^T, a scale per row
            d.update({"4": "1", "5": "0", "7": str(n), "8": "0", "14": "1", "18": FORMS[form], "22": str(k)})
            body = q.tobytes() + b"\0" * (-q.size % 4)
            out[layer.name] = [Segment(n * k, True, INT8_TAG + body),
                               Segment(n, False, (127.0 / scale).astype(np.float32).tobytes())]
        else:  # the weights stay the constant B (transposed), written raw, then raw scales per row and block
            if (n * k) % 4:
                raise ValueError(f"{layer.name}: {n} x {k} int8 weights do not fill whole 4-byte words")
            q, scale = quantize_blocks(w, BLOCK[form])
            err = dequantize_blocks(q, scale, BLOCK[form]) - w
            d.update({"18": FORMS[form], "22": str(k)})
            blocks[layer.name] = [(n * k, q.tobytes()), (scale.size, (127.0 / scale).astype(np.float32).tobytes())]
        stats["rel_rms"].append(float(np.sqrt((err**2).mean() / max((w**2).mean(), 1e-30))))
        set_params(layer, d)
        if bias is not None:
            final = layer.outputs[0]
            unbiased, bias_table = g.fresh(layer.name + "_scaled"), g.fresh(layer.name + "_bias")
            layer.outputs = [unbiased]
            i = g.layers.index(layer)
            g.layers[i + 1 : i + 1] = [
                ParamLayer("MemoryData", bias_table, [], [bias_table], [f"0={n}"]),
                ParamLayer("BinaryOp", g.fresh(layer.name + "_add"), [unbiased, bias_table], [final], ["0=0"])]
            out[bias_table] = [Segment.of(bias, False)]
    new = g.text()
    return new, _join(new, out, blocks), stats


def _join(text: str, segments: dict[str, list[Segment]], blocks: dict[str, list[tuple[int, bytes]]]) -> bytes:
    """`join_bin` for a graph with weight-block Gemms, whose raw loads (`blocks`: (elements, bytes)) it does not
    know: the other layers' segments go through `join_bin`'s checks, one layer at a time, in layer order."""
    if not blocks:
        return join_bin(text, segments)
    parts = []
    for layer in parse_param(text).layers:
        if layer.name in blocks:
            parts += [data for _, data in blocks[layer.name]]
        elif layer.name in segments:
            parts.append(join_bin(format_param(7767517, [layer]), {layer.name: segments[layer.name]}))
    return b"".join(parts)
