# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 17 · Speak many at once: batched generation
# > A memory-bound step reads every weight once, whatever it computes with them. Give it four rows instead of one.
#
# **You will:** *fold* several sequences into one decoder call (each becomes its own group of attention heads) with a
# `.param` rewrite; decode the cache layout of ncnn's SDPA layer (scaled dot-product attention, one fused layer) so that
# sequences join and leave a batch; draw the mask that keeps them apart; check four prompts batched against alone; watch
# *continuous batching* (utterances join and leave a running batch between frames); read what it buys.
#
# **You will learn:** why batching is almost free in this loop and where it stops (attention, the codec); why sequences
# go into the head axis; what holds bitwise and what to float rounding; what `--max-batch` does.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing); the full-size tables come from
# `data/bench/batch/`. **Leaves behind:** `data/outputs/<ckpt>/17_many_*.wav`, the chapter report. The set-up loads the
# checkpoint's `Synthesizer` and prints the talker's shape, read by the rewrites below:

# %%
import numpy as np

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.runtime import Sampling, Synthesizer

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("17_speak_many_at_once", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
talker, ncnn_dir = synth.config.talker, paths.ncnn_dir(ckpt)
print(ckpt, "talker:", {k: talker[k] for k in ("hidden_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim")})

# %% [markdown]
# ## 1. Four rows for the price of one
# Every frame the talker reads all its weights once and the code predictor its own 15 times: the loop is bound by
# memory, not arithmetic (chapter 11). A projection over M rows reads the same weights as over one, so B utterances
# decoded together cost about what one costs, *if* every graph call takes a row per utterance. A talker step at M rows,
# timed here and not asserted (section 2's folded graph; a tiny checkpoint is mostly call overhead):

# %%
import time

import pandas as pd
from IPython.display import display

from qtts_lib.runtime.binding.cached import merge

step_net, rng = synth.loop.talker, np.random.default_rng(14)


def step_ms(rows: int, repeats: int = 30) -> float:
    """Median wall time of a talker step for `rows` sequences of 12 cached positions."""
    x = rng.standard_normal((1, 12, talker["hidden_size"])).astype(np.float32)
    cache = merge([step_net.prefill(x)[1] for _ in range(rows)])  # one batch cache
    times = []
    for _ in range(repeats):
        e = rng.standard_normal((rows, 1, talker["hidden_size"])).astype(np.float32)
        c = merge([cache])  # a fresh copy: every step sees 12 positions
        t0 = time.perf_counter()
        step_net.forward(e, c)
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


steps = pd.DataFrame([{"rows": m, "ms per step": round(step_ms(m), 2)}
                      for m in (1, 2, 4, 8)])
steps["ms per row"] = (steps["ms per step"] / steps["rows"]).round(2)
display(steps)

# %% [markdown]
# ## 2. Fold the sequences into the head axis
# Everything in a decoder layer but attention treats rows independently: B sequences of L positions are B·L rows.
# Attention is where rows meet: the exported graph computes it per head, `q (heads, rows, d)`, and SDPA lets every row
# see every cached row. `rewrites.batch.fold_batch` makes each sequence a group of heads of its own, `(heads, B·L, d) →
# (B·heads, L, d)` before SDPA (a Reshape, a 4-D Permute, a Reshape), the inverse after. With grouped-query attention
# (fewer key/value heads, each shared by a group of query heads), query head `b·heads + h` reads key/value head
# `b·kv_heads + h // (heads/kv_heads)`: its own sequence's. One attention block, before and after, then what the rewrite
# adds per attention layer (q, k, v and the output each reshaped; the check counts the layers):

# %%
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.rewrites.batch import fold_batch

kv_text = (ncnn_dir / "talker_decoder_kv.param").read_text()
folded_text = fold_batch(kv_text, talker["num_attention_heads"])


def first_attention(text: str) -> list[str]:
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("SDPA"))
    return [" ".join(line.split()) for line in lines[at - 6: at + 4]]


