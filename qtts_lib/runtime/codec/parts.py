"""The codec's CPU form in parts, and running them chunk by chunk. Introduced in 12.

`rewrites.codec_cpu.codec_fast_parts` cuts the codec graph at the input of each upsampling stage: part 0 (codes
to the pre_conv), part 1 (the transformer), parts 2.. (one upsampling stage each). The stages after the transformer
are causal convolutions that reach only a few input samples back, so each can run over chunks of a few frames with
that much left context (`reach` measures how many) and pass a chunk on as soon as it is made (`PartChain`): a decode
of any length then never holds a stage whole.

The codec loads the upsampling parts stateful (`rewrites.codec_cpu.stateful_convolutions`): each causal convolution
keeps the last input samples it needs from the call before, so a chunk needs no left context at all and a stream of
one-frame pieces computes each sample once. Left context (`Part.context`) is what a part without states (the
int8 tier's calibration, chapter 12's measurements) is fed instead.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..binding import rope
from ..binding.net import run, to_mat


def pack_codes(codes: np.ndarray, codebook_size: int) -> tuple[np.ndarray, np.ndarray]:
    """codes (T, 16) -> semantic (1, T) int32 and acoustic (15·T,) int32.

    Codebooks 1..15 share one fused table in the graph, so codebook g+1 is offset by
    g·codebook_size, and the rows are flattened group-major (index g·T + t)."""
    codes = np.asarray(codes, np.int64)
    semantic = codes[:, 0][None].astype(np.int32)
    offsets = np.arange(codes.shape[1] - 1)[:, None] * codebook_size
    acoustic = (codes[:, 1:].T + offsets).reshape(-1).astype(np.int32)
    return semantic, acoustic


def attention_inputs(config: dict, length: int, past: int = 0) -> dict[str, np.ndarray]:
    """The transformer's mask and rope tables for `length` positions after `past` (in2, in3, in4)."""
    cos, sin = rope.tables(config["head_dim"], config["rope_theta"], past, length)
    return {"in2": rope.causal_mask(length, past, window=config["sliding_window"]), "in3": cos, "in4": sin}


