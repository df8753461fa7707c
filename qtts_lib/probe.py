"""Layer-by-layer alignment: where along a graph does the error appear? Introduced in 04.

Two probes, one result type:

- `probe(wrapper, ...)`: the torch wrapper (the module pnnx exported) with forward hooks, against the
  ncnn graph extracting its intermediate blobs, for the same inputs.
- `probe_ncnn(...)`: one ncnn graph under two configurations (CPU vs Vulkan, fp32 vs fp16, ...), blob by
  blob; chapter 10 and the precision tiers use it.

How torch and ncnn pair. pnnx inlines the traced graph and names layers by op (`gemm_3`, `conv1d_44`), not by
module path (only MemoryData keeps one), and blobs are numbered. So pairing is by **op kind, then order, then
shape**: every hooked torch leaf module of a kind has exactly one ncnn layer of the matching type, and within a
kind both run in forward order (torch call order; the .param's topological order):

    nn.Linear           <-> Gemm / InnerProduct
    nn.Conv1d           <-> Convolution1D / ConvolutionDepthWise1D   (fused activation `9=` applied to torch's)
    nn.ConvTranspose1d  <-> Deconvolution1D / DeconvolutionDepthWise1D (before the wrapper's right trim)
    nn.LayerNorm        <-> LayerNorm
    nn.Embedding        <-> Embed
    graph outputs       <-> out0, out1, ...

Counts must agree per kind and every pair must have the same shape once size-1 axes are dropped (ncnn drops
pnnx's batch axis); otherwise `PairingError` says where. What that gives per graph:

    talker_decoder, predictor_decoder  7 Linears per layer (q, k, v, o, gate, up, down) -> per layer, per proj
    codec_decoder   the 2 dequantization Embeds, pre-conv, transformer Linears per layer, the 2 upsampling
                    stages (deconv, depthwise conv, LayerNorm, pointwise Linears), every decoder block's
                    deconv and residual-unit convs, the last conv (with ncnn's fused clamp)
    speaker_encoder every TDNN conv (fused ReLU/sigmoid), Res2Net branches, MFA, pooling attention, fc
    mimi_encoder    every SEANet conv, the transformer's LayerNorms and Linears per layer, the downsample conv
    embeds, heads   one Embed / Gemm each

RMSNorm (written as plain ops or F.rms_norm), rope and SDPA have no module to hook; their effect shows in the next
paired layer. `stage` groups taps by module path (`layers.3`, `upsample.1`, `decoder.4`, `blocks.0`).

The ncnn side (`extract_blobs`, `probe_ncnn`) is torch-free; the torch side imports torch when called.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .runtime.binding.net import NO_BATCH, from_mat, net_from_text, run
from .runtime.binding.param import ParamInfo, ParamLayer, parse_param, read_param

# torch module class name -> the ncnn layer types pnnx writes for it
PAIRS: dict[str, tuple[str, ...]] = {
    "Linear": ("Gemm", "InnerProduct"),
    "Conv1d": ("Convolution1D", "ConvolutionDepthWise1D"),
    "ConvTranspose1d": ("Deconvolution1D", "DeconvolutionDepthWise1D"),
    "LayerNorm": ("LayerNorm",),
    "Embedding": ("Embed",),
}
_CONV_TYPES = PAIRS["Conv1d"] + PAIRS["ConvTranspose1d"]
_NOT_COMPUTED = ("Input", "Split", "MemoryData")


class PairingError(ValueError):
    """The torch taps and the ncnn layers do not pair one to one (counts or shapes differ)."""


@dataclass
class ProbeResult:
    """Per-layer errors of one probe, in forward order. Introduced in 04.

    rows: one dict per tap: label (torch module path or ncnn layer), stage, layer/type/blob (ncnn), shape, rel
    (relative L2 error of `a` against `b`), max_abs. `a` and `b` say what was compared (titles use them)."""

    name: str
    a: str
    b: str
    rows: list[dict] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return [r["label"] for r in self.rows]

    @property
    def errors(self) -> np.ndarray:
        return np.array([r["rel"] for r in self.rows], dtype=np.float64)

    @property
    def worst(self) -> dict:
        """The tap with the largest relative error (the first one on ties)."""
        return self.rows[int(np.argmax(self.errors))]

    def stages(self) -> list[dict]:
        """The worst tap of every stage, stages in forward order."""
        out: dict[str, dict] = {}
        for r in self.rows:
            if r["stage"] not in out or r["rel"] > out[r["stage"]]["rel"]:
                out[r["stage"]] = r
        return list(out.values())

    def first_above(self, threshold: float) -> dict | None:
        """The first tap (in forward order) whose error exceeds `threshold`: where the error appears."""
        return next((r for r in self.rows if r["rel"] > threshold), None)

    def summary(self) -> str:
        w = self.worst
        return (f"{self.name}: {len(self.rows)} taps, {len(self.stages())} stages; worst {w['label']} "
                f"({w['type']} {w['layer']}) rel {w['rel']:.3g}")


# ---------------------------------------------------------------- the ncnn side (torch-free)
def load_net(param: str | Path, bin: str | Path, threads: int = 2, device: str = "cpu", opts: dict | None = None,
             rewrite: Callable[[str], str] | None = None):
    """An ncnn.Net as the runtime makes it (`runtime.binding.net.net_from_text`: fp16/bf16 off), with `opts` (net.opt
    attributes, e.g. {"use_fp16_storage": True}) applied on top, and the .param text passed through `rewrite` (a
    `runtime.rewrites` form, say) when given. Introduced in 04."""
    text = Path(param).read_text()
    return net_from_text(text if rewrite is None else rewrite(text), bin, threads, device, options=opts)


def input_axes(param_dir: str | Path, name: str) -> list[int]:
    """The batch axis pnnx chose for each graph input (from the export manifest). Introduced in 04."""
    entry = json.loads((Path(param_dir) / "manifest.json").read_text()).get(f"{name}.param")
    if entry is None:
        raise KeyError(f"{name}.param is not in {param_dir}/manifest.json; run notebooks/04_export_align.py")
    return entry["input_batch_axes"]


def computed_layers(info: ParamInfo) -> list[ParamLayer]:
    """The layers that compute something (not Input/Split/MemoryData), in .param order. Introduced in 04."""
    return [layer for layer in info.layers if layer.type not in _NOT_COMPUTED]


def extract_blobs(net, inputs: Sequence[np.ndarray], blobs: Sequence[str],
                  in_axes: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Feed `inputs` as in0, in1, ... and extract `blobs` from one Extractor, as numpy copies in ncnn's layout
    (pnnx's batch axis dropped). Introduced in 04.

    Give the blobs in .param order: with ncnn's default light mode a consumed blob is freed, and extracting it
    later would run its producers again."""
    in_axes = list(in_axes) if in_axes is not None else [NO_BATCH] * len(inputs)
    outs = run(net, {f"in{i}": a for i, a in enumerate(inputs)}, list(blobs),
               axes={f"in{i}": ax for i, ax in enumerate(in_axes)}, name="probe")
    return dict(zip(blobs, outs))


