"""The codec's CPU form on disk: written once next to the exports, rewritten when they change. Introduced in 12.

`fast_graph` applies `rewrites.codec_cpu.codec_fast_parts` to the exported codec decoder, measures each part's
left context (`parts.reach`), sizes each part's chunk and time tiles from it, and writes the parts under
`ncnn/fast/` with a description (`codec_decoder.json`) that `codec.decoder.Codec` loads.

The tuning constants below were measured on the full-size random checkpoint at one thread (chapter 12 shows how);
they only choose between equal computations, so a wrong guess costs speed, never correctness.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from ..binding.net import make_net, net_from_text
from ..rewrites.codec_cpu import codec_fast_parts, stateful_convolutions
from ..rewrites.kv_cache import add_kv_cache
from .parts import Part, attention_inputs, codes_reach, reach, run_codes

FORM_VERSION = 4  # bump when the codec's CPU form changes: the cached files are rewritten
FAST_DIR = "fast"  # under the ncnn directory: the CPU form of the codec graph, written on first load
PART_OVERHEAD = 0.025  # a part's left context as a share of its chunk: sets the chunk length per part
TILE_SAMPLES = {96: 2400, 192: 3200, 384: 1600}  # input channels -> samples per time tile (full-base, 1 thread)


def part_time_tiles(config: dict, stage: int, channels: int, chunk_frames: int | None) -> int:
    """Time tiles for a convolution with `channels` inputs in the part that runs decoder upsampling stage `stage`
    (1..; 0 for every other part, which is never tiled): its samples per call over `TILE_SAMPLES[channels]`, at
    most its samples per frame (a one-frame call leaves no tile empty), 0 where the stage does not run at that
    width."""
    if stage < 1 or channels not in TILE_SAMPLES or chunk_frames is None:
        return 0
    ratios, rates = config["upsampling_ratios"], config["upsample_rates"]
    width, spf = int(config["decoder_dim"]) // 2 ** (stage - 1), int(np.prod(ratios)) * int(np.prod(rates[:stage - 1]))
    if channels == width:          # the stage's input convolution: at its input rate
        pass
    elif channels == width // 2:   # the stage's residual units: at its output rate
        spf *= int(rates[stage - 1])
    else:
        return 0
    n = round(chunk_frames * spf / TILE_SAMPLES[channels])
    return min(n, spf) if n > 1 else 0


def fast_graph(ncnn_dir, config: dict, threads: int = 1) -> tuple[Path, dict]:
    """The directory holding `rewrites.codec_cpu.codec_fast_parts` of the exported codec decoder (with a copy of the
    manifest), the transformer part with a KV cache (`rewrites.kv_cache.add_kv_cache`, for streaming), and their
    description (`codec_decoder.json`: per part its role, the context measured by `reach`/`codes_reach`, the chunk
    length, samples per frame), written on first use and rewritten when the exported files or the rewrite change.

    The cache is keyed by the size and mtime of the exported .param/.bin/manifest, `FORM_VERSION`,
    `PART_OVERHEAD` and `TILE_SAMPLES`; files are written under temporary names and renamed, the key last. (Loading
    the rewritten bytes from memory is not an option: the binding's `load_model_mem` keeps pointers into a buffer
    Python may free.)"""
    src = Path(ncnn_dir)
    param, weights, manifest = src / "codec_decoder.param", src / "codec_decoder.bin", src / "manifest.json"
    out = src / FAST_DIR
    key = {"version": FORM_VERSION, "overhead": PART_OVERHEAD,
           "tile_samples": {str(c): n for c, n in sorted(TILE_SAMPLES.items())},
           **{f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in (param, weights, manifest)}}
    meta = out / "codec_decoder.json"
    if meta.is_file():
        try:
            desc = json.loads(meta.read_text())
            files = [f for p in desc["parts"] for f in p["files"]] + [desc["transformer_kv"]]
            if desc.get("key") == key and all((out / f).is_file() for f in files):
                return out, desc
        except (ValueError, KeyError, TypeError):
            pass
    out.mkdir(exist_ok=True)
    meta.unlink(missing_ok=True)
    rates = [int(r) for r in config["upsampling_ratios"]] + [int(r) for r in config["upsample_rates"]]
    spf = [int(np.prod(rates[:j])) for j in range(len(rates))]  # at the input of upsampling part 2 + j
    n_pre = len(config["upsampling_ratios"])
    in_axes = manifest_axes(manifest)
    text, data = param.read_text(), weights.read_bytes()
    # 1. contexts and chunk lengths, measured on the parts without time tiles (tiles do not change what is summed),
    #    each part fed what the parts before it make of 16 frames of random codes
    plain = codec_fast_parts(text, data, config)
    measured, held = [], []
    try:
        parts = []
        for k, (t, b) in enumerate(plain):
            held.append(out / f"measure{k}.tmp{os.getpid()}.bin")
            held[-1].write_bytes(b)
            parts.append(Part(net_from_text(t, held[-1], threads)))
        codes = np.random.default_rng(0).integers(0, config["codebook_size"], (16, int(config["num_quantizers"])))
        code_context = codes_reach(parts[0], codes, config, in_axes)
        x = parts[1](run_codes(parts[0], codes, config, in_axes), **attention_inputs(config, len(codes)))
        for j in range(len(rates)):
            part = Part(parts[2 + j].net, spf[j], rates[j])
            context = reach(part, x)
            measured.append({"context": context, "chunk_frames": max(1, math.ceil(context / (PART_OVERHEAD * spf[j])))})
            x = part(x)
        del parts, part
    finally:
        for f in held:
            f.unlink(missing_ok=True)
    # 2. the parts the runtime loads: time tiles sized to each decoder stage's chunk
    chunks = [None, None] + [m["chunk_frames"] for m in measured]
    stage = [0, 0] + [max(0, j - n_pre + 1) for j in range(len(rates))]
    final = codec_fast_parts(text, data, config,
                                   tiles_of=lambda k, c: part_time_tiles(config, stage[k], c, chunks[k]))
    desc = {"key": key, "parts": [], "transformer_kv": "codec_decoder.part1_kv.param"}
    moves = []

    def stage_file(name: str, content) -> None:
        tmp = out / f"{name}.tmp{os.getpid()}"
        tmp.write_text(content) if isinstance(content, str) else tmp.write_bytes(content)
        moves.append((tmp, out / name))

    for k, (t, b) in enumerate(final):
        files = [f"codec_decoder.part{k}.param", f"codec_decoder.part{k}.bin"]
        stage_file(files[0], t)
        stage_file(files[1], b)
        if k == 0:
            entry = {"role": "codes", "context": code_context}
        elif k == 1:
            entry = {"role": "transformer"}
            stage_file(desc["transformer_kv"], add_kv_cache(t))
        else:
            entry = {"role": "upsample", "spf": spf[k - 2], "up": rates[k - 2]} | measured[k - 2]
        desc["parts"].append({"files": files} | entry)
    tmp_manifest = out / f"manifest.json.tmp{os.getpid()}"
    shutil.copyfile(manifest, tmp_manifest)
    moves.append((tmp_manifest, out / "manifest.json"))
    for tmp, dst in moves:
        os.replace(tmp, dst)
    tmp_meta = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(desc, indent=1))
    os.replace(tmp_meta, meta)  # the key last: a half-written cache is never taken as done
    current = {f for p in desc["parts"] for f in p["files"]} | {desc["transformer_kv"]}
    for stale in [*out.glob("codec_decoder.part*"), out / "codec_decoder.param", out / "codec_decoder.bin"]:
        if stale.name not in current and ".tmp" not in stale.name:  # older versions' files
            stale.unlink(missing_ok=True)
    return out, desc


def manifest_axes(manifest: Path) -> list[int]:
    return json.loads(manifest.read_text())["codec_decoder.param"]["input_batch_axes"]


def load_parts(directory: Path, desc: dict, threads: int, device: str = "cpu", bf16: bool = False,
               pool=None, stateful: bool = False) -> list[Part]:
    """The parts `desc` (a `codec_decoder.json`) names, files relative to `directory`, loaded; `bf16`: ncnn's bf16
    storage on the upsampling parts (2..), nearly all of the codec's arithmetic (codebooks and transformer fp32);
    `pool`: one memory pool for all of them (`binding.net.memory_pool`); `stateful`: the upsampling parts with
    their convolutions' states as inputs and outputs (`rewrites.codec_cpu.stateful_convolutions`, what the codec
    runs), else as written (left context; what calibration and `reach` measure)."""
    parts = []
    for i, p in enumerate(desc["parts"]):
        param = directory / p["files"][0]
        states: list = []
        rewrite = None
        if stateful and i >= 2:
            text, states = stateful_convolutions(param.read_text())
            rewrite = lambda _, text=text: text  # noqa: E731
        parts.append(Part(make_net(param, directory / p["files"][1], threads, device, rewrite,
                                   bf16=bf16 and i >= 2, allocator=pool),
                          p.get("spf", 1), p.get("up", 1), p.get("context", 0), p.get("chunk_frames"), pool,
                          tuple(states)))
    return parts
