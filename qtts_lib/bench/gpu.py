"""For a GPU host: zero-filled weights for full-size timings, and where a Vulkan frame's time goes. Introduced in 10.

    python -m qtts_lib.bench zeros DIR             # zero-filled .bin files of the sizes in DIR/bin_sizes.json
    python -m qtts_lib.bench profile DIR OUT.json --device vulkan

Full-size checkpoints are GBs; a GPU host that cannot receive them gets the small files and the sizes of the big
ones: fp32 kernels take the same time whatever the weights, so zeros time like real weights (parity is proven on the
CPU, and on lavapipe in CI).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

# graphs whose load probes the weights (the codec's CPU form measures how far each part reaches, which zeros hide):
# these get small random values instead, laid out as ncnn reads them (a storage tag before each tagged load)
RANDOM_BINS = ("ncnn/codec_decoder.bin",)


def write_zero_bins(directory: str | Path, random: tuple[str, ...] = RANDOM_BINS) -> None:
    """Zero-filled `.bin` files of the sizes in bin_sizes.json (sparse: instant, no disk); those in `random` filled
    with N(0, 0.02) fp32 weights in their .param's load order instead (`write_random_bin`)."""
    directory = Path(directory)
    for name, size in json.loads((directory / "bin_sizes.json").read_text()).items():
        if name in random:
            write_random_bin(directory / name, size)
            continue
        with (directory / name).open("wb") as f:
            f.truncate(size)


def write_random_bin(path: Path, size: int, seed: int = 0) -> None:
    """`path` (a .bin beside its .param) as fp32 N(0, 0.02) values, every tagged load preceded by the fp32 tag."""
    from ..runtime.binding.param import read_param
    from ..runtime.binding.weights import FP32_TAG, layer_loads

    rng = np.random.default_rng(seed)
    written = 0
    with path.open("wb") as f:
        for layer in read_param(path.with_suffix(".param")).layers:
            for count, tagged in layer_loads(layer):
                if tagged:
                    f.write(FP32_TAG)
                f.write((rng.standard_normal(count, np.float32) * np.float32(0.02)).tobytes())
                written += 4 * count + (4 if tagged else 0)
    if written != size:
        raise ValueError(f"{path}: the .param reads {written} bytes, bin_sizes.json says {size}")


def stub_missing(*names: str) -> None:
    """Modules the 12 Hz generate path imports but never calls (librosa, soundfile), stubbed where a GPU host has
    none: calling them raises."""
    import importlib
    import importlib.machinery
    import types

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            def missing(*a, _n=name, **k):
                raise RuntimeError(f"{_n} is not installed here")
            for part in (name, name + ".filters"):
                mod = types.ModuleType(part)
                mod.__spec__ = importlib.machinery.ModuleSpec(part, None)
                mod.mel = mod.load = mod.resample = missing
                if name == "librosa":  # cloning from a clip needs the mel filterbank: the runtime's, bit-exact
                    mod.mel = _librosa_mel
                sys.modules[part] = mod


def _librosa_mel(*, sr, n_fft, n_mels, fmin=0.0, fmax=None, **_):
    from ..runtime.audio.mel import mel_filterbank

    return mel_filterbank(sr, n_fft, n_mels, fmin, sr / 2 if fmax is None else fmax)


def _ms(fn, repeats: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(float(np.median(times)) * 1e3, 3)


def profile_vulkan(model_dir: str | Path, device: str = "vulkan", threads: int = 2) -> dict:
    """Where a GPU frame's time goes on `device`: ms per call of each graph of the GPU loop, and their layer counts
    (`lab.vulkan_probe.gpu_forms`)."""
    from ..lab.vulkan_probe import gpu_forms

    return gpu_forms(model_dir, device, threads)
