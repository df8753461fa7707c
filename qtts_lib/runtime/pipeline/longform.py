"""Speak a text of any length: one generation per segment, one voice, joined by short pauses. Introduced in 12.

One generation over a whole article drifts: the talker's context grows by 12.5 frames a second,
and users of every Qwen3-TTS port report runaway or degraded speech after a few minutes. So
`synthesize_long` cuts the text with `segment.segments` (bounded in BPE tokens, what the model
reads), speaks each segment with `Synthesizer.synthesize` and the *same* `Voice` (the x-vector and
an ICL clip's codes are computed once, by the caller), and joins the pieces:

- **Frame cap per segment**, scaled by its text (`prompt.frame_cap`, which says why 8 frames per token
  plus 2 s): a segment that reaches its cap has run away, and it stops there: it costs at most about
  twice its natural length instead of the rest of the `max_frames` budget.
- **Pause** of PAUSE_SECONDS of silence between segments: read speech pauses 0.3-0.7 s between
  sentences; each segment already ends in the model's own short silence, so 0.3 s more sounds
  like the next sentence, not like the next clip.
- **Fades** of FADE_SECONDS (10 ms, a raised cosine) at both ends of each segment: a segment cut
  at its cap can end mid-waveform, and a step into silence clicks; 10 ms is shorter than any
  phoneme, so nothing spoken is lost. Fades do not change lengths: the joined wav has exactly
  `sum(segment samples) + (segments - 1) * pause samples`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..audio.wav import SAMPLE_RATE
from ..text.segment import segments
from .prompt import FRAMES_PER_TOKEN, MARGIN_FRAMES, Voice, frame_cap
from .sampling import Sampling

if TYPE_CHECKING:
    from .synthesizer import Synthesizer

MAX_SEGMENT_TOKENS = 60     # ~15-20 s of speech: a paragraph's worth, well inside the range the model speaks well
PAUSE_SECONDS = 0.3
FADE_SECONDS = 0.01


@dataclass
class TextSegment:
    """One spoken segment: its text, token count, frame cap, what it produced and where it sits."""
    text: str
    tokens: int
    cap: int                 # the most frames it could generate
    frames: int = 0
    stopped: str = ""        # "eos" or "cap"
    start: int = 0           # first sample in the joined wav
    samples: int = 0
    seconds: float = 0.0     # wall time
    warnings: list[str] = field(default_factory=list)
    codes: np.ndarray | None = None   # (frames, 16)


@dataclass
class LongResult:
    wav: np.ndarray
    segments: list[TextSegment]
    pause_samples: int


def plan(synth: Synthesizer, text: str, max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
         frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES) -> list[TextSegment]:
    """The segments `synthesize_long` will speak, with their token counts and frame caps (nothing run yet)."""
    count = synth.prompts.text_tokens
    return [TextSegment(s, n, frame_cap(n, max_frames, frames_per_token, margin))
            for s in segments(text, max_tokens, count) for n in [count(s)]]


def fade(wav: np.ndarray, samples: int) -> np.ndarray:
    """Raised-cosine fade-in and fade-out of `samples` each (a copy; same length)."""
    wav = np.array(wav, np.float32)
    n = min(samples, len(wav) // 2)
    if n > 0:
        ramp = (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)
        wav[:n] *= ramp
        wav[len(wav) - n:] *= ramp[::-1]
    return wav


def join(wavs: list[np.ndarray], pause_samples: int, fade_samples: int) -> tuple[np.ndarray, list[int]]:
    """Faded segments with `pause_samples` of silence between them, and each one's first sample."""
    out, starts, at = [], [], 0
    for i, w in enumerate(wavs):
        if i:
            out.append(np.zeros(pause_samples, np.float32))
            at += pause_samples
        starts.append(at)
        out.append(fade(w, fade_samples))
        at += len(w)
    return (np.concatenate(out) if out else np.zeros(0, np.float32)), starts


