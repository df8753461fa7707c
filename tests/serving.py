"""A real `qtts serve` process for the server tests (test_server*.py): started on a free port with torch blocked,
two voice clips (alice: x-vector, bob: ICL), its log in a file; and a plain HTTP client."""
import io
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from qtts_lib import paths
from qtts_lib.isolation import PRELUDE
from qtts_lib.runtime.audio.encode import COMPRESSED  # noqa: F401 - the tests' list of compressed formats

CKPT = "tiny-base"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def request(url: str, path: str, body=None, method: str | None = None, read: int = -1, timeout: float = 60,
            headers: dict | None = None):
    """(status, headers, body bytes); `read` > 0 reads that many bytes and hangs up."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} | (headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read(read) if read > 0 else r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def alice_folder(tmp_path) -> Path:
    """tmp_path/voices holding alice (the committed clip, an x-vector voice): the in-process servers' voices."""
    voices = tmp_path / "voices"
    voices.mkdir(exist_ok=True)
    shutil.copy(paths.voice_wav(), voices / "alice.wav")
    return voices


def start_server(tmp_path, *extra, ckpt: str = CKPT, env: dict | None = None):
    """A `qtts serve` process over alice and bob: (process, url) once it answers. `--admit all` unless `extra` says
    otherwise: the tests hold what a request gets, not how many a loaded machine speaks at once in real time
    (tests/test_server_admission.py holds that)."""
    voices = alice_folder(tmp_path)
    shutil.copy(paths.voice_wav(), voices / "bob.wav")
    shutil.copy(paths.INPUTS / "voice.txt", voices / "bob.txt")   # bob clones in ICL mode
    port = free_port()
    log = open(tmp_path / "server.log", "w")  # a file, not a pipe nobody reads (a full pipe blocks the server)
    code = "from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + code, "serve", "--checkpoint", str(paths.model_dir(ckpt)),
                             "--port", str(port), "--voices", str(voices), "--threads", "2",
                             *([] if "--admit" in extra else ["--admit", "all"]), *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {(tmp_path / 'server.log').read_text()}")
        try:
            if request(url, "/health", timeout=2)[0] == 200:
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not come up")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()




# What a decoder gives beyond the samples sent: LAME's and AAC's priming samples and last frame's padding (Ogg Opus
# says its pre-skip and end in the container, FLAC is exact). Measured: +1344 (mp3) and +1408 (aac) for 21120.
PADDING = {"mp3": 2 * 1152, "aac": 2 * 1024, "opus": 0, "flac": 0}
MAGIC = {"mp3": (b"ID3", b"\xff\xf3", b"\xff\xfb"), "opus": (b"OggS",), "aac": (b"\xff\xf1", b"\xff\xf9"),
         "flac": (b"fLaC",), "wav": (b"RIFF",)}


def decoded(body: bytes) -> tuple[np.ndarray, int, str]:
    """A compressed body's samples (PyAV, FFmpeg's decoders), their rate and the codec: what a player hears."""
    import av

    with av.open(io.BytesIO(body)) as container:
        stream = container.streams.audio[0]
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
        return samples, stream.codec_context.sample_rate, stream.codec_context.name


def samples_at_24k(fmt: str, body: bytes) -> int:
    """How many 24 kHz samples a body of `fmt` decodes to (Opus decodes at 48 kHz)."""
    samples, rate, _ = decoded(body)
    assert rate in (24000, 48000) and body.startswith(MAGIC[fmt]), (fmt, rate, body[:8])
    return len(samples) * 24000 // rate


