"""Batched generation (chapter 17): the folded graph, the cache layout it moves sequences with, and a batch of
different prompts against each prompt run alone.

What holds, stated exactly (and measured over 200 frames at full size in chapter 17): at one sequence the folded
graph is bitwise the exported one; in a batch every row's hidden state agrees with its alone run to float32
rounding (the projections run M rows instead of one, attention over padded positions), so on the tiny checkpoint
every code is equal, greedy and sampled with a seed per sequence."""
import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.binding import cache_layout, rope
from qtts_lib.runtime.binding.cached import KvCache, KvCacheNet, merge
from qtts_lib.runtime.binding.net import make_net
from qtts_lib.runtime.errors import BatchError
from qtts_lib.runtime.pipeline import precision
from qtts_lib.runtime.pipeline.loop import Batch
from qtts_lib.runtime.pipeline.sampling import Sampler
from qtts_lib.runtime.rewrites.batch import fold_batch

CKPT = "tiny-base"
TEXTS = ["Hello from ncnn.", "Every token of this sentence is checked against PyTorch, one by one.", "Short.",
         "A fourth sentence, of middling length, to fill the batch."]


@pytest.fixture(scope="module")
def prompts(synth):
    """Four prompts of four lengths: x-vector and ICL clones, text in the prompt (non-streaming) and trailing."""
    clip = load_wav(paths.voice_wav())
    xvec = synth.voice(wav=clip)
    icl = synth.voice(wav=clip, text=(paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip())
    out = [synth.prompt(TEXTS[0], "english", xvec), synth.prompt(TEXTS[1], "english", xvec, non_streaming=True),
           synth.prompt(TEXTS[2], "english", icl), synth.prompt(TEXTS[3], "english", xvec, non_streaming=True)]
    assert len({p.embeds.shape[0] for p in out}) == 4  # every length different: the batch pads
    return out


def sampler(synth, i, greedy):
    return Sampler(Sampling(greedy=True) if greedy else Sampling(seed=100 + i), synth.config.talker)


def talker_nets(folded: bool):
    d = paths.ncnn_dir(CKPT)
    text = (d / "talker_decoder_kv.param").read_text()
    return make_net(d / "talker_decoder_kv.param", d / "talker_decoder.bin", 2,
                    rewrite=(lambda t: fold_batch(t, 4)) if folded else None), text


def test_the_folded_graph_at_one_sequence_is_the_exported_graph(synth):
    cfg = synth.config.talker
    nets = [KvCacheNet(talker_nets(f)[0], cfg["num_hidden_layers"], cfg["head_dim"], cfg["rope_theta"],
                       heads=cfg["num_attention_heads"] if f else None) for f in (False, True)]
    x = np.random.default_rng(0).standard_normal((1, 12, cfg["hidden_size"])).astype(np.float32)
    outs = []
    for net in nets:
        h, cache = net.prefill(x[:, :8])
        steps = [net.forward(x[:, t:t + 1], cache) for t in range(8, 12)]
        outs.append(np.concatenate([h] + steps, axis=1))
    assert np.array_equal(outs[0], outs[1])


def test_one_sequence_never_loads_the_folded_graph():
    """A synthesizer's decoders run one sequence on the graph without the fold; the folded graph is loaded only by a
    scheduler that may batch (before its first frame)."""
    from qtts_lib.runtime.pipeline.scheduler import Scheduler

    fresh = Synthesizer(paths.checkpoint_dir(CKPT), precision="int8")
    decoders = [fresh.loop.talker, fresh.loop.predictor.decoder]
    fresh.synthesize(TEXTS[0], "english", fresh.voice(wav=load_wav(paths.voice_wav())), max_frames=3)
    assert [d._batched for d in decoders] == [None, None]
    Scheduler(fresh, 2)
    assert all(d._batched is not None for d in decoders)


def test_the_fold_refuses_a_graph_it_does_not_know():
    with pytest.raises(ValueError, match="SDPA"):
        fold_batch("7767517\n1 1\nInput in0 0 1 in0\n", 4)


def test_cache_layout_round_trip_keeps_attention(synth):
    """A cache read into numpy and written back in the probed layout gives the same next step as the cache
    ncnn made; a plain numpy Mat would not (chapter 05)."""
    cfg = synth.config.talker
    net = precision.decoder(paths.ncnn_dir(CKPT), "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2,
                            heads=cfg["num_attention_heads"])
    x = np.random.default_rng(1).standard_normal((1, 10, cfg["hidden_size"])).astype(np.float32)
    _, cache = net.prefill(x[:, :9])
    layout = cache_layout.probe()
    copy = merge([cache])  # read and written again
    for name, m in cache.blobs.items():
        kind = "k" if "_k_" in name else "v"
        np.testing.assert_array_equal(layout.read(copy.blobs[name], kind), layout.read(m, kind))
    a = net.forward(x[:, 9:], cache)
    b = net.forward(x[:, 9:], copy)
    np.testing.assert_array_equal(a, b)


def test_the_batch_mask_hides_each_sequences_padding(synth):
    cfg = synth.config.talker
    net = precision.decoder(paths.ncnn_dir(CKPT), "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2,
                            heads=cfg["num_attention_heads"])
    x = np.random.default_rng(2).standard_normal((1, 7, cfg["hidden_size"])).astype(np.float32)
    cache = merge([net.prefill(x[:, :7])[1], net.prefill(x[:, :3])[1]])
    assert (cache.past, cache.lengths, cache.padding) == (7, [7, 3], [0, 4])
    from qtts_lib.runtime.binding.cached import batch_mask
    mask = batch_mask(cache, 1, cfg["num_attention_heads"])
    heads = cfg["num_attention_heads"]
    assert mask.shape == (2 * heads, 1, 8)
    assert np.isneginf(mask[heads:, :, :4]).all() and not np.isinf(mask[heads:, :, 4:]).any()
    assert not np.isinf(mask[:heads]).any()
    np.testing.assert_array_equal(batch_mask(merge([cache]), 1, heads), mask)
    assert rope.causal_mask(1, 7).shape == (1, 8)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("join_at", [0, 6], ids=["together", "joining"])
def test_a_batch_of_four_equals_the_four_alone(synth, prompts, greedy, join_at):
    """Four prompts of different lengths and voices; with `join_at`, two of them join after that many frames, and
    sequences leave as they end (a frame cap per sequence, so they end at different frames)."""
    caps = [30, 24, 18, 27]
    alone = [synth.loop.run(p, sampler(synth, i, greedy), caps[i]) for i, p in enumerate(prompts)]
    batch = Batch(synth.loop, max_batch=4)
    first = 2 if join_at else 4
    seqs = [batch.add(p, sampler(synth, i, greedy), caps[i]) for i, p in enumerate(prompts[:first])]
    widths, n = [], 0
    while batch:
        widths.append(len(batch))
        batch.step()
        n += 1
        if join_at and n == join_at:
            seqs += [batch.add(p, sampler(synth, i, greedy), caps[i]) for i, p in enumerate(prompts[2:], 2)]
    assert max(widths) == 4 and min(widths) == 1  # they shared calls, and left one by one
    for i, (a, b) in enumerate(zip(alone, seqs)):
        assert b.stopped == a.stopped and b.tokens == a.tokens, f"sequence {i}"
        np.testing.assert_array_equal(np.stack(b.codes), np.stack(a.codes), err_msg=f"sequence {i}")


def test_a_gpu_batch_equals_the_cpu_alone(synth, prompts):
    """On a Vulkan device with `gpu_batches` (the CPU's folded graphs, caches downloaded plain): four prompts, two
    joining mid-way, give the CPU's codes run alone. The GPU forms take one sequence (`batches` False). Skipped,
    with the reason, where ncnn sees no Vulkan device; a failure where QTTS_REQUIRE_VULKAN is set (.ci/run)."""
    from qtts_lib.lab.vulkan import vulkan_or_skip

    found, why = vulkan_or_skip()
    if not found:
        pytest.skip(why)
    assert cache_layout.probe("vulkan") == cache_layout.CacheLayout(1, spare=False)
    assert not Synthesizer(paths.model_dir(CKPT), device="vulkan").loop.batches
    gpu = Synthesizer(paths.model_dir(CKPT), device="vulkan", gpu_batches=True)
    caps = [20, 14, 9, 17]
    alone = [synth.loop.run(p, sampler(synth, i, True), caps[i]) for i, p in enumerate(prompts)]
    batch = Batch(gpu.loop, max_batch=4)
    seqs = [batch.add(p, sampler(gpu, i, True), caps[i]) for i, p in enumerate(prompts[:2])]
    for n in range(40):
        if not batch:
            break
        batch.step()
        if n == 3:
            seqs += [batch.add(p, sampler(gpu, i, True), caps[i]) for i, p in enumerate(prompts[2:], 2)]
    for i, (a, b) in enumerate(zip(alone, seqs)):
        np.testing.assert_array_equal(np.stack(b.codes), np.stack(a.codes), err_msg=f"sequence {i}")


def test_batch_refuses_what_it_cannot_do(synth, prompts):
    with pytest.raises(BatchError, match="at least 1"):
        Batch(synth.loop, max_batch=0)
    batch = Batch(synth.loop, max_batch=1)
    batch.add(prompts[0], sampler(synth, 0, True), 3)
    with pytest.raises(BatchError, match="full"):
        batch.add(prompts[1], sampler(synth, 1, True), 3)


def test_synthesize_many_gives_what_synthesize_gives(synth):
    """Results in the order given, each one `synthesize`'s: codes, stop reason and audio (ICL's voice prefix
    included), with more utterances than places (a new one starts as soon as one ends)."""
    from qtts_lib.check import snr_db
    from qtts_lib.runtime.pipeline.synthesizer import Utterance

    clip = load_wav(paths.voice_wav())
    voices = [synth.voice(wav=clip),
              synth.voice(wav=clip, text=(paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip())]
    todo = [Utterance(t, "english", voices[i % 2], Sampling(seed=i), max_frames=12 + 3 * i)
            for i, t in enumerate(TEXTS + TEXTS[:2])]
    many = synth.synthesize_many(todo, max_batch=3)
    for i, (u, got) in enumerate(zip(todo, many)):
        alone = synth.synthesize(u.text, u.language, u.voice, u.sampling, max_frames=u.max_frames)
        np.testing.assert_array_equal(got.codes, alone.codes, err_msg=f"utterance {i}")
        assert got.stopped == alone.stopped and len(got.wav) == len(alone.wav)
        assert snr_db(got.wav, alone.wav) > 100


def test_synthesize_many_checks_every_utterance_first(synth):
    from qtts_lib.runtime.errors import InputError
    from qtts_lib.runtime.pipeline.synthesizer import Utterance

    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    with pytest.raises(InputError, match="language"):
        synth.synthesize_many([Utterance("Fine.", "english", voice), Utterance("Bad.", "klingon", voice)])
    with pytest.raises(BatchError, match="max_batch"):
        synth.synthesize_many([Utterance("Fine.", "english", voice)], max_batch=0)


def test_joining_and_leaving_in_place_equals_merging(synth):
    """`KvCache.join` (memory kept for four, the joiner's channels written, the batch moved by whole tiles when the
    joiner is longer) and `keep` (the last sequence fills the hole) give the steps `merge` gives, to float32
    rounding, with every sequence's own positions unchanged."""
    from qtts_lib.runtime.binding.cached import survivors

    cfg = synth.config.talker
    net = precision.decoder(paths.ncnn_dir(CKPT), "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2,
                            heads=cfg["num_attention_heads"])
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, n, cfg["hidden_size"])).astype(np.float32) for n in (7, 40, 3, 25)]
    steps = rng.standard_normal((4, 12, cfg["hidden_size"])).astype(np.float32)
    merged = merge([net.prefill(x)[1] for x in xs])
    joined = net.prefill(xs[0])[1]
    for x in xs[1:]:
        joined.join(net.prefill(x)[1], 4)
    assert joined.lengths == merged.lengths and joined.past >= merged.past and joined.slots == 4
    layout = cache_layout.probe()
    for name, m in joined.blobs.items():
        kind = "k" if "_k_" in name else "v"
        a, b = layout.read(m, kind), layout.read(merged.blobs[name], kind)
        kv = a.shape[0] // 4
        for i, n in enumerate(joined.lengths):  # each sequence's own positions, at the end of both
            np.testing.assert_array_equal(a[i * kv:(i + 1) * kv, -n:], b[i * kv:(i + 1) * kv, -n:])
    for t in range(6):
        np.testing.assert_allclose(net.forward(steps[:, t:t + 1], joined), net.forward(steps[:, t:t + 1], merged),
                                   atol=1e-5)
    order = survivors([False, True, False, False])
    assert order == [0, 3, 2]  # the last one takes the hole; the others stay where they are
    joined.keep(order)
    merged.keep(order)
    for t in range(6, 12):
        np.testing.assert_allclose(net.forward(steps[order, t:t + 1], joined),
                                   net.forward(steps[order, t:t + 1], merged), atol=1e-5)


