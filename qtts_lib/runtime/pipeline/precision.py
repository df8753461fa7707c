"""Precision tiers: fewer bytes per weight for the two cached decoders. Introduced in 13.

The generation loop reads every weight of the talker once per frame and every weight of the code
predictor 15 times (6.6 GB per frame in fp32 at full size): it is memory-bound, so the only way
below its fp32 floor is fewer bytes per weight. A tier changes the talker's and the predictor's
transformer layers (and, int8 only, the code predictor's heads: one of its 15 per codebook, 126 MB of fp32 a
frame at full size); the embeddings, the talker's codec head (codebook 0 and the end of speech: 13 MB a frame) and
the codec stay fp32 in every tier (the codec has tiers of its own, `codec.decoder`).

    fp32  the exported graph for prefill and steps: one net, each weight held once (the code
          predictor's steps aside: `predictor_with_heads`). (Its Gemms are threaded at one row;
          `decode_step`'s InnerProduct form, which the runtime ran for steps before, measured the same
          on full-base at 2 threads and held a second copy of every weight.) The parity default.
    fp16  one-position steps run `decode_step` with ncnn's fp16 weight storage on the InnerProducts
          (x86 F16C: weights held as fp16, converted while they are read, fp32 arithmetic). Every other
          layer is masked back to fp32 (`31=2`), so only the weights are rounded. Same .bin. Prefill
          runs the exported fp32 graph (ncnn's x86 Gemm has no fp16 storage), so this tier holds the
          decoders' weights 1.5 times: fp32 and fp16.
    int8  every projection (constant-B Gemm) as ncnn's int8 Gemm with the weights as its constant A:
          int8 with one scale per row (per output feature) inside the Gemm, activations quantized
          at run time (dynamic absmax, one scale per call) and multiplied on VNNI
          (`rewrites.int8`). One graph serves prefill and steps. The predictor's heads the same
          way, each its own Gemm (fused, one call would compute all 15). Written once from numpy into `ncnn/int8/`.
    int8-k128, int8-k32  the same projections and heads as ncnn's weight-block int8 Gemm: a scale per row and
          block of 128 (32) along K, for the weights and for the activations, quantized at run time per block
          (`rewrites.int8.FORMS`). No calibration data: a heavy-tailed input (a down projection's) keeps its small
          values. 1 + 4/128 (4/32) bytes per weight. Written into `ncnn/int8-k128/` (`ncnn/int8-k32/`).

Two more tiers split int8 by decoder, for the quality harness (`qtts_lib.bench.quality`; the CLI does not offer them):
`int8-talker` (the talker int8, the code predictor and its heads fp32) and `int8-predictor` (the reverse).

The graphs are rewrites (`rewrites.decode_step`, `rewrites.int8`); this module decides which a tier loads and
keeps the int8 files current. Nothing here imports torch: the runtime writes the int8 files itself the first time
a tier is asked for (`ensure_int8`), and `qtts_lib.export` calls the same function as an export step.
"""
from __future__ import annotations

import json
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..binding.cached import KvCacheNet
from ..binding.net import PACKING_OFF, Net, make_net, nets_from_bins, parse_device
from ..errors import MissingArtifact, PrecisionError
from ..rewrites.batch import fold_batch
from ..rewrites.decode_step import cpu_graph, decode_step, fp16_step, one_position, static_reshapes
from ..rewrites.gpu import fused_predictor_param
from ..rewrites.int8 import int8_graph

TIERS = ("fp32", "fp16", "int8", "int8-k128", "int8-k32")
INT8_TIERS = {"int8": "rows", "int8-k128": "k128", "int8-k32": "k32"}   # tier -> its `rewrites.int8.FORMS` form
SPLIT_TIERS = {"int8-talker": ("talker_decoder",), "int8-predictor": ("predictor_decoder", "predictor_heads")}
DECODERS = ("talker_decoder", "predictor_decoder")
HEADS = ("predictor_heads",)   # the heads int8 makes int8 too (module docstring)
INT8_GRAPHS = DECODERS + HEADS  # what `ensure_int8` writes for the int8 tier
INT8_FORMAT = 4          # bump when the written files change meaning (3: biased Gemms are int8 too; 4: weights as A)


