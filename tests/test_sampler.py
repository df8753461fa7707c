"""qtts_lib.runtime.sampler against Hugging Face's own logits processors (transformers 4.57.3).

The HF list is built by `GenerationMixin._get_logits_processor` itself, on a bare GenerationMixin
that carries the real qwen_tts config classes, after the same preparation steps generate() runs
(`_prepare_generation_config`, `_prepare_special_tokens`, `_prepare_generated_length`) with the
kwargs that `Qwen3TTSForConditionalGeneration.generate` and the code-predictor call pass.
"""
import dataclasses
import json

import numpy as np
import pytest

from qtts_lib import checkpoint
from qtts_lib.runtime.errors import InputError
from qtts_lib.runtime.pipeline import sampling as sampler
from qtts_lib.runtime.pipeline.sampling import SamplerConfig, Sampling

torch = pytest.importorskip("torch")
from transformers import GenerationConfig  # noqa: E402
from transformers.generation.utils import GenerationMixin  # noqa: E402

TALKER_VOCAB, SUB_VOCAB, EOS = 3072, 2048, 2150


def talker_of(gen: dict, cfg: dict, greedy: bool = False, eos_token_id: int | None = None) -> SamplerConfig:
    """The talker's config from a generation_config.json, as the runtime builds it (through `Sampling`)."""
    sampling = Sampling.from_generation_config(gen, **({"greedy": True} if greedy else {}))
    return SamplerConfig.talker(sampling, cfg, eos_token_id)


def subtalker_of(gen: dict, cfg: dict, greedy: bool = False) -> SamplerConfig:
    return SamplerConfig.subtalker(Sampling.from_generation_config(gen, **({"greedy": True} if greedy else {})), cfg)


@pytest.fixture(scope="module")
def ckpt():
    d = checkpoint.ensure("tiny-base")
    return json.loads((d / "generation_config.json").read_text()), json.loads((d / "config.json").read_text())


@pytest.fixture(scope="module")
def model_configs(ckpt):
    from qtts_lib.reference import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    cfg = Qwen3TTSConfig(**ckpt[1])
    return cfg.talker_config, cfg.talker_config.code_predictor_config


class _Bare(GenerationMixin):
    """Just enough of a model for GenerationMixin's preparation steps."""

    def __init__(self, config):
        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)


def hf_processors(config, **gen_kwargs):
    """The LogitsProcessorList generate() builds for an inputs_embeds-only call (utils.py:2234-2545)."""
    m = _Bare(config)
    gc, _ = m._prepare_generation_config(None, **gen_kwargs)
    m._prepare_special_tokens(gc, kwargs_has_attention_mask=True, device="cpu")
    embeds = torch.zeros(1, 3, 8)
    gc = m._prepare_generated_length(
        gc, has_default_max_length=gc.max_length is not None and "max_length" not in gen_kwargs,
        has_default_min_length=gc.min_length is not None and "min_length" not in gen_kwargs,
        model_input_name="inputs_embeds", input_ids_length=0, inputs_tensor=embeds,
    )
    return m._get_logits_processor(gc, input_ids_seq_length=0, encoder_input_ids=embeds, device="cpu")


def talker_kwargs(s: SamplerConfig) -> dict:
    # as Qwen3TTSForConditionalGeneration.generate builds them (modeling_qwen3_tts.py:2044)
    return dict(max_new_tokens=64, min_new_tokens=2, do_sample=s.do_sample, top_k=s.top_k, top_p=s.top_p,
                temperature=s.temperature, eos_token_id=EOS, repetition_penalty=s.repetition_penalty,
                suppress_tokens=[i for i in range(TALKER_VOCAB - 1024, TALKER_VOCAB) if i != EOS])


def subtalker_kwargs(s: SamplerConfig) -> dict:
    # as the code_predictor.generate call passes them (modeling_qwen3_tts.py:1671)
    return dict(max_new_tokens=15, do_sample=s.do_sample, top_p=s.top_p, top_k=s.top_k, temperature=s.temperature)


