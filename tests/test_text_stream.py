"""Text streamed in, audio streamed out (qtts_lib.runtime.pipeline.textstream): `stream_long`'s audio for the whole
text, byte for byte, however the text is cut and whenever it comes; the segments' spans in that audio."""
import random

import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.runtime import Sampling
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, load_wav
from qtts_lib.runtime.pipeline import longform
from qtts_lib.runtime.pipeline.textstream import TextStream, stream_text
from qtts_lib.runtime.text.segment import segments

TEXT = ("The tutorial ports a speech model to a small runtime. Each chapter checks one claim against the reference. "
        "Dr. Smith reads it aloud, e.g. on Mondays. Long texts are cut into sentences! Are they packed into "
        "segments? They are, and spoken one at a time with the same voice.")
OPTIONS = dict(max_tokens=20, max_frames=6, chunk_frames=2)
PAUSE = int(round(longform.PAUSE_SECONDS * SAMPLE_RATE))


def _words(text: str, n: int) -> list[str]:
    """`text` in pieces of n words (each piece keeps the space before its next word)."""
    words = text.split(" ")
    return [" ".join(words[i:i + n]) + (" " if i + n < len(words) else "") for i in range(0, len(words), n)]


@pytest.fixture(scope="module")
def voices(synth):
    clip = load_wav(paths.voice_wav())
    return {"xvector": synth.voice(wav=clip),
            "icl": synth.voice(wav=clip, text=(paths.INPUTS / "voice.txt").read_text().strip())}


def _whole(synth, voice, seed: int) -> np.ndarray:
    return np.concatenate(list(longform.stream_long(synth, TEXT, "english", voice, Sampling(seed=seed), **OPTIONS)))


@pytest.mark.parametrize("kind, early", [("xvector", True), ("xvector", False), ("icl", False)])
def test_streamed_text_gives_stream_longs_audio_byte_for_byte(synth, voices, kind, early):
    voice = voices[kind]
    whole = _whole(synth, voice, 11)
    assert len(segments(TEXT, 20, synth.prompts.text_tokens)) >= 3
    for n in (1, 4):   # the text as late as it can come, in pieces of n words
        streamed = np.concatenate(list(stream_text(synth, _words(TEXT, n), "english", voice, Sampling(seed=11),
                                                   early=early, **OPTIONS)))
        assert streamed.tobytes() == whole.tobytes(), (kind, n)


def test_text_that_comes_early_or_at_random_steps_gives_the_same_audio(synth, voices):
    voice = voices["xvector"]
    whole = _whole(synth, voice, 5)
    rng = random.Random(3)
    for _ in range(2):
        cuts = sorted(rng.sample(range(1, len(TEXT)), 25))
        deltas = [TEXT[a:b] for a, b in zip([0] + cuts, cuts + [len(TEXT)])]
        stream = TextStream(synth, "english", voice, Sampling(seed=5), **OPTIONS)
        pieces, steps = [], 0
        while deltas or not stream.done:
            if deltas and (stream.idle or rng.random() < 0.3):
                stream.feed(deltas.pop(0))
                if not deltas:
                    stream.finish()
                continue
            pieces += stream.step()
            steps += 1
        assert np.concatenate(pieces).tobytes() == whole.tobytes()


def test_audio_comes_before_the_text_is_finished_and_a_stalled_text_waits(synth, voices):
    stream = TextStream(synth, "english", voices["xvector"], Sampling(seed=2), early=False, **OPTIONS)
    assert stream.idle and not stream.done and stream.step() == []
    first = _words(TEXT, 4)
    heard = []
    for delta in first[:6]:
        assert stream.feed(delta) == []     # the first segment may still take "Dr. Smith ... on Mondays."
    assert stream.idle and stream.step() == []
    assert [s.text for s in stream.feed(first[6])] == [TEXT[:TEXT.index(" Dr.")]]   # "Long" is in: it does not fit
    while not stream.idle:
        heard += stream.step()
    given = sum(len(p) for p in heard)
    assert given == stream.segments[0].samples > 0        # spoken while the text still comes, and no pause yet:
    assert not stream.scheduler and stream.step() == []   # nothing says a segment follows; stalled, nothing runs
    for delta in first[7:]:
        stream.feed(delta)
    stream.finish()
    while not stream.done:
        heard += stream.step()
    assert sum(len(p) for p in heard) > given
    stream.close()


