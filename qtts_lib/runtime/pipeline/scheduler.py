"""Many utterances at once: a `Scheduler` that utterances are submitted to at any time and that makes one frame of
every running one per `step` (continuous batching over `pipeline.loop.Batch`). Introduced in 17.

    scheduler = Scheduler(synth, max_batch=4)                 # over synth.loop, synth.decoders, synth.jobs
    ticket = scheduler.submit(Utterance("Hello.", "english", voice), chunk_frames=4)
    while scheduler:
        for event in scheduler.step():                        # one Event per running utterance
            play(event.ticket, event.pieces)                  # its audio, if a piece is ready; `result` at its end

The scheduler stands on three parts and reaches no further: the generation loop (`loop.Loop`), the decoders that
turn frames into audio (`codec.stream.Decoders`) and the job builder (`Jobs`: an `Utterance` checked and turned into
a prompt, a sampler and a frame cap). A `Synthesizer` has all three, public, so `Scheduler(synth)` works; `synthesize`,
`stream` and `synthesize_many` are schedulers of their own, and `qtts serve` runs one for every request.

What a step does, and why each part is bounded (a step is what every running stream waits for):

1. **Places.** At most `max_batch` utterances hold a place: running in the batch, or prefilling to join it. A place
   belongs to a *lane*: a request whose utterances come one after another (`lane()`; a long text's segments,
   `pipeline.longform.LongText`) keeps its place from its first utterance to its last, so a continuing segment is
   admitted before any utterance of a request that has not started. Among new requests, first come, first served.
2. **Prefill in pieces.** An utterance admitted while others run is prefilled `prefill_piece` prompt positions per
   step, between two frames, and joins the batch when its prompt is all in (`loop.Loop.prefill`, `Batch.join`). The
   running streams wait for a piece, never for a whole prompt. Admitted to an empty batch it is prefilled whole:
   nobody waits. The prompt's head (`Prompt.head`: the voice, the language and the instruction, not the text) goes
   in as a call of its own and its cache is kept (`Prefixes`): an utterance with the same head, later, starts from a
   copy and prefills only its text. Meanwhile its decoder decodes WARM_FRAMES of what it decodes without emitting
   (an ICL clip's codes, `codec.stream.StreamDecoder.warm`) a step.
3. **One frame** of every running utterance (`Batch.step`), pushed into each one's decoder; one that ends leaves. An
   utterance whose text is still coming (an open prompt, `pipeline.textstream`) and whose next text token has not
   come (`loop.Loop.resume`) leaves the batch with its cache (`Batch.park`; it keeps its place) while the others go
   on, and joins again when the token comes; alone, it waits in place (no frame is made).

A step in which a stream's decoder holds pieces of its first piece (`codec.stream.StreamDecoder.held`) does none of
that: it hands out the next of those pieces, for each stream that holds some (a fraction of a frame's decode each).

Prefilling in pieces and joining a batch give each sequence's hidden states to float rounding of running it alone
(chapter 17 measures how close): its greedy codes on the tiny checkpoints, and its sampled ones unless a draw sits
within that rounding of a boundary (on tiny-base, one four-segment text in a hundred has a code that goes its own
way). Cancelling a ticket (`cancel`) frees its place
at once, whatever stage it is in. One thread only: the one that runs ncnn.
"""
from __future__ import annotations

import hashlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..audio.wav import FRAME_RATE
from ..binding.cached import KvCache
from ..errors import InputError
from .bounded import BoundedCache
from .config import ModelConfig
from .loop import Batch, Loop, Sequence
from .prompt import Prompt, PromptBuilder, Voice, frame_cap
from .sampling import Sampler, Sampling

DEFAULT_MAX_BATCH = 4   # chapter 17: four rows cost about what one costs in a memory-bound step
PREFIX_BUDGET_MB = 256  # the memory a synthesizer's kept prompt heads may hold, in MB (`Prefixes`)
PREFILL_PIECE = 32      # prompt positions a joining utterance prefills per step while others run
WARM_FRAMES = 4         # frames of a voice clip's codes its decoder decodes per step meanwhile (`StreamDecoder.warm`)


@dataclass
class Utterance:
    """One thing to say (`Synthesizer.synthesize_many`, `Scheduler.submit`): `synthesize`'s arguments."""
    text: str
    language: str
    voice: Voice
    sampling: Sampling | None = None
    max_frames: int | None = None
    non_streaming: bool | None = None