print("exported:\n  " + "\n  ".join(first_attention(kv_text)))
print("folded:\n  " + "\n  ".join(first_attention(folded_text)))
before, after = parse_param(kv_text).counts, parse_param(folded_text).counts
added = {k: after[k] - before[k] for k in after if after[k] != before[k]}
print(added, "layers added per graph")
n = talker["num_hidden_layers"]
check.equal(
    "fold: per attention layer 7 Reshapes, 3 Permutes and a Split more, no Gemm",
    "Reshape Permute Split Gemm",
    tuple(added.get(k, 0) for k in ("Reshape", "Permute", "Split", "Gemm")),
    (7 * n, 3 * n, n, 0))

# %% [markdown]
# At one sequence every reshape is the identity, so the folded graph must compute exactly what the exported one does.
# The runtime runs one sequence without the fold and loads the folded graph once something may batch
# (`KvCacheNet.batched_net`); a sequence prefilled alone joins a batch with its cache as it is. Bit for bit:

# %%
from qtts_lib.runtime.binding.cached import KvCacheNet
from qtts_lib.runtime.binding.net import make_net

shape = (talker["num_hidden_layers"], talker["head_dim"], talker["rope_theta"])
plain = KvCacheNet(make_net(ncnn_dir / "talker_decoder_kv.param",
                            ncnn_dir / "talker_decoder.bin", THREADS), *shape)
folded_net = KvCacheNet(step_net.batched_net, *shape)
x = rng.standard_normal((1, 20, talker["hidden_size"])).astype(np.float32)
outs = []
for net in (plain, folded_net):
    h, cache = net.prefill(x[:, :12])
    more = [net.forward(x[:, t:t + 1], cache) for t in range(12, 20)]
    outs.append(np.concatenate([h] + more, axis=1))
check.equal("folded graph at one sequence = exported graph (prefill + 8 steps)",
            "bitwise equal", bool(np.array_equal(*outs)), True)

# %% [markdown]
# Why not one shared cache, everyone's positions stacked and a block-diagonal mask? Exact, but every query would score
# all B sequences' keys and throw B−1 of every B away, and a finished sequence would stay until a rebuild.
#
# ## 3. The cache is the kernel's: read it to move sequences
# Sequences join a batch after their own prefill and leave it when they end, so caches are cut and merged. A cache Mat
# says `(kv_heads, positions, head_dim)`, but its memory is the x86 SDPA kernel's own tiled layout, with room to spare
# (`cstep`, ncnn's stride from one channel to the next, exceeds h·w): `binding.cache_layout.probe` runs one SDPA layer
# on random inputs, finds the tile and checks every element. `merge` reads caches out in that layout and writes one
# batch cache back; the check: a cache merely read and written back steps bitwise as before:

# %%
import inspect

import ncnn

from qtts_lib.runtime.binding import cache_layout

layout = cache_layout.probe()
print(inspect.getsource(cache_layout.CacheLayout.key_index))
print(inspect.getsource(cache_layout.CacheLayout.value_index))
print("this build:", layout, "ncnn", ncnn.__version__)
x = rng.standard_normal((1, 10, talker["hidden_size"])).astype(np.float32)
_, cache = step_net.prefill(x[:, :9])
k0 = cache.blobs["cache_k_in_0"]
print(f"layer 0's K cache: c={k0.c} h={k0.h} w={k0.w}, cstep {k0.cstep} = room for "
      f"{k0.cstep // k0.w} positions")
copy = merge([cache])  # every blob read into numpy and written back in the layout
same = np.array_equal(*(step_net.forward(x[:, 9:], c) for c in (cache, copy)))
check.equal("a cache read and written back: the next step is bitwise the same", "equal",
            bool(same), True)

# %% [markdown]
# ## 4. The mask that keeps sequences apart
# All sequences of a batch hold the same number of cached positions (the blobs are one array): a shorter one is padded
# at the front, and the mask, one row per head, hides each sequence's padding from it. Three sequences that joined with
# prompts of 30, 12 and 20 rows, four steps later. In the figure a row is a query head, grouped by sequence (red lines),
# a column a key position; black at the left of a group is its sequence's front padding:

# %%
import matplotlib.pyplot as plt

from qtts_lib.runtime.binding.cached import batch_mask


def padded_cache(lengths: list[int]):
    x = rng.standard_normal((1, max(lengths), talker["hidden_size"])).astype(np.float32)
    return merge([step_net.prefill(x[:, :n])[1] for n in lengths])


