"""Run code in a fresh Python in which torch, transformers and qwen_tts cannot be imported. Introduced in 07.

This is how the tutorial proves that the runtime is torch-free: not by reading import lines,
but by making the imports fail and running the real thing.
"""
from __future__ import annotations

import subprocess
import sys

BLOCKED = ("torch", "transformers", "qwen_tts")
PRELUDE = f"""import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BLOCKED!r}:
            raise ImportError('blocked for this run: ' + name)
sys.meta_path.insert(0, _Block())
"""


def run_without_torch(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c PRELUDE + code args...`, output captured as text."""
    return subprocess.run([sys.executable, "-c", PRELUDE + code, *args], capture_output=True, text=True)


def qtts_without_torch(*args: str) -> subprocess.CompletedProcess:
    """The `qtts` CLI (`qtts say ...`) in a process where torch cannot be imported."""
    return run_without_torch("from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))", *args)
