"""Streaming decode: audio for each few frames as they are generated, equal to the whole decode. Introduced in 15.

The codec decoder is causal: causal convolutions, and a transformer whose sliding window (72 frames, so 71
frames back per layer) only looks left. A sample of frame k therefore depends on frames k-R..k only, with R
the *receptive field* (`receptive_field`): pre-conv 2 + layers x 71 + about 10 frames of the conv stack.
Decoding frames [a, b) with c frames of left context (`codes[a-c:b]`, then dropping the first c·1920
samples) gives the one-shot samples of [a, b) to float rounding once c >= R; with less context it is an
approximation whose error falls as c grows (`qtts_lib.bench.stream.context_snr` measures it; chapter 15 plots it).

On the CPU, `StreamDecoder` does not decode anything twice: `Codec.incremental` continues one decode as frames
arrive (the transformer with a KV cache, the convolution stages from their kept left context), which is exact
and costs about one whole decode. Decoding each piece again with its left context (below) is the way on a GPU,
and the way to trade exactness for time when asked (`context_frames`).

`StreamDecoder` reproduces `Codec.decode`, the runtime's (and the reference's) whole-utterance decode:
- up to 300 frames `Codec.decode` is one graph call over all frames (the one-shot decode);
- past 300 frames the reference decodes chunks of 300 frames, each with only 25 frames of left context
  (`chunked_decode(300, 25)`), which is *not* the one-shot decode. The stream follows the same chunk
  boundaries: its left context never reaches back past the start of the reference chunk's context, so it
  reproduces the reference's long decode too, not a one-shot decode that the reference never makes.
Within one reference chunk, each emitted piece [a, b) is decoded from max(a - context_frames, chunk's context
start). When that is the chunk's context start, the piece *is* the reference's computation cut at b
(causality); when context_frames >= R (the default), the frames it leaves out are beyond every sample's
reach. Either way it equals the reference's samples to float rounding (~120 dB measured). With less context
it is within the SNR that `context_snr` measures for that context.

Frames that are decoded but never emitted (an ICL voice clip's codes in front, the 25 frames of left context of a
later reference chunk) go into the incremental decode PREFIX_PIECE frames at a time, always at the same boundaries:
`warm` decodes some of them ahead (the scheduler calls it while the utterance's prompt is prefilled, a piece a step,
so that a clip's hundreds of frames never stall other streams in one go), and a stream still warming when its
frames come decodes one piece per frame pushed, then catches up at most two pieces of audio per push. Where the
work is done changes when the audio comes, never what it is.

The first piece may be shorter than the rest (`first_frames`): a stream's first audio then waits for that many
frames, not for `chunk_frames`, and the pieces after it grow to `chunk_frames` only as fast as a listener who
starts playing at the first piece allows (`piece_frames`). A stream made at real-time factor r (a frame's seconds of
work over its 80 ms of audio) has the frames of pieces 1..k ready at r times their audio, while the listener needs
piece k when the audio before it has played: with S frames out, the next piece may hold f + S·(1/r - 1) frames
(f: the first piece's) and no more, or the listener waits. `rtf` is that r, as the stream's maker expects it;
the default, 0.5, gives pieces twice the one before (1, 2, 4, 4, ... for a first piece of one frame and pieces of
four), the server passes what it measured (`app.server.capacity`), and at r >= 1 every piece is the first's size.
Pieces on other boundaries are the same audio to float rounding (the codec's transformer runs over each piece's
frames at once); the incremental decode stays one decode, each frame fed once.

The first piece comes in pieces, so that the first audio does not wait for a whole piece's decode. The codec's
decoder stages cost mostly per sample, not per call (`IncrementalDecode.pieces`), so an incremental stream hands out
the first eighth of a frame of its first piece (10 ms of audio) as soon as that is decoded and holds the rest
(`held`): an eighth again, then pieces each as long as all before them, one per `drain`. The scheduler drains them
before it makes another frame; `push` and `finish` hand out whatever is still held first. No held piece is longer
than the audio in front of it, and those stages decode faster than real time, so a player that starts at the first
piece has audio while the next is decoded. The samples are the same either way.

Both decoders here share one protocol, which every consumer of the generation loop uses: `push(frame)` returns the
pieces of audio that are ready, `finish()` the rest; `warm(frames)` decodes ahead what is never emitted (False while
some is left), and a decoder that holds pieces (`held`) hands them out one per `drain()`. `WholeDecoder` is
`synthesize`'s (nothing until the end, then the reference's whole decode; nothing to warm, nothing held);
`StreamDecoder` is `stream`'s.
"""
from __future__ import annotations

