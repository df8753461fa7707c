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
# # 02 · Split the model into ten exportable modules
# > Control flow stays in the host language; only tensor math goes into a graph.
#
# **You will:** meet the ten torch wrappers in `qtts_lib.modules` — eight graphs for generation and two encoders
# for cloning — see the rewrites each needs, and check every wrapper against the original model's blocks at two
# sequence lengths.
#
# **You will learn:** why `jit.trace` cannot carry the sampler, the per-step table choice or the prompt builder; which
# innocent-looking PyTorch idioms pnnx/ncnn cannot carry and what replaces them; why two lengths.
#
# **You need:** `models/<ckpt>/` (chapter 00; synthesized here if missing).
# **Leaves behind:** `data/reports/<ckpt>/02_split_modules.json`.

# %%
import inspect

import torch
from IPython.display import HTML, Markdown, display

from qtts_lib import check, checkpoint, modules, plots, reference, settings

ckpt = settings.checkpoint()
torch.set_num_threads(settings.threads())
report = check.begin("02_split_modules", ckpt)
tts = reference.load(checkpoint.ensure(ckpt), threads=settings.threads())
kind = tts.model.tts_model_type  # base | custom_voice | voice_design
has_speaker_encoder = tts.model.speaker_encoder is not None
NO_SPEAKER_ENCODER = (f"skipped speaker_encoder because a {kind} checkpoint has no speaker encoder "
                      f"({'built-in speakers' if kind == 'custom_voice' else 'voices described in words'} "
                      "take the x-vector's place)")
print(f"{ckpt}: {kind}, tts_model_size {tts.model.tts_model_size}")

# %% [markdown]
# ## 1. Where to cut
# A traced graph records one path through Python with the shapes it saw. Anything that branches on values
# (sampling, EOS, "which of the 15 tables this step"), grows a list, or builds a prompt from pieces is frozen or
# lost by the trace. So the host keeps: the tokenizer, the prompt builder, the sampler, the loop, the KV-cache
# bookkeeping and the RVQ argmin; the graphs get pure tensor functions with every varying quantity (mask, rope
# tables, ids) passed in as an input:

# %%
def describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


rows = []
for spec in modules.all_specs():
    if spec.name == "speaker_encoder" and not has_speaker_encoder:
        print(NO_SPEAKER_ENCODER)
        continue
    ins = spec.inputs(tts, spec.lengths[0], seed=0)
    outs = spec.run_original(tts, ins)
    rows.append(f"<tr><td><code>{spec.name}</code></td><td>{spec.summary}</td>"
                f"<td>{'<br>'.join(f'{k} {describe(v)}' for k, v in ins.items())}</td>"
                f"<td>{'<br>'.join(f'{k} {describe(v)}' for k, v in list(outs.items())[:3])}"
                f"{' …' if len(outs) > 3 else ''}</td></tr>")
display(HTML("<table><tr><th>module</th><th>what</th><th>inputs (first length)</th><th>outputs</th></tr>"
             + "".join(rows) + "</table>"))

# %% [markdown]
# The code predictor reads the talker's hidden state, so the `predictor_decoder` graph takes rows of the talker's
# width and returns rows of the code predictor's own (it starts with the code predictor's input projection,
# `small_to_mtp_projection`, here an `Identity`):

# %%
talker_width = tts.model.talker.config.hidden_size
predictor_width = tts.model.talker.code_predictor.config.hidden_size
print(f"talker hidden {talker_width}, code predictor hidden {predictor_width}, small_to_mtp_projection: "
      f"{type(tts.model.talker.code_predictor.small_to_mtp_projection).__name__}")
spec = modules.get("predictor_decoder")
ins = spec.inputs(tts, spec.lengths[0], seed=0)
with torch.inference_mode():
    hidden = spec.build(tts)(*ins.values())  # (1, L, predictor hidden)
check.equal("predictor_decoder: input width = talker hidden", "width", ins["inputs_embeds"].shape[-1], talker_width)
check.equal("predictor_decoder: output width = code predictor hidden", "width", hidden.shape[-1], predictor_width)