def test_spans_lie_in_the_audio_one_per_segment(synth, voices):
    spans = []
    stream = TextStream(synth, "english", voices["xvector"], Sampling(seed=4), on_span=spans.append, **OPTIONS)
    pieces = []
    for delta in _words(TEXT, 3):
        stream.feed(delta)
        while not stream.idle:
            pieces += stream.step()
    stream.finish()
    while not stream.done:
        pieces += stream.step()
    wav = np.concatenate(pieces)
    texts = segments(TEXT, 20, synth.prompts.text_tokens)
    assert spans == stream.spans and [s.text for s in spans] == texts
    assert spans[0].start == 0 and spans[-1].end * SAMPLE_RATE == pytest.approx(len(wav))
    for seg, span in zip(stream.segments, spans):
        assert (span.end - span.start) * SAMPLE_RATE == pytest.approx(seg.samples) and seg.samples > 0
    for a, b in zip(spans, spans[1:]):
        assert (b.start - a.end) * SAMPLE_RATE == pytest.approx(PAUSE)
        assert not wav[round(a.end * SAMPLE_RATE):round(b.start * SAMPLE_RATE)].any()   # the pause is silence
    whole = longform.synthesize_long(synth, TEXT, "english", voices["xvector"], Sampling(seed=4), max_tokens=20,
                                     max_frames=6, max_batch=1)
    assert [s.as_dict() for s in whole.spans()] == [s.as_dict() for s in spans]


def test_a_budget_refuses_the_segment_that_goes_over_it(synth, voices):
    need = sum(s.cap for s in longform.plan(synth, TEXT, max_tokens=20, max_frames=6))
    stream = TextStream(synth, "english", voices["xvector"], Sampling(seed=1), budget=need - 1, **OPTIONS)
    with pytest.raises(longform.BudgetError):
        for delta in _words(TEXT, 4):
            stream.feed(delta)
        stream.finish()
    stream.close()


def test_an_empty_text_is_refused(synth, voices):
    stream = TextStream(synth, "english", voices["xvector"], **OPTIONS)
    stream.feed("   ")
    with pytest.raises(Exception, match="empty"):
        stream.finish()
    stream.close()


def test_an_xvector_segment_starts_before_its_text_is_complete_with_the_same_audio(synth, voices):
    """x-vector: the first segment starts once its first sentence is decided, reads its text a token a frame, waits
    (makes no frame) when the next token has not come, and gives `stream_long`'s audio byte for byte; ICL cannot."""
    voice = voices["xvector"]
    options = dict(max_tokens=30, max_frames=40, chunk_frames=2)
    text = "Hello there. " + " ".join(["This sentence goes on and on with many words in it."] * 2)
    whole = np.concatenate(list(longform.stream_long(synth, text, "english", voice, Sampling(seed=9), **options)))
    for n in (1, 3):
        stream = TextStream(synth, "english", voice, Sampling(seed=9), **options)
        assert stream.early
        pieces, heard_early, waited = [], False, 0
        for delta in _words(text, n):
            stream.feed(delta)
            while not stream.idle:
                pieces += stream.step()
            first = stream.segments[0] if stream.segments else None
            heard_early |= bool(first is not None and first.open and pieces)
            seq = next(iter(stream.long.tickets.values()))[1].seq if stream.long.tickets else None
            waiting = bool(first is not None and first.open and seq is not None and seq.waiting is not None)
            assert stream.scheduler.blocked == (waiting and stream.idle)
            waited += waiting
        stream.finish()
        while not stream.done:
            pieces += stream.step()
        assert heard_early and waited > 1, n     # audio before the segment's text was complete; frames that waited
        assert np.concatenate(pieces).tobytes() == whole.tobytes(), n
        assert [s.text for s in stream.spans] == segments(text, 30, synth.prompts.text_tokens)
    with pytest.raises(Exception, match="x-vector"):
        TextStream(synth, "english", voices["icl"], early=True, **options)
    assert not TextStream(synth, "english", voices["icl"], **options).early


