"""`qtts serve`'s engine, honest and quiet: an utterance with no audio is answered, /health and /metrics tell
waiting from speaking, the engine thread sleeps while every text waits for its reader, and the voice ids are read
while the builder writes them. In-process servers paced step by step (`serving.Served`), as test_server_traffic."""
import json
import threading
import time
import types
from pathlib import Path

import pytest
from serving import PARAGRAPH, places, post, request, speech, until

from qtts_lib import paths
from qtts_lib.runtime.app.server.engine import Engine, Job
from qtts_lib.runtime.app.server.http import build_app
from qtts_lib.runtime.app.server.voices import Voices
from qtts_lib.runtime.pipeline.longform import plan


def test_an_utterance_that_ends_at_its_first_frame_is_answered_200_with_no_audio(serve, monkeypatch):
    """The model's end of speech at the very first frame (every codebook-0 draw is EOS): nothing to say and nothing
    failed, so a 200 with no samples (pcm: empty; wav: its header alone; mp3: a stream of nothing), never a 500
    "the engine failed: None"; the server goes on serving."""
    from qtts_lib.runtime.pipeline.sampling import Sampler

    engine, url, paced = serve()
    paced.run_free()
    monkeypatch.setattr(Sampler, "first", lambda self, logits, generated: self.eos_id)
    for fmt, check in (("pcm", lambda body: body == b""), ("wav", lambda body: len(body) == 44),
                       ("mp3", lambda body: len(body) < 2000)):
        status, headers, body = request(url, "/v1/audio/speech", speech(response_format=fmt))
        assert status == 200 and check(body) and "x-seed" in {k.lower() for k in headers}, (fmt, status, body[:200])
    status, _, body = request(url, "/v1/audio/speech", speech(stream_format="sse"))
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 0
    monkeypatch.undo()
    status, _, body = request(url, "/v1/audio/speech", speech())
    assert status == 200 and len(body) > 0 and engine.status().served == 5


def metric(url: str, name: str) -> float:
    text = request(url, "/metrics")[2].decode()
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_health_and_metrics_tell_waiting_from_speaking(serve):
    """One batch place: A speaks; B comes and is started by the engine (its first segment in the scheduler's queue,
    the batch full). /health says one speaking and one waiting, and qtts_queue_depth reads 1: B is not counted
    as speaking while it waits for the batch."""
    engine, url, paced = serve(max_batch=1, queue_places=2, max_frames=40)
    a = post(url, speech(PARAGRAPH))
    a_out = {}
    threading.Thread(target=lambda: a_out.setdefault("r", a.getresponse()), daemon=True).start()
    paced.allow(3)
    paced.wait_for(3)
    b = post(url, speech())
    until(lambda: places(engine) == 2, what="B given a place")
    steps = paced.done
    paced.allow()  # the engine takes B from its inbox before this step: B's utterance waits in the scheduler
    paced.wait_for(steps + 1)
    until(lambda: engine.status().started == 2, what="B started")
    health = json.loads(request(url, "/health")[2])
    assert (health["speaking"], health["waiting"], health["batch"]) == (1, 1, 1), health
    assert metric(url, "qtts_queue_depth") == 1 and metric(url, "qtts_requests_speaking") == 1
    paced.run_free()
    until(lambda: "r" in a_out, what="A's answer")
    assert a_out["r"].read() and b.getresponse().read()
    health = json.loads(request(url, "/health")[2])
    assert (health["speaking"], health["waiting"]) == (0, 0)


