"""Speak a text of any length: one generation per segment, one voice, joined by short pauses. Introduced in 16.

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

The segments are independent generations, so they can run side by side (chapter 17): `LongText` submits up to
`ahead` of them to a `Scheduler` at once and gives their audio back in order. `synthesize_long` runs
`DEFAULT_MAX_BATCH` segments at a time; `stream_long` one (the next starts when one ends: a stream's first audio
comes soonest that way), or `max_batch` when asked. A text is one request to the scheduler (its `Lane`): its next
segment is admitted before any text that has not started, so a stream never waits for another's whole text between
two of its segments; the prompts' head (the voice, language and instruction, the same in every segment) is
prefilled once (`scheduler.Prefixes`).
A text without a seed draws one (`Sampling.resolve`) and segment i samples with seed + i.

A streamed text's first piece holds FIRST_FRAMES frames (one), so its first audio waits for one frame, not for
`chunk_frames`; the pieces after it grow to `chunk_frames` (`codec.stream.StreamDecoder`'s `first_frames`: 1, 2, 4,
4, ...), and every later segment streams in pieces of `chunk_frames` from its start. The audio is the same to float
rounding whatever the pieces (the codec's transformer runs over each piece's frames at once).

Work is bounded before it starts: `plan` gives every segment its frame cap, and a `budget` (frames) refuses a text
whose caps add up to more (`BudgetError`, an `InputError`), so no request holds a place for longer than its budget.

Where each segment's audio starts and ends is known as it is given out: `LongText.spans` (a `Span` per segment, in
seconds of the text's audio, as each segment completes; `on_span` hears each), `LongResult.spans()` for a whole text.
A text may also arrive in pieces (`LongText.extend`, `pipeline.textstream`): then the pause after a segment waits
until the next segment or the text's end is known, and the text is done only once it is closed (`close_text`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..audio.wav import FRAME_RATE, SAMPLE_RATE, SAMPLES_PER_FRAME
from ..errors import InputError
from ..text.segment import segments
from .prompt import FRAMES_PER_TOKEN, MARGIN_FRAMES, Prompt, Voice, frame_cap
from .sampling import TALKER_MIN_NEW_TOKENS, Sampling
from .scheduler import DEFAULT_MAX_BATCH, Event, Scheduler, Utterance

if TYPE_CHECKING:
    from .synthesizer import Synthesizer

MAX_SEGMENT_TOKENS = 60     # ~15-20 s of speech: a paragraph's worth, well inside the range the model speaks well
PAUSE_SECONDS = 0.3
FADE_SECONDS = 0.01
FIRST_FRAMES = 1            # frames in a streamed text's first piece (the pieces after it grow to chunk_frames)


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
    prompt: Prompt | None = None      # built before its text was complete (`pipeline.textstream`), else None
    open: bool = False                # its text is still coming: its audio is not complete before its text is


@dataclass
class Span:
    """Where one segment's audio lies in its text's audio: `start` and `end` in seconds (its fades included, the
    pauses around it not), and the segment's text."""
    text: str
    start: float
    end: float

    def as_dict(self) -> dict:
        return {"text": self.text, "start": round(self.start, 6), "end": round(self.end, 6)}


class BudgetError(InputError):
    """A text whose segments may take more frames than its budget allows."""


def check_budget(segments: list[TextSegment], budget: int | None) -> int:
    """The frames `segments` may take at most (the sum of their caps); a `BudgetError` that says so when that is
    more than `budget` (None: no budget)."""
    need = sum(s.cap for s in segments)
    if budget is not None and need > budget:
        raise BudgetError(f"this text may take up to {need} frames ({need / FRAME_RATE:.0f} s of audio, "
                          f"{len(segments)} segments) and a request may take at most {budget} "
                          f"({budget / FRAME_RATE:.0f} s): send a shorter text")
    return need


@dataclass
class LongResult:
    """`synthesize_long`'s answer: the joined wav, its segments, the pause between them and the text's seed
    (segment i sampled with seed + i; `Sampling(seed=...)` replays the text)."""
    wav: np.ndarray
    segments: list[TextSegment]
    pause_samples: int
    seed: int | None = None

    def spans(self) -> list[Span]:
        """Each segment's `Span` in `wav`."""
        return [Span(s.text, s.start / SAMPLE_RATE, (s.start + s.samples) / SAMPLE_RATE) for s in self.segments]


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


