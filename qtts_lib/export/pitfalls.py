"""The pnnx and ncnn pitfalls, reproduced on the installed versions. Appendix A (pnnx) and appendix B (ncnn).

- `reproduce_pnnx(work)` / `reproduce_ncnn(work)` run every reproduction of a chapter and return one
  `Finding` per pitfall: the measured symptom, whether it reproduced, the fix, and in `.data` what the
  chapter shows and checks (the .param lines, the signals, ncnn's and torch's outputs at two lengths).
- `run_isolated(func, *args)` runs one of this module's child functions (`load_graph`, `ncnn_forward`,
  `temporary_clone`, `inplace_first_layer`, `extract_forms`, `kill_self`) in a fresh Python: some pitfalls
  kill the process (SIGFPE, SIGSEGV), and the caller must survive to report it.
- `pnnx_cli` runs pnnx the way a first attempt does (the arguments you give, nothing else), so a demo can
  leave out `input2=` or `fp16=0` on purpose. `export_module` is the careful way.
- The small torch modules (`Attention`, `StackSum`, `FusedSum`, `Upsample`, `Splitter`, `HeadMix`, `Block`)
  are one pitfall each.
"""
from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..check import rel_err
from ..runtime.binding.net import from_mat, make_net, to_mat
from . import ParamLayer, _batch_axes, export_module, pnnx_binary, read_param

LENGTHS = (7, 11)  # every export sees both, except where a single length is the point


# ---------------------------------------------------------------- child processes
@dataclass
class Isolated:
    """What a child process did: exit status, the signal that killed it (if any), its output."""
    returncode: int
    stdout: str
    stderr: str
    outputs: dict = field(default_factory=dict)

    @property
    def signal(self) -> str | None:
        return signal.Signals(-self.returncode).name if self.returncode < 0 else None

    @property
    def status(self) -> str:
        return f"killed by {self.signal} (returncode {self.returncode})" if self.signal else f"exit {self.returncode}"

    @property
    def result(self):
        """The JSON the child printed last (None when it died first)."""
        lines = self.stdout.strip().splitlines()
        return json.loads(lines[-1]) if self.returncode == 0 and lines else None


def run_isolated(func: Callable, *args, timeout: float = 120) -> Isolated:
    """Run `func(*args)` in a child Python that imports it (`func` is module-level; args go as strings).
    Appendix A."""
    if func.__qualname__ != func.__name__:
        raise ValueError(f"{func.__qualname__} is not a module-level function")
    code = f"import sys\nfrom {func.__module__} import {func.__name__} as f\nf(*sys.argv[1:])"
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    return Isolated(proc.returncode, proc.stdout, proc.stderr)


def kill_self(signal_name: str) -> None:
    """Child: die by `signal_name` (to test that the runner reports it)."""
    os.kill(os.getpid(), getattr(signal, signal_name))


def load_graph(param: str, bin: str) -> None:
    """Child: load a graph with the plain ncnn API; print both return values."""
    import ncnn

    net = ncnn.Net()
    print(json.dumps({"load_param": net.load_param(param), "load_model": net.load_model(bin)}))


def ncnn_forward(param: str, bin: str, npz_in: str, npz_out: str, spec: str) -> None:
    """Child: one forward pass through `runtime.net`; outputs to `npz_out` (empty blobs left out)."""
    spec = json.loads(spec)
    net = make_net(param, bin, spec["threads"])
    arrays = np.load(npz_in)
    ex = net.create_extractor()
    for i, ax in enumerate(spec["in_axes"]):
        ex.input(f"in{i}", to_mat(arrays[f"in{i}"], ax))
    outs, rets = {}, {}
    for name, ax in zip(spec["outputs"], spec["out_axes"]):
        rets[name], m = ex.extract(name)
        if rets[name] == 0 and m.dims > 0:
            outs[name] = from_mat(m, ax)
    np.savez(npz_out, **outs)
    print(json.dumps({"rets": rets, "empty": [n for n in spec["outputs"] if n not in outs]}))


def ncnn_isolated(param, bin, arrays: list[np.ndarray], in_axes: list[int], out_axes: list[int],
                  outputs: list[str] | None = None, threads: int = 2) -> Isolated:
    """`ncnn_forward` in a child process; `.outputs` maps blob name -> array (an empty blob is left out),
    `.result` holds the extract return codes."""
    outputs = outputs or [f"out{i}" for i in range(len(out_axes))]
    with tempfile.TemporaryDirectory(prefix="ncnn_isolated_") as tmp:
        npz_in, npz_out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(npz_in, **{f"in{i}": a for i, a in enumerate(arrays)})
        spec = json.dumps({"threads": threads, "in_axes": in_axes, "out_axes": out_axes, "outputs": outputs})
        res = run_isolated(ncnn_forward, param, bin, npz_in, npz_out, spec)
        if res.returncode == 0:
            with np.load(npz_out) as f:
                res.outputs = {k: f[k] for k in f.files}
    return res


