"""Run a cache-enabled decoder: prefill once, then one position per step. Introduced in 05.

Contract of a `<name>_kv.param` (written by `rewrites.kv_cache.add_kv_cache`, chapter 05):
  inputs  in0 embeds (1, L, hidden), in1 mask (L, past+L), in2/in3 cos/sin (L, head_dim/2),
          cache_k_in_i / cache_v_in_i for every SDPA layer i;
  outputs out0 hidden (1, L, hidden), cache_k_out_i / cache_v_out_i.
Prefill feeds empty caches and a causal mask; a step feeds the caches of the previous call
untouched, a zero mask (1, past+1) and the rope rows of the absolute position.

The caches never leave ncnn: they are extracted with `type=1` into Mats we keep and feed back.
A numpy round trip, or the tuple form `ret, m = ex.extract(name)` (which clones), loses the
backend's private layout and spare capacity (see chapter 05).

The cache of one sequence is a `KvCache`, held by whoever runs the sequence (the generation loop keeps one per
utterance), so one `KvCacheNet` serves any number of sequences. A cache is the set of blobs to feed next time,
whatever their layout: one pair per layer, or on a GPU all layers in one blob (`rewrites.gpu.packed_cache_params`).
"""
from __future__ import annotations

from collections.abc import Sequence

import ncnn
import numpy as np

from . import rope
from .net import run


def cache_blob_names(i: int) -> tuple[str, str, str, str]:
    """The four blobs of SDPA layer i's cache: K and V in, K and V out."""
    return f"cache_k_in_{i}", f"cache_v_in_{i}", f"cache_k_out_{i}", f"cache_v_out_{i}"


def layer_cache_outputs(layers: int) -> list[str]:
    """Every layer's K and V cache outputs, in order."""
    return [b for i in range(layers) for b in cache_blob_names(i)[2:]]


class KvCache:
    """One sequence's cache: the Mats to feed next time (blob name -> Mat) and the positions they hold."""

    def __init__(self, layers: int):
        self.blobs: dict[str, ncnn.Mat] = {b: ncnn.Mat() for i in range(layers) for b in cache_blob_names(i)[:2]}
        self.past = 0

    def grow(self, outputs: Sequence[str], mats: Sequence[ncnn.Mat], positions: int) -> None:
        """Take a call's cache outputs (`cache_*_out*`) as the next call's inputs."""
        self.blobs = {name.replace("_out", "_in"): m for name, m in zip(outputs, mats)}
        self.past += positions


class KvCacheNet:
    """A cached decoder: `forward(embeds, cache)` runs L new positions after the cache's and grows the cache.

    `prefill` is the graph for any number of positions; `step`, where given, a faster form of the same graph over
    the same weights for one position after the first call (`pipeline.precision` picks both per tier). `packed`:
    the graphs take and give every layer's cache as one blob (Vulkan: one download instead of 2·layers)."""

    def __init__(self, prefill: ncnn.Net, layers: int, head_dim: int, theta: float, step: ncnn.Net | None = None,
                 packed: bool = False, name: str = "decoder"):
        self.prefill_net, self.step_net, self.layers = prefill, step, layers
        self.head_dim, self.theta, self.name = head_dim, theta, name
        self.cache_outputs = ["cache_all_out"] if packed else layer_cache_outputs(layers)

    def new_cache(self) -> KvCache:
        return KvCache(self.layers)

    def forward(self, embeds: np.ndarray, cache: KvCache) -> np.ndarray:
        """embeds (1, L, hidden) after `cache.past` positions -> hidden (1, L, hidden); the cache grows by L."""
        length = embeds.shape[1]
        cos, sin = rope.tables(self.head_dim, self.theta, cache.past, length)
        stepping = self.step_net is not None and length == 1 and cache.past > 0
        inputs = {"in0": embeds, "in1": rope.causal_mask(length, cache.past), "in2": cos, "in3": sin} | cache.blobs
        out, *mats = run(self.step_net if stepping else self.prefill_net, inputs, ["out0", *self.cache_outputs],
                         axes={"in0": 0, "out0": 0}, raw=self.cache_outputs, name=self.name)
        cache.grow(self.cache_outputs, mats, length)
        return out

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, KvCache]:
        """embeds (1, L, hidden) from an empty cache -> (hidden (1, L, hidden), the cache)."""
        cache = self.new_cache()
        return self.forward(embeds, cache), cache
