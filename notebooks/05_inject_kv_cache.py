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
# # 05 · Inject a KV cache into the decoders
# > pnnx writes no cache interface; we add one by editing the .param text.
#
# **You will:** rewrite the exported talker and code-predictor decoders so every SDPA layer takes and returns its
# keys and values; write a one-sequence cache and run them with it (prefill once, then one position per step, the
# cache Mats held by the sequence and fed back untouched); check every step against the torch wrapper recomputing
# the whole prefix.
#
# **You will learn:** the ncnn KV-cache recipe (SDPA `7=1`, 6 inputs / 3 outputs, one cache `Input` line); what a
# step needs (the caches untouched, a zero mask `(1, past+1)`, rope rows at the absolute position); why the net is
# stateless and the cache is the sequence's; why caches must never leave ncnn.
#
# **You need:** `models/<ckpt>/ncnn/{talker,predictor}_decoder.param/.bin` (chapter 04; exported here if missing or
# stale); chapter 03's main greedy golden (`xvec_greedy.npz`) for a real prompt to prefill (a synthetic one
# otherwise, said so).
# **Leaves behind:** `models/<ckpt>/ncnn/{talker,predictor}_decoder_kv.param` (+ manifest),
# `data/reports/<ckpt>/05_inject_kv_cache.json`.

# %%
import inspect

import ncnn
import numpy as np
import torch

from qtts_lib import artifacts, check, checkpoint, export, golden, modules, paths, plots, probe, reference, settings
from qtts_lib.export import kvcache
from qtts_lib.modules import common
from qtts_lib.runtime.binding import rope
from qtts_lib.runtime.binding.net import from_mat, make_net, run, to_mat
from qtts_lib.runtime.pipeline import precision

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("05_inject_kv_cache", ckpt)
tts = reference.load(checkpoint.ensure(ckpt), threads=THREADS)
cfg = checkpoint.load_config(ckpt)["talker_config"]
DECODERS = {"talker_decoder": cfg, "predictor_decoder": cfg["code_predictor_config"]}
# both graphs take talker-wide rows (where the predictor is narrower, its graph projects them: chapter 09)
WIDTH = cfg["hidden_size"]
out_dir = paths.ncnn_dir(ckpt)
export.export_all(tts, ckpt, names=list(DECODERS))  # reuses chapter 04's exports when they are current

# %% [markdown]
# ## 1. Rewrite the .param: give every SDPA a cache
# ncnn's SDPA layer already supports a cache: with `7=1` it takes the past keys and values as two extra inputs,
# appends this call's keys and values, attends over all of them, and returns the grown caches as two extra outputs.
# The rewrite (`qtts_lib.runtime.rewrites.kv_cache.add_kv_cache`, in the runtime because the codec's streaming
# decoder uses it too; `qtts_lib.export.kvcache` writes the files) is a pure text function:

# %%
print(inspect.getsource(kvcache.add_kv_cache))

# %%
before = (out_dir / "talker_decoder.param").read_text()
after = kvcache.add_kv_cache(before)
show = lambda text: ([line for line in text.splitlines() if line.startswith(("SDPA", "Input"))][:6]
                     + [text.splitlines()[1] + "   <- layer and blob counts"])
print("before:", *show(before), sep="\n  ")
print("after:", *show(after), sep="\n  ")
info = export.parse_param(after)
check.equal("header counts recomputed (layers)", "count", int(after.splitlines()[1].split()[0]), len(info.layers))

# %% [markdown]
# Write the cached graphs next to the uncached ones. The weights do not change, so `<name>_kv.param` uses the same
# `<name>.bin`; the manifest records which `.param` it came from.

# %%
for name, c in DECODERS.items():
    path = kvcache.write_kv_param(ckpt, name)
    n = kvcache.count_caches(path.read_text())
    check.equal(f"{name}: cached SDPA layers = decoder layers", "count", n, c["num_hidden_layers"])
    print(f"{path.name}: {n} cached layers, shares {name}.bin")

# %% [markdown]
# ## 2. Run it: prefill, then one position per step
# The cache belongs to the sequence, not to the net. For one sequence it is a small object: for every cached layer,
# the K and V Mats to feed next time, and how many positions they hold (`past`). It starts empty. `forward` runs
# `L` new positions after the cache's: a prefill feeds the empty Mats and a causal mask `(L, L)`; every step feeds
# the Mats of the previous call **untouched**, a zero mask `(1, past+1)` (the new position may see everything
# before it) and the cos/sin rows of its absolute position. The grown caches come out as Mats extracted with
# `type=1` (the `raw=` outputs of chapter 04's `binding.net.run`) and become the next call's inputs.

