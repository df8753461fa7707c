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
# # Appendix A · The pnnx conversion pitfalls
# > Every rewrite in chapter 02 is there because a conversion broke. Here each break happens again, on the pinned
# > pnnx, next to the fix working.
#
# pnnx (PyTorch Neural Network eXchange) is ncnn's converter: it reads a traced TorchScript module and writes an
# ncnn graph, a `.param` (the layers, as text, one per line) and a `.bin` (the weights); chapter 04 drives it. This
# appendix backs the rewrite table of chapter 02 (its last column points here, by section) and the export options
# of chapter 04 (two input shapes, `fp16=0`): read it when a conversion of your own goes wrong.
#
# **You will:** follow one pitfall end to end (a torch module, its conversion, the wrong `.param` line, the wrong
# result, the fix); then convert one tiny module per pitfall, run each in ncnn (in a child process where it can
# crash), read the table of what reproduced, and look at each: the `.param` lines, the signal or wrong shape ncnn
# produced, and the fixed form checked against torch at two lengths.
#
# **You will learn:** what each failure looks like in the `.param` and at run time; which failures are loud (load
# errors, SIGFPE) and which are silent (wrong shape, wrong values); which older pitfalls no longer reproduce.
#
# **You need:** nothing from the chapters: no checkpoint, only torch, pnnx and ncnn.
#
# **Leaves behind:** `data/reports/<ckpt>/appendix_a_pnnx_pitfalls.json`. The conversions go to a temporary folder
# that is deleted at the end. The set-up: threads, the report, the work folder, the two lengths every demo uses:

# %%
import tempfile
from pathlib import Path

import ncnn
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from qtts_lib import check, settings
from qtts_lib.export import pitfalls, read_param

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("appendix_a_pnnx_pitfalls", ckpt)
WORK = Path(tempfile.mkdtemp(prefix="qtts_appendix_a_"))
LENGTHS = pitfalls.LENGTHS  # (7, 11): every conversion sees both, unless one is the bug
print(" | ".join(pitfalls.versions().values()), f"| {THREADS} threads")

# %% [markdown]
# ## 1. Watch one pitfall happen, then reproduce them all
# **The crop that pnnx drops.** The codec decoder's transposed convolutions make a few samples too many at the end
# and trim them, the obvious way being a slice, `y[..., :-2]`. A module that does exactly that:

# %%
class Upsample(nn.Module):
    def __init__(self, trim: str):
        super().__init__()
        self.trim = trim
        self.conv = nn.ConvTranspose1d(4, 4, kernel_size=4, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, 4, T)
        y = self.conv(x)  # (1, 4, 2T + 2), trimmed to (1, 4, 2T)
        return y[..., :-2] if self.trim == "slice" else F.pad(y, (0, -2))


torch.manual_seed(0)
sliced = Upsample("slice").eval()
example = {t: {"x": torch.randn(1, 4, t)} for t in LENGTHS}

# %% [markdown]
# Converted the careful way (chapter 04): traced, two input shapes so the length stays dynamic, `fp16=0`. pnnx
# exits 0, and the `.param` holds two layers, an `Input` and the transposed convolution:

# %%
info = pitfalls.pnnx_cli(sliced, "sliced", WORK / "one", *example.values(), fp16=0)
print(f"$ pnnx {info['command']}\nexit {info['returncode']}\n")
print(info["param"].read_text())
check.equal("1 y[..., :-2]: pnnx exit status", "returncode", info["returncode"], 0)
check.equal("1 y[..., :-2]: Crop layers in the .param", "count",
            read_param(info["param"]).counts["Crop"], 0)

# %% [markdown]
# The `Deconvolution1D` line writes the graph's output `out0` directly: the slice is gone, without a warning. Run it
# in ncnn (fp16 paths off, the input Mat cloned while its array lives, as in chapter 04) and measure, at both
# lengths:

# %%
def run_in_ncnn(converted: dict, x: torch.Tensor) -> np.ndarray:
    net = ncnn.Net()
    opt = net.opt
    opt.use_fp16_packed = opt.use_fp16_storage = opt.use_fp16_arithmetic = False
    net.load_param(str(converted["param"]))
    net.load_model(str(converted["bin"]))
    assert converted["input_batch_axes"] == [0], "this input has pnnx's batch axis 0"
    held = x[0].numpy()  # ncnn blobs have no batch axis: drop it
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(held).clone())
    return np.array(ex.extract("out0")[1].numpy())


