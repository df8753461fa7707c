"""The weights in huge pages: what `qtts serve` starts with. Introduced in 11.

The generation loop reads every weight of the talker once a frame and the code predictor's fifteen times (chapter
10): about 1.7 GB a frame in int8, through 4 KB pages, each a TLB entry to look up. glibc's malloc asks the kernel
for transparent huge pages (2 MB: one entry for 512) on the large blocks that ncnn keeps its weights in when the
process starts with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc 2.35 and later; the kernel's THP mode
`madvise` or `always`). A tunable is read once, when the process starts, so `qtts serve` starts itself again with
it (`restart_with_huge_pages`): the same process id, arguments and open files.

Measured on full-base, int8 loop and codec, 2 threads (`python -m qtts_lib.bench loop|stream --huge-pages off,on`,
`data/bench/`): a warm process's frames cost about 3% less, a fresh process's 3% at 40 frames and not measurably at
240 (the talker's step gains more than the code predictor's calls), while loading the model took longer on the
2-core VMs (the kernel there gives huge pages from memory the host has not handed the VM yet). That is a good trade
for a server, which loads once; `qtts say` starts without it, and a program of your own can set the variable before
starting Python. `QTTS_HUGE_PAGES=0` keeps `qtts serve` as started.
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def asked(environ=os.environ) -> bool:
    """Whether a process with this environment starts with glibc's malloc asking for huge pages."""
    return TUNABLE in environ.get("GLIBC_TUNABLES", "").split(":")


def chosen(environ=os.environ) -> bool:
    """Whether this environment sets glibc's hugetlb tunable at all (asking for huge pages or not)."""
    return any(t.startswith("glibc.malloc.hugetlb=") for t in environ.get("GLIBC_TUNABLES", "").split(":"))


def tunables(environ, huge_pages: bool) -> str:
    """`environ`'s GLIBC_TUNABLES with TUNABLE or without it (any other hugetlb setting dropped, the rest kept)."""
    kept = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb")]
    return ":".join(kept + ([TUNABLE] if huge_pages else []))


def why_not() -> str | None:
    """Why this process cannot have its weights in huge pages by TUNABLE, or None when it can."""
    if sys.platform != "linux":
        return "not Linux"
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(x) for x in version.split(".")[:2] if x.isdigit()) < (2, 35):
        return f"needs glibc 2.35 or later, not {libc or 'an unknown libc'} {version}".rstrip()
    try:
        mode = THP_MODE.read_text()
    except OSError:
        return "the kernel has no transparent huge pages"
    if "[never]" in mode:
        return "the kernel's transparent huge pages are off (never)"
    return None


def restart_with_huge_pages(argv: Sequence[str] | None) -> None:
    """Start this program again with TUNABLE (`os.execve`: it does not return) unless its environment sets glibc's
    hugetlb tunable already (TUNABLE or another value: the user's choice), the machine cannot use it (`why_not`),
    QTTS_HUGE_PAGES=0 says not to, or `argv` (the arguments `main` was given) are not this process's own command
    line (a `main` called from inside another program is left alone)."""
    if chosen() or os.environ.get("QTTS_HUGE_PAGES") == "0" or why_not() is not None:
        return
    if argv is not None and list(sys.argv[1:]) != list(argv):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, dict(os.environ, GLIBC_TUNABLES=tunables(os.environ, True)))
