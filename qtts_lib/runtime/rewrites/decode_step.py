"""Decode-step graphs: a cached decoder's `.param` rewritten for one-position steps. Introduced in 11.

- `decode_step` (`gemm_decode_as_innerproduct`): for a graph that only ever sees one position, every constant-B Gemm
  becomes Reshape(1-D) -> InnerProduct -> Reshape(1 x N) over the same `.bin`: InnerProduct's 1-D path uses all
  threads at one row, where a 2-D InnerProduct runs one row on one thread. Prefill keeps the original. fp32 no
  longer needs it (a one-row Gemm measured as fast: 56.4 vs 53.2 ms per full-base talker step at 2 threads, see
  `pipeline.precision`); fp16 does, because x86 Gemm ignores fp16 storage.
- `fp16_step` (chapter 13's fp16 tier): the same step graph with every layer but the InnerProducts masked out of
  ncnn's fp16 storage (`31=2`), so that only the weights are rounded.
- `one_thread_small_layers`: the layers that do little work at a few positions (norms, reshapes, permutes, splits,
  element-wise ops, rope) run on one thread (`31=128`, ncnn's per-layer "no threading" bit): at one position the
  fork and join of a second thread costs more than the work it shares. The projections and attention keep every
  thread. The same numbers (no sum changes order).
- `static_reshapes`: a Reshape whose shape pnnx wrote as an expression over its input's dims (`6="128,16,0h"`) gets
  the same shape as plain numbers, the referenced dim inferred (`0=128 1=16 2=-1`). ncnn parses and evaluates an
  expression's text on every call (a full-size talker step has 112 such Reshapes: about 0.35 ms of it on a 2-core
  VM). The same numbers.
- `cpu_graph`: both of the last two, how one sequence's cached decoder runs on the CPU.
- `one_position`: a graph that only ever sees one position keeps its attention heads where they are. pnnx's graph
  turns each of q, k and v from (heads, positions) rows into (positions, heads) channels with a Permute, and SDPA's
  output back with another: at one position a Reshape does the first alone and the second is no move at all, so the
  four Permutes of every layer go (the code predictor's steps: 20 layers fewer a call). The same numbers.
"""
from __future__ import annotations

import re

from ..binding.graph import Graph, int_param, params_dict, set_params
from ..binding.param import ParamLayer


def gemm_decode_as_innerproduct(text: str) -> str:
    """Constant-B Gemm (transB = 1, no transA, no constant A) -> Reshape(1-D) -> InnerProduct ->
    Reshape(w=N, h=1), for a graph that only ever sees one position (a decode step).

    Gemm's B (N, K) is stored exactly as InnerProduct's weight, so the .bin is shared; a Gemm with a
    constant C is left alone (Gemm stores C with a 4-byte storage tag, InnerProduct its bias raw; the
    talker and predictor projections have no bias). With a 2-D input InnerProduct runs its per-row path on one
    thread at S = 1;
    the 1-D input takes the threaded GEMV path.
    """
    g = Graph(text)
    for layer in [lyr for lyr in g.layers if lyr.type == "Gemm"]:
        d = params_dict(layer)
        if (int_param(d, "4", 0) or not int_param(d, "5", 0) or not int_param(d, "3", 0) or int_param(d, "2", 0)
                or int_param(d, "14", 0) or int_param(d, "18", 0) or len(layer.inputs) != 1
                or float(d.get("0", "1")) != 1.0 or float(d.get("1", "1")) != 1.0):
            continue
        bt = int_param(d, "10", -1) if int_param(d, "6", 0) else -1
        if bt != -1:
            continue  # Gemm stores C with a storage tag, InnerProduct its bias without: .bin differs
        N, K = int_param(d, "8", 0), int_param(d, "9", 0)
        i = g.layers.index(layer)
        a, b = g.fresh(layer.name + "_flat"), g.fresh(layer.name + "_ip")
        new = [ParamLayer("Reshape", g.fresh(layer.name + "_r0"), [layer.inputs[0]], [a], [f"0={K}"]),
               ParamLayer("InnerProduct", layer.name, [a], [b], [f"0={N}", "1=0", f"2={N * K}"]),
               ParamLayer("Reshape", g.fresh(layer.name + "_r1"), [b], list(layer.outputs), [f"0={N}", "1=1"])]
        g.layers[i : i + 1] = new
    return g.text()


def decode_step(text: str) -> str:
    """A cached decoder's `_kv.param` for one-position steps: Gemm -> InnerProduct on a 1-D input, static shapes.
    Same .bin."""
    return gemm_decode_as_innerproduct(static_reshapes(text))


def fp16_step(text: str) -> str:
    """The decode-step graph with every layer but the InnerProducts masked out of fp16 storage (31=2)."""
    g = Graph(decode_step(text))
    for layer in g.layers:
        if layer.type not in ("InnerProduct", "Input"):
            layer.params = [p for p in layer.params if not p.startswith("31=")] + ["31=2"]
    return g.text()


