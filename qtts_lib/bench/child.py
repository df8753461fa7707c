"""One measurement in a fresh Python: its own model load, its own peak memory, no thread pool left over from the
runtime measured before it. Introduced in 11.

`run(module, name, threads, **kwargs)` runs `qtts_lib.bench.<module>.<name>(**kwargs)` in a child process with
`OMP_NUM_THREADS=threads` and returns the dict it returned; the child prints it as one `QTTS_BENCH {json}` line.
`spawn` starts such a child without waiting (measurements that run beside each other: overlap). A child may start
with glibc's malloc asking for transparent huge pages (`runtime.app.hugepages`, what `qtts serve` runs with).
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

from ..runtime.app import hugepages

MARK = "QTTS_BENCH "


def _command(module: str, name: str, kwargs: dict) -> list[str]:
    return [sys.executable, "-m", "qtts_lib.bench.child", module, name, json.dumps(kwargs)]


def _env(threads: int, tree: str | None = None, huge_pages: bool = False) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    tunables = hugepages.tunables(env, huge_pages)
    env.pop("GLIBC_TUNABLES", None)
    return env | ({"GLIBC_TUNABLES": tunables} if tunables else {}) | ({"PYTHONPATH": tree} if tree else {})


def run(module: str, name: str, threads: int, /, tree: str | None = None, huge_pages: bool = False,
        **kwargs) -> dict:
    """`qtts_lib.bench.<module>.<name>(**kwargs)` in a fresh Python; raises with its stderr if the child fails.
    `tree`: the source tree whose `qtts_lib` the child imports (a worktree of an older commit that holds this
    module: the "before" of a change), else this one. `huge_pages`: glibc's malloc asks for huge pages in the
    child (`runtime.app.hugepages.TUNABLE`); otherwise the child runs without it, whatever this process started with."""
    proc = subprocess.run(_command(module, name, kwargs), capture_output=True, text=True,
                          env=_env(threads, tree, huge_pages), cwd=tree)
    return result_of(proc.returncode, proc.stdout, proc.stderr, f"{module}.{name}")


def spawn(module: str, name: str, threads: int, /, **kwargs) -> subprocess.Popen:
    """The same child, started and left running (its stdout a pipe: read it, or `finish` it)."""
    return subprocess.Popen(_command(module, name, kwargs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(threads))


def finish(proc: subprocess.Popen, what: str = "child") -> dict:
    out, err = proc.communicate()
    return result_of(proc.returncode, out, err, what)


def result_of(code: int, stdout: str, stderr: str, what: str) -> dict:
    line = next((x for x in stdout.splitlines() if x.startswith(MARK)), None)
    if code != 0 or line is None:
        raise RuntimeError(f"{what} failed (exit {code}):\n{stderr[-3000:]}")
    return json.loads(line[len(MARK):])


def report(value: dict) -> None:
    """What a child prints for its parent (children that stream other lines first call this at the end)."""
    print(MARK + json.dumps(value), flush=True)


if __name__ == "__main__":
    module, name, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    report(getattr(importlib.import_module(f"qtts_lib.bench.{module}"), name)(**kwargs))
