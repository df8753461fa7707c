"""Codec decoder, speaker encoder and Mimi encoder wrappers vs the original blocks on tiny-base. Introduced in 02."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from qtts_lib import check
from qtts_lib.modules import _REGISTRY, codec, common, mimi, speaker  # noqa: F401  (they register their specs)
from qtts_lib.runtime.audio.wav import SAMPLES_PER_FRAME
from qtts_lib.runtime.codec.parts import pack_codes

SNR_DB = 60.0  # codec_decoder waveform
COS = 0.99999  # speaker_encoder x-vector
REL_TOL = 1e-5  # mimi_encoder latent


def _perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """tiny-base leaves biases at 0, norms at 1, SnakeBeta alpha/beta at 0, cluster_usage at 1 and the
    ConvNeXt gamma at 1e-6: a wrapper that dropped or swapped any of them would still pass. Randomize them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.dtype.is_floating_point or t.numel() < 2 or t.std() > 0 or name.endswith("initialized"):
                continue
            r = torch.randn(t.shape, generator=g)
            if name.endswith("cluster_usage"):
                t.copy_(0.5 + 1.5 * torch.rand(t.shape, generator=g))
            elif name.endswith(("alpha", "beta")):
                t.copy_(0.3 * r)
            elif name.endswith(("gamma", "scale")):
                t.copy_(0.2 * r)
            elif "norm" in name and name.endswith("weight"):
                t.copy_(1 + 0.3 * r)
            else:  # biases
                t.copy_(0.05 * r)
    for mod in model.modules():
        if hasattr(mod, "_embed"):
            mod._embed = None  # MimiEuclideanCodebook caches embed_sum / cluster_usage on first use


@pytest.fixture(scope="module")
def tts_perturbed(tts):
    """Perturbed copies of the three blocks, shaped like `tts` as far as the specs look (a reload costs 5 s)."""
    st, spk = copy.deepcopy(tts.model.speech_tokenizer.model), copy.deepcopy(tts.model.speaker_encoder)
    _perturb(st)
    _perturb(spk)
    model = SimpleNamespace(speech_tokenizer=SimpleNamespace(model=st), speaker_encoder=spk)
    return SimpleNamespace(model=model)


def _run(tts, name: str, length: int, seed: int):
    spec = _REGISTRY[name]
    inputs = spec.inputs(tts, length, seed=seed)
    with torch.no_grad():
        out = spec.build(tts)(*inputs.values())
    ref = spec.run_original(tts, inputs)
    assert len(ref) == 1
    (key, b), = ref.items()
    assert out.shape == b.shape, (name, key, out.shape, b.shape)
    return inputs, out, b


@pytest.mark.parametrize("perturbed", [False, True], ids=["tiny", "perturbed"])
@pytest.mark.parametrize("which", [0, 1])
def test_codec_decoder(tts, tts_perturbed, which: int, perturbed: bool) -> None:
    m = tts_perturbed if perturbed else tts
    length = _REGISTRY["codec_decoder"].lengths[which]
    _, out, ref = _run(m, "codec_decoder", length, which)
    assert out.shape == (1, 1, SAMPLES_PER_FRAME * length)
    assert ref.abs().max() > 0.05, "reference is near-silent; the check would be vacuous"
    snr = check.snr_db(out, ref)
    assert snr >= SNR_DB, f"codec_decoder T={length}: SNR {snr:.1f} dB"


def _hf_mask(cfg, fn, length: int) -> torch.Tensor:
    """The boolean (T, T) mask the original builds for its sdpa attention."""
    cfg = copy.deepcopy(cfg)
    cfg._attn_implementation = "sdpa"
    m = fn(config=cfg, input_embeds=torch.zeros(1, length, 4), attention_mask=None,
           cache_position=torch.arange(length), past_key_values=None, position_ids=torch.arange(length)[None])
    return m[0, 0]


