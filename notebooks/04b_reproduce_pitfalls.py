# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04b · Reproduce the pnnx and ncnn pitfalls
# > Every rewrite in chapter 02 is there because something broke. Here each break is shown happening, on the
# > pinned versions, next to the fix working.
#
# **You will:** build tiny torch modules, one per pitfall, convert each with pnnx, run it in ncnn, and watch it
# fail: a graph that does not load, a process killed by a signal, an output of the wrong length, wrong numbers.
# Then you will run the fixed form and check it against torch at two lengths.
#
# **You will learn:** what each failure looks like in the `.param` and at run time, so you recognise it in a large
# graph; which failures are loud (load errors, SIGFPE, SIGSEGV) and which are silent (wrong shape, wrong values);
# which older pitfalls no longer reproduce on pnnx 20261020, and one that still does.
#
# **You need:** nothing from earlier chapters: no checkpoint, only torch, pnnx and ncnn. Crashing demos run in a
# child Python so the notebook survives them.
# **Leaves behind:** `data/reports/<ckpt>/04b_reproduce_pitfalls.json`. The conversions go to a temporary
# folder that is deleted at the end.

# %%
import inspect
import json
import shutil
import tempfile
import time
from importlib import metadata
from pathlib import Path

import ncnn
import numpy as np
import pnnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from IPython.display import HTML, display

from qtts_lib import check, export, paths, settings
from qtts_lib.export import pitfalls
from qtts_lib.runtime.net import from_mat, make_net, to_mat

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("04b_reproduce_pitfalls", ckpt)
VERSIONS = {d: metadata.version(d) for d in ("pnnx", "ncnn", "torch")}
PNNX, NCNN = f"pnnx {VERSIONS['pnnx']}", f"ncnn {VERSIONS['ncnn']}"
WORK = Path(tempfile.mkdtemp(prefix="qtts_04b_"))
t_start = time.perf_counter()
print(" ".join(f"{d} {v}" for d, v in VERSIONS.items()), f"| {THREADS} threads | work dir {WORK}")

# %% [markdown]
# Three small tools for the whole chapter. `export.export_module` (chapter 04) converts a module the careful way:
# two input sets, `fp16=0`. `run_ncnn` runs a converted graph in this process, through `runtime.net`, for graphs
# that are known not to crash. `pitfalls.ncnn_isolated` does the same in a child process and reports how it ended.
# Every pitfall adds one row to `findings`, built from what was measured; the table at the end is made from it.

# %%
findings = []


def finding(pitfall: str, tool: str, reproduces: bool, symptom: str, fix: str) -> None:
    findings.append({"pitfall": pitfall, "version": tool, "reproduces": reproduces, "symptom": symptom, "fix": fix})


def run_ncnn(info: dict, *arrays: np.ndarray) -> np.ndarray:
    """Output 0 of `WORK/<info['name']>.param` for numpy inputs, with the batch axes pnnx chose."""
    net = make_net(WORK / f"{info['name']}.param", WORK / f"{info['name']}.bin", THREADS)
    ex = net.create_extractor()
    for i, (a, ax) in enumerate(zip(arrays, info["input_batch_axes"])):
        ex.input(f"in{i}", to_mat(a, ax))
    ret, m = ex.extract("out0")
    assert ret == 0, f"extract failed ({ret})"
    return from_mat(m, info["output_batch_axes"][0])


def isolated(info: dict, *arrays: np.ndarray, outputs: list[str] | None = None) -> pitfalls.Isolated:
    return pitfalls.ncnn_isolated(WORK / f"{info['name']}.param", WORK / f"{info['name']}.bin", list(arrays),
                                  info["input_batch_axes"], info["output_batch_axes"], outputs, THREADS)


def torch_out(module: nn.Module, inputs: dict) -> np.ndarray:
    with torch.no_grad():
        return module(*inputs.values()).numpy()


def first_layer(param: Path, layer_type: str) -> export.ParamLayer:
    return next(l for l in export.read_param(param).layers if l.type == layer_type)


def param_of(layer: export.ParamLayer, key: str) -> str:
    """The `key=value` entry of one layer's parameters ('' when absent)."""
    return next((q for q in layer.params if q.startswith(f"{key}=")), "")


def param_lines(info: dict, *types: str) -> str:
    """The .param lines of the given layer types, as pnnx wrote them."""
    text = (WORK / f"{info['name']}.param").read_text().splitlines()
    return "\n".join(l for l in text if l.split(" ", 1)[0] in types)


# %% [markdown]
# ## 1. Reproduce the GQA failure: HF `repeat_kv` does not load
# Grouped-query attention has fewer key/value heads than query heads. Hugging Face widens k and v with
# `repeat_kv`: `h[:, :, None].expand(...).reshape(...)`. With a dynamic sequence length pnnx cannot fold the expand
# into anything ncnn has. A toy attention block: 4 query heads, 2 kv heads of width 8, a causal mask as input.

# %%
def hf_repeat_kv(h: torch.Tensor, n: int = 2) -> torch.Tensor:
    """transformers' repeat_kv: (b, kv, s, d) -> (b, kv*n, s, d) by expand + reshape."""
    b, kv, s, d = h.shape
    return h[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)


REPEATS = {
    "hf repeat_kv (expand+reshape)": hf_repeat_kv,
    "repeat_interleave(2, dim=-3)": lambda h: h.repeat_interleave(2, dim=-3),
    "repeat_interleave(2, dim=1)": lambda h: h.repeat_interleave(2, dim=1),
    "sdpa(enable_gqa=True)": None,
}


