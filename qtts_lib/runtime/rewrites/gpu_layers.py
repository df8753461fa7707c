"""A decoder graph with as few ncnn layers as the same arithmetic allows: the GPU form of chapter 10.

On Vulkan through the pip binding an extract costs a roughly fixed time per ncnn layer (host-side recording and
one dispatch with its barrier each), whatever the layer computes: the lever is the number of layers. The exported
decoder spends ~30 layers per transformer layer; this rewrite gets it to ~20 with the same arithmetic, text and
bytes in, text and bytes out (no ncnn, no torch):

- q/k/v and gate/up Gemms that share an input are one Gemm over their stacked weights (`int8.fuse_shared_input`);
- the head split of q, k and v (three Reshape, three Permute) is one Reshape and one Permute of the fused output;
  q and k then share one RMSNorm and one RotaryEmbed when their norms are the same op (weightless, equal params:
  the exported random checkpoints), else each keeps its own; a Slice along the heads hands q, k, v to SDPA;
- the residual adds go into the Gemm before them (`o_proj`, `down_proj`) as its C input (out = A·Bᵀ + C: the same
  one addition per element);
- Splits left with one consumer are dropped.

Every matcher checks the exact shape it rewrites and leaves anything else as it was. `ensure_gpu_decoder` writes
the result once per export (`ncnn/gpu/`), as the int8 tier is written (`pipeline.precision.ensure_int8`).
"""
from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np

from ..binding.graph import Graph, params_dict, set_params
from ..binding.param import ParamLayer, parse_param
from ..binding.weights import Segment, join_bin, split_bin
from .int8 import fuse_shared_input

FORMAT = 1  # bump when the rewrite changes: written files of an older format are rewritten


def drop_single_splits(g: Graph) -> int:
    """Split layers with one output: gone, their input renamed (or, after an Input, their output's consumers)."""
    removed = 0
    for split in [lyr for lyr in g.layers if lyr.type == "Split" and len(lyr.outputs) == 1]:
        src, dst = split.inputs[0], split.outputs[0]
        producer = g.producer(src)
        g.layers.remove(split)
        if producer is not None and producer.type != "Input":
            producer.outputs = [dst if b == src else b for b in producer.outputs]
            for lyr in g.layers:  # no one else reads src (pnnx splits every shared blob), but be exact
                lyr.inputs = [dst if b == src else b for b in lyr.inputs]
        else:
            for lyr in g.layers:
                lyr.inputs = [src if b == dst else b for b in lyr.inputs]
        removed += 1
    return removed


def _only(g: Graph, blob: str, kind: str, params: dict | None = None) -> ParamLayer | None:
    """The producer of `blob` if it is a `kind` layer with one input whose output only one layer reads."""
    p = g.producer(blob)
    if p is None or p.type != kind or len(p.outputs) != 1 or len(g.consumers(blob)) != 1:
        return None
    if params is not None and any(params_dict(p).get(k) != v for k, v in params.items()):
        return None
    return p


def _unsplit(g: Graph, blob: str) -> None:
    """`blob` is read no more: take it out of the Split that made it."""
    p = g.producer(blob)
    if p is not None and p.type == "Split" and not g.consumers(blob):
        p.outputs = [b for b in p.outputs if b != blob]


