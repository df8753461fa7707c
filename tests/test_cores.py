"""`--threads auto`: the CPUs this process may use, less those other processes keep busy when it starts
(`runtime.binding.cores`), at least one and at most two."""
import subprocess
import sys

import pytest

from qtts_lib.runtime.app.options import resolve_threads
from qtts_lib.runtime.binding import cores


def test_a_busy_neighbour_is_seen_and_this_process_is_not(monkeypatch):
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = cores.busy_elsewhere(0.5)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert busy >= 0.5, f"a process spinning on a core counted as {busy:.2f} CPUs"


@pytest.mark.parametrize("busy, peers, cpus, threads", [
    (0.0, 0, 2, 2), (0.2, 0, 2, 2), (1.0, 0, 2, 1), (3.0, 0, 2, 1), (1.0, 0, 8, 2),
    (0.0, 1, 2, 1),   # another qtts process started with this one: neither busy yet, each half the CPUs
    (0.0, 1, 8, 2), (0.0, 7, 8, 1)])
def test_auto_leaves_the_busy_cpus_to_their_processes(monkeypatch, busy, peers, cpus, threads):
    monkeypatch.setattr(cores, "busy_elsewhere", lambda seconds=cores.LOOK_SECONDS: busy)
    monkeypatch.setattr(cores, "peers", lambda: peers)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    said = []
    assert resolve_threads("auto", said.append) == threads
    assert bool(said) == (threads < cores.AUTO_MOST)  # a reduced count is said
    assert resolve_threads(3, said.append) == 3  # a number is kept


def test_a_process_running_ncnn_is_a_peer_while_it_lives(tmp_path, monkeypatch):
    """`register` holds a locked file for the process's life; `peers` counts the others and removes a file whose
    process has gone."""
    monkeypatch.setattr(cores, "REGISTRY", tmp_path)
    code = ("import sys, time; from qtts_lib.runtime.binding import cores; from pathlib import Path; "
            f"cores.REGISTRY = Path({str(tmp_path)!r}); cores.register(); print('in', flush=True); time.sleep(60)")
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "in"
        assert cores.peers() == 1
    finally:
        other.kill()
        other.wait()
    assert cores.peers() == 0 and not list(tmp_path.glob(f"{other.pid}.lock"))  # gone: its file removed
