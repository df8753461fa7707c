"""The one place where numpy meets ncnn: Mats, nets and extractors. Introduced in 04.

Two pitfalls of the Python binding decide how this is written:
- `ncnn.Mat(ndarray)` *borrows* the array's buffer without keeping it alive. A temporary
  array can be freed before `.clone()` copies it (wrong data, varying run to run), and an
  in-place first layer can write into freed memory. So we hold the array in a local
  variable until the Mat owns a copy.
- The fp16/bf16 paths are on by default where the CPU supports them; parity work needs
  them off, set on `net.opt` before the param is loaded.
pnnx decides per graph whether axis 0 of a blob is a batch axis (dropped in ncnn); the
export manifest records it per input/output and `Net` applies it both ways.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import ncnn
import numpy as np

from ..errors import DeviceError, MissingArtifact

NO_BATCH = 233  # pnnx's marker for "this blob has no batch axis"


def vulkan_devices() -> tuple[list[str], str]:
    """The Vulkan devices ncnn sees, by index, and why there are none (an empty string when there are). Introduced
    in 10.

    ncnn looks for a Vulkan driver the first time it is asked (`get_gpu_count`), and where there is none its C code
    writes "dlopen failed libvulkan.so.1" and the like to the process's stderr (file descriptor 2, out of Python's
    reach). That first look runs here with descriptor 2 sent to a file; what ncnn wrote becomes the reason. ncnn keeps
    the answer, and so does this function."""
    global _VULKAN
    if _VULKAN is None:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as err:
            os.dup2(err.fileno(), 2)
            try:
                names = [ncnn.get_gpu_info(i).device_name() for i in range(ncnn.get_gpu_count())]
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            said = err.read().decode(errors="replace")
        _VULKAN = names, "" if names else _no_device(said)
    return _VULKAN


_VULKAN: tuple[list[str], str] | None = None


def _no_device(said: str) -> str:
    """What ncnn's failed look for a Vulkan driver wrote, in words."""
    if "dlopen failed" in said:
        return "the Vulkan loader (libvulkan.so.1) is not installed"
    if "vkCreateInstance failed" in said:
        return "the Vulkan loader found no driver (vkCreateInstance failed)"
    lines = dict.fromkeys(s.strip() for s in said.splitlines() if s.strip())
    return "; ".join(lines) or "no Vulkan driver offers a device"


def gpu_names() -> list[str]:
    """The Vulkan devices ncnn sees, by index (empty without a Vulkan driver; `vulkan_devices` says why)."""
    return vulkan_devices()[0]


def parse_device(device: str) -> int | None:
    """"cpu" -> None; "vulkan" -> ncnn's default GPU; "vulkan:N" -> N. Introduced in 10.

    Asking for a GPU that ncnn cannot see is a `DeviceError` naming the devices it does see."""
    spec = (device or "cpu").strip().lower()
    if spec == "cpu":
        return None
    kind, _, index = spec.partition(":")
    if kind != "vulkan" or (index and not index.isdigit()):
        raise DeviceError(f"unknown device {device!r}; use cpu, vulkan or vulkan:N")
    names = gpu_names()
    if not names:
        raise DeviceError(f"device {device!r}: ncnn sees no Vulkan device (get_gpu_count() == 0); "
                          "install a Vulkan driver (e.g. Mesa's lavapipe: mesa-vulkan-drivers libvulkan1) or use cpu")
    if not index:
        return ncnn.get_default_gpu_index()
    if int(index) >= len(names):
        seen = ", ".join(f"vulkan:{i} {n}" for i, n in enumerate(names))
        raise DeviceError(f"device {device!r}: ncnn sees {len(names)} Vulkan device(s): {seen}")
    return int(index)


def release_threads() -> bool:
    """Free the calling thread's OpenMP worker threads (`omp_pause_resource_all(omp_pause_soft)` in every OpenMP
    runtime loaded: the libgomp ncnn's wheel bundles, or the one whose symbols it binds to when PyTorch loaded its
    own first); the next ncnn call from this thread makes them again. Call it before another thread takes over the
    ncnn work: GNU OpenMP keeps every thread's pool, and once it manages more threads than there are CPUs it stops
    spinning between parallel regions and parks each worker in the kernel: on two cores, steps ran 2x slower
    (appendix D, tests/test_threads.py). Returns whether a runtime was found (False elsewhere: nothing to do)."""
    global _OPENMP
    if _OPENMP is None:  # ncnn (imported above) has loaded its OpenMP runtime by now
        _OPENMP = []
        try:
            found = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                     if line.split()[-1].startswith("/") and any(k in line.split()[-1].rsplit("/", 1)[-1]
                                                                   for k in ("libgomp", "libomp", "libiomp"))}
        except OSError:
            found = set()
        for path in sorted(found):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            if hasattr(lib, "omp_pause_resource_all"):
                _OPENMP.append(lib)
    return bool([lib.omp_pause_resource_all(1) for lib in _OPENMP])  # 1: omp_pause_soft


_OPENMP: list | None = None


