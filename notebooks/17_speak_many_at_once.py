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
# **You will:** fold several sequences into one decoder call with a `.param` rewrite; decode the SDPA layer's
# private cache layout so that sequences can join and leave a batch; draw the mask that keeps sequences apart;
# check a batch of four different prompts against the four run alone, token for token; watch continuous batching
# (sequences join and leave between frames); and read what batching buys at full size on a reference machine.
#
# **You will learn:** why batching is almost free in this loop, and where it stops being free (attention, the
# codec); why sequences go into the head axis and not into one shared cache; what holds bitwise and what only to
# float rounding; what `synthesize_many`, `qtts say --text-file --max-batch` and `qtts serve --max-batch` do.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing). The full-size tables are read
# from `data/bench/batch/` (committed; `python -m qtts_lib.bench batch` remakes them on your machine).
# **Leaves behind:** `data/outputs/<ckpt>/17_many_*.wav`, `data/reports/<ckpt>/17_speak_many_at_once.json`.

# %%
import inspect
import json
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import ncnn
import numpy as np
import pandas as pd
from IPython.display import Audio, display

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, save_wav
from qtts_lib.runtime.binding import cache_layout
from qtts_lib.runtime.binding.cached import KvCacheNet, batch_mask, merge
from qtts_lib.runtime.binding.net import make_net, net_from_text, to_mat
from qtts_lib.runtime.binding.param import parse_param
from qtts_lib.runtime.pipeline.loop import Batch
from qtts_lib.runtime.pipeline.sampling import Sampler
from qtts_lib.runtime.pipeline.scheduler import PREFILL_PIECE
from qtts_lib.runtime.pipeline.synthesizer import Scheduler, Utterance
from qtts_lib.runtime.rewrites.batch import fold_batch

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("17_speak_many_at_once", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # chapters 04-05's graphs, reused when current
synth = Synthesizer(model_dir, threads=THREADS)
talker = synth.config.talker
ncnn_dir = paths.ncnn_dir(ckpt)
print(f"{ckpt}: talker {talker['hidden_size']} wide, {talker['num_hidden_layers']} layers, "
      f"{talker['num_attention_heads']} heads / {talker['num_key_value_heads']} kv heads of {talker['head_dim']}")

# %% [markdown]
# ## 1. Four rows for the price of one
# Every frame the talker reads all its weights once and the code predictor reads its weights 15 times: the loop is
# bound by memory, not by arithmetic (chapter 11 counts the bytes). A projection over M rows reads the same weights
# as over one row; only the arithmetic grows, and a few rows are still far from the arithmetic the machine could
# do while it streams the weights. So B utterances decoded together cost about what one costs, *if* every graph
# call can take one row per utterance.
#
# Here is one talker step of this checkpoint at M rows (the folded graph of section 2; on a tiny checkpoint a step
# is mostly call overhead; the full-size numbers are in section 7):

# %%
step_net = synth.loop.talker
rng = np.random.default_rng(14)


def step_ms(rows: int, repeats: int = 30) -> float:
    """Median wall time of one talker step for `rows` sequences of 12 cached positions each."""
    x = rng.standard_normal((1, 12, talker["hidden_size"])).astype(np.float32)
    cache = merge([step_net.prefill(x)[1] for _ in range(rows)])
    times = []
    for _ in range(repeats):
        e = rng.standard_normal((rows, 1, talker["hidden_size"])).astype(np.float32)
        c = merge([cache])  # a fresh copy: every step sees 12 positions
        t0 = time.perf_counter()
        step_net.forward(e, c)
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


steps = pd.DataFrame([{"rows": m, "ms per step": round(step_ms(m), 2)} for m in (1, 2, 4, 8)])
steps["ms per row"] = (steps["ms per step"] / steps["rows"]).round(2)
display(steps)
print("(times on this machine, now; not asserted)")

# %% [markdown]
# ## 2. Fold the sequences into the head axis
# Everything in a decoder layer but attention treats rows independently: B sequences of L positions are just B·L
# rows. Attention is where rows meet. pnnx's graph computes it per head, `q (heads, rows, d)`, and SDPA lets every
# row see every cached row. `rewrites.batch.fold_batch` makes each sequence a group of heads of its own:
# `(heads, B·L, d) → (B·heads, L, d)` before SDPA (a Reshape, a 4-D Permute, a Reshape; L read from the mask's
# height), the inverse after. With grouped-query attention, query head `b·heads + h` reads key/value head
# `b·kv_heads + h // (heads/kv_heads)`: its own sequence's. One attention block, before and after:

# %%
kv_text = (ncnn_dir / "talker_decoder_kv.param").read_text()
folded_text = fold_batch(kv_text, talker["num_attention_heads"])


def first_attention(text: str) -> list[str]:
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("SDPA"))
    return [" ".join(line.split()) for line in lines[at - 6: at + 4]]