# %%
class OneCache:
    """One sequence's cache: the K and V Mats of every cached layer, to feed next time, and the positions held."""

    def __init__(self, layers: int):
        self.mats = {f"cache_{kv}_in_{i}": ncnn.Mat() for i in range(layers) for kv in "kv"}
        self.past = 0


def forward(net: ncnn.Net, x: np.ndarray, cache: OneCache, c: dict) -> np.ndarray:
    """x (1, L, hidden): L new positions after the cache's -> hidden (1, L, hidden); the cache grows by L."""
    length = x.shape[1]
    cos, sin = rope.tables(c["head_dim"], c["rope_theta"], cache.past, length)  # rows at the absolute positions
    mask = rope.causal_mask(length, cache.past)  # (L, past+L): causal for a prefill, zeros for one step
    outputs = [f"cache_{kv}_out_{i}" for i in range(c["num_hidden_layers"]) for kv in "kv"]
    out, *mats = run(net, {"in0": x, "in1": mask, "in2": cos, "in3": sin} | cache.mats, ["out0", *outputs],
                     axes={"in0": 0, "out0": 0}, raw=outputs)
    cache.mats = {name.replace("_out_", "_in_"): m for name, m in zip(outputs, mats)}  # fed back as they are
    cache.past += length
    return out


def cached_net(name: str) -> ncnn.Net:
    return make_net(out_dir / f"{name}_kv.param", out_dir / f"{name}.bin", THREADS)

# %% [markdown]
# Because the net keeps nothing between calls, two sequences can take turns on one net. Each gives exactly what it
# gives when it runs alone:

# %%
c = DECODERS["predictor_decoder"]
net = cached_net("predictor_decoder")
xs = np.random.default_rng(3).standard_normal((2, 1, 6, WIDTH), dtype=np.float32)  # 2 x (1, 6, talker hidden)


def alone(x: np.ndarray) -> np.ndarray:
    kv_cache = OneCache(c["num_hidden_layers"])
    return np.concatenate([forward(net, x[:, :2], kv_cache, c)]
                          + [forward(net, x[:, t : t + 1], kv_cache, c) for t in range(2, 6)], axis=1)


caches = [OneCache(c["num_hidden_layers"]) for _ in xs]
turns = [forward(net, x[:, :2], kv_cache, c) for x, kv_cache in zip(xs, caches)]  # both prefilled
for t in range(2, 6):
    for i, (x, kv_cache) in enumerate(zip(xs, caches)):
        turns[i] = np.concatenate([turns[i], forward(net, x[:, t : t + 1], kv_cache, c)], axis=1)
for i, (x, hidden, kv_cache) in enumerate(zip(xs, turns, caches)):
    check.equal(f"sequence {i}, taking turns with another on one net = alone", "bitwise equal",
                bool(np.array_equal(hidden, alone(x))), True)
    check.equal(f"sequence {i}: positions in its cache", "past", kv_cache.past, 6)

# %% [markdown]
# The runtime's `KvCacheNet` (`runtime.binding.cached`) is this cache for many sequences at once, padded to one
# length (chapter 17). For one sequence it computes what `forward` computes, bit for bit:

# %%
runtime_net = precision.decoder(out_dir, "predictor_decoder", c["head_dim"], c["rope_theta"], threads=THREADS)
hidden, runtime_cache = runtime_net.prefill(xs[0][:, :2])
runtime_hidden = np.concatenate([hidden] + [runtime_net.forward(xs[0][:, t : t + 1], runtime_cache)
                                            for t in range(2, 6)], axis=1)
check.equal("runtime KvCacheNet, one sequence = OneCache + forward", "bitwise equal",
            bool(np.array_equal(runtime_hidden, alone(xs[0]))), True)

# %% [markdown]
# ## 3. Check every step against torch
# The torch side has no cache at all: at step *t* the chapter-02 wrapper recomputes the whole prefix of *t+1*
# positions with a causal mask and we compare its last row. If the cache is fed back wrong, positions drift apart
# after the first step. The talker prefills the real prompt embeddings of chapter 03's golden run (when present),
# the code predictor its real 2-position prefill length; then 24 steps of unit-Gaussian inputs.
#
# The decoders are the runtime's own, the `KvCacheNet` of section 2 (fp32: the exported `_kv.param` for the
# prefill and for the steps, one graph, each weight held once). `probe.probe_decode` (chapter 04's probe, for a
# cached graph) drives it exactly as the runtime does (one call per step on a cache of its own) and, inside each
# call's own Extractor, also extracts every Gemm's output
# blob: before `out0`, so no layer runs twice and the caches go back into ncnn untouched. It pairs those blobs with
# the wrapper's hooked `Linear` outputs at the new positions, so every call yields the output error *and* the error
# at every layer.