class Attention(nn.Module):
    def __init__(self, repeat: str):
        super().__init__()
        self.repeat = repeat
        self.q, self.k, self.v, self.o = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # x (1, T, 32), mask (T, T)
        t = x.shape[1]
        q = self.q(x).view(1, t, 4, 8).transpose(1, 2)
        k = self.k(x).view(1, t, 2, 8).transpose(1, 2)
        v = self.v(x).view(1, t, 2, 8).transpose(1, 2)
        if REPEATS[self.repeat] is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, REPEATS[self.repeat](k), REPEATS[self.repeat](v), attn_mask=mask)
        return self.o(o.transpose(1, 2).reshape(1, t, 32))


def attn_inputs(t: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(1, t, 32, generator=g), "mask": torch.full((t, t), float("-inf")).triu(1)}


# %% [markdown]
# All four variants share one set of weights and are converted at lengths 7 and 11. The HF one keeps its expand:

# %%
LENGTHS = (7, 11)  # every export below sees both, except where a single length is the point
torch.manual_seed(1)
attn = {r: Attention(r).eval() for r in REPEATS}
for r in list(REPEATS)[1:]:
    attn[r].load_state_dict(attn["hf repeat_kv (expand+reshape)"].state_dict())
attn_info = {r: export.export_module(m, f"attn_{i}", attn_inputs(7, 0), attn_inputs(11, 1), WORK)
             for i, (r, m) in enumerate(attn.items())}
hf = attn_info["hf repeat_kv (expand+reshape)"]
print(param_lines(hf, "pnnx.Expression", "Tensor.expand", "ExpandDims", "SDPA"))
check.at_least("1 HF repeat_kv: leftover pnnx ops in the .param", "count",
               len(export.read_param(WORK / "attn_0.param").leftovers), 1)

# %% [markdown]
# ncnn has no `pnnx.Expression` or `Tensor.expand` layer. Loading the graph with the plain ncnn API, in a child
# process in case it crashes:

# %%
LOAD = """
import sys, ncnn
net = ncnn.Net()
print("load_param", net.load_param(sys.argv[1]), "load_model", net.load_model(sys.argv[2]))
"""
load_hf = pitfalls.run_isolated(LOAD, str(WORK / "attn_0.param"), str(WORK / "attn_0.bin"))
print(load_hf.status, "|", load_hf.stdout.strip(), "| ncnn says:", load_hf.stderr.strip().replace("\n", " / "))
load_param_ret = int(load_hf.stdout.split()[1])
check.equal("1 HF repeat_kv: child process exits normally", "returncode", load_hf.returncode, 0)
check.equal("1 HF repeat_kv: ncnn load_param return value", "ret", load_param_ret, -1)

# %% [markdown]
# The fix in the wrappers: `k.repeat_interleave(n, dim=-3)`. pnnx recognises it next to the SDPA and folds it in:
# one `SDPA` layer, nothing left over, and the same numbers as torch at both lengths. `dim=-3` matters:
# `dim=1` names the same axis, yet is not matched and stays a `torch.repeat_interleave` layer.
# `enable_gqa=True` on torch's SDPA folds as well.

# %%
rows = []
for r, info in attn_info.items():
    p = export.read_param(WORK / f"{info['name']}.param")
    rows.append(f"<tr><td><code>{r}</code></td><td>{', '.join(sorted({l.type for l in p.leftovers})) or '—'}</td>"
                f"<td>{p.counts['SDPA']}</td></tr>")
display(HTML("<table><tr><th>k/v widening</th><th>leftover ops</th><th>SDPA layers</th></tr>" + "".join(rows) + "</table>"))
check.at_least("1 repeat_interleave(dim=1): leftover ops", "count", len(export.read_param(WORK / "attn_2.param").leftovers), 1)
for r in ("repeat_interleave(2, dim=-3)", "sdpa(enable_gqa=True)"):
    p = export.read_param(WORK / f"{attn_info[r]['name']}.param")
    check.equal(f"1 {r}: leftover ops", "count", len(p.leftovers), 0)
    check.equal(f"1 {r}: SDPA layers", "count", p.counts["SDPA"], 1)
    for t in LENGTHS:
        ins = attn_inputs(t, 100 + t)
        check.close(f"1 {r}: ncnn vs torch @ T={t}", run_ncnn(attn_info[r], *[v.numpy() for v in ins.values()]),
                    torch_out(attn[r], ins), rel=1e-5)
finding("GQA via HF repeat_kv", PNNX, load_param_ret != 0,
        f"`{', '.join(sorted({l.type for l in export.read_param(WORK / 'attn_0.param').leftovers}))}` left in the "
        f".param; load_param returns {load_param_ret}", "`repeat_interleave(n, dim=-3)` (or `enable_gqa=True`)")

# %% [markdown]
# ## 2. Reproduce `stack(...).sum(0)` over pnnx's batch axis
# pnnx decides for every blob whether its axis 0 is a *batch* axis; ncnn blobs have no batch axis, so that axis
# is dropped. An embedding of ids shaped `(1, T)` gets one. Summing `G` lookups with `torch.stack(parts).sum(0)`
# then stacks along the axis that ncnn does not have:

# %%
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


# %% [markdown]
# Converted with two lengths, the graph keeps the stack and the sum as two layers:

# %%
torch.manual_seed(2)
stack_sum = StackSum().eval()
ss = export.export_module(stack_sum, "stack_sum", ids_inputs(7, 0), ids_inputs(11, 1), WORK)
print("batch axis of input/output:", ss["input_batch_axes"], ss["output_batch_axes"])
print(param_lines(ss, "Concat", "Reduction"))
concat = first_layer(WORK / "stack_sum.param", "Concat")
check.equal("2 stack.sum: Concat axis in the .param", "param", param_of(concat, "0"), "0=-233")
check.equal("2 stack.sum: Reduction axes in the .param", "param",
            param_of(first_layer(WORK / "stack_sum.param", "Reduction"), "-23303"), "-23303=0")