def temporary_clone(seed: str) -> None:
    """Child: 20 transposed (64, 300) arrays into Mats two ways; print how many came back wrong."""
    import ncnn

    rng = np.random.default_rng(int(seed))
    bad = good = bad_values = 0
    for _ in range(20):
        x = rng.standard_normal((64, 300)).astype(np.float32).T          # a non-contiguous view
        a = np.array(ncnn.Mat(np.ascontiguousarray(x)).clone().numpy())  # the temporary dies before clone()
        b = np.array(to_mat(x).numpy())                                   # held until the clone owns it
        bad += not np.array_equal(a, x)
        bad_values += int(np.sum(a != x))
        good += not np.array_equal(b, x)
    print(json.dumps({"temporary_wrong": bad, "wrong_values": bad_values, "to_mat_wrong": good, "arrays": 20}))


def inplace_first_layer(param: str, bin: str, how: str) -> None:
    """Child: feed a graph whose first layer works in place a borrowed Mat or a `to_mat` one (array held)."""
    import ncnn

    net = ncnn.Net()
    net.load_param(param)
    net.load_model(bin)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)  # held until the end
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(x) if how == "borrowed" else to_mat(x))
    ret, out = ex.extract("out0")
    print(json.dumps({"ret": ret, "max_abs": float(np.abs(np.array(out.numpy()) - np.maximum(x, 0)).max())}))


def extract_forms(param: str, bin: str) -> None:
    """Child: the tuple form and the in-place form of `extract`, three ways of feeding the input."""
    import ncnn

    net = ncnn.Net()
    net.load_param(param)
    net.load_model(bin)
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)

    def ptr(m) -> int:
        return m.numpy().ctypes.data

    pool = ncnn.PoolAllocator()  # must outlive every Mat it allocated
    seen = {}
    for setting in ("input kept", "input handed over", "input kept, own blob allocator"):
        ex = net.create_extractor()
        if "own" in setting:
            ex.set_blob_allocator(pool)
        inp = to_mat(x)
        p_in = ptr(inp)
        ex.input("in0", inp)
        if setting == "input handed over":
            del inp
        t1, t2 = ex.extract("out0")[1], ex.extract("out0")[1]  # tuple form, twice
        m1, m2 = ncnn.Mat(), ncnn.Mat()
        ex.extract("out0", m1)                                  # in-place form, twice
        ex.extract("out0", m2)
        seen[setting] = {"tuple: refcount": t1.refcount, "tuple: same buffer twice": ptr(t1) == ptr(t2),
                         "in-place: refcount": m1.refcount, "in-place: same buffer twice": ptr(m1) == ptr(m2),
                         "in-place: is the input's buffer": ptr(m1) == p_in,
                         "cstep (tuple, in-place)": [t1.cstep, m1.cstep],
                         "values equal": bool(np.array_equal(t1.numpy(), m1.numpy()))}
        del t1, t2, m1, m2, ex
        inp = None
    del pool
    print(json.dumps(seen))


# ---------------------------------------------------------------- pnnx, .param, ncnn in this process
def pnnx_cli(wrapper, name: str, work: str | Path, inputs: dict, inputs2: dict | None = None, **options) -> dict:
    """Trace `wrapper` at `inputs`, run `pnnx <name>.pt input=... [input2=...] key=value...` in `work`.

    Returns the paths pnnx wrote, its exit status and log, and the batch axes it chose."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.jit.trace(wrapper, tuple(inputs.values()), check_trace=False).save(str(work / f"{name}.pt"))
    cmd = [pnnx_binary(), f"{name}.pt"]
    for key, ins in (("input", inputs), ("input2", inputs2)):
        if ins is not None:
            files = [f"{name}_{key}_{i}.npy" for i in range(len(ins))]
            for f, t in zip(files, ins.values()):
                np.save(work / f, t.detach().cpu().numpy())
            cmd.append(f"{key}=" + ",".join(files))
    cmd += [f"{k}={v}" for k, v in options.items()]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    script = work / f"{name}_ncnn.py"
    in_axes, out_axes = _batch_axes(script.read_text()) if script.is_file() else ([], [])
    return {"param": work / f"{name}.ncnn.param", "bin": work / f"{name}.ncnn.bin", "returncode": proc.returncode,
            "log": proc.stdout + proc.stderr, "command": " ".join(cmd[1:]),
            "input_batch_axes": in_axes, "output_batch_axes": out_axes}


def graph(work: Path, info: dict) -> tuple[Path, Path]:
    """The .param and .bin that `export_module(..., work)` or `pnnx_cli` wrote."""
    if "param" in info:
        return Path(info["param"]), Path(info["bin"])
    return Path(work) / f"{info['name']}.param", Path(work) / f"{info['name']}.bin"


def param_lines(param: Path, *types: str) -> list[str]:
    """The .param lines of the given layer types, as pnnx wrote them."""
    return [line for line in Path(param).read_text().splitlines() if line.split(" ", 1)[0] in types]


def first_layer(param: Path, layer_type: str) -> ParamLayer:
    return next(layer for layer in read_param(param).layers if layer.type == layer_type)


def param_of(layer: ParamLayer, key: str) -> str:
    """The `key=value` entry of one layer's parameters ('' when absent)."""
    return next((q for q in layer.params if q.startswith(f"{key}=")), "")


