"""`qtts serve` admits by capacity: it speaks at once only as many requests as keep real time, the others wait for
a place at most --max-wait seconds and are then answered 503 with Retry-After; /health and /metrics count speaking,
waiting and refused apart. The capacity is given here (`step_seconds`), as a test injects it; `qtts serve`
measures it at start (`capacity.Capacity.measure`)."""
import json
import time

import pytest
from serving import PARAGRAPH, places, post, request, speech, until

from qtts_lib.runtime.app.server.capacity import ADMIT_HEADROOM, FRAME_SECONDS, Capacity


def test_the_capacity_is_the_largest_batch_whose_step_keeps_real_time():
    budget = FRAME_SECONDS * ADMIT_HEADROOM
    assert Capacity({1: budget / 2, 2: budget * 0.9, 3: budget * 1.2}, max_batch=4).streams == 2
    assert Capacity({1: budget / 3.5}, max_batch=4).streams == 3  # 2 and 3 scaled from 1, 4 past the budget
    assert Capacity({1: budget * 3}, max_batch=4).streams == 1  # a slow machine still speaks one stream
    assert Capacity({1: budget / 2, 2: budget / 2}, max_batch=2).streams == 2


def metric(url: str, name: str) -> float:
    text = request(url, "/metrics")[2].decode()
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_a_request_past_the_capacity_waits_then_is_refused_with_retry_after(serve):
    """Two batch places, but a step at batch 2 is too slow for real time: A speaks, B waits (not started, so A keeps
    its pace), /health says one speaking and one waiting; past --max-wait B gets a 503 with Retry-After, counted as
    refused; A is spoken to its end."""
    budget = FRAME_SECONDS * ADMIT_HEADROOM
    engine, url, paced = serve(max_batch=2, queue_places=2, max_frames=40, admit="realtime",
                               step_seconds={1: budget / 2, 2: budget * 1.5}, max_wait=1.0)
    assert engine.status().streams == 1
    a = post(url, speech(PARAGRAPH))
    paced.allow(3)
    paced.wait_for(3)
    b = post(url, speech())
    until(lambda: places(engine) == 2, what="B given a place")
    paced.allow()
    until(lambda: engine.status().queued == 1, what="B taken from the inbox, and not started")
    health = json.loads(request(url, "/health")[2])
    assert (health["speaking"], health["waiting"], health["streams"]) == (1, 1, 1), health
    assert engine.status().started == 1  # A's batch is A alone
    time.sleep(1.0)  # past B's max wait
    paced.allow()  # the engine answers B after this step
    b_answer = b.getresponse()
    error = json.loads(b_answer.read())["error"]
    assert b_answer.status == 503 and b_answer.getheader("Retry-After") and error["code"] == "overloaded", error
    assert json.loads(request(url, "/health")[2])["refused"] == 1 and metric(url, "qtts_requests_refused") == 1
    paced.run_free()
    a_answer = a.getresponse()
    assert a_answer.status == 200 and len(a_answer.read()) > 0


@pytest.mark.parametrize("admit, started", [("realtime", 1), ("all", 2)])
def test_admit_all_starts_every_request_with_a_place(serve, admit, started):
    """--admit all keeps every place's request started (the batch's overflow waits in the scheduler); realtime
    starts only what keeps real time."""
    budget = FRAME_SECONDS * ADMIT_HEADROOM
    engine, url, paced = serve(max_batch=2, queue_places=2, max_frames=40, admit=admit,
                               step_seconds={1: budget / 2, 2: budget * 1.5}, max_wait=60.0)
    conns = [post(url, speech(PARAGRAPH)) for _ in range(2)]
    until(lambda: places(engine) == 2, what="both given a place")
    paced.allow()
    until(lambda: engine.status().started == started, what=f"{started} started")
    paced.run_free()
    for conn in conns:
        assert conn.getresponse().status == 200


def test_a_stalled_step_does_not_set_the_capacity():
    """The measured mean keeps the codec's periodic decode (a step a few times the median) and drops a step the
    machine stalled (another process on the cores)."""
    from qtts_lib.runtime.app.server.capacity import robust_mean

    steps = [0.01, 0.01, 0.01, 0.03] * 6
    assert robust_mean(steps) == pytest.approx(0.015)
    assert robust_mean(steps + [2.0]) == pytest.approx(0.015)


def test_an_admitted_streams_pieces_grow_only_as_fast_as_its_listener_plays(synth):
    """The engine cuts each admitted stream's pieces for the step it measured (`Capacity.piece_rtf`): a step of
    48 ms at batch 1 grows them for a real-time factor of 1.5 x 48 / 80 = 0.9, so the first nine are one frame each
    where the default growth would double them (1, 2, 4); a listener who plays from the first piece never waits."""
    import asyncio

    import numpy as np
    from test_first_piece import listener_waits, sizes_for

    from qtts_lib import paths
    from qtts_lib.runtime.app.server.engine import Engine
    from qtts_lib.runtime.app.server.schema import Speech
    from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav
    from qtts_lib.runtime.pipeline.longform import FADE_SECONDS

    capacity = Capacity({1: 0.048, 2: 0.2}, max_batch=2)
    assert capacity.streams == 1 and capacity.piece_rtf() == pytest.approx(0.9)
    engine = Engine(synth, max_frames=40, chunk_frames=4, queue_places=1, max_batch=2, admit="realtime",
                    step_seconds=capacity.seconds, log=lambda m: None)
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    speech = Speech(text="One sentence, long enough for a few dozen frames of audio.", format="pcm",
                    language="english", voice=None, sampling=synth.sampling.replace(seed=1), instructions=None)

    async def pieces():
        job = await engine.speak(speech, voice)
        try:
            return [len(p) async for p in job]
        finally:
            job.close()

    try:
        lengths = asyncio.run(pieces())
    finally:
        engine.stop()
        engine.thread.join(60)
    held = int(round(FADE_SECONDS * SAMPLE_RATE))  # the fade holds a segment's last 10 ms back until its end
    out = np.cumsum(lengths[:-1])  # but none of its first frame: a second one follows it (`longform.Fader`)
    ends = [(int(n) + held * (n > SAMPLES_PER_FRAME)) // SAMPLES_PER_FRAME for n in out
            if (n + held * (n > SAMPLES_PER_FRAME)) % SAMPLES_PER_FRAME == 0]
    assert ends[-1] >= 12, f"only {ends[-1]} frames: too few to see the pieces grow"
    expected = list(np.cumsum(sizes_for(0.9, ends[-1])))
    assert ends == expected[:len(ends)], (ends, expected)
    assert ends[:3] == [1, 2, 3] and listener_waits(sizes_for(0.9, 200), 0.9) == 0.0