class Fader:
    """`fade` over a segment that arrives in pieces: `push` each piece, `finish` at its end; the pieces given back
    are, concatenated, `fade` of the whole. The first `samples` wait until the segment is known to hold at least
    2·samples (then `fade` uses the full ramp), and the samples that may be among its last `samples` are held back
    until the end: those past `at_least` (the samples the segment is known to reach) less `samples`. A stream's first
    piece is one frame, and the talker makes two at least (`TALKER_MIN_NEW_TOKENS`), so with `at_least` set the
    whole first frame goes out at once, not 10 ms short of it: 10 ms more in front of a listener while the second
    frame is made, where the margin is smallest."""

    def __init__(self, samples: int, at_least: int = 0):
        self.samples, self.buf, self.started, self.at_least = samples, np.zeros(0, np.float32), False, at_least
        self.given = 0  # samples given back so far
        self.ramp = fade(np.ones(2 * samples, np.float32), samples)[:samples] if samples else None

    def push(self, piece: np.ndarray) -> list[np.ndarray]:
        n = self.samples
        self.buf = np.concatenate([self.buf, np.asarray(piece, np.float32)])
        if not self.started and n and len(self.buf) >= 2 * n:
            self.buf[:n] *= self.ramp
            self.started = True
        if n and not self.started:
            return []
        free = min(len(self.buf), max(self.given + len(self.buf), self.at_least) - n - self.given)
        if free <= 0:
            return []
        out, self.buf = self.buf[:free], self.buf[free:]
        self.given += free
        return [out]

    def finish(self) -> list[np.ndarray]:
        buf, self.buf = self.buf, np.zeros(0, np.float32)
        if self.started:
            tail = min(self.samples, len(buf))  # all of the last `samples` unless the segment fell short of at_least
            buf[len(buf) - tail:] *= self.ramp[::-1][self.samples - tail:]
            return [buf]
        return [fade(buf, self.samples)] if len(buf) else []