def run_ncnn(work: Path, info: dict, inputs: dict, threads: int = 2, opt: dict | None = None) -> np.ndarray:
    """Output 0 of a converted graph, in this process, for graphs known not to crash. Without `opt` the net is
    `make_net`'s (fp16/bf16 off); with it, ncnn's own `Option` defaults changed only by `opt`'s fields."""
    param, binf = graph(work, info)
    if opt is not None:
        import ncnn

        net = ncnn.Net()
        net.opt.num_threads = threads
        for k, v in opt.items():
            setattr(net.opt, k, v)
        if net.load_param(str(param)) != 0 or net.load_model(str(binf)) != 0:
            raise RuntimeError(f"ncnn could not load {param}")
    else:
        net = make_net(param, binf, threads)
    ex = net.create_extractor()
    for i, (a, ax) in enumerate(zip(inputs.values(), info["input_batch_axes"])):
        ex.input(f"in{i}", to_mat(a.numpy(), ax))
    ret, m = ex.extract("out0")
    if ret != 0:
        raise RuntimeError(f"extract failed ({ret})")
    return from_mat(m, info["output_batch_axes"][0])


def run_isolated_graph(work: Path, info: dict, inputs: dict, outputs: list[str] | None = None,
                       threads: int = 2) -> Isolated:
    """`ncnn_isolated` on a converted graph, for graphs that may crash."""
    return ncnn_isolated(*graph(work, info), [a.numpy() for a in inputs.values()], info["input_batch_axes"],
                         info["output_batch_axes"], outputs, threads)


def torch_out(module: nn.Module, inputs: dict) -> np.ndarray:
    with torch.no_grad():
        return module(*inputs.values()).numpy()


# ---------------------------------------------------------------- findings
@dataclass
class Finding:
    """One pitfall as measured in this run; `data` holds what the chapter shows and checks. Appendix A."""
    key: str
    pitfall: str
    tool: str
    reproduces: bool
    symptom: str
    fix: str
    data: dict = field(default_factory=dict, repr=False)


def versions() -> dict[str, str]:
    return {d: f"{d} {metadata.version(d)}" for d in ("pnnx", "ncnn", "torch")}


def table(findings: list[Finding]):
    """The findings as a DataFrame: pitfall, symptom, fix, reproduces on <version>? Appendix A."""
    import pandas as pd

    col = f"reproduces on {', '.join(sorted({f.tool for f in findings}))}?"
    rows = [{"pitfall": f.pitfall, "symptom": f.symptom, "fix": f.fix,
             col: "yes" if f.reproduces else "no"} for f in findings]
    return pd.DataFrame(rows, index=range(1, len(rows) + 1))


# ---------------------------------------------------------------- appendix A: GQA
def hf_repeat_kv(h: torch.Tensor, n: int = 2) -> torch.Tensor:
    """transformers' repeat_kv: (b, kv, s, d) -> (b, kv*n, s, d) by expand + reshape."""
    b, kv, s, d = h.shape
    return h[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)


HF_REPEAT = "hf repeat_kv (expand+reshape)"
REPEATS = {
    HF_REPEAT: hf_repeat_kv,
    "repeat_interleave(2, dim=-3)": lambda h: h.repeat_interleave(2, dim=-3),
    "repeat_interleave(2, dim=1)": lambda h: h.repeat_interleave(2, dim=1),
    "sdpa(enable_gqa=True)": None,
}


