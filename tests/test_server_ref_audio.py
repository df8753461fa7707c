"""A voice clip sent with the speech request (`ref_audio`, `ref_text`): spoken as the same clip in the voices folder
speaks, refused with a 400 naming `ref_audio` when it cannot be read, checked as an upload is (its stated length
before any sample), and its voice cached by the clip's hash, bounded, least recently used out. One tiny-base server
(alice: voice.wav, x-vector; bob: voice.wav with its transcript, ICL), and the cache on its own."""
import asyncio
import base64
import io
import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from serving import request, start_server, stop_server

from qtts_lib import paths
from qtts_lib.runtime.app.server.refs import BadClip, RefVoices, clip_bytes
from qtts_lib.runtime.app.server.schema import MAX_BODY_BYTES
from qtts_lib.runtime.audio.wav import pcm16, wav_header
from qtts_lib.runtime.pipeline.prompt import Voice

MAX_FRAMES = 8
TEXT = "Hello there, from a clip."


@pytest.fixture(scope="module")
def url(tts, tmp_path_factory):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    proc, url = start_server(tmp_path_factory.mktemp("ref_audio"), "--max-frames", str(MAX_FRAMES))
    yield url
    stop_server(proc)


def clip_b64() -> str:
    return base64.b64encode(paths.voice_wav().read_bytes()).decode()


def speak(url: str, **fields) -> tuple[int, dict, bytes]:
    return request(url, "/v1/audio/speech", {"input": TEXT, "response_format": "pcm", "seed": 4} | fields)


def test_ref_audio_speaks_as_the_same_clip_in_the_folder(url):
    """voice.wav sent in base64 (a body far over 64 KiB: it names ref_audio) is alice, bit for bit; as a data: URI
    too; with its transcript it is bob (ICL). A `voice` beside it is not looked up: the clip speaks."""
    clip = clip_b64()
    assert len(clip) > MAX_BODY_BYTES
    status, _, own = speak(url, ref_audio=clip)
    assert status == 200 and len(own) > 0
    assert own == speak(url, voice="alice")[2] == speak(url, ref_audio="data:audio/wav;base64," + clip,
                                                        voice="bob")[2]  # bob (ICL) would differ: the clip speaks
    transcript = (paths.INPUTS / "voice.txt").read_text().strip()
    status, _, icl = speak(url, ref_audio=clip, ref_text=transcript)
    assert status == 200 and icl == speak(url, voice="bob")[2] != own


@pytest.mark.parametrize("ref_audio,code,says", [
    ("not base64 at all!", "invalid_base64", "not base64"),
    ("data:audio/wav,UklGRg==", "invalid_base64", "data: URI"),
    (base64.b64encode(b"hello, not a sound").decode(), "bad_clip", "cannot read the clip in `ref_audio` as audio"),
    (base64.b64encode(wav_header(data_bytes=2 * 24000) + pcm16(np.zeros(24000, np.float32))).decode(), "bad_clip",
     "silent"),
])
def test_a_clip_that_cannot_be_used_is_a_400_naming_ref_audio(url, ref_audio, code, says):
    status, _, body = speak(url, ref_audio=ref_audio)
    error = json.loads(body)["error"]
    assert status == 400 and (error["param"], error["code"]) == ("ref_audio", code) and says in error["message"], error


def test_a_clip_over_the_length_limit_is_refused_from_its_header_before_decoding(url):
    """A FLAC of 30 s of sound whose STREAMINFO says two minutes: refused with the upload's message naming the stated
    120 s, which only the header says (a decode would find 30 s, a usable clip, or stop past 60 s saying "longer")."""
    rate, total = 8000, 120 * 8000
    buf = io.BytesIO()
    sf.write(buf, (np.random.default_rng(1).standard_normal(30 * rate) * 0.1).astype(np.float32), rate,
             format="FLAC", subtype="PCM_16")
    data = bytearray(buf.getvalue())  # fLaC, a block header, STREAMINFO: total samples in its bits 108..143
    data[8 + 13] = (data[8 + 13] & 0xF0) | (total >> 32)
    data[8 + 14:8 + 18] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    status, _, body = speak(url, ref_audio=base64.b64encode(bytes(data)).decode())
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "ref_audio", error
    assert "120.0 s long" in error["message"] and "at most 60 s" in error["message"], error