class LongText:
    """One text's segments (`plan`, or `segments` planned before) through a `Scheduler` that may serve others too,
    as one request (its `Lane`): up to `ahead` segments in flight, their audio given back in order by `take`, faded,
    with a pause before every segment but the first. Segment i samples with `sampling.seed + i` (a seed drawn now if
    the sampling has none). The first segment is submitted (its input checked) on creation; `budget` refuses a text
    that may take more frames (`check_budget`). `held` stops it from submitting more segments (the one running goes
    on): a reader that fell behind. Streamed (`chunk_frames`), the text's first piece holds `first_frames` frames
    and the pieces after it grow to `chunk_frames` as fast as a stream made at real-time factor `rtf` allows
    (module docstring; `first_frames` None: all of `chunk_frames`)."""

    def __init__(self, synth: Synthesizer, scheduler: Scheduler, text: str, language: str, voice: Voice,
                 sampling: Sampling | None = None, max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
                 frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES,
                 chunk_frames: int | None = None, pause: float = PAUSE_SECONDS, fade_seconds: float = FADE_SECONDS,
                 ahead: int = 1, on_segment: Callable[[int, int, TextSegment, np.ndarray], None] | None = None,
                 on_frame: Callable[[int], None] | None = None, on_warning: Callable[[str], None] | None = None,
                 budget: int | None = None, planned: list[TextSegment] | None = None,
                 first_frames: int | None = FIRST_FRAMES, rtf: float | None = None):
        self.segments = plan(synth, text, max_tokens, max_frames, frames_per_token, margin) if planned is None \
            else planned
        check_budget(self.segments, budget)
        self.scheduler, self.language, self.voice, self.chunk_frames = scheduler, language, voice, chunk_frames
        self.first_frames, self.rtf = first_frames, rtf
        self.sampling = (synth.sampling if sampling is None else sampling).resolve()
        self.pause_samples = int(round(pause * SAMPLE_RATE))
        fade_samples = self.fade_samples = int(round(fade_seconds * SAMPLE_RATE))
        self.ahead, self.on_segment, self.on_frame, self.on_warning = max(1, ahead), on_segment, on_frame, on_warning
        n = len(self.segments)
        self.faders = [Fader(fade_samples) for _ in range(n)]
        self.ready: list[list[np.ndarray]] = [[] for _ in range(n)]   # faded audio not given back yet
        self.spoken: list[list[np.ndarray]] = [[] for _ in range(n)]  # all of it, for `on_segment`
        self.finished = [False] * n
        self.tickets: dict[int, tuple[int, object]] = {}              # ticket id -> (segment, ticket)
        self.submitted = self.current = 0
        self.held = False
        self.text_open = False      # more segments may come (`extend`) until `close_text`
        self.pause_due = False      # a segment ended: a pause goes out before the next one, if one comes
        self.at = 0                 # samples given out so far
        self.spans: list[Span] = []
        self.on_span: Callable[[Span], None] | None = None
        self.budget = budget
        self.lane = scheduler.lane()
        self.started = time.perf_counter()
        self._fill()

    @property
    def done(self) -> bool:
        """Every segment given out, and no more to come."""
        return self.current >= len(self.segments) and not self.text_open

    @property
    def idle(self) -> bool:
        """Every segment known so far given out: nothing to do until `extend` brings more (or `close_text`)."""
        return self.current >= len(self.segments)

    def extend(self, planned: list[TextSegment], more: bool = True) -> None:
        """Segments that follow the text's last (`plan`'s, of the text that came since); `more`: whether others may
        still follow (`close_text` says none will). The budget counts them all (but a segment whose text is still
        coming, whose cap is not known yet): a `BudgetError` refuses the ones that would go over it, before any of
        them is submitted."""
        check_budget([s for s in self.segments + planned if not s.open], self.budget)
        n = len(planned)
        self.segments += planned
        self.faders += [Fader(self.fade_samples) for _ in range(n)]
        self.ready += [[] for _ in range(n)]
        self.spoken += [[] for _ in range(n)]
        self.finished += [False] * n
        self.text_open = more
        self._fill()

    def close_text(self) -> None:
        """No segment follows those given (`extend`)."""
        self.text_open = False

    def _fill(self) -> None:
        n = len(self.segments)
        while self.submitted < n and self.submitted - self.current < self.ahead and not self.held:
            i, seg = self.submitted, self.segments[self.submitted]
            where = f"segment {i + 1}/{n}"
            warn = (lambda m, w=where: self.on_warning(f"{w}: {m}")) if self.on_warning else None
            # the talker makes TALKER_MIN_NEW_TOKENS frames at least (within the cap): their audio can go out whole
            self.faders[i].at_least = min(TALKER_MIN_NEW_TOKENS, seg.cap) * SAMPLES_PER_FRAME
            ticket = self.scheduler.submit(
                Utterance(seg.text, self.language, self.voice, self.sampling.replace(seed=self.sampling.seed + i),
                          max_frames=seg.cap), self.chunk_frames, on_warning=warn, on_frame=self.on_frame,
                lane=self.lane, first_frames=self.first_frames if i == 0 and self.chunk_frames else None,
                rtf=self.rtf, prompt=seg.prompt)
            self.tickets[ticket.id] = (i, ticket)
            self.submitted += 1

    def hold(self, held: bool) -> None:
        """Stop submitting segments (True) or go on (False)."""
        self.held = held
        self._fill()

    def take(self, events: list[Event]) -> list[np.ndarray]:
        """The audio that is now next in order, from one `Scheduler.step`'s events (other texts' are ignored)."""
        for event in events:
            if event.ticket.id not in self.tickets:
                continue
            i, _ = self.tickets[event.ticket.id]
            self.segments[i].samples += sum(len(p) for p in event.pieces)
            fader = self.faders[i]
            faded = [f for p in event.pieces for f in fader.push(p)]
            if event.ticket.result is not None:
                faded += fader.finish()
                self._record(i, event.ticket.result)
            self.ready[i] += faded
            if self.on_segment:
                self.spoken[i] += faded
        out = []
        while self.current < len(self.segments):
            i = self.current
            if self.pause_due:
                out.append(np.zeros(self.pause_samples, np.float32))
                self.at += self.pause_samples
                self.pause_due = False
                self.segments[i].start = self.at
            out += self.ready[i]
            self.at += sum(len(p) for p in self.ready[i])
            self.ready[i] = []
            seg = self.segments[i]
            if not self.finished[i] or seg.open:
                break
            span = Span(seg.text, seg.start / SAMPLE_RATE, (seg.start + seg.samples) / SAMPLE_RATE)
            self.spans.append(span)
            if self.on_span:
                self.on_span(span)
            if self.on_segment:
                self.on_segment(i, len(self.segments), seg, np.concatenate(self.spoken[i]) if
                                self.spoken[i] else np.zeros(0, np.float32))
                self.spoken[i] = []
            self.current += 1
            self.pause_due = True
        self._fill()
        return out

    def _record(self, i: int, result) -> None:
        seg = self.segments[i]
        self.finished[i] = True
        seg.frames, seg.stopped, seg.warnings, seg.codes = len(result.codes), result.stopped, result.warnings, \
            result.codes
        seg.seconds = time.perf_counter() - self.started

    def cancel(self) -> None:
        """Stop every segment still waiting or running."""
        for i, ticket in self.tickets.values():
            if not self.finished[i]:
                self.scheduler.cancel(ticket)