import math

import numpy as np

from ..audio.wav import SAMPLES_PER_FRAME
from .decoder import CHUNK_FRAMES, LEFT_CONTEXT_FRAMES, Codec

PREFIX_PIECE = 4  # frames decoded but not emitted, per incremental push (module docstring)
CATCH_UP = 2      # pieces of audio one push may emit at most (a stream that was warming catches up)
PIECE_RTF = 0.5   # the real-time factor pieces grow for unless told (module docstring): each twice the one before


def piece_frames(out: int, first: int, chunk: int, rtf: float = PIECE_RTF) -> int:
    """Frames in a stream's next piece when `out` frames are out already (module docstring): `first` for the first
    piece, then `first` + `out`·(1/rtf - 1), at most `chunk`, so that a listener playing from the first piece never
    waits for a stream made at `rtf`."""
    if out == 0 or rtf >= 1:
        return min(first, chunk)
    return min(chunk, first + int(out * (1 / rtf - 1) + 1e-9))


# ------------------------------------------------------------ how much left context
def receptive_field(config: dict) -> int:
    """Frames of left context after which a decoded sample cannot change (from decoder_config).

    Each term is a layer's left reach in samples at its own rate, divided by that rate's samples per frame:
    pre_conv (kernel 3) at 1/frame; the transformer, (window - 1) per layer; per upsampling ratio a
    transposed conv with kernel = stride (no reach) and a ConvNeXt depthwise kernel 7 (6 back); the
    decoder's kernel-7 input conv; per upsample rate r a transposed conv of kernel 2r (1 input sample back)
    and residual units of kernel 7 at dilations 1, 3, 9 (6·13 back); the kernel-7 output conv."""
    reach = 2.0 + config["num_hidden_layers"] * (config["sliding_window"] - 1)
    per_frame = 1
    for f in config["upsampling_ratios"]:
        per_frame *= f
        reach += 6 / per_frame
    reach += 6 / per_frame
    for r in config["upsample_rates"]:
        reach += 1 / per_frame
        per_frame *= r
        reach += 6 * (1 + 3 + 9) / per_frame
    reach += 6 / per_frame
    return math.ceil(reach)


