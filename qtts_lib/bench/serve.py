"""`qtts serve` under load: N streaming clients against a real server process. Introduced in 18.

    python -m qtts_lib.bench serve --checkpoint full-base --precision int8 --threads 2 -o data/bench/serve/NAME.json
    python -m qtts_lib.bench serve ... --tree /tmp/before     # the same load against another source tree's server

The server is `qtts serve` started as a subprocess from `--tree` (default: this one), so the same bench drives any
version of the code that has that command: a worktree of an older commit gives the "before" of a change. Every
scenario sends texts of a few sentences (two segments each: a request that continues) as streamed 16-bit PCM, each
client on its own connection, reading every chunk as it comes:

- N clients at once, N = 1, 2, 4, 8 (`--clients`): the batch fills, and past `--max-batch` requests queue;
- N clients arriving `--stagger` seconds apart (`--staggered`): requests join a running batch and leave it while
  the others stream.

Per scenario: time to first audio (request sent -> first audio chunk in) p50/p99; the gaps between two audio
chunks of a running stream (each HTTP chunk is one piece of `--chunk-frames` frames, or a segment's pause) p50,
p99 and max, and each stream's longest gap p50/p99, all against the piece's own duration (`piece_ms`: a gap longer
than that is a stream that outruns its audio); the aggregate real-time factor (the scenario's wall time over the
seconds of audio all clients received); errors (a status other than 200, a stream cut off). The target the server
is held to: a running stream's p99 gap at most twice its median while others join and leave (`gap_p99_over_p50`).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
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
PIECE_SAMPLES = 1920   # samples in one frame at 24 kHz


def texts(n: int) -> list[str]:
    """n texts of four sentences each (about 90 tokens: two segments), each starting at another sentence."""
    return [" ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(4)) for i in range(n)]


class Client:
    """One streaming request on a raw socket: the HTTP/1.1 chunked body parsed here, so that each chunk the
    server sent (one piece of audio) is timed when it has all come in."""

    def __init__(self, host: str, port: int, body: dict):
        self.host, self.port, self.body = host, port, body
        self.status, self.error, self.sent, self.chunks, self.samples = None, None, None, [], 0

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
            headers = {}
            while (line := f.readline().strip()):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            if self.status != 200:
                self.error = f"status {self.status}: {f.read(400)!r}"
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
                self.samples += size // 2

    @property
    def ttfa(self) -> float | None:
        return self.chunks[0] - self.sent if self.chunks else None

    @property
    def gaps(self) -> list[float]:
        return list(np.diff(self.chunks)) if len(self.chunks) > 1 else []


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
    wall = max((c.chunks[-1] if c.chunks else time.perf_counter()) for c in clients) - t0
    audio = sum(c.samples for c in clients) / 24000
    gaps = [g for c in clients for g in c.gaps]
    longest = [max(c.gaps) for c in clients if c.gaps]
    gap = percentiles(gaps)
    return {
        "name": f"{n} staggered {stagger:g} s" if stagger else f"{n} at once", "clients": n, "stagger_s": stagger,
        "ttfa_ms": percentiles([c.ttfa for c in clients if c.ttfa is not None]),
        "gap_ms": gap, "longest_gap_ms": percentiles(longest),
        "gap_p99_over_p50": round(gap["p99"] / gap["p50"], 2) if gap["p50"] else None,
        "piece_ms": chunk_frames * 80.0,
        "rtf": round(wall / audio, 3) if audio else None, "audio_s": round(audio, 1), "wall_s": round(wall, 1),
        "errors": [c.error for c in clients if c.error],
        "per_client": [{"ttfa_ms": round(c.ttfa * 1000, 1) if c.ttfa is not None else None,
                        "longest_gap_ms": round(max(c.gaps) * 1000, 1) if c.gaps else None,
                        "audio_s": round(c.samples / 24000, 2), "chunks": len(c.chunks), "status": c.status}
                       for c in clients],
    }


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


def server_huge_pages(pid: int) -> bool | None:
    """Whether the server runs with its weights in huge pages (`runtime.app.hugepages`: it starts itself again with
    glibc's tunable where it can), from its environment; None where it cannot be read."""
    from ..runtime.app import hugepages

    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return hugepages.asked(dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x))


