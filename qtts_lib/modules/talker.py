"""Talker and code-predictor wrappers: embeddings, decoders, heads. Introduced in 02.

Seven graphs, all tensor math; the generate loop (sampling, which table per step,
prompt building) stays on the host. The decoders take the mask and half-width rope
tables as inputs, so one graph serves every length and position.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import ModuleSpec, common, register

# Qwen2 tokenizer: ids below this are ordinary text; the specials the prompt uses sit above it.
TEXT_SPECIAL_START = 151643
TEXT_SPECIALS = (151644, 151645, 151671, 151672, 151673)


def _talker(tts) -> nn.Module:
    return tts.model.talker


def _predictor(tts) -> nn.Module:
    return tts.model.talker.code_predictor


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as Qwen3TTSRMSNorm, so fp32 results match bit for bit.
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    # Written in HF's rotate_half form on full-width tables so pnnx fuses it into one ncnn
    # RotaryEmbed; the widening cat is removed from the .param after export (chapter 04), so
    # the graph takes half-width tables, ncnn's convention. `half` is a python constant:
    # x.shape[-1] under trace becomes aten::size and may survive as a pnnx.Expression.
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Decoder(nn.Module):
    """A stack of Qwen3 decoder layers + final norm, attention written out. Introduced in 02.

    Holds the original ModuleList and norm once and reads their Linear/weight tensors,
    so nothing is copied and no submodule is registered twice."""

    def __init__(self, layers: nn.ModuleList, norm: nn.Module, cfg, proj: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = layers
        self.norm = norm
        self.proj = proj if proj is not None and not isinstance(proj, nn.Identity) else None
        self.heads: int = cfg.num_attention_heads
        self.kv_heads: int = cfg.num_key_value_heads
        self.head_dim: int = cfg.head_dim
        self.n_rep: int = self.heads // self.kv_heads
        self.eps: float = cfg.rms_norm_eps

    def _attn(self, a: nn.Module, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> torch.Tensor:
        hd, half = self.head_dim, self.head_dim // 2
        q = _rms(a.q_proj(x).view(1, -1, self.heads, hd), a.q_norm.weight, self.eps).transpose(1, 2)
        k = _rms(a.k_proj(x).view(1, -1, self.kv_heads, hd), a.k_norm.weight, self.eps).transpose(1, 2)
        v = a.v_proj(x).view(1, -1, self.kv_heads, hd).transpose(1, 2)
        q, k = _rope(q, cos, sin, half), _rope(k, cos, sin, half)
        # HF's expand+reshape (repeat_kv) leaves pnnx.Expression; repeat_interleave maps to one op.
        k = k.repeat_interleave(self.n_rep, dim=-3)
        v = v.repeat_interleave(self.n_rep, dim=-3)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return a.o_proj(o.transpose(1, 2).reshape(1, -1, self.heads * hd))

    def forward(self, inputs_embeds: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        x = inputs_embeds if self.proj is None else self.proj(inputs_embeds)
        for layer in self.layers:
            h = _rms(x, layer.input_layernorm.weight, self.eps)
            x = x + self._attn(layer.self_attn, h, mask, cos, sin)
            h = _rms(x, layer.post_attention_layernorm.weight, self.eps)
            m = layer.mlp
            x = x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))
        return _rms(x, self.norm.weight, self.eps)


class TextEmbed(nn.Module):
    """int32 text ids -> talker hidden: text_embedding then text_projection. Introduced in 02."""

    def __init__(self, emb: nn.Embedding, proj: nn.Module) -> None:
        super().__init__()
        self.emb = emb
        self.fc1 = proj.linear_fc1
        self.fc2 = proj.linear_fc2

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # A leading batch axis makes pnnx emit Gemm; on the bare (n, hidden) blob it wrote a
        # Reshape + InnerProduct pair that collapses the n rows into one (chapter 04).
        x = self.emb(ids).unsqueeze(0)
        return self.fc2(F.silu(self.fc1(x))).squeeze(0)


class PassThrough(nn.Module):
    """One original submodule called as is: an nn.Embedding over int32 ids, or the codec head
    over (n, hidden). The wrapper only gives pnnx a graph with that one op. Introduced in 02."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


class PredictorHeads(nn.Module):
    """(1, hidden) -> 15 logits (1, 2048), one per code group; the host picks the one it needs. Introduced in 02."""

    def __init__(self, heads: nn.ModuleList) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(h(x) for h in self.heads)


