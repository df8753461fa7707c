"""Driving pnnx and reading what it wrote. Introduced in 04.

`export_module` traces a wrapper, runs the pnnx binary with two sets of real inputs
(two lengths, so dynamic dims stay dynamic; real .npy inputs so int32 ids are valid ids),
fp16 off, checks the exit status, learns from pnnx's generated `*_ncnn.py` which axis of
each input and output it took as batch, keeps only `<name>.param/.bin` and deletes every
intermediate (.pt, .pnnx.*, .onnx, generated scripts).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ..runtime.binding.net import NO_BATCH
from ..runtime.binding.param import ParamInfo, ParamLayer, format_param, parse_param, read_param  # noqa: F401


class ExportError(RuntimeError):
    pass


# ---------------------------------------------------------------- pnnx
def pnnx_binary() -> str:
    import pnnx

    return pnnx.EXEC_PATH


def _batch_axes(ncnn_py: str) -> tuple[list[int], list[int]]:
    """Which axis pnnx treats as batch, per input and output, from its generated test script."""
    in_pattern = r'ex\.input\("in(\d+)", ncnn\.Mat\(in\d+\.numpy\(\), batch_index=(\d+)\)'
    ins = [int(b) for _, b in sorted(re.findall(in_pattern, ncnn_py), key=lambda t: int(t[0]))]
    outs = [int(b) for _, b in sorted(re.findall(r"out(\d+)\.numpy\(batch_index=(\d+)\)", ncnn_py),
                                      key=lambda t: int(t[0]))]
    return ins, outs


def export_module(wrapper, name: str, inputs_a: dict, inputs_b: dict, out_dir: str | Path,
                  fp16: bool = False, keep_workdir: bool = False) -> dict:
    """Trace `wrapper` at inputs_a, convert with pnnx at both input sets; returns what was learned."""
    import torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"pnnx_{name}_"))
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            traced = torch.jit.trace(wrapper, tuple(inputs_a.values()), check_trace=False)
        pt = work / f"{name}.pt"
        traced.save(str(pt))
        del traced
        files = {}
        for tag, ins in (("a", inputs_a), ("b", inputs_b)):
            files[tag] = []
            for i, t in enumerate(ins.values()):
                f = work / f"{tag}{i}.npy"
                np.save(f, t.detach().cpu().numpy())
                files[tag].append(f.name)
        cmd = [pnnx_binary(), pt.name, "input=" + ",".join(files["a"]), "input2=" + ",".join(files["b"]),
               f"fp16={int(fp16)}"]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        param, binf = work / f"{name}.ncnn.param", work / f"{name}.ncnn.bin"
        if proc.returncode != 0 or not param.is_file():
            raise ExportError(f"pnnx failed on {name} (exit {proc.returncode}):\n{log[-3000:]}")
        in_batch, out_batch = _batch_axes((work / f"{name}_ncnn.py").read_text())
        shutil.move(param, out_dir / f"{name}.param")
        shutil.move(binf, out_dir / f"{name}.bin")
        shape_line = next((line for line in log.splitlines() if line.startswith("model inputshape")), "")
        return {
            "name": name,
            "input_names": list(inputs_a),
            "input_batch_axes": in_batch,
            "output_batch_axes": out_batch,
            "pnnx_inputshape": shape_line.split("=", 1)[-1].strip(),
            "export_seconds": round(time.perf_counter() - t0, 1),
            "work_bytes_before_cleanup": sum(f.stat().st_size for f in work.rglob("*") if f.is_file()),
        }
    finally:
        if not keep_workdir:
            shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- .param rewrites
def drop_rope_widening(text: str) -> tuple[str, list[str]]:
    """Feed RotaryEmbed the half-width cos/sin inputs directly. Introduced in 04.

    pnnx fuses rope into RotaryEmbed only in HF's form, which needs full-width tables, so
    the wrappers widen the half-width inputs with `cat([t, t], -1)` inside the graph. pnnx
    then takes axis 0 of those inputs for a batch axis and writes the cat as a Concat of
    two Split copies of the Input. We delete each such Concat and let the Split hand the
    Input straight on. Returns the new text and the Input blobs that changed meaning
    (they are now (L, head_dim/2) tables without a batch axis).
    """
    info = parse_param(text)
    producer = {b: layer for layer in info.layers for b in layer.outputs}
    consumers: dict[str, list[ParamLayer]] = {}
    for layer in info.layers:
        for b in layer.inputs:
            consumers.setdefault(b, []).append(layer)
    rope_inputs = {b for layer in info.layers if layer.type == "RotaryEmbed" for b in layer.inputs[1:]}
    drop, changed = set(), []
    for layer in info.layers:
        if layer.type != "Concat" or len(layer.inputs) != 2:
            continue
        srcs = [producer.get(b) for b in layer.inputs]
        split = srcs[0]
        if split is None or split.type != "Split" or srcs[1] is not split:
            continue
        if any(c is not layer for b in split.outputs for c in consumers.get(b, [])):
            continue
        fed = _downstream_of(layer.outputs[0], producer, consumers)
        if not fed & rope_inputs:
            continue
        split.outputs = [layer.outputs[0]]
        drop.add(layer.name)
        changed.append(split.inputs[0])
    layers = [layer for layer in info.layers if layer.name not in drop]
    return format_param(info.magic, layers), changed


def _downstream_of(blob: str, producer, consumers) -> set[str]:
    """The blob and the blobs a chain of Splits copies it into."""
    out, todo = {blob}, [blob]
    while todo:
        for c in consumers.get(todo.pop(), []):
            if c.type == "Split":
                out.update(c.outputs)
                todo.extend(c.outputs)
    return out


# ---------------------------------------------------------------- the whole model
PRODUCER = "04_export_align"


def code_hash() -> str:
    """Changes when the wrappers or this exporter change: exports made by older code are rebuilt."""
    import hashlib

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted((root / "modules").glob("*.py")) + [Path(__file__)]:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def expected_layers(name: str, cfg: dict) -> dict[str, int]:
    """Layer counts a correct export must contain (besides having no leftover pnnx ops)."""
    talker = cfg["talker_config"]
    n = {"talker_decoder": talker["num_hidden_layers"],
         "predictor_decoder": talker["code_predictor_config"]["num_hidden_layers"]}.get(name)
    if n is None:
        return {}
    return {"SDPA": n, "RotaryEmbed": 2 * n}


def is_fresh(out_dir: Path, name: str, ckpt: str) -> bool:
    from .. import artifacts

    try:
        entry = artifacts.verify(out_dir / f"{name}.param", ckpt)
    except artifacts.StaleArtifact:
        return False
    return entry.get("code_hash") == code_hash() and (out_dir / f"{name}.bin").is_file()


def export_spec(tts, spec, ckpt: str, out_dir: Path) -> dict:
    """Export one registered module at its two lengths, fix the rope inputs, record the manifest entry."""
    from .. import artifacts

    wrapper = spec.build(tts)
    a, b = (spec.inputs(tts, n, seed=i) for i, n in enumerate(spec.lengths))
    info = export_module(wrapper, spec.name, a, b, out_dir)
    param = out_dir / f"{spec.name}.param"
    text, changed = drop_rope_widening(param.read_text())
    if changed:
        param.write_text(text)
        info["input_batch_axes"] = [NO_BATCH if f"in{i}" in changed else ax
                                    for i, ax in enumerate(info["input_batch_axes"])]
        info["rope_inputs_made_half_width"] = changed
    info["bin_bytes"] = (out_dir / f"{spec.name}.bin").stat().st_size
    info["layer_counts"] = dict(read_param(param).counts)
    artifacts.record(param, PRODUCER, ckpt, {"lengths": list(spec.lengths)}, code_hash=code_hash(), fp16=False, **info)
    return info


def export_all(tts, ckpt: str, names: list[str] | None = None, force: bool = False) -> dict[str, dict]:
    """Export every module of `ckpt` into models/<ckpt>/ncnn/, skipping fresh ones. Introduced in 04."""
    from tqdm.auto import tqdm

    from .. import artifacts, modules, paths

    out_dir = paths.ncnn_dir(ckpt)
    specs = [s for s in modules.all_specs() if names is None or s.name in names]
    if tts.model.speaker_encoder is None:
        specs = [s for s in specs if s.name != "speaker_encoder"]
    done = {}
    for spec in (bar := tqdm(specs, desc="pnnx")):
        bar.set_postfix_str(spec.name)
        if force or not is_fresh(out_dir, spec.name, ckpt):
            export_spec(tts, spec, ckpt, out_dir)
        done[spec.name] = artifacts.read_manifest(out_dir)[f"{spec.name}.param"]
    if any(s.name == "mimi_encoder" for s in specs):
        write_rvq_tables(tts, ckpt)
    return done


def ensure(tts, ckpt: str, names: list[str] | None = None, kv_cache: bool = True) -> dict[str, dict]:
    """What later chapters need from 04 and 05: every module exported (current exports reused) and,
    with `kv_cache`, the decoders' `<name>_kv.param` written. Introduced in 05."""
    from .kvcache import CACHED, write_kv_param

    done = export_all(tts, ckpt, names)
    if kv_cache:
        for name in CACHED:
            if name in done:
                write_kv_param(ckpt, name)
    return done


def write_rvq_tables(tts, ckpt: str) -> Path:
    """The Mimi quantizer's projections and codebooks as .npz, for the numpy split RVQ of the runtime."""
    from .. import artifacts, paths
    from ..modules import mimi

    path = paths.ncnn_dir(ckpt) / "mimi_rvq.npz"
    return artifacts.save_npz(path, PRODUCER, ckpt, {"from": "speech_tokenizer encoder.quantizer"},
                              {"code_hash": code_hash()}, **mimi.rvq_tables(tts))
