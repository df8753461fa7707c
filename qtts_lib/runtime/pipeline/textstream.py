"""Text streamed in, audio streamed out: a long text whose text arrives in pieces (a language model's answer, token
by token), spoken segment by segment as soon as each segment's text is decided. Introduced in 19.

    stream = TextStream(synth, "english", voice, Sampling(seed=7))
    for delta in deltas:                         # as the text comes
        stream.feed(delta)
        while not stream.idle:                   # what the text so far allows
            play(stream.step())
    stream.finish()                              # no more text
    while not stream.done:
        play(stream.step())
    stream.spans                                 # [Span(text, start, end)], seconds in the audio

The text goes through `text.segment_stream.SegmentStream` (the whole text's segments, each given out once the text
so far decides it) and each segment, as it comes, joins the text's `longform.LongText` (`extend`): the segments,
their seeds (the text's seed + i), frame caps, fades, pauses and first piece are those `longform.stream_long` gives
the whole text, so with the same seed and pieces the audio is the same, sample for sample, however the text was cut
into deltas and whenever they came (one segment at a time, `max_batch` 1, as `stream_long` runs by default; a batch
of several is the same only to float rounding, chapter 17).

ICL, built-in-speaker and VoiceDesign prompts hold a segment's whole text in the prefill (`prompt.PromptBuilder.build`),
so there a segment starts once its text is complete. An x-vector prompt reads its text one token a frame beside the
codes (`Prompt.trailing`): the talker needs the text's token t only when it makes frame t. So with an x-vector voice
(`early`) a segment starts as soon as its first piece is decided (`SegmentStream.open_text`, a sentence that the
segment will hold whatever follows) and its first token is settled (`text.bpe_stream.TokenStream`: the ids later text
cannot change); its prompt is open (`PromptBuilder.open_prompt`), and every token that settles joins its trailing text
(`extend_prompt`); when the segment is complete, tts_eos follows and its frame cap is set (`frame_cap` of its tokens,
which no frame before the text's end can reach: the cap exceeds the tokens). Until then its cap is `max_frames`.
A frame whose text row has not come waits for it (`loop.Loop.resume`): the stream is `idle`, it makes no frame, and it
never feeds the talker anything the whole text would not have; in a batch it leaves with its cache while the others go
on, and joins again when its token comes (`loop.Batch.park`; equal to running alone to float rounding, chapter 17).
`early` is the default for an x-vector voice. The text reaches an open prompt a
sentence at a time (a sentence is in the segment once it is decided and fits beside the ones before), so the talker
may wait at the end of each sentence for the next to be decided. The pause after a segment goes out with the next
segment, once the text says one comes.

A server's engine runs one `Scheduler` for all its requests: pass it (`scheduler=`) and hand every step's events to
`take` instead of calling `step`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..audio.wav import FRAME_RATE
from ..errors import InputError
from ..text.bpe_stream import TokenStream
from ..text.segment_stream import SegmentStream
from .longform import (
    FADE_SECONDS,
    FIRST_FRAMES,
    MAX_SEGMENT_TOKENS,
    PAUSE_SECONDS,
    LongText,
    Span,
    TextSegment,
    check_budget,
)
from .prompt import FRAMES_PER_TOKEN, MARGIN_FRAMES, Voice, frame_cap
from .sampling import Sampling
from .scheduler import Event, Scheduler

if TYPE_CHECKING:
    from .synthesizer import Synthesizer


class TextStream:
    """One text fed in deltas (`feed`, then `finish`), its audio out in float32 pieces (`step`, or `take` over a
    shared scheduler's events); `spans` grows by a `Span` as each segment's audio completes (`on_span` hears each).
    The arguments are `longform.stream_long`'s; `ahead` (segments in flight) defaults to `max_batch` on the stream's
    own scheduler and to one on a shared one (as a server's `LongText`), `rtf` is `LongText`'s; `early`: start an
    x-vector segment before its text is complete (module docstring; None: where it can). `seed` is the text's seed
    (drawn on creation when the sampling has none)."""

    def __init__(self, synth: Synthesizer, language: str, voice: Voice, sampling: Sampling | None = None,
                 max_tokens: int = MAX_SEGMENT_TOKENS, max_frames: int | None = None,
                 frames_per_token: float = FRAMES_PER_TOKEN, margin: int = MARGIN_FRAMES, chunk_frames: int = 4,
                 pause: float = PAUSE_SECONDS, fade_seconds: float = FADE_SECONDS, max_batch: int = 1,
                 scheduler: Scheduler | None = None, budget: int | None = None,
                 first_frames: int | None = FIRST_FRAMES, on_frame: Callable[[int], None] | None = None,
                 on_warning: Callable[[str], None] | None = None, on_span: Callable[[Span], None] | None = None,
                 early: bool | None = None, ahead: int | None = None, rtf: float | None = None):
        self.prompts, self.language, self.voice = synth.prompts, language, voice
        self.count = synth.prompts.text_tokens
        self.segmenter = SegmentStream(max_tokens, self.count)
        self.caps = (max_frames, frames_per_token, margin)
        self.own = scheduler is None
        self.scheduler = Scheduler(synth, max_batch) if self.own else scheduler
        try:
            self.long = LongText(synth, self.scheduler, "", language, voice, sampling, max_tokens, max_frames,
                                 frames_per_token, margin, chunk_frames, pause, fade_seconds,
                                 ahead=(self.scheduler.max_batch if self.own else 1) if ahead is None else ahead,
                                 on_frame=on_frame, on_warning=on_warning, budget=budget, planned=[],
                                 first_frames=first_frames, rtf=rtf)
        except BaseException:
            self.close()
            raise
        self.long.on_span = on_span
        self.long.text_open = True
        self.early = voice.mode == "xvector" if early is None else early
        if self.early and voice.mode != "xvector":
            raise InputError("a segment starts before its text is complete only with an x-vector voice (the other "
                             "prompts hold a segment's whole text)")
        self.opening: tuple[TextSegment, TokenStream] | None = None   # the segment started before its text is in

    @property
    def seed(self) -> int:
        return self.long.sampling.seed

    @property
    def segments(self) -> list[TextSegment]:
        """The segments decided so far (with what each produced, once it has)."""
        return self.long.segments

    @property
    def spans(self) -> list[Span]:
        """A `Span` per segment whose audio is all given out, in order."""
        return self.long.spans

    @property
    def idle(self) -> bool:
        """Nothing to do until more text comes (or `finish`): every decided segment's audio is given out, or the one
        started early waits for its next token."""
        if self.long.idle:
            return True
        if self.opening is None or self.long.segments[self.long.current] is not self.opening[0]:
            return False
        ticket = next((t for i, t in self.long.tickets.values() if self.long.segments[i] is self.opening[0]), None)
        seq = ticket.seq if ticket is not None else None
        return ticket is not None and (ticket.result is not None or (
            seq is not None and seq.waiting is not None and seq.prompt.text_at(len(seq.codes) - 1) is None
            and not ticket.decoder.held))   # pieces of its first piece still to hand out: a step gives one

    @property
    def done(self) -> bool:
        """The text is finished and all its audio given out."""
        return self.long.done

    def feed(self, delta: str) -> list[TextSegment]:
        """More text; the segments it decides (already queued to be spoken). Bad input (a segment over the
        budget, a language the checkpoint lacks) raises `InputError` here."""
        if not isinstance(delta, str):
            raise InputError(f"a text delta is text, not {type(delta).__name__}")
        return self._add(self.segmenter.feed(delta), more=True)

    def finish(self) -> list[TextSegment]:
        """No more text: the last segments (the text's end decides them)."""
        added = self._add(self.segmenter.finish(), more=False)
        if not self.long.segments:
            raise InputError("the text is empty")
        return added

    def _add(self, texts: list[str], more: bool) -> list[TextSegment]:
        if self.opening is not None and texts:
            self._complete(texts[0])
            texts = texts[1:]
        planned = [TextSegment(s, n, frame_cap(n, *self.caps)) for s in texts for n in [self.count(s)]]
        self.long.extend(planned, more)
        if self.early and more:
            self._open(self.segmenter.open_text, " " if self.segmenter.open_spaced else "")
        return planned

    def _open(self, text: str, then: str) -> None:
        """Start the next segment on what of its text is decided, or give its prompt the tokens that settled since."""
        if not text:
            return
        if self.opening is None:
            tokens = TokenStream(self.prompts.tokenizer)
            ids = tokens.feed(text, then)
            if not ids:
                return
            prompt = self.prompts.open_prompt(ids, self.language, self.voice)
            seg = TextSegment(text, len(ids), self.caps[0] or 2**31 - 1, prompt=prompt, open=True)
            self.opening = (seg, tokens)
            self.long.extend([seg], True)
            return
        seg, tokens = self.opening
        if not text.startswith(seg.text):
            raise RuntimeError(f"the segmenter's open text {text!r} does not start with {seg.text!r}")
        ids = tokens.feed(text[len(seg.text):], then)
        seg.text, seg.tokens = text, seg.tokens + len(ids)
        self.prompts.extend_prompt(seg.prompt, ids, last=False)

    def _complete(self, text: str) -> None:
        """The segment started early is complete: its last tokens, tts_eos, its own frame cap."""
        seg, tokens = self.opening
        self.opening = None
        if not text.startswith(seg.text):
            raise RuntimeError(f"the segment {text!r} does not start with its open text {seg.text!r}")
        ids = tokens.feed(text[len(seg.text):]) + tokens.finish()
        self.prompts.extend_prompt(seg.prompt, ids, last=True)
        seg.text, seg.tokens = text, seg.tokens + len(ids)
        seg.cap = frame_cap(seg.tokens, *self.caps)
        for i, ticket in self.long.tickets.values():
            if self.long.segments[i] is seg:
                ticket.job.max_frames = seg.cap
                if ticket.seq is not None:
                    ticket.seq.max_frames = seg.cap
        seg.open = False
        if len(seg.prompt.trailing) > seg.cap and self.long.on_warning:  # `Jobs.build`'s warning, now it can be told
            i = self.long.segments.index(seg)
            self.long.on_warning(f"segment {i + 1}/{len(self.long.segments)}: the text has {seg.tokens} tokens but "
                                 f"at most {seg.cap} frames ({seg.cap / FRAME_RATE:.0f} s) will be generated: the end "
                                 "of the text will not be spoken")
        check_budget(self.long.segments, self.long.budget)

    def step(self) -> list[np.ndarray]:
        """One step of this stream's own scheduler, and the audio it gives (maybe none); nothing while `idle`."""
        if not self.own:
            raise RuntimeError("this stream runs on a shared scheduler: hand its steps' events to `take`")
        return [] if self.idle else self.take(self.scheduler.step())

    def take(self, events: list[Event]) -> list[np.ndarray]:
        """The audio that is next in order, from one `Scheduler.step`'s events (others' are ignored)."""
        return self.long.take(events)

    def hold(self, held: bool) -> None:
        """Submit no more segments for now (a reader far behind), or go on (`LongText.hold`)."""
        self.long.hold(held)

    def close(self) -> None:
        """Stop every segment waiting or running (and this stream's own scheduler)."""
        if hasattr(self, "long"):
            self.long.cancel()
        if self.own:
            self.scheduler.close()


def stream_text(synth: Synthesizer, deltas: Iterable[str], language: str, voice: Voice,
                sampling: Sampling | None = None, **options) -> Iterator[np.ndarray]:
    """`TextStream` over an iterable of text deltas: a delta is taken when the stream has nothing else to do (the
    text as late as it can come), and the pieces are yielded as they are made. `options` are `TextStream`'s.
    Concatenated, the pieces are `longform.stream_long`'s for the joined text with the same seed and options."""
    stream = TextStream(synth, language, voice, sampling, **options)
    deltas = iter(deltas)
    try:
        while not stream.done:
            if stream.idle:
                delta = next(deltas, None)
                stream.finish() if delta is None else stream.feed(delta)
                continue
            yield from stream.step()
    finally:
        stream.close()
