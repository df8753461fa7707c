"""Pieces shared by the wrappers: rope tables and masks as torch tensors. Introduced in 02.

ncnn's RotaryEmbed takes cos/sin tables of half the head width (its tests use that
convention), and SDPA takes a 2-D additive mask. Both are graph *inputs*: built from
torch.arange inside the graph they leave arange/where ops that pnnx cannot convert, and the
length would be frozen. The tables and masks themselves come from `runtime.rope`, the one
recipe the runtime feeds the graphs with; here they are only wrapped as tensors.
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.binding import rope


def rope_tables(head_dim: int, theta: float, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (length, head_dim // 2) for absolute positions start..start+length-1."""
    cos, sin = rope.tables(head_dim, theta, start, length)
    return torch.from_numpy(cos), torch.from_numpy(sin)


def causal_mask(length: int, past: int = 0, window: int | None = None) -> torch.Tensor:
    """Additive 2-D mask (length, past+length), see `runtime.rope.causal_mask`."""
    return torch.from_numpy(rope.causal_mask(length, past, window))


def rotate_half_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with half-width tables, the NeoX/HF layout (first half, second half)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
