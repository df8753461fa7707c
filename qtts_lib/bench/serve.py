"""`qtts serve` under load: N streaming clients against a real server process. Introduced in 18.

    python -m qtts_lib.bench serve --checkpoint full-base --precision int8 --threads 2 -o data/bench/serve/NAME.json
    python -m qtts_lib.bench serve ... --admit all      # the server starts every request that has a place
    python -m qtts_lib.bench serve ... --tree /tmp/before --admit none   # another source tree's server

The server is `qtts serve` started as a subprocess from `--tree` (default: this one), so the same bench drives any
version of the code that has that command (`--admit none` passes no `--admit`, for a tree whose server has none).
Every scenario sends texts of a few sentences (two segments each: a request that continues) as streamed 16-bit
PCM, each client on its own connection, reading every chunk as it comes:

- N clients at once, N = 1, 2, 4, 8 (`--clients`);
- N clients arriving `--stagger` seconds apart (`--staggered`): requests join the running streams and leave them.

Before the server starts, the runtime library times its own streamed first piece in this process
(`library_first_audio`: `pipeline.longform.stream_long`, what the server streams, on one sentence with the same
checkpoint, precision, codec precision, threads and piece size; the median of a few runs after one untimed), so the
server's first audio is held against the library's on the same machine in the same run (this tree's library, also
when `--tree` serves another's).

Per scenario, over the streams the server admitted (answered 200):

- first audio (request sent -> first audio chunk in) p50/p99/max: a request that waited for a place among the
  streams waited inside it, so these are also the admitted requests' waits;
- a playback model: each client starts playing at its first audio chunk; when a later chunk comes in, the audio of
  the chunks before it must cover the time since playback started, and a stream's `underrun_ms` is its largest
  shortfall (0: it never ran dry; `dry_at_ms`: the audio played by then, which says where in the stream it waited);
  `ran_dry` counts the streams whose underrun is over UNDERRUN_TOLERANCE_MS (1 ms);
- the gaps between two audio chunks p50/p99/max and each stream's longest gap, against a full piece's duration
  (`piece_ms`, `--chunk-frames` x 80 ms; a stream's first pieces are shorter);
- the audio delivered per second (seconds of audio all clients received over the scenario's wall time, its first
  request sent to its last audio in) and its ratio to the "1 at once" scenario's of the same run, and the real-time
  factor (the inverse of the first);
- refusals (a 503 `overloaded` with Retry-After, the server's answer to a request that found no place or waited
  `--max-wait` seconds: counted apart from errors, with the Retry-After each carried and the time it took) and
  errors (any other status, a 503 of a stopped engine among them, or a stream cut off).

The result also keeps the machine and its load average before the run, the server's options (`--admit` and
`--max-wait` among them) and the streams its start measured it can speak in real time (its log's line).

The bars the server is held to: no admitted stream runs dry after its first piece at 1, 2, 4 and 8 clients, at
least one stream always admitted, the audio delivered per second at least 0.9x the "1 at once" scenario's, and one
client's first audio p50 within 30 ms of the library's.
"""
from __future__ import annotations

import gc
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from .machine import describe
from .workload import voice_wav

SENTENCES = [
    "The morning train left the station a little after six, and most of the seats were still empty.",
    "A woman by the window read the same page of her book three times before she gave up and watched the fields.",
    "At the second stop a boy with a violin case sat down across from her and smiled as if they had met before.",
    "Neither of them said a word until the river came into view, wide and grey under a sky that promised rain.",
    "Then he asked whether she knew the name of the bridge, and she told him it had no name at all.",
    "He laughed, opened the case, and played a tune so quiet that only the two of them could hear it.",
]
SAMPLE_RATE = 24000
PIECE_SAMPLES = 1920           # samples in one frame at 24 kHz
UNDERRUN_TOLERANCE_MS = 1.0    # a stream whose playback fell short by more than this ran dry
LIBRARY_REPEATS = 5            # timed runs of the library's first piece (after one untimed)
FIRST_AUDIO_BAR_MS = 30.0      # one client's first audio p50 may exceed the library's by this much
TEXT_FIRST_AUDIO_BAR_MS = 50.0  # the WebSocket's first audio from streamed text, likewise