class InProcess:
    """An app served by uvicorn on a thread of this process, on a free port: the server tests that need to reach
    into the engine (stop it, break it, pace it) run their server this way. `send_buffer`: the listening socket's
    SO_SNDBUF (inherited by each connection), small to feel a client that stops reading at once."""

    def __init__(self, app, send_buffer: int | None = None, limit_concurrency: int | None = None):
        import threading

        import uvicorn

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical", limit_concurrency=limit_concurrency))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class Served:
    """Engines served in this process, each on an `InProcess` server and paced by a `Paced`: `start` makes one and
    returns (engine, url, paced); `stop` ends every one made (a fixture's teardown)."""

    def __init__(self, synth):
        self.synth, self.made = synth, []

    def start(self, voices, send_timeout: float | None = None, send_buffer: int | None = None, **options):
        """A server over the voices folder `voices` (its store: `self.voices`, the latest made) and an engine with
        `options`; paced steps never trip the engine's watchdog or deadlines (both off unless `options` set them),
        and every request with a place is started (`admit="all"`, unless `options` say otherwise)."""
        from qtts_lib.runtime.app.server.engine import Engine
        from qtts_lib.runtime.app.server.http import build_app
        from qtts_lib.runtime.app.server.reply import SEND_TIMEOUT
        from qtts_lib.runtime.app.server.voices import Voices

        self.voices = Voices(self.synth, voices, log=lambda m: None)
        self.voices.preload()
        paced = Paced()
        engine = Engine(self.synth, around_step=paced,
                        **({"stall_seconds": None, "deadline_margin": None, "admit": "all"} | options))
        app = build_app(engine, self.voices, CKPT, send_timeout=SEND_TIMEOUT if send_timeout is None else send_timeout)
        http_server = InProcess(app, send_buffer=send_buffer)
        self.made.append((engine, paced, http_server, self.voices))
        return engine, http_server.url, paced

    def stop(self) -> None:
        for engine, paced, http_server, voices in self.made:
            paced.run_free()
            engine.stop()
            engine.thread.join(60)
            http_server.stop()
            voices.close()


class Paced:
    """An engine's `around_step`: each step waits until the test allows it (`allow`), and the test can wait until a
    number of steps are done (`wait_for`), make the next one raise (`fail_with`), or see each step's events
    (`on_events`)."""

    def __init__(self):
        import threading

        self.cond = threading.Condition()
        self.allowed, self.done, self.error, self.free = 0, 0, None, False
        self.on_events = None

    def __call__(self, step):
        with self.cond:
            self.cond.wait_for(lambda: self.free or self.allowed > 0 or self.error is not None)
            if self.error is not None:
                raise self.error
            self.allowed -= 1
        events = step()
        if self.on_events is not None:
            self.on_events(events)
        with self.cond:
            self.done += 1
            self.cond.notify_all()
        return events

    def allow(self, steps: int = 1) -> None:
        with self.cond:
            self.allowed += steps
            self.cond.notify_all()

    def run_free(self) -> None:
        with self.cond:
            self.free = True
            self.cond.notify_all()

    def wait_for(self, steps: int, timeout: float = 120) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.done >= steps, timeout):
                raise TimeoutError(f"the engine made {self.done} steps, not {steps}")

    def fail_with(self, error: BaseException) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()


def until(condition, timeout: float = 60, what: str = "a condition") -> None:
    """Wait until `condition()` holds (polled); a bound on the wait, not a timing to assert."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come within {timeout:.0f} s")
        time.sleep(0.02)


def post(url: str, body: dict, rcvbuf: int | None = None, timeout: float = 120):
    """A speech request on a raw connection: (the connection, its response once the status line is in). The caller
    reads or closes it."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    if rcvbuf:
        conn.sock = socket.create_connection((u.hostname, u.port), timeout)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    conn.request("POST", "/v1/audio/speech", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return conn


def hang_up(conn) -> None:
    """Close a connection as a client that leaves does (shut down first: a thread blocked reading it wakes up, and the
    server sees the end at once)."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


PARAGRAPH = ("The tutorial ports a speech model to a small runtime. Each chapter checks one claim against the "
             "reference, and every number lands in a report. Long texts are cut into sentences, packed into "
             "segments, and spoken one segment at a time with the same voice. ")


def speech(text: str = "Hello there.", **fields) -> dict:
    """A speech request's body in the voice alice (the `serve` fixture's), as pcm."""
    return {"input": text, "voice": "alice", "response_format": "pcm"} | fields


def places(engine) -> int:
    """The places an engine's requests hold: speaking and waiting (its `status`)."""
    status = engine.status()
    return status.speaking + status.waiting