# %% [markdown]
# `Concat ... 0=-233` concatenates along "the batch axis" (233 is pnnx's marker for it) and `-23303=0` is an
# empty list of axes to reduce. Running it, in a child process:

# %%
crash = {t: isolated(ss, ids_inputs(t, 100 + t)["ids"].numpy()) for t in LENGTHS}
for t, res in crash.items():
    print(f"T={t}: {res.status}")
    check.equal(f"2 stack.sum: signal that kills ncnn @ T={t}", "signal", res.signal, "SIGFPE")

# %% [markdown]
# Where it dies: extracting only the Concat's output does not crash; it returns success and an **empty** blob.
# So it is the Reduction, handed that empty blob, that raises SIGFPE.

# %%
res = isolated(ss, ids_inputs(7, 107)["ids"].numpy(), outputs=[concat.outputs[0]])
print(res.status, "| extract:", res.stdout.strip())
check.equal("2 stack.sum: extracting the Concat blob alone", "returncode", res.returncode, 0)
check.equal("2 stack.sum: Concat blob is empty", "empty blobs", len(res.outputs), 0)

# %% [markdown]
# ### The fix, and the trap inside it
# The codec decoder avoids per-group lookups altogether: groups 1.. share one fused table, the host adds
# `g·V` to each group's ids and flattens them group-major to shape `((G-1)·T,)`, and the sum over groups is a
# matrix product with a row of ones. Group 0 keeps its own table, fed with the `(1, T)` ids, as the codec's semantic
# codebook is. The reshape before the product must keep a leading 1: `reshape(1, G-1, -1)`. With `reshape(G-1, -1)`
# pnnx takes the `G-1` for a batch axis (the Reshape line gets `12=233 13=0`: input without, output with a batch
# axis) and the sum comes out wrong, without any error. (In the codec it looked as if the group sum had vanished;
# in this small case the output is not group 0 alone either: it is simply wrong.)

# %%
class FusedSum(nn.Module):
    """The same sum in the codec decoder's form (modules/codec.py)."""

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


fused = {lead: FusedSum(stack_sum, lead).eval() for lead in (False, True)}
fused_info = {lead: export.export_module(m, f"fused_sum_{int(lead)}", fused_inputs(7, 0), fused_inputs(11, 1), WORK)
              for lead, m in fused.items()}
batch_marks = {}
for lead, info in fused_info.items():
    print(f"reshape({'1, ' if lead else ''}G-1, -1):", param_lines(info, "Reshape").splitlines()[0])
    first_reshape = first_layer(WORK / f"{info['name']}.param", "Reshape")
    batch_marks[lead] = " ".join(q for q in (param_of(first_reshape, "12"), param_of(first_reshape, "13")) if q)
    check.equal(f"2 reshape({'1, ' if lead else ''}{G - 1}, -1): batch marks on the Reshape", "params",
                batch_marks[lead], "" if lead else "12=233 13=0")

# %%
fused_rel = {}
for lead, info in fused_info.items():
    label = f"reshape({'1, ' if lead else ''}{G - 1}, -1)"
    for t in LENGTHS:
        ins = fused_inputs(t, 100 + t)
        res = isolated(info, *[v.numpy() for v in ins.values()])
        check.equal(f"2 {label}: child exit @ T={t}", "returncode", res.returncode, 0)
        ref = torch_out(stack_sum, {"ids": ins["first"]})  # the original StackSum in torch
        fused_rel[lead, t] = check.rel_err(res.outputs["out0"], ref)
        vs_group0 = check.rel_err(res.outputs["out0"], torch_out(stack_sum.tables[0], {"ids": ins["first"]}))
        print(f"{label} @ T={t}: rel error vs torch {fused_rel[lead, t]:.2e}; vs group 0 alone {vs_group0:.2f}")
        if lead:
            check.at_most(f"2 {label}: ncnn vs torch StackSum @ T={t}", "rel", fused_rel[lead, t], 1e-6)
        else:
            check.at_least(f"2 {label}: silently wrong @ T={t}", "rel", fused_rel[lead, t], 0.1)
            check.at_least(f"2 {label}: not group 0 alone either @ T={t}", "rel", vs_group0, 0.1)
finding("`stack(parts).sum(0)` over pnnx's batch axis", PNNX, all(r.signal == "SIGFPE" for r in crash.values()),
        f"`Concat {param_of(concat, '0')}` + `Reduction -23303=0`; process killed by {crash[7].signal}",
        "one fused table, `ones(1, n) @ x.reshape(1, n, -1)`")
finding("`reshape(n, -1)` before the ones-matmul", PNNX, min(fused_rel[False, t] for t in LENGTHS) > 0.1,
        f"Reshape marked `{batch_marks[False]}`; no error, rel error {fused_rel[False, 7]:.2f}", "`reshape(1, n, -1)`")

# %% [markdown]
# ## 3. Reproduce the dropped crop `x[..., :-r]`
# The codec's transposed convolutions produce `r` samples too many and trim them. With a dynamic length, pnnx
# drops `y[..., :-r]` without a word: no Crop in the `.param`, and ncnn returns the untrimmed length.

# %%
TRIMS = {
    "y[..., :-2]": lambda y: y[..., :-2],
    "F.pad(y, (0, -2))": lambda y: F.pad(y, (0, -2)),
    "y[..., :y.shape[-1] - 2]": lambda y: y[..., : y.shape[-1] - 2],
}


class Upsample(nn.Module):
    def __init__(self, trim: str):
        super().__init__()
        self.trim = trim
        self.conv = nn.ConvTranspose1d(4, 4, kernel_size=4, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, 4, T) -> (1, 4, 2T)
        return TRIMS[self.trim](self.conv(x))  # the conv gives 2T + 2


def wave_inputs(t: int, seed: int) -> dict:
    return {"x": torch.randn(1, 4, t, generator=torch.Generator().manual_seed(seed))}


