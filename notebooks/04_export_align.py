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
# # 04 · Export every module with pnnx and align it in ncnn
# > Export, then immediately compare, at two lengths: a frozen shape only shows when the length changes.
#
# **ncnn** (Tencent's inference framework for CPUs and Vulkan GPUs) runs a graph stored as `.param` (the layers, as
# text) and `.bin` (the weights). **pnnx** (PyTorch Neural Network eXchange, ncnn's converter) reads a
# TorchScript file (a traced torch module saved as `.pt`) and writes those two files.
#
# **You will:** convert one wrapper by hand (trace, pnnx, read the `.param`, run it in bare `ncnn` against torch);
# convert all ten wrappers of chapter 02 the same way, inspect each `.param`, write the one rewrite pnnx's output
# needs, and compare each graph with its torch wrapper at two lengths, then layer by layer.
#
# **You will learn:** how pnnx is driven; how to read a `.param` line; the four calls of the ncnn Python API
# (`Net`, `load_param`/`load_model`, `create_extractor`, `input`/`extract`); why rope (the rotary position
# embedding: q and k rotated by angles that grow with the position) needs a `.param` rewrite; which metric fits
# which module; how to find the layer where two graphs part.
#
# **You need:** `models/<ckpt>/` (chapter 00; made here if missing); chapter 02's wrappers.
# **Leaves behind:** `models/<ckpt>/ncnn/<module>.param/.bin` + `manifest.json`, `mimi_rvq.npz` (Mimi's codebooks,
# section 4), `data/reports/<ckpt>/04_export_align.json`. Appendices A (pnnx) and B (the ncnn binding) reproduce
# the pitfalls behind the rewrites. The set-up: checkpoint, threads, report, reference model, output folder.

# %%
import torch

from qtts_lib import check, checkpoint, paths, reference, settings

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("04_export_align", ckpt)
tts = reference.load(checkpoint.ensure(ckpt), threads=THREADS)
cfg = checkpoint.load_config(ckpt)
out_dir = paths.ncnn_dir(ckpt)

# %% [markdown]
# ## 1. Convert one wrapper by hand
# First the text embedding, by hand (`talker_text_embed`: int32 token ids → the text table → a two-layer MLP to
# the talker's width). Trace it at its first length, and save one real input per length as `.npy`: pnnx runs the
# graph on `input=` and `input2=` and marks as variable every dimension that differs between them (with one shape
# it would freeze the length); `fp16=0` keeps the weights fp32 (pnnx's default is fp16). All of it goes to a
# scratch folder this section deletes; only section 2 writes `models/`. pnnx leaves its own intermediate form
# (`.pnnx.param/.bin`, an `.onnx`), two generated test scripts, and the ncnn graph, **`.ncnn.param`** and
# **`.ncnn.bin`**. The `.param` is printed at the end:

# %%
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from qtts_lib import export, modules

print(*(f"{d} {metadata.version(d)}" for d in ("pnnx", "ncnn", "torch")), f"| {ckpt}")
spec = modules.get("talker_text_embed")
wrapper = spec.build(tts)
# {"ids": (n,) int32} at each of the two lengths
ins_a, ins_b = (spec.inputs(tts, n, seed=i) for i, n in enumerate(spec.lengths))
hand = Path(tempfile.mkdtemp(prefix="qtts_04_by_hand_"))
with torch.no_grad():
    torch.jit.trace(wrapper, tuple(ins_a.values())).save(str(hand / "text_embed.pt"))
np.save(hand / "a0.npy", ins_a["ids"].numpy())
np.save(hand / "b0.npy", ins_b["ids"].numpy())
cmd = [export.pnnx_binary(), "text_embed.pt", "input=a0.npy", "input2=b0.npy", "fp16=0"]
print(f"$ cd {hand}\n$ pnnx {' '.join(cmd[1:])}")
proc = subprocess.run(cmd, cwd=hand, capture_output=True, text=True)
wrote = sorted(f.name for f in hand.iterdir() if f.suffix != ".npy")
print(f"exit {proc.returncode}; pnnx wrote:", ", ".join(wrote), "\n")
check.equal("by hand: pnnx exit status", "returncode", proc.returncode, 0)
param_text = (hand / "text_embed.ncnn.param").read_text()
print(param_text)