print("batch axes in/out:", info["input_batch_axes"], info["output_batch_axes"])
for t, ins in example.items():
    ours = run_in_ncnn(info, ins["x"])
    with torch.no_grad():
        ref = sliced(ins["x"])[0].numpy()
    print(f"T={t}: ncnn {ours.shape}, torch {ref.shape}")
    check.equal(f"1 y[..., :-2]: ncnn output length @ T={t}", "samples", ours.shape[-1],
                2 * t + 2)
    check.close(f"1 y[..., :-2]: first 2T samples vs torch @ T={t}", ours[..., : 2 * t],
                ref, max_abs=1e-5)

# %% [markdown]
# Two samples too many per call, and everything else right, so an error averaged over the output would hardly show
# it; in the codec each call's output would be longer than its frames. The fix of chapter 02 is a negative pad,
# which pnnx writes as a `Crop`:

# %%
padded = Upsample("pad").eval()
padded.load_state_dict(sliced.state_dict())
fixed = pitfalls.pnnx_cli(padded, "padded", WORK / "one", *example.values(), fp16=0)
print("\n".join(pitfalls.param_lines(fixed["param"], "Deconvolution1D", "Crop")))
check.equal("1 F.pad(y, (0, -2)): Crop layers in the .param", "count",
            read_param(fixed["param"]).counts["Crop"], 1)
for t, ins in example.items():
    with torch.no_grad():
        ours = run_in_ncnn(fixed, ins["x"])
        check.close(f"1 F.pad(y, (0, -2)): ncnn vs torch @ T={t}", ours,
                    padded(ins["x"])[0].numpy(), rel=1e-5)

# %% [markdown]
# **Every pitfall.** One call converts every demo module and runs it (about a minute), through
# `export.export_module` (chapter 04: two input shapes, `fp16=0`) unless leaving one of those out is the pitfall
# (then `pitfalls.pnnx_cli`, with exactly the arguments given); graphs that can crash run in a child Python
# (`pitfalls.ncnn_isolated`), which reports the signal. Each row (pitfall, symptom, fix, reproduced?) is what
# this run measured; sections 2 to 7 show the rows in detail, in the table's order.

# %%
findings = pitfalls.reproduce_pnnx(WORK, THREADS)
found = {f.key: f for f in findings}
check.equal("every pitfall recorded", "count", len(findings), 8)
pitfalls.table(findings)

# %% [markdown]
# ## 2. Fold GQA into one SDPA: HF `repeat_kv` does not load
# SDPA is ncnn's scaled dot-product attention layer, `softmax(q·kᵀ/√d + mask)·v` over all heads at once. GQA,
# grouped-query attention, has fewer key/value heads than query heads. Hugging Face widens k and v by expand and
# reshape; with a dynamic length pnnx cannot fold the expand into anything ncnn has:

# %%
import inspect

print(inspect.getsource(pitfalls.hf_repeat_kv))
gqa = found["gqa"].data
print("\n".join(gqa["hf_lines"]))
check.at_least("2 HF repeat_kv: leftover pnnx ops in the .param", "count",
               len(gqa["leftovers"][pitfalls.HF_REPEAT]), 1)

# %% [markdown]
# ncnn has no `pnnx.Expression` or `Tensor.expand` layer. Loading the graph with the plain ncnn API
# (`pitfalls.load_graph`, in a child process):

# %%
load = gqa["load"]
print(load.status, "|", load.result, "|", load.stderr.strip().replace("\n", " / "))
rc, ret = load.returncode, load.result["load_param"]
check.equal("2 HF repeat_kv: child process exits normally", "returncode", rc, 0)
check.equal("2 HF repeat_kv: ncnn load_param return value", "ret", ret, -1)

# %% [markdown]
# The fix in the wrappers: `k.repeat_interleave(n, dim=-3)`. pnnx recognises it next to the SDPA and folds it in:
# one `SDPA` layer, nothing left over, and the same numbers as torch at both lengths. `dim=-3` matters: `dim=1`
# names the same axis, yet is not matched and stays a `torch.repeat_interleave` layer. `enable_gqa=True` on
# torch's SDPA folds as well. All four variants of `pitfalls.Attention` share one set of weights; checked, then
# tabled:

