"""What ncnn's C++ API buys on Vulkan over the pip binding: the probe of chapter 10.

    python -m qtts_lib.lab.cpp_probe MODEL_DIR NCNN_SRC OUT.json [--pasts 16,64,128]

Builds `cpp/vulkan_probe.cpp` against ncnn's source (NCNN_SRC: an ncnn tree with glslang/ in it; CMake and a C++
compiler needed), then times the GPU loop's one-position graphs (the talker's GEMV step and the code predictor's
GEMV step with its heads, `rewrites.gpu_layers`; separate cache blobs) at several cache lengths, four ways, in one
process per graph, the same inputs:

- `binding_ms`: the pip binding, every cache a Mat in and out (the graph before `one_blob_io`);
- `binding_one_blob_ms`: the pip binding on the graph the runtime runs (`one_blob_io`: one upload, one download);
- `host_ms`: C++, host Mats in and out (the binding's way without Python);
- `resident_ms`: C++, the caches kept on the GPU as `VkMat` from call to call (each call's cache outputs are the
  next call's inputs), the row, mask and rope tables uploaded and the output downloaded in the call's one command;
- `chained_ms_per_call`: the same with several calls recorded into one command and submitted once;
- `submit_floor_ms`: one command that moves 4 bytes up and down.

Weights may be zero-filled (`bench zeros`): fp32 kernels take the same time whatever the values.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent / "cpp"


def build(ncnn_src: str | Path, build_dir: str | Path) -> Path:
    """Configure and build the probe (Release, Ninja); the binary's path."""
    build_dir = Path(build_dir)
    for cmd in (["cmake", "-S", str(HERE), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DNCNN_SRC={Path(ncnn_src).resolve()}"], ["ninja", "-C", str(build_dir), "vulkan_probe"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return build_dir / "vulkan_probe"


def step_inputs(cfg: dict, past: int, layers: int, rng) -> dict[str, np.ndarray]:
    """A one-position step's inputs at `past` cached positions, as `binding.cached.KvCacheNet.forward` makes them
    (the batch axis of in0 dropped), caches (kv_heads, past, head_dim) per layer."""
    from ..runtime.binding import rope

    hd, kvh = cfg["head_dim"], cfg["num_key_value_heads"]
    cos, sin = rope.tables(hd, cfg["rope_theta"], past, 1)
    inputs = {"in0": rng.standard_normal((1, cfg["hidden_size"])).astype(np.float32),
              "in1": rope.causal_mask(1, past), "in2": cos, "in3": sin}
    for i in range(layers):
        for kv in "kv":
            inputs[f"cache_{kv}_in_{i}"] = rng.standard_normal((kvh, past, hd)).astype(np.float32)
    return inputs


def _binding_ms(text: str, bin_path: Path, inputs: dict, outputs: list[str], raw: list[str], repeats: int) -> float:
    from ..runtime.binding.net import net_from_text, run, to_mat

    net = net_from_text(text, bin_path, 1, "vulkan")
    mats = {k: to_mat(v) for k, v in inputs.items()}
    run(net, mats, outputs, raw=raw)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(net, mats, outputs, raw=raw)
        times.append(time.perf_counter() - t0)
    return round(float(np.median(times)) * 1e3, 3)


def measure(binary: Path, text: str, bin_path: Path, inputs: dict, outputs: list[str], caches: list[str],
            tmp: Path, repeats: int = 20, chain: int = 4) -> dict:
    """The C++ probe on one graph: writes the .param, the inputs (raw float32) and the spec; its JSON."""
    param = tmp / "graph.param"
    param.write_text(text)
    lines = [f"param {param}", f"bin {bin_path}", f"repeats {repeats}", f"chain {chain}"]
    for name, a in inputs.items():
        f = tmp / f"{name}.raw"
        np.ascontiguousarray(a, np.float32).tofile(f)
        lines.append(f"input {name} {a.ndim} {' '.join(map(str, a.shape))} {f}")
    lines += [f"output {o}" for o in outputs]
    lines += [f"cache {c} {c.replace('_in_', '_out_')}" for c in caches]
    (tmp / "spec.txt").write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(binary), str(tmp / "spec.txt")], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"the probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe(model_dir: str | Path, binary: Path, pasts=(16, 64, 128), repeats: int = 20, log=print) -> dict:
    from ..runtime.pipeline import precision
    from ..runtime.rewrites.gpu import fused_predictor_param
    from ..runtime.rewrites.gpu_layers import ensure_gpu_decoder, gemv_heads, one_blob_io

    model_dir = Path(model_dir)
    ncnn_dir = model_dir / "ncnn"
    cfg = json.loads((model_dir / "config.json").read_text())["talker_config"]
    pcfg = cfg["code_predictor_config"]
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        talker = ensure_gpu_decoder(ncnn_dir, "talker_decoder", log=log)
        pred = ensure_gpu_decoder(ncnn_dir, "predictor_decoder", log=log)
        merged = tmp / "predictor_fused.bin"
        with merged.open("wb") as out:
            for part in (pred["bin"], ncnn_dir / "predictor_heads.bin"):
                out.write(part.read_bytes())
        fused = fused_predictor_param(pred["step"].read_text(), gemv_heads((ncnn_dir / "predictor_heads.param")
                                                                           .read_text()))
        graphs = [("talker step", talker["step"].read_text(), talker["bin"], cfg, "talker_decoder", ["out0"], pasts),
                  ("predictor step", fused, merged, pcfg, "predictor_decoder", ["logits_0"], (1, 8, 15))]
        for label, text, bin_path, c, name, outputs, lengths in graphs:
            layers = precision.cached_layers(ncnn_dir, name)
            caches = [f"cache_{kv}_in_{i}" for i in range(layers) for kv in "kv"]
            raw = [b.replace("_in_", "_out_") for b in caches]
            blob = one_blob_io(text, c["head_dim"], c["num_key_value_heads"], tuple(outputs), row=c["hidden_size"])
            for past in lengths:
                inputs = step_inputs(c, past, layers, rng)
                row = measure(binary, text, bin_path, inputs, outputs, caches, tmp, repeats)
                row["binding_ms"] = _binding_ms(text, bin_path, inputs, outputs + raw, raw, repeats)
                flat = np.concatenate([inputs[b].ravel() for b in caches])
                x = np.concatenate([inputs["in0"].ravel(), inputs["in2"].ravel(), inputs["in3"].ravel()])
                row["binding_one_blob_ms"] = _binding_ms(blob, bin_path, {"x": x, "cache_all_in": flat},
                                                         [f"all_{outputs[0]}"], [], repeats)
                row |= {"graph": label, "past": past}
                row.pop("param", None)
                log(json.dumps(row))
                rows.append(row)
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qtts_lib.lab.cpp_probe", description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("ncnn_src")
    p.add_argument("output", type=Path)
    p.add_argument("--pasts", default="16,64,128")
    p.add_argument("--build-dir", default="/tmp/qtts_vulkan_probe")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args(argv)
    from ..bench.machine import describe

    t0 = time.perf_counter()
    binary = build(a.ncnn_src, a.build_dir)
    print(f"built {binary} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    result = {"machine": describe([1]), "checkpoint": Path(a.model_dir).name, "note": __doc__.split("\n\n")[1]}
    result |= probe(a.model_dir, binary, tuple(int(x) for x in a.pasts.split(",")), a.repeats)
    a.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
