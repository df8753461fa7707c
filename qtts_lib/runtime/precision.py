"""Precision tiers: fewer bytes per weight for the two cached decoders. Introduced in 10.

The generation loop reads every weight of the talker once per frame and every weight of the code
predictor 15 times (6.6 GB per frame in fp32 at full size): it is memory-bound, so the only way
below its fp32 floor is fewer bytes per weight. A tier changes the talker's and the predictor's
transformer layers only; embeddings, the two heads and the codec stay fp32 in every tier.

    fp32  the exported weights; one-position steps run `speed.decode_step` (InnerProduct on a
          1-D input). The parity default.
    fp16  the same step graph with ncnn's fp16 weight storage on the InnerProducts (x86 F16C:
          weights held as fp16, converted while they are read, fp32 arithmetic). Every other
          layer is masked back to fp32 (`31=2`), so only the weights are rounded. Same .bin.
    int8  every projection (constant-B Gemm) as ncnn's int8 Gemm: weights int8 with a per-row
          scale, activations quantized per row at run time (dynamic, absmax) and multiplied on
          VNNI; the per-row weight scale is applied by a BinaryOp after the Gemm (ncnn's int8
          Gemm has one scale per weight tensor, so the rows are normalised to |max| = 1 first).
          One graph serves prefill and steps. Written once from numpy into `ncnn/int8/`.

Nothing here imports torch: the runtime writes the int8 files itself the first time a tier is
asked for (`ensure_int8`), and `qtts_lib.export` calls the same function as an export step.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .param import ParamLayer
from .speed import INT8_TAG, Graph, Segment, decode_step, join_bin, params_dict, set_params, split_bin

TIERS = ("fp32", "fp16", "int8")
DECODERS = ("talker_decoder", "predictor_decoder")
INT8_GEMM = "2"          # Gemm param 18 (quantize_term): int8 weights, activations quantized at run time
INT8_FORMAT = 2          # bump when the written files change meaning


class PrecisionError(ValueError):
    """An unknown tier, or a tier the device cannot run; the message lists what can."""


def check_tier(precision: str, device: str = "cpu") -> str:
    tier = (precision or "fp32").strip().lower()
    if tier not in TIERS:
        raise PrecisionError(f"unknown precision {precision!r}; use one of {', '.join(TIERS)}")
    if tier != "fp32" and (device or "cpu").strip().lower() != "cpu":
        raise PrecisionError(f"precision {tier} runs on the CPU only; on {device} use fp32")
    return tier


# ---------------------------------------------------------------- fp16
def fp16_step(text: str) -> str:
    """The decode-step graph with every layer but the InnerProducts masked out of fp16 storage (31=2)."""
    g = Graph(decode_step(text))
    for layer in g.layers:
        if layer.type not in ("InnerProduct", "Input"):
            layer.params = [p for p in layer.params if not p.startswith("31=")] + ["31=2"]
    return g.text()


# ---------------------------------------------------------------- int8
def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (N, K) fp32 -> (q (N, K) int8, row scale (N,) fp32) with w ≈ q / 127 * scale[:, None]."""
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None] * 127.0), -127, 127).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) / 127.0 * scale[:, None]


def _int8_eligible(layer: ParamLayer) -> bool:
    d = params_dict(layer)
    return (layer.type == "Gemm" and d.get("5") == "1" and d.get("3") == "1" and d.get("4", "0") == "0"
            and d.get("2", "0") == "0" and d.get("18", "0") == "0" and len(layer.inputs) == 1
            and (d.get("6", "0") == "0" or d.get("10", "-1") == "-1") and d.get("14", "0") == "0"
            and float(d.get("0", "1")) == 1.0)