def check_tier(precision: str, device: str = "cpu") -> str:
    tier = (precision or "fp32").strip().lower()
    if tier not in TIERS and tier not in SPLIT_TIERS:
        raise PrecisionError(f"unknown precision {precision!r}; use one of {', '.join(TIERS)}")
    if tier != "fp32" and (device or "cpu").strip().lower() != "cpu":
        raise PrecisionError(f"precision {tier} runs on the CPU only; on {device} use fp32")
    return tier


def int8_form(tier: str, name: str) -> str | None:
    """The int8 form (`rewrites.int8.FORMS`) graph `name` runs in `tier`, or None where it stays fp32 (or fp16)."""
    if tier in INT8_TIERS:
        return INT8_TIERS[tier]
    return "rows" if name in SPLIT_TIERS.get(tier, ()) else None


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "format": INT8_FORMAT}


def _graph_file(name: str) -> str:
    """The .param a graph of `INT8_GRAPHS` is written from: a decoder's cached graph, a head's own."""
    if name not in INT8_GRAPHS:
        raise ValueError(f"no int8 form of {name!r}; there is one of {', '.join(INT8_GRAPHS)}")
    return f"{name}_kv.param" if name in DECODERS else f"{name}.param"


def int8_paths(ncnn_dir: str | Path, name: str, form: str = "rows") -> tuple[Path, Path]:
    d = Path(ncnn_dir) / ("int8" if form == "rows" else f"int8-{form}")
    return d / _graph_file(name), d / f"{name}.bin"


def ensure_int8(ncnn_dir: str | Path, name: str, log=None, form: str = "rows") -> tuple[Path, Path]:
    """`ncnn/int8/<name>_kv.param` (a head: `<name>.param`) + `<name>.bin` (another `form`: `ncnn/int8-<form>/`),
    written from the exported fp32 files unless already there for exactly those files (size, mtime and format
    recorded in the folder's `stamp.json`)."""
    ncnn_dir = Path(ncnn_dir)
    src_param, src_bin = ncnn_dir / _graph_file(name), ncnn_dir / f"{name}.bin"
    param, bin_ = int8_paths(ncnn_dir, name, form)
    stamps_file = param.parent / "stamp.json"
    stamps = json.loads(stamps_file.read_text()) if stamps_file.is_file() else {}
    want = {"param": _stamp(src_param), "bin": _stamp(src_bin)}
    have = stamps.get(name, {})
    if {k: have.get(k) for k in want} == want and param.is_file() and bin_.is_file():
        return param, bin_
    if log:
        log(f"writing the int8 tier ({form}) of {name} (once; {src_bin.stat().st_size / 1e9:.2f} GB of fp32 weights)")
    with src_bin.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as fp32:
        # the fp32 weights mapped, not copied; a head's Gemms share one input but must stay apart
        text, data, stats = int8_graph(src_param.read_text(), fp32, fuse=name in DECODERS, form=form)
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
    whether ncnn's fp16 weight storage is on. `decoder` loads it; `qtts_lib.bench.quality` probes it."""
    param: Path
    bin: Path
    rewrite: Callable[[str], str] | None
    fp16_weights: bool

    def net(self, threads: int = 2, device: str = "cpu"):
        return make_net(self.param, self.bin, threads, device, self.rewrite, fp16_weights=self.fp16_weights)

    def probe_options(self, ncnn_dir: str | Path, threads: int = 2) -> dict:
        """The same graph as `qtts_lib.probe.probe_ncnn` options (paths relative to `ncnn_dir`)."""
        rel = self.param.relative_to(Path(ncnn_dir)).with_suffix("")
        opts = {"param": str(rel), "bin": self.bin, "threads": threads, "use_fp16_storage": self.fp16_weights}
        return opts | ({"rewrite": self.rewrite} if self.rewrite else {})