print("exported:\n  " + "\n  ".join(first_attention(kv_text)))
print("folded:\n  " + "\n  ".join(first_attention(folded_text)))
before, after = parse_param(kv_text).counts, parse_param(folded_text).counts
print({k: after[k] - before[k] for k in after if after[k] != before[k]}, "layers added per graph")
n_layers = talker["num_hidden_layers"]
check.equal("fold: per attention layer 7 Reshapes, 3 Permutes and a Split more, no Gemm", "Reshape Permute Split Gemm",
            tuple(after[k] - before[k] for k in ("Reshape", "Permute", "Split", "Gemm")),
            (7 * n_layers, 3 * n_layers, n_layers, 0))

# %% [markdown]
# At one sequence every reshape is the identity, so the folded graph must compute exactly what the exported one
# does. The runtime runs one sequence without the fold (its reshapes and permutes cost a step time) and loads the
# folded graph, its weights a second time, once something may batch (`KvCacheNet.batched_net`); a sequence
# prefilled alone then joins a batch with its cache as it is. Both hold only if the two graphs agree bit for bit:

# %%
plain = KvCacheNet(make_net(ncnn_dir / "talker_decoder_kv.param", ncnn_dir / "talker_decoder.bin", THREADS),
                   talker["num_hidden_layers"], talker["head_dim"], talker["rope_theta"])
folded_net = KvCacheNet(step_net.batched_net, talker["num_hidden_layers"], talker["head_dim"], talker["rope_theta"])
x = rng.standard_normal((1, 20, talker["hidden_size"])).astype(np.float32)
outs = []
for net in (plain, folded_net):
    h, cache = net.prefill(x[:, :12])
    outs.append(np.concatenate([h] + [net.forward(x[:, t:t + 1], cache) for t in range(12, 20)], axis=1))
check.equal("folded graph at one sequence = exported graph (prefill + 8 steps)", "bitwise equal",
            bool(np.array_equal(*outs)), True)

# %% [markdown]
# ### The other arrangement, and why not
# Without a rewrite, B sequences can share *one* cache: stack everyone's positions along the sequence axis and give
# SDPA a block-diagonal mask, so that each row sees only its own sequence's keys. It is exact, but every query then
# scores all B sequences' keys and throws B−1 of every B away, and a finished sequence's rows stay in the cache
# until it is rebuilt. One SDPA layer at the full-size shapes (16 heads, 8 kv heads of 128, B = 8 sequences of 300
# cached positions), both ways, on this machine:

# %%
inputs = "\n".join(f"Input {n} 0 1 {n}" for n in "qkvm")
SDPA_ONE = f"7767517\n6 9\n{inputs}\nInput c 0 2 pk pv\nSDPA sdpa 6 3 q k v m pk pv out ok ov 5=1 7=1\n"
empty = Path(tempfile.mkdtemp()) / "empty.bin"
empty.write_bytes(b"\0" * 4)
sdpa = net_from_text(SDPA_ONE, empty, THREADS)
layout = cache_layout.probe()
B, T, H, KV, D = 8, 300, 16, 8, 128


def sdpa_ms(q, k, v, mask, past_k, past_v, repeats: int = 20) -> float:
    mats = {**{name: to_mat(a) for name, a in zip("qkvm", (q, k, v, mask))},
            "pk": layout.write(past_k, "k"), "pv": layout.write(past_v, "v")}  # caches in the layer's own layout
    times = []
    for _ in range(repeats):
        ex, out = sdpa.create_extractor(), ncnn.Mat()
        for name, m in mats.items():
            ex.input(name, m)
        t0 = time.perf_counter()
        ex.extract("out", out)
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
folded = sdpa_ms(r(B * H, 1, D), r(B * KV, 1, D), r(B * KV, 1, D), np.zeros((1, T + 1), np.float32),
                 r(B * KV, T, D), r(B * KV, T, D))
block = np.full((B, B * (T + 1)), -np.inf, np.float32)  # row b sees sequence b's T cached positions and its new one
for b in range(B):
    block[b, b * T:(b + 1) * T] = 0
    block[b, B * T + b] = 0
