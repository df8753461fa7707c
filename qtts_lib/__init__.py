"""qtts_lib: the shared package of the qtts tutorial (Qwen3-TTS 12 Hz on ncnn).

Torch-side modules (`checkpoint`, `reference`, `modules`, `export`) drive the
reference model; `runtime` is the deployable numpy + ncnn side and never
imports torch, transformers or qwen_tts.
"""

__version__ = "0.1.0"