# %% [markdown]
# Line 1 is ncnn's magic number, line 2 `layer_count blob_count` (a **blob** is ncnn's name for a tensor between
# layers); then one layer per line: `type name n_inputs n_outputs input_blobs... output_blobs... key=value...`,
# the keys numbered per layer type (ncnn's operator reference). Here: an `Input` blob `in0`; an `Embed` with `0=`
# the width and `1=` the rows (the vocabulary); two `Gemm` (`fc1`, `fc2` of the MLP) with `Swish` (SiLU) between;
# a few `Reshape`/`ExpandDims`/`Squeeze` from the shapes the trace saw; the output blob `out0`. The figure draws
# the first `Gemm` line field by field, naming the keys ncnn's Gemm defines. `export.parse_param` reads every line
# the same way (`export.read_param`, a file); its `leftovers` are the **leftover pnnx ops**, layers pnnx could not
# map to an ncnn layer (`pnnx.Expression`, `Tensor.expand`, ...), which ncnn cannot load. Against the config:

# %%
from qtts_lib import plots

gemm_line = next(line for line in param_text.splitlines() if line.startswith("Gemm"))
GEMM_KEYS = {"3": "B transposed", "5": "B (weights) in .bin", "6": "C (bias) in .bin",
             "7": "rows M (0: from input)", "8": "outputs N", "9": "inputs K"}
plots.param_line(gemm_line, GEMM_KEYS, title=f"text embedding, first Gemm ({ckpt})")
hand_info = export.parse_param(param_text)
embed_layer = next(layer for layer in hand_info.layers if layer.type == "Embed")
embed = dict(q.split("=", 1) for q in embed_layer.params)  # {"0": width, "1": rows}
print(" ".join(embed_layer.params))
talker_cfg = cfg["talker_config"]
check.equal("by hand: Embed 1= (rows) = text vocabulary", "rows", int(embed["1"]),
            talker_cfg["text_vocab_size"])
check.equal("by hand: Embed 0= (width) = text hidden size", "width", int(embed["0"]),
            talker_cfg["text_hidden_size"])
check.equal("by hand: Gemm layers (fc1, fc2)", "count", hand_info.counts["Gemm"], 2)
check.equal("by hand: leftover pnnx ops", "count", len(hand_info.leftovers), 0)

# %% [markdown]
# Now run it with the bare ncnn Python API: a `Net` (one loaded graph) whose fp16 paths are off (ncnn turns them
# on by default where the CPU has them; appendix B), `load_param` and `load_model` (each returns 0 on success),
# then per call an `Extractor` (one evaluation of the graph): `input` the ids as an `ncnn.Mat` (ncnn's tensor),
# `extract` the output blob. The Mat is cloned while the numpy array is alive, because `ncnn.Mat(array)` only
# borrows its memory (appendix B). `spec.check` is the module's metric and tolerance from chapter 02:

# %%
import shutil

import ncnn

net = ncnn.Net()
net.opt.num_threads = THREADS
net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
rets = (net.load_param(str(hand / "text_embed.ncnn.param")),
        net.load_model(str(hand / "text_embed.ncnn.bin")))
check.equal("by hand: load_param, load_model", "returns", str(rets), "(0, 0)")
print("blobs:", net.input_names(), "->", net.output_names())
for ins in (ins_a, ins_b):
    ids = ins["ids"].numpy()  # (n,) int32, alive while the Mat is cloned
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(ids).clone())
    ret, out = ex.extract("out0")
    ours = np.array(out.numpy())  # (n, hidden)
    with torch.inference_mode():
        ref = wrapper(*ins.values()).numpy()
    print(f"n={len(ids)}: extract {ret}, ncnn {ours.shape} vs torch {ref.shape}")
    spec.check(f"by hand: bare ncnn vs torch @ {len(ids)}", ours, ref)
