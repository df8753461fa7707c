"""qtts_lib.runtime is the deployable side: it must import with torch, transformers and qwen_tts unavailable."""
import pkgutil

import qtts_lib.runtime
from qtts_lib.isolation import run_without_torch

IMPORT_ALL = """
import importlib
for mod in sys.argv[1:]:
    importlib.import_module(mod)
print('imported', len(sys.argv) - 1, 'modules')
"""


def test_runtime_imports_without_torch():
    mods = ["qtts_lib.runtime"] + [
        f"qtts_lib.runtime.{m.name}" for m in pkgutil.iter_modules(qtts_lib.runtime.__path__)
    ]
    r = run_without_torch(IMPORT_ALL, *mods)
    assert r.returncode == 0, r.stderr
    assert f"imported {len(mods)} modules" in r.stdout


def test_the_blocker_really_blocks():
    r = run_without_torch(IMPORT_ALL, "qtts_lib.reference", "torch")
    assert r.returncode != 0 and "blocked for this run" in r.stderr