demo = padded_cache([30, 12, 20])
for _ in range(4):
    step_net.forward(rng.standard_normal((3, 1, talker["hidden_size"]))
                     .astype(np.float32), demo)
heads = talker["num_attention_heads"]
mask = batch_mask(demo, 1, heads)
print(f"cache: {demo.past} positions; each sequence's own: {demo.lengths}; padding "
      f"{demo.padding}; mask {mask.shape} (sequences x heads, new rows, cached + new)")
fig, ax = plt.subplots(figsize=(9, 2.8))
ax.imshow(np.isfinite(mask[:, 0, :]), aspect="auto", cmap="Greys_r",
          interpolation="nearest")
ax.hlines([heads - 0.5, 2 * heads - 0.5], *ax.get_xlim(), color="tab:red", lw=1)
ax.set(xlabel="key position (cached + this step's)", ylabel="query head (by sequence)",
       title="white: visible, black: another sequence's padding")
plt.show()
seen = [int(np.isfinite(mask[b * heads, 0]).sum()) for b in range(3)]
check.equal("each sequence's heads see exactly its own positions",
            "visible keys per sequence", seen, [n + 1 for n in demo.lengths])

# %% [markdown]
# ## 5. A batch of four against the four alone
# A row in a batch may differ from the same row alone: the projections run over M rows (another kernel tile, perhaps
# another order of additions), and attention scores padded positions the mask sets to −∞ (exact zeros after the
# softmax). One talker step of the three padded sequences above against the three stepped alone:

# %%
lengths = [30, 12, 20]
x = rng.standard_normal((3, max(lengths), talker["hidden_size"])).astype(np.float32)
alone_caches = [step_net.prefill(x[b:b + 1, :n])[1] for b, n in enumerate(lengths)]
together_cache = merge(alone_caches)  # a copy: the alone caches stay as they are
e = rng.standard_normal((3, 1, talker["hidden_size"])).astype(np.float32)
h_batched = step_net.forward(e, together_cache)
h_alone = np.concatenate([step_net.forward(e[b:b + 1], c)
                          for b, c in enumerate(alone_caches)])
step_diff = float(np.abs(h_batched - h_alone).max() / np.abs(h_alone).max())
print(f"one step, 3 sequences: bitwise equal {np.array_equal(h_batched, h_alone)}, "
      f"max relative difference {step_diff:.2e} (ncnn {ncnn.__version__})")
check.at_most("a batched step's rows vs the same rows alone (max relative difference)",
              "relative", step_diff, 1e-5)

# %% [markdown]
# Then whole generations: four prompts of four lengths (x-vector and ICL clones, text trailing and inside the prompt),
# each with its own sampler, decoded in one `Batch` and each alone. Every decision is the same unless it sits within
# float32 rounding of a boundary (two nearly equal logits, a draw at the edge of a code's share), so greedy codes are
# asserted equal and sampled ones shown (one may now and then go its own way):

# %%
from qtts_lib.runtime import load_wav
from qtts_lib.runtime.pipeline.loop import Batch
from qtts_lib.runtime.pipeline.sampling import Sampler

clip = load_wav(paths.voice_wav())
clip_text = (paths.INPUTS / "voice.txt").read_text().strip()
two = {"base": [{"wav": clip}, {"wav": clip, "text": clip_text}],
       "custom_voice": [{"speaker": s} for s in synth.speakers[:2]],
       "voice_design": [{"instruct": "A calm, low voice."}, {"instruct": ""}]}
voices = [synth.voice(**v) for v in two[synth.kind]]
texts = ["Hello from ncnn.",
         "Every token of this sentence is checked against PyTorch, one by one.",
         "Four at once.", "A fourth sentence, of middling length, to fill the batch."]