# ---------------------------------------------------------------- inputs
def _decoder_inputs(cfg, hidden: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = common.seeded(seed)
    cos, sin = common.rope_tables(cfg.head_dim, cfg.rope_theta, 0, length)
    return {
        "inputs_embeds": torch.randn(1, length, hidden, generator=g),
        "mask": common.causal_mask(length),
        "cos": cos,
        "sin": sin,
    }


def _text_ids(tts, length: int, seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, TEXT_SPECIAL_START, (length,), generator=common.seeded(seed))
    n = min(len(TEXT_SPECIALS), length // 2)
    ids[:n] = torch.tensor(TEXT_SPECIALS[:n])
    return {"ids": ids.to(torch.int32)}


def _codec_ids(tts, length: int, seed: int) -> dict[str, torch.Tensor]:
    vocab = _talker(tts).config.vocab_size
    return {"ids": torch.randint(0, vocab, (length,), generator=common.seeded(seed), dtype=torch.int32)}


def _predictor_ids(tts, length: int, seed: int) -> dict[str, torch.Tensor]:
    cfg = _predictor(tts).config
    code = torch.randint(0, cfg.vocab_size, (length,), generator=common.seeded(seed))
    group = torch.arange(length) % (cfg.num_code_groups - 1)
    return {"ids": (group * cfg.vocab_size + code).to(torch.int32)}


def _hidden(rows: int, hidden: int, seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(rows, hidden, generator=common.seeded(seed))}


# ---------------------------------------------------------------- references
def _run_layers(model: nn.Module, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                text_pos: torch.Tensor) -> torch.Tensor:
    """Call each original layer as its Model.forward does, with the original rotary module."""
    pe = model.rotary_emb(x, pos)
    mask4 = mask[None, None]
    cache_position = text_pos[0]
    with torch.no_grad():
        for layer in model.layers:
            x = layer(x, attention_mask=mask4, position_ids=text_pos, past_key_values=None,
                      use_cache=False, cache_position=cache_position, position_embeddings=pe)[0]
        return model.norm(x)


def _talker_decoder_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    x = inputs["inputs_embeds"]
    pos = torch.arange(x.shape[1]).view(1, 1, -1).expand(3, 1, -1)  # mrope: t/h/w rows equal for text & audio
    return {"hidden": _run_layers(_talker(tts).model, x, inputs["mask"], pos, pos[0])}


def _predictor_decoder_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    cp = _predictor(tts)
    with torch.no_grad():
        x = cp.small_to_mtp_projection(inputs["inputs_embeds"])
    pos = torch.arange(x.shape[1]).view(1, -1)
    return {"hidden": _run_layers(cp.model, x, inputs["mask"], pos, pos)}


@torch.no_grad()
def _text_embed_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    t = _talker(tts)
    return {"embeds": t.text_projection(t.model.text_embedding(inputs["ids"].long()))}


@torch.no_grad()
def _codec_embed_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"embeds": _talker(tts).model.codec_embedding(inputs["ids"].long())}


@torch.no_grad()
def _predictor_embeds_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    cp = _predictor(tts)
    ids = inputs["ids"].long()
    group, code = ids // cp.config.vocab_size, ids % cp.config.vocab_size
    rows = [cp.model.codec_embedding[int(gi)](ci[None]) for gi, ci in zip(group, code)]
    return {"embeds": torch.cat(rows, dim=0)}


@torch.no_grad()
def _codec_head_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"logits": _talker(tts).codec_head(inputs["x"])}


@torch.no_grad()
def _predictor_heads_ref(tts, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"out{i}": h(inputs["x"]) for i, h in enumerate(_predictor(tts).lm_head)}


# ---------------------------------------------------------------- builders
def _eval(m: nn.Module) -> nn.Module:
    return m.float().eval()


def _build_talker_decoder(tts) -> nn.Module:
    m = _talker(tts).model
    return _eval(Decoder(m.layers, m.norm, m.config))


def _build_predictor_decoder(tts) -> nn.Module:
    cp = _predictor(tts)
    return _eval(Decoder(cp.model.layers, cp.model.norm, cp.config, cp.small_to_mtp_projection))


def _build_predictor_embeds(tts) -> nn.Module:
    tables = [e.weight.detach() for e in _predictor(tts).model.codec_embedding]
    return _eval(PassThrough(nn.Embedding.from_pretrained(torch.cat(tables, dim=0), freeze=True)))