class Attention(nn.Module):
    """4 query heads, 2 kv heads of width 8, the kv widening chosen by name from REPEATS."""

    def __init__(self, repeat: str):
        super().__init__()
        self.repeat = repeat
        self.q, self.k, self.v, self.o = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # x (1, T, 32), mask (T, T)
        t = x.shape[1]
        q = self.q(x).view(1, t, 4, 8).transpose(1, 2)
        k = self.k(x).view(1, t, 2, 8).transpose(1, 2)
        v = self.v(x).view(1, t, 2, 8).transpose(1, 2)
        widen = REPEATS[self.repeat]
        if widen is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, widen(k), widen(v), attn_mask=mask)
        return self.o(o.transpose(1, 2).reshape(1, t, 32))


def attn_inputs(t: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(1, t, 32, generator=g), "mask": torch.full((t, t), float("-inf")).triu(1)}


def reproduce_gqa(work: Path, threads: int = 2) -> Finding:
    """All REPEATS variants with one set of weights: leftovers, SDPA count, the HF one loaded in a child,
    the folding ones against torch at both lengths."""
    torch.manual_seed(1)
    attn = {r: Attention(r).eval() for r in REPEATS}
    for m in attn.values():
        m.load_state_dict(attn[HF_REPEAT].state_dict())
    info = {r: export_module(m, f"attn_{i}", attn_inputs(7, 0), attn_inputs(11, 1), work)
            for i, (r, m) in enumerate(attn.items())}
    params = {r: read_param(graph(work, i)[0]) for r, i in info.items()}
    load = run_isolated(load_graph, *graph(work, info[HF_REPEAT]))
    outputs = {}
    for r in ("repeat_interleave(2, dim=-3)", "sdpa(enable_gqa=True)"):
        for t in LENGTHS:
            ins = attn_inputs(t, 100 + t)
            outputs[r, t] = run_ncnn(work, info[r], ins, threads), torch_out(attn[r], ins)
    leftovers = {r: sorted({layer.type for layer in p.leftovers}) for r, p in params.items()}
    ret = load.result["load_param"] if load.result else None
    data = {"hf_lines": param_lines(graph(work, info[HF_REPEAT])[0], "pnnx.Expression", "Tensor.expand", "SDPA"),
            "leftovers": leftovers, "sdpa": {r: p.counts["SDPA"] for r, p in params.items()},
            "load": load, "outputs": outputs}
    return Finding("gqa", "GQA via HF repeat_kv", versions()["pnnx"], ret is not None and ret != 0,
                   f"{', '.join(leftovers[HF_REPEAT])} left in the .param; load_param returns {ret}",
                   "repeat_interleave(n, dim=-3), or enable_gqa=True", data)


# ---------------------------------------------------------------- appendix A: a sum over pnnx's batch axis
G, V, D = 4, 16, 8  # groups, rows per table, width


class StackSum(nn.Module):
    """sum over groups g of table_g[ids]: the obvious way."""

    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(V, D) for _ in range(G))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (1, T) int32 -> (1, T, D)
        return torch.stack([t(ids) for t in self.tables]).sum(0)


def ids_inputs(t: int, seed: int) -> dict:
    return {"ids": torch.randint(0, V, (1, t), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)}