shared = sdpa_ms(r(H, B, D), r(KV, B, D), r(KV, B, D), block, r(KV, B * T, D), r(KV, B * T, D))
print(f"folded into heads: {folded:.2f} ms; one shared cache, block-diagonal mask: {shared:.2f} ms "
      f"({shared / folded:.1f}x) (this machine, now; each query scores {T + 1} keys folded, {B * (T + 1)} shared)")

# %% [markdown]
# ## 3. The cache is the kernel's: read it to move sequences
# Sequences join a batch after their own prefill and leave it when they end, so caches must be cut and merged.
# Chapter 05 showed that a cache Mat fed back after a numpy round trip gives wrong attention. Why: the Mat says
# `(kv_heads, positions, head_dim)`, but its memory is the x86 SDPA kernel's own tiled layout, with capacity to
# spare. `binding.cache_layout.probe` runs one SDPA layer on random inputs, finds the tile and checks every element:

# %%
print(inspect.getsource(cache_layout.CacheLayout.key_index))
print(inspect.getsource(cache_layout.CacheLayout.value_index))
print("this build:", layout, "ncnn", ncnn.__version__)
x = rng.standard_normal((1, 10, talker["hidden_size"])).astype(np.float32)
_, cache = step_net.prefill(x[:, :9])
k0 = cache.blobs["cache_k_in_0"]
print(f"layer 0's K cache: c={k0.c} h={k0.h} w={k0.w}, cstep {k0.cstep} = room for {k0.cstep // k0.w} positions")
copy = merge([cache])  # every blob read into numpy and written back in the layout
check.equal("a cache read and written back: the next step is bitwise the same", "equal",
            bool(np.array_equal(step_net.forward(x[:, 9:], cache), step_net.forward(x[:, 9:], copy))), True)

# %% [markdown]
# ## 4. The mask that keeps sequences apart
# All sequences of a batch hold the same number of cached positions (the blobs are one array): a shorter one is
# padded at the front, and the mask, one row per head, hides each sequence's padding from it. Three sequences that
# joined with prompts of 30, 12 and 20 rows, four steps later:

# %%
def padded_cache(lengths: list[int]):
    x = rng.standard_normal((1, max(lengths), talker["hidden_size"])).astype(np.float32)
    return merge([step_net.prefill(x[:, :n])[1] for n in lengths])


demo = padded_cache([30, 12, 20])
for _ in range(4):
    step_net.forward(rng.standard_normal((3, 1, talker["hidden_size"])).astype(np.float32), demo)
heads = talker["num_attention_heads"]
mask = batch_mask(demo, 1, heads)
print(f"cache: {demo.past} positions; each sequence's own: {demo.lengths}; padding {demo.padding}; "
      f"mask {mask.shape} (sequences x heads, new rows, cached + new)")
fig, ax = plt.subplots(figsize=(9, 2.8))
ax.imshow(np.isfinite(mask[:, 0, :]), aspect="auto", cmap="Greys_r", interpolation="nearest")
for b in range(1, 3):
    ax.axhline(b * heads - 0.5, color="tab:red", lw=1)
ax.set(xlabel="key position (cached + this step's)", ylabel="query head (sequence-major)",
       title="white: visible, black: another sequence's padding")
plt.show()
check.equal("each sequence's heads see exactly its own positions", "visible keys per sequence",
            [int(np.isfinite(mask[b * heads, 0]).sum()) for b in range(3)], [n + 1 for n in demo.lengths])

# %% [markdown]
# ## 5. A batch of four against the four alone
# What could make a row in a batch differ from the same row alone: the projections run over M rows instead of one
# (another kernel tile, perhaps another order of additions), and attention scores padded positions that the mask
# sets to −∞ (they add exact zeros after the softmax). First, one talker step of the three padded sequences above
# against the same three sequences stepped alone, compared as numbers:

# %%
lengths = [30, 12, 20]
x = rng.standard_normal((3, max(lengths), talker["hidden_size"])).astype(np.float32)
alone_caches = [step_net.prefill(x[b:b + 1, :n])[1] for b, n in enumerate(lengths)]
together_cache = merge(alone_caches)  # a copy: the alone caches stay as they are
e = rng.standard_normal((3, 1, talker["hidden_size"])).astype(np.float32)
h_batched = step_net.forward(e, together_cache)
h_alone = np.concatenate([step_net.forward(e[b:b + 1], c) for b, c in enumerate(alone_caches)])
step_diff = float(np.abs(h_batched - h_alone).max() / np.abs(h_alone).max())
print(f"one step, 3 sequences: bitwise equal {np.array_equal(h_batched, h_alone)}, max relative difference "
      f"{step_diff:.2e} (ncnn {ncnn.__version__}, {THREADS} threads)")