@dataclass
class Result:
    """What one utterance produced.

    codes: (T, 16) int64, the frames; tokens: every codebook-0 token sampled (EOS included if it came);
    stopped: "eos" or "cap" (the frame cap was reached); wav: float32 at 24 kHz (None for a stream, whose audio
    went out in pieces); seconds: wall time of "prefill", "talker", "predictor" and "codec"; warnings: problems
    found on the way (also told to `on_warning` as soon as they are known); seed: the seed it sampled with (drawn
    afresh when its sampling had none: `Sampling(seed=result.seed)` replays it bit for bit)."""
    codes: np.ndarray
    tokens: list[int]
    stopped: str
    wav: np.ndarray | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def eos_step(self) -> int:
        """Index of EOS in `tokens`, -1 if it never came."""
        return len(self.tokens) - 1 if self.stopped == "eos" else -1

    @classmethod
    def of(cls, seq: Sequence, groups: int) -> Result:
        codes = np.stack(seq.codes).astype(np.int64) if seq.codes else np.zeros((0, groups), np.int64)
        return cls(codes, list(seq.tokens), seq.stopped or "cap", seconds=dict(seq.seconds))


@dataclass
class Job:
    """An utterance checked and built, before its first frame: its prompt, sampling (and the sampler that draws
    with it), frame cap and warnings."""
    prompt: Prompt
    sampling: Sampling
    sampler: Sampler
    max_frames: int
    warnings: list[str]


class Prefixes:
    """The talker caches of prompt heads (`Prompt.head`), by the digest of the head's rows: a scheduler prefills a
    head as a call of its own and keeps its cache here, and an utterance whose prompt starts with the same rows (the
    same voice, language and instruction) starts from a copy of it. A head always goes in as its own call, kept or
    not, so an utterance gives the same numbers the first time and every time after. A synthesizer holds one for all
    its schedulers (`synthesize` after `synthesize`, the server's requests).

    The kept caches hold at most `budget_mb` MB (2**20 bytes) together, counted as the memory of their Mats
    (`cache_bytes`, the room to spare included): the least recently used (put, or found by `get`) go first, and a
    head whose cache alone is larger than the budget is not kept (its utterances prefill it every time, with the
    same numbers). A kept cache holds the head's positions of every talker layer, 224 KB a position at full size
    (28 layers, K and V of 8 heads of 128 floats) in whole tiles of positions: about 4 MB for a cloned voice's nine,
    about 224 MB for a head of a thousand (a long instruction)."""

    def __init__(self, budget_mb: float = PREFIX_BUDGET_MB):
        if budget_mb < 0:
            raise ValueError(f"a budget of {budget_mb} MB")
        self.budget = int(budget_mb * 2**20)  # bytes
        self._kept = BoundedCache(self.budget)  # digest of the head's rows -> its cache

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def nbytes(self) -> int:
        """What the kept caches hold now."""
        return self._kept.nbytes

    def get(self, rows: np.ndarray) -> KvCache | None:
        """The kept cache of `rows` (not a copy: `Loop.start(prefix=)` copies it), or None. Found, it becomes the
        most recently used."""
        return self._kept.get(_digest(rows))

    def put(self, rows: np.ndarray, cache: KvCache) -> None:
        """Keep a copy of `cache`, which holds `rows` and nothing more, as the most recently used; the least
        recently used go until all fit the budget. A cache larger than the whole budget is not copied nor kept (a
        copy holds at most its memory: `KvCache.copy` keeps the same room, or none)."""
        if cache.past != len(rows):
            raise ValueError(f"a cache of {cache.past} positions for a head of {len(rows)}")
        key = _digest(rows)
        if not self._kept.fits(cache_bytes(cache)):
            self._kept.discard(key)
            return
        copy = cache.copy()
        self._kept.put(key, copy, cache_bytes(copy))


def cache_bytes(cache: KvCache) -> int:
    """The memory a cache's Mats hold: every blob's channels at their channel step (positions held and room to
    spare)."""
    return sum(m.cstep * m.c * m.elemsize for m in cache.blobs.values())