# %%
main_golden = paths.golden_dir(ckpt) / f"{golden.mode_of(tts)}_greedy.npz"
try:
    prompt = artifacts.load_npz(main_golden, ckpt)[0]["inputs_embeds"][None]  # (1, P, hidden)
    print(f"talker prefill: the {prompt.shape[1]}-position prompt of {main_golden.name}")
except artifacts.StaleArtifact as e:
    prompt = None
    print(f"talker prefill: synthetic, because {e}")
STEPS = 24
per_step, probed = {}, {}
for name, c in DECODERS.items():
    net = precision.decoder(out_dir, name, c["head_dim"], c["rope_theta"], threads=THREADS)
    wrapper = modules.get(name).build(tts)
    g = np.random.default_rng(5)
    first = (prompt if name == "talker_decoder" and prompt is not None
             else g.standard_normal((1, 2, WIDTH), dtype=np.float32))
    x = np.concatenate([first, g.standard_normal((1, STEPS, WIDTH), dtype=np.float32)], axis=1)
    P = first.shape[1]

    def torch_inputs(n, c=c, x=x):
        cos, sin = common.rope_tables(c["head_dim"], c["rope_theta"], 0, n)
        return torch.from_numpy(x[:, :n]), common.causal_mask(n), cos, sin

    probed[name] = probe.probe_decode(wrapper, net, out_dir, x, P, torch_inputs, steps=range(STEPS + 1))
    errs = [r.rows[-1]["rel"] for r in probed[name].values()]  # the last tap is the graph output, out0
    per_step[name] = errs
    check.at_most(f"{name}: prefill ({P} positions)", "rel", errs[0], 1e-5)
    check.at_most(f"{name}: worst of {STEPS} cached steps", "rel", max(errs[1:]), 1e-5)
    worst = max((r.worst for r in probed[name].values()), key=lambda row: row["rel"])
    check.at_most(f"{name}: worst layer over all calls, {worst['label']}", "rel", worst["rel"], 1e-5)

# %%
versions = f"ncnn {ncnn.__version__} vs torch {torch.__version__}, {ckpt}, {THREADS} threads"
curves = {f"{n}: output": e for n, e in per_step.items()}
curves |= {f"{n}: worst layer": [r.worst["rel"] for r in probed[n].values()] for n in probed}
plots.step_errors(curves, threshold=1e-5,
                  title=f"cached ncnn decoders vs torch recomputing the prefix ({versions})");

# %% [markdown]
# The same probe, per layer, at a few calls of the talker: the prefill, the first step, and later ones. The curves
# lie on top of each other; a cache fed back wrong would leave the prefill where it is and lift every later call,
# starting at the first attention output (`o_proj`) of layer 0.

