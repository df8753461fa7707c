"""qtts_lib.runtime is the deployable side: it must import with torch, transformers and qwen_tts unavailable."""
import pkgutil
import subprocess
import sys

import qtts_lib.runtime

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'qwen_tts'):
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
import importlib
for mod in {mods!r}:
    importlib.import_module(mod)
print('imported', len({mods!r}), 'modules')
"""


def test_runtime_imports_without_torch():
    mods = ["qtts_lib.runtime"] + [
        f"qtts_lib.runtime.{m.name}" for m in pkgutil.iter_modules(qtts_lib.runtime.__path__)
    ]
    r = subprocess.run([sys.executable, "-c", BLOCK.format(mods=mods)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"imported {len(mods)} modules" in r.stdout


def test_the_blocker_really_blocks():
    r = subprocess.run([sys.executable, "-c", BLOCK.format(mods=["qtts_lib.reference", "torch"])],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "blocked for this test" in r.stderr