class FusedSum(nn.Module):
    """The same sum in the codec decoder's form (modules/codec.py): one fused table, a ones-matmul."""

    def __init__(self, src: StackSum, leading_one: bool):
        super().__init__()
        self.first = src.tables[0]
        self.rest = nn.Embedding.from_pretrained(torch.cat([t.weight for t in src.tables[1:]]).detach())
        self.register_buffer("ones", torch.ones(1, G - 1))
        self.leading_one = leading_one

    def forward(self, first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:  # (1, T), ((G-1)*T,) int32
        a = self.rest(rest)  # ((G-1)*T, D), group-major rows
        a = a.reshape(1, G - 1, -1) if self.leading_one else a.reshape(G - 1, -1)
        return self.first(first) + (self.ones @ a).reshape(1, -1, D)


def fused_inputs(t: int, seed: int) -> dict:
    ids = ids_inputs(t, seed)["ids"]
    rest = (ids.long() + V * torch.arange(G - 1)[:, None]).reshape(-1).to(torch.int32)  # group g+1 at rows g*V..
    return {"first": ids, "rest": rest}


def reshape_label(lead: bool) -> str:
    return f"reshape({'1, ' if lead else ''}{G - 1}, -1)"


def reproduce_batch_sum(work: Path, threads: int = 2) -> list[Finding]:
    """StackSum run in children (it dies), then FusedSum with and without the leading 1, at both lengths."""
    pnnx_v = versions()["pnnx"]
    torch.manual_seed(2)
    stack_sum = StackSum().eval()
    ss = export_module(stack_sum, "stack_sum", ids_inputs(7, 0), ids_inputs(11, 1), work)
    param = graph(work, ss)[0]
    concat, reduction = first_layer(param, "Concat"), first_layer(param, "Reduction")
    crash = {t: run_isolated_graph(work, ss, ids_inputs(t, 100 + t), threads=threads) for t in LENGTHS}
    concat_only = run_isolated_graph(work, ss, ids_inputs(7, 107), [concat.outputs[0]], threads)
    ss_data = {"info": ss, "lines": param_lines(param, "Concat", "Reduction"), "concat_axis": param_of(concat, "0"),
               "reduction_axes": param_of(reduction, "-23303"), "crash": crash, "concat_only": concat_only}
    stack = Finding("stack_sum", "stack(parts).sum(0) over pnnx's batch axis", pnnx_v,
                    all(r.signal == "SIGFPE" for r in crash.values()),
                    f"Concat {ss_data['concat_axis']} + Reduction {ss_data['reduction_axes']}; "
                    f"process killed by {crash[7].signal}", "one fused table, ones(1, n) @ x.reshape(1, n, -1)",
                    ss_data)

    lines, marks, runs, rel = {}, {}, {}, {}
    for lead in (False, True):
        info = export_module(FusedSum(stack_sum, lead).eval(), f"fused_sum_{int(lead)}", fused_inputs(7, 0),
                             fused_inputs(11, 1), work)
        reshape = first_layer(graph(work, info)[0], "Reshape")
        lines[lead] = param_lines(graph(work, info)[0], "Reshape")[0]
        marks[lead] = " ".join(q for q in (param_of(reshape, "12"), param_of(reshape, "13")) if q)
        for t in LENGTHS:
            ins = fused_inputs(t, 100 + t)
            res = run_isolated_graph(work, info, ins, threads=threads)
            ref = torch_out(stack_sum, {"ids": ins["first"]})  # the original StackSum in torch
            group0 = torch_out(stack_sum.tables[0], {"ids": ins["first"]})
            runs[lead, t] = res, ref, group0
            rel[lead, t] = rel_err(res.outputs["out0"], ref) if "out0" in res.outputs else float("nan")
    trap = Finding("reshape_trap", "reshape(n, -1) before the ones-matmul", pnnx_v,
                   all(rel[False, t] > 0.1 for t in LENGTHS),
                   f"Reshape marked {marks[False]}; no error, rel error {rel[False, 7]:.2f}", "reshape(1, n, -1)",
                   {"lines": lines, "marks": marks, "runs": runs})
    return [stack, trap]


# ---------------------------------------------------------------- appendix A: the dropped crop
TRIM_SLICE = "y[..., :-2]"
TRIMS = {
    TRIM_SLICE: lambda y: y[..., :-2],
    "F.pad(y, (0, -2))": lambda y: F.pad(y, (0, -2)),
    "y[..., :y.shape[-1] - 2]": lambda y: y[..., : y.shape[-1] - 2],
}


class Upsample(nn.Module):
    """A transposed convolution that makes 2T + 2 samples, trimmed to 2T by the named TRIMS entry."""

    def __init__(self, trim: str):
        super().__init__()
        self.trim = trim
        self.conv = nn.ConvTranspose1d(4, 4, kernel_size=4, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, 4, T) -> (1, 4, 2T)
        return TRIMS[self.trim](self.conv(x))


def wave_inputs(t: int, seed: int) -> dict:
    return {"x": torch.randn(1, 4, t, generator=torch.Generator().manual_seed(seed))}


def reproduce_crop(work: Path, threads: int = 2) -> Finding:
    torch.manual_seed(3)
    ups = {k: Upsample(k).eval() for k in TRIMS}
    for m in ups.values():
        m.load_state_dict(ups[TRIM_SLICE].state_dict())
    info = {k: export_module(m, f"trim_{i}", wave_inputs(7, 0), wave_inputs(11, 1), work)
            for i, (k, m) in enumerate(ups.items())}
    crops = {k: read_param(graph(work, i)[0]).counts["Crop"] for k, i in info.items()}
    outputs = {(k, t): (run_ncnn(work, info[k], wave_inputs(t, 100 + t), threads),
                        torch_out(ups[k], wave_inputs(t, 100 + t))) for k in TRIMS for t in LENGTHS}
    n = outputs[TRIM_SLICE, 7][0].shape[-1]
    data = {"lines": {k: param_lines(graph(work, i)[0], "Crop") for k, i in info.items()}, "crops": crops,
            "outputs": outputs}
    return Finding("crop", "x[..., :-r] with a dynamic length", versions()["pnnx"], n != 14,
                   f"{crops[TRIM_SLICE]} Crop layers written; T=7 gives {n} samples instead of 14, no error",
                   "F.pad(x, (0, -r)) (a Crop); x[..., :x.shape[-1] - r] also works", data)


# ---------------------------------------------------------------- appendix A: unbind / chunk / tensor_split
def _weigh3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Three pieces into one number each, weighted so that a wrong piece width shows."""
    return a.sum(-1) + 10 * b.sum(-1) + 100 * c.sum(-1)


SPLITS = {
    "unbind(-1)": lambda y: (lambda p: p[0] * p[1] + p[2] - p[3])(y.unbind(-1)),
    "chunk(2, -1)": lambda y: (lambda a, b: a * torch.sigmoid(b))(*y.chunk(2, -1)),
    "tensor_split(4, -1)": lambda y: (lambda a, b, c, d: a * b + c * d)(*y.tensor_split(4, -1)),
    "chunk(3, -1) of 8": lambda y: _weigh3(*y.chunk(3, -1)),
    "tensor_split(3, -1) of 8": lambda y: _weigh3(*y.tensor_split(3, -1)),
    "split([3, 3, 2], -1)": lambda y: _weigh3(*y.split([3, 3, 2], -1)),
}
UNEVEN = ("chunk(3, -1) of 8", "tensor_split(3, -1) of 8")


class Splitter(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, 12)
        return SPLITS[self.kind](self.lin(x))


def seq_inputs(t: int, seed: int, width: int = 12) -> dict:
    return {"x": torch.randn(1, t, width, generator=torch.Generator().manual_seed(seed))}


def reproduce_splits(work: Path, threads: int = 2) -> list[Finding]:
    """Each SPLITS variant: its Slice line, the piece widths ncnn makes, and ncnn vs torch at both lengths."""
    pnnx_v = versions()["pnnx"]
    torch.manual_seed(4)
    mods = {k: Splitter(k).eval() for k in SPLITS}
    info = {k: export_module(m, f"split_{i}", seq_inputs(7, 0), seq_inputs(11, 1), work)
            for i, (k, m) in enumerate(mods.items())}
    lines, leftovers, has_list, widths, outputs = {}, {}, {}, {}, {}
    for k, inf in info.items():
        param, binf = graph(work, inf)
        p = read_param(param)
        slice_layer = next(layer for layer in p.layers if layer.type == "Slice")
        lines[k] = param_lines(param, "Slice")
        leftovers[k] = len(p.leftovers)
        has_list[k] = any(q.startswith("-23300=") for q in slice_layer.params)
        ex = make_net(param, binf, threads).create_extractor()
        ex.input("in0", to_mat(seq_inputs(7, 5)["x"].numpy(), inf["input_batch_axes"][0]))
        widths[k] = [ex.extract(b)[1].w for b in slice_layer.outputs]
        for t in LENGTHS:
            ins = seq_inputs(t, 100 + t)
            outputs[k, t] = run_ncnn(work, inf, ins, threads), torch_out(mods[k], ins)
    rel = {kt: rel_err(*o) for kt, o in outputs.items()}
    data = {"lines": lines, "leftovers": leftovers, "has_list": has_list, "widths": widths, "outputs": outputs}
    even_worst = max(rel[k, t] for k in SPLITS if k not in UNEVEN and k != "split([3, 3, 2], -1)" for t in LENGTHS)
    even = Finding("split_even", "unbind / chunk / tensor_split (even pieces)", pnnx_v, even_worst > 1e-5,
                   f"wrong values (rel {even_worst:.1e})" if even_worst > 1e-5 else
                   f"fixed: a Slice with its pieces listed; rel error <= {even_worst:.0e}", "none needed", data)
    uneven = Finding("split_uneven", "uneven chunk(3) / tensor_split(3) of 8", pnnx_v,
                     all(rel[k, t] > 0.1 for k in UNEVEN for t in LENGTHS),
                     f"pieces {widths[UNEVEN[0]]} instead of [3, 3, 2]; no error", "explicit sizes: split([3, 3, 2])",
                     data)
    return [even, uneven]


# ---------------------------------------------------------------- appendix A: one input shape
class HeadMix(nn.Module):
    """32 channels into 4 heads of 8 and back (view / transpose / reshape, as attention does)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, 32)
        h = F.silu(x.view(1, -1, 4, 8).transpose(1, 2))  # (1, 4, T, 8): heads first
        return self.lin(h.transpose(1, 2).reshape(1, -1, 32))


