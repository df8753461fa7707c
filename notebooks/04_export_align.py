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
# **You will:** convert one wrapper by hand (trace, the pnnx command, the `.param` it writes, the graph loaded with
# bare `ncnn` and compared with torch); then convert all ten wrappers of chapter 02 the same way (fp16 off, two
# input shapes), inspect each `.param` for leftover pnnx ops and for the layers you expect, run each graph in ncnn
# through `qtts_lib.runtime.net`, and compare with the torch wrapper at two lengths.
#
# **You will learn:** how pnnx is driven and what it leaves behind; how to read a `.param`; the four calls of the
# ncnn Python API; why rope is written the way it is and what the one `.param` rewrite does; which metric fits which
# module.
#
# **You need:** `models/<ckpt>/` (chapter 00; synthesized here if missing). The wrappers of chapter 02 are library
# code (`qtts_lib.modules`), not an artifact.
# **Leaves behind:** `models/<ckpt>/ncnn/<module>.param/.bin` + `manifest.json`, `mimi_rvq.npz`,
# `data/reports/<ckpt>/04_export_align.json`. The pitfalls behind the rewrites are reproduced in appendix A (pnnx) and
# appendix B (the ncnn binding).

# %%
import shutil
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path

import ncnn
import numpy as np
import pandas as pd
import torch
from IPython.display import HTML, display

from qtts_lib import artifacts, check, checkpoint, export, modules, paths, plots, probe, reference, settings
from qtts_lib.runtime.audio import rvq
from qtts_lib.runtime.binding.net import Net

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("04_export_align", ckpt)
tts = reference.load(checkpoint.ensure(ckpt), threads=THREADS)
cfg = checkpoint.load_config(ckpt)
out_dir = paths.ncnn_dir(ckpt)
print(" ".join(f"{d} {metadata.version(d)}" for d in ("pnnx", "ncnn", "torch")), f"| {THREADS} threads | {ckpt}")

# %% [markdown]
# ## 1. Convert one wrapper by hand
# pnnx converts a TorchScript file, given example inputs, into an ncnn graph. One wrapper by hand first: the text
# embedding (`talker_text_embed`: int32 token ids → the text table → a two-layer MLP to the talker's width).
# Trace it at its first length and save real inputs at both lengths, each as `.npy`: two shapes tell pnnx which
# dimensions vary, and `fp16=0` keeps the weights in fp32 (pnnx's default is fp16). All of it goes to a scratch
# folder that this section deletes; `models/` is written only by section 2.

# %%
spec = modules.get("talker_text_embed")
wrapper = spec.build(tts)
ins_a, ins_b = (spec.inputs(tts, n, seed=i) for i, n in enumerate(spec.lengths))  # {"ids": (n,) int32}
hand = Path(tempfile.mkdtemp(prefix="qtts_04_by_hand_"))
with torch.no_grad():
    torch.jit.trace(wrapper, tuple(ins_a.values())).save(str(hand / "talker_text_embed.pt"))
np.save(hand / "a0.npy", ins_a["ids"].numpy())
np.save(hand / "b0.npy", ins_b["ids"].numpy())
cmd = [export.pnnx_binary(), "talker_text_embed.pt", "input=a0.npy", "input2=b0.npy", "fp16=0"]
print(f"$ cd {hand}\n$ pnnx {' '.join(cmd[1:])}")
proc = subprocess.run(cmd, cwd=hand, capture_output=True, text=True)
print(f"exit {proc.returncode}; pnnx wrote:", ", ".join(sorted(f.name for f in hand.iterdir() if f.suffix != ".npy")))
check.equal("by hand: pnnx exit status", "returncode", proc.returncode, 0)

# %% [markdown]
# pnnx leaves several files: its own intermediate form (`.pnnx.param/.bin`, an `.onnx`), two generated test scripts,
# and the ncnn graph, **`.ncnn.param`** (the layers, as text) and **`.ncnn.bin`** (the weights). The `.param`:

# %%
param_text = (hand / "talker_text_embed.ncnn.param").read_text()
print(param_text)