def probe_ncnn(param_dir: str | Path, name: str, inputs: Sequence[np.ndarray], a_opts: dict | None = None,
               b_opts: dict | None = None, layers: Sequence[str] | None = None) -> ProbeResult:
    """One graph under two configurations, blob by blob: the output of every computing layer (or of `layers`,
    by ncnn layer name) of configuration `a` against `b`. Introduced in 04 (used in 09 and the precision tiers).

    Each opts dict may hold `threads`, `device` ("cpu", "vulkan", "vulkan:N"), `param` (another .param over the
    same `<name>.bin`; a path relative to `param_dir`, without .param), `bin` (another weight file: a precision
    tier's, chapter 13), `rewrite` (a function of the .param text, e.g. `rewrites.decode_step.decode_step`) and any
    `net.opt` attribute (`use_fp16_storage`, ...); unset ones are the runtime's defaults (fp32, 2 threads, CPU,
    `<name>.param`). Blobs that only one side has (renamed or added by a rewrite) are skipped. The inputs' batch
    axes are those of `<name>.param` in the export manifest (a cached graph is fed its first inputs only)."""
    param_dir = Path(param_dir)
    sides = []
    for o in (dict(a_opts or {}), dict(b_opts or {})):
        param = param_dir / f"{o.pop('param', name)}.param"
        rewrite = o.pop("rewrite", None)
        info = parse_param(param.read_text() if rewrite is None else rewrite(param.read_text()))
        sides.append((o, param, rewrite, info, Path(o.pop("bin", param_dir / f"{name}.bin"))))
    order_b = {b: i for i, layer in enumerate(sides[1][3].layers) for b in layer.outputs}
    chosen = [layer for layer in computed_layers(sides[0][3])
              if (layers is None or layer.name in layers) and layer.outputs[0] in order_b]
    axes = input_axes(param_dir, name)[: len(inputs)]
    got = []
    for side, (o, param, rewrite, _, bin_) in enumerate(sides):
        threads, device = o.pop("threads", 2), o.pop("device", "cpu")
        net = load_net(param, bin_, threads, device, o, rewrite)
        blobs = [layer.outputs[0] for layer in chosen]
        got.append(extract_blobs(net, inputs, sorted(blobs, key=order_b.get) if side else blobs, axes))
        del net
    rows = [_row(layer.name, layer, got[0][layer.outputs[0]], got[1][layer.outputs[0]]) for layer in chosen]
    return ProbeResult(name, _describe(a_opts), _describe(b_opts), rows)