# ---------------------------------------------------------------- the configs
def test_configs_from_checkpoint(ckpt):
    gen, cfg = ckpt
    t = talker_of(gen, cfg["talker_config"], greedy=False)
    assert (t.do_sample, t.temperature, t.top_k, t.top_p, t.repetition_penalty) == (True, 0.9, 50, 1.0, 1.05)
    assert t.eos_id == EOS and t.min_new_tokens == 2
    assert len(t.suppress_ids) == 1023 and EOS not in t.suppress_ids and min(t.suppress_ids) == 2048
    assert talker_of(gen, cfg, greedy=True).do_sample is False  # whole config.json works too
    assert talker_of(gen, cfg, eos_token_id=7).eos_id == 7
    s = subtalker_of(gen, cfg["talker_config"], greedy=False)
    assert (s.do_sample, s.temperature, s.top_k, s.top_p, s.repetition_penalty) == (True, 0.9, 50, 1.0, 1.0)
    assert s.eos_id is None and s.suppress_ids == () and s.min_new_tokens == 0
    assert talker_of({}, cfg).temperature == 0.9  # qwen_tts hard defaults fill missing keys


def test_hf_builds_the_list_we_mirror(ckpt, model_configs):
    """The processor classes and order, as also seen in a real tiny-base generate() run."""
    gen, cfg = ckpt
    talker_cfg, pred_cfg = model_configs
    names = lambda procs: [type(p).__name__ for p in procs]  # noqa: E731
    t = talker_of(gen, cfg)
    head = ["RepetitionPenaltyLogitsProcessor", "MinLengthLogitsProcessor",
            "MinNewTokensLengthLogitsProcessor", "SuppressTokensLogitsProcessor"]
    warpers = ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    assert names(hf_processors(talker_cfg, **talker_kwargs(t))) == head + warpers
    greedy = talker_of(gen, cfg, greedy=True)
    assert names(hf_processors(talker_cfg, **talker_kwargs(greedy))) == head  # no warpers when greedy
    s = subtalker_of(gen, cfg)
    assert names(hf_processors(pred_cfg, **subtalker_kwargs(s))) == warpers
    assert names(hf_processors(pred_cfg, **subtalker_kwargs(subtalker_of(gen, cfg, greedy=True)))) == []


# ---------------------------------------------------------------- parity cases
def _cases(gen: dict, cfg: dict) -> list[tuple[str, str, SamplerConfig, np.ndarray, list[int]]]:
    rng = np.random.default_rng(20261130)
    T = talker_of(gen, cfg)
    S = subtalker_of(gen, cfg)
    variants = {
        "talker": T,
        "talker-greedy": talker_of(gen, cfg, greedy=True),
        "talker-p0.8": dataclasses.replace(T, top_p=0.8),
        "talker-p0.95-T1.3-rep1.3": dataclasses.replace(T, top_p=0.95, temperature=1.3, repetition_penalty=1.3),
        "talker-k1": dataclasses.replace(T, top_k=1),
        "sub": S,
        "sub-greedy": subtalker_of(gen, cfg, greedy=True),
        "sub-p0.7-k5000": dataclasses.replace(S, top_p=0.7, top_k=5000),
    }

    def hist(n: int, hi: int = 2048) -> list[int]:
        return rng.integers(0, hi, n).tolist()

    out = []
    for name, c in variants.items():
        vocab = TALKER_VOCAB if name.startswith("talker") else SUB_VOCAB
        for step in (0, 1, 2):  # EOS the top token at steps 0/1/2; history repeats it
            x = rng.standard_normal(vocab).astype(np.float32) * 3
            x[EOS % vocab] = x.max() + 5
            h = hist(step)
            out.append((f"{name}/eos-top-step{step}", name, c, x, h))
        x = (np.round(rng.standard_normal(vocab) * 2) / 2).astype(np.float32)  # many ties, also at the k-th
        out.append((f"{name}/ties", name, c, x, hist(30)))
        x = rng.standard_normal(vocab).astype(np.float32) * 0.1
        x[rng.integers(0, 2048)] = 40.0
        out.append((f"{name}/peaked", name, c, x, hist(10)))
        x = (rng.standard_normal(vocab) * 1e-4).astype(np.float32)
        out.append((f"{name}/flat", name, c, x, hist(60)))
        x = np.zeros(vocab, np.float32)  # exactly flat: top-k keeps all tied ids
        out.append((f"{name}/all-equal", name, c, x, hist(5)))
        x = (-np.abs(rng.standard_normal(vocab)) * 4 - 1).astype(np.float32)  # penalty multiplies negatives
        out.append((f"{name}/negative", name, c, x, hist(200)))
        x = rng.standard_normal(vocab).astype(np.float32) * 6
        out.append((f"{name}/wide", name, c, x, hist(40) * 2))
    return out