prompts = [synth.prompt(t, "english", voices[i // 2], non_streaming=bool(i % 2))
           for i, t in enumerate(texts)]
print("prompt rows:", [p.embeds.shape[0] for p in prompts])

# %% [markdown]
# Each prompt gets its own sampler, greedy then seeded; the four run alone and in one `Batch`:

# %%
FRAMES, rows = 44, []
for greedy in (True, False):
    def sampler(i: int, greedy: bool = greedy) -> Sampler:
        return Sampler(Sampling(greedy=True) if greedy else Sampling(seed=40 + i),
                       synth.config.talker)
    alone = [synth.loop.run(p, sampler(i), FRAMES) for i, p in enumerate(prompts)]
    batch = Batch(synth.loop, max_batch=4)
    together = [batch.add(p, sampler(i), FRAMES) for i, p in enumerate(prompts)]
    while batch:
        batch.step()
    for i, (a, b) in enumerate(zip(alone, together)):
        differ = [f for f, (x, y) in enumerate(zip(a.codes, b.codes))
                  if not np.array_equal(x, y)]
        rows.append({"sampling": "greedy" if greedy else f"seed {40 + i}", "prompt": i,
                     "frames alone / batched": f"{len(a.codes)} / {len(b.codes)}",
                     "first differing frame": differ[0] if differ else None})
        if greedy:
            check.tokens_equal(f"greedy prompt {i}: batched = alone", np.stack(b.codes),
                               np.stack(a.codes))
display(pd.DataFrame(rows))

# %% [markdown]
# At full size the same four prompts, greedy, over a longer run (`python -m qtts_lib.bench batch --parity`), in fp32 and
# in the int8 tier: where a code first changes on random weights, if it does.

# %%
import json

BENCH = paths.DATA / "bench" / "batch" / "dev-2core-epyc-full-base"  # one machine
for tier in ("fp32", "int8"):
    full = json.loads(BENCH.with_name(f"{BENCH.name}-parity-{tier}.json").read_text())
    print(f"{full['checkpoint']}, {full['precision']}, B={full['batch']}, "
          f"{full['frames']} frames, on {full['machine']['cpu']}:")
    display(pd.DataFrame(full["sequences"]))

# %% [markdown]
# In fp32 every code holds to the end; in int8 the batched sequences leave the alone ones within the first frames. int8
# quantizes each projection's input at run time with one scale per call (from its largest |value|), shared by the rows
# of a batch: a batched row's grid depends on the other rows' largest value. int8 is already an approximation that
# changes codes on random weights (chapter 13); a batch draws another sample of it, so only fp32 keeps parity.
#
# ## 6. Continuous batching: join between frames, leave at the end
# A `Scheduler` keeps up to `max_batch` utterances running. A new one joins between two frames: while others run, its
# prompt is prefilled a piece at a time (`PREFILL_PIECE` positions a step, so running sequences never wait for a whole
# prompt), then its cache joins the batch in place. One that ends leaves at once (its cache channels cut out). Six
# utterances of different lengths through four places, with the batch width at every step:

# %%
from qtts_lib.runtime.pipeline.scheduler import PREFILL_PIECE
from qtts_lib.runtime.pipeline.synthesizer import Scheduler, Utterance

caps, scheduler = [30, 12, 22, 8, 26, 16], Scheduler(synth, max_batch=4)
print(f"prefill piece: {PREFILL_PIECE} prompt positions per step while others run")
tickets = [scheduler.submit(Utterance(f"Utterance number {i + 1}.", "english",
                                      voices[0], Sampling(seed=i), max_frames=c))
           for i, c in enumerate(caps)]
widths, spans = [], {}
while scheduler:
    events = scheduler.step()  # one event per running utterance
    for event in events:
        spans.setdefault(event.ticket.id, [len(widths), len(widths)])[1] = len(widths)
    widths.append(len(events))
fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 4), sharex=True, layout="constrained")
for row, t in enumerate(tickets):
    first, last = spans[t.id]
    a1.barh(row, last - first + 1, left=first, color=f"C{row}")
a1.set(yticks=range(len(tickets)), title="which utterance runs at which step",
       yticklabels=[f"#{i + 1} ({c} frames)" for i, c in enumerate(caps)])
a2.step(range(len(widths)), widths, where="mid")
a2.set(xlabel="step (a frame of each running utterance)", ylabel="width", ylim=(0, 4.5))
plt.show()

# %% [markdown]
# The batch must fill, never overflow, end every utterance where it would alone, and take some mid-batch;
# `synthesize_many` wraps the same scheduler: a list of utterances in, their results in order out:

# %%
from IPython.display import Audio

from qtts_lib.runtime.audio.wav import SAMPLE_RATE, save_wav