def test_a_copied_cache_goes_on_like_the_original(synth):
    cfg = synth.config.talker
    net = precision.decoder(paths.ncnn_dir(CKPT), "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2,
                            heads=cfg["num_attention_heads"])
    x = np.random.default_rng(4).standard_normal((1, 20, cfg["hidden_size"])).astype(np.float32)
    _, cache = net.prefill(x[:, :17])
    copy = cache.copy()
    for t in range(17, 20):
        np.testing.assert_array_equal(net.forward(x[:, t:t + 1], cache), net.forward(x[:, t:t + 1], copy))


def test_steps_appending_in_place_equal_steps_handing_the_caches_back(synth, monkeypatch):
    """On the CPU a step with room in its caches extracts only its output (the layer appends into the Mats fed in);
    past the room it takes the layer's new Mats. Both give what extracting every cache gives, bit for bit."""
    assert cache_layout.probe().appends  # the CPU layer appends in place (the probe checks it)
    cfg = synth.config.talker
    net = precision.decoder(paths.ncnn_dir(CKPT), "talker_decoder", cfg["head_dim"], cfg["rope_theta"], 2)
    x = np.random.default_rng(5).standard_normal((1, 45, cfg["hidden_size"])).astype(np.float32)
    runs, seen = [], []
    for in_place in (True, False):
        if not in_place:
            monkeypatch.setattr(KvCache, "appends_in_place", lambda self, positions: False)
        h, cache = net.prefill(x[:, :5])
        steps = []
        for t in range(5, 45):
            if in_place:
                seen.append(cache.appends_in_place(1))
            steps.append(net.forward(x[:, t:t + 1], cache))
        runs.append((np.concatenate([h, *steps], axis=1), cache.arrays()))
    assert any(seen) and not all(seen)  # both ways ran: in place, and past the room
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    for name, a in runs[0][1].items():
        np.testing.assert_array_equal(a, runs[1][1][name])