def texts(n: int) -> list[str]:
    """n texts of four sentences each (about 90 tokens: two segments), each starting at another sentence."""
    return [" ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(4)) for i in range(n)]


class Client:
    """One streaming request on a raw socket: the HTTP/1.1 chunked body parsed here, so that each chunk the
    server sent (one piece of audio) is timed when it has all come in. A 503 is a refusal (`refused`, with its
    `retry_after`), not an error."""

    def __init__(self, host: str, port: int, body: dict):
        self.host, self.port, self.body = host, port, body
        self.status, self.error, self.sent, self.answered = None, None, None, None
        self.refused, self.retry_after = False, None
        self.chunks: list[float] = []   # when each audio chunk had all come in (perf_counter)
        self.sizes: list[int] = []      # its samples
        self.samples = 0

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - a failed stream is a result of the bench, not its end
            self.error = repr(e)

    def _run(self) -> None:
        payload = json.dumps(self.body).encode()
        with socket.create_connection((self.host, self.port), timeout=600) as s:
            f = s.makefile("rb")
            self.sent = time.perf_counter()
            s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
            self.status = int(f.readline().split()[1])
            self.answered = time.perf_counter()
            headers = {}
            while (line := f.readline().strip()):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            if self.status != 200:
                body = f.read(int(headers.get("content-length", 0)) or 400)
                if self.status == 503 and error_code(body) in ("overloaded", None) and "retry-after" in headers:
                    self.refused, self.retry_after = True, retry_after_of(headers["retry-after"])
                else:  # a stopped or failed engine answers 503 too: an error, not a refusal
                    self.error = f"status {self.status}: {body[:400]!r}"
                return
            if headers.get("transfer-encoding") != "chunked":
                raise ValueError(f"not a chunked stream: {headers}")
            while True:
                size_line = f.readline()
                if not size_line:
                    raise ConnectionError("the stream was cut off (no last chunk)")
                size = int(size_line.split(b";")[0], 16)
                data = f.read(size + 2)[:size] if size else f.read(2)
                if size == 0:
                    return
                if len(data) < size:
                    raise ConnectionError("the stream was cut off mid-chunk")
                self.chunks.append(time.perf_counter())
                self.sizes.append(size // 2)
                self.samples += size // 2

    @property
    def admitted(self) -> bool:
        return self.status == 200

    @property
    def ttfa(self) -> float | None:
        return self.chunks[0] - self.sent if self.chunks else None

    @property
    def gaps(self) -> list[float]:
        return list(np.diff(self.chunks)) if len(self.chunks) > 1 else []

    @property
    def underrun(self) -> float | None:
        """Seconds the playback model ran dry at most (`underrun`); None without audio."""
        return underrun(self.chunks, self.sizes) if self.chunks else None

    @property
    def dry_at(self) -> float | None:
        """Seconds of audio played when the playback model ran driest (`ran_dry`); None if it never did."""
        return ran_dry(self.chunks, self.sizes)[1]


def retry_after_of(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def error_code(body: bytes) -> str | None:
    """The `code` of an OpenAI-style JSON error body (`overloaded`: the server's refusal), None if it has none."""
    try:
        return (json.loads(body).get("error") or {}).get("code")
    except (ValueError, AttributeError):
        return None


def underrun(times, samples, rate: int = SAMPLE_RATE) -> float:
    """The playback model: playing starts when the first chunk is in (`times[0]`); when chunk k comes in, the audio
    of chunks 0..k-1 must cover the time since then. The largest shortfall in seconds (0: never ran dry)."""
    return ran_dry(times, samples, rate)[0]


def ran_dry(times, samples, rate: int = SAMPLE_RATE) -> tuple[float, float | None]:
    """`underrun`'s shortfall, and the seconds of audio played when it was largest (None: never ran dry): where in
    the stream the client waited (within the first piece, at a segment's start, ...)."""
    if len(times) < 2:
        return 0.0, None
    t = np.asarray(times, np.float64)
    before = np.cumsum(np.asarray(samples, np.float64))[:-1] / rate   # audio in before chunk k, k = 1..
    short = (t[1:] - t[0]) - before
    k = int(np.argmax(short))
    return (float(short[k]), float(before[k])) if short[k] > 0 else (0.0, None)


def percentiles(values, scale: float = 1000.0) -> dict:
    if not len(values):
        return {"p50": None, "p99": None, "max": None}
    v = np.asarray(values, np.float64) * scale
    return {"p50": round(float(np.percentile(v, 50)), 1), "p99": round(float(np.percentile(v, 99)), 1),
            "max": round(float(v.max()), 1)}


def scenario(host: str, port: int, n: int, stagger: float, chunk_frames: int, seed0: int = 0) -> dict:
    """n clients (every `stagger` seconds, or at once), each its own text; what they saw."""
    clients = [Client(host, port, {"input": text, "voice": "bench", "response_format": "pcm", "seed": seed0 + i})
               for i, text in enumerate(texts(n))]
    threads = [threading.Thread(target=c.run) for c in clients]
    t0 = time.perf_counter()
    for i, t in enumerate(threads):
        if stagger and i:
            time.sleep(max(0.0, t0 + i * stagger - time.perf_counter()))
        t.start()
    for t in threads:
        t.join()
    spoke = [c for c in clients if c.chunks]
    wall = max(c.chunks[-1] for c in spoke) - t0 if spoke else None
    audio = sum(c.samples for c in clients) / SAMPLE_RATE
    gaps = [g for c in spoke for g in c.gaps]
    longest = [max(c.gaps) for c in spoke if c.gaps]
    underruns = [c.underrun for c in spoke]
    gap = percentiles(gaps)
    refused = [c for c in clients if c.refused]
    return {
        "name": f"{n} staggered {stagger:g} s" if stagger else f"{n} at once", "clients": n, "stagger_s": stagger,
        "admitted": sum(c.admitted for c in clients), "refused": len(refused),
        "retry_after_s": [c.retry_after for c in refused],
        "refused_after_ms": percentiles([c.answered - c.sent for c in refused]),
        "ttfa_ms": percentiles([c.ttfa for c in spoke]),
        "underrun_ms": percentiles(underruns),
        "ran_dry": sum(u * 1000 > UNDERRUN_TOLERANCE_MS for u in underruns),
        "gap_ms": gap, "longest_gap_ms": percentiles(longest),
        "gap_p99_over_p50": round(gap["p99"] / gap["p50"], 2) if gap["p50"] else None,
        "piece_ms": chunk_frames * 80.0,
        "delivered_audio_per_s": round(audio / wall, 3) if wall else None,
        "rtf": round(wall / audio, 3) if audio else None, "audio_s": round(audio, 1),
        "wall_s": round(wall, 1) if wall is not None else None,
        "errors": [c.error for c in clients if c.error],
        "per_client": [{"status": c.status, "refused": c.refused, "retry_after_s": c.retry_after,
                        "ttfa_ms": round(c.ttfa * 1000, 1) if c.ttfa is not None else None,
                        "underrun_ms": round(c.underrun * 1000, 1) if c.chunks else None,
                        "dry_at_ms": round(c.dry_at * 1000, 1) if c.dry_at is not None else None,
                        "longest_gap_ms": round(max(c.gaps) * 1000, 1) if c.gaps else None,
                        "audio_s": round(c.samples / SAMPLE_RATE, 2), "chunks": len(c.chunks)}
                       for c in clients],
    }


def streamed_text_first_audio(port: int, repeats: int, chunk_frames: int) -> dict:
    """The WebSocket's first audio from streamed text (`runtime.app.server.live`), alone on the server: speech.start,
    SENTENCES[0] in deltas of four words, then text.done, the message that decides the text's one segment; from
    sending it to the first audio delta in. One run untimed, then `repeats` timed."""
    import json as _json

    import websocket

    times = []
    pieces = [" ".join(SENTENCES[0].split(" ")[i:i + 4]) + " " for i in range(0, len(SENTENCES[0].split(" ")), 4)]
    for i in range(max(1, repeats) + 1):
        ws = websocket.create_connection(f"ws://127.0.0.1:{port}/v1/audio/speech/stream", timeout=600)
        try:
            ws.send(_json.dumps({"type": "speech.start", "voice": "bench", "response_format": "pcm", "seed": i}))
            for piece in pieces:
                ws.send(_json.dumps({"type": "text.delta", "text": piece}))
            t0 = time.perf_counter()
            ws.send(_json.dumps({"type": "text.done"}))
            while (message := _json.loads(ws.recv()))["type"] != "speech.audio.delta":
                if message["type"] == "error":
                    raise RuntimeError(f"the WebSocket answered an error: {message['error']}")
            if i:
                times.append(time.perf_counter() - t0)
            while message["type"] != "speech.audio.done":  # to its end: the next one finds its place free
                if (message := _json.loads(ws.recv()))["type"] == "error":
                    raise RuntimeError(f"the WebSocket answered an error: {message['error']}")
        finally:
            ws.close()
    return {"p50_ms": round(statistics.median(times) * 1000, 1), "ms": [round(t * 1000, 1) for t in times],
            "text": SENTENCES[0], "from": "text.done sent", "to": "first speech.audio.delta in"}


def add_delivered_ratio(rows: list[dict]) -> None:
    """Each scenario's audio delivered per second over the "1 at once" scenario's (None without that one)."""
    alone = next((r["delivered_audio_per_s"] for r in rows if r["name"] == "1 at once"), None)
    for r in rows:
        ours = r["delivered_audio_per_s"]
        r["delivered_ratio"] = round(ours / alone, 3) if alone and ours is not None else None


def library_first_audio(model_dir: Path, threads: int, precision: str, codec_precision: str, chunk_frames: int,
                        max_frames: int, repeats: int = LIBRARY_REPEATS) -> dict:
    """The runtime library's streamed first audio in this process: `longform.stream_long` (the server's streaming
    path, its first piece one frame) on SENTENCES[0] with the bench's voice, from the call to its first piece, the
    voice built before; one run untimed, then `repeats` timed. The synthesizer is freed, and this thread's OpenMP
    workers with it, before the server starts."""
    from ..runtime.audio.clips import read_voice_clip
    from ..runtime.binding.net import release_threads
    from ..runtime.pipeline.longform import stream_long
    from ..runtime.pipeline.synthesizer import Synthesizer

    synth = Synthesizer(model_dir, threads=threads, precision=precision, codec_precision=codec_precision)
    try:
        voice = synth.voice(wav=read_voice_clip(voice_wav()).wav)
        times = []
        for i in range(max(1, repeats) + 1):
            t0 = time.perf_counter()
            pieces = stream_long(synth, SENTENCES[0], "english", voice, synth.sampling.replace(seed=i),
                                 max_frames=max_frames, chunk_frames=chunk_frames)
            try:
                first = next(pieces)
                seconds = time.perf_counter() - t0
            finally:
                pieces.close()
            if i:
                times.append(seconds)
    finally:
        synth.close()
        del synth
        gc.collect()
        release_threads()
    return {"p50_ms": round(statistics.median(times) * 1000, 1), "ms": [round(t * 1000, 1) for t in times],
            "first_piece_samples": len(first), "text": SENTENCES[0], "path": "pipeline.longform.stream_long"}


def tree_commit(tree: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or None
    except OSError:
        return None


def start_server(model_dir: Path, tree: Path, python: str, args: list[str], log: Path) -> tuple[subprocess.Popen, int]:
    """`qtts serve` from `tree` on a free port, its log in `log`; returns once /health answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from qtts_lib.runtime.app.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen([python, "-c", code, str(tree), "serve", "--checkpoint", str(model_dir), "--port",
                             str(port), *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 1800  # a first int8 run writes the tier's files
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                if b" 200 " in s.recv(64):
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not come up")


def stop_server(proc: subprocess.Popen) -> None:
    """Ask the server to stop; kill it if it has not within 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def server_huge_pages(pid: int) -> bool | None:
    """Whether the server runs with its weights in huge pages (`runtime.app.hugepages`: it starts itself again with
    glibc's tunable where it can), from its environment; None where it cannot be read."""
    from ..runtime.app import hugepages

    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return hugepages.asked(dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x))


def server_capacity(log_text: str) -> str | None:
    """The server log's line on the streams it speaks in real time (`capacity.Capacity.describe`), if any."""
    found = re.findall(r"^(?:qtts serve: )?(\d+ stream\(s\) at once in real time.*)$", log_text, re.M)
    return found[-1] if found else None


def benchmark(model_dir: Path, threads: int = 2, precision: str = "fp32", codec_precision: str = "fp32",
              clients: tuple[int, ...] = (1, 2, 4, 8), staggered: tuple[int, ...] = (8,), stagger: float = 2.0,
              max_batch: int = 4, max_frames: int = 100, chunk_frames: int = 4, tree: Path | None = None,
              python: str | None = None, warmup: bool = True, admit: str | None = "realtime",
              max_wait: float | None = None, queue: int | None = None,
              library_repeats: int = LIBRARY_REPEATS, streamed_text: bool = True) -> dict:
    """Every scenario against one server process, after the library's first audio in this process (module
    docstring). `admit` None / `max_wait` None pass no --admit / --max-wait (the server's default); `queue` None:
    room for every client; `streamed_text`: also time the WebSocket's first audio from streamed text (a server
    that has it)."""
    load_start = [round(x, 2) for x in os.getloadavg()]
    tree = Path(tree or Path(__file__).resolve().parents[2]).resolve()
    model_dir = Path(model_dir).resolve()
    python = python or sys.executable
    machine = describe([threads])
    library = library_first_audio(model_dir, threads, precision, codec_precision, chunk_frames, max_frames,
                                  library_repeats)
    queue = max(8, max(clients + staggered)) if queue is None else queue
    options = ["--threads", str(threads), "--precision", precision, "--codec-precision", codec_precision,
               "--max-batch", str(max_batch), "--max-frames", str(max_frames), "--chunk-frames", str(chunk_frames),
               "--queue", str(queue)]
    options += ["--admit", admit] if admit else []
    options += ["--max-wait", f"{max_wait:g}"] if max_wait is not None else []
    with tempfile.TemporaryDirectory() as tmp:
        voices = Path(tmp) / "voices"
        voices.mkdir()
        shutil.copy(voice_wav(), voices / "bench.wav")
        log = Path(tmp) / "server.log"
        proc, port = start_server(model_dir, tree, python, ["--voices", str(voices), *options], log)
        huge_pages = server_huge_pages(proc.pid)
        try:
            if warmup:  # one request first: the voice, the allocator's pools and the pages at working size
                scenario("127.0.0.1", port, 1, 0.0, chunk_frames, seed0=100)
            rows = [scenario("127.0.0.1", port, n, 0.0, chunk_frames) for n in clients]
            rows += [scenario("127.0.0.1", port, n, stagger, chunk_frames) for n in staggered]
            text = streamed_text_first_audio(port, library_repeats, chunk_frames) if streamed_text else None
        finally:
            stop_server(proc)
            log_text = log.read_text()
    add_delivered_ratio(rows)
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    one = next((r["ttfa_ms"]["p50"] for r in rows if r["name"] == "1 at once"), None)
    return {"machine": machine, "load_average_start": load_start, "checkpoint": model_dir.name, "threads": threads,
            "precision": precision, "codec_precision": codec_precision, "max_batch": max_batch,
            "max_frames": max_frames, "chunk_frames": chunk_frames, "admit": admit, "max_wait": max_wait,
            "queue": queue, "server_options": options, "server_capacity": server_capacity(log_text),
            "huge_pages": huge_pages, "tree": str(tree), "commit": tree_commit(tree),
            "underrun_tolerance_ms": UNDERRUN_TOLERANCE_MS, "library_first_audio": library,
            "first_audio_over_library_ms": round(one - library["p50_ms"], 1) if one is not None else None,
            "streamed_text_first_audio": text,
            "streamed_text_over_library_ms": round(text["p50_ms"] - library["p50_ms"], 1) if text else None,
            "scenarios": rows,
            "server_log_tail": log_text[-4000:] if any(r["errors"] for r in rows) else ""}


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _v(v) -> str:
    return "-" if v is None else str(v)


def table(result: dict) -> str:
    """The scenarios as a text table (what the bench prints); a field an older result lacks shows as -."""
    machine, library = result["machine"], result.get("library_first_audio") or {}
    lines = [f"{result.get('checkpoint')} {result.get('precision')} (codec {result.get('codec_precision')}), "
             f"{result.get('threads')} threads, max batch {result.get('max_batch')}, admit {_v(result.get('admit'))}"
             f"; {machine.get('cpu')}, {machine.get('cores')} cores, load average before "
             f"{result.get('load_average_start', machine.get('load_average'))}"]
    if result.get("server_capacity"):
        lines.append(f"server: {result['server_capacity']}")
    lines.append(f"library first audio p50 {_ms(library.get('p50_ms'))} ms; the server's, 1 client, minus it: "
                 f"{_v(result.get('first_audio_over_library_ms'))} ms (bar: {FIRST_AUDIO_BAR_MS:.0f}); from streamed "
                 f"text over the WebSocket, minus it: {_v(result.get('streamed_text_over_library_ms'))} ms (bar: "
                 f"{TEXT_FIRST_AUDIO_BAR_MS:.0f})")
    lines.append(f"{'scenario':<18} {'first audio p50/p99/max ms':>26} {'gap p50/p99/max ms':>20} "
                 f"{'longest/piece ms':>16} {'dry':>3} {'underrun':>8} {'admit':>5} {'refused':>8} {'err':>3} "
                 f"{'audio s/s':>9} {'ratio':>5} {'rtf':>6}")
    for r in result["scenarios"]:
        t, g, lg = r["ttfa_ms"], r["gap_ms"], r["longest_gap_ms"]
        under = (r.get("underrun_ms") or {}).get("max")
        after = [x for x in r.get("retry_after_s") or [] if x is not None]
        refused = _v(r.get("refused")) + (f"@{max(after):g}s" if after else "")
        lines.append(f"{r['name']:<18} {'/'.join(map(_ms, (t['p50'], t['p99'], t.get('max')))):>26} "
                     f"{'/'.join(map(_ms, (g['p50'], g['p99'], g['max']))):>20} "
                     f"{_ms(lg.get('max')) + '/' + _ms(r['piece_ms']):>16} {_v(r.get('ran_dry')):>3} "
                     f"{'-' if under is None else f'{under:.1f}':>8} {_v(r.get('admitted')):>5} {refused:>8} "
                     f"{len(r['errors']):>3} {_v(r.get('delivered_audio_per_s')):>9} "
                     f"{_v(r.get('delivered_ratio')):>5} {_v(r['rtf']):>6}")
    return "\n".join(lines)


def load_table(paths: list[Path]) -> list[dict]:
    """Rows for a figure or a table (chapter 18): one per scenario of each committed result, with its label
    ("before"/"after" from the file name, else the commit); a field an older result lacks is None."""
    rows = []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        label = "before" if "before" in Path(p).stem else "after" if "after" in Path(p).stem else (doc["commit"] or
                                                                                                   "")[:7]
        for r in doc["scenarios"]:
            rows.append({"run": label, "scenario": r["name"], "clients": r["clients"], "stagger_s": r["stagger_s"],
                         "admit": doc.get("admit"),
                         "ttfa_p50_ms": r["ttfa_ms"]["p50"], "ttfa_p99_ms": r["ttfa_ms"]["p99"],
                         "ttfa_max_ms": r["ttfa_ms"].get("max"),
                         "gap_p50_ms": r["gap_ms"]["p50"], "gap_p99_ms": r["gap_ms"]["p99"],
                         "gap_max_ms": r["gap_ms"]["max"], "longest_gap_p50_ms": r["longest_gap_ms"]["p50"],
                         "longest_gap_p99_ms": r["longest_gap_ms"]["p99"],
                         "longest_gap_max_ms": r["longest_gap_ms"].get("max"), "piece_ms": r["piece_ms"],
                         "gap_p99_over_p50": r["gap_p99_over_p50"], "rtf": r["rtf"],
                         "underrun_max_ms": (r.get("underrun_ms") or {}).get("max"), "ran_dry": r.get("ran_dry"),
                         "admitted": r.get("admitted"), "refused": r.get("refused"),
                         "delivered_audio_per_s": r.get("delivered_audio_per_s"),
                         "delivered_ratio": r.get("delivered_ratio"),
                         "library_first_audio_ms": (doc.get("library_first_audio") or {}).get("p50_ms"),
                         "errors": len(r["errors"])})
    return rows


def plot(paths: list[Path], ax=None):
    """The load table as a figure: per scenario, the p50 and p99 gap of a running stream before and after, against
    the piece's duration (chapter 18 draws it)."""
    import matplotlib.pyplot as plt

    rows = load_table(paths)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    ax = ax or plt.subplots(figsize=(9, 3.6))[1]
    width = 0.8 / max(len(runs), 1)
    for k, run in enumerate(runs):
        by = {r["scenario"]: r for r in rows if r["run"] == run}
        x = np.arange(len(scenarios)) + (k - (len(runs) - 1) / 2) * width
        p50 = [by[s]["gap_p50_ms"] if s in by else np.nan for s in scenarios]
        p99 = [by[s]["gap_p99_ms"] if s in by else np.nan for s in scenarios]
        ax.bar(x, p99, width, color=f"C{k}", alpha=0.35, label=f"{run}: p99")
        ax.bar(x, p50, width, color=f"C{k}", label=f"{run}: p50")
    piece = rows[0]["piece_ms"] if rows else 320
    ax.axhline(piece, color="grey", ls="--", lw=1, label="a piece's duration")
    ax.set(xticks=range(len(scenarios)), xticklabels=scenarios, yscale="log",
           ylabel="gap between audio pieces (ms)", title="a running stream's gaps under load")
    ax.legend(fontsize=8)
    return ax
