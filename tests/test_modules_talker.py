"""Talker/predictor wrappers vs the original blocks on tiny-base, at both lengths. Introduced in 02."""
from __future__ import annotations

import pytest
import torch

from qtts_lib import paths, reference
from qtts_lib.modules import _REGISTRY, talker  # noqa: F401  (talker registers its specs)

NAMES = ["talker_text_embed", "talker_codec_embed", "talker_decoder", "talker_codec_head",
         "predictor_decoder", "predictor_embeds", "predictor_heads"]
DECODERS = {"talker_decoder", "predictor_decoder"}
REL_TOL = 1e-5  # decoders: ||a-b|| / ||b||
ABS_TOL = 1e-5  # embeddings and heads: max |a-b|


@pytest.fixture(scope="module")
def tts_norms(tts):
    """tiny-base inits every RMSNorm weight to 1; random ones catch a swapped q_norm/k_norm."""
    t = reference.load(paths.model_dir("tiny-base"), threads=2)  # the model does not deepcopy
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in t.model.talker.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return t


def _check(tts, name: str, which: int) -> None:
    spec = _REGISTRY[name]
    length = spec.lengths[which]
    inputs = spec.inputs(tts, length, seed=which)
    with torch.no_grad():
        out = spec.build(tts)(*inputs.values())
    out = out if isinstance(out, tuple) else (out,)
    ref = spec.run_original(tts, inputs)
    assert len(out) == len(ref)
    for a, (key, b) in zip(out, ref.items()):
        assert a.shape == b.shape, (name, key)
        if name in DECODERS:
            err = ((a - b).norm() / b.norm()).item()
            assert err <= REL_TOL, f"{name} L={length} {key}: rel {err:.3e}"
        else:
            err = (a - b).abs().max().item()
            assert err <= ABS_TOL, f"{name} L={length} {key}: max_abs {err:.3e}"


def test_registered():
    assert set(NAMES) <= set(_REGISTRY)


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("name", NAMES)
def test_matches_reference(tts, name: str, which: int) -> None:
    _check(tts, name, which)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoders_with_random_norms(tts_norms, name: str) -> None:
    _check(tts_norms, name, 0)


def test_predictor_ids_cover_groups(tts) -> None:
    ids = _REGISTRY["predictor_embeds"].inputs(tts, 16, seed=0)["ids"]
    assert ids.dtype == torch.int32
    assert sorted(set((ids // 2048).tolist())) == list(range(15))
