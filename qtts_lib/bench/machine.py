"""The machine a benchmark ran on, described in its result: CPU, cores, memory, load, read bandwidth, GPU.
Introduced in 11.

Every committed result in data/bench/ carries this description, measured when the run started (and the load again
when it ended): a number without its machine says nothing. The read bandwidth is what the memory-bound generation
loop is held against (its floor, chapter 11); `Probe` measures it again inside a run, since a VM's drifts by 20%
from minute to minute.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

PROBE_EVERY = 8     # frames between two bandwidth probes inside a run
PROBE_GIB = 0.125   # the probe's array: four times the EPYC VM's 32 MB L3, so it reads memory


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The x86 extensions ncnn's CPU kernels choose between (and what sets a VM's int8 and bf16 speed): "AMD EPYC" alone
# names three generations whose int8 kernels differ (Zen 3 has no AVX-512, Zen 4 and 5 have VNNI and BF16).
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "amx_int8", "amx_bf16")


def cpu_identity(cpuinfo: str | None = None) -> dict:
    """Vendor, family, model and stepping as /proc/cpuinfo gives them for the first CPU, and the SIMD extensions of
    SIMD_FLAGS it lists; describing this machine (`cpuinfo` None), also the sizes of the data caches CPU 0 sees (MiB
    per level, one instance each). `cpuinfo`: another machine's /proc/cpuinfo text instead."""
    here = cpuinfo is None
    if here:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    out: dict = {k: fields[f] for k, f in (("vendor", "vendor_id"), ("family", "cpu family"), ("model", "model"),
                                           ("stepping", "stepping")) if f in fields}
    for k in ("family", "model", "stepping"):
        if str(out.get(k, "")).isdigit():
            out[k] = int(out[k])
    out["simd"] = [f for f in SIMD_FLAGS if f in flags]
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")) if here else ():
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction" and size.endswith("K"):
            caches[f"L{level}"] = round(int(size[:-1]) / 1024, 3)
    if caches:
        out["cache_mib"] = caches
    return out


def memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return float("nan")


def read_bandwidth_gbs(threads: int, gib: float = 1.0, repeats: int = 5, array: np.ndarray | None = None) -> float:
    """Streaming-read bandwidth in GB/s: `threads` threads each take the max of their slice of a `gib` GiB
    array (numpy releases the GIL in the reduction). Max, not sum: numpy's pairwise float sum is
    compute-bound at about half this machine's bandwidth, its SIMD max is not. Median of `repeats`;
    the first pass warms the pages. `array`: read this one instead (a probe that runs again and again)."""
    a = np.ones(int(gib * 2**30 / 4), np.float32) if array is None else array
    parts = np.array_split(a, threads)
    a.max()

    def once() -> float:
        workers = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - t0

    seconds = statistics.median(once() for _ in range(repeats))
    return a.nbytes / seconds / 1e9


def gpus() -> dict:
    """The GPU as nvidia-smi names it (name, driver, memory) and the Vulkan devices ncnn sees; {} without them."""
    info: dict = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        if q.returncode == 0 and q.stdout.strip():
            name, driver, mem = [s.strip() for s in q.stdout.splitlines()[0].split(",")]
            info.update(gpu=name, driver=driver, gpu_memory=mem)
    except (OSError, subprocess.TimeoutExpired):
        pass
    from ..runtime.binding.net import gpu_names

    if gpu_names():
        info["vulkan_devices"] = gpu_names()
    return info


def describe(thread_counts: list[int]) -> dict:
    """CPU (its name, family, model, SIMD extensions and caches), cores, memory, load, versions, the read bandwidth
    at each thread count (measured now), the GPU."""
    from importlib import metadata

    return {
        "cpu": cpu_model(),
        **cpu_identity(),
        "cores": os.cpu_count(),
        "memory_gb": memory_gb(),
        "python": platform.python_version(),
        "ncnn": metadata.version("ncnn"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "read_bandwidth_gbs": {str(t): round(read_bandwidth_gbs(t), 1) for t in thread_counts},
        **gpus(),
    }


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it does not carry the parent's peak
    across fork + exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    return float("nan")


def huge_pages_mb() -> int | None:
    """Anonymous memory of this process in transparent huge pages (MB; None where the kernel does not say)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) // 1024  # kB
    except OSError:
        pass
    return None


class Probe:
    """Bandwidth probes inside a run, between frames (outside the timed code): a VM's bandwidth drifts by
    20% from minute to minute, so each run is held against what the memory gave while it ran. The probe's
    array lives for the whole run; `peak_rss_gb` leaves it out."""

    def __init__(self, threads: int):
        self.threads, self.gbs, self.seconds = threads, [], 0.0
        self.array = np.ones(int(PROBE_GIB * 2**30 / 4), np.float32)

    def __call__(self, frame: int = 0) -> None:
        if frame % PROBE_EVERY == 0:
            t = time.perf_counter()
            self.gbs.append(round(read_bandwidth_gbs(self.threads, repeats=3, array=self.array), 1))
            self.seconds += time.perf_counter() - t

    def peak_rss_gb(self) -> float:
        return peak_rss_gb() - self.array.nbytes / 2**30
