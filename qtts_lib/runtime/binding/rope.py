"""Rope tables and attention masks in numpy, for graphs that take them as inputs. Introduced in 05.

The same recipe as the reference's rotary embedding: inverse frequencies in float32,
angle = position * inv_freq in float32, then cos/sin. Tables are half width (head_dim/2),
ncnn RotaryEmbed's convention. Masks are 2-D and additive (0 visible, -inf hidden).
"""
from __future__ import annotations

import numpy as np


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exps, dtype=np.float32)).astype(np.float32)


def tables(head_dim: int, theta: float, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (length, head_dim/2) for absolute positions start..start+length-1."""
    pos = np.arange(start, start + length, dtype=np.float32)
    angles = (pos[:, None] * inv_freq(head_dim, theta)[None, :]).astype(np.float32)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def causal_mask(length: int, past: int = 0, window: int | None = None) -> np.ndarray:
    """(length, past+length): query i (absolute past+i) sees key j when j <= past+i (and within `window`)."""
    q = np.arange(past, past + length)[:, None]
    k = np.arange(past + length)[None, :]
    ok = k <= q
    if window is not None:
        ok &= k > q - window
    return np.where(ok, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