# %% [markdown]
# Line 1 is ncnn's magic number, line 2 `layer_count blob_count`; then one layer per line:
# `type name n_inputs n_outputs input_blobs... output_blobs... key=value...`, the keys numbered per layer type
# (ncnn's operator reference). Here: an `Input` blob `in0`; an `Embed` with `0=` the width and `1=` the number of
# rows (the vocabulary), reading the ids as int32; two `Gemm` (`fc1`, `fc2` of the MLP, `8=` outputs `9=` inputs)
# with `Swish` (SiLU) between; a few `Reshape`/`ExpandDims`/`Squeeze` around them, from the shapes the trace saw;
# the output blob `out0`. Checked against this checkpoint's config:

# %%
hand_info = export.parse_param(param_text)
embed_layer = next(layer for layer in hand_info.layers if layer.type == "Embed")
embed = dict(q.split("=", 1) for q in embed_layer.params)  # {"0": width, "1": rows, ...}
print(" ".join(embed_layer.params))
check.equal("by hand: Embed 1= (rows) = text vocabulary", "rows", int(embed["1"]),
            cfg["talker_config"]["text_vocab_size"])
check.equal("by hand: Embed 0= (width) = text hidden size", "width", int(embed["0"]),
            cfg["talker_config"]["text_hidden_size"])
check.equal("by hand: Gemm layers (fc1, fc2)", "count", hand_info.counts["Gemm"], 2)
check.equal("by hand: leftover pnnx ops", "count", len(hand_info.leftovers), 0)

# %% [markdown]
# Now run it with the bare ncnn Python API: a `Net` whose fp16 paths are off (ncnn turns them on by default where
# the CPU has them; appendix B), `load_param` and `load_model` (each returns 0 on success), then per input an
# `Extractor`: `input` the ids as an `ncnn.Mat`, `extract` the output blob. The Mat is cloned while the numpy array
# is alive, because `ncnn.Mat(array)` only borrows its memory (appendix B). Against the torch wrapper, at both
# lengths:

# %%
net = ncnn.Net()
net.opt.num_threads = THREADS
net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
rets = (net.load_param(str(hand / "talker_text_embed.ncnn.param")),
        net.load_model(str(hand / "talker_text_embed.ncnn.bin")))
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
# `export.export_module` does what section 1 did by hand:
# 1. `torch.jit.trace` the wrapper at the first length and save the TorchScript `.pt`;
# 2. save real inputs for **both** lengths as `.npy` and run the pnnx binary with `input=... input2=... fp16=0`
#    (two shapes mark the varying dims dynamic; real inputs keep int32 ids valid ids; fp16 weights are pnnx's
#    default and would cost parity);
# 3. check pnnx's exit status (the `pnnx.export` Python helper discards it);
# 4. read pnnx's generated test script for which axis of each blob it took as batch (ncnn drops that axis);
# 5. keep `<name>.param/.bin`, delete the `.pt`, `.pnnx.*`, `.onnx` and generated scripts;
# 6. record a manifest entry: producer, checkpoint fingerprint, sha256, versions, batch axes, code hash of the
#    wrappers (so an export made by older code is redone), layer counts.
#
# Exports already up to date are reused.

# %%
t0 = time.perf_counter()
entries = export.export_all(tts, ckpt)
print(f"{len(entries)} modules ready in {time.perf_counter() - t0:.1f} s")
has_speaker_encoder = tts.model.speaker_encoder is not None
if not has_speaker_encoder:
    print(f"skipped speaker_encoder because a {cfg['tts_model_type']} checkpoint has no speaker encoder (chapter 02)")
wrappers = [s.name for s in modules.all_specs() if has_speaker_encoder or s.name != "speaker_encoder"]
check.equal("modules exported = chapter 02's wrappers of this checkpoint", "names", ", ".join(sorted(entries)),
            ", ".join(sorted(wrappers)))
rows = "".join(
    f"<tr><td><code>{n}</code></td><td>{e['export_seconds']}</td><td>{e['bin_bytes'] / 2**20:.2f}</td>"
    f"<td>{e['work_bytes_before_cleanup'] / 2**20:.1f}</td><td>{e['pnnx_inputshape']}</td>"
    f"<td>{e['input_batch_axes']}</td><td>{sum(e['layer_counts'].values())}</td></tr>" for n, e in entries.items())