def fuse_shared_input(g: Graph, weights: dict[str, np.ndarray]) -> int:
    """Gemms fed by the same Split (q/k/v; gate/up) -> one Gemm over their stacked weights and a Slice of its
    output. Exact under int8 too: the shared input is quantized once per row either way, and every weight row
    has its own scale. `weights` (layer name -> (N, K) fp32) is updated; returns the number of Gemms removed."""
    removed = 0
    for split in [lyr for lyr in g.layers if lyr.type == "Split"]:
        users = [next((c for c in g.consumers(b) if c.type == "Gemm" and c.name in weights), None)
                 for b in split.outputs]
        group = [(b, c) for b, c in zip(split.outputs, users) if c is not None and _int8_eligible(c)]
        if len(group) < 2 or len({weights[c.name].shape[1] for _, c in group}) != 1:
            continue
        first = group[0][1]
        stacked = np.concatenate([weights[c.name] for _, c in group])
        sizes = [weights[c.name].shape[0] for _, c in group]
        fused_out = g.fresh(first.name + "_fused")
        d = params_dict(first)
        d["8"] = str(stacked.shape[0])
        set_params(first, d)
        slice_ = ParamLayer("Slice", g.fresh(first.name + "_slice"), [fused_out], [c.outputs[0] for _, c in group],
                            [f"-23300={len(sizes)}," + ",".join(map(str, sizes)), "1=-1"])
        first.outputs = [fused_out]
        pos = min(g.layers.index(c) for _, c in group)  # before every consumer of the group's outputs
        for _, c in group:
            g.layers.remove(c)
            if c is not first:
                del weights[c.name]
        g.layers[pos:pos] = [first, slice_]
        weights[first.name] = stacked
        gone = {b for b, _ in group[1:]}
        split.outputs = [b for b in split.outputs if b not in gone]
        removed += len(group) - 1
    return removed


def int8_graph(text: str, data: bytes, fuse: bool = True) -> tuple[str, bytes, dict]:
    """The int8 form of a decoder graph and its .bin: Gemms sharing an input fused (`fuse_shared_input`), then
    each eligible Gemm -> int8 Gemm -> BinaryOp(mul, MemoryData row scales). Returns (param text, bin, stats)."""
    segs = split_bin(text, data)
    g = Graph(text)
    weights = {}
    for layer in g.layers:
        if _int8_eligible(layer):
            d = params_dict(layer)
            weights[layer.name] = segs[layer.name][0].array().reshape(int(d["8"]), int(d["9"]))
    stats = {"gemms": 0, "weights": 0, "rel_rms": [], "fused_away": fuse_shared_input(g, weights) if fuse else 0}
    out: dict[str, list[Segment]] = {}
    for layer in list(g.layers):
        if layer.name in segs:
            out[layer.name] = segs[layer.name]
        if not _int8_eligible(layer):
            continue
        d = params_dict(layer)
        n, k = int(d["8"]), int(d["9"])
        w = weights[layer.name]
        q, scale = quantize_rows(w)
        err = dequantize_rows(q, scale) - w
        stats["rel_rms"].append(float(np.sqrt((err**2).mean() / max((w**2).mean(), 1e-30))))
        stats["gemms"] += 1
        stats["weights"] += n * k
        d["18"] = INT8_GEMM
        set_params(layer, d)
        body = q.tobytes() + b"\0" * (-q.size % 4)
        out[layer.name] = [Segment(n * k, True, INT8_TAG + body), Segment(1, False, np.float32(127.0).tobytes())]
        scaled, table = g.fresh(layer.name + "_q"), g.fresh(layer.name + "_rows")
        final = layer.outputs[0]
        layer.outputs = [scaled]
        i = g.layers.index(layer)
        g.layers[i + 1 : i + 1] = [ParamLayer("MemoryData", table, [], [table], [f"0={n}"]),
                                   ParamLayer("BinaryOp", g.fresh(layer.name + "_mul"), [scaled, table], [final],
                                              ["0=2"])]
        out[table] = [Segment.of(scale, False)]
    new = g.text()
    return new, join_bin(new, out), stats


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "format": INT8_FORMAT}