# %% [markdown]
# The three trims, converted with two lengths; which of them got a `Crop`:

# %%
torch.manual_seed(3)
ups = {k: Upsample(k).eval() for k in TRIMS}
for k in list(TRIMS)[1:]:
    ups[k].load_state_dict(ups["y[..., :-2]"].state_dict())
up_info = {k: export.export_module(m, f"trim_{i}", wave_inputs(7, 0), wave_inputs(11, 1), WORK)
           for i, (k, m) in enumerate(ups.items())}
for k, info in up_info.items():
    print(f"{k:26s}", param_lines(info, "Crop") or "(no Crop layer)")

# %%
trim_shapes = {}
for k, info in up_info.items():
    crops = export.read_param(WORK / f"{info['name']}.param").counts["Crop"]
    check.equal(f"3 {k}: Crop layers", "count", crops, 0 if k == "y[..., :-2]" else 1)
    for t in LENGTHS:
        ins = wave_inputs(t, 100 + t)
        ours, ref = run_ncnn(info, ins["x"].numpy()), torch_out(ups[k], ins)
        trim_shapes[k, t] = ours.shape
        check.equal(f"3 {k}: ncnn output length @ T={t}", "samples", ours.shape[-1],
                    2 * t + 2 if k == "y[..., :-2]" else 2 * t)
        # the dropped crop loses nothing else: the first 2T samples are right
        check.close(f"3 {k}: first 2T samples vs torch @ T={t}", ours[..., : 2 * t], ref, max_abs=1e-5)
finding("`x[..., :-r]` with a dynamic length", PNNX, trim_shapes["y[..., :-2]", 7][-1] != 14,
        f"no Crop written; T=7 gives {trim_shapes['y[..., :-2]', 7][-1]} samples instead of 14, no error",
        "`F.pad(x, (0, -r))` (a Crop); `x[..., :x.shape[-1] - r]` also works")

# %% [markdown]
# ## 4. Check `unbind` / `chunk` / `tensor_split`: fixed, with one exception
# Older pnnx wrote these as a `Slice` without parameters. On this version they become a `Slice` whose
# `-23300=` list gives the pieces (`-233` = "an equal share of what is left"), and even splits are right.
# An **uneven** split is not: for 8 into 3, `chunk` and `tensor_split` give 3, 3, 2 in torch, while ncnn's equal
# shares come out 2, 3, 3. Explicit sizes (`split([3, 3, 2])`) are written into the Slice and are right.

# %%
SPLITS = {
    "unbind(-1)": lambda y: (lambda p: p[0] * p[1] + p[2] - p[3])(y.unbind(-1)),
    "chunk(2, -1)": lambda y: (lambda a, b: a * torch.sigmoid(b))(*y.chunk(2, -1)),
    "tensor_split(4, -1)": lambda y: (lambda a, b, c, d: a * b + c * d)(*y.tensor_split(4, -1)),
    "chunk(3, -1) of 8": lambda y: (lambda a, b, c: a.sum(-1) + 10 * b.sum(-1) + 100 * c.sum(-1))(*y.chunk(3, -1)),
    "tensor_split(3, -1) of 8": lambda y: (lambda a, b, c: a.sum(-1) + 10 * b.sum(-1) + 100 * c.sum(-1))(*y.tensor_split(3, -1)),
    "split([3, 3, 2], -1)": lambda y: (lambda a, b, c: a.sum(-1) + 10 * b.sum(-1) + 100 * c.sum(-1))(*y.split([3, 3, 2], -1)),
}


class Splitter(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, 12)
        return SPLITS[self.kind](self.lin(x))


def seq_inputs(t: int, seed: int, width: int = 12) -> dict:
    return {"x": torch.randn(1, t, width, generator=torch.Generator().manual_seed(seed))}


# %% [markdown]
# Each converted with two lengths; the `Slice` line pnnx wrote for each:

# %%
torch.manual_seed(4)
splitters = {k: Splitter(k).eval() for k in SPLITS}
split_info = {k: export.export_module(m, f"split_{i}", seq_inputs(7, 0), seq_inputs(11, 1), WORK)
              for i, (k, m) in enumerate(splitters.items())}
for k, info in split_info.items():
    print(f"{k:22s}", param_lines(info, "Slice"))

# %%
split_rel, widths = {}, {}
for k, info in split_info.items():
    p = export.read_param(WORK / f"{info['name']}.param")
    slice_layer = next(l for l in p.layers if l.type == "Slice")
    check.equal(f"4 {k}: leftover ops", "count", len(p.leftovers), 0)
    check.equal(f"4 {k}: Slice has its -23300 list", "has", any(q.startswith("-23300=") for q in slice_layer.params), True)
    # the width of each piece in ncnn: extract the Slice outputs
    net = make_net(WORK / f"{info['name']}.param", WORK / f"{info['name']}.bin", THREADS)
    ex = net.create_extractor()
    ex.input("in0", to_mat(seq_inputs(7, 5)["x"].numpy(), info["input_batch_axes"][0]))
    widths[k] = [ex.extract(b)[1].w for b in slice_layer.outputs]
    for t in LENGTHS:
        ins = seq_inputs(t, 100 + t)
        split_rel[k, t] = check.rel_err(run_ncnn(info, ins["x"].numpy()), torch_out(splitters[k], ins))
print({k: w for k, w in widths.items()})
UNEVEN = ("chunk(3, -1) of 8", "tensor_split(3, -1) of 8")
for k in SPLITS:
    if k in UNEVEN:
        check.equal(f"4 {k}: piece widths in ncnn (torch: [3, 3, 2])", "widths", str(widths[k]), "[2, 3, 3]")
        for t in LENGTHS:
            check.at_least(f"4 {k}: silently wrong @ T={t}", "rel", split_rel[k, t], 0.1)
    else:
        for t in LENGTHS:
            check.at_most(f"4 {k}: ncnn vs torch @ T={t}", "rel", split_rel[k, t], 1e-5)