def fold_heads(g: Graph, weights: dict) -> int:
    """The q/k/v head split of every SDPA whose q, k, v come from one fused Gemm's Slice (module docstring);
    `weights` (`fuse_shared_input`'s: layer name -> tuple of row blocks) has each such Gemm's blocks put in q, k, v
    order. Returns the number of attention blocks rewritten."""
    done = 0
    for sdpa in [lyr for lyr in g.layers if lyr.type == "SDPA"]:
        q, k, v = sdpa.inputs[:3]
        rq, rk = _only(g, q, "RotaryEmbed"), _only(g, k, "RotaryEmbed")
        pv = _only(g, v, "Permute", {"0": "2"})
        if rq is None or rk is None or pv is None or rq.params != rk.params:
            continue
        pq, pk = (_only(g, r.inputs[0], "Permute", {"0": "2"}) for r in (rq, rk))
        if pq is None or pk is None:
            continue
        nq, nk = _only(g, pq.inputs[0], "RMSNorm"), _only(g, pk.inputs[0], "RMSNorm")
        if nq is None or nk is None:
            continue
        sq, sk, sv = (_only(g, x.inputs[0], "Reshape") for x in (nq, nk, pv))
        if sq is None or sk is None or sv is None:
            continue
        sl = g.producer(sq.inputs[0])
        want = [sq.inputs[0], sk.inputs[0], sv.inputs[0]]
        if (sl is None or sl.type != "Slice" or sorted(sl.outputs) != sorted(want) or len(set(want)) != 3
                or params_dict(sl).get("1") != "-1" or g.producer(sl.inputs[0]) is None):
            continue
        gemm = g.producer(sl.inputs[0])
        blocks = weights.get(gemm.name)
        if not isinstance(blocks, tuple) or len(blocks) != 3:
            continue
        order = [sl.outputs.index(b) for b in want]
        weights[gemm.name] = tuple(blocks[i] for i in order)
        dims = params_dict(nq)
        head_dim = int(dims["0"])
        sizes = [int(s) for s in params_dict(sl)["-23300"].split(",")[1:]]
        sizes = [sizes[i] for i in order]
        if head_dim < 1 or any(s % head_dim for s in sizes) or params_dict(nk).get("0") != dims["0"]:
            continue
        hq, hk, hv = (s // head_dim for s in sizes)
        shared_norm = nq.params == nk.params and dims.get("2") == "0"
        fused_out = sl.inputs[0]
        stem = sl.name
        heads, perm = g.fresh(stem + "_heads"), g.fresh(stem + "_perm")
        new = [ParamLayer("Reshape", g.fresh(stem + "_reshape"), [fused_out], [heads],
                          [f"0={head_dim}", f"1={hq + hk + hv}", "2=-1"]),
               ParamLayer("Permute", g.fresh(stem + "_permute"), [heads], [perm], ["0=2"])]
        cos_sin_k = rk.inputs[1:]
        if shared_norm:
            qk, qkn, qkr = g.fresh(stem + "_qk"), g.fresh(stem + "_qkn"), g.fresh(stem + "_qkr")
            new += [ParamLayer("Slice", g.fresh(stem + "_slice_qkv"), [perm], [qk, v],
                               [f"-23300=2,{hq + hk},{hv}", "1=0"]),
                    ParamLayer("RMSNorm", nq.name, [qk], [qkn], list(nq.params)),
                    ParamLayer("RotaryEmbed", rq.name, [qkn] + rq.inputs[1:], [qkr], list(rq.params)),
                    ParamLayer("Slice", g.fresh(stem + "_slice_qk"), [qkr], [q, k], [f"-23300=2,{hq},{hk}", "1=0"])]
            gone_rope = [rk]
        else:
            q0, k0, qn, kn = (g.fresh(stem + s) for s in ("_q", "_k", "_qn", "_kn"))
            new += [ParamLayer("Slice", g.fresh(stem + "_slice_qkv"), [perm], [q0, k0, v],
                               [f"-23300=3,{hq},{hk},{hv}", "1=0"]),
                    ParamLayer("RMSNorm", nq.name, [q0], [qn], list(nq.params)),
                    ParamLayer("RMSNorm", nk.name, [k0], [kn], list(nk.params)),
                    ParamLayer("RotaryEmbed", rq.name, [qn] + rq.inputs[1:], [q], list(rq.params)),
                    ParamLayer("RotaryEmbed", rk.name, [kn] + rk.inputs[1:], [k], list(rk.params))]
            gone_rope = []
        at = g.layers.index(sl)
        old = [sl, sq, sk, sv, nq, nk, pq, pk, pv, rq, rk]
        for lyr in old:
            g.layers.remove(lyr)
        g.layers[at:at] = new
        # the new layers sit where the Slice was: move them after the producers of cos/sin (Splits of the inputs)
        last = max(g.layers.index(g.producer(b)) for b in rq.inputs[1:] if g.producer(b) is not None)
        if last > at:
            for lyr in new:
                g.layers.remove(lyr)
            last = max(g.layers.index(g.producer(b)) for b in rq.inputs[1:] if g.producer(b) is not None)
            g.layers[last + 1:last + 1] = new
        if gone_rope:
            for b in cos_sin_k:
                _unsplit(g, b)
        done += 1
    return done


def _plain_gemm(layer: ParamLayer) -> bool:
    """A Gemm over one input and constant weights, with no C, alpha = beta = 1, no transposed output."""
    d = params_dict(layer)
    return (layer.type == "Gemm" and len(layer.inputs) == 1 and d.get("5") == "1" and d.get("4", "0") == "0"
            and d.get("2", "0") == "0" and (d.get("6", "0") == "0" or d.get("10", "-1") == "-1")
            and float(d.get("0", "1")) == 1.0 and float(d.get("1", "1")) == 1.0 and d.get("14", "0") == "0"
            and d.get("18", "0") == "0" and d.get("11", "0") == "0")


def fold_residuals(g: Graph) -> int:
    """BinaryOp add(x, Gemm(h)) -> Gemm(h, C=x): the residual as the Gemm's C input."""
    done = 0
    for add in [lyr for lyr in g.layers if lyr.type == "BinaryOp" and len(lyr.inputs) == 2]:
        d = params_dict(add)
        if d.get("0", "0") != "0" or any(k not in ("0",) for k in d):
            continue
        for i, b in enumerate(add.inputs):
            gemm = g.producer(b)
            other = add.inputs[1 - i]
            if gemm is None or not _plain_gemm(gemm) or len(g.consumers(b)) != 1 or other == b:
                continue
            gd = params_dict(gemm)
            gd["6"] = "0"
            gd.pop("10", None)
            set_params(gemm, gd)
            gemm.inputs = [gemm.inputs[0], other]
            gemm.outputs = list(add.outputs)
            g.layers.remove(gemm)  # to where the add was: after the producer of `other`
            g.layers[g.layers.index(add)] = gemm
            done += 1
            break
    return done


def gpu_decoder(text: str, data, kv_text: str | None = None) -> tuple[dict[str, str], bytes, dict]:
    """The GPU forms of a decoder graph (`text`, its .bin `data`: bytes or an mmap) -> ({"full": the graph without a
    cache, and given its `_kv` form `kv_text`, "kv": that rewritten alike, "step": its one-position GEMV form
    (`gemv_step`)}, the .bin all of them read (the same weights in the same order), layer counts)."""
    segs = split_bin(text, data)

    def rewrite(src: str, residuals: bool = True) -> tuple[str, dict, dict]:
        g = Graph(src)
        weights = {}
        for layer in g.layers:
            if layer.type == "Gemm" and layer.name in segs and params_dict(layer).get("5") == "1":
                d = params_dict(layer)
                weights[layer.name] = segs[layer.name][0].array().reshape(int(d["8"]), int(d["9"]))
        stats = {"fused_gemms": fuse_shared_input(g, weights)}
        stats["single_splits"] = drop_single_splits(g)
        stats["attention_blocks"] = fold_heads(g, weights)
        stats["residuals"] = fold_residuals(g) if residuals else 0
        stats["single_splits"] += drop_single_splits(g)
        return g.text(), weights, stats

    new, weights, stats = rewrite(text)
    out = dict(segs)
    for name, w in weights.items():
        if isinstance(w, tuple):  # a fused Gemm: its rows stacked
            out[name] = [Segment.of(np.concatenate(w), True)]
    for name in set(segs) - {lyr.name for lyr in parse_param(new).layers}:
        del out[name]
    texts = {"full": new}
    if kv_text is not None:
        texts["kv"] = rewrite(kv_text)[0]
        texts["step"] = gemv_step(rewrite(kv_text, residuals=False)[0])
    for form, t in texts.items():
        if _weight_order(t) != _weight_order(new):
            raise ValueError(f"the {form} GPU form reads its weights in another order than the full one")
    layers = {"exported": len(parse_param(text).layers)} | {k: len(parse_param(t).layers) for k, t in texts.items()}
    if kv_text is not None:
        layers["exported kv"] = len(parse_param(kv_text).layers)
    return texts, join_bin(new, out), stats | {"layers": layers}


def gemv_step(kv_text: str) -> str:
    """A `_kv` decoder graph (GPU form, residuals not folded) -> the same arithmetic for one position, on 1-D blobs,
    every plain projection an `InnerProduct` (a Gemm's B is an InnerProduct's weight byte for byte).

    ncnn's Vulkan InnerProduct on a 1-D input runs a GEMV (the K axis split in 8 partial sums): on an H200 it
    reads fp32 weights ~6x faster than Gemm on one row (data/bench/gpu/h200-vulkan-forms.json). The input row is
    flattened once (`Reshape 0=-1`) and the heads' merge (`Reshape` to (heads*dim, rows)) made a flatten too;
    everything else (RMSNorm over the whole vector, Slice on w, the head split to (dim, heads, 1)) reads 1-D alike.
    Valid for one position only: the step graph of a cached decoder."""
    g = Graph(kv_text)
    first = next(lyr for lyr in g.layers if lyr.type == "Input" and lyr.outputs == ["in0"])
    flat = g.fresh("in0_flat")
    for lyr in g.layers:
        lyr.inputs = [flat if b == "in0" else b for b in lyr.inputs]
    g.layers.insert(g.layers.index(first) + 1, ParamLayer("Reshape", "in0_flatten", ["in0"], [flat], ["0=-1"]))
    for lyr in g.layers:
        d = params_dict(lyr)
        if lyr.type == "Reshape" and set(d) == {"6"} and d["6"].endswith(',0c"'):  # (heads*dim, rows) -> (heads*dim)
            lyr.params = ["0=-1"]
        elif lyr.type == "Gemm" and _plain_gemm(lyr) and d.get("3") == "1" and d.get("7", "0") == "0":
            if d.get("6", "0") == "1" and d.get("10", "-1") != "-1":
                continue  # a Gemm with a constant C (a bias): its C is tagged, an InnerProduct's bias is not
            n, k = int(d["8"]), int(d["9"])
            lyr.type, lyr.params = "InnerProduct", [f"0={n}", "1=0", f"2={n * k}"]
    return g.text()


def gemv_heads(heads_text: str) -> str:
    """predictor_heads.param with every plain Gemm an InnerProduct (1-D input: the GEMV path; same weights)."""
    g = Graph(heads_text)
    for lyr in g.layers:
        d = params_dict(lyr)
        if lyr.type == "Gemm" and _plain_gemm(lyr) and d.get("3") == "1" and d.get("7", "0") == "0" \
                and not (d.get("6", "0") == "1" and d.get("10", "-1") != "-1"):
            n, k = int(d["8"]), int(d["9"])
            lyr.type, lyr.params = "InnerProduct", [f"0={n}", "1=0", f"2={n * k}"]
    return g.text()


def one_blob_io(kv_text: str, head_dim: int, kv_heads: int, outputs: tuple[str, ...] = ("out0",), *,
                step: bool = True, row: int | None = None) -> str:
    """A cached decoder graph whose caches cross the bus as one flat blob, and for a one-position `step` whose
    whole call is one upload and one download. Introduced in 10.

    Every layer's K and V output is flattened and concatenated into `cache_all_out` (1-D). With `step`:
    - the caches come in as one flat `cache_all_in`, sliced in equal parts and reshaped to (head_dim, past,
      kv_heads) (with `step` False, as exported: one empty Mat per layer, the first call of a sequence);
    - the row, cos and sin come in as one blob `x` (1-D: `row` values, half, half), sliced in the graph;
    - SDPA takes no mask (one query attends to every cached position: the mask would be all zeros);
    - each of `outputs` also exists as `all_<output>` = Concat(output, flat caches): one download per call.
    The prefill form (`step` False, several rows) keeps its inputs and gains only `cache_all_out`."""
    g = Graph(kv_text)
    cache_in = next(lyr for lyr in g.layers if lyr.type == "Input" and lyr.outputs[0].startswith("cache_k_in_"))
    names = list(cache_in.outputs)
    flats = []
    for b in [n.replace("_in_", "_out_") for n in names]:
        flat = g.fresh(b + "_flat")
        producer = g.producer(b)
        g.layers.insert(g.layers.index(producer) + 1, ParamLayer("Reshape", g.fresh(b + "_flatten"), [b], [flat],
                                                                 ["0=-1"]))
        flats.append(flat)
    concat_inputs = {o: [] for o in outputs} if step else {}
    uses = 1 + len(concat_inputs)
    tail = []
    for flat in flats:
        copies = [g.fresh(flat + "_c") for _ in range(uses)] if uses > 1 else [flat]
        if uses > 1:
            tail.append(ParamLayer("Split", g.fresh(flat + "_split"), [flat], copies, []))
        for i, o in enumerate(concat_inputs):
            concat_inputs[o].append(copies[1 + i])
        flats[flats.index(flat)] = copies[0]
    tail.append(ParamLayer("Concat", "cache_concat", list(flats), ["cache_all_out"], ["0=0"]))
    for o, parts in concat_inputs.items():
        user = g.producer(o)
        if user is None:
            raise ValueError(f"no layer makes {o}")
        copy = g.fresh(o + "_c")
        consumers = g.consumers(o)
        if consumers:
            raise ValueError(f"{o} is read inside the graph: not an output")
        user.outputs = [o + "_pre" if b == o else b for b in user.outputs]
        tail.append(ParamLayer("Split", g.fresh(o + "_split"), [o + "_pre"], [o, copy], []))  # o keeps its name
        tail.append(ParamLayer("Reshape", g.fresh(o + "_flatten"), [copy], [copy + "_flat"], ["0=-1"]))
        tail.append(ParamLayer("Concat", g.fresh("all_" + o), [copy + "_flat"] + parts, ["all_" + o], ["0=0"]))
    g.layers += tail
    if step:
        at = g.layers.index(cache_in)
        flat_in = [g.fresh(n + "_flat") for n in names]
        g.layers[at:at + 1] = [ParamLayer("Input", "cache_all_in", [], ["cache_all_in"], []),
                               ParamLayer("Slice", "cache_slice", ["cache_all_in"], flat_in,
                                          [f"-23300={len(names)}," + ",".join(["-233"] * len(names)), "1=0"])] + [
            ParamLayer("Reshape", g.fresh(n + "_shape"), [f], [n], [f"0={head_dim}", "1=-1", f"2={kv_heads}"])
            for n, f in zip(names, flat_in)]
        if row is None:
            raise ValueError("a step form needs the row's width")
        _merge_row_inputs(g, row, head_dim // 2)
    return g.text()


def _merge_row_inputs(g: Graph, hidden: int, half: int) -> None:
    """in0 (the row), in2/in3 (cos/sin) -> one 1-D input `x`, sliced; the mask in1 and SDPA's use of it gone."""
    for sdpa in [lyr for lyr in g.layers if lyr.type == "SDPA"]:
        d = params_dict(sdpa)
        if d.get("5") == "1":
            sdpa.inputs = sdpa.inputs[:3] + sdpa.inputs[4:]
            d["5"] = "0"
            set_params(sdpa, d)
    mask_users = [lyr for lyr in g.layers if "in1" in lyr.inputs]
    for split in mask_users:
        if split.type != "Split" or any(g.consumers(b) for b in split.outputs):
            raise ValueError("the mask feeds something other than SDPA")
        g.layers.remove(split)
    inputs = {lyr.outputs[0]: lyr for lyr in g.layers if lyr.type == "Input" and lyr.outputs[0] in ("in0", "in1",
                                                                                                   "in2", "in3")}
    at = g.layers.index(inputs["in0"])
    for lyr in inputs.values():
        g.layers.remove(lyr)
    cos, sin = g.fresh("cos_flat"), g.fresh("sin_flat")
    g.layers[at:at] = [ParamLayer("Input", "x", [], ["x"], []),
                       ParamLayer("Slice", "x_slice", ["x"], ["in0", cos, sin], [f"-23300=3,{hidden},{half},{half}",
                                                                                "1=0"]),
                       ParamLayer("Reshape", "cos_shape", [cos], ["in2"], [f"0={half}", "1=1"]),
                       ParamLayer("Reshape", "sin_shape", [sin], ["in3"], [f"0={half}", "1=1"])]


def _weight_order(text: str) -> list[str]:
    from ..binding.weights import layer_loads

    return [lyr.name for lyr in parse_param(text).layers if layer_loads(lyr)]


FORMS = {"full": "{}.param", "kv": "{}_kv.param", "step": "{}_step.param"}


def gpu_paths(ncnn_dir: str | Path, name: str) -> dict[str, Path]:
    """Where `ensure_gpu_decoder` writes a decoder's GPU forms: the three params of `gpu_decoder` and "bin"."""
    d = Path(ncnn_dir) / "gpu"
    return {form: d / pattern.format(name) for form, pattern in FORMS.items()} | {"bin": d / f"{name}.bin"}


def ensure_gpu_decoder(ncnn_dir: str | Path, name: str, log=None) -> dict[str, Path]:
    """`ncnn/gpu/<name>.param`, `<name>_kv.param`, `<name>_step.param` and `<name>.bin` (`gpu_decoder`), written
    from the exported files unless already there for exactly those files (size, mtime, FORMAT in `gpu/stamp.json`)."""
    ncnn_dir = Path(ncnn_dir)
    src = [ncnn_dir / f"{name}.param", ncnn_dir / f"{name}_kv.param", ncnn_dir / f"{name}.bin"]
    paths = gpu_paths(ncnn_dir, name)
    stamps_file = paths["bin"].parent / "stamp.json"
    stamps = json.loads(stamps_file.read_text()) if stamps_file.is_file() else {}
    want = {p.name: [p.stat().st_size, p.stat().st_mtime_ns, FORMAT] for p in src}
    have = stamps.get(name, {})
    if {k: have.get(k) for k in want} == want and all(p.is_file() for p in paths.values()):
        return paths
    if log:
        log(f"writing the GPU forms of {name} (once; {src[2].stat().st_size / 1e9:.2f} GB of weights)")
    with src[2].open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        texts, blob, stats = gpu_decoder(src[0].read_text(), data, src[1].read_text())
    paths["bin"].parent.mkdir(parents=True, exist_ok=True)
    tmp = paths["bin"].with_suffix(".bin.tmp")
    tmp.write_bytes(blob)
    tmp.replace(paths["bin"])
    for form, t in texts.items():
        paths[form].write_text(t)
    stamps[name] = want | {"stats": stats}
    stamps_file.write_text(json.dumps(stamps, indent=1))
    return paths