check.at_most("a batched step's rows vs the same rows alone (max relative difference)", "relative", step_diff, 1e-5)

# %% [markdown]
# Then whole generations: four prompts of four lengths (x-vector and ICL clones, text trailing and inside the
# prompt), each with its own sampler, decoded in one `Batch` and each alone, greedy and sampled. The step above
# need not be bitwise equal (float32 rounding of the same numbers added in another order), and every decision
# downstream is the same unless it sits within that rounding of a boundary: an argmax between two nearly equal
# logits, or a sampled draw at the edge of a code's share of probability. So greedy codes are asserted equal;
# sampled ones are shown (one may now and then go its own way from a frame). On this checkpoint:

# %%
clip, clip_text = load_wav(paths.voice_wav()), (paths.INPUTS / "voice.txt").read_text().strip()
kinds = {"base": lambda: [synth.voice(wav=clip), synth.voice(wav=clip, text=clip_text)],
         "custom_voice": lambda: [synth.voice(speaker=s) for s in synth.speakers[:2]],
         "voice_design": lambda: [synth.voice(instruct="A calm, low voice."), synth.voice(instruct="")]}
voices = kinds[synth.kind]()
texts = ["Hello from ncnn.", "Every token of this sentence is checked against PyTorch, one by one.",
         "Four at once.", "A fourth sentence, of middling length, to fill the batch."]
