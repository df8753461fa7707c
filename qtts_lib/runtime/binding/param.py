"""ncnn `.param` text as data: parse it, change it, write it back. Introduced in 04.

A `.param` is a magic line, `layer_count blob_count`, then one line per layer:
`type name n_in n_out inputs... outputs... key=value...`. The export side reads what pnnx wrote
(chapter 04) and rewrites it (the KV cache, chapter 05); the runtime rewrites graphs at load time
for speed and for the GPU (`runtime.rewrites`). Both use these few functions.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ParamLayer:
    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: list[str]


@dataclass
class ParamInfo:
    magic: int
    layers: list[ParamLayer]
    counts: Counter = field(default_factory=Counter)

    @property
    def leftovers(self) -> list[ParamLayer]:
        """Layers ncnn cannot run: pnnx-internal ops that no pass converted."""
        return [layer for layer in self.layers if layer.type.startswith("pnnx.") or layer.type.startswith("torch.")
                or layer.type.startswith("Tensor.") or layer.type.startswith("nn.") or layer.type.startswith("F.")]

    @property
    def input_blobs(self) -> list[str]:
        return [b for layer in self.layers if layer.type == "Input" for b in layer.outputs]


def parse_param(text: str) -> ParamInfo:
    """Parse ncnn .param text: magic line, `layer_count blob_count`, then one layer per line."""
    lines = [line for line in text.splitlines() if line.strip()]
    magic = int(lines[0])
    n_layers, _ = (int(x) for x in lines[1].split())
    layers = []
    for line in lines[2 : 2 + n_layers]:
        tok = line.split()
        typ, name, n_in, n_out = tok[0], tok[1], int(tok[2]), int(tok[3])
        ins = tok[4 : 4 + n_in]
        outs = tok[4 + n_in : 4 + n_in + n_out]
        layers.append(ParamLayer(typ, name, ins, outs, tok[4 + n_in + n_out :]))
    return ParamInfo(magic, layers, Counter(layer.type for layer in layers))


def read_param(path: str | Path) -> ParamInfo:
    return parse_param(Path(path).read_text())


def format_param(magic: int, layers: list[ParamLayer]) -> str:
    """.param text from layers, with the layer and blob counts recomputed."""
    blobs = {b for layer in layers for b in layer.inputs + layer.outputs}
    rows = [str(magic), f"{len(layers)} {len(blobs)}"]
    for layer in layers:
        rows.append(" ".join([f"{layer.type:<24}", f"{layer.name:<24}", str(len(layer.inputs)), str(len(layer.outputs))]
                             + layer.inputs + layer.outputs + layer.params).rstrip())
    return "\n".join(rows) + "\n"