del net
shutil.rmtree(hand)

# %% [markdown]
# ## 2. Export every wrapper with pnnx
# `export.export_module` does what section 1 did by hand (real inputs at both lengths, so that ids are valid
# rows; pnnx's exit status checked, which the `pnnx.export` Python helper discards; only `<name>.param/.bin`
# kept). It also reads pnnx's test script for each input's **batch axis**: pnnx decides for every tensor whether
# its axis 0 indexes independent examples and drops it, ncnn blobs having none, so the runtime must drop it too
# (233, pnnx's marker: no batch axis). The manifest records fingerprint, sha256, versions, batch axes, layer
# counts and a hash of the wrappers' code (older exports are redone). `export.export_all` runs it for every
# wrapper, reusing current exports; its text embedding must be section 1's graph:

# %%
import time

import pandas as pd

t0 = time.perf_counter()
entries = export.export_all(tts, ckpt)
print(f"{len(entries)} modules ready in {time.perf_counter() - t0:.1f} s")
has_speaker_encoder = tts.model.speaker_encoder is not None
if not has_speaker_encoder:
    print(f"no speaker_encoder: a {cfg['tts_model_type']} checkpoint has none")
wrappers = [s.name for s in modules.all_specs()
            if has_speaker_encoder or s.name != "speaker_encoder"]
check.equal("modules exported = chapter 02's wrappers of this checkpoint", "names",
            ", ".join(sorted(entries)), ", ".join(sorted(wrappers)))
same = (out_dir / "talker_text_embed.param").read_text() == param_text
check.equal("talker_text_embed: export_all's .param = the one made by hand",
            "same text", same, True)
pd.DataFrame({n: {"export s": e["export_seconds"], ".bin MiB": e["bin_bytes"] / 2**20,
                  "intermediates MiB (deleted)": e["work_bytes_before_cleanup"] / 2**20,
                  "pnnx input shapes": e["pnnx_inputshape"],
                  "batch axis per input (233 = none)": str(e["input_batch_axes"]),
                  "layers": sum(e["layer_counts"].values())}
              for n, e in entries.items()}).T.style.format(
    {".bin MiB": "{:.2f}", "intermediates MiB (deleted)": "{:.1f}"})

# %% [markdown]
# ## 3. Read the `.param`
# Two things must hold for every module: no leftover pnnx op, and the layers we designed for are there
# (`export.expected_layers`). In the decoders: **one SDPA per layer** (ncnn's scaled dot-product attention,
# `softmax(q·kᵀ/√d + mask)·v` over all heads at once, with the GQA `repeat_interleave` folded in; GQA,
# grouped-query attention, shares each k/v head among a group of query heads), **one RotaryEmbed per q and per k**
# (rope), and seven `Gemm` per layer (q, k, v, o, gate, up, down), plus one for the code predictor's input
# projection where it is a `Linear` (chapter 02). The head of the talker's `.param` shows the four `Input`s
# (`in0` hidden rows, `in1` mask, `in2`/`in3` cos/sin) and the first layer's norm, projections, rope and SDPA:

# %%
for name in entries:
    info = export.read_param(out_dir / f"{name}.param")
    check.equal(f"{name}: leftover pnnx ops", "count", len(info.leftovers), 0)
    for layer_type, n in export.expected_layers(name, cfg).items():
        check.equal(f"{name}: {layer_type} layers", "count", info.counts[layer_type], n)
