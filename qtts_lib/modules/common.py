"""Pieces shared by the wrappers: rope tables and masks built on the host. Introduced in 02.

ncnn's RotaryEmbed takes cos/sin tables of half the head width (its tests use that
convention; CPU happens to accept full width, Vulkan does not), and SDPA takes a 2-D
additive mask. Both are graph *inputs*: built from torch.arange inside the graph they
leave arange/where ops that pnnx cannot convert, and the length would be frozen.
"""
from __future__ import annotations

import numpy as np
import torch

NEG_INF = float("-inf")


def rope_tables(head_dim: int, theta: float, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (length, head_dim // 2) for absolute positions start..start+length-1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    pos = torch.arange(start, start + length, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def full_width(t: torch.Tensor) -> torch.Tensor:
    """(…, hd/2) -> (…, hd): the HF layout cat(freqs, freqs)."""
    return torch.cat([t, t], dim=-1)


def causal_mask(length: int, past: int = 0, window: int | None = None) -> torch.Tensor:
    """Additive 2-D mask (length, past+length): 0 where query i may see key j, -inf elsewhere.

    With `window`, key j is visible to query i only when i - window < j <= i (HF sliding window)."""
    q = torch.arange(past, past + length)[:, None]
    k = torch.arange(past + length)[None, :]
    ok = k <= q
    if window is not None:
        ok &= k > q - window
    return torch.zeros(ok.shape).masked_fill(~ok, NEG_INF)


def rotate_half_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with half-width tables, the NeoX/HF layout (first half, second half)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