DECODER_REWRITES = [
    "attention written out (q/k/v proj, per-head RMSNorm, rope, SDPA, o_proj): "
    "the HF attention dispatch does not trace",
    "GQA via repeat_interleave(dim=-3) -> one ncnn SDPA; HF expand+reshape (repeat_kv) leaves pnnx.Expression",
    "rope tables are inputs at half width (ncnn RotaryEmbed convention); "
    "built in-graph they need arange and freeze the length",
    "2-D additive mask input (ncnn SDPA) instead of HF's 4-D mask built from cache_position",
    "RMSNorm as plain ops in the original op order (bit-exact in fp32)",
]

register(ModuleSpec(
    name="talker_text_embed",
    build=lambda tts: _eval(TextEmbed(_talker(tts).model.text_embedding, _talker(tts).text_projection)),
    inputs=_text_ids,
    run_original=_text_embed_ref,
    lengths=(7, 3),
    summary="text ids (n,) int32 -> (n, hidden): text_embedding, then text_projection (Linear-SiLU-Linear)",
    rewrites=["int32 ids straight into Embedding (ncnn Embed takes int ids; no cast/reshape ops)",
              "ResizeMLP inlined as fc1 -> silu -> fc2 on the original Linears"],
))

register(ModuleSpec(
    name="talker_codec_embed",
    build=lambda tts: _eval(PassThrough(_talker(tts).model.codec_embedding)),
    inputs=_codec_ids,
    run_original=_codec_embed_ref,
    lengths=(7, 3),
    summary="codec ids (n,) int32 -> (n, hidden): the talker's codec_embedding (group 0 and control tokens)",
    rewrites=["int32 ids straight into Embedding"],
))

register(ModuleSpec(
    name="talker_decoder",
    build=_build_talker_decoder,
    inputs=lambda tts, length, seed: _decoder_inputs(_talker(tts).config, _talker(tts).config.hidden_size,
                                                     length, seed),
    run_original=_talker_decoder_ref,
    metric="rel",
    lengths=(37, 5),
    summary="talker layers + norm: embeds (1, L, hidden), mask (L, L), cos/sin (L, hd/2) -> (1, L, hidden)",
    rewrites=DECODER_REWRITES + [
        "interleaved mrope -> plain rope: with the 3 position rows equal (text and audio) "
        "the sections select identical tables",
    ],
))

register(ModuleSpec(
    name="talker_codec_head",
    build=lambda tts: _eval(PassThrough(_talker(tts).codec_head)),
    inputs=lambda tts, length, seed: _hidden(length, _talker(tts).config.hidden_size, seed),
    run_original=_codec_head_ref,
    lengths=(5, 2),
    summary="(n, hidden) -> (n, 3072) logits of code group 0 and control tokens",
))

register(ModuleSpec(
    name="predictor_decoder",
    build=_build_predictor_decoder,
    inputs=lambda tts, length, seed: _decoder_inputs(_predictor(tts).config, _talker(tts).config.hidden_size,
                                                     length, seed),
    run_original=_predictor_decoder_ref,
    metric="rel",
    lengths=(16, 2),
    summary=("code-predictor layers + norm (small_to_mtp_projection first when not Identity), "
             "same I/O as talker_decoder"),
    rewrites=DECODER_REWRITES,
))

register(ModuleSpec(
    name="predictor_embeds",
    build=_build_predictor_embeds,
    inputs=_predictor_ids,
    run_original=_predictor_embeds_ref,
    lengths=(7, 3),
    summary="ids (n,) int32, offset by group*2048 (group 0..14) -> (n, hidden) from one fused table",
    rewrites=["fused 15x2048 table with group offsets: one Embed instead of 15 graphs or a host-side table switch",
              "int32 ids"],
))

register(ModuleSpec(
    name="predictor_heads",
    build=lambda tts: _eval(PredictorHeads(_predictor(tts).lm_head)),
    inputs=lambda tts, length, seed: _hidden(length, _predictor(tts).config.hidden_size, seed),
    run_original=_predictor_heads_ref,
    lengths=(1, 4),  # the loop feeds one row per step; a second row count proves no shape was frozen
    summary="(n, hidden) -> 15 logits (n, 2048), out0..out14, one per code group 1..15",
    rewrites=["all 15 lm_heads in one graph with 15 outputs; the host reads the one of the current step"],
))
