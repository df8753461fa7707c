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
from .net import MissingArtifact, Net, from_mat, parse_device, to_mat


def _layers(text: str) -> tuple[str, list[list[str]]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0], [line.split() for line in lines[2:]]


def _format(magic: str, layers: list[list[str]]) -> str:
    blobs = {b for f in layers for b in f[4 : 4 + int(f[2]) + int(f[3])]}
    return "\n".join([magic, f"{len(layers)} {len(blobs)}"] + [" ".join(f) for f in layers]) + "\n"


def packed_cache_params(kv_text: str) -> tuple[str, str]:
    """A `<name>_kv.param` -> (prefill, step) params whose caches travel as one blob.

    Both end in `Concat(cache_k_out_0, cache_v_out_0, ...) -> cache_all_out` along axis 0 (heads).
    The step param replaces the caches' `Input` by `Input cache_all_in` + an equal `Slice` along
    axis 0. Prefill keeps the per-layer empty cache inputs (a Slice of an empty Mat is not defined)."""
    magic, layers = _layers(kv_text)
    cache_input = next(f for f in layers if f[0] == "Input" and f[4].startswith("cache_k_in_"))
    ins = cache_input[4:]
    outs = [name.replace("_in_", "_out_") for name in ins]
    concat = ["Concat", "cache_concat", str(len(outs)), "1", *outs, "cache_all_out", "0=0"]
    prefill = _format(magic, layers + [concat])
    split = ["Slice", "cache_slice", "1", str(len(ins)), "cache_all_in", *ins,
             f"-23300={len(ins)}," + ",".join(["-233"] * len(ins)), "1=0"]
    at = layers.index(cache_input)
    step_layers = layers[:at] + [["Input", "cache_all_in", "0", "1", "cache_all_in"], split] + layers[at + 1 :]
    return prefill, _format(magic, step_layers + [concat])


def fused_predictor_param(decoder_text: str, heads_text: str) -> str:
    """predictor_decoder.param (no cache) + predictor_heads.param -> one graph.

    The heads' input is the decoder's `out0` (every position: a head on 17 rows costs nothing);
    the heads' blobs are prefixed `h_`, their outputs renamed `logits_0` .. `logits_14`. Weights
    are read in layer order, so the merged .bin is the decoder's followed by the heads'."""
    magic, dec = _layers(decoder_text)
    _, heads = _layers(heads_text)
    head_in = next(f for f in heads if f[0] == "Input")[4]
    rename = {head_in: "out0"}
    merged = []
    for f in heads:
        if f[0] == "Input":
            continue
        n_in, n_out = int(f[2]), int(f[3])
        blobs = f[4 : 4 + n_in + n_out]
        for b in blobs:
            if b not in rename:
                rename[b] = f"logits_{b[3:]}" if b.startswith("out") else f"h_{b}"
        merged.append([f[0], f"h_{f[1]}", f[2], f[3], *[rename[b] for b in blobs], *f[4 + n_in + n_out :]])
    # out0 now feeds the heads and is extracted too: route it through a Split
    producer = next(f for f in dec if "out0" in f[4 + int(f[2]) : 4 + int(f[2]) + int(f[3])])
    producer[producer.index("out0", 4 + int(producer[2]))] = "dec_out"
    consumers = sum(f[4 : 4 + int(f[2])].count("out0") for f in merged)
    split = ["Split", "split_dec_out", "1", str(consumers + 1), "dec_out", "out0"]
    split += [f"out0_{i}" for i in range(consumers)]
    k = 0
    for f in merged:
        for j in range(4, 4 + int(f[2])):
            if f[j] == "out0":
                f[j], k = f"out0_{k}", k + 1
    return _format(magic, dec + [split] + merged)


def net_from_text(text: str, bin: str | Path, threads: int, device: str):
    """An ncnn.Net from param text and a .bin file, with `make_net`'s options (fp32, threads, device).

    (The binding's `load_model_mem` keeps pointers into a buffer Python frees: files only.)"""
    import ncnn

    gpu = parse_device(device)
    net = ncnn.Net()
    opt = net.opt
    opt.num_threads = threads
    opt.use_fp16_packed = opt.use_fp16_storage = opt.use_fp16_arithmetic = opt.use_bf16_storage = False
    opt.use_vulkan_compute = gpu is not None
    if gpu is not None:
        net.set_vulkan_device(gpu)
    if net.load_param_mem(text) != 0 or net.load_model(str(bin)) != 0:
        raise RuntimeError("ncnn could not load a rewritten graph")
    return net


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