def to_mat(array: np.ndarray, batch_axis: int = NO_BATCH) -> ncnn.Mat:
    """An `ncnn.Mat` that owns a copy of `array` (float32 or int32). Introduced in 04."""
    a = np.asarray(array)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    elif a.dtype == np.int64:
        a = a.astype(np.int32)
    if a.dtype not in (np.float32, np.int32):
        raise TypeError(f"ncnn blobs are float32 or int32, not {a.dtype}")
    if batch_axis == 0:
        if a.shape[0] != 1:
            raise ValueError(f"batch axis must have size 1, got shape {a.shape}")
        a = a[0]
    if a.ndim == 0 or a.ndim > 4:
        raise ValueError(f"ncnn takes 1-4 dims after the batch axis, got shape {a.shape}")
    if a.dtype == np.float32 and a.size:  # a Mat of that shape filled through its buffer: half the cost of a clone
        mat = ncnn.Mat(*reversed(a.shape))
        np.asarray(mat)[...] = a
        return mat
    held = np.ascontiguousarray(a)  # keep a reference until the clone owns the data
    mat = ncnn.Mat(held).clone()
    del held
    return mat


def from_mat(mat, batch_axis: int = NO_BATCH) -> np.ndarray:
    """A numpy copy of an ncnn.Mat (float32), with the batch axis restored if the graph had one. A plain fp32 Mat is
    read through the binding's buffer (its shape, and the channel step as a stride): one call into the binding.
    Every attribute read is one too, and in the generation loop each runs with cold caches after a call that streamed
    the weights (tens of µs a Mat, read attribute by attribute); `Mat.numpy()` describes the buffer in a format numpy
    parses in Python, about 10x the cost. (A packed Mat must not reach the buffer: the binding has no format for it.)"""
    if mat.elemsize == 4 and mat.elempack == 1:
        a = np.asarray(mat).copy()
    else:
        a = np.array(mat.numpy(), copy=True)
    return a[None] if batch_axis == 0 else a


def memory_pool() -> ncnn.PoolAllocator:
    """One pool of blob and workspace memory for several nets that run one after another (the codec's parts,
    `make_net(allocator=...)`). Each net's own pools hold that net's peak for the life of the net, so a chain of
    nets first touches the sum of their peaks; sharing one, it touches little more than the largest. First-touched
    memory is slow on a VM (page faults): the codec's first decode in a process touched about 160 MB with a pool
    per part and about 65 MB with one shared (chapter 14). ncnn keeps a raw pointer to it: whoever holds the nets
    must hold the pool too, and drop it after them (`codec.parts.Part` carries it)."""
    return ncnn.PoolAllocator()


# A cached decoder's one-position step on the CPU moves a few thousand numbers between its hundreds of small layers:
# converting them to and from ncnn's packed layouts (8 or 4 elements a lane) costs more than the layouts save (the
# code predictor's step, full size, 2-core VM: about 25 µs a call of its layers beside the projections), and at one
# position the outputs are bit for bit the same. Not at several: there a Gemm's input packed or not sums in another
# order (an fp32 prefill differed by 1e-5), so only a one-position graph may turn packing off.
PACKING_OFF = {"use_packing_layout": False}


def make_net(param: str | Path, bin: str | Path, threads: int = 2, device: str = "cpu",
             rewrite: Callable[[str], str] | None = None, fp16_weights: bool = False, bf16: bool = False,
             allocator: ncnn.PoolAllocator | None = None):
    """An ncnn.Net with fp16/bf16 off, `threads` set and on `device` (cpu, vulkan, vulkan:N), loaded from param/bin.

    `rewrite` turns the .param text into an equivalent faster form before loading (`runtime.rewrites`);
    the weights are read from `bin` unchanged. `fp16_weights` turns ncnn's fp16 storage on (the fp16
    precision tier, chapter 13: the .param masks every layer that should stay fp32). `bf16` turns ncnn's bf16
    storage on (weights and activations held as bfloat16 between layers; on x86 with AVX512-BF16 its
    convolutions multiply in bf16 and accumulate in fp32: the codec's bf16 tier, chapter 14). `allocator`: blobs and
    workspaces from this pool (`memory_pool`) instead of the net's own."""
    for f in (param, bin):
        if not Path(f).is_file():
            raise MissingArtifact(f"{f} not found; run notebooks/04_export_align.py to export the modules")
    text = Path(param).read_text()
    try:
        options = ({"use_bf16_storage": True} if bf16 else {}) | (
            {"blob_allocator": allocator, "workspace_allocator": allocator} if allocator is not None else {})
        return net_from_text(text if rewrite is None else rewrite(text), bin, threads, device, fp16_weights,
                             options or None)
    except RuntimeError:
        raise RuntimeError(f"ncnn could not load {param}" + (" (rewritten)" if rewrite else "")) from None


