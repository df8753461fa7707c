"""Run a cache-enabled decoder: prefill once, then one position per step. Introduced in 05.

Contract of a `<name>_kv.param` (see qtts_lib.export.kvcache):
  inputs  in0 embeds (1, L, hidden), in1 mask (L, past+L), in2/in3 cos/sin (L, head_dim/2),
          cache_k_in_i / cache_v_in_i for every SDPA layer i;
  outputs out0 hidden (1, L, hidden), cache_k_out_i / cache_v_out_i.
Prefill feeds empty caches and a causal mask; a step feeds the caches of the previous call
untouched, a zero mask (1, past+1) and the rope rows of the absolute position.

The caches never leave ncnn: they are extracted with `type=1` into Mats we keep and feed back.
A numpy round trip, or the tuple form `ret, m = ex.extract(name)` (which clones), loses the
backend's private layout and spare capacity (see chapter 05).

`add_kv_cache` is the `.param` rewrite that gives a graph this interface (pure text; chapter 05 writes the
decoders' `_kv.param` files with it, and the codec's streaming decoder its transformer's).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import precision as tiers
from . import rope
from .net import MissingArtifact, from_mat, make_net, parse_device, to_mat
from .param import ParamLayer, format_param, parse_param


def run_with_caches(ex, caches: list, name: str = "graph"):
    """Feed an extractor (its other inputs already set) the caches `cache_k_in_i`/`cache_v_in_i`, run it to `out0`,
    and take the grown caches out with `type=1` (never through numpy: module docstring). Returns (out0 Mat, caches)."""
    import ncnn

    for i, (k, v) in enumerate(caches):
        ex.input(f"cache_k_in_{i}", k)
        ex.input(f"cache_v_in_{i}", v)
    out = ncnn.Mat()
    if ex.extract("out0", out) != 0:
        raise RuntimeError(f"{name}: forward failed")
    grown = []
    for i in range(len(caches)):
        k, v = ncnn.Mat(), ncnn.Mat()
        ex.extract(f"cache_k_out_{i}", k, 1)
        ex.extract(f"cache_v_out_{i}", v, 1)
        grown.append((k, v))
    return out, grown


class KvCacheNet:
    """A decoder with a KV cache. `prefill(embeds)` then `step(embed)`; `reset()` starts over."""

    def __init__(self, directory: str | Path, name: str, head_dim: int, theta: float, threads: int = 2,
                 device: str = "cpu", fast: bool | None = None, precision: str = "fp32", log=None):
        directory = Path(directory)
        param = directory / f"{name}_kv.param"
        if not param.is_file():
            raise MissingArtifact(f"{param} not found; run notebooks/05_inject_kv_cache.py")
        manifest = json.loads((directory / "manifest.json").read_text())
        self.layers = manifest[f"{name}_kv.param"]["cached_layers"]
        self.precision = tiers.check_tier(precision, device)
        if self.precision == "int8":
            # One int8 graph (chapter 10) for prefill and steps: its Gemms are threaded at one row.
            self.net = tiers.step_graph(directory, name, "int8", log).net(threads, device)
            self.step_net = None
        else:
            self.net = make_net(param, directory / f"{name}.bin", threads, device)
            # One-position steps on the CPU run a decode-only form of the same graph over the same .bin
            # (Gemm -> InnerProduct on a 1-D input, `speed.decode_step`; fp16 storage on top in the fp16 tier);
            # prefill keeps the original. The two nets hold their own copy of the weights: that is the memory
            # this speed costs.
            fast = parse_device(device) is None if fast is None else fast
            self.step_net = tiers.step_graph(directory, name, self.precision).net(threads, device) if fast else None
        self.name, self.head_dim, self.theta = name, head_dim, theta
        self.reset()

    def reset(self) -> None:
        self.caches: list | None = None
        self.past = 0

    def _run(self, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import ncnn

        length = embeds.shape[1]
        cos, sin = rope.tables(self.head_dim, self.theta, self.past, length)
        stepping = self.step_net is not None and length == 1 and self.caches is not None
        ex = (self.step_net if stepping else self.net).create_extractor()
        held = [to_mat(embeds, 0), to_mat(mask), to_mat(cos), to_mat(sin)]
        for i, m in enumerate(held):
            ex.input(f"in{i}", m)
        caches = [(ncnn.Mat(), ncnn.Mat()) for _ in range(self.layers)] if self.caches is None else self.caches
        out, self.caches = run_with_caches(ex, caches, self.name)
        self.past += length
        return from_mat(out, 0)

    def prefill(self, embeds: np.ndarray) -> np.ndarray:
        """embeds (1, L, hidden) from an empty cache -> hidden (1, L, hidden)."""
        self.reset()
        return self._run(embeds, rope.causal_mask(embeds.shape[1]))

    def step(self, embeds: np.ndarray) -> np.ndarray:
        """embeds (1, L, hidden) after the cached positions (L = 1 in decoding) -> hidden (1, L, hidden)."""
        if self.caches is None:
            raise RuntimeError("step() before prefill()")
        return self._run(embeds, rope.causal_mask(embeds.shape[1], self.past))


# ---------------------------------------------------------------- the .param rewrite (chapter 05)
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