def step_graph(ncnn_dir: str | Path, name: str, tier: str, log=None) -> StepGraph:
    """The step graph of decoder `name` in `tier`: fp32 `decode_step` and fp16 `fp16_step` over the exported
    `<name>_kv.param` and `.bin`; an int8 form the files of `ensure_int8` (written on first use), which also serve
    prefill. A split tier's fp32 decoder: fp32's."""
    ncnn_dir, tier = Path(ncnn_dir), check_tier(tier)
    form = int8_form(tier, name)
    if form:
        return StepGraph(*ensure_int8(ncnn_dir, name, log, form), None, False)
    rewrite = fp16_step if tier == "fp16" else decode_step
    return StepGraph(ncnn_dir / f"{name}_kv.param", ncnn_dir / f"{name}.bin", rewrite, tier == "fp16")


def ensure_int8_tier(ncnn_dir: str | Path, log=None, tier: str = "int8") -> None:
    """Every int8 file of `tier` (`ensure_int8` of each of `INT8_GRAPHS` it makes int8): what an export or a
    benchmark writes before anything is timed."""
    for name in INT8_GRAPHS:
        form = int8_form(check_tier(tier), name)
        if form:
            ensure_int8(ncnn_dir, name, log, form)


def head(ncnn_dir: str | Path, name: str, threads: int = 2, device: str = "cpu", precision: str = "fp32",
         log=None) -> Net:
    """Head `name` (one of `HEADS`) as `precision` runs it: an int8 form the files of `ensure_int8`, else the
    exported fp32 graph (fp16 leaves it fp32)."""
    ncnn_dir, tier = Path(ncnn_dir), check_tier(precision, device)
    form = int8_form(tier, name)
    return Net(ncnn_dir, name, threads, device, files=ensure_int8(ncnn_dir, name, log, form) if form else None)


def weight_bytes(tier: str) -> float:
    """Bytes per weight of the decoders' projections in a tier (the loop's floor scales with it): a weight-block
    form adds a 4-byte scale per block."""
    return {"fp32": 4.0, "fp16": 2.0, "int8": 1.0, "int8-k128": 1 + 4 / 128, "int8-k32": 1 + 4 / 32}[tier]


def frame_bytes(ncnn_dir: str | Path, tier: str, groups: int = 16, log=None) -> int:
    """Weight bytes one frame reads in `tier`, from the files it loads: the talker decoder and codec head once, the
    code predictor's decoder and one of its heads per predicted codebook (`groups` - 1). An int8 form's files as
    written (its scales and the layers it leaves fp32 included); fp16 halves the decoders' fp32 files."""
    ncnn_dir, tier = Path(ncnn_dir), check_tier(tier)

    def size(name: str) -> float:
        form = int8_form(tier, name) if name in INT8_GRAPHS else None
        if form:
            return ensure_int8(ncnn_dir, name, log, form)[1].stat().st_size
        return (ncnn_dir / f"{name}.bin").stat().st_size * (0.5 if tier == "fp16" and name in DECODERS else 1.0)

    return int(size("talker_decoder") + size("talker_codec_head")
               + (groups - 1) * (size("predictor_decoder") + size("predictor_heads") / (groups - 1)))


def cached_layers(ncnn_dir: str | Path, name: str) -> int:
    """The number of cached attention layers of `<name>_kv.param`, from the export manifest (chapter 05)."""
    manifest = Path(ncnn_dir) / "manifest.json"
    entry = json.loads(manifest.read_text()).get(f"{name}_kv.param") if manifest.is_file() else None
    if entry is None:
        raise MissingArtifact(f"{Path(ncnn_dir) / (name + '_kv.param')} is not exported; "
                              "run notebooks/05_inject_kv_cache.py")
    return entry["cached_layers"]