class Jobs:
    """The job builder: `build` checks an utterance's arguments and makes its `Job` (the prompt, through the
    checkpoint's `PromptBuilder`; the sampling, the checkpoint's `default` unless given; the frame cap, the text's
    own `prompt.frame_cap` unless given)."""

    def __init__(self, config: ModelConfig, prompts: PromptBuilder, default: Sampling):
        self.config, self.prompts, self.default = config, prompts, default

    @property
    def groups(self) -> int:
        return self.config.groups

    def build(self, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
              max_frames: int | None = None, non_streaming: bool | None = None,
              on_warning: Callable[[str], None] | None = None) -> Job:
        """Everything checked and built before the first frame; bad input raises `InputError` here."""
        if not isinstance(voice, Voice):
            raise InputError(f"voice must be a Voice (from Synthesizer.voice), not {type(voice).__name__}")
        if sampling is not None and not isinstance(sampling, Sampling):
            raise InputError(f"sampling must be a Sampling, not {type(sampling).__name__}")
        prompt = self.prompts.build(text, language, voice, non_streaming)
        cap = frame_cap(prompt.text_tokens) if max_frames is None else max_frames
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise InputError(f"max_frames must be a whole number, at least 1, not {max_frames!r}")
        warnings = []
        follows = self.config.follows_instructions
        if voice.instruct and not follows:
            warnings.append("this checkpoint does not follow instructions (0.6B CustomVoice): the instruction is "
                            "dropped, as the reference drops it; the 1.7B CustomVoice and VoiceDesign checkpoints "
                            "follow them")
        if len(prompt.trailing) > cap:
            warnings.append(f"the text has {prompt.text_tokens} tokens but at most {cap} frames "
                            f"({cap / FRAME_RATE:.0f} s) will be generated: the end of the text will not be spoken")
        for w in warnings:
            if on_warning:
                on_warning(w)
        sampling = (self.default if sampling is None else sampling).resolve()  # no seed: this utterance draws one
        return Job(prompt, sampling, Sampler(sampling, self.config.talker), cap, warnings)

    def of_prompt(self, prompt: Prompt, sampling: Sampling | None, max_frames: int) -> Job:
        """The job of an open prompt (`PromptBuilder.open_prompt`): its frame cap `max_frames` until its text is
        complete (then the caller sets the text's own), its sampling as `build`'s."""
        sampling = (self.default if sampling is None else sampling).resolve()
        return Job(prompt, sampling, Sampler(sampling, self.config.talker), max_frames, [])

    def of(self, utterance: Utterance, on_warning: Callable[[str], None] | None = None) -> Job:
        if not isinstance(utterance, Utterance):
            raise InputError(f"expected an Utterance, not {type(utterance).__name__}")
        u = utterance
        return self.build(u.text, u.language, u.voice, u.sampling, u.max_frames, u.non_streaming, on_warning)


class Parts(Protocol):
    """What a scheduler runs on (a `Synthesizer` has them): the loop, the decoders, the job builder, the kept heads."""
    loop: Loop
    decoders: object
    jobs: Jobs
    prefixes: Prefixes


class Lane:
    """A request's place in a scheduler (`Scheduler.lane`): its utterances are admitted before those of requests
    that have not started (a ticket submitted without a lane has one of its own)."""

    _ids = itertools.count(1)

    def __init__(self):
        self.id = next(self._ids)
        self.started = False


class Ticket:
    """A submitted utterance: its job, decoder, lane, its sequence while it runs, its `Result` once done.
    `admitted`: its place in the order utterances were admitted (None while waiting); `cancelled` once cancelled."""

    _ids = itertools.count(1)

    def __init__(self, job: Job, decoder, on_frame: Callable[[int], None] | None = None, lane: Lane | None = None):
        self.id = next(self._ids)
        self.job, self.decoder, self.on_frame = job, decoder, on_frame
        self.lane = lane or Lane()
        self.seq: Sequence | None = None
        self.result: Result | None = None
        self.admitted: int | None = None
        self.cancelled = False
        self.codec_s = 0.0


@dataclass
class Event:
    """What one `Scheduler.step` produced for one ticket: audio `pieces` (maybe none); on its last frame the
    ticket has its `result`. `drained`: a held piece handed out, no frame made (a step of these decodes nothing)."""
    ticket: Ticket
    pieces: list[np.ndarray]
    drained: bool = False


