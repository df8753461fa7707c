"""The codec decoder over its exported graph: codes (T, 16) -> 24 kHz waveform. Introduced in 06.

The graph (chapter 04) takes the 16 codebooks packed for one fused embedding table
(`pack_codes`), a sliding-window causal mask and rope tables. The reference decodes long
outputs in chunks (`chunked_decode(chunk_size=300, left_context_size=25)`): each chunk is
decoded with up to 25 frames of left context whose samples are then dropped. The first
chunk equals a one-shot decode, later ones do not (25 frames is far less than the
transformer's reach), so matching the reference means chunking exactly as it does.

On the CPU the graph runs in a faster equivalent form (`speed.codec_fast_parts`, chapter 09), cut in
parts at the input of each upsampling stage. Part 0 (codebooks, transformer, ConvNeXt upsampler) runs over
all frames; the stages after it are causal convolutions that reach only a few input samples back
(`reach` measures how many), so each runs over chunks of a few frames with that much left context, and a
chunk goes on to the next stage as soon as it is made (`run_parts`). A decode of any length then holds no
stage whole: at full size the codec's working memory stays in the low hundreds of MB instead of growing
by about 10 MB per frame, which also matters for speed where fresh memory is slow to touch (a VM).
"""
from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import rope, speed
from .audio import SAMPLES_PER_FRAME
from .net import Net, from_mat, make_net, net_from_text, parse_device, to_mat

CHUNK_FRAMES, LEFT_CONTEXT_FRAMES = 300, 25  # the reference's chunked_decode defaults


def pack_codes(codes: np.ndarray, codebook_size: int) -> tuple[np.ndarray, np.ndarray]:
    """codes (T, 16) -> semantic (1, T) int32 and acoustic (15·T,) int32.

    Codebooks 1..15 share one fused table in the graph, so codebook g+1 is offset by
    g·codebook_size, and the rows are flattened group-major (index g·T + t)."""
    codes = np.asarray(codes, np.int64)
    semantic = codes[:, 0][None].astype(np.int32)
    offsets = np.arange(codes.shape[1] - 1)[:, None] * codebook_size
    acoustic = (codes[:, 1:].T + offsets).reshape(-1).astype(np.int32)
    return semantic, acoustic


FAST_DIR = "fast"  # under the ncnn directory: the CPU form of the codec graph, written on first load
PART_OVERHEAD = 0.025  # a part's left context as a share of its chunk: sets the chunk length per part
TILE_SAMPLES = {96: 2400, 192: 3200, 384: 1600}  # input channels -> samples per time tile (full-base, 1 thread)


def part_time_tiles(config: dict, part: int, channels: int, chunk_frames: int | None) -> int:
    """Time tiles for a convolution with `channels` inputs in codec part `part` (0: the head, which runs whole;
    k >= 1: upsampling stage k): its samples per call over `TILE_SAMPLES[channels]`, at most its samples per
    frame (a one-frame call leaves no tile empty), 0 where the stage does not run at that width."""
    if part == 0 or channels not in TILE_SAMPLES or chunk_frames is None:
        return 0
    ratios, rates = config["upsampling_ratios"], config["upsample_rates"]
    width, spf = int(config["decoder_dim"]) // 2 ** (part - 1), int(np.prod(ratios)) * int(np.prod(rates[:part - 1]))
    if channels == width:          # the stage's input convolution: at its input rate
        pass
    elif channels == width // 2:   # the stage's residual units: at its output rate
        spf *= int(rates[part - 1])
    else:
        return 0
    n = round(chunk_frames * spf / TILE_SAMPLES[channels])
    return min(n, spf) if n > 1 else 0