even = ["unbind(-1)", "chunk(2, -1)", "tensor_split(4, -1)"]
even_worst = max(split_rel[k, t] for k in even for t in LENGTHS)
finding("unbind / chunk / tensor_split (even pieces)", PNNX, even_worst > 1e-5,
        f"wrong values (rel {even_worst:.1e})" if even_worst > 1e-5 else
        f"no longer reproduces on {PNNX}: a Slice with its pieces listed; rel error ≤ {even_worst:.0e}", "none needed")
finding("uneven `chunk(3)` / `tensor_split(3)` of 8", PNNX, all(split_rel[k, 7] > 0.1 for k in UNEVEN),
        f"pieces {widths['chunk(3, -1) of 8']} instead of [3, 3, 2]; no error", "explicit sizes: `split([3, 3, 2])`")

# %% [markdown]
# ## 5. Reproduce a frozen length: one input shape
# pnnx learns which dimensions vary by seeing two input shapes. Given one, it writes the traced sizes as
# constants wherever a shape is computed. A block that splits 32 channels into 4 heads of 8 and back
# (`view` / `transpose` / `reshape`, as attention does):

# %%
class HeadMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, 32)
        h = F.silu(x.view(1, -1, 4, 8).transpose(1, 2))  # (1, 4, T, 8): heads first
        return self.lin(h.transpose(1, 2).reshape(1, -1, 32))


# %% [markdown]
# Converted twice with `pitfalls.pnnx_cli`, which runs pnnx with exactly the arguments given: once with `input=`
# only, once with `input=` and `input2=`:

# %%
torch.manual_seed(5)
head_mix = HeadMix().eval()
one = pitfalls.pnnx_cli(head_mix, "one_shape", WORK / "one", seq_inputs(7, 0, 32), fp16=0)
two = pitfalls.pnnx_cli(head_mix, "two_shapes", WORK / "two", seq_inputs(7, 0, 32), seq_inputs(11, 1, 32), fp16=0)
for name, r in (("one shape", one), ("two shapes", two)):
    print(f"--- {name}: pnnx {r['command']} -> exit {r['returncode']}")
    print("\n".join(l for l in r["param"].read_text().splitlines() if l.startswith(("Reshape  ", "Gemm"))))
check.equal("5 one shape: pnnx exit status", "returncode", one["returncode"], 0)
check.equal("5 one shape: first Reshape has the traced length as a constant", "param",
            param_of(first_layer(one["param"], "Reshape"), "11"), "11=7")
check.equal("5 one shape: Gemm has a constant row count", "param", param_of(first_layer(one["param"], "Gemm"), "7"), "7=7")
check.equal("5 two shapes: Gemm rows follow the input", "param", param_of(first_layer(two["param"], "Gemm"), "7"), "7=0")

# %% [markdown]
# With one shape the first Reshape carries `11=7` (depth 7: the traced length), the second `1=7`, and the Gemm
# `7=7` (a constant row count); with two shapes they use expressions of the input's size (`0h`, `0d`) and `7=0`.
# At another length the frozen graph does not complain. It returns 7 rows, the first 7 of the right answer:

# %%
frozen = {}
for t in (7, 11):
    ins = seq_inputs(t, 100 + t, 32)
    res = pitfalls.ncnn_isolated(one["param"], one["bin"], [ins["x"].numpy()], one["input_batch_axes"], one["output_batch_axes"])
    ours, ref = res.outputs["out0"], torch_out(head_mix, ins)
    frozen[t] = ours.shape
    print(f"T={t}: {res.status}, extract {res.stdout.strip()}, ncnn shape {ours.shape}, torch shape {ref.shape}")
    check.equal(f"5 one shape: ncnn output shape @ T={t}", "shape", str(ours.shape), "(1, 7, 32)")
    check.close(f"5 one shape: first 7 rows vs torch @ T={t}", ours[:, :7], ref[:, :7], max_abs=1e-5)

# %%
shutil.copy(two["param"], WORK / "two_shapes.param")
shutil.copy(two["bin"], WORK / "two_shapes.bin")
info = {"name": "two_shapes", "input_batch_axes": two["input_batch_axes"], "output_batch_axes": two["output_batch_axes"]}
for t in (3, 7, 11):
    ins = seq_inputs(t, 200 + t, 32)
    check.close(f"5 two shapes: ncnn vs torch @ T={t}", run_ncnn(info, ins["x"].numpy()), torch_out(head_mix, ins), rel=1e-5)
finding("one input shape given to pnnx", PNNX, frozen[11] != (1, 11, 32),
        f"Reshape `11=7`, Gemm `7=7`; T=11 returns shape {frozen[11]}, no error", "always `input=` and `input2=`")

# %% [markdown]
# ## 6. Reproduce `ncnn.Mat` borrowing numpy memory
# `ncnn.Mat(array)` wraps the array's buffer: no copy and no reference count (its `refcount` is `None`). Two
# consequences. First, `ncnn.Mat(np.ascontiguousarray(x)).clone()` with a **non-contiguous** `x`:
# `ascontiguousarray` makes a temporary copy, the temporary is freed as soon as the Mat is built, and `clone()`
# copies freed memory. Each child process below converts 20 transposed `(64, 300)` arrays both ways.

# %%
x_demo = np.ones((3, 4), np.float32)
borrowed = ncnn.Mat(x_demo)
print("refcount of ncnn.Mat(array):", borrowed.refcount, "| of its clone:", borrowed.clone().refcount,
      "| same buffer:", borrowed.numpy().ctypes.data == x_demo.ctypes.data)
check.equal("6 ncnn.Mat(array).refcount", "refcount", str(borrowed.refcount), "None")
del borrowed

