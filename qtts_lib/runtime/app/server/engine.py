"""`qtts serve`'s engine: the one thread that runs ncnn, and every request it speaks. Introduced in 18.

Its whole surface is two calls, both on the event loop:

    job = await engine.speak(speech, voice)     # planned, checked and given a place, or an error at once
    async for piece in job: ...                  # float32 audio pieces at 24 kHz, as they are made
    job.close()                                  # however the request ended: its place is free
    engine.status()                              # speaking, waiting, refused, the batch, healthy or why not

    job = await engine.speak_text(speech, voice)  # its text to come: job.feed(delta) ... job.finish()
    async for item in job: ...                   # audio pieces, and a `longform.Span` as each segment completes

One thread runs every piece of ncnn work: OpenMP keeps a worker pool per thread that ran ncnn, so ncnn called from
whichever thread the event loop lends would starve on a machine with few cores (appendix D). Up to `max_batch`
requests are decoded together (`pipeline.scheduler.Scheduler`, chapter 17): each frame's graph calls serve all of
them, and each request's pieces come as its own frames do. A request keeps its place from its first segment to its
last (`pipeline.longform.LongText`); one that joins is prefilled a piece per frame, so the streams already running
never wait for a whole prompt. A request whose client leaves more than `backlog_seconds` of audio unread has its
text held (no next segment) until the client catches up; the engine sleeps while it has nothing it may step.

Admission by capacity: the engine starts only as many requests as it can speak in real time (`capacity.Capacity`,
measured once before the first request, or given as `step_seconds`), so every stream it speaks keeps up with its
listener; the others wait for a place, in order, at most `max_wait` seconds, and are then refused (a 503 with
Retry-After). Each stream's pieces grow from one frame only as fast as its listener can play them
(`Capacity.piece_rtf`). `admit="all"` starts every request that has a place, the batch's overflow waiting in the
scheduler: more audio a second when the machine can batch, but every stream slower than real time past its
capacity.

Failures are seen, never hidden. An exception on the engine's thread stops the engine: every request is told, and
new ones are refused. So does a step that runs far past what is expected of it (the watchdog: `stall_times` its
running median and at least `stall_seconds`, since a step that joins a prefill or shares the cores with a busy
neighbour runs longer than the median), and every request has a deadline (its planned frames at no more than
`deadline_per_frame` seconds each, plus `deadline_margin` seconds) past which it is cut with an error. A
stopped engine stays stopped: `status().healthy` is False with the reason, and a supervisor restarts the process.
"""
from __future__ import annotations

import asyncio
import queue
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ...audio.wav import SAMPLE_RATE
from ...errors import AudioError, InputError
from ...pipeline.longform import FIRST_FRAMES, LongText, Span, check_budget, plan
from ...pipeline.scheduler import DEFAULT_MAX_BATCH, Scheduler
from ...pipeline.textstream import TextStream
from .capacity import Capacity

FRAME_BUDGET = 9000      # frames a request may take (12 minutes: a 4096-character English text fits)
BACKLOG_SECONDS = 20.0   # audio a client may leave unread before its text is held
MAX_WAIT = 30.0          # seconds a request may wait for a place among the streams before a 503
STALL_TIMES = 10         # a step this many times its running median ...
STALL_SECONDS = 60.0     # ... and at least this long stops the engine (the watchdog)
DEADLINE_FRAME_SECONDS = 0.4  # a request's deadline allows each planned frame five times its 80 ms of audio ...
DEADLINE_MARGIN = 120.0  # ... plus this many seconds
POLL_SECONDS = 1.0       # how often a waiting request looks at the engine's health


class Unavailable(Exception):
    """The engine cannot take a request now: overloaded (`retry_after` seconds) or stopped (None)."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class EngineFailed(Exception):
    """The engine stopped while the request was speaking or waiting (the reason is the message)."""


class DeadlinePassed(EngineFailed):
    """A request ran past its deadline: it is cut, the engine goes on."""


class Stalled(Exception):
    """The watchdog's reason for stopping the engine: a step that ran far too long."""