display(HTML("<table><tr><th>module</th><th>export s</th><th>.bin MiB</th><th>intermediates MiB (deleted)</th>"
             "<th>pnnx input shapes</th><th>batch axis per input (233 = none)</th><th>layers</th></tr>"
             + rows + "</table>"))
check.equal("talker_text_embed: export_all's .param = the one made by hand", "same text",
            (out_dir / "talker_text_embed.param").read_text() == param_text, True)

# %% [markdown]
# ## 3. Read the `.param`
# Read as in section 1. Two things must hold for every module:
# no pnnx-internal op survived (ncnn cannot load `pnnx.Expression`, `Tensor.expand`, ...), and the layers we
# designed for are there: in the decoders **one SDPA per layer** (the GQA `repeat_interleave` folded into it) and
# **one RotaryEmbed per q and per k**.

# %%
for name in entries:
    info = export.read_param(out_dir / f"{name}.param")
    check.equal(f"{name}: leftover pnnx ops", "count", len(info.leftovers), 0)
    for layer_type, n in export.expected_layers(name, cfg).items():
        check.equal(f"{name}: {layer_type} layers", "count", info.counts[layer_type], n)
print("".join((out_dir / "talker_decoder.param").read_text().splitlines(keepends=True)[:30]))

# %% [markdown]
# Each decoder layer has seven projections (q, k, v, o, gate, up, down), each a `Gemm` from `9=` inputs to `8=`
# outputs. The first Gemm of the code predictor's graph:

# %%
predictor_cfg = cfg["talker_config"]["code_predictor_config"]
projected = not isinstance(tts.model.talker.code_predictor.small_to_mtp_projection, torch.nn.Identity)
for name, layers, extra in (("talker_decoder", cfg["talker_config"]["num_hidden_layers"], 0),
                            ("predictor_decoder", predictor_cfg["num_hidden_layers"], int(projected))):
    check.equal(f"{name}: Gemm layers (7 per layer{' + the projection' if extra else ''})", "count",
                export.read_param(out_dir / f"{name}.param").counts["Gemm"], 7 * layers + extra)
first_gemm = next(line for line in (out_dir / "predictor_decoder.param").read_text().splitlines()
                  if line.startswith("Gemm"))
print(" ".join(first_gemm.split()), "<- small_to_mtp_projection (chapter 09)" if projected else "<- q_proj of layer 0")

# %% [markdown]
# ### The one rewrite after pnnx: half-width rope tables
# pnnx fuses rope into ncnn's `RotaryEmbed` only when it sees Hugging Face's form
# `x·cos + rotate_half(x)·sin`, which uses full-width tables. ncnn's convention (its `RotaryEmbed` tests, and the
# Vulkan kernels) is half-width tables. So the wrapper takes half-width `cos`/`sin` and widens them with
# `cat([t, t], -1)` inside the graph; pnnx then mistakes the length axis of those inputs for a batch axis and writes
# the widening as a `Concat` of two `Split` copies. `export.drop_rope_widening` deletes those Concats, so the
# half-width inputs reach `RotaryEmbed` directly, and the manifest records the inputs as having no batch axis:

# %%
e = entries["talker_decoder"]
print("rewritten inputs:", e.get("rope_inputs_made_half_width"), "-> batch axes", e["input_batch_axes"])
check.equal("talker_decoder: no Concat left in front of RotaryEmbed", "count",
            export.read_param(out_dir / "talker_decoder.param").counts["Concat"], 0)

# %% [markdown]
# ## 4. Align each graph in ncnn, at two lengths
# `runtime.net.Net` loads a graph with fp16/bf16 off and the manifest's batch axes, and turns numpy into `ncnn.Mat`
# that own their memory (the binding's Mat only borrows a numpy buffer; appendix B shows what that does).
# Inputs are fresh seeded synthetic ones, at the two lengths of each module. Each module is compared with the metric
# and tolerance its spec carries (`spec.check`, the same comparison as chapter 02): relative L2 error for the decoders
# (their outputs grow through the layers), max |diff| for embeddings and heads, waveform SNR for the codec, cosine for
# the x-vector, latent relative error and then **codes** for Mimi.