# %% [markdown]
# ## 2. The rewrites, each shown equal in torch
# Each wrapper reuses the original weights and re-expresses the computation. The last column names the pitfall each
# rewrite avoids, reproduced on the pinned pnnx in [appendix A][A] (its section number); here we only prove
# that each rewrite computes the same thing.
#
# | rewrite | replaces | because | pitfall |
# |---|---|---|---|
# | `k.repeat_interleave(n, dim=-3)` (GQA) | HF `repeat_kv` | `repeat_kv` leaves `pnnx.Expression`¹ | [A §2][A] |
# | rope `cos`/`sin` (head_dim/2) inputs | `rotary_emb` | an in-graph `arange` freezes the length | chapter 04 |
# | 2-D additive mask `(len, len)` input | HF's 4-D mask (vmap) | the SDPA form; HF's won't trace | |
# | int32 ids straight into the embedding | int64 ids | ncnn `Embed` reads int32; no Reshape | |
# | one fused `15·2048` table² | 15 tables | one Embed, no per-group graph | [A §3, §5][A] |
# | `ones(1, 15) @ x.reshape(1, 15, -1)`³ | `stack(...).sum(0)` | Reduction with empty axes: SIGFPE | [A §3][A] |
# | `F.pad(x, (0, -r))` | `x[..., :-r]` | pnnx silently drops the slice | [A §4][A] |
# | fixed left padding in causal convs | `ceil` on `x.shape[-1]` | the trace bakes in the length | [A §6][A] |
# | constants folded before trace | computed per call | fewer ops, none shape-dependent | |
#
# ¹ expand + reshape, and the .param does not load; `repeat_interleave` folds into one ncnn SDPA. ² ids offset by
# `group·2048` on the host; an uneven `chunk` of the codes would still split wrongly in ncnn. ³ the leading 1 keeps
# pnnx from taking the 15 for a batch axis. The rope tables are chapter 04's one `.param` rewrite; the folded
# constant is the codec's `embedding_sum / usage`.
#
# Two more pitfalls are not rewrites of a wrapper: pnnx writes fp16 weights unless told `fp16=0` ([appendix A][A]
# §7; chapter 04 exports with it), and the ncnn Python binding can feed a correct graph freed memory or pick a
# lower precision by itself (borrowed `ncnn.Mat` buffers, the two forms of `extract`, the fp16 defaults of `Option`:
# [appendix B][B]).
#
# [A]: appendix_a_pnnx_pitfalls.ipynb
# [B]: appendix_b_ncnn_binding_pitfalls.ipynb

# %%
g = torch.Generator().manual_seed(0)
x = torch.randn(1, 2, 9, 16, generator=g)  # (batch, kv_heads, seq_len, head_dim)
from qwen_tts.core.models.modeling_qwen3_tts import repeat_kv

check.equal("repeat_interleave(dim=-3) == HF repeat_kv", "max_abs",
            (x.repeat_interleave(4, dim=-3) - repeat_kv(x, 4)).abs().max().item(), 0.0)
y = torch.randn(1, 8, 50, generator=g)
check.equal("F.pad(x, (0, -3)) == x[..., :-3]", "max_abs",
            (torch.nn.functional.pad(y, (0, -3)) - y[..., :-3]).abs().max().item(), 0.0)
parts = [torch.randn(4, 8, generator=g) for _ in range(15)]
stacked = torch.stack(parts).sum(0)
via_matmul = (torch.ones(1, 15) @ torch.stack(parts).reshape(1, 15, -1)).reshape(4, 8)
check.close("ones @ x == stack(...).sum(0)", via_matmul, stacked, max_abs=1e-6)
tables = [torch.randn(2048, 8, generator=g) for _ in range(15)]
codes = torch.randint(0, 2048, (15, 5), generator=g)
fused = torch.cat(tables)[(codes + torch.arange(15)[:, None] * 2048).int()]
separate = torch.stack([tables[i][codes[i]] for i in range(15)])
check.equal("fused table + group offsets == 15 tables", "max_abs", (fused - separate).abs().max().item(), 0.0)

# %% [markdown]
# The rewrites of each module, as recorded in its spec:

# %%
display(Markdown("\n".join(f"- **`{s.name}`**: " + "; ".join(s.rewrites) for s in modules.all_specs())))

# %% [markdown]
# The decoder wrapper, in full (the talker and the code predictor share it):

# %%
print(inspect.getsource(modules.get("talker_decoder").build(tts).__class__))

# %% [markdown]
# ## 3. Check every wrapper against the original, at two lengths
# A wrapper that froze a length still matches at the length it was written for; only a second length shows it.
# Inputs are synthetic (seeded): hidden states ~ N(0, 1), random valid ids and codes, noise-like waveforms.
# Each module's spec carries its metric and tolerance (chapter 04 compares with the same ones): relative L2 error for
# the decoders and the Mimi latent (unit-Gaussian inputs grow through the layers, so an absolute bound would mislead),
# max |diff| for embeddings and heads, SNR for the waveform, cosine for the x-vector.

# %%
print("\n".join(f"{s.name:20} {s.metric:8} {s.tolerance:g}" for s in modules.all_specs()))  # each spec's own
results = []
for spec in modules.all_specs():
    if spec.name == "speaker_encoder" and not has_speaker_encoder:
        print(NO_SPEAKER_ENCODER)
        continue
    wrapper = spec.build(tts)
    for length in spec.lengths:
        ins = spec.inputs(tts, length, seed=length)
        with torch.inference_mode():
            ref = spec.run_original(tts, ins)
            ours = wrapper(*ins.values())
        ours = ours if isinstance(ours, (tuple, list)) else (ours,)
        assert len(ours) == len(ref), f"{spec.name}: {len(ours)} outputs vs {len(ref)}"
        for (out_name, r), o in zip(ref.items(), ours):
            assert tuple(o.shape) == tuple(r.shape), f"{spec.name}.{out_name}: {tuple(o.shape)} vs {tuple(r.shape)}"
        o_all = torch.cat([o.reshape(-1) for o in ours])
        r_all = torch.cat([r.reshape(-1) for r in ref.values()])
        name = f"{spec.name} @ {length}"
        row = spec.check(name, o_all, r_all)
        results.append({"module": spec.name, "length": f"length {'a' if length == spec.lengths[0] else 'b'}",
                        "rel": check.rel_err(o_all, r_all), "metric": spec.metric, "value": row["value"]})

# %% [markdown]
# One picture for all of them: relative L2 error per module at both lengths (a bar at the floor means bitwise equal).
# The wrappers reuse the original weights and mostly the same op order, so many are exactly equal; the codec decoder
# and the encoders reorder sums (folded codebooks, convolutions) and land at fp32 rounding.

# %%
plots.errors(results, value="rel", group="module", series="length", threshold=1e-5,
             ylabel="relative L2 error vs original", title=f"wrappers vs original blocks ({ckpt})");

# %% [markdown]
# ## Summary
# - Ten modules: text/codec embeddings, talker decoder, codec head, predictor decoder (taking the talker's width),
#   fused predictor embeddings, 15 predictor heads, codec decoder; speaker encoder and Mimi encoder for cloning.
# - Mask, rope tables and ids are inputs; GQA by `repeat_interleave(dim=-3)`; fused tables with offsets; sums by
#   matmul; crops by negative pad; static padding; constants folded. Each rewrite equals the original idiom in torch;
#   appendix A shows each original idiom failing in pnnx/ncnn.
# - Every wrapper matches the original blocks at two lengths (table above); chapter 04 exports them.
#
# **Artifacts left:** `data/reports/<ckpt>/02_split_modules.json`.
#
# **If your numbers differ**
# - *A decoder matches at one length only* → something derived from `x.shape` was frozen;
#   look for Python ints from shapes.
# - *Decoders off by ~1e-1* → mask or rope table layout (full vs half width, or a transposed table).
# - *Codec SNR low* → the sliding-window mask is off by one, or a codebook was folded without its projection.
# - *predictor_decoder off where the two widths printed in section 1 differ* → `small_to_mtp_projection` not
#   applied (chapter 09).

# %%
check.table()