@dataclass(frozen=True)
class Status:
    """What the engine is doing, as `/health` and `/metrics` report it."""

    healthy: bool
    error: str | None    # why not, when not healthy
    speaking: int        # requests the batch has admitted (their audio is being made)
    waiting: int         # requests holding a place that are not speaking yet
    started: int         # requests started (their text given to the batch), speaking or not yet
    queued: int          # requests taken in that wait for one of the streams' places (admission by capacity)
    held: int            # speaking requests whose text waits for their client to catch up
    refused: int         # requests turned away for want of a place, since the start
    served: int          # requests spoken to the end, since the start
    batch: int           # utterances in the batch now
    max_batch: int
    largest_batch: int   # the most utterances one step has decoded
    streams: int         # requests spoken at once: those that keep real time, or every place when admitting all


class Job:
    """One request in the engine. The event loop iterates it for its audio pieces (float32 arrays) and closes it
    however the request ends; the engine's thread puts what it makes on `out`. `backlog`: samples sent and not yet
    taken (the client's reading, felt through the event loop's flow control). An iteration raises the refusal
    (`InputError` or `AudioError`) when the request cannot start, `EngineFailed` when the engine stops or the
    request passes its deadline."""

    def __init__(self, engine: Engine, speech, voice, planned: list, loop: asyncio.AbstractEventLoop):
        self.engine, self.speech, self.voice, self.planned, self.loop = engine, speech, voice, planned, loop
        self.frames = sum(s.cap for s in planned)
        self.out: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrived = 0.0  # monotonic seconds, when it was given a place
        self.released = False
        self.long: LongText | None = None  # the engine thread's
        self.text: TextStream | None = None  # the engine thread's, for a text that streams in (`speak_text`)
        self.streamed = speech is not None and speech.text is None
        self.early_text: list[str | None] = []  # the engine thread's: deltas (None: the end) before it started
        self.spans: list[Span] = []  # the engine thread's: segments completed in the latest step
        self.deadline: float | None = None  # monotonic seconds, set when the engine starts it
        self._backlog, self._lock = 0, threading.Lock()
        self._held_over: int | None = None  # held for a backlog over this many samples: `take` wakes the engine

    def usage(self) -> tuple[int, int]:
        """(text tokens in, frames planned at most)."""
        return sum(s.tokens for s in self.planned), sum(s.frames for s in self.planned)

    @property
    def backlog(self) -> int:
        return self._backlog

    # ------------------------------------------------------------ the event loop's side
    def __aiter__(self):
        return self

    async def __anext__(self):
        kind, value = await self._take()
        if kind in ("audio", "segment"):
            return value
        if kind == "done":
            raise StopAsyncIteration
        if kind in ("refused", "busy") or isinstance(value, EngineFailed):
            raise value
        raise EngineFailed(str(value))

    async def _take(self):
        """The next (kind, value); a stopped engine is noticed within POLL_SECONDS, whatever it managed to say."""
        while True:
            try:
                kind, value = await asyncio.wait_for(self.out.get(), POLL_SECONDS)
                break
            except TimeoutError:
                failure = self.engine.failure_now()
                if failure is not None:
                    return "error", failure
        if kind == "audio":
            with self._lock:
                self._backlog -= len(value)
                wake = self._held_over is not None and self._backlog <= self._held_over
                if wake:
                    self._held_over = None
            if wake:
                self.engine.inbox.put(None)
        return kind, value

    def close(self) -> None:
        """The request is over, however it ended: its place is free (once), its work stops at the next step."""
        self.engine.release(self)

    def feed(self, delta: str) -> None:
        """More of a streamed text (`speak_text`): the engine's thread takes it in order."""
        self.engine.inbox.put(("text", self, delta))

    def finish(self) -> None:
        """A streamed text's end."""
        self.engine.inbox.put(("text", self, None))

    # ------------------------------------------------------------ the engine thread's side
    def send(self, kind: str, value=None) -> None:
        if kind == "audio":
            with self._lock:
                self._backlog += len(value)
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed: the server is going down
            self.cancelled.set()

    def held(self, limit: int) -> bool:
        """Whether the backlog is over `limit` samples (its text then waits); while it is, the client's next take
        that brings it back under wakes the engine, which sleeps meanwhile."""
        with self._lock:
            held = self._backlog > limit
            self._held_over = limit if held else None
            return held