class Scheduler:
    """Continuous batching over a loop, its decoders and a job builder (module docstring). One thread only."""

    def __init__(self, parts: Parts, max_batch: int = DEFAULT_MAX_BATCH, prefill_piece: int = PREFILL_PIECE):
        self.loop, self.decoders, self.jobs, self.prefixes = parts.loop, parts.decoders, parts.jobs, parts.prefixes
        self.batch = Batch(self.loop, max_batch)
        if max_batch > 1:
            self.loop.prepare_batches()  # the graphs for several sequences, loaded before the first frame
        self.prefill_piece = max(1, prefill_piece)
        self.waiting: deque[Ticket] = deque()
        self.prefilling: list[Ticket] = []     # admitted, their prompts going in a piece a step
        self.running: dict[int, Ticket] = {}   # id(sequence) -> its ticket
        self.parked: list[Ticket] = []         # running, out of the batch until their text comes (`Batch.park`)
        self._admitted = itertools.count()

    @property
    def max_batch(self) -> int:
        return self.batch.max_batch

    @property
    def places(self) -> int:
        """Places free: `max_batch` less the utterances running or prefilling."""
        return self.max_batch - len(self.batch) - len(self.prefilling) - len(self.parked)

    def __bool__(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    @property
    def blocked(self) -> bool:
        """Whether a step would do nothing until text comes: every utterance it holds runs and waits for its next
        text token (an engine may sleep until a text delta arrives instead of stepping)."""
        if (self.waiting and self.places > 0) or self.prefilling or not self.running:
            return False
        return all(not t.decoder.held and t.seq.waiting is not None and
                   t.seq.prompt.text_at(len(t.seq.codes) - 1) is None for t in self.running.values())

    def lane(self) -> Lane:
        """A new request's lane (see `Lane`)."""
        return Lane()

    def submit(self, utterance: Utterance, chunk_frames: int | None = None,
               on_warning: Callable[[str], None] | None = None, on_frame: Callable[[int], None] | None = None,
               lane: Lane | None = None, first_frames: int | None = None, rtf: float | None = None,
               prompt: Prompt | None = None) -> Ticket:
        """Queue an utterance (checked now: bad input raises here). `chunk_frames`: stream its audio in pieces of
        that many frames; None: one whole decode when it ends. `first_frames`: a stream's first piece holds that
        many frames and the next ones grow to `chunk_frames` as fast as a stream made at real-time factor `rtf`
        allows (`codec.stream.StreamDecoder`; None: its default); None: `chunk_frames`. `lane`: the request it
        belongs to. `prompt`: a prompt built for the utterance, its text maybe still coming (`Jobs.of_prompt`)."""
        for name, frames in (("chunk_frames", chunk_frames), ("first_frames", first_frames)):
            if frames is not None and (not isinstance(frames, int) or isinstance(frames, bool) or frames < 1):
                raise InputError(f"{name} must be a whole number, at least 1, not {frames!r}")
        job = self.jobs.of(utterance, on_warning) if prompt is None else \
            self.jobs.of_prompt(prompt, utterance.sampling, utterance.max_frames)
        # passed only when given: `experimental.codec_process`'s decoders take the first two arguments alone
        first = {} if first_frames is None or chunk_frames is None else {"first_frames": first_frames}
        if first and rtf is not None:
            first["rtf"] = rtf
        return self.enqueue(job, self.decoders.decoder(chunk_frames, utterance.voice.codes, **first), on_frame, lane)

    def enqueue(self, job: Job, decoder, on_frame=None, lane: Lane | None = None) -> Ticket:
        """Queue a built job with its decoder."""
        ticket = Ticket(job, decoder, on_frame, lane)
        self.waiting.append(ticket)
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Stop a ticket where it is (waiting, prefilling or running): its place is free at once; it gets no
        result."""
        if ticket.cancelled or ticket.result is not None:
            return
        ticket.cancelled = True
        if ticket in self.waiting:
            self.waiting.remove(ticket)
        elif ticket in self.prefilling:
            self.prefilling.remove(ticket)
            ticket.seq = None  # its cache goes with it
        elif ticket in self.parked:
            self.parked.remove(ticket)
            del self.running[id(ticket.seq)]
            ticket.seq.cache = None
        elif ticket.seq is not None and id(ticket.seq) in self.running:
            self.batch.remove(ticket.seq)
            del self.running[id(ticket.seq)]
        ticket.decoder.close()

    # ------------------------------------------------------------ one step
    def step(self) -> list[Event]:
        """Admit waiting tickets while places are free, prefill (a piece, or whole into an empty batch), then one
        frame of every running ticket. A step in which some stream's decoder holds pieces of its first piece
        (`codec.stream.StreamDecoder.drain`) hands out one of those instead, for each such stream, and nothing else:
        its audio is playing, the next piece is due first."""
        held = [t for t in self.running.values() if t.decoder.held]
        if held:
            return [self._drain(t) for t in held]
        self._admit()
        self._prefill()
        events = []
        if not self._text_rows():
            return events
        for seq, frame in self.batch.step():
            ticket = self.running[id(seq)]
            t0 = time.perf_counter()
            pieces = ticket.decoder.push(frame.codes) if frame is not None else []
            ticket.codec_s += time.perf_counter() - t0
            event = Event(ticket, pieces)
            if frame is not None and ticket.on_frame:
                ticket.on_frame(len(seq.codes))
            if seq.stopped:
                self._finish(ticket, event)
            events.append(event)
        return events

    def _text_rows(self) -> bool:
        """Whether the batch can make a frame: sequences whose text has not come (`loop.Loop.resume`) leave it
        while others can go on (`Batch.park`), and come back once it has; alone, one waits in place."""
        for ticket in list(self.parked):
            if self.loop.resume(ticket.seq):
                self.parked.remove(ticket)
                self.batch.unpark(ticket.seq)
        stalled = [s for s in self.batch.sequences if not self.loop.resume(s)]
        if not stalled:
            return True
        if len(stalled) == len(self.batch):
            return False  # none can go on: they wait in place (a stream alone keeps its numbers exactly)
        for seq in stalled:
            self.batch.park(seq)
            self.parked.append(self.running[id(seq)])
        return True

    def _drain(self, ticket: Ticket) -> Event:
        t0 = time.perf_counter()
        pieces = ticket.decoder.drain()
        ticket.codec_s += time.perf_counter() - t0
        return Event(ticket, pieces, drained=True)

    def _admit(self) -> None:
        while self.waiting and self.places > 0:
            ticket = next((t for t in self.waiting if t.lane.started), self.waiting[0])  # a started request first
            self.waiting.remove(ticket)
            ticket.admitted = next(self._admitted)
            ticket.lane.started = True
            job = ticket.job
            head = self._head(job)
            prefix = self.prefixes.get(job.prompt.embeds[:head]) if head else None
            ticket.seq = self.loop.start(job.prompt, job.sampler, job.max_frames, positions=0, prefix=prefix)
            self.prefilling.append(ticket)

    def _prefill(self) -> None:
        """A piece of the oldest prefilling ticket's prompt, or every prompt whole when nothing runs yet."""
        while self.prefilling:
            whole = not self.batch.sequences
            ticket = self.prefilling[0]
            seq, job = ticket.seq, ticket.job
            head = self._head(job)
            positions = None if whole else self.prefill_piece
            if seq.prefilled < head:  # the head is a call (or pieces) of its own: its cache is kept
                positions = min(head - seq.prefilled, positions or head)
            done = self.loop.prefill(seq, positions)
            ticket.decoder.warm(None if whole else WARM_FRAMES)  # a stream's decoder: the clip's codes, a few at a time
            if head and seq.prefilled == head and not done:
                self.prefixes.put(job.prompt.embeds[:head], seq.cache)
                if whole:
                    continue
            if done:
                self.prefilling.pop(0)
                self.batch.join(seq)
                self.running[id(seq)] = ticket
            if not whole:
                return

    def _head(self, job: Job) -> int:
        """How many of the job's first positions go in on their own and are kept (`Prefixes`): its prompt's head
        where the loop can copy caches (not the GPU form), else none."""
        return job.prompt.head if self.loop.copies_caches and job.prompt.head < len(job.prompt.embeds) else 0

    def _finish(self, ticket: Ticket, event: Event) -> None:
        seq = ticket.seq
        t0 = time.perf_counter()
        last = ticket.decoder.finish()
        ticket.decoder.close()
        ticket.codec_s += time.perf_counter() - t0
        if len(last):
            event.pieces.append(last)
        del self.running[id(seq)]
        result = Result.of(seq, self.jobs.groups)
        result.warnings = ticket.job.warnings
        result.seconds["codec"] = ticket.codec_s
        result.seed = ticket.job.sampler.seed
        ticket.result = result

    def close(self) -> None:
        """Cancel everything still waiting, prefilling or running."""
        for ticket in list(self.waiting) + list(self.prefilling) + list(self.running.values()):
            self.cancel(ticket)


def _digest(rows: np.ndarray) -> bytes:
    return hashlib.sha1(np.ascontiguousarray(rows).tobytes()).digest()