def _describe(opts: dict | None) -> str:
    opts = dict(opts or {})
    words = [opts.pop("device", "cpu"), f"{opts.pop('threads', 2)} threads"]
    if "param" in opts:
        words.insert(0, f"{opts.pop('param')}.param")
    if "rewrite" in opts:
        words.insert(0, getattr(opts.pop("rewrite"), "__name__", "rewritten"))
    words += [k if v is True else f"{k}={v}" for k, v in opts.items()]
    return "ncnn " + ", ".join(words)


def _stage(label: str) -> str:
    """`layers.3.self_attn.q_proj` -> `layers.3`; `input_proj` -> `input_proj`; ncnn names stay as they are."""
    parts = label.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and parts[1].isdigit() else parts[0]


def _squeezed(a: np.ndarray) -> np.ndarray:
    return a.reshape([d for d in a.shape if d != 1])


def _row(label: str, layer: ParamLayer, ours: np.ndarray, ref: np.ndarray) -> dict:
    a, b = _squeezed(np.asarray(ours, np.float64)), _squeezed(np.asarray(ref, np.float64))
    if a.shape != b.shape:
        raise PairingError(f"{label} <-> {layer.type} {layer.name}: shapes {ours.shape} (ncnn) vs {ref.shape}")
    den = float(np.linalg.norm(b))
    num = float(np.linalg.norm(a - b))
    return {"label": label, "stage": _stage(label), "layer": layer.name, "type": layer.type,
            "blob": layer.outputs[0], "shape": tuple(ref.shape), "rel": num / den if den > 0 else num,
            "max_abs": float(np.max(np.abs(a - b))) if a.size else 0.0}


def activation(layer: ParamLayer, x: np.ndarray) -> np.ndarray:
    """Apply the activation ncnn fused into a (de)convolution layer (`9=` type, `10=` params) to `x`.

    pnnx folds a ReLU, sigmoid or clamp that follows a conv into the conv; the torch hook sees the output
    before it. Introduced in 04."""
    if layer.type not in _CONV_TYPES:
        return x
    p = dict(kv.split("=", 1) for kv in layer.params if "=" in kv)
    kind = int(p.get("9", 0))
    args = [float(v) for v in p.get("-23310", "0").split(",")[1:]]
    if kind == 0:
        return x
    if kind == 1:
        return np.maximum(x, 0) if not args or args[0] == 0 else np.where(x > 0, x, x * args[0])
    if kind == 2:
        return np.where(x > 0, x, x * args[0])
    if kind == 3:
        return np.clip(x, args[0], args[1])
    if kind == 4:
        return 1.0 / (1.0 + np.exp(-x))
    raise NotImplementedError(f"{layer.name}: fused activation type {kind}")


# ---------------------------------------------------------------- pairing
def pair(taps: list[tuple[str, str, tuple]], info: ParamInfo) -> list[tuple[str, ParamLayer]]:
    """(torch label, ncnn layer) pairs in .param order: per op kind, the i-th torch tap with the i-th ncnn layer.

    `taps` are (module path, module class name, output shape) in torch call order. Introduced in 04."""
    pairs = []
    for kind, types in PAIRS.items():
        ours = [t for t in taps if t[1] == kind]
        theirs = [layer for layer in info.layers if layer.type in types]
        if len(ours) != len(theirs):
            raise PairingError(f"{len(ours)} torch {kind} calls vs {len(theirs)} ncnn {'/'.join(types)} layers")
        pairs += [(label, layer) for (label, _, _), layer in zip(ours, theirs)]
    order = {layer.name: i for i, layer in enumerate(info.layers)}
    return sorted(pairs, key=lambda p: order[p[1].name])


