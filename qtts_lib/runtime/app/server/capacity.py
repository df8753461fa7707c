"""How many streams `qtts serve`'s engine can speak at once in real time: its admission rule. Introduced in 18.

A batch of b streams makes one frame for each in one step, and a frame is 80 ms of audio, so b streams keep real
time while a step at batch b (the codec's decode of their pieces included) takes under 80 ms. `Capacity` holds the
mean seconds of a step at each batch size, measured once on the engine's thread before the first request
(`measure`: a short neutral utterance at each batch size, its prefill left out) or given (a test's, or an
operator's who measured it), and admits the largest batch whose step leaves ADMIT_HEADROOM of the frame to the rest
of the server (the event loop's encoding, the voice builds). A batch size it has not measured is assumed to cost
the largest measured one's time scaled by the batch (a batch costs less than that in practice, so the estimate
errs toward fewer streams). At least one stream is always admitted, however slow the machine.

The same numbers cut each stream's pieces (`piece_rtf`): its first piece is one frame, and the next ones grow only
as fast as a listener who plays from the first piece allows at the admitted batch's step (`codec.stream.piece_frames`),
so an admitted stream runs dry only where one step is slower than real time.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from ...codec.stream import PIECE_RTF
from ...pipeline.scheduler import Utterance

FRAME_SECONDS = 0.08     # the audio one frame makes (12.5 frames a second)
ADMIT_HEADROOM = 0.7     # a step may take this share of a frame's 80 ms at the admitted batch (0.85 admitted two
                         # streams at 67 ms a step on a 2-core Zen 5: served, with their prefills and pieces of
                         # one frame, they ran at 0.92 of real time and ran dry mid-sentence)
MEASURE_FRAMES = 24      # frames each measured utterance makes
PIECE_MARGIN = 1.5       # pieces grow for steps this much slower than measured: a prefill joining, the spread, and
                         # what piece_frames leaves out (the first piece's pieces, the fade's 10 ms held back, each
                         # piece's decode); at 1.2, streams started as another ended ran dry 230 ms in (2-core Zen 5)
OUTLIER_TIMES = 5        # a measured step this many times the median is the machine's stall, not the model's cost
MEASURE_TEXT = "One two three four five six seven eight nine ten, and then the count goes on again."


class Capacity:
    """Seconds a step takes at each batch size (`seconds`), and the streams that keep real time (`streams`)."""

    def __init__(self, seconds: dict[int, float], max_batch: int):
        self.seconds, self.max_batch = dict(seconds), max_batch
        self.streams = self._streams()

    def estimate(self, batch: int) -> float:
        """Seconds of a step at `batch`: measured, or the largest measured batch's scaled up (0 when none is)."""
        if batch in self.seconds:
            return self.seconds[batch]
        below = [b for b in self.seconds if b < batch]
        return self.seconds[max(below)] * batch / max(below) if below else 0.0

    def _streams(self) -> int:
        fits = [b for b in range(1, self.max_batch + 1) if self.estimate(b) <= FRAME_SECONDS * ADMIT_HEADROOM]
        return max(fits, default=1)

    def piece_rtf(self) -> float:
        """The real-time factor a stream's pieces grow for (`codec.stream.piece_frames`): a step at the admitted
        batch over a frame's 80 ms, PIECE_MARGIN slower; never faster than the pieces' default growth."""
        return max(PIECE_RTF, PIECE_MARGIN * self.estimate(self.streams) / FRAME_SECONDS)

    def describe(self) -> str:
        steps = ", ".join(f"{b}: {s * 1e3:.0f} ms" for b, s in sorted(self.seconds.items()))
        return (f"{self.streams} stream(s) at once in real time (a step at each batch size: {steps}); pieces grow "
                f"for a real-time factor of {self.piece_rtf():.2f}")

    @classmethod
    def measure(cls, synth, scheduler, chunk_frames: int) -> Capacity:
        """Each batch size in turn, 1 to the scheduler's width: that many neutral utterances (greedy, a voice of
        zeros) of MEASURE_FRAMES frames, streamed in pieces of `chunk_frames`; the mean step at each batch size
        once every prefill is in (`robust_mean`), after one short utterance untimed. On the calling thread (the
        engine's: ncnn's workers are that thread's)."""
        voice = neutral_voice(synth)
        sampling = synth.sampling.replace(greedy=True)
        times: dict[int, list[float]] = defaultdict(list)
        scheduler.submit(Utterance(MEASURE_TEXT, "english", voice, sampling, chunk_frames), chunk_frames)
        while scheduler:  # a warm-up, not timed: the first calls of a net run slower than the rest
            scheduler.step()
        for width in range(1, scheduler.max_batch + 1):
            for _ in range(width):
                scheduler.submit(Utterance(MEASURE_TEXT, "english", voice, sampling, MEASURE_FRAMES), chunk_frames)
            while scheduler:
                joining = bool(scheduler.waiting or scheduler.prefilling)
                start = time.perf_counter()
                events = scheduler.step()
                took = time.perf_counter() - start
                batch = sum(not e.drained for e in events)
                if batch and not joining:
                    times[batch].append(took)
        return cls({b: robust_mean(t) for b, t in times.items()}, scheduler.max_batch)


def robust_mean(seconds: list[float]) -> float:
    """The mean step, without the steps over OUTLIER_TIMES the median: the codec's decode every few steps stays in
    (it is part of the cost), a step that the machine stalled (another process on the cores) does not."""
    median = float(np.median(seconds))
    return float(np.mean([s for s in seconds if s <= OUTLIER_TIMES * median]))


def neutral_voice(synth):
    """A voice to measure with: a speaker row of zeros on Base (no clip needed), the first speaker on CustomVoice,
    the model's own choice on VoiceDesign."""
    if synth.kind == "voice_design":
        return synth.voice(instruct=None)
    if synth.kind == "custom_voice":
        return synth.voice(speaker=synth.speakers[0])
    return synth.voice(xvector=np.zeros_like(synth.embeddings.codec([0])[0]))
