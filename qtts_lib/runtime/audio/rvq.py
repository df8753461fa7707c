"""Split residual vector quantization in numpy: Mimi latents -> the 16 codes the model uses. Introduced in 02.

Mimi's quantizer is split: a semantic chain (1 level) and an acoustic chain (residual levels),
both starting from the same latent, each through its own 1x1 input projection. The model keeps
`encoder_valid_num_quantizers` = 16 codes per frame: 1 semantic + 15 acoustic. Each level picks
the codebook row nearest (euclidean) to the current residual and subtracts it.
Distances in float64 so ties resolve like the reference's fp32 cdist on these tables.
"""
from __future__ import annotations

import numpy as np


def residual_chain(x: np.ndarray, codebooks: np.ndarray) -> np.ndarray:
    """x (T, d), codebooks (levels, K, d) -> codes (levels, T)."""
    residual = x.astype(np.float64)
    codes = []
    for cb in codebooks.astype(np.float64):
        # |x - c|^2 without the per-row |x|^2, which does not change the argmin
        idx = np.argmin((cb * cb).sum(1)[None, :] - 2.0 * residual @ cb.T, axis=1)
        codes.append(idx)
        residual = residual - cb[idx]
    return np.stack(codes)


def split_rvq_encode(latent: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
    """latent (D, T) -> codes (16, T) int64: semantic chain then acoustic chain."""
    lat = latent.astype(np.float64)
    sem = residual_chain((tables["semantic_in"].astype(np.float64) @ lat).T, tables["semantic_codebooks"])
    ac = residual_chain((tables["acoustic_in"].astype(np.float64) @ lat).T, tables["acoustic_codebooks"])
    return np.concatenate([sem, ac]).astype(np.int64)
