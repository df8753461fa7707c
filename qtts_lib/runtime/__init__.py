"""The torch-free runtime: numpy + ncnn (+ soundfile) only.

This subpackage is the deployable product of the tutorial. It must import with
torch, transformers and qwen_tts unavailable (tests/test_runtime_imports.py).
"""
