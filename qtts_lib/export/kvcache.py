"""Give an exported decoder a KV-cache interface by editing its .param text. Introduced in 05.

pnnx writes no cache interface. ncnn's SDPA layer has one (docs/developer-guide/kvcache.md):
with `7=1` it takes two more inputs (the past keys and values) and produces two more outputs
(the keys and values including this call's tokens). The rewrite is pure text:

- every SDPA line: 4 inputs / 1 output -> 6 inputs / 3 outputs, `7=1` appended;
- one new `Input` line that declares all cache input blobs;
- the header's layer and blob counts recomputed.

The weights (.bin) are unchanged, so the cached and uncached graphs share one .bin.
"""
from __future__ import annotations

from pathlib import Path

from . import ParamLayer, format_param, parse_param

CACHED = ("talker_decoder", "predictor_decoder")  # the graphs that run one position per step


def cache_blob_names(i: int) -> tuple[str, str, str, str]:
    return f"cache_k_in_{i}", f"cache_v_in_{i}", f"cache_k_out_{i}", f"cache_v_out_{i}"


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


def write_kv_param(ckpt: str, name: str) -> Path:
    """models/<ckpt>/ncnn/<name>_kv.param from the verified <name>.param, with a manifest entry."""
    from .. import artifacts, paths

    src = paths.ncnn_dir(ckpt) / f"{name}.param"
    entry = artifacts.verify(src, ckpt)
    text = add_kv_cache(src.read_text())
    out = src.with_name(f"{name}_kv.param")
    out.write_text(text)
    artifacts.record(out, "05_inject_kv_cache", ckpt, {"from": src.name, "from_sha256": entry["sha256"]},
                     cached_layers=count_caches(text), bin=f"{name}.bin")
    return out