def int8_paths(ncnn_dir: str | Path, name: str) -> tuple[Path, Path]:
    d = Path(ncnn_dir) / "int8"
    return d / f"{name}_kv.param", d / f"{name}.bin"


def ensure_int8(ncnn_dir: str | Path, name: str, log=None) -> tuple[Path, Path]:
    """`ncnn/int8/<name>_kv.param` + `<name>.bin`, written from the exported fp32 files unless already
    there for exactly those files (size, mtime and format recorded in `int8/stamp.json`)."""
    ncnn_dir = Path(ncnn_dir)
    src_param, src_bin = ncnn_dir / f"{name}_kv.param", ncnn_dir / f"{name}.bin"
    param, bin_ = int8_paths(ncnn_dir, name)
    stamps_file = param.parent / "stamp.json"
    stamps = json.loads(stamps_file.read_text()) if stamps_file.is_file() else {}
    want = {"param": _stamp(src_param), "bin": _stamp(src_bin)}
    have = stamps.get(name, {})
    if {k: have.get(k) for k in want} == want and param.is_file() and bin_.is_file():
        return param, bin_
    if log:
        log(f"writing the int8 tier of {name} (once; {src_bin.stat().st_size / 1e9:.2f} GB of fp32 weights)")
    text, data, stats = int8_graph(src_param.read_text(), src_bin.read_bytes())
    param.parent.mkdir(parents=True, exist_ok=True)
    tmp = bin_.with_suffix(".bin.tmp")
    tmp.write_bytes(data)
    tmp.replace(bin_)
    param.write_text(text)
    stamps[name] = want | {"gemms": stats["gemms"], "fused_away": stats["fused_away"], "weights": stats["weights"],
                           "weight_rel_rms": float(np.mean(stats["rel_rms"])) if stats["rel_rms"] else 0.0}
    stamps_file.write_text(json.dumps(stamps, indent=1))
    return param, bin_


@dataclass(frozen=True)
class StepGraph:
    """How a tier runs a decoder's one-position steps: a .param, an optional rewrite of its text, a .bin and
    whether ncnn's fp16 weight storage is on. `KvCacheNet` loads it; `qtts_lib.quality` probes it."""
    param: Path
    bin: Path
    rewrite: Callable[[str], str] | None
    fp16_weights: bool

    def net(self, threads: int = 2, device: str = "cpu"):
        from .net import make_net

        return make_net(self.param, self.bin, threads, device, self.rewrite, fp16_weights=self.fp16_weights)

    def probe_options(self, ncnn_dir: str | Path, threads: int = 2) -> dict:
        """The same graph as `qtts_lib.probe.probe_ncnn` options (paths relative to `ncnn_dir`)."""
        rel = self.param.relative_to(Path(ncnn_dir)).with_suffix("")
        opts = {"param": str(rel), "bin": self.bin, "threads": threads, "use_fp16_storage": self.fp16_weights}
        return opts | ({"rewrite": self.rewrite} if self.rewrite else {})


def step_graph(ncnn_dir: str | Path, name: str, tier: str, log=None) -> StepGraph:
    """The step graph of decoder `name` in `tier`: fp32 `speed.decode_step` and fp16 `fp16_step` over the exported
    `<name>_kv.param` and `.bin`; int8 the files of `ensure_int8` (written on first use), which also serve prefill."""
    ncnn_dir, tier = Path(ncnn_dir), check_tier(tier)
    if tier == "int8":
        return StepGraph(*ensure_int8(ncnn_dir, name, log), None, False)
    rewrite = fp16_step if tier == "fp16" else decode_step
    return StepGraph(ncnn_dir / f"{name}_kv.param", ncnn_dir / f"{name}.bin", rewrite, tier == "fp16")


def weight_bytes(tier: str) -> float:
    """Bytes per weight of the decoders' projections in a tier (the loop's floor scales with it)."""
    return {"fp32": 4.0, "fp16": 2.0, "int8": 1.0}[tier]