@pytest.fixture(scope="module")
def parity(ckpt, model_configs):
    gen, cfg = ckpt
    talker_cfg, pred_cfg = model_configs
    rows = []
    lists: dict[str, object] = {}
    for label, name, c, x, h in _cases(gen, cfg):
        if name not in lists:
            lists[name] = (hf_processors(talker_cfg, **talker_kwargs(c)) if name.startswith("talker")
                           else hf_processors(pred_cfg, **subtalker_kwargs(c)))
        ids = torch.tensor([h], dtype=torch.long).reshape(1, len(h))
        ref = lists[name](ids, torch.from_numpy(x.copy())[None])[0]
        ours = sampler.process(x, h, len(h), c)
        rows.append((label, c, ours, ref.numpy(), torch.softmax(ref, -1).numpy(), x, h))
    return rows


def _tie_at_cut(label: str, c: SamplerConfig) -> bool:
    """Top-p with a tie group straddling the cut: HF's torch.sort is unstable, so which tied ids it
    drops is implementation-defined (documented in sampler.top_p); only the count can match."""
    return c.do_sample and c.top_p < 1.0 and label.endswith(("/ties", "/all-equal"))


def test_enough_cases(parity):
    assert sum(not _tie_at_cut(r[0], r[1]) for r in parity) >= 24
    assert {r[2].size for r in parity} == {TALKER_VOCAB, SUB_VOCAB}


def test_processed_distributions_match_hf(parity):
    worst = 0.0
    for label, c, ours, ref, ref_p, *_ in parity:
        p = sampler.probs(ours)
        assert p.dtype == np.float32 and abs(float(p.sum()) - 1) < 1e-5, label
        if _tie_at_cut(label, c):
            continue
        assert np.array_equal(np.isneginf(ours), np.isneginf(ref)), label
        d = float(np.abs(p - ref_p).max())
        worst = max(worst, d)
        assert d <= 1e-6, (label, d)
    print(f"max abs prob diff over the exact cases: {worst:.3g}")


def test_processed_logits_are_bitwise_hf(parity):
    # every step is an elementwise float32 op or a mask, so the scores agree exactly
    for label, c, ours, ref, *_ in parity:
        if not _tie_at_cut(label, c):
            assert np.array_equal(ours, ref), label


def test_tie_at_top_p_cut_differs_only_inside_the_tie(parity):
    rows = [r for r in parity if _tie_at_cut(r[0], r[1])]
    assert rows
    for label, _c, ours, ref, ref_p, _x, _h in rows:
        differ = np.isneginf(ours) != np.isneginf(ref)
        assert np.isneginf(ours).sum() == np.isneginf(ref).sum(), label
        # every id kept by one side and dropped by the other holds the same processed score
        kept_value = np.where(np.isneginf(ours), ref, ours)[differ]
        assert np.unique(kept_value).size <= 1, label
        assert np.abs(np.sort(sampler.probs(ours)) - np.sort(ref_p)).max() <= 1e-6, label