def test_the_engine_sleeps_while_every_text_waits_for_its_reader(serve):
    """A client reads a little and stops (small socket buffers): its unread audio passes the backlog, its text is
    held, and nothing is left to step. The engine thread then blocks until there is work: over a second it makes
    no step at all (it spun through empty steps before). When the client reads again, the engine wakes and the
    text is spoken to its end."""
    engine, url, paced = serve(max_batch=2, max_frames=30, chunk_frames=2, backlog_seconds=0.5, send_timeout=120,
                               send_buffer=4096)
    text = PARAGRAPH * 3
    segments = len(plan(engine.synth, text, max_frames=30))
    assert segments >= 2
    paced.run_free()
    a = post(url, speech(text), rcvbuf=4096)
    response = a.getresponse()
    assert response.status == 200 and response.read(64)

    def settled() -> bool:  # held with nothing to step, and no step for half a second (a spinning engine never is)
        if not (engine.status().held == 1 and engine.status().batch == 0):
            return False
        before = paced.done
        time.sleep(0.5)
        return paced.done == before and engine.status().held == 1

    until(settled, timeout=300, what="the text held with nothing to step")
    steps = paced.done
    time.sleep(1.0)
    assert paced.done - steps <= 1, f"{paced.done - steps} steps while every text was held"
    body = response.read()  # the client reads again: the engine wakes and finishes the text
    assert len(body) > 0 and engine.status().served == 1 and places(engine) == 0
    a.close()


class _Paused(dict):
    """A dict whose iteration runs `during` after its first item: the builder thread writing while a request reads,
    made to happen at one exact point."""

    during = staticmethod(lambda: None)

    def items(self):
        for i, item in enumerate(dict.items(self)):
            yield item
            if i == 0:
                during, self.during = self.during, lambda: None  # once
                during()


def test_voice_ids_are_read_while_the_builder_writes_them(tmp_path):
    """`Voices.by_id` (a request, on the event loop) walks the ids while the builder thread removes one (a delete)
    or adds one (an upload): the reader sees one version whole, never "dictionary changed size during iteration"."""
    synth = types.SimpleNamespace(kind="base", speakers=[])
    voices = Voices(synth, tmp_path, log=lambda m: None)
    try:
        voices.ids = _Paused(alice="voice_a", bob="voice_b", carol="voice_c")
        voices.ids.during = lambda: voices._delete("bob")
        assert voices.by_id() == {"voice_a": "alice", "voice_b": "bob", "voice_c": "carol"}
        assert voices.by_id() == {"voice_a": "alice", "voice_c": "carol"}
    finally:
        voices.close()


def test_a_reader_that_catches_up_wakes_the_engine():
    """`Job.held` (engine thread) and the job's iteration (event loop): a job held for its backlog wakes the engine
    once, when a piece taken brings the backlog back under the limit, and not before."""
    import asyncio

    import numpy as np

    woken = []

    async def run():
        engine = types.SimpleNamespace(inbox=types.SimpleNamespace(put=woken.append))
        job = Job(engine, None, None, [], asyncio.get_running_loop())
        for _ in range(3):
            job.send("audio", np.zeros(100, np.float32))
        await asyncio.sleep(0)
        assert job.held(150) and job.backlog == 300
        await anext(job)
        assert woken == []  # 200 left: still over
        await anext(job)
        assert woken == [None]  # 100: under, the engine is woken
        await anext(job)
        assert woken == [None] and not job.held(150)

    asyncio.run(run())


def stalled(url: str, path: str = "/v1/audio/speech"):
    """A raw connection that sends its headers and 10 of the 100 body bytes it announced, then nothing."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                 .encode() + b'{"input": ')
    return sock


def answer_of(sock) -> bytes:
    """Everything the server sends until it closes the connection (a timeout if it never does)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@pytest.fixture
def served_app(synth, tmp_path):
    """(url, engine) of an app with a 1-second body timeout, served with the connection limit `qtts serve` sets by
    default (max batch + queue + 32)."""
    from serving import CKPT, InProcess, alice_folder

    voices = alice_folder(tmp_path)
    store = Voices(synth, voices, log=lambda m: None)
    store.preload()
    engine = Engine(synth, max_frames=6, chunk_frames=2, queue_places=2, max_batch=2)
    http_server = InProcess(build_app(engine, store, CKPT, body_timeout=1.0),
                            limit_concurrency=engine.max_batch + engine.queue_places + 32)
    yield http_server.url, engine
    engine.stop()
    engine.thread.join(60)
    http_server.stop()
    store.close()


