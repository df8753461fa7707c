import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")



@pytest.fixture(scope="session")
def tts():
    """The reference model on tiny-base, loaded once for every test file (about 5 s a load)."""
    from qtts_lib import checkpoint, paths, reference

    checkpoint.ensure("tiny-base")
    return reference.load(paths.model_dir("tiny-base"), threads=2)


@pytest.fixture(scope="module")
def exported(tts):
    """tiny-base with its ncnn graphs (chapters 04-05 do the same; reused when current): its model directory."""
    from qtts_lib import export, paths

    export.ensure(tts, "tiny-base")
    return paths.model_dir("tiny-base")


@pytest.fixture(scope="module")
def synth(tts):
    """The runtime on tiny-base (its graphs exported first), one per test file."""
    from qtts_lib import export, paths
    from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

    export.ensure(tts, "tiny-base")
    return Synthesizer(paths.model_dir("tiny-base"), threads=2)