prompts = [synth.prompt(t, "english", voices[i // 2], non_streaming=bool(i % 2)) for i, t in enumerate(texts)]
print("prompt rows:", [p.embeds.shape[0] for p in prompts])
FRAMES = 44


def sampler(i: int, greedy: bool) -> Sampler:
    return Sampler(Sampling(greedy=True) if greedy else Sampling(seed=40 + i), synth.config.talker)


rows = []
for greedy in (True, False):
    alone = [synth.loop.run(p, sampler(i, greedy), FRAMES) for i, p in enumerate(prompts)]
    batch = Batch(synth.loop, max_batch=4)
    together = [batch.add(p, sampler(i, greedy), FRAMES) for i, p in enumerate(prompts)]
    while batch:
        batch.step()
    for i, (a, b) in enumerate(zip(alone, together)):
        differ = [f for f in range(min(len(a.codes), len(b.codes))) if not np.array_equal(a.codes[f], b.codes[f])]
        rows.append({"sampling": "greedy" if greedy else f"seed {40 + i}", "prompt": i,
                     "rows": prompts[i].embeds.shape[0], "frames": len(b.codes),
                     "codes equal": len(a.codes) == len(b.codes) and not differ,
                     "first differing frame": differ[0] if differ else None})
        if greedy:
            check.tokens_equal(f"greedy prompt {i}: batched = alone", np.stack(b.codes), np.stack(a.codes))
display(pd.DataFrame(rows))

# %% [markdown]
# At full size the same four prompts, greedy, over a longer run (`python -m qtts_lib.bench batch --parity`, committed
# for the reference machine), in fp32 and in the int8 tier: where a code first changes on random weights, if it does.

# %%
REFERENCE = paths.DATA / "bench" / "batch" / "dev-2core-epyc-full-base"  # the reference machine's files
for tier in ("fp32", "int8"):
    full = json.loads(REFERENCE.with_name(f"{REFERENCE.name}-parity-{tier}.json").read_text())
    print(f"{full['checkpoint']}, {full['precision']}, B={full['batch']}, {full['frames']} frames, on "
          f"{full['machine']['cpu']} ({full['machine']['cores']} cores):")
    display(pd.DataFrame(full["sequences"]))

# %% [markdown]
# In fp32 every code of the four sequences holds to the end. In int8 the batched sequences leave the alone ones
# within the first frames. int8 quantizes each projection's input at run time (a scale from its absmax, then
# rounding to integers), with one scale per call, shared by the rows of a batch: a float32 rounding difference
# upstream can move a value across a rounding boundary of the quantizer, and a batched row's grid also depends on
# the other rows' largest value. int8 is already an approximation of fp32 that changes codes on random weights
# (chapter 13); a batch draws another sample of the same approximation. Batched int8 is *not* int8 alone, and only
# fp32 batches keep the parity checks.

# %% [markdown]
# ## 6. Continuous batching: join between frames, leave at the end
# A `Scheduler` keeps up to `max_batch` utterances running. A new one joins between two frames: while others run,
# its prompt is prefilled a piece at a time between frames (`PREFILL_PIECE` positions per step, so the running
# sequences wait for a piece, never for a whole prompt), then its cache joins the batch in place; into an empty
# batch it is prefilled whole. One that ends leaves at once (its channels cut out). Six utterances of different
# lengths through four places, with the batch width at every step:

# %%
caps = [30, 12, 22, 8, 26, 16]
scheduler = Scheduler(synth, max_batch=4)
print(f"prefill piece: {PREFILL_PIECE} prompt positions per step while others run")
tickets = [scheduler.submit(Utterance(f"Utterance number {i + 1}.", "english", voices[0], Sampling(seed=i),
                                      max_frames=c)) for i, c in enumerate(caps)]
widths, spans = [], {}
while scheduler:
    events = scheduler.step()  # one event per running utterance
    for event in events:
        spans.setdefault(event.ticket.id, [len(widths), len(widths)])[1] = len(widths)
    widths.append(len(events))
fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 4), sharex=True)
for row, t in enumerate(tickets):
    a1.barh(row, spans[t.id][1] - spans[t.id][0] + 1, left=spans[t.id][0], color=f"C{row}")
a1.set(yticks=range(len(tickets)), yticklabels=[f"#{i + 1} ({c} frames)" for i, c in enumerate(caps)],
       title="which utterance runs at which step")
a2.step(range(len(widths)), widths, where="mid")
a2.set(xlabel="step (one frame of every running utterance)", ylabel="batch width", ylim=(0, 4.5))
plt.tight_layout()
plt.show()
check.equal("never more than max_batch at once, and a full batch was reached", "max width", max(widths), 4)
check.equal("every utterance ran to its own end (its cap, or EOS before it)", "ended right",
            all(len(t.result.codes) == c if t.result.stopped == "cap" else len(t.result.codes) < c
                for c, t in zip(caps, tickets)), True)
check.equal("a new utterance started while others ran", "joined mid-batch",
            any(spans[t.id][0] > 0 for t in tickets), True)
many = synth.synthesize_many([Utterance(t, "english", voices[0], Sampling(seed=i), max_frames=40)
                              for i, t in enumerate(texts)], max_batch=4)
for i, result in enumerate(many):
    save_wav(paths.outputs_dir(ckpt) / f"17_many_{i}.wav", result.wav)
display(Audio(np.concatenate([r.wav for r in many]), rate=SAMPLE_RATE))

# %% [markdown]
# ## 7. What it buys at full size
# `python -m qtts_lib.bench batch` on `full-base`, on the reference machine: B utterances of the same length, each its
# own text, each B in a fresh process, interleaved repeats, medians. Times are per *aggregate* frame (all B
# sequences' frames); `rtf` is the aggregate real-time factor; `ms/frame each` is how fast each one advances. Other
# machines, the GPU among them, are side by side on the [results](results.ipynb) page.

# %%
bench = json.loads(REFERENCE.with_suffix(".json").read_text())
m = bench["machine"]
print(f"{bench['checkpoint']} on {m['cpu']}, {m['cores']} cores, {bench['rows'][0]['threads']} threads, "
      f"{bench['frames']} frames, ncnn {m['ncnn']}")
table = pd.DataFrame([{"precision": r["precision"], "B": r["batch"], **r["ms_per_frame"], "rtf": r["rtf"],
                       "frames/s": r["frames_per_s"], "ms/frame each": r["sequence_ms_per_frame"],
                       "codec share": r["codec_share"], "peak GiB": r["peak_rss_gb"]} for r in bench["rows"]])
display(table)
for precision, g in table.groupby("precision", sort=False):
    loop = (g["talker"] + g["predictor"]).to_numpy()
    at4 = g[g.B == 4].iloc[0]
    print(f"{precision}: the loop {loop[0]:.1f} ms per frame at B={g.B.iloc[0]}, {loop[-1]:.1f} per aggregate "
          f"frame at B={g.B.iloc[-1]} ({loop[0] / loop[-1]:.1f}x less); the codec {g.codec.min():.0f}-"
          f"{g.codec.max():.0f} ms per frame at every B; at B=4 the loop {at4.talker + at4.predictor:.0f} ms "
          f"per aggregate frame, the codec {at4.codec:.0f} ({at4['codec share']:.0%} of the time)")
fig, axes = plt.subplots(1, table.precision.nunique(), figsize=(11, 3.4), sharey=True)
for ax, (precision, g) in zip(axes, table.groupby("precision", sort=False)):
    g.set_index("B")[["talker", "predictor", "codec"]].plot.bar(stacked=True, ax=ax, rot=0)
    ax.set(ylabel="ms per aggregate frame", title=f"where the time goes ({precision})")
plt.tight_layout()
plt.show()

# %% [markdown]
# The loop's cost per aggregate frame falls almost as 1/B at first (the weights are read once for B rows) and more
# slowly later, as the arithmetic, attention over B caches and per-call overhead catch up. The codec does not batch:
# it is bound by arithmetic, not memory (chapter 12 measures it against the machine's peak), so decoding B
# utterances costs B times one, and its share of every aggregate frame grows with B (in int8 it soon is the larger
# part). The lever is then the codec's own cost: chapter 14's bf16 tier. The same harness with
# `--codec-precision fp32,bf16`, each row beside its twin (aggregate RTF):

# %%
bf16 = json.loads(REFERENCE.with_name(f"{REFERENCE.name}-codec-bf16.json").read_text())
twins = pd.DataFrame([{"precision": r["precision"], "codec": r["codec_precision"], "B": r["batch"], "rtf": r["rtf"]}
                      for r in bf16["rows"]])
display(twins.pivot_table(index=["precision", "B"], columns="codec", values="rtf"))

# %% [markdown]
# ## 8. Where users get it
# - Python: `synth.synthesize_many([Utterance(text, language, voice, sampling, max_frames), ...], max_batch=4)`,
#   results in order; a `Scheduler` to submit utterances at any time (what the server runs).
# - `qtts say --text-file book.txt --max-batch 4`: a long text's segments, four at a time (the default).
# - `qtts serve --max-batch 4`: concurrent requests share the batch; each response still streams its own frames as
#   they come; `/health` shows `batch`, `max_batch` and the `largest_batch` seen. A request is a *lane*
#   (`Scheduler.lane`): it keeps its place from its first segment to its last, so a long text's next segment goes
#   before any request that has not started, and a running stream never waits behind a newcomer; a request that
#   joins is prefilled in pieces of `PREFILL_PIECE` (32) positions between frames. Chapter 18 serves this over HTTP
#   and reads what it changes for a running stream under load.
# - On a GPU `--max-batch` defaults to 1: chapter 10's GPU forms take one sequence per call, the fastest for one.
#   More loads the CPU's folded graphs on the device (`gpu_batches=True`): more round trips per frame, each serving
#   B sequences, with caches that come back plain (`cache_layout.probe("vulkan")`), so sequences join and leave as
#   on the CPU. The [results](results.ipynb) page shows how that scales on a GPU host.

# %% [markdown]
# ## Summary
# - Sequences fold into the attention's head axis (`rewrites.batch.fold_batch`): every other layer sees B·L rows,
#   every weight is read once for all of them, and at one sequence the graph is bitwise the exported one.
# - The SDPA cache is in the kernel's tiled layout; `binding.cache_layout` probes it so that sequences can be merged
#   (left-padded, a per-head mask) and cut.
# - A batch of different prompts gives each prompt's own hidden states to float32 rounding, so its own greedy codes
#   (here, and at full size in fp32 over the committed run); a sampled draw can flip where it sits on a boundary;
#   in int8 the run-time quantizer turns rounding differences into different codes.
# - Continuous batching (`Scheduler`): prefill in pieces between frames, join, leave the frame it ends; a request
#   keeps its place from its first segment to its last.
# - The loop's cost per aggregate frame falls with B; the codec does not batch, so its share of the time grows.
#
# **Artifacts left:** `data/outputs/<ckpt>/17_many_*.wav`, the chapter report.
#
# **If your numbers differ**
# - *A batch's codes differ from the alone run at once* → the mask: a sequence sees another's padding, or rope rows
#   at the wrong positions (each sequence its own `lengths[b]`).
# - *`cache_layout.probe` refuses this build* → another ncnn version keeps its cache differently: batching is off
#   (B = 1 still works); read the probe's message.
# - *B = 8 no faster per frame than B = 4* → the codec dominates (codec share), or attention over long caches.
# - *Batched int8 codes differ from int8 alone* → expected: the run-time quantizer's scale is shared by the rows of
#   a call (section 5); compare batches in fp32.

# %%
check.table()