def synthesize_long(synth: Synthesizer, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
                    max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
                    frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES,
                    pause: float = PAUSE_SECONDS, fade_seconds: float = FADE_SECONDS,
                    max_batch: int = DEFAULT_MAX_BATCH,
                    on_segment: Callable[[int, int, TextSegment, np.ndarray], None] | None = None,
                    on_frame: Callable[[int], None] | None = None,
                    on_warning: Callable[[str], None] | None = None, budget: int | None = None) -> LongResult:
    """Speak `text` segment by segment with one `voice` (see the module docstring): `plan`'s segments, each a
    whole utterance with its own frame cap, `max_batch` of them at a time, joined with pauses and fades.

    Segment i samples with `sampling` (the checkpoint's defaults unless given) and seed `sampling.seed + i`.
    `on_segment(i, n, segment, wav)` runs as each segment is done, in order, with its faded wav (progress bars;
    streaming); `on_frame(n)` after frame n of any segment; `on_warning` gets the synthesizer's warnings prefixed
    with "segment i/n". `budget`: the most frames the text may take (`check_budget`)."""
    scheduler = Scheduler(synth, max_batch)
    long = LongText(synth, scheduler, text, language, voice, sampling, max_tokens, max_frames, frames_per_token,
                    margin, None, pause, fade_seconds, ahead=max_batch, on_segment=on_segment, on_frame=on_frame,
                    on_warning=on_warning, budget=budget)
    pieces = []
    try:
        while not long.done:
            pieces += long.take(scheduler.step())
    finally:
        scheduler.close()
    wav = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    at = 0
    for seg in long.segments:
        seg.start = at
        at += seg.samples + long.pause_samples
    return LongResult(wav, long.segments, long.pause_samples, long.sampling.seed)


def stream_long(synth: Synthesizer, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
                max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
                frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES, chunk_frames: int = 4,
                pause: float = PAUSE_SECONDS, fade_seconds: float = FADE_SECONDS, max_batch: int = 1,
                on_frame: Callable[[int], None] | None = None, budget: int | None = None,
                first_frames: int | None = FIRST_FRAMES) -> Iterator[np.ndarray]:
    """`synthesize_long`, streamed: float32 pieces as they are generated, each segment decoded in pieces of
    `chunk_frames` frames (the text's first piece `first_frames`, the pieces after it growing to `chunk_frames`),
    the pauses as pieces of silence. Concatenated they equal `synthesize_long`'s wav as closely as each segment's
    stream equals its whole decode. `max_batch` segments run at once (default one: the first audio comes soonest).
    The first segment's prompt is built (and bad input refused) before the first piece; closing the generator stops
    the loop at once, and so does an exception raised by `on_frame(n)`."""
    scheduler = Scheduler(synth, max_batch)
    try:
        long = LongText(synth, scheduler, text, language, voice, sampling, max_tokens, max_frames, frames_per_token,
                        margin, chunk_frames, pause, fade_seconds, ahead=max_batch, on_frame=on_frame, budget=budget,
                        first_frames=first_frames)
        while not long.done:
            yield from long.take(scheduler.step())
    finally:
        scheduler.close()