print(*(out_dir / "talker_decoder.param").read_text().splitlines()[:30], sep="\n")
predictor_cfg = talker_cfg["code_predictor_config"]
projection = tts.model.talker.code_predictor.small_to_mtp_projection
projected = not isinstance(projection, torch.nn.Identity)
for name, c, extra in (("talker_decoder", talker_cfg, 0),
                       ("predictor_decoder", predictor_cfg, int(projected))):
    label = f"{name}: Gemm layers (7 per layer{' + the projection' if extra else ''})"
    gemms = export.read_param(out_dir / f"{name}.param").counts["Gemm"]
    check.equal(label, "count", gemms, 7 * c["num_hidden_layers"] + extra)

# %% [markdown]
# ### The one rewrite after pnnx: half-width rope tables
# Rope rotates each pair of channels of q and k by an angle proportional to the position; the graph gets the
# angles as two tables, cos and sin, one row per position. pnnx fuses rope into ncnn's `RotaryEmbed` layer only
# in Hugging Face's form, `x·cos + rotate_half(x)·sin` with full-width tables (each angle twice); ncnn's layer
# (its tests, its Vulkan kernels) and our runtime use half-width tables, one column per pair. So the wrapper
# takes half-width tables and widens them in the graph with `cat([t, t], -1)`; pnnx writes that as a `Concat` of
# two `Split` copies (taking the length axis for a batch axis), which `export_all` then cuts out. To see what pnnx
# wrote, export the talker decoder again into a scratch folder and follow cos and sin (`in2`, `in3`) to the first
# RotaryEmbed:

# %%
spec = modules.get("talker_decoder")
raw_dir = Path(tempfile.mkdtemp(prefix="qtts_04_rope_"))
a, b = (spec.inputs(tts, n, seed=i) for i, n in enumerate(spec.lengths))
raw = export.export_module(spec.build(tts), spec.name, a, b, raw_dir)
raw_text = (raw_dir / "talker_decoder.param").read_text()  # as pnnx wrote it
shutil.rmtree(raw_dir)
tables = [f"in{i}" for i, n in enumerate(raw["input_names"]) if n in ("cos", "sin")]


def rope_path(text: str, start: list[str]) -> list[str]:
    """The lines that carry `start` through Splits and Concats to the first rope."""
    seen, shown = set(start), []
    for tok in (line.split() for line in text.splitlines()[2:]):
        blobs = set(tok[4 : 4 + int(tok[2]) + int(tok[3])])
        shown += [" ".join(tok)] if seen & blobs else []
        if seen & blobs and tok[0] in ("Input", "Split", "Concat"):
            seen |= blobs
        if tok[0] == "RotaryEmbed" and seen & blobs:
            return shown


print(raw_text.splitlines()[1], "(layers, blobs) as pnnx wrote it:")
print(*rope_path(raw_text, tables), sep="\n")

# %% [markdown]
# `Split` copies the half-width table twice, `Concat` glues the copies side by side into the full-width table,
# and a second `Split` hands that to every layer's RotaryEmbed (the second and third inputs of a RotaryEmbed are
# its cos and sin). The rewrite deletes every `Concat` whose two inputs are the two outputs of one `Split` (used
# nowhere else) and whose output reaches a RotaryEmbed's cos or sin; that `Split` then hands its input straight
# on, with one output instead of two. Written on the text, token by token, with the header counts recomputed:

# %%
from collections import Counter