def benchmark(model_dir: Path, threads: int = 2, precision: str = "fp32", codec_precision: str = "fp32",
              clients: tuple[int, ...] = (1, 2, 4, 8), staggered: tuple[int, ...] = (8,), stagger: float = 2.0,
              max_batch: int = 4, max_frames: int = 100, chunk_frames: int = 4, tree: Path | None = None,
              python: str | None = None, warmup: bool = True) -> dict:
    """Every scenario against one server process (module docstring)."""
    tree = Path(tree or Path(__file__).resolve().parents[2]).resolve()
    python = python or sys.executable
    machine = describe([threads])
    with tempfile.TemporaryDirectory() as tmp:
        voices = Path(tmp) / "voices"
        voices.mkdir()
        shutil.copy(voice_wav(), voices / "bench.wav")
        args = ["--voices", str(voices), "--threads", str(threads), "--precision", precision,
                "--codec-precision", codec_precision, "--max-batch", str(max_batch), "--max-frames", str(max_frames),
                "--chunk-frames", str(chunk_frames), "--queue", str(max(8, max(clients + staggered)))]
        log = Path(tmp) / "server.log"
        proc, port = start_server(Path(model_dir).resolve(), tree, python, args, log)
        huge_pages = server_huge_pages(proc.pid)
        try:
            if warmup:  # one request first: the voice, the allocator's pools and the pages at working size
                scenario("127.0.0.1", port, 1, 0.0, chunk_frames, seed0=100)
            rows = [scenario("127.0.0.1", port, n, 0.0, chunk_frames) for n in clients]
            rows += [scenario("127.0.0.1", port, n, stagger, chunk_frames) for n in staggered]
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            server_log = log.read_text()[-4000:]
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"machine": machine, "checkpoint": Path(model_dir).name, "threads": threads, "precision": precision,
            "codec_precision": codec_precision, "max_batch": max_batch, "max_frames": max_frames,
            "chunk_frames": chunk_frames, "huge_pages": huge_pages, "tree": str(tree), "commit": tree_commit(tree),
            "scenarios": rows,
            "server_log_tail": server_log if any(r["errors"] for r in rows) else ""}


def table(result: dict) -> str:
    """The scenarios as a text table (what the bench prints)."""
    lines = [f"{'scenario':<22} {'ttfa p50/p99 ms':>16} {'gap p50/p99/max ms':>22} {'p99/p50':>7} {'rtf':>6} "
             f"{'errors':>6}"]
    for r in result["scenarios"]:
        t, g = r["ttfa_ms"], r["gap_ms"]
        lines.append(f"{r['name']:<22} {t['p50']!s:>7}/{t['p99']!s:<8} {g['p50']!s:>7}/{g['p99']!s}/{g['max']!s:<8} "
                     f"{r['gap_p99_over_p50']!s:>7} {r['rtf']!s:>6} {len(r['errors']):>6}")
    return "\n".join(lines)


def load_table(paths: list[Path]) -> list[dict]:
    """Rows for a figure or a table (chapter 18): one per scenario of each committed result, with its label
    ("before"/"after" from the file name, else the commit)."""
    rows = []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        label = "before" if "before" in Path(p).stem else "after" if "after" in Path(p).stem else (doc["commit"] or
                                                                                                   "")[:7]
        for r in doc["scenarios"]:
            rows.append({"run": label, "scenario": r["name"], "clients": r["clients"], "stagger_s": r["stagger_s"],
                         "ttfa_p50_ms": r["ttfa_ms"]["p50"], "ttfa_p99_ms": r["ttfa_ms"]["p99"],
                         "gap_p50_ms": r["gap_ms"]["p50"], "gap_p99_ms": r["gap_ms"]["p99"],
                         "gap_max_ms": r["gap_ms"]["max"], "longest_gap_p50_ms": r["longest_gap_ms"]["p50"],
                         "longest_gap_p99_ms": r["longest_gap_ms"]["p99"], "piece_ms": r["piece_ms"],
                         "gap_p99_over_p50": r["gap_p99_over_p50"], "rtf": r["rtf"], "errors": len(r["errors"])})
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