# ------------------------------------------------------------ the streaming decoder
class StreamDecoder:
    """Feed frames one at a time (`push`); get back the samples of each piece as soon as its frames are in: the first
    piece of `first_frames` frames (None: `chunk_frames`), the next ones growing to `chunk_frames` as fast as a
    stream made at `rtf` allows (`piece_frames`; the first piece in pieces: `held`, `drain`); `finish` returns the
    rest. Concatenated, the pieces equal
    `codec.decode(prefix + frames)` minus the prefix's samples (see the module docstring for exactly how equal).

    `prefix`: frames decoded in front but never emitted (an ICL voice clip's codes, as the reference does).

    Two ways to decode a piece:
    - incremental (the default on the CPU, `context_frames=None`): one `Codec.incremental` decode per reference
      chunk, fed each piece once. Nothing is decoded twice, so streaming costs about what one whole decode
      costs, and every piece is exact.
    - re-decode (`context_frames` given, or a codec without the CPU form, e.g. on a GPU): each piece is decoded
      again with `context_frames` frames of left context (default `receptive_field`, exact); less is cheaper and
      approximate (chapter 15 measures how approximate; the product streams with the default, exact, on every
    device)."""

    def __init__(self, codec: Codec, chunk_frames: int = 4, context_frames: int | None = None,
                 prefix: np.ndarray | None = None, first_frames: int | None = None, rtf: float = PIECE_RTF):
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be at least 1, not {chunk_frames}")
        if first_frames is not None and first_frames < 1:
            raise ValueError(f"first_frames must be at least 1, not {first_frames}")
        if not 0 < rtf < float("inf"):
            raise ValueError(f"rtf must be a number above 0, not {rtf}")
        self.codec, self.chunk, self.rtf = codec, chunk_frames, rtf
        self.first = chunk_frames if first_frames is None else min(first_frames, chunk_frames)
        self.piece = self.first  # the next piece's frames
        self.incremental = context_frames is None and getattr(codec, "parts", None) is not None
        self.context = receptive_field(codec.config) if context_frames is None else context_frames
        self.frames: list[np.ndarray] = [] if prefix is None else list(np.asarray(prefix, np.int64))
        self.emitted = len(self.frames)  # frames whose samples are out (or never will be: the prefix)
        self.start = self.emitted        # the first piece starts here
        self._rest = None                # the first piece's pieces not handed out yet (`drain`)
        self._decodes: dict[int, list] = {}  # reference chunk start -> [its incremental decode, frames fed to it]

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        out = self._drain_all()
        self.frames.append(np.asarray(frame, np.int64))
        if not self.warm(PREFIX_PIECE):
            return out
        while len(self.frames) - self.emitted >= self.piece and len(out) < CATCH_UP:
            a, b = self.emitted, self.emitted + self.piece
            self.piece = piece_frames(b - self.start, self.first, self.chunk, self.rtf)
            if a == self.start and self.incremental:  # the first piece: its head now, the rest held
                out.append(self._first(a, b))
                break
            out.append(self._decode(a, b))
        if self.incremental:  # the next reference chunk's left context, a piece as soon as its frames are here
            start = (self.emitted // CHUNK_FRAMES + 1) * CHUNK_FRAMES
            if len(self.frames) >= start - LEFT_CONTEXT_FRAMES + PREFIX_PIECE or len(self.frames) >= start:
                self._context(start, min(len(self.frames), start), PREFIX_PIECE)
        return out

    def warm(self, frames: int | None = None) -> bool:
        """Decode about `frames` (None: all) of the frames in front of the next piece that are decoded but never
        emitted (module docstring): whole PREFIX_PIECEs while the budget lasts (one at least); whether none are
        left. Incremental decodes only."""
        return not self.incremental or self._context(self.emitted, self.emitted, frames)

    @property
    def held(self) -> bool:
        """Whether pieces of the first one are held (`drain` hands them out)."""
        return self._rest is not None

    def drain(self) -> list[np.ndarray]:
        """The next held piece of the first one (module docstring), [] if none is held."""
        if self._rest is None:
            return []
        piece, last = next(self._rest)
        if last:
            self._rest = None
        return [piece]

    def finish(self) -> np.ndarray:
        """The samples of every frame pushed since the last piece (the decoder can go on after it)."""
        return np.concatenate(self._drain_all() + [self._decode(self.emitted, len(self.frames))])

    def close(self) -> None:
        self._rest = None
        self._decodes.clear()

    def _drain_all(self) -> list[np.ndarray]:
        out = []
        while self._rest is not None:
            out += self.drain()
        return out

    def _first(self, a: int, b: int) -> np.ndarray:
        """The first piece [a, b) of the stream, in pieces (`IncrementalDecode.pieces`): the first returned, the
        rest held for `drain`. One reference chunk's frames only, as every first piece is (else `_decode`)."""
        chunk_start = a // CHUNK_FRAMES * CHUNK_FRAMES
        if b > chunk_start + CHUNK_FRAMES:
            return self._decode(a, b)
        self._context(a, a)
        entry = self._decodes[chunk_start]
        rest = entry[0].pieces(np.stack(self.frames[a:b]))
        entry[1], self.emitted = b, b
        piece, last = next(rest)
        self._rest = None if last else rest
        return piece

    def _decode(self, a: int, b: int) -> np.ndarray:
        parts = []
        while a < b:  # split at the reference's 300-frame chunk boundaries
            chunk_start = a // CHUNK_FRAMES * CHUNK_FRAMES
            end = min(b, chunk_start + CHUNK_FRAMES)
            floor = chunk_start - LEFT_CONTEXT_FRAMES if chunk_start - LEFT_CONTEXT_FRAMES > 0 else 0
            if self.incremental:
                self._context(a, a)  # context (or prefix) frames: decoded, not emitted
                entry = self._decodes[chunk_start]
                parts.append(entry[0].push(np.stack(self.frames[a:end])))
                entry[1] = end
                for old in [k for k in self._decodes if k < chunk_start]:
                    del self._decodes[old]
            else:
                lo = max(floor, a - self.context)
                codes = np.stack(self.frames[lo:end])
                parts.append(self.codec.decode_once(codes)[(a - lo) * SAMPLES_PER_FRAME:])
            a = end
        self.emitted = b
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)

    def _context(self, a: int, upto: int, budget: int | None = None) -> bool:
        """Feed the incremental decode of frame a's reference chunk (started here if need be) the frames before
        `upto` (at most a) that it decodes without emitting, PREFIX_PIECE at a time from the chunk's context start,
        at most `budget` frames now; whether every frame before a is in."""
        chunk_start = a // CHUNK_FRAMES * CHUNK_FRAMES
        if chunk_start not in self._decodes:  # decoded from the reference chunk's own context start
            floor = chunk_start - LEFT_CONTEXT_FRAMES if chunk_start - LEFT_CONTEXT_FRAMES > 0 else 0
            self._decodes[chunk_start] = [self.codec.incremental(), floor]
        entry = self._decodes[chunk_start]
        while entry[1] < upto and (budget is None or budget > 0):
            n = min(PREFIX_PIECE, a - entry[1])
            if entry[1] + n > upto:  # a whole piece only (the same boundaries whoever feeds it)
                break
            entry[0].push(np.stack(self.frames[entry[1]:entry[1] + n]))
            entry[1] += n
            budget = None if budget is None else budget - n
        return entry[1] >= a