def drop_rope_widening_text(param_text: str) -> str:
    """Delete each Concat that glues two Split copies of a rope table back together."""
    magic, _, *lines = param_text.splitlines()
    rows = [line.split() for line in lines]  # type name n_in n_out ins outs k=v
    ins = lambda r: r[4 : 4 + int(r[2])]
    outs = lambda r: r[4 + int(r[2]) : 4 + int(r[2]) + int(r[3])]
    producer = {b: r for r in rows for b in outs(r)}
    users = Counter(b for r in rows for b in ins(r))
    rope_tables = {b for r in rows if r[0] == "RotaryEmbed" for b in ins(r)[1:]}

    def reaches_rope(blob: str) -> bool:  # it, or a Split copy of it, is a cos/sin
        copies = [b for r in rows if r[0] == "Split" and blob in ins(r)
                  for b in outs(r)]
        return blob in rope_tables or any(reaches_rope(b) for b in copies)

    dropped = []
    for r in rows:
        split = producer.get(ins(r)[0]) if r[0] == "Concat" and r[2] == "2" else None
        if (split and split[0] == "Split" and outs(split) == ins(r)
                and all(users[b] == 1 for b in ins(r)) and reaches_rope(outs(r)[0])):
            split[3:] = ["1", split[4], outs(r)[0]]  # one output, the Concat's
            dropped.append(r[1])
    rows = [r for r in rows if r[1] not in dropped]
    blobs = {b for r in rows for b in ins(r) + outs(r)}
    body = [f"{r[0]:<24} {r[1]:<24} " + " ".join(r[2:]) for r in rows]
    return "\n".join([magic, f"{len(rows)} {len(blobs)}", *body]) + "\n"

# %% [markdown]
# Applied to what pnnx wrote, the same lines after the rewrite; then the text compared with the library's
# `export.drop_rope_widening` (which `export_all` applies) and with the `.param` section 2 saved. The rewritten
# inputs now carry `(L, head_dim/2)` tables without a batch axis, as the manifest records (233: no batch axis):

# %%
ours = drop_rope_widening_text(raw_text)
library, changed = export.drop_rope_widening(raw_text)
print(ours.splitlines()[1], "(layers, blobs) after the rewrite:")
print(*rope_path(ours, tables), sep="\n")
check.equal("rope rewrite written here = export.drop_rope_widening (talker_decoder)",
            "same text", ours == library, True)
check.equal("talker_decoder: saved .param = pnnx's with the rope rewrite", "same text",
            (out_dir / "talker_decoder.param").read_text() == library, True)
e = entries["talker_decoder"]
print("rewritten inputs:", changed, "| manifest:", e.get("rope_inputs_made_half_width"),
      "-> batch axes", e["input_batch_axes"])
check.equal("talker_decoder: no Concat left in front of RotaryEmbed", "count",
            export.read_param(out_dir / "talker_decoder.param").counts["Concat"], 0)

# %% [markdown]
# ## 4. Align each graph in ncnn, at two lengths
# The runtime's `Net` (`qtts_lib.runtime.binding.net`) is section 1's cell made reusable: fp16/bf16 off, the
# manifest's batch axes, and per call `run`: one Extractor, inputs copied into `ncnn.Mat`s, outputs as numpy
# (`raw=` keeps chosen outputs as Mats, which chapter 05 needs). On fresh inputs at both lengths each module gets
# its spec's metric: relative L2 error (decoders), max |diff| (embeddings, heads), SNR (codec), cosine
# (x-vector). The Mimi graph stops at the latent, one vector per frame; the host turns it into **codes** with
# `rvq.split_rvq_encode`, a numpy nearest-entry search over the codebooks `export_all` saved in `mimi_rvq.npz`
# (codebook 0 alone, then 1..15 as one residual chain). Those codes must equal torch's `encode`:

# %%
from qtts_lib import artifacts
from qtts_lib.runtime.audio import rvq
from qtts_lib.runtime.binding.net import Net

