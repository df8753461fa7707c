"""codec_decoder: 16 code rows -> 24 kHz waveform (Qwen3TTSTokenizerV2Decoder). Introduced in 02.

Graph inputs
  semantic (1, T) int32      codebook 0, values in [0, 2048)
  acoustic (15*T,) int32     codebooks 1..15, each code offset by g*2048 (g = 0..14 for
                             codebooks 1..15), flattened group-major: index g*T + t
  mask     (T, T) float32    additive sliding-window causal mask, common.causal_mask(T, window=72)
  cos, sin (T, head_dim/2)   rope tables for positions 0..T-1
Output
  wav      (1, 1, 1920*T)    clamped to [-1, 1], equal to `decoder(codes)` (one shot, no chunking)

The acoustic layout lets one Embed over a fused 15*2048-row table dequantize all 15
groups at once; the host adds the group offsets when it packs the codes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.codec.parts import pack_codes
from . import ModuleSpec, common, register

N_ACOUSTIC = 15


def _codebook(vq: nn.Module) -> torch.Tensor:
    cb = vq._codebook
    return cb.embedding_sum / cb.cluster_usage.clamp(min=cb.epsilon)[:, None]


def _vq_out(vq: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    # project_out is Identity here (codebook_dim == dimension) but fold it if a checkpoint has one
    return vq.project_out(rows)


class CausalConv(nn.Module):
    """Stride-1 CausalConvNet with its left pad fixed; the stock ceil arithmetic would bake T into the trace."""

    def __init__(self, src: nn.Module):
        super().__init__()
        assert src.stride == 1, "only stride-1 causal convs occur in the decoder"
        self.conv = src.conv
        self.pad = src.padding  # kernel - stride; the right "extra" padding is always 0 at stride 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))


class TransConv(nn.Module):
    """CausalTransConvNet; the right trim is a negative pad because pnnx drops `x[..., :-r]` with dynamic T."""

    def __init__(self, src: nn.Module):
        super().__init__()
        self.conv = src.conv
        self.trim = src.right_pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return F.pad(x, (0, -self.trim)) if self.trim > 0 else x


class Snake(nn.Module):
    """SnakeBeta with exp(alpha) and 1/(exp(beta)+1e-9) folded into constants."""

    def __init__(self, src: nn.Module):
        super().__init__()
        with torch.no_grad():
            self.register_buffer("a", src.alpha.exp()[None, :, None].clone())
            self.register_buffer("ib", (1.0 / (src.beta.exp() + src.no_div_by_zero))[None, :, None].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sin(x * self.a)
        return x + self.ib * (s * s)  # s*s instead of pow(2): one BinaryOp less to convert


class ConvNeXt(nn.Module):
    def __init__(self, src: nn.Module):
        super().__init__()
        self.dwconv = CausalConv(src.dwconv)
        self.norm, self.pwconv1, self.act, self.pwconv2 = src.norm, src.pwconv1, src.act, src.pwconv2
        self.gamma = src.gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResUnit(nn.Module):
    def __init__(self, src: nn.Module):
        super().__init__()
        self.act1, self.conv1 = Snake(src.act1), CausalConv(src.conv1)
        self.act2, self.conv2 = Snake(src.act2), CausalConv(src.conv2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class CodecTransformerLayer(nn.Module):
    """Pre-norm transformer layer with LayerScale; attention is SDPA with the mask input.
    Shared with the Mimi encoder, which only swaps the norm (mimi.MimiTransformerLayer)."""

    def __init__(self, src: nn.Module, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        assert heads == kv_heads, "the 12 Hz codec has no GQA"
        a = src.self_attn
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = a.q_proj, a.k_proj, a.v_proj, a.o_proj
        self.mlp = src.mlp
        self.ln1, self.ln2 = src.input_layernorm, src.post_attention_layernorm
        self.s_attn, self.s_mlp = src.self_attn_layer_scale.scale, src.mlp_layer_scale.scale
        self.heads, self.head_dim = heads, head_dim

    def _norm(self, ln: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), ln.weight, ln.variance_epsilon)  # -> ncnn RMSNorm

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self._norm(self.ln1, x)
        t = h.shape[1]
        q = self.q_proj(h).view(1, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(1, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(1, t, self.heads, self.head_dim).transpose(1, 2)
        q, k = common.rotate_half_pairs(q, cos, sin), common.rotate_half_pairs(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.s_attn * self.o_proj(o.transpose(1, 2).reshape(1, t, -1))
        return x + self.s_mlp * self.mlp(self._norm(self.ln2, x))


class CodecDecoder(nn.Module):
    """Introduced in 02. Qwen3TTSTokenizerV2Decoder.forward with export-friendly dequantization."""

    def __init__(self, dec: nn.Module):
        super().__init__()
        cfg = dec.config
        q = dec.quantizer
        with torch.no_grad():
            # output_proj (1x1 conv, no bias) is linear, so it folds into every table row; each
            # acoustic row then carries its share and the 15 looked-up rows just add up.
            w_first = q.rvq_first.output_proj.weight[:, :, 0]
            w_rest = q.rvq_rest.output_proj.weight[:, :, 0]
            assert q.rvq_first.output_proj.bias is None and q.rvq_rest.output_proj.bias is None
            sem = _vq_out(q.rvq_first.vq.layers[0], _codebook(q.rvq_first.vq.layers[0])) @ w_first.T
            ac = torch.cat([_vq_out(layer, _codebook(layer)) for layer in q.rvq_rest.vq.layers]) @ w_rest.T
            # a project_out bias would be added once per looked-up row, as in the original sum
        self.sem_embed = nn.Embedding.from_pretrained(sem.clone(), freeze=True)
        self.ac_embed = nn.Embedding.from_pretrained(ac.clone(), freeze=True)
        self.register_buffer("ones", torch.ones(1, N_ACOUSTIC))
        self.pre_conv = CausalConv(dec.pre_conv)
        pt = dec.pre_transformer
        self.input_proj, self.output_proj, self.norm = pt.input_proj, pt.output_proj, pt.norm
        self.layers = nn.ModuleList(
            CodecTransformerLayer(layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
            for layer in pt.layers
        )
        self.upsample = nn.Sequential(*[m for tc, cn in dec.upsample for m in (TransConv(tc), ConvNeXt(cn))])
        blocks: list[nn.Module] = [CausalConv(dec.decoder[0])]
        for blk in dec.decoder[1:-2]:
            b = blk.block
            blocks += [Snake(b[0]), TransConv(b[1]), *[ResUnit(u) for u in b[2:]]]
        blocks += [Snake(dec.decoder[-2]), CausalConv(dec.decoder[-1])]
        self.decoder = nn.Sequential(*blocks)
        self.dim = sem.shape[1]

    def forward(
        self, semantic: torch.Tensor, acoustic: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        e = self.sem_embed(semantic)  # (1, T, D)
        # (1, 15, T*D): group-major rows; the leading 1 keeps pnnx from taking the 15 for a batch axis
        a = self.ac_embed(acoustic).reshape(1, N_ACOUSTIC, -1)
        e = e + (self.ones @ a).reshape(1, -1, self.dim)  # sum over groups without stack/unbind
        h = self.pre_conv(e.transpose(1, 2)).transpose(1, 2)
        h = self.input_proj(h)
        for layer in self.layers:
            h = layer(h, mask, cos, sin)
        h = self.output_proj(F.rms_norm(h, (h.shape[-1],), self.norm.weight, self.norm.variance_epsilon))
        wav = self.decoder(self.upsample(h.transpose(1, 2)))
        return wav.clamp(-1.0, 1.0)


# ---------------------------------------------------------------- registry
def _decoder(tts) -> nn.Module:
    return tts.model.speech_tokenizer.model.decoder


def build(tts) -> nn.Module:
    return CodecDecoder(_decoder(tts)).eval()


def unpack_codes(semantic: torch.Tensor, acoustic: torch.Tensor, codebook_size: int = 2048) -> torch.Tensor:
    """Inverse of `runtime.codec.pack_codes`, as a (16, T) int64 tensor for the original decoder."""
    t = semantic.shape[-1]
    off = torch.arange(N_ACOUSTIC, dtype=torch.int64)[:, None] * codebook_size
    return torch.cat([semantic.long().reshape(1, t), acoustic.long().reshape(N_ACOUSTIC, t) - off])


def inputs(tts, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    cfg = _decoder(tts).config
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_quantizers, length), generator=common.seeded(seed))
    sem, ac = (torch.from_numpy(a) for a in pack_codes(codes.T.numpy(), cfg.codebook_size))
    cos, sin = common.rope_tables(cfg.head_dim, cfg.rope_theta, 0, length)
    mask = common.causal_mask(length, window=cfg.sliding_window)
    return {"semantic": sem, "acoustic": ac, "mask": mask, "cos": cos, "sin": sin}


@torch.no_grad()
def run_original(tts, inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    codes = unpack_codes(inp["semantic"], inp["acoustic"], _decoder(tts).config.codebook_size)
    return {"wav": _decoder(tts)(codes[None])}


SPEC = register(
    ModuleSpec(
        name="codec_decoder",
        build=build,
        inputs=inputs,
        metric="snr_db",
        tolerance=60.0,
        run_original=run_original,
        lengths=(25, 44),
        summary="16 codebooks (T frames) -> 1920*T samples: dequantize, pre-conv, sliding-window transformer, "
        "ConvNeXt upsampler, SnakeBeta decoder blocks, clamp",
        rewrites=[
            "Dequantization folded into two tables: semantic codebook @ output_proj, and one 15x2048-row "
            "acoustic table (each group's codebook @ output_proj); codes arrive pre-offset by group*2048, so one "
            "Embed plus ones(1,15) @ rows replaces the per-group loop (pnnx cannot convert unbind/stack-sum).",
            "Sliding-window mask (window 72: key j visible when i-72 < j <= i) and rope cos/sin are graph "
            "inputs: HF mask code does not trace, arange in the graph leaves unconvertible ops.",
            "Causal conv left pad is a constant: at stride 1 the original's ceil arithmetic always gives 0 extra "
            "padding, but traced it would bake T into the graph.",
            "Transposed-conv right trim as F.pad(x, (0, -r)): pnnx silently drops x[..., :-r] with dynamic T.",
            "SnakeBeta exp(alpha), 1/(exp(beta)+eps) precomputed; RMSNorm as F.rms_norm; attention as SDPA.",
        ],
    )
)
