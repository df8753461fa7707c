"""Decode-step graphs: a cached decoder's `.param` rewritten for one-position steps. Introduced in 10.

- `decode_step` (`gemm_decode_as_innerproduct`): for a graph that only ever sees one position, every constant-B Gemm
  becomes Reshape(1-D) -> InnerProduct -> Reshape(1 x N) over the same `.bin`: InnerProduct's 1-D path uses all
  threads at one row, where a 2-D InnerProduct runs one row on one thread. Prefill keeps the original. fp32 no
  longer needs it (a one-row Gemm measured as fast: 56.4 vs 53.2 ms per full-base talker step at 2 threads, see
  `pipeline.precision`); fp16 does, because x86 Gemm ignores fp16 storage.
- `fp16_step` (chapter 12's fp16 tier): the same step graph with every layer but the InnerProducts masked out of
  ncnn's fp16 storage (`31=2`), so that only the weights are rounded.
- `one_thread_small_layers`: the layers that do little work at a few positions (norms, reshapes, permutes, splits,
  element-wise ops, rope) run on one thread (`31=128`, ncnn's per-layer "no threading" bit): at one position the
  fork and join of a second thread costs more than the work it shares. The projections and attention keep every
  thread. The same numbers (no sum changes order).
"""
from __future__ import annotations

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
    """A cached decoder's `_kv.param` for one-position steps: Gemm -> InnerProduct on a 1-D input. Same .bin."""
    return gemm_decode_as_innerproduct(text)


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
