"""The `.bin` weight file of an ncnn graph, layer by layer. Introduced in 11.

ncnn reads a `.bin` front to back: each layer, in `.param` order, makes the loads its type defines (a
convolution its weights, then its bias if it has one; an int8 Gemm its int8 weights, then raw fp32 scales...).
A load is `tagged` when it starts with a 4-byte storage tag (fp32, fp16 or int8 data follows). `split_bin` cuts a
`.bin` into each layer's loads; a rewrite that changes weights swaps the segments of the layers it touches and
`join_bin` writes the new file in the new graph's layer order. Only the layer types pnnx writes for these graphs
(and the ones the rewrites make) are known; any other is refused, never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graph import int_param, params_dict
from .param import ParamLayer, parse_param

FP32_TAG = b"\x00\x00\x00\x00"
FP16_TAG = (0x01306B47).to_bytes(4, "little")
INT8_TAG = (0x000D4B38).to_bytes(4, "little")

# layer types that read nothing from the .bin
WEIGHTLESS = {
    "Input", "Split", "BinaryOp", "UnaryOp", "Reshape", "Permute", "Padding", "Crop", "Concat", "Slice",
    "SDPA", "RotaryEmbed", "Swish", "GELU", "Sigmoid", "TanH", "ReLU", "Clip", "Softmax", "MatMul",
    "Flatten", "Eltwise", "Noop", "Reduction", "ExpandDims", "Squeeze", "Tile", "Exp", "Log", "Power",
    "Pooling", "Pooling1D", "Interp", "Dropout", "CopyTo", "Cast", "Mish", "HardSwish", "HardSigmoid",
}


@dataclass
class Segment:
    """One `ModelBin::load` of a layer: `tagged` segments start with a 4-byte storage tag."""
    count: int          # elements
    tagged: bool
    data: bytes = b""

    def array(self) -> np.ndarray:
        """fp32 values (only fp32 storage is supported)."""
        body = self.data[4:] if self.tagged else self.data
        if self.tagged and self.data[:4] != FP32_TAG:
            raise ValueError("only fp32 weights (tag 0) are supported")
        return np.frombuffer(body, np.float32, count=self.count)

    @staticmethod
    def of(array: np.ndarray, tagged: bool) -> Segment:
        a = np.ascontiguousarray(array, np.float32).reshape(-1)
        return Segment(a.size, tagged, (FP32_TAG if tagged else b"") + a.tobytes())


def layer_loads(layer: ParamLayer) -> list[tuple[int, bool]]:
    """(elements, tagged) of every load a layer makes from the .bin, in order."""
    t, d = layer.type, params_dict(layer)
    if t in WEIGHTLESS:
        return []
    if t in ("Convolution", "Convolution1D", "ConvolutionDepthWise", "ConvolutionDepthWise1D",
             "Deconvolution", "Deconvolution1D", "DeconvolutionDepthWise", "DeconvolutionDepthWise1D"):
        int8 = int_param(d, "8", 0)
        if int_param(d, "19", 0) or int8 > 1 or (int8 and t != "Convolution"):
            raise ValueError(f"{layer.name}: dynamic-weight or requantizing int8 convolutions are not supported")
        loads = [(int_param(d, "6", 0), True)]
        if int_param(d, "5", 0):
            loads.append((int_param(d, "0", 0), False))
        if int8:  # an int8 Convolution (the codec's int8 tier, chapter 14): per-output weight scales, input scale
            loads += [(int_param(d, "0", 0), False), (1, False)]
        return loads
    if t == "InnerProduct":
        int8 = int_param(d, "8", 0)
        if int8 > 1:
            raise ValueError(f"{layer.name}: requantizing int8 InnerProduct is not supported")
        loads = [(int_param(d, "2", 0), True)]
        if int_param(d, "1", 0):
            loads.append((int_param(d, "0", 0), False))
        if int8:  # int8 InnerProduct (`bench.projections`' timing form): per-output weight scales, input scale
            loads += [(int_param(d, "0", 0), False), (1, False)]
        return loads
    if t == "Gemm":
        quantized = int_param(d, "18", 0)
        if quantized not in (0, 2):
            raise ValueError(f"{layer.name}: Gemm quantize_term {quantized} (weight blocks) is not supported")
        M, N, K = int_param(d, "7", 0), int_param(d, "8", 0), int_param(d, "9", 0)
        loads = []
        if int_param(d, "4", 0):
            loads.append((M * K, True))
        if int_param(d, "5", 0):
            loads.append((N * K, True))
        bt = int_param(d, "10", -1)
        if int_param(d, "6", 0) and bt != -1:
            loads.append(({0: 1, 1: M, 2: M, 3: M * N, 4: N}[bt], True))  # Gemm's C is tagged
        if quantized:  # int8 Gemm (chapter 13): after the (int8-tagged) weights, raw fp32 scales
            if int_param(d, "4", 0):
                loads.append((M, False))   # one per row of A
            if int_param(d, "5", 0):
                loads.append((1, False))   # one for all of B
        return loads
    if t == "Embed":
        if int_param(d, "18", 0):
            raise ValueError(f"{layer.name}: int8 Embed is not supported")
        loads = [(int_param(d, "3", 0), True)]
        if int_param(d, "2", 0):
            loads.append((int_param(d, "0", 0), False))
        return loads
    if t == "MemoryData":
        dims = [int_param(d, k, 0) for k in ("0", "1", "11", "2")]
        n = int(np.prod([x for x in dims if x])) if any(dims) else 1
        return [(n, False)]
    if t == "LayerNorm":
        return [(int_param(d, "0", 0), False)] * 2 if int_param(d, "2", 1) else []
    if t == "RMSNorm":
        return [(int_param(d, "0", 0), False)] if int_param(d, "2", 1) else []
    raise ValueError(f"{layer.name}: layer type {t} is not known to split_bin")


def split_bin(text: str, data: bytes) -> dict[str, list[Segment]]:
    """The .bin cut into each layer's loads (layer name -> segments); checks it is consumed exactly. The segments
    are views of `data` (bytes, or an mmap of a file), not copies: a 1.7B talker is 5.6 GB."""
    data = memoryview(data)
    pos, out = 0, {}
    for layer in parse_param(text).layers:
        segs = []
        for count, tagged in layer_loads(layer):
            n = 4 * count
            if tagged:
                tag = bytes(data[pos : pos + 4])
                if tag == FP16_TAG:
                    n = 4 + ((2 * count + 3) // 4) * 4
                elif tag == INT8_TAG:
                    n = 4 + ((count + 3) // 4) * 4
                elif tag == FP32_TAG:
                    n += 4
                else:
                    raise ValueError(f"{layer.name}: unsupported weight storage tag {tag.hex()}")
            segs.append(Segment(count, tagged, data[pos : pos + n]))
            pos += n
        if segs:
            out[layer.name] = segs
    if pos != len(data):
        raise ValueError(f".bin has {len(data)} bytes, the .param reads {pos}")
    return out


def join_bin(text: str, segments: dict[str, list[Segment]]) -> bytes:
    """The .bin for `text`: every layer's segments in layer order (the inverse of split_bin)."""
    parts = []
    for layer in parse_param(text).layers:
        want = layer_loads(layer)
        have = segments.get(layer.name, [])
        if [(s.count, s.tagged) for s in have] != want:
            raise ValueError(f"{layer.name}: segments {[(s.count, s.tagged) for s in have]} do not match {want}")
        parts += [s.data for s in have]
    return b"".join(parts)