check.equal("never more than max_batch at once, and a full batch was reached",
            "max width", max(widths), 4)
ended = [len(t.result.codes) == c if t.result.stopped == "cap"
         else len(t.result.codes) < c for c, t in zip(caps, tickets)]
check.equal("every utterance ran to its own end (its cap, or EOS before it)",
            "ended right", all(ended), True)
check.equal("a new utterance started while others ran", "joined mid-batch",
            any(spans[t.id][0] > 0 for t in tickets), True)
many = synth.synthesize_many([Utterance(t, "english", voices[0], Sampling(seed=i),
                                        max_frames=40) for i, t in enumerate(texts)],
                             max_batch=4)
for i, result in enumerate(many):
    save_wav(paths.outputs_dir(ckpt) / f"17_many_{i}.wav", result.wav)
display(Audio(np.concatenate([r.wav for r in many]), rate=SAMPLE_RATE))

# %% [markdown]
# ## 7. What it buys at full size
# `python -m qtts_lib.bench batch` on `full-base`: B utterances of one length, each B in a fresh process, medians. Per
# *aggregate* frame (a frame of any of the B sequences): the loop's ms, the codec's, and the real-time factor of all B
# together (wall time over the audio made, below 1 faster than real time), also with chapter 14's bf16 codec. The file's
# machine is printed; other machines are on the [results](results.ipynb) page:

# %%
bench = json.loads(BENCH.with_suffix(".json").read_text())
bf16 = json.loads(BENCH.with_name(f"{BENCH.name}-codec-bf16.json").read_text())
print(f"{bench['checkpoint']} on {bench['machine']['cpu']}, {bench['frames']} frames")
bf = {(r["precision"], r["batch"]): r["rtf"] for r in bf16["rows"]
      if r["codec_precision"] == "bf16"}
table = pd.DataFrame([{"loop": r["precision"], "B": r["batch"], "codec ms": m["codec"],
                       "loop ms": m["talker"] + m["predictor"], "rtf": r["rtf"],
                       "bf16 codec rtf": bf.get((r["precision"], r["batch"]))}
                      for r in bench["rows"] for m in [r["ms_per_frame"]]])
table.set_index(["loop", "B"])

# %% [markdown]
# The loop's cost per aggregate frame falls almost as 1/B at first, then more slowly. The codec, bound by arithmetic
# (chapter 12), does not batch: its own cost (the bf16 tier) is the lever. More in the [lab notes](../lab_notes.md).
#
# ## 8. Where users get it
# - Python: `synth.synthesize_many([Utterance(...), ...], max_batch=4)`, or a `Scheduler`; `qtts say --text-file
#   book.txt --max-batch 4`: a long text's segments, four at a time (the default).
# - `qtts serve --max-batch 4`: concurrent requests share the batch; a request is a *lane* (`Scheduler.lane`) that
#   keeps its place from its first segment to its last, so a stream never waits behind a newcomer (chapter 18).
# - On a GPU `--max-batch` defaults to 1; more loads the CPU's folded graphs on the device (`gpu_batches=True`).
#
# ## Summary
# - Sequences fold into the attention's head axis (`rewrites.batch.fold_batch`): every other layer sees B·L rows, every
#   weight is read once for all of them, and at one sequence the graph is bitwise the exported one.
# - The SDPA cache is in the kernel's tiled layout; `binding.cache_layout` probes it so that sequences can be merged
#   (left-padded, a per-head mask) and cut. A batch keeps each prompt's greedy codes in fp32, not in int8.
# - Continuous batching (`Scheduler`): prefill in pieces between frames, join, leave the frame it ends. The loop's cost
#   per aggregate frame falls with B; the codec does not batch, so its share of the time grows.
#
# **Artifacts left:** `data/outputs/<ckpt>/17_many_*.wav`, the chapter report.
#
# **If your numbers differ**
# - *A batch's codes differ from the alone run at once* → the mask (another's padding seen) or rope rows misplaced.
# - *`cache_layout.probe` refuses this build* → another ncnn's cache layout: batching is off. *B = 8 no faster per
#   frame than B = 4* → the codec dominates, or attention over long caches. *Batched int8 ≠ alone* → expected.

# %%
check.table()
