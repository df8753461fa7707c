"""Chapter 10's lab: the Vulkan gate, ncnn's conventions tested on small graphs, fp16 forced on, extracts counted.
Introduced in 10.

Nothing here is part of the runtime: these are the probes the chapter runs to show what the GPU does and costs.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import ncnn
import numpy as np

from ..runtime.binding.net import gpu_names, net_from_text, run, vulkan_devices

REQUIRE = "QTTS_REQUIRE_VULKAN"  # set by .ci/run: a missing Vulkan device is then a failure, not a skip


class VulkanRequired(RuntimeError):
    """QTTS_REQUIRE_VULKAN is set and ncnn sees no Vulkan device: chapter 10 and the GPU tests must not pass as
    skips there."""


def vulkan_or_skip(gpu_count: int | None = None, required: str | None = None) -> tuple[bool, str]:
    """(True, device names) when ncnn sees a Vulkan device; (False, why) when not, in words (what ncnn's loader said
    is captured, not printed: `runtime.binding.net.vulkan_devices`). Introduced in 10.

    Where the environment variable QTTS_REQUIRE_VULKAN is set (`.ci/run` sets it, after installing lavapipe) a
    missing device raises `VulkanRequired` instead: a skip there would mean the set-up broke."""
    cause = ""
    if gpu_count is None:
        names, cause = vulkan_devices()
        gpu_count = len(names)
    required = os.environ.get(REQUIRE, "") if required is None else required
    if gpu_count > 0:
        return True, ", ".join(gpu_names()) or f"{gpu_count} Vulkan device(s)"
    reason = ("no Vulkan device on this machine: ncnn sees none (get_gpu_count() == 0)"
              + (f": {cause}" if cause else "")
              + ". Install a Vulkan driver, e.g. Mesa's lavapipe (apt-get install mesa-vulkan-drivers libvulkan1), "
              "or run on a GPU")
    if required and required.lower() not in ("0", "false", "no"):
        raise VulkanRequired(f"{REQUIRE}={required}: {reason}. .ci/run installs lavapipe when it runs as root.")
    return False, reason


def submissions_per_frame(talker_layers: int, predictor_layers: int, groups: int = 16, rewritten: bool = False) -> int:
    """Blocking extracts (each one GPU submission + download in the pip binding) per generated frame. Embedding
    lookups are numpy on every device (`pipeline.embeddings`), so they make none."""
    if rewritten:  # the GPU forms (chapter 10): one talker call (hidden and caches in one blob), the codec head,
        return 1 + 1 + groups  # the predictor's first position and one call per codebook 1..15
    kv = lambda layers: 1 + 2 * layers  # noqa: E731  (output, then K and V of every layer)
    talker = kv(talker_layers) + 1  # + codec head
    predictor = (groups - 1) * (kv(predictor_layers) + 1)  # prefill + 14 steps, each with its head
    return talker + predictor


def packed_decoder(out_dir: Path, name: str, config: dict, threads: int, device: str):
    """A cached decoder whose caches travel as one blob (`rewrites.gpu.packed_cache_params` over the exported
    `_kv` graph): the packed form chapter 10 steps beside the exported one and the GPU forms."""
    from ..runtime.binding.cached import KvCacheNet
    from ..runtime.pipeline import precision
    from ..runtime.rewrites.gpu import packed_cache_params

    prefill, step = packed_cache_params((Path(out_dir) / f"{name}_kv.param").read_text())
    nets = [net_from_text(text, Path(out_dir) / f"{name}.bin", threads, device) for text in (prefill, step)]
    return KvCacheNet(nets[0], precision.cached_layers(out_dir, name), config["head_dim"], config["rope_theta"],
                      step=nets[1], packed=True, name=name)


def gpu_loop_graphs(loop, codec_net, layers: tuple[int, int]) -> dict[str, tuple]:
    """Every graph the GPU loop (`pipeline.loop.Loop` with its GPU forms) and the codec's GPU form run: label ->
    (ncnn.Net, the exported graph it replaces, the layers `one_blob_io` may add to that graph's count). `layers`:
    the talker's and the predictor's decoder layers. One-blob I/O adds at most, per cache blob, a flatten out (and
    for a step a Split, a Slice part and a reshape in), the Concat, and per step output a Split, a flatten and a
    Concat."""
    talker, predictor = 2 * layers[0], 2 * layers[1]  # cache blobs: K and V per layer

    def prefill(n: int) -> int:
        return n + 1

    def step(n: int, outs: int) -> int:
        return 3 * n + 2 + 3 * outs

    both = "predictor (cached decoder + heads)"
    return {"talker prefill (kv)": (loop.talker.prefill_net, "talker_decoder_kv", prefill(talker)),
            "talker step (GEMV, one blob)": (loop.talker.step_net, "talker_decoder_kv", step(talker, 1)),
            "talker full sequence": (loop.talker.full, "talker_decoder", 0),
            "codec head": (loop.head.net, "talker_codec_head", 0),
            "predictor first position": (loop.predictor.first, both, prefill(predictor)),
            "predictor step (GEMV, one blob)": (loop.predictor.step, both, step(predictor, 15)),
            "codec (GPU form, after the codebooks)": (codec_net, "codec_decoder", 0)}


# ---------------------------------------------------------------- small graphs and probes
def small_graph(text: str, device: str, threads: int = 2, weights: bytes = b"", fp16: bool = False):
    """An ncnn.Net from .param text without its magic line (and .bin bytes), with every fp16 option on or off
    (the runtime keeps them off: `runtime.binding.net`); the chapter's own probe. Introduced in 10."""
    fp16_options = {k: fp16 for k in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic")}
    with tempfile.TemporaryDirectory() as tmp:  # load_model_mem keeps pointers into a buffer Python frees
        (Path(tmp) / "g.bin").write_bytes(weights)
        return net_from_text("7767517\n" + text, Path(tmp) / "g.bin", threads, device, options=fp16_options)


def run_graph(net, **arrays) -> np.ndarray:
    """Blob `out` of `net` for named numpy inputs."""
    return run(net, arrays, ["out"], name="small graph")[0]


ROPE = "4 4\nInput x 0 1 x\nInput cos 0 1 cos\nInput sin 0 1 sin\nRotaryEmbed rope 3 1 x cos sin out 0=0\n"
SDPA = "5 5\nInput q 0 1 q\nInput k 0 1 k\nInput v 0 1 v\nInput m 0 1 m\nSDPA sdpa 4 1 q k v m out 5=1\n"


def convention_rows(devices: list[str], threads: int = 2) -> list[dict]:
    """Rope with half- and full-width tables, SDPA with 2-D and 3-D masks, on each device, against numpy
    (max |diff|). The seed found full width and 3-D masks wrong on Vulkan; chapter 10 shows this version."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 8)).astype(np.float32)  # (heads, seq, head_dim): ncnn's c, h, w
    ang = np.arange(5, dtype=np.float32)[:, None] / 10000 ** (np.arange(0, 8, 2, dtype=np.float32) / 8)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)  # (seq, head_dim/2)
    rope_ref = np.concatenate([x[..., :4] * cos - x[..., 4:] * sin, x[..., 4:] * cos + x[..., :4] * sin], -1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3, 8), (2, 6, 8), (2, 6, 8)))

    def sdpa_ref(mask: np.ndarray) -> np.ndarray:  # GQA: 4 query heads over 2 kv heads
        s = q @ np.repeat(k, 2, 0).transpose(0, 2, 1) / np.sqrt(8) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ np.repeat(v, 2, 0)

    masks = {"2-D (L, S)": rng.standard_normal((3, 6)), "3-D (1, L, S)": rng.standard_normal((1, 3, 6)),
             "3-D (heads, L, S)": rng.standard_normal((4, 3, 6))}
    rows = []
    for dev in devices:
        for width, c, s in (("half", cos, sin), ("full", np.tile(cos, 2), np.tile(sin, 2))):
            y = run_graph(small_graph(ROPE, dev, threads), x=x, cos=c, sin=s)
            rows.append({"test": f"rope, {width}-width tables", "device": dev,
                         "max_abs": float(np.abs(y - rope_ref).max())})
        for label, m in masks.items():
            y = run_graph(small_graph(SDPA, dev, threads), q=q, k=k, v=v, m=m.astype(np.float32))
            rows.append({"test": f"SDPA mask {label}", "device": dev, "max_abs": float(np.abs(y - sdpa_ref(m)).max())})
    return rows


class Counted:
    """An extractor that counts its `extract` calls."""

    def __init__(self, ex, counter: list):
        self.ex, self.counter = ex, counter

    def input(self, *args):
        return self.ex.input(*args)

    def extract(self, *args):
        self.counter[0] += 1
        return self.ex.extract(*args)


@contextlib.contextmanager
def patched_ncnn(fp16: bool = False, counter: list | None = None):
    """Nets created inside: fp16 forced on at load time (the runtime turns it off), extracts counted.
    Introduced in 10."""
    real = ncnn.Net

    class Patched(real):
        def _opts(self):
            if fp16:
                o = self.opt
                o.use_fp16_packed = o.use_fp16_storage = o.use_fp16_arithmetic = True

        def load_param(self, path):
            self._opts()
            return super().load_param(path)

        def load_param_mem(self, text):
            self._opts()
            return super().load_param_mem(text)

        def create_extractor(self):
            ex = super().create_extractor()
            return ex if counter is None else Counted(ex, counter)

    ncnn.Net = Patched
    try:
        yield
    finally:
        ncnn.Net = real