@dataclass
class Part:
    """One part of the codec's CPU form (`speed.codec_fast_parts`): part 0 runs over all frames; part k >= 1 runs
    upsampling stage k over chunks of `chunk_frames` frames, each with `context` input samples of left context
    whose output it drops. `spf`: input samples per frame; `up`: output samples per input sample."""
    net: object
    spf: int
    up: int
    context: int = 0
    chunk_frames: int | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """One graph call on a (channels, 1, samples) input."""
        ex = self.net.create_extractor()
        m = to_mat(x)
        ex.input("in0", m)
        out = ncnn_Mat()
        if ex.extract("out0", out) != 0:
            raise RuntimeError("codec part: forward failed")
        return from_mat(out)



class PartStream:
    """A part fed its input piece by piece: `push(x)` returns the part's output for the samples of `x`, exactly
    what one call over the whole input would give there. The last `context` input samples are kept as the next
    piece's left context; before the first piece there is none, as at the start of the whole input."""

    def __init__(self, part: Part):
        self.part, self.tail = part, None

    def push(self, x: np.ndarray) -> np.ndarray:
        inp = x if self.tail is None else np.concatenate([self.tail, x], axis=-1)
        y = self.part(inp)
        drop = 0 if self.tail is None else self.tail.shape[-1] * self.part.up
        self.tail = inp[..., inp.shape[-1] - min(self.part.context, inp.shape[-1]):].copy()  # not a view of inp
        return y[..., drop:]


def run_parts(parts: list[Part], x: np.ndarray) -> np.ndarray:
    """Parts 1.. over `x` (part 0's output), depth first: each part's chunks (`chunk_frames` frames of its input)
    go on to the next part as soon as they are made, so no stage is ever held whole; the pieces of the last part
    are concatenated. Every call gets whole frames (a time-tiled convolution needs at least one)."""
    streams = [PartStream(p) for p in parts]
    pieces: list[np.ndarray] = []

    def feed(level: int, piece: np.ndarray) -> None:
        if level == len(streams):
            pieces.append(piece)
            return
        p = streams[level].part
        step = piece.shape[-1] if p.chunk_frames is None else p.chunk_frames * p.spf
        for start in range(0, piece.shape[-1], step):
            feed(level + 1, streams[level].push(piece[..., start : start + step]))

    feed(0, x)
    return np.concatenate(pieces, axis=-1)


def ncnn_Mat():  # noqa: N802 - the import stays lazy (the module imports without ncnn)
    import ncnn

    return ncnn.Mat()