# %%
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
            assert o.shape == r.shape, f"{name} @ {length}: ncnn shape {o.shape} vs torch {r.shape}"
        o_all, r_all = np.concatenate([o.ravel() for o in ours]), np.concatenate([r.ravel() for r in ref])
        label = f"{name} @ {length}"
        spec.check(label, o_all, r_all)
        results.append({"module": name, "length": "first length" if length == spec.lengths[0] else "second length",
                        "rel": check.rel_err(o_all, r_all)})
        if name == "mimi_encoder":
            codes_ncnn = rvq.split_rvq_encode(ours[0][0], rvq_tables)  # (16, T)
            wav = ins["wav"][0]  # (1, L)
            with torch.inference_mode():
                codes_torch = tts.model.speech_tokenizer.model.encode(
                    wav, torch.ones_like(wav, dtype=torch.long)).audio_codes[0]
            check.tokens_equal(f"mimi codes (ncnn + numpy RVQ vs torch encode) @ {length}", codes_ncnn,
                               codes_torch.numpy().T)

# %% [markdown]
# Relative L2 error of every module at both lengths, ncnn against torch. The decoders sit around 1e-7: fp32 with a
# different summation order. The codec decoder is the largest (a deep convolution stack with a final clamp), still
# over 100 dB on tiny checkpoints.

# %%
plots.errors(results, value="rel", group="module", series="length", threshold=1e-5,
             ylabel="relative L2 error, ncnn vs torch", title=f"ncnn fp32 vs torch wrappers ({ckpt})");

# %% [markdown]
# ## 5. Find where the error grows: probe every layer
# One number per graph says *whether* ncnn agrees with torch, not *where* they part. `qtts_lib.probe.probe` runs the
# torch wrapper with a forward hook on every `Linear`, `Conv1d`, `ConvTranspose1d`, `LayerNorm` and `Embedding`,
# runs the ncnn graph extracting the matching intermediate blobs from one Extractor, and pairs them. pnnx keeps no
# module paths in a `.param` (layers are named by op, `gemm_3`; blobs are numbers; look at the listing in section
# 3), so the pairing is **by op kind, then order, then shape**: the i-th `Linear` call is the i-th `Gemm` of the
# `.param`. A count or a shape that disagrees raises `PairingError` instead of pairing the wrong layers, and an
# activation that pnnx fused into a convolution (`conv1drelu_*`, the codec's final `conv1dclip_0`) is applied to
# torch's side first. The rule, and what it gives per graph, from the module's docstring:

# %%
print(probe.__doc__.split("How torch and ncnn pair.")[1].split("The ncnn side")[0].strip())

# %% [markdown]
# Each of the five deep graphs runs at its shorter length on fresh inputs. The limit is **1e-5 relative error at
# every layer**, the limit the decoders' final outputs already meet in section 4: fp32 with another summation order
# rounds each layer at about 1e-7, and even the 40-odd convolutions of the codec stay around 1e-6; fp16 anywhere
# would give about 1e-3, and a real bug (a rope or mask convention, one wrong weight) more. One limit fits all five
# because all five run in fp32 end to end.

# %%
LAYER_TOL = 1e-5
deep = ("talker_decoder", "predictor_decoder", "codec_decoder", "speaker_encoder", "mimi_encoder")
probes = {}
for name in (n for n in deep if n in entries):
    spec = modules.get(name)
    ins = spec.inputs(tts, min(spec.lengths), seed=2000)
    probes[name] = probe.probe(spec, out_dir, name, ins, threads=THREADS, tts=tts)
    worst = probes[name].worst
    check.at_most(f"{name}: worst layer {worst['label']} ({worst['layer']})", "rel", worst["rel"], LAYER_TOL)
pd.DataFrame([{"module": n, "taps": len(r.rows), "first tap": r.rows[0]["label"], "first rel": r.rows[0]["rel"],
               "worst tap": r.worst["label"], "ncnn layer": r.worst["layer"], "worst rel": r.worst["rel"],
               "output rel": r.rows[-1]["rel"]} for n, r in probes.items()]).set_index("module").style.format(
    {"first rel": "{:.2g}", "worst rel": "{:.2g}", "output rel": "{:.2g}"})