# %%
calls = sorted({0, 1, STEPS // 2, STEPS})
plots.layer_errors({f"call {i}": probed["talker_decoder"][i] for i in calls}, threshold=1e-5,
                   title=f"talker_decoder per layer at calls {calls} ({versions})");

# %% [markdown]
# ## 4. The cache is private to ncnn: keep it there
# The cache Mats belong to the SDPA backend. On this x86 build they keep a head-contiguous layout and reserve spare
# sequence capacity in `cstep`, which later steps append into. Watch the capacity grow ahead of the length:

# %%
c = DECODERS["talker_decoder"]
net = cached_net("talker_decoder")
x = np.random.default_rng(1).standard_normal((1, 16, WIDTH), dtype=np.float32)
kv_cache = OneCache(c["num_hidden_layers"])
forward(net, x[:, :4], kv_cache, c)
for t in range(4, 16):
    k = kv_cache.mats["cache_k_in_0"]  # what the next call feeds layer 0
    if t in (4, 5, 8, 12, 15):
        print(f"past {kv_cache.past:2d}: cache k of layer 0  w={k.w} h={k.h} c={k.c}  "
              f"cstep={k.cstep} (room for {k.cstep // k.w} rows)")
    forward(net, x[:, t : t + 1], kv_cache, c)

# %% [markdown]
# Two tempting shortcuts destroy that state. The tuple form `ret, m = ex.extract(name)` returns a **clone** (plain
# layout, no spare capacity); a numpy round trip does the same and worse. Fed back, both give wrong attention
# without any error (NaN or plain wrong numbers, depending on the step). We run the same 4 steps three ways, on the
# bare binding (an Extractor of their own instead of `run`), so each way of extracting is written out:

# %%
def run_steps(mode: str, steps: int = 4) -> list[np.ndarray]:
    """Prefill + steps on the talker's cached graph, extracting caches the way `mode` says."""
    c = DECODERS["talker_decoder"]
    net = make_net(out_dir / "talker_decoder_kv.param", out_dir / "talker_decoder.bin", THREADS)
    layers = c["num_hidden_layers"]
    x = np.random.default_rng(2).standard_normal((1, 8 + steps, WIDTH), dtype=np.float32)
    caches, outs = None, []
    for t in [0] + list(range(8, 8 + steps)):
        length = 8 if t == 0 else 1
        past = 0 if t == 0 else t
        cos, sin = rope.tables(c["head_dim"], c["rope_theta"], past, length)
        ex = net.create_extractor()
        held = [to_mat(x[:, t : t + length], 0), to_mat(rope.causal_mask(length, past)), to_mat(cos), to_mat(sin)]
        for i, m in enumerate(held):
            ex.input(f"in{i}", m)
        for i in range(layers):
            k, v = (ncnn.Mat(), ncnn.Mat()) if caches is None else caches[i]
            ex.input(f"cache_k_in_{i}", k)
            ex.input(f"cache_v_in_{i}", v)
        out = ncnn.Mat()
        ex.extract("out0", out)
        outs.append(from_mat(out, 0))
        caches = []
        for i in range(layers):
            if mode == "in place, type=1":
                k, v = ncnn.Mat(), ncnn.Mat()
                ex.extract(f"cache_k_out_{i}", k, 1)
                ex.extract(f"cache_v_out_{i}", v, 1)
            elif mode == "tuple form (clone)":
                _, k = ex.extract(f"cache_k_out_{i}")
                _, v = ex.extract(f"cache_v_out_{i}")
            else:  # numpy round trip
                _, k = ex.extract(f"cache_k_out_{i}")
                _, v = ex.extract(f"cache_v_out_{i}")
                k, v = to_mat(np.array(k.numpy())), to_mat(np.array(v.numpy()))
            caches.append((k, v))
    return outs


ways = {m: run_steps(m) for m in ("in place, type=1", "tuple form (clone)", "numpy round trip")}
right = ways["in place, type=1"]
for mode, outs in ways.items():
    nans = sum(int(np.isnan(o).any()) for o in outs[1:])
    worst = max(check.rel_err(o, r) for o, r in zip(outs[1:], right[1:]))
    worst = float("inf") if nans else worst  # NaN output counts as infinitely wrong
    print(f"{mode:20}  prefill equal: {np.array_equal(outs[0], right[0])}   steps with NaN: {nans}/{len(outs) - 1}   "
          f"worst step vs in-place: rel {worst:.3g}")
    if mode != "in place, type=1":
        check.at_least(f"{mode}: cached steps go wrong on ncnn {ncnn.__version__}", "rel vs in-place", worst, 1e-2)

# %% [markdown]
# ## Summary
# - The cache interface is a text rewrite: SDPA 4-in/1-out → 6-in/3-out with `7=1`, one `Input` line for all cache
#   blobs, counts recomputed; the weights are shared with the uncached graph.
# - The cache is the sequence's (`OneCache`: its Mats and `past`), the net only the graph: a prefill starts a
#   cache, each `forward` grows it. The runtime's `KvCacheNet` is the same for many sequences (chapter 17).
# - Prefill with empty caches and a causal mask; each step with the previous caches untouched, a zero mask
#   `(1, past+1)` and rope rows at the absolute position. Every step matches torch to ~1e-7 relative, at the
#   output and at every layer the probe pairs.
# - Extract caches in place with `type=1` and feed them back as they are; a clone or a numpy round trip silently
#   breaks attention.
#
# **Artifacts left:** `models/<ckpt>/ncnn/{talker,predictor}_decoder_kv.param` with manifest entries;
# the chapter report.
#
# **If your numbers differ**
# - *Prefill right, steps wrong* → caches extracted with the tuple form or converted to numpy (section 4).
# - *A sequence differs when another takes turns on the same net* → state kept in the net instead of the sequence's
#   own cache (section 2).
# - *Steps right for a while, then wrong* → rope rows not at the absolute position (`past`),
#   or the mask width is not `past+1`.
# - *`load_param` fails on the _kv file* → the header counts; `export.parse_param` on it shows which line is off.

# %%
check.table()