def test_a_voices_head_is_prefilled_once_and_gives_the_same_numbers_kept_or_not():
    """A synthesizer keeps the talker cache of each prompt head it spoke (`scheduler.Prefixes`): the next utterance
    with the same voice and language prefills only its text. The head always goes in as a call of its own, so an
    utterance's codes and audio are the same whether its head was kept or not (int8, where the rows of one call
    share an activation scale, would show a head fed with the text)."""
    from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

    def counting(synth):
        fed, real = [], synth.loop.prefill

        def prefill(seq, positions=None):
            before = seq.prefilled
            done = real(seq, positions)
            fed.append(seq.prefilled - before)
            return done
        synth.loop.prefill = prefill
        return fed

    warm, cold = (Synthesizer(paths.model_dir(CKPT), precision="int8") for _ in range(2))
    voice = warm.voice(wav=load_wav(paths.voice_wav()))
    fed = counting(warm)
    seeded = Sampling(seed=7)
    first = warm.synthesize(TEXTS[0], "english", voice, seeded, max_frames=6)
    head, length = (lambda p: (p.head, len(p.embeds)))(warm.prompt(TEXTS[0], "english", voice))
    assert 0 < head < length and sum(fed) == length and head in fed and len(warm.prefixes) == 1
    fed.clear()
    again = warm.synthesize(TEXTS[0], "english", voice, seeded, max_frames=6)
    assert sum(fed) == length - head  # only the text
    np.testing.assert_array_equal(again.codes, first.codes)
    np.testing.assert_array_equal(again.wav, first.wav)
    fed.clear()
    other = warm.synthesize(TEXTS[1], "english", voice, seeded, max_frames=6, non_streaming=True)
    assert sum(fed) == len(warm.prompt(TEXTS[1], "english", voice, non_streaming=True).embeds) - head
    alone = cold.synthesize(TEXTS[1], "english", voice, seeded, max_frames=6, non_streaming=True)
    np.testing.assert_array_equal(other.codes, alone.codes)  # kept or made now: the same numbers
    np.testing.assert_array_equal(other.wav, alone.wav)
    warm.synthesize(TEXTS[0], "chinese", voice, seeded, max_frames=2)  # another language: another head
    assert len(warm.prefixes) == 2


