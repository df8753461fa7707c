"""One thread for the small layers of a decoder graph: the second core is woken only for work worth sharing.
Introduced in 09.

A decode step is hundreds of ncnn layers (the full-size talker's cached graph 852, 1160 with the batch fold of
chapter 14; the code predictor's 251, run 15 times a frame): about 5,000 layer calls a frame, of which some 430
are projections that read the weights. Every layer of ncnn's x86 backend runs its loop as an OpenMP parallel region
over `num_threads`, so on two threads each RMSNorm of one row, each Reshape, each residual add wakes the second
thread and waits for it at a barrier, for work of a microsecond or two. Those synchronisations, not arithmetic,
are what the loop spends beyond reading its weights at two threads (at one thread the same loop sits much closer
to its floor: chapter 09's table).

ncnn has a per-layer switch for it: bit 7 of a layer's feature mask (param 31; `get_masked_option` in ncnn's
net.cpp) runs that layer with one thread. `small_layers_single_threaded` sets it on every layer except those that
do the heavy work (the projections, and attention, whose cost grows with the context). Each output element is
computed by one thread in the same order either way, so the outputs are bitwise those of the threaded graph
(tests/test_rewrites.py checks it on every decoder of tiny-base).
"""
from __future__ import annotations

from ..binding.graph import Graph, int_param, params_dict, set_params

SINGLE_THREAD = 1 << 7          # ncnn's featmask bit: num_threads = 1 for this layer
THREADED = ("Gemm", "InnerProduct", "SDPA")   # the layers worth two threads at one row


def small_layers_single_threaded(text: str, threaded: tuple[str, ...] = THREADED) -> str:
    """`.param` text with bit 7 of param 31 set on every layer but `Input` and the `threaded` types (other bits of
    31, e.g. fp16's mask, are kept)."""
    g = Graph(text)
    for layer in g.layers:
        if layer.type == "Input" or layer.type in threaded:
            continue
        d = params_dict(layer)
        d["31"] = str(int_param(d, "31", 0) | SINGLE_THREAD)
        set_params(layer, d)
    return g.text()
