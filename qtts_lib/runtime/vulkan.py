"""Fewer round trips on a GPU: the generation loop's graphs rewritten for Vulkan. Introduced in 08.

The pip binding has no VkMat: every `extract` is one blocking submission plus a download, and
every CPU Mat given to `input` is an upload. The CPU loop (chapters 05-06) extracts the output
and then each layer's K and V cache separately (2·layers + 1 submissions per decoder call) and
calls three graphs per predictor step. On a GPU that is per-call overhead, not arithmetic.
Three `.param` rewrites, all without touching the weights, cut it down:

- `packed_cache_params`: one `Concat` gathers every layer's K/V cache into one output blob and,
  for steps, one `Slice` splits an input blob back into the per-layer caches: a decoder step is
  one forward + two downloads (hidden, caches) instead of 2·layers + 1 submissions.
- `fused_predictor_param`: the code predictor's decoder (no cache) and its 15 heads in one
  graph. The predictor's sequence is at most 17 positions, so recomputing it each step costs the
  GPU microseconds and removes the cache traffic: one upload + one extract per codebook.
- the embedding tables are read once (through their own graphs, on the CPU) into numpy, so a
  lookup is an index, not a graph call.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from . import rope
from .net import MissingArtifact, Net, from_mat, net_from_text, parse_device, to_mat
from .param import ParamLayer, format_param, parse_param


def packed_cache_params(kv_text: str) -> tuple[str, str]:
    """A `<name>_kv.param` -> (prefill, step) params whose caches travel as one blob.

    Both end in `Concat(cache_k_out_0, cache_v_out_0, ...) -> cache_all_out` along axis 0 (heads).
    The step param replaces the caches' `Input` by `Input cache_all_in` + an equal `Slice` along
    axis 0. Prefill keeps the per-layer empty cache inputs (a Slice of an empty Mat is not defined)."""
    info = parse_param(kv_text)
    layers = info.layers
    cache_input = next(lyr for lyr in layers if lyr.type == "Input" and lyr.outputs[0].startswith("cache_k_in_"))
    ins = cache_input.outputs
    outs = [name.replace("_in_", "_out_") for name in ins]
    concat = ParamLayer("Concat", "cache_concat", outs, ["cache_all_out"], ["0=0"])
    prefill = format_param(info.magic, layers + [concat])
    split = ParamLayer("Slice", "cache_slice", ["cache_all_in"], list(ins),
                       [f"-23300={len(ins)}," + ",".join(["-233"] * len(ins)), "1=0"])
    at = layers.index(cache_input)
    packed_input = ParamLayer("Input", "cache_all_in", [], ["cache_all_in"], [])
    step_layers = layers[:at] + [packed_input, split] + layers[at + 1 :]
    return prefill, format_param(info.magic, step_layers + [concat])


def fused_predictor_param(decoder_text: str, heads_text: str) -> str:
    """predictor_decoder.param (no cache) + predictor_heads.param -> one graph.

    The heads' input is the decoder's `out0` (every position: a head on 17 rows costs nothing);
    the heads' blobs are prefixed `h_`, their outputs renamed `logits_0` .. `logits_14`. Weights
    are read in layer order, so the merged .bin is the decoder's followed by the heads'."""
    info = parse_param(decoder_text)
    dec = info.layers
    heads = parse_param(heads_text).layers
    head_in = next(lyr for lyr in heads if lyr.type == "Input").outputs[0]
    rename = {head_in: "out0"}
    merged = []
    for lyr in heads:
        if lyr.type == "Input":
            continue
        for b in lyr.inputs + lyr.outputs:
            if b not in rename:
                rename[b] = f"logits_{b[3:]}" if b.startswith("out") else f"h_{b}"
        merged.append(ParamLayer(lyr.type, f"h_{lyr.name}", [rename[b] for b in lyr.inputs],
                                 [rename[b] for b in lyr.outputs], list(lyr.params)))
    # out0 now feeds the heads and is extracted too: route it through a Split
    producer = next(lyr for lyr in dec if "out0" in lyr.outputs)
    producer.outputs = ["dec_out" if b == "out0" else b for b in producer.outputs]
    consumers = sum(lyr.inputs.count("out0") for lyr in merged)
    split = ParamLayer("Split", "split_dec_out", ["dec_out"], ["out0"] + [f"out0_{i}" for i in range(consumers)], [])
    k = 0
    for lyr in merged:
        for j, b in enumerate(lyr.inputs):
            if b == "out0":
                lyr.inputs[j], k = f"out0_{k}", k + 1
    return format_param(info.magic, dec + [split] + merged)


def embed_table(ncnn_dir: Path, name: str, rows: int, threads: int = 2) -> np.ndarray:
    """Every row of an embedding graph, (rows, hidden) float32, computed once on the CPU (exact copies)."""
    return Net(ncnn_dir, name, threads, "cpu")(np.arange(rows, dtype=np.int32))[0]


class PackedKvCacheNet:
    """`KvCacheNet`'s interface (prefill, step, reset, past) with the caches as one blob."""

    def __init__(self, directory: str | Path, name: str, head_dim: int, theta: float, threads: int = 2,
                 device: str = "vulkan"):
        if parse_device(device) is None:  # x86 SDPA's cache layout has spare capacity a Concat mangles
            raise ValueError("PackedKvCacheNet is for Vulkan devices; on the CPU use KvCacheNet")
        directory = Path(directory)
        param = directory / f"{name}_kv.param"
        if not param.is_file():
            raise MissingArtifact(f"{param} not found; run notebooks/05_inject_kv_cache.py")
        self.layers = json.loads((directory / "manifest.json").read_text())[f"{name}_kv.param"]["cached_layers"]
        prefill, step = packed_cache_params(param.read_text())
        self.nets = [net_from_text(text, directory / f"{name}.bin", threads, device) for text in (prefill, step)]
        self.name, self.head_dim, self.theta = name, head_dim, theta
        self.reset()

    def reset(self) -> None:
        self.cache = None
        self.past = 0

    def _run(self, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import ncnn

        cos, sin = rope.tables(self.head_dim, self.theta, self.past, embeds.shape[1])
        ex = self.nets[self.cache is not None].create_extractor()
        held = [to_mat(embeds, 0), to_mat(mask), to_mat(cos), to_mat(sin)]
        for i, m in enumerate(held):
            ex.input(f"in{i}", m)
        if self.cache is None:
            empty = [ncnn.Mat() for _ in range(2 * self.layers)]
            for i in range(self.layers):
                ex.input(f"cache_k_in_{i}", empty[2 * i])
                ex.input(f"cache_v_in_{i}", empty[2 * i + 1])
        else:
            ex.input("cache_all_in", self.cache)
        out, cache = ncnn.Mat(), ncnn.Mat()
        if ex.extract("out0", out) != 0 or ex.extract("cache_all_out", cache, 1) != 0:
            raise RuntimeError(f"{self.name}: forward failed")
        self.cache = cache
        self.past += embeds.shape[1]
        return from_mat(out, 0)

    def prefill(self, embeds: np.ndarray) -> np.ndarray:
        self.reset()
        return self._run(embeds, rope.causal_mask(embeds.shape[1]))

    def step(self, embeds: np.ndarray) -> np.ndarray:
        if self.cache is None:
            raise RuntimeError("step() before prefill()")
        return self._run(embeds, rope.causal_mask(embeds.shape[1], self.past))


class FusedPredictor:
    """The code predictor as one graph per codebook: `logits(seq, s)` runs the decoder over the
    whole sequence (no cache) and reads head s at its last position."""

    def __init__(self, directory: str | Path, head_dim: int, theta: float, threads: int = 2,
                 device: str = "vulkan"):
        directory = Path(directory)
        text = fused_predictor_param((directory / "predictor_decoder.param").read_text(),
                                     (directory / "predictor_heads.param").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            merged = Path(tmp) / "predictor_fused.bin"
            with merged.open("wb") as out:
                for part in ("predictor_decoder.bin", "predictor_heads.bin"):
                    with (directory / part).open("rb") as f:
                        shutil.copyfileobj(f, out, 1 << 24)
            self.net = net_from_text(text, merged, threads, device)
        self.head_dim, self.theta = head_dim, theta

    def logits(self, seq: np.ndarray, s: int) -> np.ndarray:
        """seq (L, hidden) -> head s's logits (vocab,) at position L-1."""
        import ncnn

        length = len(seq)
        cos, sin = rope.tables(self.head_dim, self.theta, 0, length)
        held = [to_mat(seq[None].astype(np.float32), 0), to_mat(rope.causal_mask(length)), to_mat(cos), to_mat(sin)]
        ex = self.net.create_extractor()
        for i, m in enumerate(held):
            ex.input(f"in{i}", m)
        out = ncnn.Mat()
        if ex.extract(f"logits_{s}", out) != 0:
            raise RuntimeError(f"fused predictor: head {s} failed")
        return from_mat(out)[-1]