def synthesize_long(synth: Synthesizer, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
                    max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
                    frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES,
                    pause: float = PAUSE_SECONDS, fade_seconds: float = FADE_SECONDS,
                    on_segment: Callable[[int, int, TextSegment, np.ndarray], None] | None = None,
                    on_frame: Callable[[int], None] | None = None,
                    on_warning: Callable[[str], None] | None = None) -> LongResult:
    """Speak `text` segment by segment with one `voice` (see the module docstring): `plan`'s segments, each with
    `Synthesizer.synthesize` and its own frame cap, joined with pauses and fades.

    Segment i samples with `sampling` (the checkpoint's defaults unless given) and seed `sampling.seed + i`.
    `on_segment(i, n, segment, wav)` runs as each segment is done, with its faded wav (progress bars; streaming);
    `on_frame(n)` after each frame of the current segment; `on_warning` gets the synthesizer's warnings prefixed
    with "segment i/n"."""
    todo = plan(synth, text, max_tokens, max_frames, frames_per_token, margin)
    sampling = synth.sampling if sampling is None else sampling
    pause_samples, fade_samples = int(round(pause * SAMPLE_RATE)), int(round(fade_seconds * SAMPLE_RATE))
    wavs = []
    for i, seg in enumerate(todo):
        where = f"segment {i + 1}/{len(todo)}"
        t0 = time.perf_counter()
        result = synth.synthesize(seg.text, language, voice, sampling.replace(seed=sampling.seed + i),
                                  max_frames=seg.cap, on_frame=on_frame,
                                  on_warning=(lambda m, w=where: on_warning(f"{w}: {m}")) if on_warning else None)
        seg.seconds = time.perf_counter() - t0
        seg.frames, seg.samples = len(result.codes), len(result.wav)
        seg.stopped = result.stopped
        seg.warnings = result.warnings
        seg.codes = result.codes
        wavs.append(result.wav)
        if on_segment:
            on_segment(i, len(todo), seg, fade(result.wav, fade_samples))
    wav, starts = join(wavs, pause_samples, fade_samples)
    for seg, start in zip(todo, starts):
        seg.start = start
    return LongResult(wav, todo, pause_samples)


def _faded(pieces, samples: int):
    """`fade` applied to a stream of pieces: the first `samples` wait until the segment is known to hold at least
    2·samples (then `fade` uses the full ramp), and the last `samples` are held back until the stream ends."""
    buf, started = np.zeros(0, np.float32), False
    ramp = fade(np.ones(2 * samples, np.float32), samples)[:samples] if samples else None
    for piece in pieces:
        buf = np.concatenate([buf, np.asarray(piece, np.float32)])
        if not started and samples and len(buf) >= 2 * samples:
            buf[:samples] *= ramp
            started = True
        if (started or not samples) and len(buf) > samples:
            out, buf = buf[: len(buf) - samples], buf[len(buf) - samples :]
            yield out
    if started:
        buf[len(buf) - samples :] *= ramp[::-1]
        yield buf
    elif len(buf):
        yield fade(buf, samples)


def stream_long(synth: Synthesizer, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
                max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
                frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES, chunk_frames: int = 4,
                pause: float = PAUSE_SECONDS, fade_seconds: float = FADE_SECONDS,
                on_frame: Callable[[int], None] | None = None) -> Iterator[np.ndarray]:
    """`synthesize_long`, streamed (what `qtts serve` speaks): float32 pieces as they are generated, each segment
    through `Synthesizer.stream`, the pauses as pieces of silence. Concatenated they equal `synthesize_long`'s wav
    as closely as each segment's stream equals its `synthesize`. The first segment's prompt is built (and bad input
    refused) before the first piece; closing the generator stops the loop at once, and so does an exception raised
    by `on_frame(n)` (called after each frame of the current segment: the server's way to stop for a client that
    left)."""
    todo = plan(synth, text, max_tokens, max_frames, frames_per_token, margin)
    sampling = synth.sampling if sampling is None else sampling
    pause_samples, fade_samples = int(round(pause * SAMPLE_RATE)), int(round(fade_seconds * SAMPLE_RATE))
    for i, seg in enumerate(todo):
        if i:
            yield np.zeros(pause_samples, np.float32)
        with synth.stream(seg.text, language, voice, sampling.replace(seed=sampling.seed + i), max_frames=seg.cap,
                          chunk_frames=chunk_frames, on_frame=on_frame) as pieces:
            yield from _faded(pieces, fade_samples)