# %% [markdown]
# Error along depth, one panel per graph, every tap in forward order (ticks mark the stages: decoder layers, the
# codec's upsampling and decoder blocks, the speaker encoder's SE-Res2Net blocks, Mimi's SEANet convolutions and
# transformer layers). Read it for a *shape*: the transformer decoders stay flat (each layer rounds afresh and the
# residual stream does not amplify it), while the convolution stacks (codec decoder, Mimi's SEANet) climb steadily
# with depth. A bug shows as a step: the curve jumps at one tap and stays up; `result.first_above(LAYER_TOL)`
# names that tap.

# %%
title = (f"ncnn {metadata.version('ncnn')} fp32 vs torch {torch.__version__} wrappers, layer by layer "
         f"({ckpt}, {THREADS} threads)")
plots.layer_errors(probes, threshold=LAYER_TOL, title=title);

# %% [markdown]
# ### The same probe between two ncnn runs
# `probe.probe_ncnn` compares one graph under two configurations blob by blob, the output of *every* computing
# layer (nothing to pair: the blob names are the same). Chapter 10 uses it for Vulkan against CPU, the precision
# tiers for fp16 or int8 against fp32. Here one thread against the chapter's thread count, on the talker decoder:

# %%
spec = modules.get("talker_decoder")
ins = [t.numpy() for t in spec.inputs(tts, min(spec.lengths), seed=2000).values()]
threads_probe = probe.probe_ncnn(out_dir, "talker_decoder", ins, {"threads": 1}, {"threads": THREADS})
print(threads_probe.summary())
check.at_most(f"talker_decoder: 1 vs {THREADS} threads, worst of {len(threads_probe.rows)} blobs", "rel",
              threads_probe.worst["rel"], 1e-6)

# %% [markdown]
# ## Summary
# - By hand: trace, `pnnx <name>.pt input=... input2=... fp16=0`, read the `.param` (one layer a line), then
#   `ncnn.Net` → `load_param`/`load_model` → `create_extractor` → `input`/`extract`, compared with torch.
# - pnnx with two real input sets and `fp16=0` converts all ten wrappers with no leftover ops; the decoders get one
#   SDPA per layer and RotaryEmbed for q and k once the in-graph widening of the rope tables is removed.
# - `runtime.net.Net` is the only place where numpy becomes `ncnn.Mat`: owning copies, fp16/bf16 off, the batch
#   axes pnnx chose.
# - Every module matches its torch wrapper in ncnn at two lengths; Mimi's latent through the numpy split RVQ gives
#   the same codes as torch's encoder.
# - `qtts_lib.probe` pairs every Linear, convolution, LayerNorm and Embedding of a wrapper with its ncnn layer (by op
#   kind, order and shape): every layer of the five deep graphs stays under 1e-5; the decoders' error is flat along
#   depth, the convolution stacks' climbs slowly. `probe_ncnn` does the same between two ncnn configurations.
#
# **Artifacts left:** `models/<ckpt>/ncnn/*.param/.bin`, `manifest.json`, `mimi_rvq.npz`, the chapter report.
#
# **If your numbers differ**
# - *`load_param` fails* → a leftover pnnx op (section 3 names it); appendix A shows the usual suspects.
# - *Right at one length, wrong shape at the other* → the export saw one shape;
#   both `input=` and `input2=` must be given.
# - *Errors around 1e-3* → fp16 weights or arithmetic:
#   export with `fp16=0` and turn `use_fp16_*` off (runtime.net does).
# - *Random garbage that changes from run to run* → an `ncnn.Mat` made from a temporary numpy array (appendix B).
# - *A module's worst layer is over 1e-5* → the first tap above the limit (`probes[name].first_above(LAYER_TOL)`)
#   is where the port differs; everything before it is fine.
# - *`PairingError`* → pnnx fused, split or dropped a layer of that kind, or a wrapper calls one module twice: the
#   message names the kind and both counts (or the pair whose shapes differ).

# %%
check.table()
