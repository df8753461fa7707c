"""`qtts serve` under traffic: fairness between requests, places freed when clients leave, bounded work, failures
that are seen. Each test runs the app in this process (uvicorn on a thread, `serving.InProcess`) over an `Engine`
whose steps the test paces (`serving.Paced`), so that every assertion is about an order of events or a state the
server reaches, never about how long something took."""
import http.client
import json
import threading
import time

import pytest
from serving import PARAGRAPH, hang_up, places, post, request, speech, until

from qtts_lib import paths
from qtts_lib.runtime.app.server.voices import DESIGNED, Voices
from qtts_lib.runtime.pipeline.longform import plan


def response_in_thread(conn) -> dict:
    """conn.getresponse() on a thread (it returns once the first audio is in): {"response": ...} when it has, or
    {"error": ...} when the connection ended first (a client that hung up)."""
    out = {}

    def wait():
        try:
            out["response"] = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            out["error"] = e

    threading.Thread(target=wait, daemon=True).start()
    return out


def first_audio(conn, paced) -> http.client.HTTPResponse:
    """Let the engine step, one step at a time, until `conn` has its headers (its first audio is out); a step or
    two more may run while the audio travels, which no test depends on."""
    out = response_in_thread(conn)
    for _ in range(500):
        target = paced.done + 1
        paced.allow()
        paced.wait_for(target)
        try:
            until(lambda: "response" in out, timeout=0.2)
            return out["response"]
        except TimeoutError:
            pass
    raise TimeoutError("no first audio in 500 steps")


def test_a_running_stream_keeps_its_place_before_a_new_request(serve):
    """Two clients, one batch place. A speaks a text of several segments; B asks while A speaks its first. Every
    step that served A comes before every step that served B: A's next segment is admitted before B's first, so
    A's audio never waits for B's whole utterance between two of its segments."""
    engine, url, paced = serve(max_frames=8)
    lanes = []
    paced.on_events = lambda events: lanes.append({(e.ticket.lane.id, e.ticket.id) for e in events})
    a = post(url, speech(PARAGRAPH * 2))
    a_response = first_audio(a, paced)
    b = post(url, speech("A second request."))
    until(lambda: places(engine) == 2, what="B in the queue")
    paced.run_free()
    a_body, b_body = a_response.read(), b.getresponse().read()
    assert a_body and b_body
    lane_a = next(lane for step in lanes for lane, _ in step)
    served_a = [i for i, step in enumerate(lanes) if any(lane == lane_a for lane, _ in step)]
    served_b = [i for i, step in enumerate(lanes) if any(lane != lane_a for lane, _ in step)]
    segments_a = {t for step in lanes for lane, t in step if lane == lane_a}
    assert len(segments_a) >= 2 and served_b
    assert max(served_a) < min(served_b)


def test_a_client_that_leaves_while_queued_frees_its_place_at_once(serve):
    """One place speaking and one waiting: A speaks, B waits, C is refused (503, Retry-After). B hangs up: its
    place is free while the engine makes no step at all, and C is taken."""
    engine, url, paced = serve(max_batch=1, queue_places=1, max_frames=40)
    a = post(url, speech(PARAGRAPH))
    a_response = first_audio(a, paced)
    b = post(url, speech())
    until(lambda: places(engine) == 2, what="B in the queue")
    status, headers, body = request(url, "/v1/audio/speech", speech())
    assert status == 503 and json.loads(body)["error"]["code"] == "overloaded" and int(headers["retry-after"]) >= 1
    steps = paced.done
    hang_up(b)
    until(lambda: places(engine) == 1, what="B's place freed")
    c = post(url, speech())
    until(lambda: places(engine) == 2, what="C taken")
    assert paced.done == steps  # the engine never stepped: the event loop freed the place
    paced.run_free()
    assert a_response.read() and c.getresponse().read()
    assert engine.status().served >= 2


def test_a_client_that_leaves_before_its_first_audio_frees_its_place(serve):
    """A request admitted and speaking, its first piece not out yet (20 frames a piece, the first too): its client
    hangs up. The place is free at once; at the next step the engine drops its utterance from the batch."""
    engine, url, paced = serve(max_batch=2, chunk_frames=20, first_frames=20, max_frames=40)
    a = post(url, speech(PARAGRAPH))
    out = response_in_thread(a)
    paced.allow(2)
    paced.wait_for(2)
    assert engine.status().speaking == 1 and engine.status().batch == 1 and "response" not in out
    hang_up(a)
    until(lambda: places(engine) == 0, what="A's place freed")
    paced.allow()
    until(lambda: engine.status().speaking == 0, what="A dropped")
    paced.wait_for(3)
    assert engine.status().batch == 0 and engine.status().started == 0


def test_an_engine_that_stops_is_seen(serve):
    """The engine's thread fails (a step raises): the request waiting gets a 5xx JSON error, /health answers 503
    with the reason, and a new request is refused at once with a 503."""
    engine, url, paced = serve(max_batch=1, queue_places=2, max_frames=40)
    a = post(url, speech(PARAGRAPH))
    first_audio(a, paced)
    b = post(url, speech())
    until(lambda: places(engine) == 2, what="B in the queue")
    paced.fail_with(RuntimeError("a step failed"))
    b_response = b.getresponse()
    assert b_response.status in (500, 503)
    assert "a step failed" in json.loads(b_response.read())["error"]["message"]
    status, _, body = request(url, "/health")
    assert status == 503 and json.loads(body)["status"] == "error" and "a step failed" in json.loads(body)["error"]
    status, _, body = request(url, "/v1/audio/speech", speech())
    assert status == 503 and json.loads(body)["error"]["code"] == "engine_stopped"