def reach(part: Part, x: np.ndarray, positions=(0.4, 0.5, 0.63)) -> int:
    """Input samples of left context a part's output needs, measured: one input sample at a time is changed,
    and the output samples that change at all (bitwise) mark its reach. Convolutions are shift-invariant, so
    a few positions in the middle of `x` (channels, 1, samples) give it; checked causal on the way."""
    rng = np.random.default_rng(0)
    base = part(x)
    n, span = x.shape[-1], 0
    for f in positions:
        p = int(f * n)
        y = x.copy()
        y[..., p] += rng.standard_normal(y.shape[:-1]).astype(np.float32)
        changed = np.nonzero((part(y) != base).reshape(-1, base.shape[-1]).any(axis=0))[0]
        if len(changed) == 0 or changed[0] < p * part.up:
            raise ValueError("codec part: the output does not depend causally on its input")
        span = max(span, int(changed[-1]) - p * part.up)
    return -(-span // part.up) + 1


def fast_graph(ncnn_dir, config: dict, threads: int = 1) -> tuple[Path, dict]:
    """The directory holding `speed.codec_fast_parts` of the exported codec decoder (with a copy of the manifest)
    and its description (`codec_decoder.json`: per part the context measured by `reach`, the chunk length,
    samples per frame), written on first use and rewritten when the exported files or the rewrite change.

    The cache is keyed by the size and mtime of the exported .param/.bin/manifest, `speed.CODEC_FAST_BIN_VERSION`,
    `PART_OVERHEAD` and `TILE_SAMPLES`; files are written under temporary names and renamed, the key last. (Loading
    the rewritten bytes from memory is not an option: the binding's `load_model_mem` keeps pointers into a buffer
    Python may free.)"""
    src = Path(ncnn_dir)
    param, weights, manifest = src / "codec_decoder.param", src / "codec_decoder.bin", src / "manifest.json"
    out = src / FAST_DIR
    key = {"version": speed.CODEC_FAST_BIN_VERSION, "overhead": PART_OVERHEAD,
           "tile_samples": {str(c): n for c, n in sorted(TILE_SAMPLES.items())},
           **{f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in (param, weights, manifest)}}
    meta = out / "codec_decoder.json"
    if meta.is_file():
        try:
            desc = json.loads(meta.read_text())
            if desc.get("key") == key and all((out / f).is_file() for p in desc["parts"] for f in p["files"]):
                return out, desc
        except (ValueError, KeyError, TypeError):
            pass
    out.mkdir(exist_ok=True)
    meta.unlink(missing_ok=True)
    ratios, rates = config["upsampling_ratios"], config["upsample_rates"]
    spf = [int(np.prod(ratios)) * int(np.prod(rates[:k])) for k in range(len(rates) + 1)]  # at each part's input
    text, data = param.read_text(), weights.read_bytes()
    # 1. contexts and chunk lengths, measured on the parts without time tiles (tiles do not change what is summed),
    #    each part fed what the parts before it make of 16 frames of random codes
    plain = speed.codec_fast_parts(text, data, config)
    measured, held = [], []
    try:
        nets = []
        for k, (t, b) in enumerate(plain):
            held.append(out / f"measure{k}.tmp{os.getpid()}.bin")
            held[-1].write_bytes(b)
            nets.append(net_from_text(t, held[-1], threads))
        codes = np.random.default_rng(0).integers(0, config["codebook_size"], (16, 16))
        x = _run_head(nets[0], codes, config, _in_axes(manifest))
        for k in range(1, len(plain)):
            part = Part(nets[k], spf[k - 1], int(rates[k - 1]))
            context = reach(part, x)
            measured.append({"context": context,
                             "chunk_frames": max(1, math.ceil(context / (PART_OVERHEAD * spf[k - 1])))})
            x = part(x)
        del nets
    finally:
        for f in held:
            f.unlink(missing_ok=True)
    # 2. the parts the runtime loads: time tiles sized to each part's chunk
    chunks = [None] + [m["chunk_frames"] for m in measured]
    final = speed.codec_fast_parts(text, data, config,
                                   tiles_of=lambda k, c: part_time_tiles(config, k, c, chunks[k]))
    desc = {"key": key, "parts": []}
    moves = []
    for k, (t, b) in enumerate(final):
        files = [f"codec_decoder.part{k}.param", f"codec_decoder.part{k}.bin"]
        for name, content in zip(files, (t, b)):
            tmp = out / f"{name}.tmp{os.getpid()}"
            tmp.write_text(content) if isinstance(content, str) else tmp.write_bytes(content)
            moves.append((tmp, out / name))
        entry = ({"spf": spf[k - 1], "up": int(rates[k - 1])} | measured[k - 1] if k else
                 {"spf": 1, "up": spf[0], "context": 0, "chunk_frames": None})
        desc["parts"].append({"files": files} | entry)
    tmp_manifest = out / f"manifest.json.tmp{os.getpid()}"
    shutil.copyfile(manifest, tmp_manifest)
    moves.append((tmp_manifest, out / "manifest.json"))
    for tmp, dst in moves:
        os.replace(tmp, dst)
    tmp_meta = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(desc, indent=1))
    os.replace(tmp_meta, meta)  # the key last: a half-written cache is never taken as done
    current = {f for p in desc["parts"] for f in p["files"]}
    for stale in [*out.glob("codec_decoder.part*.param"), *out.glob("codec_decoder.part*.bin"),
                  out / "codec_decoder.param", out / "codec_decoder.bin"]:  # older versions' files
        if stale.name not in current:
            stale.unlink(missing_ok=True)
    return out, desc


def _in_axes(manifest: Path) -> list[int]:
    return json.loads(manifest.read_text())["codec_decoder.param"]["input_batch_axes"]


