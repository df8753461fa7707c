"""`qtts serve` starts itself again with glibc's malloc asking for huge pages (runtime.app.hugepages), once, with its
arguments; a `main` called from inside another program, QTTS_HUGE_PAGES=0 or a machine without them leave it be."""
import os
import subprocess
import sys

import pytest
from serving import start_server, stop_server

from qtts_lib.runtime.app import hugepages

CAN = hugepages.why_not()
needs_huge_pages = pytest.mark.skipif(CAN is not None, reason=f"no huge pages by glibc's tunable here: {CAN}")
PRINT_AFTER_RESTART = ("import os, sys\nfrom qtts_lib.runtime.app.hugepages import restart_with_huge_pages\n"
                       "print('started', os.environ.get('GLIBC_TUNABLES'), sys.argv[1:], flush=True)\n"
                       "restart_with_huge_pages(sys.argv[1:])\nprint('running', os.environ.get('GLIBC_TUNABLES'))")


def run(env: dict, *args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "QTTS_HUGE_PAGES")} | env
    done = subprocess.run([sys.executable, "-c", PRINT_AFTER_RESTART, *args], capture_output=True, text=True, env=env,
                          check=True)
    return done.stdout.splitlines()


def test_tunables_keep_the_others_and_set_hugetlb_once():
    env = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.cpu.hwcaps=-AVX512F"}
    assert hugepages.tunables(env, True) == "glibc.cpu.hwcaps=-AVX512F:" + hugepages.TUNABLE
    assert hugepages.tunables(env, False) == "glibc.cpu.hwcaps=-AVX512F"
    assert hugepages.tunables({}, True) == hugepages.TUNABLE and hugepages.tunables({}, False) == ""
    assert hugepages.asked({"GLIBC_TUNABLES": hugepages.tunables(env, True)}) and not hugepages.asked(env)


@needs_huge_pages
def test_a_program_starts_again_once_with_the_tunable_and_its_arguments():
    lines = run({}, "serve", "--port", "1")
    assert lines == ["started None ['serve', '--port', '1']",
                     f"started {hugepages.TUNABLE} ['serve', '--port', '1']", f"running {hugepages.TUNABLE}"]


@needs_huge_pages
def test_it_stays_as_started_when_told_or_when_main_was_not_given_its_own_command_line(monkeypatch):
    assert run({"QTTS_HUGE_PAGES": "0"}, "serve") == ["started None ['serve']", "running None"]
    off = "glibc.malloc.hugetlb=0"  # the user's own choice stands
    assert run({"GLIBC_TUNABLES": off}, "serve") == [f"started {off} ['serve']", f"running {off}"]
    starts = []
    monkeypatch.setattr(hugepages.os, "execve", lambda *args: starts.append(args))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    hugepages.restart_with_huge_pages(["serve", "--port", "1"])  # main called inside pytest: not its command line
    assert starts == []
    hugepages.restart_with_huge_pages(sys.argv[1:])  # this process's own arguments: it would start again
    assert len(starts) == 1 and starts[0][1] == sys.orig_argv and hugepages.asked(starts[0][2])


@needs_huge_pages
def test_qtts_serve_runs_with_the_weights_in_huge_pages(exported, tmp_path):
    from qtts_lib.bench.serve import server_huge_pages

    proc, _ = start_server(tmp_path)
    try:
        assert server_huge_pages(proc.pid) is True
    finally:
        stop_server(proc)
