"""The 10 export-friendly torch wrappers of Qwen3-TTS. Introduced in 02.

Control flow (sampling, choosing a table per step, building the prompt) stays in the
host language; only tensor math goes into a graph. Each wrapper re-expresses one
block of the original model so that pnnx/ncnn can carry it, and each is checked
against the original block at two sequence lengths (chapter 02).

Registry contract (one `ModuleSpec` per module, registered by the submodules):
  build(tts)                 -> torch.nn.Module   the wrapper, eval, fp32
  inputs(tts, length, seed)  -> dict[str, Tensor] named graph inputs, in order
  run_original(tts, inputs)  -> dict[str, Tensor] the original model's blocks on the same inputs
  metric, tolerance          how this module's outputs are compared (chapters 02, 04, 10)
The wrapper's forward(*inputs.values()) returns a tensor or a tuple whose order
matches the keys of run_original(...).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MODULES = [
    "talker_text_embed",
    "talker_codec_embed",
    "talker_decoder",
    "talker_codec_head",
    "predictor_decoder",
    "predictor_embeds",
    "predictor_heads",
    "codec_decoder",
    "speaker_encoder",
    "mimi_encoder",
]


@dataclass
class ModuleSpec:
    name: str
    build: Callable
    inputs: Callable
    run_original: Callable
    lengths: tuple[int, int]
    summary: str
    rewrites: list[str] = field(default_factory=list)
    # max_abs for embeddings and heads; rel (L2) where values grow through layers; snr_db for
    # waveforms; cos for the x-vector, whose scale the prompt never sees.
    metric: str = "max_abs"
    tolerance: float = 1e-5

    def check(self, label: str, ours, ref) -> dict:
        """Record `ours` against `ref` (all outputs flattened together) with this module's metric."""
        from .. import check

        return check.within(label, self.metric, ours, ref, self.tolerance)


_REGISTRY: dict[str, ModuleSpec] = {}


def register(spec: ModuleSpec) -> ModuleSpec:
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> ModuleSpec:
    _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"unknown module {name!r}; known: {', '.join(MODULES)}")
    return _REGISTRY[name]


def all_specs() -> list[ModuleSpec]:
    _load_all()
    return [_REGISTRY[n] for n in MODULES if n in _REGISTRY]


def _load_all() -> None:
    from . import codec, mimi, speaker, talker  # noqa: F401  (they register themselves)