def test_mask_semantics(tts) -> None:
    """Codec decoder: HF's sliding window keeps i-72 < j <= i. Mimi: create_causal_mask, no window at all."""
    dec, enc = tts.model.speech_tokenizer.model.decoder, tts.model.speech_tokenizer.model.encoder
    assert dec.config.sliding_window == 72 and enc.config.sliding_window == 250
    want = _hf_mask(dec.config, create_sliding_window_causal_mask, 100)
    assert torch.equal(want, common.causal_mask(100, window=72) == 0)
    want = _hf_mask(enc.config, create_causal_mask, 300)
    assert torch.equal(want, common.causal_mask(300, window=mimi.WINDOW) == 0)
    assert not torch.equal(want, common.causal_mask(300, window=250) == 0)


def test_codec_sliding_window(tts_perturbed) -> None:
    """Past the window (100 > 72 frames) the mask input still reproduces the original; off by one is far worse."""
    length = 100
    inputs, out, ref = _run(tts_perturbed, "codec_decoder", length, 2)
    snr = check.snr_db(out, ref)
    assert snr >= SNR_DB
    wrapper = _REGISTRY["codec_decoder"].build(tts_perturbed)
    for w in (71, 73):
        with torch.no_grad():
            off = wrapper(*{**inputs, "mask": common.causal_mask(length, window=w)}.values())
        assert check.snr_db(off, ref) < snr - 20.0, f"window {w} indistinguishable from 72"


def test_codec_pack_roundtrip() -> None:
    codes = torch.randint(0, 2048, (16, 7), generator=common.seeded(0))
    sem, ac = pack_codes(codes.T.numpy(), 2048)  # the runtime packs (T, 16)
    assert sem.dtype == ac.dtype == np.int32 and ac.shape == (15 * 7,)
    assert int(ac[3 * 7 + 5]) == int(codes[4, 5]) + 3 * 2048  # group g = codebook g+1 at g*T + t
    assert torch.equal(codec.unpack_codes(torch.from_numpy(sem), torch.from_numpy(ac)), codes)


@pytest.mark.parametrize("perturbed", [False, True], ids=["tiny", "perturbed"])
@pytest.mark.parametrize("which", [0, 1])
def test_speaker_encoder(tts, tts_perturbed, which: int, perturbed: bool) -> None:
    m = tts_perturbed if perturbed else tts
    length = _REGISTRY["speaker_encoder"].lengths[which]
    _, out, ref = _run(m, "speaker_encoder", length, which)
    cos = torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=0).item()
    assert cos >= COS, f"speaker_encoder frames={length}: cos {cos:.7f}"


def test_mel_from_wav_matches_extract(tts) -> None:
    wav = (0.1 * np.random.default_rng(0).standard_normal(24000)).astype(np.float32)
    with torch.no_grad():
        out = _REGISTRY["speaker_encoder"].build(tts)(speaker.mel_from_wav(wav))
    ref = tts.model.extract_speaker_embedding(wav, 24000)
    assert check.rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("perturbed", [False, True], ids=["tiny", "perturbed"])
@pytest.mark.parametrize("which", [0, 1])
def test_mimi_encoder_and_rvq(tts, tts_perturbed, which: int, perturbed: bool) -> None:
    m = tts_perturbed if perturbed else tts
    length = _REGISTRY["mimi_encoder"].lengths[which]
    inputs, out, ref = _run(m, "mimi_encoder", length, which)
    err = check.rel_err(out, ref)
    assert err <= REL_TOL, f"mimi_encoder L={length}: rel {err:.3e}"

    codes = mimi.split_rvq_encode(common.as_numpy(out[0]), mimi.rvq_tables(m))
    st = m.model.speech_tokenizer.model
    with torch.no_grad():
        want = st.encode(inputs["wav"][:, 0], torch.ones(1, length, dtype=torch.long)).audio_codes[0].T
    assert codes.shape == (16, length // SAMPLES_PER_FRAME) == tuple(want.shape)
    assert (codes == common.as_numpy(want)).all(), f"{(codes != common.as_numpy(want)).sum()} codes differ"
    assert len(np.unique(codes)) > 16, "codes nearly constant; the check would be vacuous"
