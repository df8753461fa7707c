"""The codec's GPU form on disk: written once next to the exports, rewritten when they change. Introduced in 10.

`gpu_graph` applies `rewrites.codec_cpu.codec_gpu_parts` to the exported codec decoder and writes its two parts
under `ncnn/gpu/`: part 0 (the codebook sums and the pre_conv) runs on the CPU, part 1 (the transformer and every
upsampling stage) is one Vulkan graph with no layer that lacks a Vulkan kernel. The exported graph on Vulkan runs
its Deconvolution1D, ConvolutionDepthWise1D, Embed and MatMul layers on the CPU mid-graph (a download, the CPU op
and an upload each), which at full size cost more than the rest of the decode on an H200 (chapter 10).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..rewrites.codec_cpu import codec_gpu_parts

FORM_VERSION = 1  # bump when the GPU form changes: the written files are rewritten
PARTS = ("codec_decoder.part0", "codec_decoder.part1")


def gpu_graph(ncnn_dir, config: dict) -> list[tuple[Path, Path]]:
    """(param, bin) of the codec's two GPU-form parts under `ncnn_dir/gpu/`, written unless already there for
    exactly the exported files (size and mtime of the .param, .bin and manifest, and `FORM_VERSION`, kept in
    `gpu/codec_decoder.json`, written last)."""
    src = Path(ncnn_dir)
    param, weights, manifest = src / "codec_decoder.param", src / "codec_decoder.bin", src / "manifest.json"
    out = src / "gpu"
    files = [(out / f"{p}.param", out / f"{p}.bin") for p in PARTS]
    key = {"version": FORM_VERSION, **{f.name: [f.stat().st_size, f.stat().st_mtime_ns]
                                       for f in (param, weights, manifest)}}
    meta = out / "codec_decoder.json"
    try:
        if json.loads(meta.read_text()) == key and all(f.is_file() for pair in files for f in pair):
            return files
    except (OSError, ValueError):
        pass
    out.mkdir(exist_ok=True)
    meta.unlink(missing_ok=True)
    for (t, b), (pf, bf) in zip(codec_gpu_parts(param.read_text(), weights.read_bytes(), config), files):
        for dst, content in ((pf, t), (bf, b)):
            tmp = dst.with_name(f"{dst.name}.tmp{os.getpid()}")
            tmp.write_text(content) if isinstance(content, str) else tmp.write_bytes(content)
            os.replace(tmp, dst)
    tmp = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(key, indent=1))
    os.replace(tmp, meta)  # the key last: a half-written form is never taken as done
    return files