# %%
import pandas as pd

check.at_least("2 repeat_interleave(dim=1): leftover ops", "count",
               len(gqa["leftovers"]["repeat_interleave(2, dim=1)"]), 1)
for r in ("repeat_interleave(2, dim=-3)", "sdpa(enable_gqa=True)"):
    check.equal(f"2 {r}: leftover ops", "count", len(gqa["leftovers"][r]), 0)
    check.equal(f"2 {r}: SDPA layers", "count", gqa["sdpa"][r], 1)
    for t in LENGTHS:
        check.close(f"2 {r}: ncnn vs torch @ T={t}", *gqa["outputs"][r, t], rel=1e-5)
leftovers = {r: ", ".join(v) or "none" for r, v in gqa["leftovers"].items()}
table = pd.DataFrame({"leftover ops": leftovers, "SDPA layers": gqa["sdpa"]})
table.rename_axis("k/v widening")

# %% [markdown]
# ## 3. Sum over pnnx's batch axis: SIGFPE, then a silent reshape trap
# pnnx decides for every blob whether its axis 0 is a *batch* axis; ncnn blobs have none, so that axis is dropped.
# An embedding of ids shaped `(1, T)` gets one. The codec decoder looks up `G` groups of ids (one per codebook,
# each its own table) and sums them; `torch.stack(parts).sum(0)` stacks along the axis ncnn does not have:

# %%
print(inspect.getsource(pitfalls.StackSum))
ss = found["stack_sum"].data
print("batch axis of input/output:", ss["info"]["input_batch_axes"],
      ss["info"]["output_batch_axes"])
print("\n".join(ss["lines"]))
concat, reduction = ss["concat_axis"], ss["reduction_axes"]
check.equal("3 stack.sum: Concat axis in the .param", "param", concat, "0=-233")
check.equal("3 stack.sum: Reduction axes in the .param", "param", reduction, "-23303=0")

# %% [markdown]
# `Concat ... 0=-233` concatenates along "the batch axis" (233 is pnnx's marker for it) and `-23303=0` is an
# empty list of axes to reduce. Run at both lengths in a child process, then with only the Concat's output
# extracted: an **empty** blob, returned with success, so it is the Reduction, handed it, that raises SIGFPE.

# %%
for t, res in ss["crash"].items():
    print(f"T={t}: {res.status}")
    check.equal(f"3 stack.sum: signal that kills ncnn @ T={t}", "signal", res.signal,
                "SIGFPE")
alone = ss["concat_only"]
print("Concat blob alone:", alone.status, "| extract:", alone.result)
check.equal("3 stack.sum: extracting the Concat blob alone", "returncode",
            alone.returncode, 0)
check.equal("3 stack.sum: Concat blob is empty", "empty blobs", len(alone.outputs), 0)

# %% [markdown]
# **The fix, and the trap inside it.** The codec decoder avoids per-group lookups altogether: groups 1.. share one
# fused table (their `V`-row tables stacked), the host adds `g·V` to group g's ids and flattens them group-major to
# `((G-1)·T,)`, and the sum over groups is a matrix product with a row of ones. Group 0 keeps its own table, fed
# the `(1, T)` ids, as the codec's semantic codebook is. The reshape before the product must keep a leading 1:
# `reshape(1, G-1, -1)`. With `reshape(G-1, -1)` pnnx takes the `G-1` for a batch axis (the Reshape line gets
# `12=233 13=0`: input without, output with a batch axis) and the sum comes out wrong, without any error: it is
# not even group 0 alone (which a dropped sum would give), as the checks below show.

# %%
print(inspect.getsource(pitfalls.FusedSum))
trap = found["reshape_trap"].data
for lead in (False, True):
    print(f"{pitfalls.reshape_label(lead)}:", trap["lines"][lead])
    label = pitfalls.reshape_label(lead)
    check.equal(f"3 {label}: batch marks on the Reshape", "params", trap["marks"][lead],
                "" if lead else "12=233 13=0")

# %% [markdown]
# Both forms against the original `StackSum` in torch, and against group 0 alone, at both lengths:

# %%
for (lead, t), (res, ref, group0) in trap["runs"].items():
    label = pitfalls.reshape_label(lead)
    check.equal(f"3 {label}: child exit @ T={t}", "returncode", res.returncode, 0)
    ours = res.outputs["out0"]
    print(f"{label} @ T={t}: rel error vs torch {check.rel_err(ours, ref):.2e}; "
          f"vs group 0 alone {check.rel_err(ours, group0):.2f}")
    if lead:
        check.close(f"3 {label}: ncnn vs torch StackSum @ T={t}", ours, ref, rel=1e-6)
    else:
        check.at_least(f"3 {label}: silently wrong @ T={t}", "rel",
                       check.rel_err(ours, ref), 0.1)
        check.at_least(f"3 {label}: not group 0 alone either @ T={t}", "rel",
                       check.rel_err(ours, group0), 0.1)

# %% [markdown]
# ## 4. Reproduce the dropped crop `x[..., :-r]`
# Section 1 followed this one by hand. `pitfalls.Upsample` is the same module with three ways to trim: the slice,
# the negative pad, and a slice whose end is computed from the length. Which of the three got a `Crop`:

# %%
crop = found["crop"].data
for k, lines in crop["lines"].items():
    print(f"{k:26s}", "\n".join(lines) or "(no Crop layer)")
for k in pitfalls.TRIMS:
    dropped = k == pitfalls.TRIM_SLICE
    check.equal(f"4 {k}: Crop layers", "count", crop["crops"][k], 0 if dropped else 1)
    for t in LENGTHS:
        ours, ref = crop["outputs"][k, t]
        check.equal(f"4 {k}: ncnn output length @ T={t}", "samples", ours.shape[-1],
                    2 * t + 2 if dropped else 2 * t)
        # the dropped crop loses nothing else: the first 2T samples are right
        check.close(f"4 {k}: first 2T samples vs torch @ T={t}", ours[..., : 2 * t],
                    ref, max_abs=1e-5)

# %% [markdown]
# ## 5. Check `unbind` / `chunk` / `tensor_split`: fixed, with one exception
# Older pnnx wrote these as a `Slice` without parameters. On this version they become a `Slice` whose `-23300=`
# list gives the pieces (`-233` = "an equal share of what is left"), and even splits are right. An **uneven**
# split is not: for 8 into 3, `chunk` and `tensor_split` give 3, 3, 2 in torch, while ncnn's equal shares come out
# 2, 3, 3. Explicit sizes (`split([3, 3, 2])`) are written into the Slice and are right. Each variant of
# `pitfalls.Splitter`, checked, then its Slice parameters and the widths of the pieces ncnn made:

# %%
sp = found["split_even"].data
for k in pitfalls.SPLITS:
    check.equal(f"5 {k}: leftover ops", "count", sp["leftovers"][k], 0)
    check.equal(f"5 {k}: Slice has its -23300 list", "has", sp["has_list"][k], True)
    if k in pitfalls.UNEVEN:
        check.equal(f"5 {k}: piece widths in ncnn (torch: [3, 3, 2])", "widths",
                    str(sp["widths"][k]), "[2, 3, 3]")
    for t in LENGTHS:
        if k in pitfalls.UNEVEN:
            check.at_least(f"5 {k}: silently wrong @ T={t}", "rel",
                           check.rel_err(*sp["outputs"][k, t]), 0.1)
        else:
            check.close(f"5 {k}: ncnn vs torch @ T={t}", *sp["outputs"][k, t], rel=1e-5)
params = {k: " ".join(q for q in v[0].split() if "=" in q)
          for k, v in sp["lines"].items()}
widths = {k: str(w) for k, w in sp["widths"].items()}
table = pd.DataFrame({"Slice parameters": params, "widths in ncnn": widths})
table.rename_axis("split")

# %% [markdown]
# ## 6. Reproduce a frozen length: one input shape
# pnnx learns which dimensions vary by seeing two input shapes. Given one, it writes the traced sizes as constants
# wherever a shape is computed. `pitfalls.HeadMix` splits 32 channels into 4 heads of 8 and back, as attention
# does; converted once with `input=` only and once with `input=` and `input2=`:

# %%
one = found["one_shape"].data
for k in ("one", "two"):
    print(f"--- pnnx {one[k]['command']} -> exit {one[k]['returncode']}")
    print("\n".join(one["lines"][k]))
check.equal("6 one shape: pnnx exit status", "returncode", one["one"]["returncode"], 0)
check.equal("6 one shape: first Reshape has the traced length as a constant", "param",
            one["reshape"], "11=7")