def test_on_a_shared_scheduler_its_events_go_to_take(synth, voices):
    """A server runs one scheduler for all its requests: the stream takes its audio from each step's events, like
    the server's `LongText` of the whole text (the same audio), and warns when a segment's text outruns its cap."""
    from qtts_lib.runtime.pipeline.scheduler import Scheduler

    voice = voices["xvector"]
    scheduler = Scheduler(synth, max_batch=1)
    whole_long = longform.LongText(synth, scheduler, TEXT, "english", voice, Sampling(seed=8), chunk_frames=2,
                                   max_tokens=20, max_frames=6)
    whole = []
    while not whole_long.done:
        whole += whole_long.take(scheduler.step())
    warnings = []
    stream = TextStream(synth, "english", voice, Sampling(seed=8), scheduler=scheduler, on_warning=warnings.append,
                        **OPTIONS)
    assert stream.early   # one place: a segment may start early
    with pytest.raises(RuntimeError, match="take"):
        stream.step()
    pieces, deltas = [], _words(TEXT, 2)
    while not stream.done:
        if deltas and (stream.idle or len(pieces) % 3 == 0):
            stream.feed(deltas.pop(0))
            if not deltas:
                stream.finish()
        pieces += stream.take(scheduler.step())
    assert np.concatenate(pieces).tobytes() == np.concatenate(whole).tobytes()
    assert len(warnings) >= 1 and all("will not be spoken" in w for w in warnings)


def test_an_open_prompt_completed_is_builds_prompt(synth, voices):
    text = "Hello there, general Kenobi. You are a bold one!"
    ids = synth.tokenizer.encode(text, added_tokens=False)
    want = synth.prompts.build(text, "english", voices["xvector"])
    for k in (1, 4, len(ids)):
        got = synth.prompts.open_prompt(ids[:k], "english", voices["xvector"])
        assert got.open and got.text_at(k - 1) is None
        m = max(k, len(ids) - 1)
        synth.prompts.extend_prompt(got, ids[k:m], last=False)
        synth.prompts.extend_prompt(got, ids[m:], last=True)
        assert not got.open and got.text_ids == want.text_ids and got.head == want.head
        assert got.embeds.tobytes() == want.embeds.tobytes() and got.trailing.tobytes() == want.trailing.tobytes()
        assert got.text_at(len(ids) + 3) is got.tts_pad


def test_a_stream_waiting_for_its_text_leaves_the_batch_and_the_others_go_on(synth, voices):
    """Two requests on a scheduler of two places: A's text comes a word at a time, B's whole. When A's next token has
    not come, A leaves the batch with its cache (`Batch.park`, keeping its place) and B makes frames meanwhile; A
    joins again when its token comes and both end; a parked stream can be cancelled."""
    from qtts_lib.runtime.pipeline.scheduler import Scheduler

    voice = voices["xvector"]
    scheduler = Scheduler(synth, max_batch=2)
    a = TextStream(synth, "english", voice, Sampling(seed=3), scheduler=scheduler, max_tokens=30, max_frames=40,
                   chunk_frames=2)
    b = longform.LongText(synth, scheduler, TEXT, "english", voice, Sampling(seed=4), chunk_frames=2, max_tokens=20,
                          max_frames=12)
    words = _words("Hello there. This sentence goes on and on with many words in it. And so on.", 1)
    heard, parked_steps, b_frames_while_parked = {"a": 0, "b": 0}, 0, 0
    while not (a.done and b.done):
        if a.idle and words:
            a.feed(words.pop(0))
            if not words:
                a.finish()
        events = scheduler.step()
        if scheduler.parked:
            parked_steps += 1
            b_frames_while_parked += sum(1 for e in events if e.ticket.id in b.tickets and not e.drained)
        heard["a"] += sum(len(p) for p in a.take(events))
        heard["b"] += sum(len(p) for p in b.take(events))
    assert parked_steps > 0 and b_frames_while_parked > 0
    assert heard["a"] > 0 and heard["b"] > 0 and not scheduler.parked and not scheduler
    assert [s.text for s in a.spans] == segments("Hello there. This sentence goes on and on with many words in it. "
                                                 "And so on.", 30, synth.prompts.text_tokens)

    c = TextStream(synth, "english", voice, Sampling(seed=5), scheduler=scheduler, max_frames=40, chunk_frames=2)
    d = longform.LongText(synth, scheduler, TEXT, "english", voice, Sampling(seed=6), chunk_frames=2, max_frames=40)
    c.feed("Hello there. This ")
    for _ in range(40):
        events = scheduler.step()
        c.take(events)
        d.take(events)
        if scheduler.parked:
            break
    assert scheduler.parked
    c.close()
    assert not scheduler.parked and scheduler.places == 1
    d.cancel()