def test_a_stalled_body_is_dropped(served_app):
    """A client sends part of its body and stalls: after the body timeout it gets a 408 that names the stall and
    its connection is closed (recv sees the end); an upload that stalls is dropped the same way."""
    url, _ = served_app
    for path in ("/v1/audio/speech", "/v1/voices"):
        sock = stalled(url, path)
        answer = answer_of(sock)  # the socket's 30 s timeout raises if the server never closes it
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408") and b"sent nothing for 1 s" in answer, answer[:300]


def test_sixty_stalled_bodies_do_not_keep_health_from_answering(served_app):
    """60 stalled bodies, more than the server's connection limit (36 here): each is closed, with a 408 after the
    body timeout or uvicorn's 503 past its limit (which of the two depends on how many connections uvicorn had
    accepted when it parsed each request's headers: an order of events, not a property), so /health answers 200
    and a speech request is served."""
    url, engine = served_app
    socks = [stalled(url) for _ in range(60)]
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            try:
                status = request(url, "/health", timeout=5)[0]
            except OSError:
                status = None
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200
        assert request(url, "/v1/audio/speech", speech())[0] == 200
        answers = [answer_of(s) for s in socks]  # each closed by the server: 408, or uvicorn's 503 past its limit
        assert all(a.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for a in answers), [a[:40] for a in answers]
    finally:
        for s in socks:
            s.close()


def test_no_module_of_the_server_is_over_600_lines():
    """The server is its parts (engine, voice store, HTTP layer, schema, ...), each small enough to read whole."""
    from qtts_lib.runtime.app import server

    folder = paths.ROOT / "qtts_lib" / "runtime" / "app" / "server"
    assert Path(server.__file__).parent == folder
    sizes = {f.name: len(f.read_text(encoding="utf-8").splitlines()) for f in folder.glob("*.py")}
    assert {"engine.py", "voices.py", "http.py"} <= set(sizes) and max(sizes.values()) <= 600, sizes


def test_the_engine_sleeps_while_a_streamed_text_waits_for_its_next_words(synth):
    """A text streamed in (`speak_text`) whose first words have come: its segment starts and makes the frames those
    words allow, then waits for more text; the engine sleeps meanwhile (at most a step or two in a second), and wakes
    for the next delta."""
    import asyncio

    from qtts_lib.runtime.app.server.schema import Speech
    from qtts_lib.runtime.audio.wav import load_wav

    steps = []

    def counted(step):
        steps.append(time.monotonic())
        return step()

    engine = Engine(synth, max_frames=40, chunk_frames=2, queue_places=1, max_batch=2, admit="all",
                    around_step=counted, log=lambda m: None)
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    speech = Speech(text=None, format="pcm", language="english", voice=None, sampling=synth.sampling.replace(seed=3),
                    instructions=None)

    async def run():
        job = await engine.speak_text(speech, voice)
        try:
            job.feed("Good morning to ")
            first = await asyncio.wait_for(anext(job), 120)  # the first words' frames
            await asyncio.sleep(1.0)
            while not job.out.empty():
                job.out.get_nowait()
            before = len(steps)
            await asyncio.sleep(1.0)
            idle = len(steps) - before
            job.feed("all of you, and welcome back.")
            job.finish()
            rest = [item async for item in job]
            return first, idle, rest
        finally:
            job.close()

    try:
        first, idle, rest = asyncio.run(run())
    finally:
        engine.stop()
        engine.thread.join(60)
    assert len(first) > 0 and idle <= 2, f"{idle} steps in a second while the text waited"
    assert any(len(x) for x in rest if hasattr(x, "__len__"))
