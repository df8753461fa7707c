"""The codec decoder's CPU form: rewrites of its exported graph, pure functions of the .param text (and the .bin
bytes). Introduced in 12.

The runtime applies them when it loads the codec on the CPU (`codec.cpu_form` writes the result once, in parts,
next to the exports); the exported files stay what pnnx wrote, so chapter 04 aligns those and chapters 06-08 prove
the rewritten form gives the same waveforms. Each rewrite keeps the computation and only changes which ncnn kernels
run it; each is checked equal to the exported graph (tests/test_rewrites.py, chapter 12).

- `conv1d_as_conv2d`: Convolution1D / ConvolutionDepthWise1D -> the 2-D layer with kernel_h = 1 between two
  Reshapes (same weight bytes), a preceding zero left-Padding folded into the layer's own pad_left. ncnn's 2-D x86
  convolution has packed sgemm / winograd paths that the 1-D layer lacks.
- `deconv1d_as_deconv2d`: Deconvolution1D -> Deconvolution with kernel_h = 1 (same weight bytes).
- `deconv_polyphase`: a strided transposed conv (kernel K = m*stride) whose right trim is K - stride becomes a
  stride-1 convolution with m taps and stride*out channels, then a Reshape/Permute/Reshape that interleaves the
  phases (new weights).
- `keep_3d`: the Reshape pairs between consecutive h = 1 convolutions dropped (blobs stay 3-D).
- `self_mul_as_square`: Snake's sin(x)·sin(x) as one square.
- `conv_split_input` / `conv_tile_time`: wide convolutions cut along input channels, long ones along time (each cut
  computes the same sums; ncnn's im2col matrix and sgemm tiles stay small).
- `stateful_convolutions`: every causal convolution of an upsampling part takes the last samples of its input from
  the previous call (a state blob in, a state blob out) instead of zeros: a stream of pieces then computes each
  sample once (`codec.parts.PartStream`), where left context would compute the context again every piece.
- `codec_fast_parts`: all of it, cut in parts at the input of each upsampling stage (`binding.graph.cut_graph`).
- `codec_gpu_parts`: the GPU form (chapter 10): the shared rewrites without the CPU's cuts, in two parts, the codebooks
  (CPU) and the rest (Vulkan), so no layer of the GPU's part lacks a Vulkan kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..binding.graph import Graph, cut_graph, int_param, params_dict, set_params
from ..binding.param import ParamLayer, parse_param
from ..binding.weights import Segment, join_bin, split_bin


def _fold_left_padding(g: Graph, layer: ParamLayer) -> int:
    """If `layer`'s input comes from a zero left-only Padding used by nobody else, bypass that
    Padding and return its left pad; else 0."""
    pad = g.producer(layer.inputs[0])
    if pad is None or pad.type != "Padding" or len(g.consumers(pad.outputs[0])) != 1:
        return 0
    d = params_dict(pad)
    others = [int_param(d, k, 0) for k in ("0", "1", "3", "4", "6", "7", "8")]
    if any(others) or float(d.get("5", "0")) != 0.0:
        return 0
    layer.inputs[0] = pad.inputs[0]
    g.layers.remove(pad)
    return int_param(d, "2", 0)


def _wrap_3d(g: Graph, layer: ParamLayer, in_channels: int, out_channels: int, new_type: str, params: dict) -> None:
    """Replace `layer` (2-D blob (w=T, h=C) in and out) by Reshape -> new_type (h=1) -> Reshape."""
    i = g.layers.index(layer)
    a, b = g.fresh(layer.name + "_in3d"), g.fresh(layer.name + "_out3d")
    pre = ParamLayer("Reshape", g.fresh(layer.name + "_r0"), [layer.inputs[0]], [a],
                     ["0=-1", "1=1", f"2={in_channels}"])
    new = ParamLayer(new_type, layer.name, [a], [b], [])
    set_params(new, params)
    post = ParamLayer("Reshape", g.fresh(layer.name + "_r1"), [b], list(layer.outputs), ["0=-1", f"1={out_channels}"])
    g.layers[i : i + 1] = [pre, new, post]


_CONV_KEYS_1D = ("0", "1", "2", "3", "4", "15", "18", "5", "6", "7", "9", "10")


def conv1d_as_conv2d(text: str, fold_padding: bool = True, depthwise: bool = True, to_2d: bool = True) -> str:
    """Convolution1D (and ConvolutionDepthWise1D) -> the 2-D layer with kernel_h = 1.

    The blob (w=T, h=C) is reshaped to (w=T, h=1, c=C) and back; the weights are the same bytes
    ((out, in, k) for both). A zero left-only Padding feeding the conv is folded into pad_left.
    `to_2d=False` only folds the padding (the 1-D layer stays). Unsupported variants (dilation
    in the 1-D layer is kept as dilation_w) are carried over key by key.
    """
    g = Graph(text)
    types = {"Convolution1D": "Convolution"}
    if depthwise:
        types["ConvolutionDepthWise1D"] = "ConvolutionDepthWise"
    for layer in [lyr for lyr in g.layers if lyr.type in types]:
        d = params_dict(layer)
        if any(k.startswith("-") and k not in ("-23310",) for k in d):
            raise ValueError(f"{layer.name}: unexpected array param in {d}")
        left = int_param(d, "4", 0)
        right = int_param(d, "15", left)
        if left < 0:
            continue  # 'same' padding modes: leave alone
        if fold_padding:
            left += _fold_left_padding(g, layer)
        out_c, k = int_param(d, "0", 0), int_param(d, "1", 0)
        group = int_param(d, "7", 1)
        in_c = group if layer.type == "ConvolutionDepthWise1D" else int_param(d, "6", 0) // (out_c * k)
        if not to_2d:
            d["4"], d["15"] = str(left), str(right)
            set_params(layer, d)
            continue
        p = {"0": str(out_c), "1": str(k), "11": "1", "2": d.get("2", "1"), "12": "1", "3": d.get("3", "1"),
             "13": "1", "4": str(left), "15": str(right), "14": "0", "16": "0"}
        if "18" in d:
            p["18"] = d["18"]
        p["5"], p["6"] = d.get("5", "0"), d.get("6", "0")
        if "7" in d:
            p["7"] = d["7"]
        for key in ("9", "10", "-23310"):
            if key in d:
                p[key] = d[key]
        _wrap_3d(g, layer, in_c, out_c, types[layer.type], p)
    return g.text()


def deconv1d_as_deconv2d(text: str) -> str:
    """Deconvolution1D -> Deconvolution with kernel_h = 1 between Reshapes (same weight bytes)."""
    g = Graph(text)
    for layer in [lyr for lyr in g.layers if lyr.type == "Deconvolution1D"]:
        d = params_dict(layer)
        out_c, k = int_param(d, "0", 0), int_param(d, "1", 0)
        in_c = int_param(d, "6", 0) // (out_c * k)
        left = int_param(d, "4", 0)
        p = {"0": str(out_c), "1": str(k), "11": "1", "2": d.get("2", "1"), "12": "1", "3": d.get("3", "1"),
             "13": "1", "4": str(left), "15": d.get("15", str(left)), "14": "0", "16": "0",
             "18": d.get("18", "0"), "19": "0", "5": d.get("5", "0"), "6": d.get("6", "0")}
        if "20" in d:
            raise ValueError(f"{layer.name}: output_w is not supported")
        for key in ("9", "10", "-23310"):
            if key in d:
                p[key] = d[key]
        _wrap_3d(g, layer, in_c, out_c, "Deconvolution", p)
    return g.text()


def _crop_right(layer: ParamLayer) -> int | None:
    """Samples a pnnx Crop removes from the right end of the last axis (None if it is not that)."""
    d = params_dict(layer)
    starts, ends, axes = d.get("-23309"), d.get("-23310"), d.get("-23311")
    if starts is None or ends is None or axes is None:
        return None
    s, e, a = ([float(x) for x in v.split(",")[1:]] for v in (starts, ends, axes))
    if len(s) != 1 or s[0] != 0 or a[0] not in (-1,) or e[0] >= 0:
        return None
    return int(-e[0])


def polyphase_weights(w: np.ndarray, bias: np.ndarray | None, stride: int) -> tuple[np.ndarray, np.ndarray | None]:
    """ncnn deconv weights (out, in, K) -> stride-1 conv weights (out*stride, in, m), m = ceil(K/stride).

    Output phase r of channel o (conv channel o*stride + r) at frame q is
        sum_j W[o, :, r + j*stride] . x[q - j],  j = 0..m-1
    so conv tap m-1-j (the conv sees x[q-m+1 .. q] after a left pad of m-1) holds W[o, :, r + j*stride].
    """
    out_c, in_c, K = w.shape
    m = -(-K // stride)
    wp = np.zeros((out_c, in_c, m * stride), np.float32)
    wp[:, :, :K] = w
    taps = wp.reshape(out_c, in_c, m, stride)             # [o, i, j, r] = W[o, i, r + j*stride]
    conv = taps[:, :, ::-1, :].transpose(0, 3, 1, 2)      # [o, r, i, m-1-j]
    conv = np.ascontiguousarray(conv.reshape(out_c * stride, in_c, m))
    b = None if bias is None else np.repeat(bias, stride).astype(np.float32)
    return conv, b


def deconv_polyphase(text: str, data: bytes, conv2d: bool = True) -> tuple[str, bytes]:
    """Every Deconvolution1D (dilation 1, no padding) whose output is trimmed on the right by
    K - stride (a Crop, or nothing when K == stride) -> stride-1 conv + phase interleave.

    The conv has m = ceil(K/stride) taps, left pad m-1 and stride*out channels (channel o*stride + r
    is phase r of channel o); its (w=T, h=stride*out) output is viewed as (w=T, h=stride, c=out),
    Permute(order 1) swaps w and h, and a Reshape flattens to (w=T*stride, h=out). Returns the new
    .param text and .bin bytes.
    """
    g = Graph(text)
    segs = split_bin(text, data)
    for layer in [lyr for lyr in g.layers if lyr.type == "Deconvolution1D"]:
        d = params_dict(layer)
        out_c, K, stride = int_param(d, "0", 0), int_param(d, "1", 0), int_param(d, "3", 1)
        if (int_param(d, "2", 1) != 1 or int_param(d, "4", 0) != 0 or int_param(d, "15", 0) != 0
                or int_param(d, "18", 0) != 0 or "20" in d or "9" in d):
            continue
        cons = g.consumers(layer.outputs[0])
        trim = K - stride
        crop = None
        if trim > 0:
            if len(cons) != 1 or cons[0].type != "Crop" or _crop_right(cons[0]) != trim:
                continue
            crop = cons[0]
        elif trim < 0 or K % stride:
            continue
        in_c = int_param(d, "6", 0) // (out_c * K)
        s = segs[layer.name]
        w = s[0].array().reshape(out_c, in_c, K)
        bias = s[1].array() if len(s) > 1 else None
        wc, bc = polyphase_weights(w, bias, stride)
        m = wc.shape[2]
        final = crop.outputs[0] if crop is not None else layer.outputs[0]
        if crop is not None:
            g.layers.remove(crop)
        i = g.layers.index(layer)
        x, conv_out, v, perm = (g.fresh(layer.name + t) for t in ("_x3", "_y", "_v", "_p"))
        cp = {"0": str(out_c * stride), "1": str(m), "2": "1", "3": "1", "4": str(m - 1), "15": "0",
              "5": "1" if bc is not None else "0", "6": str(wc.size)}
        if conv2d:
            cp.update({"11": "1", "12": "1", "13": "1", "14": "0", "16": "0"})
            new = [ParamLayer("Reshape", g.fresh(layer.name + "_r0"), [layer.inputs[0]], [x],
                              ["0=-1", "1=1", f"2={in_c}"]),
                   ParamLayer("Convolution", layer.name, [x], [conv_out], [])]
        else:
            new = [ParamLayer("Convolution1D", layer.name, [layer.inputs[0]], [conv_out], [])]
        set_params(new[-1], cp)
        new += [ParamLayer("Reshape", g.fresh(layer.name + "_r1"), [conv_out], [v],
                           ["0=-1", f"1={stride}", f"2={out_c}"]),
                ParamLayer("Permute", g.fresh(layer.name + "_perm"), [v], [perm], ["0=1"]),
                ParamLayer("Reshape", g.fresh(layer.name + "_r2"), [perm], [final], ["0=-1", f"1={out_c}"])]
        g.layers[i : i + 1] = new
        segs[layer.name] = [Segment.of(wc, True)] + ([Segment.of(bc, False)] if bc is not None else [])
    out = g.text()
    return out, join_bin(out, segs)


# ---------------------------------------------------------------- fewer Reshapes
def keep_3d(text: str) -> str:
    """Drop the Reshape pairs that `conv1d_as_conv2d` / `deconv_polyphase` put between consecutive
    (h = 1) convolutions: blobs stay (w=T, h=1, c=C) through the shape-agnostic layers between them
    (Split, UnaryOp, same-shape BinaryOp, a right Crop of the last axis, a left/right Padding), and a
    Reshape back to (w=T, h=C) is put only in front of any other consumer.

    A post-Reshape `0=-1 1=C` whose producer is a 2-D conv (or the polyphase Permute chain's last
    Reshape) is removed by having the producer write its output blob in 3-D; a pre-Reshape
    `0=-1 1=1 2=C` of a 3-D blob is removed by feeding its consumers the 3-D blob.
    """
    g = Graph(text)
    chan: dict[str, int] = {}          # 3-D blobs -> channels
    producer = {b: lyr for lyr in g.layers for b in lyr.outputs}
    conv2d = ("Convolution", "ConvolutionDepthWise", "Deconvolution")
    # 1. producers write 3-D
    for layer in list(g.layers):
        if (layer.type != "Reshape" or len(layer.params) != 2 or layer.params[0] != "0=-1"
                or not layer.params[1].startswith("1=")):
            continue
        src = producer.get(layer.inputs[0])
        c = int(layer.params[1][2:])
        if src is not None and src.type in conv2d and len(g.consumers(layer.inputs[0])) == 1:
            src.outputs = list(layer.outputs)
            g.layers.remove(layer)
            chan[layer.outputs[0]] = c
        elif src is not None and src.type == "Permute" and len(g.consumers(layer.inputs[0])) == 1:
            layer.params = ["0=-1", "1=1", f"2={c}"]    # polyphase interleave ends in 3-D
            chan[layer.outputs[0]] = c
    # 2. propagate in layer order
    agnostic = {"Split", "UnaryOp"}
    i = 0
    while i < len(g.layers):
        layer = g.layers[i]
        ins3 = [b for b in layer.inputs if b in chan]
        if not ins3:
            i += 1
            continue
        c = chan[ins3[0]]
        d = params_dict(layer)
        ok = False
        if layer.type == "Reshape" and layer.params == ["0=-1", "1=1", f"2={c}"]:
            src, dst = layer.inputs[0], layer.outputs[0]
            for lyr in g.layers:
                lyr.inputs = [src if b == dst else b for b in lyr.inputs]
            g.layers.remove(layer)
            continue
        if layer.type in agnostic:
            ok = True
        elif layer.type == "BinaryOp":
            ok = (len(layer.inputs) == 2 and len(ins3) == 2 and chan[ins3[1]] == c) or (
                len(layer.inputs) == 1 and int_param(d, "1", 0) == 1)
        elif layer.type == "Crop":
            ok = _crop_right(layer) is not None
        elif layer.type == "Padding":
            ok = not any(int_param(d, k, 0) for k in ("0", "1", "6", "7", "8"))
        elif layer.type in conv2d:
            # a 2-D conv fed directly (its pre-Reshape already removed) consumes 3-D natively
            ok = True
        if ok:
            if layer.type not in conv2d:
                for b in layer.outputs:
                    chan[b] = c
            i += 1
            continue
        # any other consumer: back to (w=T, h=C) in front of it
        new = []
        for j, b in enumerate(layer.inputs):
            if b in chan:
                flat = g.fresh(b + "_2d")
                new.append(ParamLayer("Reshape", g.fresh(layer.name + "_to2d"), [b], [flat], ["0=-1", f"1={chan[b]}"]))
                layer.inputs[j] = flat
        g.layers[i:i] = new
        i += len(new) + 1
    return g.text()


# ---------------------------------------------------------------- convolution kernel choice
NO_SGEMM = 1 << 5  # ncnn layer featmask (param 31): this layer runs without the im2col + sgemm path


def split_part(in_channels: int) -> int:
    """Input channels per part for `conv_split_input` (0: leave the layer whole).

    ncnn's im2col + sgemm convolution picks its tiles from the L2 size and with K = 7 * in_channels
    large the B tile fills the whole L2; smaller K runs 20-30% faster at 768 and 384 input channels
    (full-base, 1 thread). 96-channel kernels run faster on the direct (packed) path in 48-channel parts."""
    if in_channels >= 768:
        return 192
    if in_channels >= 384:
        return 96
    if in_channels == 96:
        return 48
    return 0


def _parts(n: int, part: int) -> list[int]:
    """`n` split into about n/part pieces, each a multiple of 16 (ncnn's widest channel packing)."""
    k = max(1, -(-n // part))
    units, extra = divmod(n // 16, k)
    if n % 16 or units == 0:
        return [n]
    return [16 * (units + (i < extra)) for i in range(k)]


def conv_split_input(text: str, data: bytes, part_of=split_part) -> tuple[str, bytes]:
    """Each (h = 1, ungrouped, kernel_w > 1, no fused activation) Convolution on a 3-D blob whose input channels
    `part_of` splits ->
    Slice of the input channels -> one Convolution per part (bias on the first) -> a chain of BinaryOp adds.

    The sum is the same convolution (each part is a partial sum over its input channels); the split gives
    ncnn's sgemm a smaller K. Parts of at most 48 channels run with sgemm masked off (`NO_SGEMM`), on ncnn's
    direct packed kernel. Needs the .bin rewritten (the weights are cut along input channels)."""
    g = Graph(text)
    segs = split_bin(text, data)
    for layer in [lyr for lyr in g.layers if lyr.type == "Convolution"]:
        d = params_dict(layer)
        out_c, kw, kh = int_param(d, "0", 0), int_param(d, "1", 0), int_param(d, "11", int_param(d, "1", 0))
        if kh != 1 or kw < 2 or int_param(d, "7", 1) != 1 or int_param(d, "19", 0) or int_param(d, "8", 0) or "31" in d:
            continue
        in_c = int_param(d, "6", 0) // (out_c * kw)
        part = part_of(in_c)
        sizes = _parts(in_c, part) if part else [in_c]
        if int_param(d, "9", 0):
            sizes = [in_c]  # a fused activation applies to the whole sum: never split
        if len(sizes) < 2:
            if part and part <= 48:
                d["31"] = str(NO_SGEMM)
                set_params(layer, d)
            continue
        s = segs.pop(layer.name)
        w = s[0].array().reshape(out_c, in_c, kw)
        bias = s[1] if len(s) > 1 else None
        i = g.layers.index(layer)
        ins = [g.fresh(layer.name + f"_in{j}") for j in range(len(sizes))]
        new = [ParamLayer("Slice", g.fresh(layer.name + "_slice"), [layer.inputs[0]], ins,
                          ["-23300=" + ",".join([str(len(sizes))] + [str(x) for x in sizes[:-1]] + ["-233"]), "1=0"])]
        start, acc = 0, None
        for j, (blob, n) in enumerate(zip(ins, sizes)):
            name = layer.name if j == 0 else g.fresh(layer.name + f"_part{j}")
            p = dict(d)
            p["5"] = "1" if (j == 0 and bias is not None) else "0"
            p["6"] = str(out_c * n * kw)
            if n <= 48:
                p["31"] = str(NO_SGEMM)
            out = g.fresh(layer.name + f"_y{j}")
            conv = ParamLayer("Convolution", name, [blob], [out], [])
            set_params(conv, p)
            new.append(conv)
            segs[name] = [Segment.of(w[:, start : start + n], True)] + ([bias] if p["5"] == "1" else [])
            start += n
            if acc is not None:
                dst = layer.outputs[0] if j == len(sizes) - 1 else g.fresh(layer.name + f"_sum{j}")
                new.append(ParamLayer("BinaryOp", g.fresh(layer.name + f"_add{j}"), [acc, out], [dst], ["0=0"]))
                out = dst
            acc = out
        g.layers[i : i + 1] = new
    out_text = g.text()
    return out_text, join_bin(out_text, segs)


def conv_tile_time(text: str, data: bytes, tiles_of) -> tuple[str, bytes]:
    """Each causal (h = 1, stride 1, left padding only, equal to dilation * (kernel_w - 1)) Convolution on a 3-D
    blob for which `tiles_of(in_channels)` says n > 1 ->
    Slice of the time axis into n near-equal tiles -> per tile: its left context (the last `pad` samples of the
    previous tile's input, zeros for the first) concatenated in front, the Convolution without padding ->
    Concat of the outputs along time.

    The same sums in the same order: the waveform is unchanged. ncnn's im2col + sgemm convolution writes the
    whole im2col matrix (7 * channels * length floats, 137 MB at 192 channels and 40 frames) before the gemm
    reads it back; per tile it stays small. The tile count is fixed in the graph, so every tile must be
    non-empty: the caller keeps n at most the layer's samples per frame. Each tile carries a copy of the
    weights (ncnn layers cannot share them)."""
    g = Graph(text)
    segs = split_bin(text, data)
    for layer in [lyr for lyr in g.layers if lyr.type == "Convolution"]:
        d = params_dict(layer)
        out_c, kw, kh = int_param(d, "0", 0), int_param(d, "1", 0), int_param(d, "11", int_param(d, "1", 0))
        dil, pad = int_param(d, "2", 1), int_param(d, "4", 0)
        pads = (int_param(d, "15", pad), int_param(d, "14", pad), int_param(d, "16", int_param(d, "14", pad)))
        strides = (int_param(d, "3", 1), int_param(d, "13", int_param(d, "3", 1)))
        if (kh != 1 or kw < 1 or strides != (1, 1) or pads != (0, 0, 0) or pad != dil * (kw - 1)
                or int_param(d, "7", 1) != 1 or int_param(d, "19", 0) or int_param(d, "8", 0) or "31" in d):
            continue
        in_c = int_param(d, "6", 0) // (out_c * kw)
        n = tiles_of(in_c)
        if n < 2:
            continue
        s = segs.pop(layer.name)
        i = g.layers.index(layer)
        xs = [g.fresh(layer.name + f"_t{j}") for j in range(n)]
        new = [ParamLayer("Slice", g.fresh(layer.name + "_tiles"), [layer.inputs[0]], xs,
                          ["-23300=" + ",".join([str(n)] + ["-233"] * n), "1=-1"])]
        ys, prev = [], None
        for j, x in enumerate(xs):
            if pad:
                src = g.fresh(layer.name + f"_in{j}")
                if prev is None:
                    new.append(ParamLayer("Padding", g.fresh(layer.name + "_pad"), [x], [src],
                                          ["0=0", "1=0", f"2={pad}", "3=0", "4=0", "5=0.000000e+00", "6=0"]))
                else:
                    ctx = g.fresh(layer.name + f"_ctx{j}")
                    new.append(ParamLayer("Crop", g.fresh(layer.name + f"_crop{j}"), [prev], [ctx],
                                          [f"-23309=1,-{pad}", "-23310=1,-233", "-23311=1,-1"]))
                    new.append(ParamLayer("Concat", g.fresh(layer.name + f"_cat{j}"), [ctx, x], [src], ["0=-1"]))
                if j < n - 1:  # the next tile's context is cut from this input: two consumers need a Split
                    a, b = g.fresh(layer.name + f"_in{j}a"), g.fresh(layer.name + f"_in{j}b")
                    new.append(ParamLayer("Split", g.fresh(layer.name + f"_split{j}"), [src], [a, b], []))
                    src, prev = a, b
            else:
                src = x
            name = layer.name if j == 0 else g.fresh(layer.name + f"_tile{j}")
            p = dict(d)
            p["4"], p["15"], p["14"], p["16"] = "0", "0", "0", "0"
            y = g.fresh(layer.name + f"_y{j}")
            conv = ParamLayer("Convolution", name, [src], [y], [])
            set_params(conv, p)
            new.append(conv)
            segs[name] = list(s)
            ys.append(y)
        new.append(ParamLayer("Concat", g.fresh(layer.name + "_join"), ys, [layer.outputs[0]], ["0=-1"]))
        g.layers[i : i + 1] = new
    out_text = g.text()
    return out_text, join_bin(out_text, segs)


@dataclass(frozen=True)
class ConvState:
    """A causal convolution's state blobs in a `stateful_convolutions` graph: the last `samples` input samples of
    `channels` channels, fed as `input` (zeros, (channels, 1, samples), before the first call) and read back from
    `output` for the next call."""
    input: str
    output: str
    channels: int
    samples: int


def _conv_in_channels(layer: ParamLayer) -> int:
    d = params_dict(layer)
    out_c, kw, kh = int_param(d, "0", 0), int_param(d, "1", 0), int_param(d, "11", int_param(d, "1", 0))
    if layer.type == "ConvolutionDepthWise":
        return out_c
    return int_param(d, "6", 0) // (out_c * kw * kh) * int_param(d, "7", 1)


def stateful_convolutions(text: str) -> tuple[str, list[ConvState]]:
    """Every left-padded (causal, h = 1) Convolution / ConvolutionDepthWise, and every zero left Padding in front
    of a time tile (`conv_tile_time`), fed the last P input samples of the previous call (P: its left padding)
    instead of P zeros: a state Input concatenated in front of its input, and the last P samples of (state, input)
    cropped out as a state output. With zero states the graph computes what it did (the same sums: zeros in front
    either way); fed its states back call after call, pieces of any length give the samples of one call over
    their concatenation, and no sample is computed twice. Weights are untouched (the same .bin)."""
    g = Graph(text)
    states: list[ConvState] = []

    def first_conv(blob: str) -> ParamLayer:
        todo = [blob]
        while todo:
            for lyr in g.consumers(todo.pop()):
                if lyr.type in ("Convolution", "ConvolutionDepthWise"):
                    return lyr
                if lyr.type == "Split":
                    todo += lyr.outputs
        raise ValueError(f"no convolution reads {blob!r}")

    def add_state(before: ParamLayer, samples: int, channels: int) -> tuple[str, str]:
        """A state Input (inserted before `before`, its name read twice through a Split); returns the blob to put
        in front of the convolution's input and the one `save_state` reads."""
        k = len(states)
        s_in, s_a, s_b = f"state_in_{k}", g.fresh(f"state{k}_a"), g.fresh(f"state{k}_b")
        i = g.layers.index(before)
        g.layers[i:i] = [ParamLayer("Input", s_in, [], [s_in], []),
                         ParamLayer("Split", g.fresh(f"state{k}_in"), [s_in], [s_a, s_b], [])]
        states.append(ConvState(s_in, f"state_out_{k}", channels, samples))
        return s_a, s_b

    def save_state(before: ParamLayer, state: str, whole: str) -> None:
        """The next call's state: the last samples of (this call's state, the convolution's whole input)."""
        st = states[-1]
        cat = g.fresh(f"{st.output}_cat")
        i = g.layers.index(before)
        g.layers[i:i] = [ParamLayer("Concat", g.fresh(f"{st.output}_concat"), [state, whole], [cat], ["0=-1"]),
                         ParamLayer("Crop", g.fresh(f"{st.output}_crop"), [cat], [st.output],
                                    [f"-23309=1,-{st.samples}", "-23310=1,-233", "-23311=1,-1"])]

    def split(before: ParamLayer, blob: str) -> tuple[str, str]:
        """`blob` read twice: a Split inserted before `before`."""
        a, b = g.fresh(f"{blob}_a"), g.fresh(f"{blob}_b")
        g.layers.insert(g.layers.index(before), ParamLayer("Split", g.fresh(f"{blob}_split"), [blob], [a, b], []))
        return a, b

    for layer in list(g.layers):
        d = params_dict(layer)
        if layer.type in ("Convolution", "ConvolutionDepthWise"):
            pad = int_param(d, "4", 0)
            if pad <= 0 or int_param(d, "11", int_param(d, "1", 0)) != 1 or any(
                    int_param(d, k, pad) != 0 for k in ("15", "14")) or int_param(d, "16", 0) != 0:
                continue
            front, kept = add_state(layer, pad, _conv_in_channels(layer))
            x, whole = split(layer, layer.inputs[0])
            save_state(layer, kept, whole)
            fed = g.fresh(f"{layer.name}_with_state")
            g.layers.insert(g.layers.index(layer), ParamLayer("Concat", g.fresh(f"{layer.name}_state"), [front, x],
                                                              [fed], ["0=-1"]))
            layer.inputs[0] = fed
            d["4"], d["15"], d["14"], d["16"] = "0", "0", "0", "0"
            set_params(layer, d)
        elif layer.type == "Padding":
            pad = int_param(d, "2", 0)
            tiles = g.producer(layer.inputs[0])
            if (pad <= 0 or any(int_param(d, k, 0) for k in ("0", "1", "3", "4")) or float(d.get("5", "0")) != 0
                    or tiles is None or tiles.type != "Slice" or tiles.outputs[0] != layer.inputs[0]):
                continue
            front, kept = add_state(tiles, pad, _conv_in_channels(first_conv(layer.outputs[0])))
            tiles.inputs[0], whole = split(tiles, tiles.inputs[0])  # the state: the whole input's last samples
            save_state(tiles, kept, whole)
            g.layers[g.layers.index(layer)] = ParamLayer("Concat", layer.name, [front, layer.inputs[0]],
                                                         list(layer.outputs), ["0=-1"])
    return g.text(), states


def self_mul_as_square(text: str) -> str:
    """Split(x -> a, b) -> BinaryOp mul(a, b) (the Snake activation's sin(x)^2) -> UnaryOp square of x
    (ncnn's in-place x * x: the same products). Weights unchanged."""
    g = Graph(text)
    for split in [lyr for lyr in g.layers if lyr.type == "Split" and len(lyr.outputs) == 2]:
        users = [g.consumers(b) for b in split.outputs]
        mul = users[0][0] if len(users[0]) == 1 and users[0] == users[1] else None
        if mul is None or mul.type != "BinaryOp" or sorted(mul.inputs) != sorted(split.outputs):
            continue
        d = params_dict(mul)
        if int_param(d, "0", 0) != 2 or int_param(d, "1", 0):  # mul, no scalar operand
            continue
        g.layers[g.layers.index(mul)] = ParamLayer("UnaryOp", mul.name, [split.inputs[0]], mul.outputs, ["0=4"])
        g.layers.remove(split)
    return g.text()


# ---------------------------------------------------------------- what the runtime loads
def codec_rewritten(text: str, data: bytes) -> tuple[str, bytes]:
    """The rewrites every CPU form shares: strided transposed convolutions as polyphase stride-1 convolutions (new
    weights), 1-D (de)convolutions as 2-D ones with h = 1, blobs kept 3-D between them, Snake's sin(x)^2 as one
    square."""
    t, b = deconv_polyphase(text, data)
    return self_mul_as_square(keep_3d(deconv1d_as_deconv2d(conv1d_as_conv2d(t)))), b


def _cut_convolutions(t: str, b: bytes, part_of, tiles_of) -> tuple[str, bytes]:
    """Long convolutions cut along time (`conv_tile_time`, where `tiles_of` is given), the other wide ones along
    input channels (`conv_split_input`); a layer cut along time is not cut again along channels."""
    if tiles_of is None:
        return conv_split_input(t, b, part_of)
    t, b = conv_tile_time(t, b, tiles_of)
    return conv_split_input(t, b, lambda c: 0 if tiles_of(c) > 1 else part_of(c))


def codec_fast_bin(text: str, data: bytes, part_of=split_part, tiles_of=None) -> tuple[str, bytes]:
    """The whole codec graph in its CPU form: `codec_rewritten`, then the convolutions cut along time or input
    channels. Returns the .param text and .bin bytes. (The runtime loads the same form in parts,
    `codec_fast_parts`.)"""
    return _cut_convolutions(*codec_rewritten(text, data), part_of, tiles_of)


# ---------------------------------------------------------------- the codec in parts
def codec_cut_layers(text: str, config: dict) -> list[str]:
    """Names of the layers whose input the codec graph is cut at, in order: the first 1-D convolution (the pre_conv
    in front of the transformer: what is cut there is the transformer's input), then every strided transposed
    convolution (the ConvNeXt upsampler's `upsampling_ratios`, then the decoder's `upsample_rates`).
    `deconv_polyphase` and `conv1d_as_conv2d` keep these names on the layers they make."""
    layers = parse_param(text).layers
    deconvs = [lyr.name for lyr in layers if lyr.type == "Deconvolution1D"]
    n = len(config["upsampling_ratios"]) + len(config["upsample_rates"])
    if len(deconvs) != n:
        raise ValueError(f"expected {n} transposed convolutions in the codec graph, found {len(deconvs)}")
    pre_conv = next((lyr.name for lyr in layers if lyr.type == "Convolution1D"), None)
    if pre_conv is None:
        raise ValueError("no 1-D convolution in front of the codec's transformer")
    return [pre_conv] + deconvs


def codec_fast_parts(text: str, data: bytes, config: dict, part_of=split_part,
                     tiles_of=None) -> list[tuple[str, bytes]]:
    """`codec_fast_bin` in parts, cut (`cut_graph`) where `codec_cut_layers` says:

        0  codes -> the codebook sums (RVQ) and the pre_conv        reads in0/in1 (codes), writes out0
        1  the transformer (and its output projection)              reads in0, in2/in3/in4 (mask, rope), writes out0
        2.. one transposed convolution and what follows it up to the next one: the ConvNeXt upsampler's stages,
           then the decoder's stages (the last with the output convolution)     reads in0, writes out0

    Parts 2.. are causal convolutions only, so each can run over a window of its input with a little left
    context (`runtime.codec` measures how much): the runtime decodes them chunk by chunk and never holds a whole
    stage; part 1 can run one position at a time with a KV cache (streaming). Each part is then rewritten like
    the whole (time tiles by `tiles_of(k, channels)`, channel splits)."""
    t, b = codec_rewritten(text, data)
    parts = []
    for k, (pt, pb) in enumerate(_cut_parts(t, b, codec_cut_layers(text, config))):
        parts.append(_cut_convolutions(pt, pb, part_of, None if tiles_of is None else lambda c, k=k: tiles_of(k, c)))
    return parts


def codec_gpu_parts(text: str, data: bytes, config: dict) -> list[tuple[str, bytes]]:
    """The codec's GPU form: `codec_rewritten` (no Deconvolution1D or ConvolutionDepthWise1D left, layers that
    ncnn has no Vulkan kernel for) cut once, after the pre_conv, and nothing cut along time or channels (those
    cuts pay on the CPU's caches; on a GPU they would only add layers):

        0  codes -> the codebook sums and the pre_conv: Embed and MatMul, which have no Vulkan kernel either; a
           gather and a few MFLOP per frame, run on the CPU              reads in0/in1 (codes), writes out0
        1  everything else, one graph for Vulkan                       reads in0, in2/in3/in4, writes out0"""
    t, b = codec_rewritten(text, data)
    return _cut_parts(t, b, codec_cut_layers(text, config)[:1])


def _cut_parts(t: str, b: bytes, names: list[str]) -> list[tuple[str, bytes]]:
    """`t`/`b` cut at the output of the layer `names[0]` (the pre_conv, and the Reshapes that take it back to 2-D)
    and at the input of each later one: len(names) + 1 parts, each with its own weights."""
    segs = split_bin(t, b)
    texts, rest = [], t
    for name in names:
        layer = next(lyr for lyr in parse_param(rest).layers if lyr.name == name)
        cut = layer.outputs[0] if not texts else layer.inputs[0]  # after the pre_conv; before each transposed conv
        if not texts:
            consumers = [lyr for lyr in parse_param(rest).layers if cut in lyr.inputs]
            while len(consumers) == 1 and consumers[0].type == "Reshape":  # the conv's way back to 2-D goes along
                cut = consumers[0].outputs[0]
                consumers = [lyr for lyr in parse_param(rest).layers if cut in lyr.inputs]
        head, rest = cut_graph(rest, cut)
        texts.append(head)
    texts.append(rest)
    parts = []
    for pt in texts:
        keep = {lyr.name for lyr in parse_param(pt).layers}
        parts.append((pt, join_bin(pt, {n: v for n, v in segs.items() if n in keep})))
    return parts