@pytest.mark.parametrize("piece", [3, 1000], ids=["in-pieces", "whole"])
def test_utterances_joining_a_running_batch_equal_them_alone(synth, prompts, piece):
    """Through a `Scheduler`: utterances submitted while others run are prefilled `piece` positions a step (or
    whole) and join between frames; every one's codes equal its codes alone."""
    from qtts_lib.runtime.pipeline.scheduler import Job, Scheduler

    caps = [30, 24, 18, 27]
    alone = [synth.loop.run(p, sampler(synth, i, False), caps[i]) for i, p in enumerate(prompts)]
    scheduler = Scheduler(synth, max_batch=4, prefill_piece=piece)

    def submit(i):
        job = Job(prompts[i], Sampling(seed=100 + i), sampler(synth, i, False), caps[i], [])
        return scheduler.enqueue(job, synth.decoders.decoder(None))

    tickets = [submit(0), submit(1)]
    steps, prefilling_steps = 0, 0
    while scheduler:
        scheduler.step()
        steps += 1
        prefilling_steps += bool(scheduler.prefilling)
        if steps == 3:
            tickets += [submit(2), submit(3)]
    assert (prefilling_steps > 2) == (piece == 3)  # in pieces, a prompt took several steps to go in
    for i, (a, t) in enumerate(zip(alone, tickets)):
        assert t.result.tokens == a.tokens, f"utterance {i}"
        np.testing.assert_array_equal(t.result.codes, np.stack(a.codes), err_msg=f"utterance {i}")