rvq_tables, _ = artifacts.load_npz(out_dir / "mimi_rvq.npz", ckpt)
results = []
for name in entries:
    spec, net = modules.get(name), Net(out_dir, name, threads=THREADS)
    wrapper = spec.build(tts)
    for length in spec.lengths:
        ins = spec.inputs(tts, length, seed=1000 + length)
        with torch.inference_mode():
            ref = wrapper(*ins.values())
        ref = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
        ours = net(*[t.numpy() for t in ins.values()])
        for o, r in zip(ours, ref):
            assert o.shape == r.shape, f"{name} @ {length}: {o.shape} vs {r.shape}"
        o_all = np.concatenate([o.ravel() for o in ours])
        r_all = np.concatenate([r.ravel() for r in ref])
        spec.check(f"{name} @ {length}", o_all, r_all)
        which = "first length" if length == spec.lengths[0] else "second length"
        rel = check.rel_err(o_all, r_all)
        results.append({"module": name, "length": which, "rel": rel})
        if name == "mimi_encoder":
            codes_ncnn = rvq.split_rvq_encode(ours[0][0], rvq_tables)  # (16, T)
            wav = ins["wav"][0]  # (1, L)
            with torch.inference_mode():
                codes_torch = tts.model.speech_tokenizer.model.encode(
                    wav, torch.ones_like(wav, dtype=torch.long)).audio_codes[0]
            label = f"mimi codes (ncnn + numpy RVQ vs torch encode) @ {length}"
            check.tokens_equal(label, codes_ncnn, codes_torch.numpy().T)

# %% [markdown]
# Relative L2 error of every module at both lengths, ncnn against torch (the checks above used each module's
# own metric; this plot puts all on one scale, with a line at 1e-5, section 5's per-layer bar). fp32 with a
# different summation order is all that separates them; the codec decoder, a deep convolution stack with a final
# clamp, collects the most. The largest error, also as an SNR (`-20·log10(rel)` in dB):

# %%
worst = max(results, key=lambda r: r["rel"])
print(f"largest: {worst['module']} at its {worst['length']}: rel {worst['rel']:.1e}, "
      f"SNR {-20 * np.log10(worst['rel']):.0f} dB")
plots.errors(results, value="rel", group="module", series="length", threshold=1e-5,
             ylabel="relative L2 error, ncnn vs torch",
             title=f"ncnn fp32 vs torch wrappers ({ckpt})");

# %% [markdown]
# ## 5. Find where the error grows: probe every layer
# One number per graph says *whether* ncnn agrees with torch, not *where* they part. `qtts_lib.probe.probe` hooks
# every `Linear`, `Conv1d`, `ConvTranspose1d`, `LayerNorm` and `Embedding` of the torch wrapper, extracts the
# intermediate blobs of the ncnn graph from one Extractor, and pairs them **by op kind, then order, then shape**
# (pnnx keeps no module paths: layers are named by op, `gemm_3`, blobs are numbers): the i-th `Linear` call is the
# i-th `Gemm`; each pair is a **tap**. A count or shape that disagrees raises `PairingError`; an activation fused
# into a convolution (`conv1drelu_*`) is applied to torch's side first. The five deep graphs run at their shorter
# length. The limit is **1e-5 relative error at every layer**: fp32 keeps 24 significant bits, so another
# summation order moves a layer by a few multiples of 2⁻²⁴ (about 6e-8); fp16 keeps 11 (2⁻¹¹, about 5e-4), so
# fp16 anywhere would cross it, as would a real bug (a rope or mask convention, one wrong weight):

# %%
from qtts_lib import probe

LAYER_TOL = 1e-5
deep = ("talker_decoder", "predictor_decoder", "codec_decoder", "speaker_encoder",
        "mimi_encoder")
probes = {}
for name in (n for n in deep if n in entries):
    spec = modules.get(name)
    ins = spec.inputs(tts, min(spec.lengths), seed=2000)
    probes[name] = probe.probe(spec, out_dir, name, ins, threads=THREADS, tts=tts)
    w = probes[name].worst
    label = f"{name}: worst layer {w['label']} ({w['layer']})"
    check.at_most(label, "rel", w["rel"], LAYER_TOL)