# %%
TEMPORARY = """
import json, numpy as np, ncnn
from qtts_lib.runtime.net import to_mat
rng = np.random.default_rng(int(__import__("sys").argv[1]))
bad = good = bad_values = 0
for _ in range(20):
    x = rng.standard_normal((64, 300)).astype(np.float32).T        # a non-contiguous view
    a = np.array(ncnn.Mat(np.ascontiguousarray(x)).clone().numpy())  # the temporary dies before clone()
    b = np.array(to_mat(x).numpy())                                  # holds the array until the clone owns it
    bad += not np.array_equal(a, x); bad_values += int(np.sum(a != x)); good += not np.array_equal(b, x)
print(json.dumps({"temporary_wrong": bad, "wrong_values": bad_values, "to_mat_wrong": good, "arrays": 20}))
"""
runs = [pitfalls.run_isolated(TEMPORARY, str(seed)) for seed in range(5)]
counts = [json.loads(r.stdout) if r.returncode == 0 else None for r in runs]
for r, c in zip(runs, counts):
    print(r.status, c)
temp_wrong = sum(c["temporary_wrong"] for c in counts if c)
temp_total = sum(c["arrays"] for c in counts if c)
check.equal("6 runs that crashed", "count", sum(c is None for c in counts), 0)
check.equal("6 to_mat (hold, then clone): wrong arrays", "count", sum(c["to_mat_wrong"] for c in counts), 0)
# observed, not asserted: it depends on the allocator reusing the freed block
check.at_least("6 Mat(ascontiguousarray(x)).clone(): wrong arrays (observed)", "count", temp_wrong, 0)

# %% [markdown]
# Only a few values per array are wrong, with no error anywhere: easy to miss in an average error. How many, here:

# %%
print(f"wrong in {temp_wrong}/{temp_total} arrays, {sum(c['wrong_values'] for c in counts)} wrong values "
      f"out of {temp_total * 64 * 300}")

# %% [markdown]
# Second, an **in-place first layer**. In light mode (the default) ncnn checks whether an input blob is shared
# before a layer overwrites it, by reading `*refcount`; a borrowed Mat has no refcount to read. A two-layer graph
# written by hand (`Input` then `ReLU`, which works in place), the array alive and held the whole time:

# %%
(WORK / "relu.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu0 1 1 in0 out0\n")
(WORK / "relu.bin").write_bytes(b"")
INPLACE = """
import sys, numpy as np, ncnn
from qtts_lib.runtime.net import to_mat
net = ncnn.Net()
net.load_param(sys.argv[1]); net.load_model(sys.argv[2])
x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)   # held until the end
ex = net.create_extractor()
ex.input("in0", ncnn.Mat(x) if sys.argv[3] == "borrowed" else to_mat(x))
ret, out = ex.extract("out0")
print(ret, float(np.abs(np.array(out.numpy()) - np.maximum(x, 0)).max()))
"""
inplace = {how: [pitfalls.run_isolated(INPLACE, str(WORK / "relu.param"), str(WORK / "relu.bin"), how) for _ in range(3)]
           for how in ("borrowed", "to_mat")}
for how, rs in inplace.items():
    print(f"{how:9s}", [r.status for r in rs], rs[0].stdout.strip())
check.equal("6 in-place first layer, borrowed Mat: runs killed by SIGSEGV", "count",
            sum(r.signal == "SIGSEGV" for r in inplace["borrowed"]), 3)
check.equal("6 in-place first layer, to_mat: runs that exit normally", "count",
            sum(r.returncode == 0 for r in inplace["to_mat"]), 3)
check.at_most("6 in-place first layer, to_mat: max |ncnn - relu(x)|", "max_abs",
              float(inplace["to_mat"][0].stdout.split()[1]), 0.0)
finding("`ncnn.Mat(np.ascontiguousarray(x)).clone()`", NCNN, temp_wrong > 0,
        f"{temp_wrong}/{temp_total} arrays had wrong values, no error", "hold the array, then clone (`runtime.net.to_mat`)")
finding("borrowed Mat into an in-place first layer", NCNN, all(r.signal == "SIGSEGV" for r in inplace["borrowed"]),
        f"killed by {inplace['borrowed'][0].signal} ({inplace['borrowed'][0].returncode}), even with the array held",
        "feed a Mat that owns its data (`to_mat` clones)")

# %% [markdown]
# ## 7. Compare the two forms of `extract`
# The binding offers `ret, m = ex.extract(name)`, which returns `m.clone()`, and `ex.extract(name, m)`, which fills
# `m` with what ncnn's `Extractor::extract` hands out. Whether that is a copy depends on where the blob's memory
# came from: ncnn detaches (clones) blobs that live in its own local pool, and hands out anything else as it is.
# Observed on a weightless `Input → ReLU → Sigmoid` graph (both layers work in place), in a child process, three
# ways: the caller keeps its input Mat (so ncnn copies it into its pool before overwriting it); the caller hands the
# input Mat over (so the layers overwrite the input's own buffer); the caller keeps it and sets its own blob allocator.