@dataclass
class Part:
    """One part of the codec's CPU form (`rewrites.codec_cpu.codec_fast_parts`). The upsampling parts (2..) run over
    chunks of `chunk_frames` frames, each with `context` input samples of left context whose output is dropped; `spf`:
    input samples per frame, `up`: output samples per input sample; `pool`: the memory pool the net allocates from,
    if not its own (`binding.net.memory_pool`), held here so that it outlives the net; `states`: the net's
    convolution states (`rewrites.codec_cpu.ConvState`), empty for a net without them."""
    net: object
    spf: int = 1
    up: int = 1
    context: int = 0
    chunk_frames: int | None = None
    pool: object = None
    states: tuple = ()

    def __call__(self, x: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        """One graph call: `x` as in0 (a (channels, 1, samples) or (channels, samples) array), `inputs` by name; a
        stateful part from zero states (what the part as written computes)."""
        return run(self.net, {"in0": x} | self.zero_states() | inputs, ["out0"], name="codec part")[0]

    def zero_states(self) -> dict:
        """The state inputs before the first call: zeros, as the convolutions' own padding."""
        return {s.input: to_mat(np.zeros((s.channels, 1, s.samples), np.float32)) for s in self.states}


class PartStream:
    """A part fed its input piece by piece: `push(x)` returns the part's output for the samples of `x`, what one
    call over the whole input would give there (to float rounding). A stateful part carries its convolutions'
    states from call to call (Mats in the layer's own layout, as a KV cache is kept: `binding.cached`), zeros
    before the first. A part without states is fed the last `context` input samples again as the next piece's left
    context (before the first piece there is none, as at the start of the whole input)."""

    def __init__(self, part: Part):
        self.part, self.tail = part, None
        self.states = part.zero_states() if part.states else {}
        self.outputs = [s.output for s in part.states]

    def push(self, x: np.ndarray) -> np.ndarray:
        if self.states:
            y, *mats = run(self.part.net, {"in0": x} | self.states, ["out0", *self.outputs], raw=self.outputs,
                           name="codec part")
            # cloned: the net's Mats come from the codec's memory pool, which a stream must not outlive holding them
            self.states = {s.input: m.clone() for s, m in zip(self.part.states, mats)}
            return y
        inp = x if self.tail is None else np.concatenate([self.tail, x], axis=-1)
        y = self.part(inp)
        drop = 0 if self.tail is None else self.tail.shape[-1] * self.part.up
        self.tail = inp[..., inp.shape[-1] - min(self.part.context, inp.shape[-1]):].copy()  # not a view of inp
        return y[..., drop:]


class PartChain:
    """The upsampling parts in a row, fed piece by piece (`push`): each part's chunks (`chunk_frames` frames of
    its input) go on to the next part as soon as they are made, so no stage is ever held whole; `push` returns
    the last part's output for what it was given, `pieces` the same in pieces as they are made. A time-tiled
    convolution needs a sample in each of its tiles (`cpu_form.part_time_tiles`): whole frames always give that, and
    so do the pieces `Codec.cuts` asks for (quarter frames into the first decoder stage, which has no tiles, eighths
    into the second and on, two tiles at most there)."""

    def __init__(self, parts: list[Part]):
        self.streams = [PartStream(p) for p in parts]

    def push(self, x: np.ndarray) -> np.ndarray:
        return self._feed(x, 0, len(self.streams))

    def pieces(self, x: np.ndarray, cuts: list[tuple[int, int]]) -> Iterator[tuple[np.ndarray, bool]]:
        """`push(x)` with its output handed out in pieces as they are made. `cuts`: (level, first) pairs, levels
        rising. The parts before the first level take all of x; from there part `level`'s input goes on in pieces of
        `first` samples, `first` again, then each as long as all before it (first, first, 2·first, 4·first, ...), and
        the first of those is cut again the same way at the next level. Yields (piece, whether it is the last).
        Every piece must be taken before the chain is pushed again."""
        yield from self._cut(self._feed(x, 0, cuts[0][0]), cuts, True)

    def _cut(self, x: np.ndarray, cuts: list[tuple[int, int]], last_of_all: bool):
        (level, first), inner = cuts[0], cuts[1:]
        stop = inner[0][0] if inner else len(self.streams)
        start = 0
        while start < x.shape[-1]:
            n = max(first, start)
            y, last = self._feed(x[..., start:start + n], level, stop), last_of_all and start + n >= x.shape[-1]
            if inner and start == 0:
                yield from self._cut(y, inner, last)
            else:
                yield (self._feed(y, stop, len(self.streams)) if inner else y), last
            start += n

    def _feed(self, x: np.ndarray, level: int, stop: int) -> np.ndarray:
        """x through the parts `level` .. `stop` - 1, each part's chunks (`chunk_frames` frames of its input) passed
        on as soon as they are made."""
        pieces: list[np.ndarray] = []

        def feed(level: int, piece: np.ndarray) -> None:
            if level == stop:
                pieces.append(piece)
                return
            p = self.streams[level].part
            step = piece.shape[-1] if p.chunk_frames is None else p.chunk_frames * p.spf
            for start in range(0, piece.shape[-1], step):
                feed(level + 1, self.streams[level].push(piece[..., start : start + step]))

        feed(level, x)
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
    base = run_codes(part, codes, config, in_axes)
    span = 0
    for p in (len(codes) // 2, len(codes) // 2 + 3):
        other = codes.copy()
        other[p] = (other[p] + 1) % config["codebook_size"]
        changed = np.nonzero((run_codes(part, other, config, in_axes) != base).reshape(-1, base.shape[-1]).any(0))[0]
        if len(changed) == 0 or changed[0] < p:
            raise ValueError("codec part 0: the output does not depend causally on the codes")
        span = max(span, int(changed[-1]) - p)
    return span + 1


def run_codes(part: Part, codes: np.ndarray, config: dict, in_axes: list[int]) -> np.ndarray:
    """Part 0 on codes (T, groups): the codebook sums through the pre_conv, (channels, T)."""
    semantic, acoustic = pack_codes(codes, config["codebook_size"])
    return run(part.net, {"in0": semantic, "in1": acoustic}, ["out0"], axes={"in0": in_axes[0], "in1": in_axes[1]},
               name="codec part 0")[0]


def transformer_output(parts: list[Part], codes: np.ndarray, config: dict, in_axes: list[int]) -> np.ndarray:
    """Parts 0 and 1 of the CPU form (codebooks, pre_conv, transformer) over all of `codes` (T, groups): what the
    upsampling parts (`parts[2:]`) are fed, (channels, T)."""
    x = run_codes(parts[0], codes, config, in_axes)
    return parts[1](x, **attention_inputs(config, len(codes)))
