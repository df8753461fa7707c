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


@pytest.fixture
def serve(synth, tmp_path):
    """serve(**engine options, send_timeout=, send_buffer=) -> (engine, url, paced): an in-process server with the
    voice alice, whose engine steps the test paces (`serving.Served`); stopped afterwards. For the server's tests."""
    from serving import Served, alice_folder

    from qtts_lib.runtime.app.server.reply import SEND_TIMEOUT

    voices = alice_folder(tmp_path)
    served = Served(synth)

    def start(send_timeout: float = SEND_TIMEOUT, send_buffer: int | None = None, **options):
        options = {"max_frames": 6, "chunk_frames": 2, "queue_places": 2, "max_batch": 1} | options
        return served.start(voices, send_timeout=send_timeout, send_buffer=send_buffer, **options)

    yield start
    served.stop()
