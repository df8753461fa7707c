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


def part_time_tiles(config: dict, stage: int, channels: int, chunk_frames: int | None) -> int:
    """Time tiles for a convolution with `channels` inputs in the part that runs decoder upsampling stage `stage`
    (1..; 0 for every other part, which is never tiled): its samples per call over `TILE_SAMPLES[channels]`, at
    most its samples per frame (a one-frame call leaves no tile empty), 0 where the stage does not run at that
    width."""
    if stage < 1 or channels not in TILE_SAMPLES or chunk_frames is None:
        return 0
    ratios, rates = config["upsampling_ratios"], config["upsample_rates"]
    width, spf = int(config["decoder_dim"]) // 2 ** (stage - 1), int(np.prod(ratios)) * int(np.prod(rates[:stage - 1]))
    if channels == width:          # the stage's input convolution: at its input rate
        pass
    elif channels == width // 2:   # the stage's residual units: at its output rate
        spf *= int(rates[stage - 1])
    else:
        return 0
    n = round(chunk_frames * spf / TILE_SAMPLES[channels])
    return min(n, spf) if n > 1 else 0


def ncnn_Mat():  # noqa: N802 - the import stays lazy (the module imports without ncnn)
    import ncnn

    return ncnn.Mat()


@dataclass
class Part:
    """One part of the codec's CPU form (`speed.codec_fast_parts`). The upsampling parts (2..) run over chunks of
    `chunk_frames` frames, each with `context` input samples of left context whose output is dropped; `spf`:
    input samples per frame, `up`: output samples per input sample."""
    net: object
    spf: int = 1
    up: int = 1
    context: int = 0
    chunk_frames: int | None = None

    def __call__(self, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        """One graph call: `x` as in0 (a (channels, 1, samples) or (channels, samples) array), `inputs` by name."""
        ex = self.net.create_extractor()
        held = [to_mat(x)] + [to_mat(a) for a in inputs.values()]
        for name, m in zip(["in0", *inputs], held):
            ex.input(name, m)
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


class PartChain:
    """The upsampling parts in a row, fed piece by piece (`push`): each part's chunks (`chunk_frames` frames of
    its input) go on to the next part as soon as they are made, so no stage is ever held whole; `push` returns
    the last part's output for what it was given. Every call gets whole frames (a time-tiled convolution needs at
    least one), so pushes must be whole frames too."""

    def __init__(self, parts: list[Part]):
        self.streams = [PartStream(p) for p in parts]

    def push(self, x: np.ndarray) -> np.ndarray:
        pieces: list[np.ndarray] = []

        def feed(level: int, piece: np.ndarray) -> None:
            if level == len(self.streams):
                pieces.append(piece)
                return
            p = self.streams[level].part
            step = piece.shape[-1] if p.chunk_frames is None else p.chunk_frames * p.spf
            for start in range(0, piece.shape[-1], step):
                feed(level + 1, self.streams[level].push(piece[..., start : start + step]))

        feed(0, x)
        return np.concatenate(pieces, axis=-1)


def run_parts(parts: list[Part], x: np.ndarray) -> np.ndarray:
    """The upsampling parts over all of `x` (the transformer's output): `PartChain` fed once."""
    return PartChain(parts).push(x)


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


def codes_reach(part: Part, codes: np.ndarray, config: dict, in_axes: list[int]) -> int:
    """`reach` for part 0 (codes in): the frames of left context its output needs, measured by changing every
    code of one frame at a time."""
    base = _run_codes(part, codes, config, in_axes)
    span = 0
    for p in (len(codes) // 2, len(codes) // 2 + 3):
        other = codes.copy()
        other[p] = (other[p] + 1) % config["codebook_size"]
        changed = np.nonzero((_run_codes(part, other, config, in_axes) != base).reshape(-1, base.shape[-1]).any(0))[0]
        if len(changed) == 0 or changed[0] < p:
            raise ValueError("codec part 0: the output does not depend causally on the codes")
        span = max(span, int(changed[-1]) - p)
    return span + 1


def _run_codes(part: Part, codes: np.ndarray, config: dict, in_axes: list[int]) -> np.ndarray:
    """Part 0 on codes (T, 16): the codebook sums through the pre_conv, (channels, T)."""
    semantic, acoustic = pack_codes(codes, config["codebook_size"])
    ex = part.net.create_extractor()
    held = [to_mat(semantic, in_axes[0]), to_mat(acoustic, in_axes[1])]
    for i, m in enumerate(held):
        ex.input(f"in{i}", m)
    out = ncnn_Mat()
    if ex.extract("out0", out) != 0:
        raise RuntimeError("codec part 0: forward failed")
    return from_mat(out)


def fast_graph(ncnn_dir, config: dict, threads: int = 1) -> tuple[Path, dict]:
    """The directory holding `speed.codec_fast_parts` of the exported codec decoder (with a copy of the manifest),
    the transformer part with a KV cache (`kvcache.add_kv_cache`, for streaming), and their description
    (`codec_decoder.json`: per part its role, the context measured by `reach`/`codes_reach`, the chunk length,
    samples per frame), written on first use and rewritten when the exported files or the rewrite change.

    The cache is keyed by the size and mtime of the exported .param/.bin/manifest, `speed.CODEC_FAST_BIN_VERSION`,
    `PART_OVERHEAD` and `TILE_SAMPLES`; files are written under temporary names and renamed, the key last. (Loading
    the rewritten bytes from memory is not an option: the binding's `load_model_mem` keeps pointers into a buffer
    Python may free.)"""
    from .kvcache import add_kv_cache

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
            files = [f for p in desc["parts"] for f in p["files"]] + [desc["transformer_kv"]]
            if desc.get("key") == key and all((out / f).is_file() for f in files):
                return out, desc
        except (ValueError, KeyError, TypeError):
            pass
    out.mkdir(exist_ok=True)
    meta.unlink(missing_ok=True)
    rates = [int(r) for r in config["upsampling_ratios"]] + [int(r) for r in config["upsample_rates"]]
    spf = [int(np.prod(rates[:j])) for j in range(len(rates))]  # at the input of upsampling part 2 + j
    n_pre = len(config["upsampling_ratios"])
    in_axes = _in_axes(manifest)
    text, data = param.read_text(), weights.read_bytes()
    # 1. contexts and chunk lengths, measured on the parts without time tiles (tiles do not change what is summed),
    #    each part fed what the parts before it make of 16 frames of random codes
    plain = speed.codec_fast_parts(text, data, config)
    measured, held = [], []
    try:
        parts = []
        for k, (t, b) in enumerate(plain):
            held.append(out / f"measure{k}.tmp{os.getpid()}.bin")
            held[-1].write_bytes(b)
            parts.append(Part(net_from_text(t, held[-1], threads)))
        codes = np.random.default_rng(0).integers(0, config["codebook_size"], (16, 16))
        code_context = codes_reach(parts[0], codes, config, in_axes)
        x = parts[1](_run_codes(parts[0], codes, config, in_axes), **_attention_inputs(config, len(codes)))
        for j in range(len(rates)):
            part = Part(parts[2 + j].net, spf[j], rates[j])
            context = reach(part, x)
            measured.append({"context": context, "chunk_frames": max(1, math.ceil(context / (PART_OVERHEAD * spf[j])))})
            x = part(x)
        del parts, part
    finally:
        for f in held:
            f.unlink(missing_ok=True)
    # 2. the parts the runtime loads: time tiles sized to each decoder stage's chunk
    chunks = [None, None] + [m["chunk_frames"] for m in measured]
    stage = [0, 0] + [max(0, j - n_pre + 1) for j in range(len(rates))]
    final = speed.codec_fast_parts(text, data, config,
                                   tiles_of=lambda k, c: part_time_tiles(config, stage[k], c, chunks[k]))
    desc = {"key": key, "parts": [], "transformer_kv": "codec_decoder.part1_kv.param"}
    moves = []

    def stage_file(name: str, content) -> None:
        tmp = out / f"{name}.tmp{os.getpid()}"
        tmp.write_text(content) if isinstance(content, str) else tmp.write_bytes(content)
        moves.append((tmp, out / name))

    for k, (t, b) in enumerate(final):
        files = [f"codec_decoder.part{k}.param", f"codec_decoder.part{k}.bin"]
        stage_file(files[0], t)
        stage_file(files[1], b)
        if k == 0:
            entry = {"role": "codes", "context": code_context}
        elif k == 1:
            entry = {"role": "transformer"}
            stage_file(desc["transformer_kv"], add_kv_cache(t))
        else:
            entry = {"role": "upsample", "spf": spf[k - 2], "up": rates[k - 2]} | measured[k - 2]
        desc["parts"].append({"files": files} | entry)
    tmp_manifest = out / f"manifest.json.tmp{os.getpid()}"
    shutil.copyfile(manifest, tmp_manifest)
    moves.append((tmp_manifest, out / "manifest.json"))
    for tmp, dst in moves:
        os.replace(tmp, dst)
    tmp_meta = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(desc, indent=1))
    os.replace(tmp_meta, meta)  # the key last: a half-written cache is never taken as done
    current = {f for p in desc["parts"] for f in p["files"]} | {desc["transformer_kv"]}
    for stale in [*out.glob("codec_decoder.part*"), out / "codec_decoder.param", out / "codec_decoder.bin"]:
        if stale.name not in current and ".tmp" not in stale.name:  # older versions' files
            stale.unlink(missing_ok=True)
    return out, desc


def _in_axes(manifest: Path) -> list[int]:
    return json.loads(manifest.read_text())["codec_decoder.param"]["input_batch_axes"]


def _attention_inputs(config: dict, length: int, past: int = 0) -> dict[str, np.ndarray]:
    """The transformer's mask and rope tables for `length` positions after `past` (in2, in3, in4)."""
    cos, sin = rope.tables(config["head_dim"], config["rope_theta"], past, length)
    return {"in2": rope.causal_mask(length, past, window=config["sliding_window"]), "in3": cos, "in4": sin}


class Codec:
    """`decode(codes)` as the reference does it; `decode_once` for one graph call's worth of frames."""

    def __init__(self, ncnn_dir, config: dict, threads: int = 2, device: str = "cpu", fast: bool | None = None):
        self.config = config  # speech_tokenizer/config.json's decoder_config
        # On the CPU the graph is loaded in its faster equivalent form (`speed.codec_fast_parts`: 1-D convolutions
        # as 2-D ones with h = 1, which reach ncnn's packed kernels, polyphase upsampling, long convolutions cut
        # along time, other wide ones along input channels), in parts whose upsampling stages run chunk by
        # chunk; cached next to the exported files (`fast_graph`).
        fast = parse_device(device) is None if fast is None else fast
        self.parts: list[Part] | None = None
        self.net = None
        if fast:
            self.directory, desc = fast_graph(ncnn_dir, config)
            self.in_axes = _in_axes(self.directory / "manifest.json")
            self.parts = [Part(make_net(self.directory / p["files"][0], self.directory / p["files"][1], threads,
                                        device), p.get("spf", 1), p.get("up", 1), p.get("context", 0),
                               p.get("chunk_frames")) for p in desc["parts"]]
            self.transformer_kv = self.directory / desc["transformer_kv"]
            self.threads, self.device = threads, device
        else:
            self.net = Net(ncnn_dir, "codec_decoder", threads, device)

    def decode_once(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> wav (1920·T,): the exported graph's one call over all T frames (no chunking of the
        reference's kind). The CPU form computes the same samples part by part, the upsampling stages over
        chunks with the left context each needs (equal to the whole call to float rounding)."""
        c = self.config
        T = len(codes)
        if self.parts is not None:
            return run_parts(self.parts[2:], self.transformer_output(codes)).reshape(-1)
        semantic, acoustic = pack_codes(codes, c["codebook_size"])
        mask = rope.causal_mask(T, window=c["sliding_window"])
        cos, sin = rope.tables(c["head_dim"], c["rope_theta"], 0, T)
        return self.net(semantic, acoustic, mask, cos, sin)[0].reshape(-1)

    def transformer_output(self, codes: np.ndarray) -> np.ndarray:
        """Parts 0 and 1 (codebooks, pre_conv, transformer) over all of `codes` (T, 16): what the upsampling parts
        (`parts[2:]`) are fed, (channels, T). The CPU form only."""
        x = _run_codes(self.parts[0], codes, self.config, self.in_axes)
        return self.parts[1](x, **_attention_inputs(self.config, len(codes)))

    def incremental(self) -> IncrementalDecode:
        """A decode fed a few frames at a time (`IncrementalDecode`; the CPU form only)."""
        if self.parts is None:
            raise ValueError("incremental decoding needs the codec's CPU form (fast=True, device cpu)")
        return IncrementalDecode(self)

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


class IncrementalDecode:
    """`decode_once` of a growing code sequence, a few frames at a time: `push(codes)` returns the samples of
    those frames, equal (to float rounding) to what one `decode_once` over everything pushed so far gives there.

    Nothing is decoded twice. Part 0 (codebooks and pre_conv) is rerun on the new frames with its few frames of
    left context; the transformer runs only the new positions, with a KV cache (its `_kv` form, chapter 05's
    rewrite) and a mask that keeps the sliding window; the upsampling parts continue from their kept left
    context (`PartChain`). The caches grow with the positions pushed; `Codec.decode`'s reference chunks
    (300 frames) bound them in `stream.StreamDecoder`, which starts a new one per chunk."""

    def __init__(self, codec: Codec):
        import ncnn

        self.codec, self.config = codec, codec.config
        self.net = make_net(codec.transformer_kv, codec.directory / "codec_decoder.part1.bin", codec.threads,
                            codec.device)
        text = codec.transformer_kv.read_text()
        self.layers = sum(1 for line in text.splitlines() if line.startswith("SDPA"))
        self.caches = [(ncnn.Mat(), ncnn.Mat()) for _ in range(self.layers)]
        self.chain = PartChain(codec.parts[2:])
        self.codes = np.zeros((0, 16), np.int64)
        self.past = 0

    def push(self, codes: np.ndarray) -> np.ndarray:
        from .kvcache import run_with_caches

        codes = np.asarray(codes, np.int64).reshape(-1, 16)
        if len(codes) == 0:
            return np.zeros(0, np.float32)
        ctx = min(self.codec.parts[0].context, len(self.codes))
        window = np.concatenate([self.codes[len(self.codes) - ctx:], codes])
        x = _run_codes(self.codec.parts[0], window, self.config, self.codec.in_axes)[..., ctx:]
        self.codes = window[len(window) - min(self.codec.parts[0].context, len(window)):]  # the next push's context
        ex = self.net.create_extractor()
        held = [to_mat(x)] + [to_mat(a) for a in _attention_inputs(self.config, len(codes), self.past).values()]
        for name, m in zip(("in0", "in2", "in3", "in4"), held):
            ex.input(name, m)
        out, self.caches = run_with_caches(ex, self.caches, "codec transformer")
        self.past += len(codes)
        return self.chain.push(from_mat(out)).reshape(-1)