def reproduce_one_shape(work: Path, threads: int = 2) -> Finding:
    """HeadMix through `pnnx_cli` with `input=` only and with `input=` + `input2=`."""
    torch.manual_seed(5)
    head_mix = HeadMix().eval()
    one = pnnx_cli(head_mix, "one_shape", work / "one", seq_inputs(7, 0, 32), fp16=0)
    two = pnnx_cli(head_mix, "two_shapes", work / "two", seq_inputs(7, 0, 32), seq_inputs(11, 1, 32), fp16=0)
    frozen = {t: (run_isolated_graph(work, one, seq_inputs(t, 100 + t, 32), threads=threads),
                  torch_out(head_mix, seq_inputs(t, 100 + t, 32))) for t in LENGTHS}
    outputs = {t: (run_ncnn(work, two, seq_inputs(t, 200 + t, 32), threads),
                   torch_out(head_mix, seq_inputs(t, 200 + t, 32))) for t in (3, 7, 11)}
    shape11 = tuple(frozen[11][0].outputs["out0"].shape) if "out0" in frozen[11][0].outputs else None
    data = {"one": one, "two": two, "frozen": frozen, "outputs": outputs,
            "lines": {k: param_lines(r["param"], "Reshape", "Gemm") for k, r in (("one", one), ("two", two))},
            "reshape": param_of(first_layer(one["param"], "Reshape"), "11"),
            "gemm": {k: param_of(first_layer(r["param"], "Gemm"), "7") for k, r in (("one", one), ("two", two))}}
    return Finding("one_shape", "one input shape given to pnnx", versions()["pnnx"], shape11 != (1, 11, 32),
                   f"Reshape {data['reshape']}, Gemm {data['gemm']['one']}; T=11 returns shape {shape11}, no error",
                   "always input= and input2=", data)