# %%
(WORK / "act.param").write_text("7767517\n3 3\nInput in0 0 1 in0\nReLU r0 1 1 in0 a\nSigmoid s0 1 1 a out0\n")
(WORK / "act.bin").write_bytes(b"")
EXTRACT = """
import json, sys, numpy as np, ncnn
from qtts_lib.runtime.net import to_mat
net = ncnn.Net()
net.load_param(sys.argv[1]); net.load_model(sys.argv[2])
x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
ptr = lambda m: m.numpy().ctypes.data
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
    ex.extract("out0", m1); ex.extract("out0", m2)          # in-place form, twice
    seen[setting] = {"tuple: refcount": t1.refcount, "tuple: same buffer twice": ptr(t1) == ptr(t2),
                     "in-place: refcount": m1.refcount, "in-place: same buffer twice": ptr(m1) == ptr(m2),
                     "in-place: is the input's buffer": ptr(m1) == p_in,
                     "cstep (tuple, in-place)": [t1.cstep, m1.cstep],
                     "values equal": bool(np.array_equal(t1.numpy(), m1.numpy()))}
    del t1, t2, m1, m2, ex
    inp = None
del pool
print(json.dumps(seen))
"""
res = pitfalls.run_isolated(EXTRACT, str(WORK / "act.param"), str(WORK / "act.bin"))
seen = json.loads(res.stdout)
display(HTML("<table><tr><th></th>" + "".join(f"<th>{k}</th>" for k in seen["input kept"]) + "</tr>" + "".join(
    f"<tr><td>{s}</td>" + "".join(f"<td>{v}</td>" for v in row.values()) + "</tr>" for s, row in seen.items()) + "</table>"))

# %%
check.equal("7 child exit", "returncode", res.returncode, 0)
for s, row in seen.items():
    check.equal(f"7 {s}: tuple form is a private copy", "refcount", row["tuple: refcount"], 1)
    check.equal(f"7 {s}: tuple form, new buffer per call", "same buffer", row["tuple: same buffer twice"], False)
    check.equal(f"7 {s}: both forms give the same values", "equal", row["values equal"], True)
    cstep_tuple, cstep_inplace = row["cstep (tuple, in-place)"]
    check.equal(f"7 {s}: cstep, tuple form minus in-place form", "elements", cstep_tuple - cstep_inplace, 0)
    shared = s != "input kept"
    check.equal(f"7 {s}: in-place form returns the extractor's blob", "same buffer", row["in-place: same buffer twice"], shared)
check.equal("7 input handed over: in-place form is the input's own buffer", "same buffer",
            seen["input handed over"]["in-place: is the input's buffer"], True)

# %% [markdown]
# `cstep` (the distance between channels) is the same in both forms here, because these blobs have the natural
# layout and `clone()` re-creates exactly that. The case where it is not: ncnn's x86 SDPA keeps the KV cache in a
# buffer with spare capacity recorded in `cstep`; a clone keeps the values but loses the capacity, and the next
# decode step reads NaN. That needs a graph with a KV cache, which chapter 05 builds; there the caches are extracted
# with `ex.extract(name, m)` and fed back untouched.

# %%
finding("`ret, m = ex.extract(name)` clones", NCNN,
        all(r["tuple: refcount"] == 1 and not r["tuple: same buffer twice"] for r in seen.values()),
        "tuple form: a new buffer every call (refcount 1); in-place form: the extractor's own blob unless it came from ncnn's pool",
        "`ex.extract(name, m)` for KV caches (chapter 05)")

# %% [markdown]
# ## 8. Measure the fp16 defaults
# Two separate defaults. pnnx writes **fp16 weights** unless told `fp16=0` (the CLI and the Python helper alike);
# ncnn's `Option` turns the **fp16 paths on** (`use_fp16_packed/storage/arithmetic`) wherever the CPU has them.
# A small decoder-like block: an MLP with a residual, then a convolution.

# %%
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.conv = nn.Linear(64, 256), nn.Linear(256, 64), nn.Conv1d(64, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, 64)
        h = x + self.down(F.silu(self.up(x)))
        return h + self.conv(h.transpose(1, 2)).transpose(1, 2)


# %% [markdown]
# Converted twice, with pnnx's default and with `fp16=0`; the default is the same in the Python helper:

# %%
torch.manual_seed(8)
block = Block().eval()
print("pnnx.export(..., fp16=", inspect.signature(pnnx.export).parameters["fp16"].default, ") by default", sep="")
conv = {"pnnx default": pitfalls.pnnx_cli(block, "block_default", WORK / "fp16", seq_inputs(7, 0, 64), seq_inputs(11, 1, 64)),
        "fp16=0": pitfalls.pnnx_cli(block, "block_fp32", WORK / "fp32", seq_inputs(7, 0, 64), seq_inputs(11, 1, 64), fp16=0)}
sizes = {k: c["bin"].stat().st_size for k, c in conv.items()}
print({k: f"{s / 1024:.1f} KiB" for k, s in sizes.items()}, "ratio", round(sizes["pnnx default"] / sizes["fp16=0"], 3))
check.equal("8 pnnx.export default fp16", "default", inspect.signature(pnnx.export).parameters["fp16"].default, True)
check.at_most("8 .bin size, pnnx default / fp16=0", "ratio", sizes["pnnx default"] / sizes["fp16=0"], 0.55)

# %%
def run_block(c: dict, x: np.ndarray, **opt) -> np.ndarray:
    net = ncnn.Net()
    net.opt.num_threads = THREADS
    for k, v in opt.items():
        setattr(net.opt, k, v)
    assert net.load_param(str(c["param"])) == 0 and net.load_model(str(c["bin"])) == 0
    ex = net.create_extractor()
    ex.input("in0", to_mat(x, c["input_batch_axes"][0]))
    return from_mat(ex.extract("out0")[1], c["output_batch_axes"][0])


FP_OFF = dict(use_fp16_packed=False, use_fp16_storage=False, use_fp16_arithmetic=False, use_bf16_storage=False)
ins = seq_inputs(11, 111, 64)
ref = torch_out(block, ins)
weights_rel = {k: check.rel_err(run_block(c, ins["x"].numpy(), **FP_OFF), ref) for k, c in conv.items()}
print({k: f"{v:.1e}" for k, v in weights_rel.items()})
check.at_most("8 fp16=0 weights, fp16 paths off: ncnn vs torch", "rel", weights_rel["fp16=0"], 1e-6)
check.at_least("8 pnnx default (fp16 weights): ncnn vs torch", "rel", weights_rel["pnnx default"], 1e-5)

