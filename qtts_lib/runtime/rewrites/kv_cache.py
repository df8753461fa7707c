"""The KV-cache rewrite of a `.param` (chapter 05): pure text in, text out. Introduced in 05.

pnnx writes attention without a cache interface. ncnn's SDPA layer has one (docs/developer-guide/kvcache.md):
with `7=1` it takes the past K and V as two more inputs and gives the grown K and V as two more outputs. The rewrite
adds those blobs to every SDPA layer and one `Input` layer that declares the cache inputs; the header's counts are
recomputed. `binding.cached` runs the result (its blob names are `binding.cached.cache_blob_names`). Chapter 05
writes the decoders' `_kv.param` files with it, and `codec.cpu_form` the codec transformer's.
"""
from __future__ import annotations

from ..binding.cached import cache_blob_names
from ..binding.param import ParamLayer, format_param, parse_param


def add_kv_cache(text: str) -> str:
    """The .param text with a KV cache on every SDPA layer (see module docstring)."""
    info = parse_param(text)
    sdpa = [layer for layer in info.layers if layer.type == "SDPA"]
    if not sdpa:
        raise ValueError("no SDPA layer in this .param: nothing to give a cache")
    for i, layer in enumerate(sdpa):
        if len(layer.inputs) != 4 or len(layer.outputs) != 1:
            raise ValueError(f"{layer.name}: expected 4 inputs / 1 output, "
                             f"found {len(layer.inputs)}/{len(layer.outputs)} (already cached?)")
        k_in, v_in, k_out, v_out = cache_blob_names(i)
        layer.inputs += [k_in, v_in]
        layer.outputs += [k_out, v_out]
        layer.params = [p for p in layer.params if not p.startswith("7=")] + ["7=1"]
    cache_in = [b for i in range(len(sdpa)) for b in cache_blob_names(i)[:2]]
    last_input = max(i for i, layer in enumerate(info.layers) if layer.type == "Input")
    layers = (info.layers[: last_input + 1] + [ParamLayer("Input", "kv_cache_in", [], cache_in, [])]
              + info.layers[last_input + 1 :])
    return format_param(info.magic, layers)


def count_caches(text: str) -> int:
    """Number of cached SDPA layers in a .param (0 for an uncached graph)."""
    return sum(1 for layer in parse_param(text).layers if layer.type == "SDPA" and len(layer.outputs) == 3)