pd.DataFrame([{"module": n, "taps": len(r.rows), "first tap": r.rows[0]["label"],
               "first rel": r.rows[0]["rel"], "worst tap": r.worst["label"],
               "ncnn layer": r.worst["layer"], "worst rel": r.worst["rel"],
               "output rel": r.rows[-1]["rel"]} for n, r in probes.items()]).set_index(
    "module").style.format("{:.2g}", subset=["first rel", "worst rel", "output rel"])

# %% [markdown]
# Error along depth, one panel per graph, every tap in forward order (ticks mark the stages). Read it for a
# *shape*: the decoders stay flat (each layer rounds afresh), the convolution stacks (codec decoder, Mimi's
# SEANet encoder) climb with depth. A bug is a step up that stays up; `probes[name].first_above(LAYER_TOL)` names it.

# %%
title = (f"ncnn {metadata.version('ncnn')} fp32 vs torch {torch.__version__} wrappers, "
         f"layer by layer ({ckpt}, {THREADS} threads)")
plots.layer_errors(probes, threshold=LAYER_TOL, title=title);

# %% [markdown]
# **The same probe between two ncnn runs.** `probe.probe_ncnn` compares one graph under two configurations, every
# computing layer's output blob (same names: nothing to pair); chapter 10 uses it for Vulkan against CPU, chapters
# 13 and 14 for fp16 or int8. Here one thread against the chapter's thread count, on the talker decoder, with a
# bar ten times tighter: the same kernels, only the sums split differently between threads:

# %%
spec = modules.get("talker_decoder")
ins = [t.numpy() for t in spec.inputs(tts, min(spec.lengths), seed=2000).values()]
threads_probe = probe.probe_ncnn(out_dir, "talker_decoder", ins, {"threads": 1},
                                 {"threads": THREADS})
print(threads_probe.summary())
n_blobs = len(threads_probe.rows)
check.at_most(f"talker_decoder: 1 vs {THREADS} threads, worst of {n_blobs} blobs",
              "rel", threads_probe.worst["rel"], 1e-6)

# %% [markdown]
# ## Summary
# - By hand: trace, `pnnx <name>.pt input=... input2=... fp16=0`, read the `.param`, then `ncnn.Net` →
#   `load_param`/`load_model` → `create_extractor` → `input`/`extract`.
# - pnnx with two real input sets and `fp16=0` converts all ten wrappers with no leftover ops; the decoders get one
#   SDPA per layer and RotaryEmbed for q and k once `drop_rope_widening_text` removes the rope tables' widening.
# - `runtime.binding.net.Net` is the only place where numpy becomes `ncnn.Mat`: owning copies, fp16/bf16 off,
#   pnnx's batch axes. Every module matches its torch wrapper at two lengths; Mimi's codes match torch's encoder.
# - `qtts_lib.probe` pairs every layer of a wrapper with its ncnn layer: every layer of the five deep graphs stays
#   under 1e-5. `probe_ncnn` does the same between two ncnn configurations.
#
# **Artifacts left:** `models/<ckpt>/ncnn/*.param/.bin`, `manifest.json`, `mimi_rvq.npz`, the chapter report.
#
# **If your numbers differ**
# - *`load_param` fails* → a leftover pnnx op (section 3 names it); appendix A shows the usual suspects.
# - *Right at one length, wrong shape at the other* → the export saw one shape: give `input=` and `input2=`.
# - *Errors around 1e-3* → fp16 weights or arithmetic: export with `fp16=0`, turn `use_fp16_*` off (Net does).
# - *Random garbage that changes from run to run* → an `ncnn.Mat` made from a temporary numpy array (appendix B).
# - *The rope rewrite check fails* → another pnnx writes the widening differently: section 3's printed lines.
# - *A module's worst layer is over 1e-5* → the first tap above the limit (`probes[name].first_above(LAYER_TOL)`)
#   is where the port differs; everything before it is fine.
# - *`PairingError`* → pnnx fused, split or dropped a layer of that kind, or a wrapper calls one module twice: the
#   message names the kind and both counts (or the pair whose shapes differ).

# %%
check.table()