# %% [markdown]
# Now the runtime side, on the fp32 file. The `Option` defaults of this binding, and what the CPU offers:

# %%
defaults = {k: getattr(ncnn.Net().opt, k) for k in
            ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_bf16_packed", "use_bf16_storage")}
flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").is_file() else set()
print(defaults)
print("cpu:", {f: f in flags for f in ("f16c", "avx512_fp16", "avx512_bf16", "asimdhp")})
for k in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic"):
    check.equal(f"8 ncnn Option default {k}", "value", defaults[k], True)
check.equal("8 ncnn Option default use_bf16_storage", "value", defaults["use_bf16_storage"], False)

# %% [markdown]
# The same input through the fp32 file three ways: defaults, everything off (what `runtime.net.make_net` does),
# and bf16 storage switched on by hand:

# %%
runtime_out = {"defaults": run_block(conv["fp16=0"], ins["x"].numpy()),
               "fp16/bf16 off": run_block(conv["fp16=0"], ins["x"].numpy(), **FP_OFF),
               "bf16 storage on": run_block(conv["fp16=0"], ins["x"].numpy(), **{**FP_OFF, "use_bf16_storage": True})}
runtime_rel = {k: check.rel_err(v, ref) for k, v in runtime_out.items()}
default_vs_off = check.max_abs_err(runtime_out["defaults"], runtime_out["fp16/bf16 off"])
print({k: f"{v:.1e}" for k, v in runtime_rel.items()}, "| max |defaults - off| =", default_vs_off)
check.at_most("8 runtime fp16/bf16 off: ncnn vs torch", "rel", runtime_rel["fp16/bf16 off"], 1e-6)
check.at_most("8 runtime defaults: ncnn vs torch", "rel", runtime_rel["defaults"], 1e-2)
check.at_least("8 runtime bf16 storage on: ncnn vs torch", "rel", runtime_rel["bf16 storage on"], 1e-5)
finding("pnnx fp16 weights by default", PNNX, weights_rel["pnnx default"] > 1e-5,
        f".bin {sizes['pnnx default'] / sizes['fp16=0']:.2f}× the size; rel error {weights_rel['pnnx default']:.0e} "
        f"vs {weights_rel['fp16=0']:.0e}", "`fp16=0` (pnnx) / `fp16=False` (`pnnx.export`)")
finding("ncnn fp16 runtime defaults", NCNN, runtime_rel["defaults"] > 1e-5,
        f"defaults on; on this CPU max |defaults − off| = {default_vs_off:.1e}; "
        f"bf16 storage: rel {runtime_rel['bf16 storage on']:.0e}",
        "turn `use_fp16_*` and `use_bf16_storage` off before `load_param` (`make_net`)")

# %% [markdown]
# On this x86 CPU the defaults change nothing for this block: the output is bitwise the same, so no layer here took
# an fp16 path. On ARM with fp16 arithmetic, or on Vulkan, they do take one. Turn them off anyway: parity must not
# depend on the CPU. bf16 storage is off by default, and switching it on costs about three decimal digits.

# %% [markdown]
# ## 9. Tabulate what reproduced
# Built from the measurements above; "reproduces" is what happened in this run.

# %%
display(HTML("<table><tr><th>#</th><th>pitfall</th><th>version</th><th>reproduces?</th><th>symptom (measured)</th>"
             "<th>fix</th></tr>" + "".join(
                 f"<tr><td>{i}</td><td>{f['pitfall']}</td><td>{f['version']}</td><td>{'yes' if f['reproduces'] else 'no'}</td>"
                 f"<td>{f['symptom']}</td><td>{f['fix']}</td></tr>" for i, f in enumerate(findings, 1)) + "</table>"))
elapsed = time.perf_counter() - t_start
shutil.rmtree(WORK, ignore_errors=True)
print(f"chapter ran in {elapsed:.0f} s; work dir removed")
check.equal("every pitfall recorded", "count", len(findings), 12)

# %% [markdown]
# ## Summary
# - Loud failures: HF `repeat_kv` leaves `pnnx.Expression`/`Tensor.expand` and `load_param` returns -1;
#   `stack(...).sum(0)` over pnnx's batch axis kills the process with SIGFPE; a borrowed `ncnn.Mat` feeding an
#   in-place first layer dies with SIGSEGV.
# - Silent failures: `x[..., :-r]` with a dynamic length is dropped; one input shape freezes the length;
#   `reshape(n, -1)` in front of the ones-matmul and an uneven `chunk`/`tensor_split` give wrong numbers; a Mat
#   cloned from a temporary array has a few wrong values. Only a second length, or a comparison with torch, shows them.
# - Fixed on pnnx 20261020: `unbind`/`chunk`/`tensor_split` with even pieces become a Slice with parameters.
# - fp16 is the default twice (pnnx weights, ncnn `Option`); both are turned off for parity work.
#
# **Artifacts left:** `data/reports/<ckpt>/04b_reproduce_pitfalls.json` only.
#
# **If your numbers differ**
# - *A "killed by" check fails: the child exits normally* → an ncnn build that guards the empty Reduction or the
#   missing refcount → compare the ncnn version printed at the top; if the `.param` lines printed in §2 are the same,
#   ncnn fixed it and the rewrite is merely harmless.
# - *A leftover-op, Crop or Slice check fails* → another pnnx version → the version printed at the top, and the
#   `.param` lines printed in §1, §3, §4 against the ones described there.
# - *"wrong arrays (observed)" is 0* → your allocator left the freed block untouched → the bug is still there:
#   §6 shows the borrowed Mat's `refcount` is `None`.
# - *"runtime defaults" around 1e-3 instead of 1e-7* → a CPU with fp16 arithmetic (ARM) → the cpu flags printed in
#   §8; this is why `make_net` turns the fp16/bf16 paths off.

# %%
check.table()
