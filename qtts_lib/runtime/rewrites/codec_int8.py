"""The codec's int8 convolutions, written from numpy: pure text and bytes in, text and bytes out. Introduced in 14.

ncnn's int8 Convolution (`8=1`, int8_scale_term) multiplies int8 by int8 and accumulates in int32: its input is
quantized with one static scale (`round(x * s)`, clipped to ±127: no per-call absmax, unlike the int8 Gemm of
`rewrites.int8`), its weights with one scale per output channel, and the sum is scaled back to fp32 with the bias
added. The .bin then holds, after the fp32 weights and bias, the per-output weight scales and the input scale; ncnn
rounds the fp32 weights to int8 when it loads the graph. The input scale comes from data (`codec.int8_form`
calibrates it): `input_absmax` per layer, measured on what the layer really sees.

`residual_convolutions` picks the layers worth it: the convolutions inside the decoder stages' residual units,
where nearly all of the codec's arithmetic is, and where each sum has 7·channels or channels terms to average the
rounding away. The stage's input convolution (the polyphase upsampler) and the last output convolution stay fp32.
"""
from __future__ import annotations

import re

import numpy as np

from ..binding.graph import Graph, int_param, params_dict, set_params
from ..binding.weights import Segment, join_bin, split_bin
from .int8 import dequantize_rows, quantize_rows

INT8_MAX = 127.0


def residual_convolutions(text: str, width: int) -> list[str]:
    """The ungrouped Convolution layers of one decoder stage's part (`rewrites.codec_cpu.codec_fast_parts`) whose
    output has the stage's residual width `width` (half its input width): the residual units' dilated and 1x1
    convolutions, including the pieces `conv_split_input` / `conv_tile_time` cut them in. The stage's polyphase
    upsampler writes `width` times its stride channels and the last output convolution one, so neither is picked."""
    names = []
    for layer in Graph(text).layers:
        d = params_dict(layer)
        if layer.type == "Convolution" and int_param(d, "0", 0) == width and int_param(d, "7", 1) == 1:
            names.append(layer.name)
    return names


def calibration_group(name: str) -> str:
    """The layer a time tile of `conv_tile_time` was cut from (its tiles share one input scale): `x_tile3_sp12`
    -> `x`. A channel piece of `conv_split_input` keeps its own name: its input is another slice of channels."""
    return re.sub(r"_tile\d+_sp\d+$", "", name)


def int8_convolutions(text: str, data: bytes, input_absmax: dict[str, float]) -> tuple[str, bytes, dict]:
    """Every Convolution named in `input_absmax` (layer -> the largest |input| it was seen to get) -> ncnn's int8
    Convolution: input scale 127 / absmax, per-output-channel weight scales 127 / |max| of each output's weights
    (the rows of `rewrites.int8.quantize_rows`). The weights stay fp32 in the .bin (ncnn quantizes them on load with
    those scales), so the file is the same size. Returns (param text, bin, stats: layers made int8, their weights,
    the rms error of the rounded weights relative to their rms)."""
    g = Graph(text)
    segs = split_bin(text, data)
    stats = {"convolutions": 0, "weights": 0, "weight_rel_rms": []}
    for layer in g.layers:
        if layer.name not in input_absmax:
            continue
        d = params_dict(layer)
        if layer.type != "Convolution" or int_param(d, "8", 0) or int_param(d, "19", 0):
            raise ValueError(f"{layer.name}: not an fp32 Convolution with constant weights")
        amax = float(input_absmax[layer.name])
        if not np.isfinite(amax) or amax <= 0:
            raise ValueError(f"{layer.name}: input absmax {amax} cannot set an int8 scale")
        out_c = int_param(d, "0", 0)
        s = segs[layer.name]
        w = s[0].array().reshape(out_c, -1)
        q, amax_rows = quantize_rows(w)  # what ncnn makes of w * ws on load
        ws = (INT8_MAX / amax_rows).astype(np.float32)
        err = dequantize_rows(q, amax_rows) - w
        stats["weight_rel_rms"].append(float(np.sqrt((err ** 2).mean() / max((w ** 2).mean(), 1e-30))))
        stats["convolutions"] += 1
        stats["weights"] += w.size
        d["8"] = "1"
        set_params(layer, d)
        segs[layer.name] = list(s) + [Segment.of(ws, False), Segment.of(np.float32([INT8_MAX / amax]), False)]
    new = g.text()
    return new, join_bin(new, segs), stats