def decoder(ncnn_dir: str | Path, name: str, head_dim: int, theta: float, threads: int = 2, device: str = "cpu",
            precision: str = "fp32", fast_steps: bool | None = None, log=None, heads: int | None = None) -> KvCacheNet:
    """Cached decoder `name` as `precision` runs it. fp32 and int8: one graph for prefill and steps (their Gemms
    are threaded at one row), each weight held once. fp16 (CPU only): the exported graph for prefill and
    `step_graph` (fp16 InnerProducts) for one-position steps, two nets over the same `.bin`. `fast_steps` overrides
    whether steps run the step graph (the lab notes time fp32 both ways). On a GPU, fp32 only, the exported graph.

    One sequence's graph runs with static shapes and its small layers on one thread (`rewrites.decode_step.cpu_graph`).
    `heads` (the config's num_attention_heads) lets calls take several sequences at once: the graph folded by
    `rewrites.batch.fold_batch` (at one sequence it computes what the exported graph does), on the CPU and on a GPU
    alike, loaded when a call first needs it (`KvCacheNet.batched_net`: its weights are held a second time). fp16's
    step graph stays one sequence, one position: a batch runs the fp32-storage graph."""
    ncnn_dir, tier = Path(ncnn_dir), check_tier(precision, device)
    layers = cached_layers(ncnn_dir, name)
    param = ncnn_dir / f"{name}_kv.param"
    if not param.is_file():
        raise MissingArtifact(f"{param} not found; run notebooks/05_inject_kv_cache.py")
    form = int8_form(tier, name)
    if form:
        graph = step_graph(ncnn_dir, name, tier, log)
        param, bin_ = graph.param, graph.bin
    else:
        bin_ = ncnn_dir / f"{name}.bin"
    batched = None if heads is None else partial(make_net, param, bin_, threads, device,
                                                 lambda text: fold_batch(static_reshapes(text), heads))
    fast = tier == "fp16" if fast_steps is None else fast_steps
    step = step_graph(ncnn_dir, name, tier).net(threads, device) if fast and not form else None
    return KvCacheNet(make_net(param, bin_, threads, device, cpu_graph), layers, head_dim, theta,
                      step=step, name=name, heads=heads, device=device, batched=batched)


def predictor_with_heads(ncnn_dir: str | Path, head_dim: int, theta: float, threads: int = 2, device: str = "cpu",
                         precision: str = "fp32", log=None, heads: int | None = None) -> KvCacheNet | None:
    """The code predictor's cached decoder with its 15 heads in the same graph (`rewrites.gpu.fused_predictor_param`
    over `predictor_decoder_kv.param`): a call extracts `logits_s` (head s on the positions fed) and the caches, so
    each predictor step is one graph call, not a decoder call and a head call. The CPU's fp32 and int8 tiers: the
    prefill in that graph, the 14 steps of a frame in its one-position form (`rewrites.decode_step.one_position`:
    20 layers fewer a call; ncnn's packed layouts off, `binding.net.PACKING_OFF`), two nets, so the predictor's
    weights are held twice (int8: 110 MB more, fp32 440 MB).
    None elsewhere (fp16's step graph, a GPU: `decoder` and `head` apart). The .bin is the decoder's followed by the
    heads' (`binding.net.nets_from_bins`)."""
    ncnn_dir, tier = Path(ncnn_dir), check_tier(precision, device)
    if tier == "fp16" or parse_device(device) is not None:
        return None
    (param, dec_bin), (heads_param, heads_bin) = (
        ensure_int8(ncnn_dir, n, log, int8_form(tier, n)) if int8_form(tier, n) else
        (ncnn_dir / _graph_file(n), ncnn_dir / f"{n}.bin") for n in ("predictor_decoder", "predictor_heads"))
    for f in (param, dec_bin, heads_param, heads_bin):
        if not f.is_file():
            raise MissingArtifact(f"{f} not found; run notebooks/05_inject_kv_cache.py")
    fused = fused_predictor_param(param.read_text(), heads_param.read_text())

    def load(texts: list[str], options=None) -> list:
        return nets_from_bins(texts, [dec_bin, heads_bin], threads, device, options)

    batched = None if heads is None else (lambda: load([fold_batch(static_reshapes(fused), heads)])[0])
    prefill, step = load([cpu_graph(fused), one_position(cpu_graph(fused))], [None, PACKING_OFF])
    return KvCacheNet(prefill, cached_layers(ncnn_dir, "predictor_decoder"), head_dim, theta, step=step,
                      name="predictor_decoder", heads=heads, device=device, logits=True, batched=batched)