# ---------------------------------------------------------------- appendices A and B: fp16
class Block(nn.Module):
    """A small decoder-like block: an MLP with a residual, then a convolution."""

    def __init__(self):
        super().__init__()
        self.up, self.down, self.conv = nn.Linear(64, 256), nn.Linear(256, 64), nn.Conv1d(64, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, 64)
        h = x + self.down(F.silu(self.up(x)))
        return h + self.conv(h.transpose(1, 2)).transpose(1, 2)


def reproduce_fp16_weights(work: Path, threads: int = 2) -> Finding:
    """Block converted with pnnx's default and with fp16=0; both run with ncnn's fp16/bf16 paths off."""
    import pnnx

    torch.manual_seed(8)
    block = Block().eval()
    ins = seq_inputs(7, 0, 64), seq_inputs(11, 1, 64)
    conv = {"pnnx default": pnnx_cli(block, "block_default", work / "fp16", *ins),
            "fp16=0": pnnx_cli(block, "block_fp32", work / "fp32", *ins, fp16=0)}
    sizes = {k: c["bin"].stat().st_size for k, c in conv.items()}
    outputs = {(k, t): (run_ncnn(work, c, seq_inputs(t, 100 + t, 64), threads),
                        torch_out(block, seq_inputs(t, 100 + t, 64))) for k, c in conv.items() for t in LENGTHS}
    rel = {k: max(rel_err(*outputs[k, t]) for t in LENGTHS) for k in conv}
    default = inspect.signature(pnnx.export).parameters["fp16"].default
    data = {"export_default": default, "sizes": sizes, "outputs": outputs,
            "commands": {k: c["command"] for k, c in conv.items()}}
    return Finding("fp16_weights", "pnnx writes fp16 weights by default", versions()["pnnx"],
                   rel["pnnx default"] > 1e-5,
                   f".bin {sizes['pnnx default'] / sizes['fp16=0']:.2f}x the size; rel error "
                   f"{rel['pnnx default']:.0e} vs {rel['fp16=0']:.0e}", "fp16=0 (pnnx) / fp16=False (pnnx.export)",
                   data)


def reproduce_pnnx(work: str | Path, threads: int = 2) -> list[Finding]:
    """Every pnnx pitfall of appendix A, converted into `work`. Appendix A."""
    work = Path(work)
    return [reproduce_gqa(work, threads), *reproduce_batch_sum(work, threads), reproduce_crop(work, threads),
            *reproduce_splits(work, threads), reproduce_one_shape(work, threads),
            reproduce_fp16_weights(work, threads)]


# ---------------------------------------------------------------- appendix B: the ncnn binding
RELU_PARAM = "7767517\n2 2\nInput in0 0 1 in0\nReLU relu0 1 1 in0 out0\n"
ACT_PARAM = "7767517\n3 3\nInput in0 0 1 in0\nReLU r0 1 1 in0 a\nSigmoid s0 1 1 a out0\n"
FP_OFF = dict(use_fp16_packed=False, use_fp16_storage=False, use_fp16_arithmetic=False, use_bf16_storage=False)