class WholeDecoder:
    """The decoder protocol over one whole decode: frames are kept as they are pushed, and `finish` decodes them all
    (with the voice clip's codes in front, for ICL) exactly as the reference does (`Codec.decode_with_voice`)."""

    def __init__(self, codec: Codec, prefix: np.ndarray | None = None):
        self.codec, self.prefix, self.frames = codec, prefix, []

    held = False  # the protocol (module docstring): a whole decode holds nothing back and warms nothing

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        self.frames.append(np.asarray(frame, np.int64))
        return []

    def warm(self, frames: int | None = None) -> bool:
        return True

    def drain(self) -> list[np.ndarray]:
        return []

    def finish(self) -> np.ndarray:
        codes = np.stack(self.frames) if self.frames else np.zeros((0, self.codec.groups), np.int64)
        return self.codec.decode_with_voice(codes, self.prefix).astype(np.float32)

    def close(self) -> None:
        pass


class Decoders:
    """This process's codec as a synthesizer's decoders: `decoder(None, prefix)` a `WholeDecoder` (synthesize),
    `decoder(chunk_frames, prefix, first_frames=, rtf=)` a `StreamDecoder` (stream). `experimental.codec_process` offers
    the first two arguments in a second process."""

    def __init__(self, codec: Codec):
        self.codec = codec

    def decoder(self, chunk_frames: int | None, prefix: np.ndarray | None = None, first_frames: int | None = None,
                rtf: float = PIECE_RTF):
        if chunk_frames is None:
            return WholeDecoder(self.codec, prefix)
        return StreamDecoder(self.codec, chunk_frames, prefix=prefix, first_frames=first_frames, rtf=rtf)

    def close(self) -> None:
        pass