def test_a_body_over_64_kib_without_ref_audio_is_still_refused(url):
    status, _, body = request(url, "/v1/audio/speech", {"input": "Hi.", "voice": "alice", "x": "a" * MAX_BODY_BYTES})
    assert status == 413 and "request body over" in json.loads(body)["error"]["message"]


# ------------------------------------------------------------ the cache, on its own
class Store:
    """A voice store's surface that `RefVoices` uses, counting builds; `gate` holds each build until set."""

    def __init__(self):
        self.builds, self.gate = [], threading.Event()
        self.gate.set()
        self.synth = SimpleNamespace(voice=self.voice)

    def voice(self, wav, text=None):
        self.gate.wait(30)
        self.builds.append(text)
        return Voice(speaker_row=np.zeros(256, np.float32), text=text)  # 1 kB, and the transcript

    async def off_loop(self, work, *args):
        return await asyncio.to_thread(work, *args)


def wav_b64(seconds: float = 2.0, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    sf.write(buf, (rng.standard_normal(int(seconds * 24000)) * 0.1).astype(np.float32), 24000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_a_clip_is_built_once_even_when_requests_bring_it_at_once():
    store = Store()
    refs = RefVoices(store)

    async def run():
        store.gate.clear()
        together = [asyncio.ensure_future(refs.voice(wav_b64(), None)) for _ in range(3)]
        await asyncio.sleep(0.2)
        store.gate.set()
        voices = await asyncio.gather(*together)
        again = await refs.voice(wav_b64(), None)
        icl = await refs.voice(wav_b64(), "Some words.")  # the same clip with a transcript: another voice
        return voices, again, icl

    voices, again, icl = asyncio.run(run())
    assert voices[0] is voices[1] is voices[2] is again and icl is not again
    assert store.builds == [None, "Some words."]


def test_the_cache_keeps_the_most_recently_used_within_its_count_and_bytes():
    store = Store()
    refs = RefVoices(store, count=2)
    clips = [wav_b64(seed=i) for i in range(3)]

    async def run(order):
        for i in order:
            await refs.voice(clips[i], None)

    asyncio.run(run([0, 1, 0, 2]))  # 1 is the least recently used when 2 comes
    assert len(store.builds) == 3
    asyncio.run(run([0, 2]))
    assert len(store.builds) == 3 and len(refs.cache) == 2
    asyncio.run(run([1]))
    assert len(store.builds) == 4
    small = RefVoices(Store(), megabytes=0.0025)  # room for two voices of ~1 kB
    asyncio.run(small.voice(clips[0], None))
    asyncio.run(small.voice(clips[1], None))
    asyncio.run(small.voice(clips[2], None))
    assert len(small.cache) == 2 and small.cache.nbytes <= 2500 and len(small.store.builds) == 3


@pytest.mark.parametrize("text", ["", "   ", "data:audio/wav;base64,", "QQ=", "data:;base64,@@"])
def test_clip_bytes_refuses_what_is_not_base64(text):
    with pytest.raises(BadClip) as caught:
        clip_bytes(text)
    assert caught.value.param == "ref_audio" and caught.value.code == "invalid_base64"


def test_clip_bytes_reads_base64_wrapped_in_lines_and_data_uris():
    data = paths.voice_wav().read_bytes()[:300]
    b64 = base64.b64encode(data).decode()
    wrapped = "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
    assert clip_bytes(b64) == clip_bytes(wrapped) == clip_bytes("data:audio/wav;base64," + b64) == data
