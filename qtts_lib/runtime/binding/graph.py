"""Editing a parsed `.param` graph: parameters by key, producers and consumers, fresh names, and cutting a graph in
two. Introduced in 11.

Every `.param` rewrite of the runtime (`runtime.rewrites`) is written over these few helpers.
"""
from __future__ import annotations

from .param import ParamLayer, format_param, parse_param


def params_dict(layer: ParamLayer) -> dict[str, str]:
    """`k=v` tokens of a layer as an ordered dict of strings (array params keep their raw text)."""
    out = {}
    for p in layer.params:
        k, v = p.split("=", 1)
        out[k] = v
    return out


def set_params(layer: ParamLayer, d: dict[str, str]) -> None:
    layer.params = [f"{k}={v}" for k, v in d.items()]


def int_param(d: dict, key: str, default: int) -> int:
    return int(d[key]) if key in d else default


class Graph:
    """Layers plus producer/consumer lookups and fresh names."""

    def __init__(self, text: str):
        info = parse_param(text)
        self.magic, self.layers = info.magic, info.layers
        self._n = 0
        self._used: set[str] | None = None

    def consumers(self, blob: str) -> list[ParamLayer]:
        return [lyr for lyr in self.layers if blob in lyr.inputs]

    def producer(self, blob: str) -> ParamLayer | None:
        return next((lyr for lyr in self.layers if blob in lyr.outputs), None)

    def fresh(self, stem: str) -> str:
        """A layer or blob name used nowhere in the graph yet (an earlier rewrite may have used `stem_spN`)."""
        if self._used is None:
            self._used = {n for lyr in self.layers for n in (lyr.name, *lyr.inputs, *lyr.outputs)}
        while True:
            self._n += 1
            name = f"{stem}_sp{self._n}"
            if name not in self._used:
                self._used.add(name)
                return name

    def text(self) -> str:
        return format_param(self.magic, self.layers)


def cut_graph(text: str, blob: str) -> tuple[str, str]:
    """`text` cut in two at `blob`: the head (every layer `blob` depends on) with `blob` renamed to its output
    `out0`; the tail (every other layer) reading `blob` from an Input named `in0`, and keeping the graph inputs
    only it reads (with their names). Layers are told apart by position, not name (pnnx repeats the names of
    Split layers). A constant (MemoryData) that both sides read is copied into the tail under its own name, so
    the weights are found for both. Raises ValueError unless `blob` really cuts the graph: the tail may need
    nothing else the head makes (an input both read would be such a blob)."""
    info = parse_param(text)
    producer = {b: i for i, lyr in enumerate(info.layers) for b in lyr.outputs}
    if blob not in producer:
        raise ValueError(f"no layer makes blob {blob!r}")
    head, todo = set(), [blob]
    while todo:
        i = producer[todo.pop()]
        if i not in head:
            head.add(i)
            todo += info.layers[i].inputs
    ahead = [lyr for i, lyr in enumerate(info.layers) if i in head]
    behind = [lyr for i, lyr in enumerate(info.layers) if i not in head]
    crossing = {b for lyr in behind for b in lyr.inputs if b != blob and producer.get(b) in head}
    constants = []  # a constant both sides read (pnnx shares equal parameters through a Split): the tail gets its own
    for b in sorted(crossing):
        src = info.layers[producer[b]]
        while src.type == "Split" and producer.get(src.inputs[0]) is not None:
            src = info.layers[producer[src.inputs[0]]]
        if src.type == "MemoryData":
            constants.append(ParamLayer("MemoryData", src.name, [], [b], list(src.params)))
    crossing -= {lyr.outputs[0] for lyr in constants}
    if crossing:
        raise ValueError(f"blob {blob!r} does not cut the graph in two (the tail also needs {sorted(crossing)})")
    names = {b for lyr in info.layers for b in lyr.inputs + lyr.outputs}
    if "out0" in {b for lyr in ahead for b in lyr.outputs} or "in0" in names - {b for lyr in ahead for b in
                                                                                 lyr.outputs}:
        raise ValueError("the head already has an out0, or the tail an in0")
    head_layers = [ParamLayer(lyr.type, lyr.name, list(lyr.inputs), ["out0" if b == blob else b for b in lyr.outputs],
                              list(lyr.params)) for lyr in ahead]
    tail_layers = [ParamLayer("Input", "in0", [], ["in0"], [])] + constants + [
        ParamLayer(lyr.type, lyr.name, ["in0" if b == blob else b for b in lyr.inputs], list(lyr.outputs),
                   list(lyr.params)) for lyr in behind]
    return format_param(info.magic, head_layers), format_param(info.magic, tail_layers)