class Engine:
    """The synthesizer behind the one thread that runs ncnn: its scheduler (the batch), the requests it speaks and
    the inbox in front of it (a stream's first piece `first_frames` frames, the next ones growing to
    `chunk_frames`). `speak`, `status` and `stop` are the event loop's; the rest runs on the engine's
    thread. `stall_seconds` or `deadline_margin` None: no watchdog, no deadlines (a test that holds steps on
    purpose). `on_step(batch)` is called after each frame step with how many utterances it decoded (the metrics).
    `around_step(step)`, where given, runs each step in its place and returns its events: a test's hand on the
    engine (hold a step until the test allows it, count the steps, raise or hang instead of stepping)."""

    def __init__(self, synth, max_frames: int = 600, chunk_frames: int = 4, queue_places: int = 8,
                 max_batch: int = DEFAULT_MAX_BATCH, budget: int | None = FRAME_BUDGET,
                 backlog_seconds: float = BACKLOG_SECONDS, stall_seconds: float | None = STALL_SECONDS,
                 deadline_margin: float | None = DEADLINE_MARGIN, deadline_per_frame: float = DEADLINE_FRAME_SECONDS,
                 admit: str = "realtime", step_seconds: dict[int, float] | None = None, max_wait: float = MAX_WAIT,
                 first_frames: int = FIRST_FRAMES,
                 on_step: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None,
                 around_step: Callable[[Callable[[], list]], list] | None = None):
        from ...binding.net import release_threads

        if admit not in ("realtime", "all"):
            raise InputError(f"admit is 'realtime' or 'all', not {admit!r}")
        self.log = log or (lambda m: print(f"qtts serve: {m}", file=sys.stderr))
        self.admit, self.max_wait = admit, max_wait

        self.synth, self.max_frames, self.chunk_frames, self.budget = synth, max_frames, chunk_frames, budget
        self.first_frames = first_frames
        self.queue_places, self.stall_seconds = queue_places, stall_seconds
        self.deadline_margin, self.deadline_per_frame = deadline_margin, deadline_per_frame
        self.backlog = int(backlog_seconds * SAMPLE_RATE)
        self.on_step, self.around_step = on_step, around_step
        self.scheduler = Scheduler(synth, max_batch)
        self.inbox: queue.Queue[Job | None | bool] = queue.Queue()
        self.speaking: list[Job] = []  # the engine thread's: every request started, admitted to the batch or not
        self.queued: deque[Job] = deque()  # the engine thread's: requests not started, waiting for a stream's place
        self.pending = 0               # requests holding a place, waiting or speaking (the event loop's)
        self.refused = self.served = self.largest_batch = 0
        self.failure: BaseException | None = None
        self._step_started: float | None = None
        self._durations: deque[float] = deque(maxlen=256)  # the latest steps' seconds (the watchdog's median)
        self.capacity = None if admit == "all" or step_seconds is None else Capacity(step_seconds, max_batch)
        release_threads()  # loading ran ncnn in this thread; from now on only the engine's thread does
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._work, name="qtts-engine", daemon=True)
        self.thread.start()
        self._ready.wait()  # the capacity measured (when it is) before any request

    @property
    def streams(self) -> int:
        """Requests started at once: those that keep real time (`capacity`), or, admitting all, every place."""
        return self.max_batch + self.queue_places if self.capacity is None else self.capacity.streams

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    # ------------------------------------------------------------ the event loop's side
    async def speak(self, speech, voice) -> Job:
        """A place for the request (`schema.Speech`, spoken with `voice`): its text planned against the budget (the
        tokenizer, off the event loop: a `BudgetError` or `InputError`), then `Unavailable` at once when there is no
        place or the engine has stopped."""
        planned = await asyncio.to_thread(self._plan, speech.text)
        return self._place(Job(self, speech, voice, planned, asyncio.get_running_loop()))

    async def speak_text(self, speech, voice) -> Job:
        """A place for a request whose text streams in (`schema.Speech` with `text` None, spoken with `voice`):
        `job.feed(delta)` as the text comes, `job.finish()` at its end; iterating it gives the audio pieces and a
        `longform.Span` as each segment's audio is complete. Segments start as soon as the text decides them
        (`pipeline.textstream.TextStream`), so the audio is the whole text's; the budget is checked as the text
        comes (an `InputError` out of the iteration). `Unavailable` at once as `speak`'s."""
        return self._place(Job(self, speech, voice, [], asyncio.get_running_loop()))

    def _place(self, job: Job) -> Job:
        failure = self.failure_now()
        if failure is not None:
            raise Unavailable(f"the engine stopped: {failure}")
        speaking = min(self.streams, self.max_batch)
        if self.pending >= speaking + self.queue_places:
            self.refused += 1
            raise Unavailable(f"server busy: {speaking} requests speaking and {self.queue_places} queued; "
                              "retry later", retry_after=max(1, round(self.pending / speaking)))
        job.arrived = time.monotonic()
        self.pending += 1
        self.inbox.put(job)
        return job

    def _plan(self, text: str) -> list:
        segments = plan(self.synth, text, max_frames=self.max_frames)
        check_budget(segments, self.budget)
        return segments

    def release(self, job: Job) -> None:
        if not job.released:
            job.released = True
            self.pending -= 1
            job.cancelled.set()
            self.inbox.put(None)  # wakes an idle engine, which drops the job if it has not started it yet

    def status(self) -> Status:
        failure = self.failure_now()
        jobs = [j for j in list(self.speaking) if not j.released]  # a snapshot
        started = [j for j in jobs if j.long.lane.started]
        speaking = len(started)
        return Status(healthy=failure is None, error=None if failure is None else str(failure), speaking=speaking,
                      waiting=max(self.pending - speaking, 0), started=len(jobs), queued=len(list(self.queued)),
                      held=sum(1 for j in started if j.long.held),
                      refused=self.refused, served=self.served, batch=len(self.scheduler.batch),
                      max_batch=self.max_batch, largest_batch=self.largest_batch,
                      streams=self.streams)

    def failure_now(self) -> BaseException | None:
        """Why the engine has stopped (its thread's exception, or the watchdog's `Stalled`), or None while it runs."""
        if self.failure is None and not self.thread.is_alive():
            self.failure = EngineFailed("the engine's thread has ended")
        if self.failure is None:
            self._watch()
        return self.failure

    def _watch(self) -> None:
        """The watchdog: a step running past `stall_times` its running median and `stall_seconds` stops the engine
        (a request waiting on it is answered, `/health` says why) even while the thread is stuck inside ncnn."""
        started, limit = self._step_started, self.stall_seconds
        if started is None or limit is None:
            return
        durations = list(self._durations)
        median = statistics.median(durations) if durations else 0.0
        expected = max(STALL_TIMES * median, limit)
        running = time.monotonic() - started
        if running > expected:
            self.failure = Stalled(f"a step has run for {running:.1f} s (the running median is {median * 1e3:.0f} "
                                   f"ms; the watchdog allows {expected:.1f} s)")
            print(f"qtts serve: the engine stopped: {self.failure}", file=sys.stderr)

    def stop(self) -> None:
        self.inbox.put(False)

    # ------------------------------------------------------------ the engine's thread
    def _work(self) -> None:
        try:
            if self.admit == "realtime" and self.capacity is None:
                self.log("measuring the steps at each batch size (the streams that keep real time) ...")
                self.capacity = Capacity.measure(self.synth, self.scheduler, self.chunk_frames)
                self.log(self.capacity.describe())
        except BaseException as e:  # noqa: BLE001 - as any failure of this thread
            self.failure = e
        finally:
            self._ready.set()
        try:
            while self.failure is None and self._take_inbox():
                if self.speaking:
                    self._step()
        except BaseException as e:  # noqa: BLE001 - the engine stops, and says why to everyone
            if self.failure is None:
                self.failure = e
            print(f"qtts serve: the engine stopped: {e!r}", file=sys.stderr)
        if self.failure is None:
            return  # stopped on purpose
        for job in [*self.speaking, *self.queued]:
            job.send("error", self.failure)
        self.speaking, self.queued = [], deque()
        while True:
            try:
                job = self.inbox.get_nowait()
            except queue.Empty:
                break
            if job:
                job.send("error", self.failure)

    def _take_inbox(self) -> bool:
        """Queue the requests that came and start them while there are streams' places (wait for one when idle:
        nothing speaking, every text held for its client's backlog with nothing left to step, or every utterance
        waiting for the text a client streams in); answer those that waited past `max_wait` with a 503; drop those
        whose clients left or whose deadline passed; False: stop."""
        incoming = []
        idle = not self.speaking or not self.scheduler or self.scheduler.blocked  # blocked: waiting for text
        timeout = None
        if idle and self.queued:  # wake in time to answer the oldest waiting request
            timeout = max(0.0, self.queued[0].arrived + self.max_wait - time.monotonic())
        try:
            incoming.append(self.inbox.get(block=idle, timeout=timeout))
            while True:
                incoming.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        if False in incoming:
            for job in self.speaking:
                job.long.cancel()
                job.send("done")
            for job in self.queued:
                job.send("error", EngineFailed("the server is stopping"))
            return False
        self.queued.extend(job for job in incoming if isinstance(job, Job))
        self.queued = deque(job for job in self.queued if not job.cancelled.is_set())
        while self.queued and len(self.speaking) < self.streams:
            self._start(self.queued.popleft())
        for _, job, delta in (m for m in incoming if isinstance(m, tuple)):
            if job.text is None:
                job.early_text.append(delta)  # not started yet: taken in order once it is
            elif job in self.speaking:
                self._feed(job, delta)
        now = time.monotonic()
        while self.queued and now - self.queued[0].arrived > self.max_wait:
            self.refused += 1
            self.queued.popleft().send("busy", Unavailable(
                f"server busy: the request waited {self.max_wait:.0f} s for one of the {self.streams} streams this "
                "server speaks in real time; retry later", retry_after=max(1, round(self.max_wait))))
        for job in list(self.speaking):
            if job.cancelled.is_set():  # the client left
                self._end(job)
            elif job.deadline is not None and now > job.deadline:
                allowed = job.frames * self.deadline_per_frame + self.deadline_margin
                self._end(job, "error", DeadlinePassed(f"the request passed its deadline: {allowed:.0f} s for "
                                                       f"{job.frames} frames planned"))
        return True

    def _start(self, job: Job) -> None:
        if job.streamed:
            return self._start_text(job)
        s = job.speech
        try:
            job.long = LongText(self.synth, self.scheduler, s.text, s.language, job.voice, s.sampling,
                                max_frames=self.max_frames, chunk_frames=self.chunk_frames, planned=job.planned,
                                first_frames=self.first_frames,
                                rtf=None if self.capacity is None else self.capacity.piece_rtf())
        except (InputError, AudioError) as e:
            job.send("refused", e)
            return
        if s.stream_format == "sse":  # its events say where each segment lies (`speech.segment`)
            job.long.on_span = job.spans.append
        if self.deadline_margin is not None:
            job.deadline = time.monotonic() + self.deadline_per_frame * job.frames + self.deadline_margin
        self.speaking.append(job)

    def _start_text(self, job: Job) -> None:
        s = job.speech
        try:
            job.text = TextStream(self.synth, s.language, job.voice, s.sampling, max_frames=self.max_frames,
                                  chunk_frames=self.chunk_frames, scheduler=self.scheduler, budget=self.budget,
                                  first_frames=self.first_frames, on_span=job.spans.append,
                                  rtf=None if self.capacity is None else self.capacity.piece_rtf())
        except (InputError, AudioError) as e:
            job.send("refused", e)
            return
        job.long, job.planned = job.text.long, job.text.segments
        self.speaking.append(job)
        for delta in job.early_text:
            if job in self.speaking:
                self._feed(job, delta)
        job.early_text = []

    def _feed(self, job: Job, delta: str | None) -> None:
        """A streamed text's next delta (None: its end, which sets its deadline by the frames it may take)."""
        try:
            if delta is not None:
                job.text.feed(delta)
                return
            job.text.finish()
        except (InputError, AudioError) as e:
            self._end(job, "refused", e)
            return
        if self.deadline_margin is not None:
            job.frames = sum(seg.cap for seg in job.text.segments)
            job.deadline = time.monotonic() + self.deadline_per_frame * job.frames + self.deadline_margin

    def _step(self) -> None:
        self._step_started = time.monotonic()
        step = self.scheduler.step
        events = step() if self.around_step is None else self.around_step(step)
        self._durations.append(time.monotonic() - self._step_started)
        self._step_started = None
        batch = sum(not e.drained for e in events)  # one event per utterance in the batch; none if it only drained
        self.largest_batch = max(self.largest_batch, batch)
        if batch and self.on_step is not None:
            self.on_step(batch)
        for job in list(self.speaking):
            for piece in job.long.take(events):
                job.send("audio", piece)
            for span in job.spans:  # after the audio it spans
                job.send("segment", span)
            job.spans.clear()
            if job.long.done:  # not counted as speaking once its client can hear it is done (`/health`)
                self.served += 1
                self._end(job, "done")
            else:
                job.long.hold(job.held(self.backlog))  # a client far behind: no next segment for now

    def _end(self, job: Job, message: str | None = None, value=None) -> None:
        job.long.cancel()
        self.speaking.remove(job)
        if message:
            job.send(message, value)
