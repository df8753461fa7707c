"""The numpy split RVQ on hand-made codebooks."""
import numpy as np

from qtts_lib.runtime.audio import rvq


def test_residual_chain_picks_nearest_then_subtracts():
    cb = np.array([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]],      # level 0
                   [[0.0, 0.0], [0.25, 0.0], [0.0, 0.25]]])   # level 1
    x = np.array([[1.2, 0.1], [0.1, 0.8], [0.0, 0.0]])
    codes = rvq.residual_chain(x, cb)
    # level 0: nearest rows 1, 2, 0; residuals (0.2, 0.1), (0.1, -0.2), (0, 0) -> level 1: 1, 0, 0
    np.testing.assert_array_equal(codes, [[1, 2, 0], [1, 0, 0]])


def test_split_chains_start_from_the_same_latent():
    rng = np.random.default_rng(0)
    d, t = 4, 6
    tables = {
        "semantic_in": np.eye(d, dtype=np.float32),
        "semantic_codebooks": rng.standard_normal((1, 8, d)).astype(np.float32),
        "acoustic_in": -np.eye(d, dtype=np.float32),
        "acoustic_codebooks": rng.standard_normal((15, 8, d)).astype(np.float32),
    }
    latent = rng.standard_normal((d, t)).astype(np.float32)
    codes = rvq.split_rvq_encode(latent, tables)
    assert codes.shape == (16, t) and codes.dtype == np.int64
    np.testing.assert_array_equal(codes[:1], rvq.residual_chain(latent.T, tables["semantic_codebooks"]))
    np.testing.assert_array_equal(codes[1:], rvq.residual_chain(-latent.T, tables["acoustic_codebooks"]))