def write_graph(work: Path, name: str, text: str) -> tuple[Path, Path]:
    """A weightless graph written by hand."""
    param, binf = Path(work) / f"{name}.param", Path(work) / f"{name}.bin"
    param.write_text(text)
    binf.write_bytes(b"")
    return param, binf


def reproduce_borrowing(work: Path, runs: int = 5, repeats: int = 3) -> list[Finding]:
    """The borrowed Mat: its refcount, a clone of a temporary (`runs` children), an in-place first layer."""
    import ncnn

    ncnn_v = versions()["ncnn"]
    x = np.ones((3, 4), np.float32)
    borrowed = ncnn.Mat(x)
    mat = {"refcount": str(borrowed.refcount), "clone refcount": str(borrowed.clone().refcount),
           "same buffer": borrowed.numpy().ctypes.data == x.ctypes.data}
    del borrowed
    temp = [run_isolated(temporary_clone, seed) for seed in range(runs)]
    counts = [r.result for r in temp]
    wrong = sum(c["temporary_wrong"] for c in counts if c)
    total = sum(c["arrays"] for c in counts if c)
    relu = write_graph(work, "relu", RELU_PARAM)
    inplace = {how: [run_isolated(inplace_first_layer, *relu, how) for _ in range(repeats)]
               for how in ("borrowed", "to_mat")}
    data = {"mat": mat, "temp": temp, "counts": counts, "inplace": inplace}
    first = inplace["borrowed"][0]
    return [Finding("temporary", "ncnn.Mat(np.ascontiguousarray(x)).clone()", ncnn_v, wrong > 0,
                    f"{wrong}/{total} arrays had wrong values, no error",
                    "hold the array, then clone (runtime.net.to_mat)", data),
            Finding("inplace", "borrowed Mat into an in-place first layer", ncnn_v,
                    all(r.signal == "SIGSEGV" for r in inplace["borrowed"]),
                    f"killed by {first.signal} ({first.returncode}), even with the array held",
                    "feed a Mat that owns its data (to_mat clones)", data)]


def reproduce_extract(work: Path) -> Finding:
    res = run_isolated(extract_forms, *write_graph(work, "act", ACT_PARAM))
    seen = res.result or {}
    clones = bool(seen) and all(r["tuple: refcount"] == 1 and not r["tuple: same buffer twice"] for r in seen.values())
    return Finding("extract", "ret, m = ex.extract(name) clones", versions()["ncnn"], clones,
                   "tuple form: a new buffer every call (refcount 1); in-place form: the extractor's own blob "
                   "unless it came from ncnn's pool", "ex.extract(name, m) for KV caches (chapter 05)",
                   {"run": res, "seen": seen})


def reproduce_fp16_runtime(work: Path, threads: int = 2) -> Finding:
    """Block converted with fp16=0, run with the Option defaults, with fp16/bf16 off, with bf16 storage on."""
    import ncnn

    torch.manual_seed(8)
    block = Block().eval()
    info = export_module(block, "block", seq_inputs(7, 0, 64), seq_inputs(11, 1, 64), work)
    defaults = {k: getattr(ncnn.Net().opt, k) for k in
                ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_bf16_packed", "use_bf16_storage")}
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    settings = {"defaults": {}, "fp16/bf16 off": None, "bf16 storage on": {**FP_OFF, "use_bf16_storage": True}}
    outputs, refs = {}, {}
    for t in LENGTHS:
        ins = seq_inputs(t, 100 + t, 64)
        refs[t] = torch_out(block, ins)
        for k, opt in settings.items():
            outputs[k, t] = run_ncnn(work, info, ins, threads, opt)
    rel = {k: max(rel_err(outputs[k, t], refs[t]) for t in LENGTHS) for k in settings}
    diff = max(float(np.abs(outputs["defaults", t] - outputs["fp16/bf16 off", t]).max()) for t in LENGTHS)
    data = {"defaults": defaults, "cpu": {f: f in flags for f in ("f16c", "avx512_fp16", "avx512_bf16", "asimdhp")},
            "outputs": outputs, "refs": refs}
    return Finding("fp16_runtime", "ncnn's Option turns fp16 paths on", versions()["ncnn"], rel["defaults"] > 1e-5,
                   f"defaults on; on this CPU max |defaults - off| = {diff:.1e}; bf16 storage: rel "
                   f"{rel['bf16 storage on']:.0e}", "turn use_fp16_* and use_bf16_storage off before load_param "
                   "(make_net)", data)


def reproduce_ncnn(work: str | Path, threads: int = 2) -> list[Finding]:
    """Every ncnn-binding pitfall of appendix B, with its graphs in `work`. Appendix B."""
    work = Path(work)
    return [*reproduce_borrowing(work), reproduce_extract(work), reproduce_fp16_runtime(work, threads)]