def _run_head(net, codes: np.ndarray, config: dict, in_axes: list[int]) -> np.ndarray:
    """Part 0 (or the whole exported graph) on codes (T, 16): its `out0` as numpy."""
    T = len(codes)
    semantic, acoustic = pack_codes(codes, config["codebook_size"])
    mask = rope.causal_mask(T, window=config["sliding_window"])
    cos, sin = rope.tables(config["head_dim"], config["rope_theta"], 0, T)
    held = [to_mat(a, ax) for a, ax in zip((semantic, acoustic, mask, cos, sin), in_axes)]
    ex = net.create_extractor()
    for i, m in enumerate(held):
        ex.input(f"in{i}", m)
    out = ncnn_Mat()
    if ex.extract("out0", out) != 0:
        raise RuntimeError("codec: forward failed")
    return from_mat(out)


class Codec:
    """`decode(codes)` as the reference does it; `decode_once` for one graph call's worth of frames."""

    def __init__(self, ncnn_dir, config: dict, threads: int = 2, device: str = "cpu", fast: bool | None = None):
        self.config = config  # speech_tokenizer/config.json's decoder_config
        # On the CPU the graph is loaded in its faster equivalent form (`speed.codec_fast_parts`: 1-D convolutions
        # as 2-D ones with h = 1, which reach ncnn's packed kernels, polyphase upsampling, long convolutions cut
        # along time, other wide ones along input channels), in parts that decode the upsampling stages chunk by
        # chunk; cached next to the exported files (`fast_graph`).
        fast = parse_device(device) is None if fast is None else fast
        self.parts: list[Part] | None = None
        if fast:
            directory, desc = fast_graph(ncnn_dir, config)
            self.in_axes = _in_axes(directory / "manifest.json")
            self.parts = [Part(make_net(directory / p["files"][0], directory / p["files"][1], threads, device),
                               p["spf"], p["up"], p["context"], p["chunk_frames"]) for p in desc["parts"]]
            self.net = None
        else:
            self.net = Net(ncnn_dir, "codec_decoder", threads, device)

    def decode_once(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> wav (1920·T,): the exported graph's one call over all T frames (no chunking of the
        reference's kind). The CPU form computes the same samples part by part, the upsampling stages over
        chunks with the left context each needs (equal to the whole call to float rounding)."""
        c = self.config
        T = len(codes)
        if self.parts is not None:
            return run_parts(self.parts[1:], _run_head(self.parts[0].net, codes, c, self.in_axes)).reshape(-1)
        semantic, acoustic = pack_codes(codes, c["codebook_size"])
        mask = rope.causal_mask(T, window=c["sliding_window"])
        cos, sin = rope.tables(c["head_dim"], c["rope_theta"], 0, T)
        return self.net(semantic, acoustic, mask, cos, sin)[0].reshape(-1)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> wav (1920·T,), chunked exactly as the reference's chunked_decode."""
        if len(codes) == 0:
            return np.zeros(0, np.float32)
        parts, start, T = [], 0, len(codes)
        while start < T:
            end = min(start + CHUNK_FRAMES, T)
            context = LEFT_CONTEXT_FRAMES if start - LEFT_CONTEXT_FRAMES > 0 else start
            wav = self.decode_once(codes[start - context : end])
            parts.append(wav[context * SAMPLES_PER_FRAME :])
            start = end
        return np.concatenate(parts)

    def decode_with_voice(self, codes: np.ndarray, voice_codes: np.ndarray | None = None) -> np.ndarray:
        """Decode; with the voice clip's codes (ICL), decode them in front and cut their share of
        the samples by frame ratio, as the reference does."""
        if voice_codes is None or len(voice_codes) == 0:
            return self.decode(codes)
        total = np.concatenate([voice_codes, codes])
        wav = self.decode(total)
        cut = int(len(voice_codes) / max(len(total), 1) * len(wav))
        return wav[cut:]