def test_greedy_argmax_matches_hf(parity):
    for label, c, ours, ref, *_ in parity:
        if not _tie_at_cut(label, c):
            assert int(np.argmax(ours)) == int(torch.argmax(torch.from_numpy(ref))), label


def test_eos_masked_only_before_min_new_tokens(parity):
    for label, _c, ours, _ref, *_ in parity:
        if "eos-top" in label and label.startswith("talker"):
            step = int(label[-1])
            assert np.isneginf(ours[EOS]) == (step < 2), label
            if step == 2:
                assert int(np.argmax(ours)) == EOS, label


def test_sample_greedy_is_argmax(parity):
    greedy = [r for r in parity if not r[1].do_sample]
    assert greedy
    for label, c, _ours, ref, _, x, h in greedy:
        got = sampler.sample(x, h, len(h), c, np.random.default_rng(0))
        assert got == int(torch.argmax(torch.from_numpy(ref))), label


def test_only_a_processor_free_greedy_config_skips_to_the_argmax(ckpt, parity):
    """`SamplerConfig.argmax_only`: the greedy sub-talker's picks skip the processors; a config with a penalty, a
    suppressed range, an end of speech to hold back or draws does not. Where it holds, the pick equals `sample`'s."""
    gen, cfg = ckpt
    assert subtalker_of(gen, cfg["talker_config"], greedy=True).argmax_only
    assert not subtalker_of(gen, cfg["talker_config"], greedy=False).argmax_only
    assert not talker_of(gen, cfg["talker_config"], greedy=True).argmax_only  # suppressed ids, penalty, min tokens
    assert not SamplerConfig(repetition_penalty=1.05).argmax_only
    assert not SamplerConfig(eos_id=3, min_new_tokens=2).argmax_only
    assert SamplerConfig(eos_id=3).argmax_only
    one = sampler.Sampler(Sampling(greedy=True), cfg["talker_config"])
    checked = 0
    for _label, c, _ours, _ref, _, x, h in parity:
        if c.argmax_only:
            assert one.code(x, np.asarray(h, np.int64), 0) == sampler.sample(x, h, len(h), c, None)
            checked += 1
    assert checked


# ---------------------------------------------------------------- sampling
def _run(seed: int, c: SamplerConfig, x: np.ndarray, n: int = 200) -> list[int]:
    rng = np.random.default_rng(seed)
    got: list[int] = []
    for _ in range(n):
        got.append(sampler.sample(x, got[-20:], len(got), c, rng))
    return got


def test_seeded_sampling_is_repeatable(ckpt):
    gen, cfg = ckpt
    c = talker_of(gen, cfg)
    x = np.random.default_rng(3).standard_normal(TALKER_VOCAB).astype(np.float32)
    a, b, other = _run(11, c, x), _run(11, c, x), _run(12, c, x)
    assert a == b
    assert a != other
    assert EOS not in a[:2] and all(t < 2048 or t == EOS for t in a)


def test_draws_follow_the_distribution(ckpt):
    gen, cfg = ckpt
    c = subtalker_of(gen, cfg)
    x = np.random.default_rng(5).standard_normal(SUB_VOCAB).astype(np.float32) * 2
    p = sampler.probs(sampler.process(x, [], 0, c))
    rng = np.random.default_rng(99)
    n = 20_000
    counts = np.bincount([sampler.draw(p, rng) for _ in range(n)], minlength=SUB_VOCAB)
    assert counts[p == 0].sum() == 0
    assert np.abs(counts / n - p).max() < 0.01
    # chi-square over the kept ids (50 of them): well under the 0.1% critical value for 49 dof (~85)
    kept = p > 0
    chi2 = float((((counts[kept] - n * p[kept]) ** 2) / (n * p[kept])).sum())
    assert chi2 < 85, chi2


def test_draw_never_picks_zero_mass():
    p = np.zeros(10, np.float32)
    p[3] = 1.0

    class One:
        def random(self):
            return 1.0 - 2.0 ** -53  # the largest value Generator.random can return

    assert sampler.draw(p, One()) == 3
    assert sampler.draw(p, np.random.default_rng(0)) == 3


