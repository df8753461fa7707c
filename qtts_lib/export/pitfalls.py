"""Small helpers for chapter 04b, which reproduces the pnnx/ncnn pitfalls. Introduced in 04b.

- `pnnx_cli` runs pnnx the way a first attempt does (the arguments you give, nothing else),
  so a demo can leave out `input2=` or `fp16=0` on purpose. `export_module` is the careful way.
- `run_isolated` / `ncnn_isolated` run code, or one ncnn forward pass, in a child Python: some
  pitfalls kill the process (SIGFPE, SIGSEGV), and the notebook must survive to report it.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import _batch_axes, pnnx_binary


def pnnx_cli(wrapper, name: str, work: str | Path, inputs: dict, inputs2: dict | None = None, **options) -> dict:
    """Trace `wrapper` at `inputs`, run `pnnx <name>.pt input=... [input2=...] key=value...` in `work`.

    Returns the paths pnnx wrote, its exit status and log, and the batch axes it chose."""
    import torch

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.jit.trace(wrapper, tuple(inputs.values()), check_trace=False).save(str(work / f"{name}.pt"))
    cmd = [pnnx_binary(), f"{name}.pt"]
    for key, ins in (("input", inputs), ("input2", inputs2)):
        if ins is not None:
            files = [f"{name}_{key}_{i}.npy" for i in range(len(ins))]
            for f, t in zip(files, ins.values()):
                np.save(work / f, t.detach().cpu().numpy())
            cmd.append(f"{key}=" + ",".join(files))
    cmd += [f"{k}={v}" for k, v in options.items()]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    script = work / f"{name}_ncnn.py"
    in_axes, out_axes = _batch_axes(script.read_text()) if script.is_file() else ([], [])
    return {"param": work / f"{name}.ncnn.param", "bin": work / f"{name}.ncnn.bin", "returncode": proc.returncode,
            "log": proc.stdout + proc.stderr, "command": " ".join(cmd[1:]),
            "input_batch_axes": in_axes, "output_batch_axes": out_axes}


@dataclass
class Isolated:
    """What a child process did: exit status, the signal that killed it (if any), its output."""
    returncode: int
    stdout: str
    stderr: str
    outputs: dict = field(default_factory=dict)

    @property
    def signal(self) -> str | None:
        return signal.Signals(-self.returncode).name if self.returncode < 0 else None

    @property
    def status(self) -> str:
        return f"killed by {self.signal} (returncode {self.returncode})" if self.signal else f"exit {self.returncode}"


def run_isolated(code: str, *args: str, timeout: float = 120) -> Isolated:
    """Run `python -c code args...` in a child process."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    return Isolated(proc.returncode, proc.stdout, proc.stderr)


_FORWARD = """
import json, sys
import numpy as np
from qtts_lib.runtime.net import make_net, to_mat, from_mat
param, binf, npz_in, npz_out, spec = sys.argv[1:6]
spec = json.loads(spec)
net = make_net(param, binf, spec["threads"])
arrays = np.load(npz_in)
ex = net.create_extractor()
for i, ax in enumerate(spec["in_axes"]):
    ex.input(f"in{i}", to_mat(arrays[f"in{i}"], ax))
outs, rets = {}, {}
for name, ax in zip(spec["outputs"], spec["out_axes"]):
    rets[name], m = ex.extract(name)
    if rets[name] == 0 and m.dims > 0:
        outs[name] = from_mat(m, ax)
np.savez(npz_out, **outs)
print(json.dumps({"rets": rets, "empty": [n for n in spec["outputs"] if n not in outs]}))
"""


def ncnn_isolated(param, bin, arrays: list[np.ndarray], in_axes: list[int], out_axes: list[int],
                  outputs: list[str] | None = None, threads: int = 2) -> Isolated:
    """One forward pass through `runtime.net` in a child process; `.outputs` maps blob name -> array
    (an empty blob is left out), `.stdout` holds the extract return codes as JSON."""
    outputs = outputs or [f"out{i}" for i in range(len(out_axes))]
    with tempfile.TemporaryDirectory(prefix="ncnn_isolated_") as tmp:
        npz_in, npz_out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(npz_in, **{f"in{i}": a for i, a in enumerate(arrays)})
        spec = json.dumps({"threads": threads, "in_axes": in_axes, "out_axes": out_axes, "outputs": outputs})
        res = run_isolated(_FORWARD, str(param), str(bin), str(npz_in), str(npz_out), spec)
        if res.returncode == 0:
            with np.load(npz_out) as f:
                res.outputs = {k: f[k] for k in f.files}
    return res