def output_layers(info: ParamInfo) -> list[ParamLayer]:
    """The layers producing out0, out1, ... in output order. Introduced in 04."""
    producer = {b: layer for layer in info.layers for b in layer.outputs}
    outs = sorted((b for b in producer if b.startswith("out") and b[3:].isdigit()), key=lambda b: int(b[3:]))
    return [ParamLayer(producer[b].type, producer[b].name, producer[b].inputs, [b], producer[b].params)
            for b in outs]


# ---------------------------------------------------------------- the torch side
def torch_taps(wrapper, inputs: Sequence) -> tuple[list[tuple[str, str, tuple]], list[np.ndarray], list]:
    """Run `wrapper(*inputs)` with a forward hook on every module of a paired kind.

    Returns (taps, values, outputs): taps (module path, class name, shape) in call order, their outputs as numpy,
    and the wrapper's outputs as a list of numpy arrays. Introduced in 04."""
    import torch

    taps, values, handles = [], [], []

    def hook(path: str):
        def record(module, args, out):
            taps.append((path, type(module).__name__, tuple(out.shape)))
            values.append(out.detach().float().cpu().numpy().copy())
        return record

    kinds = tuple(PAIRS)
    for path, m in wrapper.named_modules():
        if type(m).__name__ in kinds:
            handles.append(m.register_forward_hook(hook(path)))
    try:
        with torch.inference_mode():
            out = wrapper(*inputs)
    finally:
        for h in handles:
            h.remove()
    outs = [o.detach().float().cpu().numpy() for o in (out if isinstance(out, tuple) else (out,))]
    return taps, values, outs


def _name_stages(rows: list[dict], wrapper) -> None:
    """Add `stage_type`, the class of the wrapper's submodule at each stage path (ResUnit, TransConv, ...)."""
    for r in rows:
        try:
            r["stage_type"] = type(wrapper.get_submodule(r["stage"])).__name__
        except AttributeError:
            r["stage_type"] = ""


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def probe(wrapper, param_dir: str | Path, name: str, inputs, threads: int = 2, device: str = "cpu",
          tts=None, opts: dict | None = None) -> ProbeResult:
    """Per-layer error of the ncnn graph `name` against the torch wrapper it was exported from. Introduced in 04.

    `wrapper` is the nn.Module (or its `modules.ModuleSpec`, built with `tts`); `inputs` its inputs (a dict in
    graph-input order, as `spec.inputs` returns, or a sequence). Pairing: see the module docstring. Rows are
    the paired layers in .param order, then the graph outputs."""
    if hasattr(wrapper, "build") and hasattr(wrapper, "inputs"):
        wrapper = wrapper.build(tts)
    args = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    taps, values, outs = torch_taps(wrapper, args)
    param_dir = Path(param_dir)
    info = read_param(param_dir / f"{name}.param")
    pairs = pair(taps, info)
    value_of = {label: v for (label, _, _), v in zip(taps, values)}
    finals = output_layers(info)
    if len(finals) != len(outs):
        raise PairingError(f"{len(outs)} torch outputs vs {len(finals)} ncnn outputs")
    net = load_net(param_dir / f"{name}.param", param_dir / f"{name}.bin", threads, device, opts)
    blobs = [layer.outputs[0] for _, layer in pairs] + [layer.outputs[0] for layer in finals]
    got = extract_blobs(net, [_numpy(a) for a in args], blobs, input_axes(param_dir, name))
    rows = [_row(label, layer, got[layer.outputs[0]], activation(layer, value_of[label])) for label, layer in pairs]
    rows += [_row(f"output {i}", layer, got[layer.outputs[0]], o) for i, (layer, o) in enumerate(zip(finals, outs))]
    for r in rows[len(pairs):]:
        r["stage"] = "output"
    _name_stages(rows, wrapper)
    what = [device, f"{threads} threads", "fp32"] + [f"{k}={v}" for k, v in (opts or {}).items()]
    return ProbeResult(name, "ncnn " + ", ".join(what), "torch wrapper", rows)