SMALL_LAYERS = ("RMSNorm", "Reshape", "Permute", "Split", "BinaryOp", "Slice", "RotaryEmbed", "Swish")
ONE_THREAD = 1 << 7  # ncnn's featmask bit for "this layer runs on one thread" (src/net.cpp, get_masked_option)


def one_thread_small_layers(text: str, types=SMALL_LAYERS) -> str:
    """Every layer of `types` with ncnn's one-thread bit added to its featmask (`31=`; module docstring)."""
    g = Graph(text)
    for layer in g.layers:
        if layer.type in types:
            d = params_dict(layer)
            d["31"] = str(int_param(d, "31", 0) | ONE_THREAD)
            set_params(layer, d)
    return g.text()


RESHAPE_KEYS = {1: ("0",), 2: ("0", "1"), 3: ("0", "1", "2"), 4: ("0", "1", "11", "2")}  # w, h, (d,) c


def static_reshapes(text: str) -> str:
    """Every Reshape whose shape expression (`6="..."`) lists whole numbers and exactly one of its input's dims
    (`0w`, `0h`, `0d` or `0c`) -> the same shape as static params, that dim inferred (-1): ncnn infers it as the
    input's size over the others', which is the referenced dim whenever the reshape is valid. Other expressions
    (two blobs, arithmetic) stay."""
    g = Graph(text)
    for layer in g.layers:
        if layer.type != "Reshape":
            continue
        d = params_dict(layer)
        terms = d.get("6", "").strip('"').split(",")
        refs = [t for t in terms if re.fullmatch(r"0[whdc]", t)]
        if not 1 <= len(terms) <= 4 or len(refs) != 1 or not all(t in refs or re.fullmatch(r"[1-9]\d*", t)
                                                                   for t in terms):
            continue
        del d["6"]
        d |= {k: "-1" if t in refs else t for k, t in zip(RESHAPE_KEYS[len(terms)], terms)}
        set_params(layer, d)
    return g.text()


def cpu_graph(text: str) -> str:
    """A cached decoder's graph as one sequence runs it on the CPU: `static_reshapes`, `one_thread_small_layers`."""
    return one_thread_small_layers(static_reshapes(text))


def one_position(text: str) -> str:
    """A cached decoder's graph (after `static_reshapes`) for calls of exactly one position, without the Permutes
    around attention (module docstring): every SDPA input made as Reshape(w, heads, -1) [-> RMSNorm] -> Permute(0=2)
    becomes Reshape(w, 1, heads) [-> RMSNorm], and SDPA's output Permute(0=2) -> Reshape(N, -1) loses the Permute.
    Raises ValueError where a graph is not that pattern."""
    g = Graph(text)
    dropped = []
    for sdpa in [lyr for lyr in g.layers if lyr.type == "SDPA"]:
        for blob in sdpa.inputs[:3]:
            layer = g.producer(blob)
            while layer is not None and layer.type == "RotaryEmbed":
                layer = g.producer(layer.inputs[0])
            if layer is None or layer.type != "Permute" or params_dict(layer).get("0") != "2":
                raise ValueError(f"{sdpa.name}: {blob} is not made by a Permute(0=2)")
            chain = [g.producer(layer.inputs[0])]
            if chain[0] is not None and chain[0].type == "RMSNorm":
                chain.append(g.producer(chain[0].inputs[0]))
            reshape = chain[-1]
            d = params_dict(reshape) if reshape is not None and reshape.type == "Reshape" else {}
            if _shape(d) != {"0", "1", "2"} or d["2"] != "-1":
                raise ValueError(f"{sdpa.name}: {blob} does not come from a static Reshape(w, heads, -1)")
            set_params(reshape, d | {"1": "1", "2": d["1"]})
            dropped.append(layer)
        permute = (g.consumers(sdpa.outputs[0]) or [None])[0]
        rows = g.consumers(permute.outputs[0]) if permute is not None else []
        d = params_dict(rows[0]) if len(rows) == 1 and rows[0].type == "Reshape" else {}
        if (permute is None or permute.type != "Permute" or params_dict(permute).get("0") != "2"
                or _shape(d) != {"0", "1"} or d["1"] != "-1"):
            raise ValueError(f"{sdpa.name}: its output does not go back to rows through Permute(0=2) -> Reshape(N, -1)")
        dropped.append(permute)
    for permute in dropped:
        for consumer in g.consumers(permute.outputs[0]):
            consumer.inputs = [permute.inputs[0] if b == permute.outputs[0] else b for b in consumer.inputs]
    gone = {id(layer) for layer in dropped}
    g.layers = [layer for layer in g.layers if id(layer) not in gone]
    return g.text()


def _shape(d: dict[str, str]) -> set[str]:
    """The shape keys a Reshape's params set (w, h, d, c; the expression)."""
    return set(d) & {"0", "1", "11", "2", "6"}
