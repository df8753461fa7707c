"""Run code in a fresh Python in which torch, transformers and qwen_tts cannot be imported. Introduced in 07.

This is how the tutorial proves that the runtime is torch-free: not by reading import lines,
but by making the imports fail and running the real thing.
"""
from __future__ import annotations

import subprocess
import sys

BLOCKED = ("torch", "transformers", "qwen_tts")


def prelude(blocked: tuple[str, ...]) -> str:
    """Python source that makes the packages `blocked` fail to import, as a missing package does."""
    return f"""import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {tuple(blocked)!r}:
            raise ModuleNotFoundError('blocked for this run: ' + name, name=name.split('.')[0])
sys.meta_path.insert(0, _Block())
"""


PRELUDE = prelude(BLOCKED)


def run_without(blocked: tuple[str, ...], code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args...` in a process where the packages `blocked` cannot be imported, output captured."""
    return subprocess.run([sys.executable, "-c", prelude(blocked) + code, *args], capture_output=True, text=True)


def run_without_torch(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c PRELUDE + code args...`, output captured as text."""
    return run_without(BLOCKED, code, *args)


def qtts_without_torch(*args: str) -> subprocess.CompletedProcess:
    """The `qtts` CLI (`qtts say ...`) in a process where torch cannot be imported."""
    return run_without_torch("from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))", *args)


def serve_without_torch(args: list[str], log, env: dict | None = None,
                        timeout: float = 600.0) -> tuple[subprocess.Popen, str]:
    """`qtts serve ARGS` on a free local port in a process where torch cannot be imported, its output in the file
    `log` (a file, not a pipe nobody reads: a full pipe blocks the server); returns the process and its URL once
    `/health` answers 200, RuntimeError (with the log's end) if it exits first or does not answer in `timeout`
    seconds. Introduced in 18."""
    import socket
    import time
    import urllib.error
    import urllib.request
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = "from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + code, "serve", "--port", url.rsplit(":", 1)[1],
                             *args], stdout=Path(log).open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"qtts serve did not come up: {Path(log).read_text()[-2000:]}")
