"""Give an exported decoder a KV-cache interface by editing its .param text. Introduced in 05.

pnnx writes no cache interface. ncnn's SDPA layer has one (docs/developer-guide/kvcache.md):
with `7=1` it takes two more inputs (the past keys and values) and produces two more outputs
(the keys and values including this call's tokens). The rewrite is pure text:

- every SDPA line: 4 inputs / 1 output -> 6 inputs / 3 outputs, `7=1` appended;
- one new `Input` line that declares all cache input blobs;
- the header's layer and blob counts recomputed.

The weights (.bin) are unchanged, so the cached and uncached graphs share one .bin. The rewrite itself lives in
`qtts_lib.runtime.rewrites.kv_cache` (the runtime applies it to the codec's transformer too); this module writes the
files.
"""
from __future__ import annotations

from pathlib import Path

from ..runtime.binding.cached import cache_blob_names  # noqa: F401 - chapter 05 shows the blob names from here
from ..runtime.rewrites.kv_cache import add_kv_cache, count_caches

CACHED = ("talker_decoder", "predictor_decoder")  # the graphs that run one position per step


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
