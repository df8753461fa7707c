"""A speech answer's FFmpeg work (encoder, atempo) runs off the event loop, its pieces in order; and the mp3 default
with PyAV missing is a clear error, never WAV bytes. The app in this process (tiny-base), an encoder injected."""
import json
import sys
import threading

import pytest
from serving import MAGIC, Served, alice_folder, request

from qtts_lib.runtime.app.server import reply
from qtts_lib.runtime.audio.encode import Encoder

BODY = {"input": "Hello there, how are you doing today?", "voice": "alice", "seed": 2}


@pytest.fixture
def url(synth, tmp_path):
    served = Served(synth)
    _, url, paced = served.start(alice_folder(tmp_path), max_frames=30, chunk_frames=2)
    paced.run_free()
    yield url
    served.stop()


def test_the_loop_answers_while_a_piece_is_being_encoded(url, monkeypatch):
    """An encoder that blocks inside its first piece: /health is answered meanwhile (an encoder on the event loop
    would hold it until released); released, the answer is the one an ordinary encoder gives, piece for piece."""
    plain = request(url, "/v1/audio/speech", BODY | {"response_format": "mp3"})
    entered, release = threading.Event(), threading.Event()

    class Blocking(Encoder):
        def write(self, wav):
            entered.set()
            assert release.wait(120), "never released"
            return super().write(wav)

    monkeypatch.setattr(reply, "Encoder", Blocking)
    answer = {}
    speaking = threading.Thread(target=lambda: answer.update(got=request(url, "/v1/audio/speech",
                                                                         BODY | {"response_format": "mp3"})))
    speaking.start()
    try:
        assert entered.wait(120), "no piece reached the encoder"
        status, _, body = request(url, "/health", timeout=30)
        assert status == 200 and json.loads(body)["speaking"] == 1 and not release.is_set()
    finally:
        release.set()
        speaking.join(120)
    status, headers, audio = answer["got"]
    assert status == 200 and audio.startswith(MAGIC["mp3"]) and (status, audio) == (plain[0], plain[2])


def test_pieces_stay_in_order_however_long_each_takes(url, monkeypatch):
    """Each piece's encode and tempo take a different time (the later ones less): the bytes are those of an
    ordinary run."""
    plain = request(url, "/v1/audio/speech", BODY | {"response_format": "pcm", "speed": 1.5})
    delays = iter([0.3, 0.2, 0.1] + [0.0] * 1000)

    class Uneven(Encoder):
        def write(self, wav):
            threading.Event().wait(next(delays))
            return super().write(wav)

    monkeypatch.setattr(reply, "Encoder", Uneven)
    status, _, uneven = request(url, "/v1/audio/speech", BODY | {"response_format": "pcm", "speed": 1.5})
    assert status == plain[0] == 200 and uneven == plain[2] and len(uneven) > 0


def test_without_pyav_the_default_mp3_is_a_clear_error_not_wav(url, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError, as where PyAV is not installed
    status, headers, body = request(url, "/v1/audio/speech", {"input": "Hi.", "voice": "alice"})
    error = json.loads(body)["error"]
    assert status == 501 and headers["content-type"] == "application/json" and error["param"] == "response_format"
    assert "PyAV" in error["message"] and "mp3 unless the request says otherwise" in error["message"], error
    assert request(url, "/v1/audio/speech", {"input": "Hi.", "voice": "alice", "response_format": "wav"})[0] == 200