# ---------------------------------------------------------------- the user's object
def test_sampling_defaults_are_the_checkpoints(ckpt):
    gen, _ = ckpt
    s = Sampling.from_generation_config(gen)
    assert (s.greedy, s.temperature, s.top_k, s.top_p, s.repetition_penalty) == (
        not gen["do_sample"], gen["temperature"], gen["top_k"], gen["top_p"], gen["repetition_penalty"])
    assert Sampling.from_generation_config({"do_sample": False, "subtalker_dosample": True}).subtalker_greedy is False
    # qwen_tts's hard defaults, which are the class's; no seed: every request draws afresh
    assert Sampling.from_generation_config({}) == Sampling() and s.seed is None
    assert Sampling.from_generation_config({}, seed=3) == Sampling(seed=3)


def test_replace_validates_and_greedy_reaches_the_code_predictor(ckpt):
    gen, cfg = ckpt
    s = Sampling.from_generation_config(gen).replace(temperature=0.7, top_k=5, seed=3)
    assert (s.temperature, s.top_k, s.seed) == (0.7, 5, 3)
    g = s.replace(greedy=True)
    assert not SamplerConfig.talker(g, cfg).do_sample and not SamplerConfig.subtalker(g, cfg).do_sample


def test_no_seed_is_a_fresh_draw_resolved_once_and_replayable(ckpt):
    """`Sampling()` has no seed; `resolve` draws one (a new one each call) and keeps a given one; a `Sampler` built
    from an unresolved sampling resolves it itself, never falling back to a fixed seed, and says which seed it
    drew: a sampler built with that seed draws the same codes."""
    gen, cfg = ckpt
    fresh = Sampling.from_generation_config(gen)
    assert Sampling().seed is None and fresh.seed is None
    seeds = {fresh.resolve().seed for _ in range(8)}
    assert len(seeds) == 8 and all(isinstance(s, int) and 0 <= s < 2**sampler.SEED_BITS for s in seeds)
    assert fresh.resolve().replace(seed=None) == fresh  # only the seed is filled in
    given = fresh.replace(seed=5)
    assert given.resolve() is given
    x = np.random.default_rng(3).standard_normal(TALKER_VOCAB).astype(np.float32)

    def codes(s: sampler.Sampler) -> list[int]:
        got: list[int] = []
        for _ in range(100):
            got.append(s.first(x, got))
        return got

    a, b = sampler.Sampler(fresh, cfg), sampler.Sampler(fresh, cfg)
    take_a, take_b = codes(a), codes(b)
    assert a.seed != b.seed and take_a != take_b
    replay = sampler.Sampler(fresh.replace(seed=a.seed), cfg)
    assert replay.seed == a.seed and codes(replay) == take_a
    # greedy needs no seed: a greedy sampling is as repeatable as ever
    greedy = Sampling(greedy=True)
    assert not greedy.draws and greedy.seed == sampler.GREEDY_SEED and greedy.resolve() is greedy
    assert fresh.draws and Sampling(greedy=True, subtalker_greedy=False).draws
    assert Sampling(greedy=True, subtalker_greedy=False).seed is None
    assert codes(sampler.Sampler(greedy, cfg)) == codes(sampler.Sampler(greedy, cfg))


@pytest.mark.parametrize("bad", [{"temperature": 0}, {"temperature": -1.0}, {"temperature": float("nan")},
                                 {"temperature": float("inf")}, {"temperature": "hot"}, {"top_p": 0},
                                 {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5}, {"seed": -3}, {"seed": True},
                                 {"repetition_penalty": 0}, {"greedy": "yes"}, {"nucleus": 0.9}])
def test_bad_sampling_parameters_name_what_is_valid(bad):
    with pytest.raises(InputError, match="must be|unknown sampling"):
        Sampling().replace(**bad)
