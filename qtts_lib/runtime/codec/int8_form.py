"""The codec's int8 tier on disk: the CPU form with int8 residual convolutions, calibrated once, int8 projections
in the upsampler, and an int8 transformer for streams. Introduced in 14.

`int8_graph` takes the CPU form (`codec.cpu_form.fast_graph`), decodes `CALIBRATION_FRAMES` frames of random codes
through it in fp32, chunk by chunk as the runtime does, and records the largest |input| of every convolution that
`rewrites.codec_int8.residual_convolutions` picks in the decoder stages `INT8_STAGES` (the time tiles of one layer
share the largest of theirs). `rewrites.codec_int8.int8_convolutions` then writes those parts again with ncnn's
int8 Convolution under `ncnn/fast_int8/`; the other parts are the CPU form's own files, named from there. Storage
stays fp32 (on the Intel Xeon VM that lists AMX, stages 2-4 with fp32 storage ran 17.3 ms/frame at 33.5 dB SNR
against fp32's 27.0; the same with bf16 storage, 20.4 at 30.8 dB; stages 1-4, 15.9 at 27.2 dB; 3-4, 22.1 at 40.1 dB).

The input scales are static (ncnn's int8 Convolution has no per-call absmax), so they are only as good as the
calibration's codes: random codes through the checkpoint's own codebooks, transformer and upsampler. With a real
checkpoint, check the tier on real speech before relying on it (`python -m qtts_lib.bench codec --tiers` against
fp32 on your codes; chapter 14).

The transformer's cached form, which a stream runs one position per push, gets int8 projections as the talker's
(`rewrites.int8`: weights int8 per row, each call's activations quantized with their own absmax), all but its input
and output projections, which stay fp32 (with those two int8 as well, a stream fell from 33.5 to 29.8 dB against
fp32; without them the int8 transformer is within 75 dB of its fp32 form): a one-frame push reads 30 MB of
transformer weights instead of 121. The whole decode keeps the fp32 transformer, run once over all frames.

The ConvNeXt upsampler's pointwise projections (parts 2 and 3: two Gemms each, 1024 <-> 4096, 67 MB of fp32 weights
that every push reads whole) are the same int8 Gemm with run-time scales. On the AMD EPYC Zen 3 VM (full-base, 40
frames of random codes, one process, rounds alternating) the tier's SNR against fp32 stayed 33.5 dB, its first
one-frame push went from 22.7 to 20.7 ms and one-frame pieces from 53.1 to 50.0 ms a frame. The convolutions around
them stay fp32: static int8 there cost 3 dB a layer or more (chapter 14's lab notes list what was tried).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..binding.graph import Graph
from ..binding.net import run
from ..rewrites.codec_int8 import calibration_group, int8_convolutions, residual_convolutions
from ..rewrites.int8 import int8_graph as int8_projections
from .cpu_form import FAST_DIR, fast_graph, load_parts, manifest_axes
from .parts import Part, run_parts, transformer_output

INT8_DIR = "fast_int8"     # under the ncnn directory, beside the CPU form's `fast/`
INT8_VERSION = 3           # bump when the int8 form changes: the cached files are rewritten
INT8_STAGES = (2, 3, 4)    # decoder stages (1 = the first after the ConvNeXt upsampler) with int8 residual units
CALIBRATION_FRAMES, CALIBRATION_SEED = 320, 20261202


class _Observed:
    """A codec part that also records the largest |value| of `blobs` on every call (calibration only)."""

    def __init__(self, part: Part, blobs: list[str]):
        self.part, self.blobs = part, blobs
        self.spf, self.up, self.context, self.chunk_frames = part.spf, part.up, part.context, part.chunk_frames
        self.states = ()  # fed left context, as measured
        self.absmax = dict.fromkeys(blobs, 0.0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out, *seen = run(self.part.net, {"in0": x}, ["out0", *self.blobs], name="codec calibration", light=False)
        for b, a in zip(self.blobs, seen):
            self.absmax[b] = max(self.absmax[b], float(np.abs(a).max()))
        return out


def stage_of_part(k: int, config: dict) -> int:
    """The decoder stage (1..) that part `k` of the CPU form runs, 0 for the codes, transformer and upsampler."""
    return max(0, k - 1 - len(config["upsampling_ratios"]))


def int8_graph(ncnn_dir, config: dict, threads: int = 2, log=None) -> tuple[Path, dict]:
    """The directory of the codec's int8 tier and its description (`codec_decoder.json`, as the CPU form's, with
    part files relative to it and the calibration recorded), written on first use and again when the CPU form or
    this tier changes. Files are written under temporary names and renamed, the description last."""
    src = Path(ncnn_dir)
    fast_dir, fast = fast_graph(src, config)
    out = src / INT8_DIR
    key = {"version": INT8_VERSION, "stages": list(INT8_STAGES), "frames": CALIBRATION_FRAMES,
           "seed": CALIBRATION_SEED, "cpu_form": fast["key"]}
    meta = out / "codec_decoder.json"
    if meta.is_file():
        try:
            desc = json.loads(meta.read_text())
            files = [f for p in desc["parts"] for f in p["files"]]
            files += [desc["transformer_kv"], desc["transformer_kv_bin"]]
            if desc.get("key") == key and all((out / f).is_file() for f in files):
                return out, desc
        except (ValueError, KeyError, TypeError):
            pass
    if log:
        log(f"codec int8 tier: calibrating on {CALIBRATION_FRAMES} frames of random codes ...")
    out.mkdir(exist_ok=True)
    meta.unlink(missing_ok=True)
    chosen = {}  # part index -> {the convolutions made int8 -> the blob each reads}
    for k, p in enumerate(fast["parts"]):
        stage = stage_of_part(k, config)
        if stage in INT8_STAGES:
            text = (fast_dir / p["files"][0]).read_text()
            names = set(residual_convolutions(text, int(config["decoder_dim"]) // 2 ** stage))
            if names:  # else nothing of the residual width in this part: it stays the CPU form's
                chosen[k] = {lyr.name: lyr.inputs[0] for lyr in Graph(text).layers if lyr.name in names}
    parts = load_parts(fast_dir, fast, threads)
    observed = {k: _Observed(parts[k], sorted(set(chosen[k].values()))) for k in chosen}
    codes = np.random.default_rng(CALIBRATION_SEED).integers(
        0, config["codebook_size"], (CALIBRATION_FRAMES, int(config["num_quantizers"])))
    x = transformer_output(parts, codes, config, manifest_axes(fast_dir / "manifest.json"))
    run_parts([observed.get(k, part) for k, part in enumerate(parts) if k >= 2], x)
    seen = {k: o.absmax for k, o in observed.items()}
    del parts, observed  # the fp32 nets
    desc = {"key": key, "parts": [], "calibration": {}, "stats": {}, "gemm_stats": {}}
    moves = []

    def stage(name: str, content) -> None:
        """`content` written under a temporary name, renamed at the end."""
        tmp = out / f"{name}.tmp{os.getpid()}"
        tmp.write_text(content) if isinstance(content, str) else tmp.write_bytes(content)
        moves.append((tmp, out / name))

    for k, p in enumerate(fast["parts"]):
        text = (fast_dir / p["files"][0]).read_text() if k >= 2 else ""
        has_gemms = any(lyr.type == "Gemm" for lyr in Graph(text).layers) if text else False
        if k not in chosen and not has_gemms:
            desc["parts"].append(p | {"files": [f"../{FAST_DIR}/{f}" for f in p["files"]]})
            continue
        data = (fast_dir / p["files"][1]).read_bytes()
        if has_gemms:  # the ConvNeXt upsampler's pointwise projections: the loop's int8 Gemm
            text, data, stats = int8_projections(text, data)
            desc["gemm_stats"][str(k)] = {"gemms": stats["gemms"], "weights": stats["weights"]}
        if k in chosen:
            group_max: dict[str, float] = {}
            for name, blob in chosen[k].items():
                g = calibration_group(name)
                group_max[g] = max(group_max.get(g, 0.0), seen[k][blob])
            absmax = {name: group_max[calibration_group(name)] for name in chosen[k]}
            text, data, stats = int8_convolutions(text, data, absmax)
            desc["calibration"][str(k)] = {g: round(v, 6) for g, v in sorted(group_max.items())}
            desc["stats"][str(k)] = {"stage": stage_of_part(k, config), "convolutions": stats["convolutions"],
                                     "weights": stats["weights"],
                                     "weight_rel_rms_max": round(max(stats["weight_rel_rms"]), 5)}
        files = [f"codec_decoder.part{k}.param", f"codec_decoder.part{k}.bin"]
        stage(files[0], text)
        stage(files[1], data)
        desc["parts"].append(p | {"files": files})
    # the transformer's cached form (what a stream runs, one position a push): its inner projections int8
    kv_text = (fast_dir / fast["transformer_kv"]).read_text()
    gemms = [lyr.name for lyr in Graph(kv_text).layers if lyr.type == "Gemm"]
    text, data, stats = int8_projections(kv_text, (fast_dir / fast["parts"][1]["files"][1]).read_bytes(),
                                         keep=(gemms[0], gemms[-1]))
    desc["transformer_kv"], desc["transformer_kv_bin"] = "codec_decoder.part1_kv.param", "codec_decoder.part1_kv.bin"
    stage(desc["transformer_kv"], text)
    stage(desc["transformer_kv_bin"], data)
    desc["transformer_kv_stats"] = {"gemms": stats["gemms"], "weights": stats["weights"],
                                    "kept_fp32": [gemms[0], gemms[-1]]}
    desc["manifest"] = f"../{FAST_DIR}/manifest.json"
    for tmp, dst in moves:
        os.replace(tmp, dst)
    tmp_meta = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(desc, indent=1))
    os.replace(tmp_meta, meta)
    return out, desc