def probe_decode(wrapper, kv_net, param_dir: str | Path, x: np.ndarray, prefill: int,
                 torch_inputs: Callable[[int], tuple], steps: Sequence[int]) -> dict[int, ProbeResult]:
    """Per-layer error of a cached ncnn decoder along decode steps. Introduced in 05.

    Runs `kv_net` (a `runtime.binding.cached.KvCacheNet` loaded from `param_dir`) the way the runtime does: `prefill`
    positions
    of `x` (1, N, hidden), then one position per step to the end of x. At every call index in `steps` (0 = the
    prefill, t = step t) the intermediate blobs are extracted from the same Extractor the runtime's call uses, in
    .param order before its outputs (the caches still go back into ncnn untouched), and paired with the torch
    wrapper's taps as it recomputes the whole prefix `wrapper(*torch_inputs(n))`, keeping the last rows.
    Returns {call index: result}."""
    info = read_param(Path(param_dir) / f"{kv_net.name}_kv.param")
    results = {}
    n_total = x.shape[1]
    cache = kv_net.new_cache()
    call_ends = [prefill] + list(range(prefill + 1, n_total + 1))
    for call, end in enumerate(call_ends):
        start = 0 if call == 0 else end - 1
        if call not in steps:
            _run(kv_net, x[:, start:end], cache)
            continue
        taps, values, outs = torch_taps(wrapper, torch_inputs(end))
        pairs = pair(taps, info)
        value_of = {label: v for (label, _, _), v in zip(taps, values)}
        sink: dict[str, np.ndarray] = {}
        blobs = [layer.outputs[0] for _, layer in pairs]
        hidden = _run(kv_net, x[:, start:end], cache, blobs, sink)
        rows = [_row(label, layer, sink[layer.outputs[0]], _last_rows(value_of[label], end - start))
                for label, layer in pairs]
        final = output_layers(info)[0]
        rows.append(_row("output 0", final, hidden, outs[0][:, start:end]))
        rows[-1]["stage"] = "output"
        _name_stages(rows, wrapper)
        results[call] = ProbeResult(kv_net.name, f"ncnn cached, call {call} (past {start})",
                                    "torch wrapper on the whole prefix", rows)
    return results


def _last_rows(value: np.ndarray, n: int) -> np.ndarray:
    """The last `n` positions of a (1, L, C) torch tap (the positions a cached call computes)."""
    return value[:, -n:] if value.ndim == 3 else value[-n:]


class _TapExtractor:
    """Wraps an ncnn Extractor: before the first extract of `out0`, extracts `blobs` (in .param order) into `sink`.
    Everything else passes through, so the runtime's own call (and its in-place cache handling) is what runs."""

    def __init__(self, ex, blobs: Sequence[str], sink: dict):
        self.ex, self.blobs, self.sink = ex, blobs, sink

    def input(self, *args):
        return self.ex.input(*args)

    def extract(self, name, *args):
        if name == "out0" and self.blobs:
            for b in self.blobs:
                ret, m = self.ex.extract(b)
                if ret != 0:
                    raise RuntimeError(f"extracting blob {b} failed ({ret})")
                self.sink[b] = from_mat(m)
            self.blobs = []
        return self.ex.extract(name, *args)


class _TapNet:
    def __init__(self, net, blobs: Sequence[str], sink: dict):
        self.net, self.blobs, self.sink = net, blobs, sink

    def create_extractor(self):
        return _TapExtractor(self.net.create_extractor(), self.blobs, self.sink)


def _run(kv_net, embeds: np.ndarray, cache, blobs: Sequence[str] = (), sink: dict | None = None) -> np.ndarray:
    """One runtime call (`KvCacheNet.forward`: the prefill from an empty cache, then steps), with `blobs` tapped into
    `sink`.

    Both of KvCacheNet's nets are wrapped: the prefill net, and the decode-only step net (`rewrites.decode_step`'s
    Gemm -> InnerProduct form) that steps use on the CPU; that rewrite keeps every Gemm's output blob name."""
    sink = sink if sink is not None else {}
    real = {attr: getattr(kv_net, attr) for attr in ("prefill_net", "step_net") if getattr(kv_net, attr) is not None}
    for attr, net in real.items():
        setattr(kv_net, attr, _TapNet(net, list(blobs), sink))
    try:
        return kv_net.forward(embeds, cache)
    finally:
        for attr, net in real.items():
            setattr(kv_net, attr, net)
