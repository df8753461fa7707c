"""qtts_lib.runtime is the deployable side: it must import with torch, transformers and qwen_tts unavailable; its
layers import downwards only (no module is imported by a module it imports); its public API is the package."""
import ast
import pkgutil
from pathlib import Path

import qtts_lib.runtime
from qtts_lib.isolation import run_without_torch

IMPORT_ALL = """
import importlib
for mod in sys.argv[1:]:
    importlib.import_module(mod)
print('imported', len(sys.argv) - 1, 'modules')
"""
ROOT = Path(qtts_lib.runtime.__file__).parent


def runtime_modules() -> list[str]:
    return ["qtts_lib.runtime"] + [m.name for m in pkgutil.walk_packages(qtts_lib.runtime.__path__,
                                                                         "qtts_lib.runtime.")]


def test_runtime_imports_without_torch():
    mods = runtime_modules()
    assert len(mods) > 40 and "qtts_lib.runtime.pipeline.loop" in mods
    r = run_without_torch(IMPORT_ALL, *mods)
    assert r.returncode == 0, r.stderr
    assert f"imported {len(mods)} modules" in r.stdout


def test_the_blocker_really_blocks():
    r = run_without_torch(IMPORT_ALL, "qtts_lib.reference", "torch")
    assert r.returncode != 0 and "blocked for this run" in r.stderr


def imports_of(name: str) -> set[str]:
    """The runtime modules `name` imports (relative and absolute imports; a package's own __init__ left out)."""
    mods = set(runtime_modules())
    path = ROOT.parent.parent / (name.replace(".", "/") + ("/__init__.py" if (ROOT.parent.parent / name.replace(
        ".", "/")).is_dir() else ".py"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found |= {m for m in [base] + [f"{base}.{a.name}" for a in node.names] if m in mods}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in mods}
    return {m for m in found if m != name and not name.startswith(m + ".")}


def test_no_module_is_imported_by_a_module_it_imports():
    graph = {m: imports_of(m) for m in runtime_modules()}
    cycles = []

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        return seen

    for m in graph:
        if m in reach(m):
            cycles.append(m)
    assert not cycles, f"import cycles through {cycles}"
    assert "qtts_lib.runtime.binding.net" in graph["qtts_lib.runtime.pipeline.loop"]  # the walk sees imports


def test_the_public_api_is_the_package():
    from qtts_lib.runtime import Result, Sampling, Stream, Synthesizer, Voice, load_wav  # noqa: F401

    assert Synthesizer.__module__ == "qtts_lib.runtime.pipeline.synthesizer"
    assert set(qtts_lib.runtime.__all__) >= {"Synthesizer", "Voice", "Sampling", "load_wav", "synthesize_long",
                                             "stream_long", "QttsError"}
    from qtts_lib.runtime import errors

    assert all(issubclass(getattr(errors, n), errors.QttsError)
               for n in ("InputError", "AudioError", "MissingArtifact", "DeviceError", "PrecisionError"))
