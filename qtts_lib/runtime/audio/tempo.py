"""Speech faster or slower at the same pitch, piece by piece: FFmpeg's `atempo` through PyAV. Introduced in 18.

OpenAI's speech API takes a `speed` from 0.25 to 4.0. Playing the samples faster would raise the pitch with the
tempo (a tape run fast); `atempo` instead cuts the audio into overlapping windows and lays them down closer together
or further apart, each shifted to where it best matches its neighbour (WSOLA), so the voice keeps its pitch. One
`atempo` keeps its quality between 0.5 and 2.0 (FFmpeg's documentation: chain filters beyond that), so a speed
outside is split into stages: 4.0 is two stages of 2.0, 0.25 two of 0.5. FFmpeg comes with PyAV's wheels, the same
maintained library `audio.encode` uses for mp3, opus, aac and flac (`pip install av`, or the serve extra); speed
1.0 needs neither.

    tempo = Tempo(1.5)
    for piece in pieces:            # float32 pieces at 24 kHz
        send(tempo.write(piece))    # what the filter has ready (perhaps nothing yet: it holds back part of a window)
    send(tempo.close())             # the rest

The output of a piece-by-piece run is the output of one whole run (`change_tempo`), sample for sample: the filter
buffers its windows itself, whatever the pieces' sizes.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from fractions import Fraction

import numpy as np

from ..errors import InputError
from .encode import require
from .wav import SAMPLE_RATE

MIN_SPEED, MAX_SPEED = 0.25, 4.0    # OpenAI's range for `speed`
STAGE_MIN, STAGE_MAX = 0.5, 2.0     # one atempo's range of good quality


def check_speed(speed) -> float:
    """`speed` as a float, or an `InputError` saying the range."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise InputError(f"speed must be a number from {MIN_SPEED} to {MAX_SPEED} (1.0: as generated), not {speed!r}")
    return float(speed)


def stages(speed: float) -> list[float]:
    """The atempo factors whose product is `speed`, each in [STAGE_MIN, STAGE_MAX]: as few as that takes."""
    speed = check_speed(speed)
    n = max(1, math.ceil(abs(math.log(speed)) / math.log(STAGE_MAX) - 1e-9))
    return [speed ** (1 / n)] * n


class Tempo:
    """Float32 pieces at 24 kHz in, the same speech at `speed` times the tempo out, as soon as FFmpeg has it."""

    def __init__(self, speed: float, sample_rate: int = SAMPLE_RATE):
        self.speed, self.sample_rate = check_speed(speed), sample_rate
        self.samples_in = self.samples_out = 0
        self._graph = None
        if self.speed == 1.0:
            return
        av = require("a speed other than 1.0")
        self._av = av
        graph = av.filter.Graph()
        node = graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono",
                                 time_base=f"1/{sample_rate}")
        for factor in stages(self.speed):
            stage = graph.add("atempo", f"{factor:.9f}")
            node.link_to(stage)
            node = stage
        node.link_to(graph.add("abuffersink"))
        graph.configure()
        self._graph = graph

    def write(self, piece: np.ndarray) -> np.ndarray:
        """The tempo-changed samples this piece completes (often fewer than it brings, at first none)."""
        piece = np.ascontiguousarray(piece, np.float32).reshape(-1)
        if self._graph is None:
            self.samples_in += len(piece)
            self.samples_out += len(piece)
            return piece
        if len(piece):
            frame = self._av.AudioFrame.from_ndarray(piece[None], format="flt", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = self.sample_rate, self.samples_in, Fraction(
                1, self.sample_rate)
            self.samples_in += len(piece)
            self._graph.push(frame)
        return self._pull()

    def close(self) -> np.ndarray:
        """The rest: what the filter held back. After it, the Tempo is spent."""
        if self._graph is None:
            return np.zeros(0, np.float32)
        self._graph.push(None)
        rest = self._pull()
        self._graph = None
        return rest

    def _pull(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (self._av.error.BlockingIOError, self._av.error.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1).astype(np.float32, copy=False))
        wav = np.concatenate(out) if out else np.zeros(0, np.float32)
        self.samples_out += len(wav)
        return wav


def tempo_pieces(pieces: Iterable[np.ndarray], speed: float) -> Iterator[np.ndarray]:
    """The pieces at `speed` (`Tempo`), one out per piece in (perhaps empty), then the rest; speed 1.0 passes them
    through untouched."""
    tempo = Tempo(speed)
    for piece in pieces:
        yield tempo.write(piece)
    rest = tempo.close()
    if len(rest):
        yield rest


def change_tempo(wav: np.ndarray, speed: float) -> np.ndarray:
    """A whole wav at `speed` (what `Tempo` gives piece by piece)."""
    tempo = Tempo(speed)
    head = tempo.write(wav)
    return np.concatenate([head, tempo.close()])