def test_an_error_mid_stream_breaks_the_stream(serve):
    """A stream that has sent audio when the engine fails is cut off: the chunked body never ends, so the client
    sees a broken stream, not a short 200 that looks complete."""
    engine, url, paced = serve(max_batch=1, max_frames=40)
    a = post(url, speech(PARAGRAPH))
    response = first_audio(a, paced)
    assert response.status == 200 and response.read(100)
    paced.fail_with(RuntimeError("a step failed"))
    with pytest.raises(http.client.IncompleteRead):
        response.read()


def test_a_request_over_the_budget_is_refused_before_any_work(serve):
    engine, url, paced = serve(max_frames=40, budget=60)
    assert sum(s.cap for s in plan(engine.synth, PARAGRAPH * 3, max_frames=40)) > 60
    status, _, body = request(url, "/v1/audio/speech", speech(PARAGRAPH * 3))
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "over_budget" and "at most 60" in error["message"]
    assert paced.done == 0 and places(engine) == 0
    paced.run_free()
    assert request(url, "/v1/audio/speech", speech("Short."))[0] == 200


def test_a_client_that_stops_reading_is_held_then_dropped(serve):
    """A client reads its first audio and then nothing (small socket buffers on both ends): the audio it leaves
    unread passes the backlog, so its text submits no next segment, and after `send_timeout` without taking any
    audio it is dropped (its place and its utterance freed). The server serves the next request."""
    engine, url, paced = serve(max_batch=2, max_frames=30, chunk_frames=2, backlog_seconds=0.5, send_timeout=2,
                               send_buffer=4096)
    seen = set()
    paced.on_events = lambda events: seen.update(e.ticket.id for e in events)
    text = PARAGRAPH * 6
    segments = len(plan(engine.synth, text, max_frames=30))
    paced.run_free()
    a = post(url, speech(text), rcvbuf=4096)
    response = a.getresponse()
    assert response.status == 200 and response.read(64)
    until(lambda: places(engine) == 0 and engine.status().speaking == 0, timeout=300, what="the stalled client dropped")
    assert 1 <= len(seen) < segments
    assert request(url, "/v1/audio/speech", speech("Still here."))[0] == 200
    a.close()


def server_speech(text: str):
    from qtts_lib.runtime.app.server.schema import Speech
    from qtts_lib.runtime.pipeline.sampling import Sampling

    return Speech(text, "pcm", "english", "alice", Sampling(), None)


def test_voices_of_every_kind_without_a_folder():
    """A VoiceDesign checkpoint's one voice is words: nothing to build at start, with or without --voices."""
    from qtts_lib import checkpoint, export, reference
    from qtts_lib.runtime import Synthesizer

    ckpt = "tiny-voicedesign"
    export.ensure(reference.load(checkpoint.ensure(ckpt), threads=2), ckpt)
    said = []
    voices = Voices(Synthesizer(paths.model_dir(ckpt), threads=2), None, said.append)
    voices.preload()
    assert voices.names() == [DESIGNED] and not said
    assert voices.get(DESIGNED, "A calm voice.").instruct == "A calm voice."
    voices.close()


def test_a_step_that_hangs_stops_the_engine_and_says_why(serve):
    """The watchdog: the engine's thread hangs inside a step (an injected hang: the paced step is never allowed to
    finish). Past the stall limit /health answers 503 with the reason, the stream that was speaking is cut off, the
    request waiting gets a 503, and a new request is refused at once."""
    engine, url, paced = serve(max_batch=1, queue_places=2, max_frames=40, stall_seconds=1.0)
    a = post(url, speech(PARAGRAPH))
    response = first_audio(a, paced)
    assert response.status == 200 and request(url, "/health")[0] == 200
    b = post(url, speech())
    until(lambda: places(engine) == 2, what="B in the queue")
    until(lambda: request(url, "/health")[0] == 503, timeout=60, what="the watchdog")  # the next step never ends
    assert "a step has run for" in json.loads(request(url, "/health")[2])["error"]
    with pytest.raises(http.client.IncompleteRead):
        response.read()
    b_response = b.getresponse()
    assert b_response.status == 503 and "a step has run for" in json.loads(b_response.read())["error"]["message"]
    status, _, body = request(url, "/v1/audio/speech", speech())
    assert status == 503 and json.loads(body)["error"]["code"] == "engine_stopped"


def test_a_request_past_its_deadline_is_cut_and_the_engine_goes_on(serve):
    """A request's deadline (here half a second, however many frames) passes while the engine is held inside a step:
    at the next step the request is cut with an error the client sees (a 504 JSON error before any audio, or a
    stream cut off after it, as the first step did or did not make audio), and the engine serves the next one."""
    engine, url, paced = serve(max_batch=1, max_frames=40, chunk_frames=20, deadline_margin=0.5,
                               deadline_per_frame=0.0)
    a = post(url, speech(PARAGRAPH))
    out = response_in_thread(a)
    until(lambda: engine.status().started == 1, what="A started (its deadline set)")
    time.sleep(1.0)  # past the deadline, the engine held inside its first step
    paced.allow()
    until(lambda: "response" in out or "error" in out, what="A's answer")
    response = out["response"]
    if response.status == 200:
        with pytest.raises(http.client.IncompleteRead):
            response.read()
    else:
        error = json.loads(response.read())["error"]
        assert response.status == 504 and error["code"] == "deadline_exceeded" and "deadline" in error["message"]
    paced.run_free()
    engine.deadline_margin = 120.0  # the next request's own deadline out of reach of a loaded machine
    assert request(url, "/health")[0] == 200 and request(url, "/v1/audio/speech", speech(PARAGRAPH))[0] == 200