def net_from_text(text: str, bin: str | Path, threads: int = 2, device: str = "cpu", fp16_weights: bool = False,
                  options: dict | None = None):
    """`make_net` from .param text (a rewritten graph) and a .bin file: the one place ncnn's options are set.

    `options` (net.opt attributes) are set over the runtime's, for the chapters' probes (fp16 forced on, say).
    (The binding's `load_model_mem` keeps pointers into a buffer Python frees: weights come from files only.)"""
    gpu = parse_device(device)
    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    net = ncnn.Net()
    opt = net.opt
    opt.num_threads = threads
    opt.use_fp16_packed = False
    opt.use_fp16_storage = fp16_weights
    opt.use_fp16_arithmetic = False
    opt.use_bf16_storage = False
    opt.use_vulkan_compute = gpu is not None
    for key, value in (options or {}).items():
        setattr(opt, key, value)
    if gpu is not None:
        net.set_vulkan_device(gpu)
    if net.load_param_mem(text) != 0 or net.load_model(str(bin)) != 0:
        raise RuntimeError("ncnn could not load a graph")
    return net


def nets_from_bins(texts: Sequence[str], bins: Sequence[str | Path], threads: int = 2, device: str = "cpu",
                   options: Sequence[dict | None] | None = None) -> list:
    """Nets of graphs whose weights are several `.bin` files one after the other (graphs merged from others, as the
    code predictor with its heads: weights are read in layer order), each `texts` loaded over their concatenation,
    copied into a temporary file for the load (`net_from_text`: weights come from files only). `options`: each
    text's (`net_from_text`), if given."""
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "merged.bin"
        with merged.open("wb") as out:
            for part in bins:
                with Path(part).open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 24)
        return [net_from_text(text, merged, threads, device, options=opts)
                for text, opts in zip(texts, options or [None] * len(texts))]


def run(net: ncnn.Net, inputs: Mapping[str, np.ndarray | ncnn.Mat], outputs: Sequence[str], *,
        axes: Mapping[str, int] | None = None, raw: Sequence[str] = (), name: str = "graph",
        light: bool = True) -> list:
    """One extractor of `net`: set `inputs` (blob name -> numpy array or Mat), extract `outputs` in order.

    Numpy inputs become Mats that own a copy (`to_mat`); the Mats live until the last extract. Outputs named in
    `raw` come back as Mats extracted with `type=1`, in the backend's own layout (KV caches: never round-trip them
    through numpy, chapter 05); the others as numpy copies. `axes` (blob name -> pnnx's batch axis, from the export
    manifest) drops the batch axis going in and restores it coming out. ncnn computes only the layers the
    extracted outputs need (the code predictor reads one of its 15 heads per step). `light=False` keeps every
    intermediate blob until the extractor goes (ncnn's light mode frees each once consumed, so a second extract
    upstream of the first would compute it again): for reading inner blobs, as a calibration does. Introduced in 04."""
    axes = axes or {}
    ex = net.create_extractor()
    if not light:
        ex.set_light_mode(False)
    for k, v in inputs.items():  # the extractor holds a reference to each Mat (and `to_mat`'s own its copy)
        ex.input(k, v if isinstance(v, ncnn.Mat) else to_mat(v, axes.get(k, NO_BATCH)))
    out = []
    for k in outputs:
        m = ncnn.Mat()
        ret = ex.extract(k, m, 1) if k in raw else ex.extract(k, m)
        if ret != 0:
            raise RuntimeError(f"{name}: extracting {k} failed ({ret})")
        out.append(m if k in raw else from_mat(m, axes.get(k, NO_BATCH)))
    return out


class Net:
    """A pnnx-exported graph: call it with numpy arrays in input order, get numpy outputs."""

    def __init__(self, directory: str | Path, name: str, threads: int = 2, device: str = "cpu",
                 rewrite: Callable[[str], str] | None = None, files: tuple[Path, Path] | None = None):
        directory = Path(directory)
        manifest = directory / "manifest.json"
        if not manifest.is_file():
            raise MissingArtifact(f"{manifest} not found; run notebooks/04_export_align.py to export the modules")
        entry = json.loads(manifest.read_text()).get(f"{name}.param")
        if entry is None:
            raise MissingArtifact(f"{name} is not in {manifest}; run notebooks/04_export_align.py")
        self.name = name
        self.axes = {f"in{i}": a for i, a in enumerate(entry["input_batch_axes"])}
        self.axes |= {f"out{i}": a for i, a in enumerate(entry["output_batch_axes"])}
        self.inputs, self.outputs = len(entry["input_batch_axes"]), len(entry["output_batch_axes"])
        # `files`: another form of the graph (a precision tier's), with the export's inputs and outputs
        self.param, bin_ = files or (directory / f"{name}.param", directory / f"{name}.bin")
        self.net = make_net(self.param, bin_, threads, device, rewrite)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """All outputs, in order."""
        return self.run(arrays, range(self.outputs))

    def run(self, arrays, outputs) -> list[np.ndarray]:
        """Only the outputs whose indices are given: ncnn computes just the layers they need."""
        if len(arrays) != self.inputs:
            raise ValueError(f"{self.name} takes {self.inputs} inputs, got {len(arrays)}")
        return run(self.net, {f"in{i}": a for i, a in enumerate(arrays)}, [f"out{i}" for i in outputs],
                   axes=self.axes, name=self.name)
