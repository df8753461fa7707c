"""mimi_encoder: 24 kHz wav -> 12.5 Hz latent before quantization (the Mimi encoder of the 12 Hz tokenizer).
Introduced in 02.

Graph inputs
  wav      (1, 1, L) float32, L a multiple of 1920 (the host pads)
  mask     (T', T') float32   causal mask at the transformer's 25 Hz rate, T' = L/960 = 2T
  cos, sin (T', head_dim/2)
Graph output
  latent   (1, D, T), T = L/1920: what MimiModel._encode_frame hands to quantizer.encode

The residual vector quantizer stays on the host (`split_rvq_encode`, numpy): an argmin
chain over 16 codebooks is cheap and needs no graph.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.audio import rvq
from ..runtime.audio.wav import SAMPLES_PER_FRAME
from . import ModuleSpec, codec, common, register

HOP = SAMPLES_PER_FRAME // 2  # samples per step of the encoder transformer (25 Hz)

# transformers 4.57.3 builds MimiTransformerModel's mask with create_causal_mask, so with
# sdpa/eager attention the config's sliding_window (250) is never applied: the reference is
# plainly causal. Only flash_attention_2 would window. We match the reference.
WINDOW: int | None = None


class MConv(nn.Module):
    """Causal MimiConv1d with constant pads: padding_total lives in a buffer and the extra right pad
    (ceil arithmetic) is 0 whenever L is a multiple of the strides, which the host guarantees."""

    def __init__(self, src: nn.Module):
        super().__init__()
        assert src.causal
        self.conv = src.conv
        self.pad = int(src.padding_total)
        self.mode = src.pad_mode  # "constant" in the encoder, "replicate" in the downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0), mode=self.mode))


class ResBlock(nn.Module):
    def __init__(self, src: nn.Module):
        super().__init__()
        assert isinstance(src.shortcut, nn.Identity)
        self.block = nn.Sequential(*[MConv(m) if hasattr(m, "padding_total") else m for m in src.block])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class MimiTransformerLayer(codec.CodecTransformerLayer):
    """MimiTransformerLayer: the codec decoder's layer with LayerNorm instead of RMSNorm
    (SDPA with the mask input, LayerScale, GELU MLP). Introduced in 02."""

    def _norm(self, ln: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return ln(x)


class MimiEncoder(nn.Module):
    """Introduced in 02. SEANet encoder -> transformer (25 Hz) -> stride-2 downsample (12.5 Hz)."""

    def __init__(self, enc: nn.Module):
        super().__init__()
        cfg = enc.config
        self.encoder = nn.Sequential(
            *[MConv(m) if hasattr(m, "padding_total") else ResBlock(m) if hasattr(m, "block") else m
              for m in enc.encoder.layers]
        )
        self.layers = nn.ModuleList(
            MimiTransformerLayer(layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
            for layer in enc.encoder_transformer.layers
        )
        self.downsample = MConv(enc.downsample)

    def forward(self, wav: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.encoder(wav).transpose(1, 2)
        for layer in self.layers:
            h = layer(h, mask, cos, sin)
        return self.downsample(h.transpose(1, 2))


# ---------------------------------------------------------------- host-side RVQ
def rvq_tables(tts) -> dict[str, np.ndarray]:
    """Introduced in 02. What split_rvq_encode needs: input projections and the first 16 codebooks."""
    model = tts.model.speech_tokenizer.model
    q = model.encoder.quantizer
    n_ac = model.encoder_valid_num_quantizers - q.num_semantic_quantizers

    def cbs(rvq: nn.Module, n: int) -> np.ndarray:
        return np.stack([common.as_numpy(layer.codebook.embed) for layer in rvq.layers[:n]]).astype(np.float32)

    sem, ac = q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer
    return {
        "semantic_in": common.as_numpy(sem.input_proj.weight[:, :, 0]).astype(np.float32),
        "semantic_codebooks": cbs(sem, q.num_semantic_quantizers),
        "acoustic_in": common.as_numpy(ac.input_proj.weight[:, :, 0]).astype(np.float32),
        "acoustic_codebooks": cbs(ac, n_ac),
    }


# The numpy side (split_rvq_encode) lives in the runtime: it is deployed, not exported.
split_rvq_encode = rvq.split_rvq_encode


# ---------------------------------------------------------------- registry
def _mimi(tts) -> nn.Module:
    return tts.model.speech_tokenizer.model.encoder


def build(tts) -> nn.Module:
    return MimiEncoder(_mimi(tts)).eval()


def inputs(tts, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    assert length % SAMPLES_PER_FRAME == 0, f"wav length must be a multiple of {SAMPLES_PER_FRAME}"
    cfg = _mimi(tts).config
    t = length // HOP
    wav = (0.1 * torch.randn(1, 1, length, generator=common.seeded(seed))).clamp(-1.0, 1.0)
    cos, sin = common.rope_tables(cfg.head_dim, cfg.rope_theta, 0, t)
    return {"wav": wav, "mask": common.causal_mask(t, window=WINDOW), "cos": cos, "sin": sin}


@torch.no_grad()
def run_original(tts, inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    enc = _mimi(tts)
    h = enc.encoder(inp["wav"])  # as MimiModel._encode_frame, without padding_cache / past_key_values
    h = enc.encoder_transformer(h.transpose(1, 2), return_dict=True).last_hidden_state
    return {"latent": enc.downsample(h.transpose(1, 2))}


SPEC = register(
    ModuleSpec(
        name="mimi_encoder",
        build=build,
        inputs=inputs,
        metric="rel",
        tolerance=1e-5,
        run_original=run_original,
        lengths=(SAMPLES_PER_FRAME * 20, SAMPLES_PER_FRAME * 33),
        summary="Mimi encoder: wav (1,1,L) -> SEANet convs -> 25 Hz transformer -> downsample -> latent (1,D,L/1920)",
        rewrites=[
            "Causal conv pads are constants (padding_total is a buffer and the ceil arithmetic would trace T); "
            "the extra right pad is 0 because the host pads L to a multiple of 1920.",
            "Causal mask and rope cos/sin are graph inputs at the transformer's 25 Hz rate (T' = L/960). "
            "No sliding window: transformers 4.57.3 builds Mimi's sdpa mask with create_causal_mask, "
            "so the configured window of 250 is not applied by the reference.",
            "Attention written as SDPA with the mask input; RVQ (argmin chains) moved to numpy on the host.",
        ],
    )
)
