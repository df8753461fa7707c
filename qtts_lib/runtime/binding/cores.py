"""How many of this process's CPUs other processes keep busy, and the thread count that leaves them theirs.
Introduced in appendix D.

ncnn fixes a net's threads when it loads (its Gemm layers pack their weights for that many), and GNU OpenMP's
workers wait for each other at every layer: a worker whose core another process holds stalls its whole process.
Two processes of two threads on two cores then take several times as long as one alone, each (appendix D measures
it), where one thread each would take about what a fair share is. So `qtts say` and `qtts serve` choose their
thread count when they start (`--threads auto`, their default): the CPUs this process may run on, less those other
processes keep busy over a short look (`busy_elsewhere`), shared with the other qtts processes running ncnn on this
machine (`register`, `peers`: two started together each see the other, though neither is busy yet), at least one
and at most `most`.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

LOOK_SECONDS = 0.25  # how long `busy_elsewhere` watches the CPUs
AUTO_MOST = 2        # `--threads auto` uses at most this many threads (the default the runtime was measured at)


REGISTRY = Path(tempfile.gettempdir()) / "qtts-ncnn-processes"  # one locked file per live process (`register`)
_registered = None   # this process's file, held open (and locked) while it lives


def register() -> None:
    """Count this process among those running ncnn here, for as long as it lives: a file in REGISTRY that it holds
    locked (the kernel drops the lock when the process ends, however it ends)."""
    global _registered
    if _registered is not None:
        return
    try:
        REGISTRY.mkdir(exist_ok=True)
        f = open(REGISTRY / f"{os.getpid()}.lock", "w")
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    _registered = f


def peers() -> int:
    """Other live processes in REGISTRY (a file nobody holds is a process gone: removed)."""
    count = 0
    try:
        paths = list(REGISTRY.glob("*.lock"))
    except OSError:
        return 0
    for path in paths:
        if path.name == f"{os.getpid()}.lock":
            continue
        try:
            with open(path) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    count += 1
                    continue
                path.unlink(missing_ok=True)
        except OSError:
            continue
    return count


def _busy_ticks() -> int:
    """Clock ticks all CPUs spent not idle since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def busy_elsewhere(seconds: float = LOOK_SECONDS) -> float:
    """CPUs' worth of work other processes did over the next `seconds` (the machine's busy time less this process's
    own); 0.0 where /proc/stat cannot be read."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
        mine0, busy0, t0 = sum(os.times()[:2]), _busy_ticks(), time.monotonic()
        time.sleep(seconds)
        mine1, busy1, t1 = sum(os.times()[:2]), _busy_ticks(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, ((busy1 - busy0) / hz - (mine1 - mine0)) / (t1 - t0))


def auto_threads(most: int = AUTO_MOST) -> tuple[int, float, int]:
    """(threads, busy, peers): this process's CPUs less those busy elsewhere (rounded), and at most its share with
    the other registered processes, between 1 and `most`; the CPUs' worth found busy elsewhere; those processes. This
    process is registered first, then looks for `LOOK_SECONDS`, so that two started together see each other."""
    register()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = busy_elsewhere()
    others = peers()
    return max(1, min(most, cpus - round(busy), cpus // (others + 1))), busy, others