gemm = one["gemm"]
check.equal("6 one shape: Gemm has a constant row count", "param", gemm["one"], "7=7")
check.equal("6 two shapes: Gemm rows follow the input", "param", gemm["two"], "7=0")

# %% [markdown]
# With one shape the first Reshape carries `11=7` (depth 7: the traced length), the second `1=7`, and the Gemm
# `7=7` (a constant row count); with two shapes they use expressions of the input's size (`0h`, `0d`) and `7=0`.
# At another length the frozen graph does not complain. It returns 7 rows, the first 7 of the right answer:

# %%
for t, (res, ref) in one["frozen"].items():
    ours = res.outputs["out0"]
    print(f"T={t}: {res.status}, extract {res.result}, ncnn {ours.shape}, torch",
          ref.shape)
    check.equal(f"6 one shape: ncnn output shape @ T={t}", "shape", str(ours.shape),
                "(1, 7, 32)")
    check.close(f"6 one shape: first 7 rows vs torch @ T={t}", ours[:, :7], ref[:, :7],
                max_abs=1e-5)
for t, (ours, ref) in one["outputs"].items():
    check.close(f"6 two shapes: ncnn vs torch @ T={t}", ours, ref, rel=1e-5)

# %% [markdown]
# ## 7. Measure pnnx's fp16 default
# pnnx writes **fp16 weights** unless told `fp16=0`, the CLI and the Python helper alike. `pitfalls.Block` (an MLP
# with a residual, then a convolution) converted both ways, run with ncnn's own fp16/bf16 paths off (appendix B
# is about those), against torch at both lengths:

# %%
fp = found["fp16_weights"].data
sizes = fp["sizes"]
print({k: f"pnnx {c}" for k, c in fp["commands"].items()})
print({k: f"{s / 1024:.1f} KiB" for k, s in sizes.items()}, "ratio",
      round(sizes["pnnx default"] / sizes["fp16=0"], 3))
check.equal("7 pnnx.export default fp16", "default", fp["export_default"], True)
check.at_most("7 .bin size, pnnx default / fp16=0", "ratio",
              sizes["pnnx default"] / sizes["fp16=0"], 0.55)

# %% [markdown]
# Both against torch at both lengths; then the work folder goes:

# %%
import shutil

for t in LENGTHS:
    check.close(f"7 fp16=0 weights, fp16 paths off: ncnn vs torch @ T={t}",
                *fp["outputs"]["fp16=0", t], rel=1e-6)
    check.at_least(f"7 pnnx default (fp16 weights): ncnn vs torch @ T={t}", "rel",
                   check.rel_err(*fp["outputs"]["pnnx default", t]), 1e-5)
shutil.rmtree(WORK, ignore_errors=True)

# %% [markdown]
# ## Summary
# - Loud failures: HF `repeat_kv` leaves `pnnx.Expression`/`Tensor.expand` and `load_param` returns -1;
#   `stack(...).sum(0)` over pnnx's batch axis kills the process with SIGFPE.
# - Silent failures: `x[..., :-r]` with a dynamic length is dropped; one input shape freezes the length;
#   `reshape(n, -1)` in front of the ones-matmul and an uneven `chunk`/`tensor_split` give wrong numbers. Only a
#   second length, or a comparison with torch, shows them.
# - Fixed on pnnx 20261020: `unbind`/`chunk`/`tensor_split` with even pieces become a Slice with parameters.
# - pnnx writes fp16 weights unless told `fp16=0`; the runtime side of fp16 is appendix B.
#
# **Artifacts left:** `data/reports/<ckpt>/appendix_a_pnnx_pitfalls.json` only.
#
# **If your numbers differ**
# - *The SIGFPE check fails: the child exits normally* → an ncnn build that guards the empty Reduction → if the
#   `.param` lines in §3 are the same, ncnn fixed it and the rewrite is merely harmless.
# - *A leftover-op, Crop or Slice check fails* → another pnnx version → the version printed at the top, and the
#   `.param` lines printed in §2, §4, §5 against the ones described there.
# - *A row of §1's table says "no" where this text says "reproduces"* → your pnnx fixed it (the section of that
#   pitfall names the part); chapter 02's rewrite is then merely harmless. *fp16=0 fails near 1e-3* → appendix B §5.

# %%
check.table()
