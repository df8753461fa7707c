"""`qtts serve` closed to abuse: every upload's decode is bounded (a few hundred kilobytes of FLAC can hold hours of
silence), the voices folder under a quota, a voice's files written together."""
import base64
import io
import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from serving import request, start_server, stop_server

SIX_HOURS = 6 * 3600
BOMB_RATE = 8000  # Hz: six hours of it is 173 M samples (691 MB as float32, 2 GB once resampled to 24 kHz)
GROWTH_LIMIT_MB = 400


def bomb(stated: bool = True) -> bytes:
    """A FLAC of six hours' silence (about 550 KB); `stated=False` zeroes STREAMINFO's total-samples field, as an
    encoder that streams writes it ("unknown"), so only decoding finds the length."""
    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", BOMB_RATE, 1, format="FLAC", subtype="PCM_16") as f:
        ten_minutes = np.zeros(BOMB_RATE * 600, np.int16)
        for _ in range(SIX_HOURS // 600):
            f.write(ten_minutes)
    data = bytearray(buf.getvalue())
    if not stated:  # fLaC, a 4-byte block header, then STREAMINFO: total samples are its bits 108..143
        data[8 + 13] &= 0xF0
        data[8 + 14:8 + 18] = b"\0\0\0\0"
    return bytes(data)


READ_IN_CHILD = textwrap.dedent("""
    import resource, sys, time
    from qtts_lib.runtime.errors import AudioError
    from qtts_lib.runtime.audio.clips import MAX_UPLOAD_SECONDS, read_voice_clip

    data = open(sys.argv[1], "rb").read()
    for line in open("/proc/self/status"):  # a bomb not stopped dies here of MemoryError, not the machine
        if line.startswith("VmSize:"):
            size = int(line.split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), resource.RLIM_INFINITY))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    for keep_long in (False, True):  # a voice upload, a consent recording
        try:
            read_voice_clip(data, keep_long=keep_long, keep_long_option=None, max_seconds=MAX_UPLOAD_SECONDS)
            print("ACCEPTED")
        except AudioError as e:
            print("REFUSED", e)
    seconds = time.monotonic() - start
    print("GROWTH_MB", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, "SECONDS", seconds)
""")


@pytest.mark.parametrize("stated", [True, False], ids=["length-stated", "length-unstated"])
def test_a_six_hour_clip_is_refused_before_it_is_decoded(tmp_path, stated):
    """The clip's length is read from its container before any sample (stated), else the decode stops one sample
    past the limit (unstated): refused, naming the limit, in a second or so, with the process's peak memory grown
    by less than 400 MB, as a voice upload and as a consent recording (kept whole, never trimmed)."""
    path = tmp_path / "six_hours.flac"
    path.write_bytes(bomb(stated))
    assert path.stat().st_size < 2_000_000
    run = subprocess.run([sys.executable, "-c", READ_IN_CHILD, str(path)], capture_output=True, text=True,
                         timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 3, run.stdout + run.stderr
    for line in lines[:2]:
        assert line.startswith("REFUSED") and "at most 60 s" in line, line
    growth = float(lines[2].split()[1])
    assert growth < GROWTH_LIMIT_MB, lines[2]  # the time is printed, not asserted: a timing is no property


def test_a_clip_within_the_limit_reads_as_before():
    """A bounded read gives the very samples an unbounded one does (stereo 48 kHz: averaged, resampled)."""
    import soundfile as sf

    from qtts_lib.runtime.audio.wav import read_audio

    rng = np.random.default_rng(0)
    stereo = (rng.standard_normal((48000 * 3, 2)) * 0.1).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, stereo, 48000, format="WAV", subtype="FLOAT")
    whole, notes = read_audio(buf.getvalue())
    bounded, bounded_notes = read_audio(buf.getvalue(), max_seconds=60)
    assert np.array_equal(whole, bounded) and notes == bounded_notes and len(notes) == 2
    with pytest.raises(Exception, match="at most 2 s"):
        read_audio(buf.getvalue(), max_seconds=2)


def peak_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in kB."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@pytest.fixture(scope="module")
def server(tts, tmp_path_factory):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    tmp = tmp_path_factory.mktemp("bounds")
    proc, url = start_server(tmp, "--max-frames", "6")
    yield proc, url, tmp / "voices"
    stop_server(proc)


def upload(url: str, path: str, fields: dict, files: dict):
    import httpx

    r = httpx.post(url + path, data=fields, files=files, timeout=300)
    return r.status_code, r.json()


def test_a_six_hour_upload_is_refused_with_the_server_s_memory_bounded(server):
    """The same clips (length stated, length unstated) uploaded as a voice, as a consent recording and sent with a
    speech request (`ref_audio`, in base64): a 400 that names the limit, at once, the server's peak memory (VmHWM,
    reset first through /proc/PID/clear_refs) grown by less than 400 MB."""
    proc, url, _ = server
    bombs = [bomb(stated=True), bomb(stated=False)]
    rss, _ = peak_kb(proc.pid)
    with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
        f.write("5")  # resets the peak to the RSS now
    start = time.monotonic()
    answers = []
    for data in bombs:
        answers.append(upload(url, "/v1/voices", {"name": "boom"}, {"audio": ("boom.flac", data, "audio/flac")}))
        answers.append(upload(url, "/v1/audio/voice_consents", {"name": "Boom", "language": "en"},
                              {"recording": ("boom.flac", data, "audio/flac")}))
        speech = {"input": "Hi.", "ref_audio": base64.b64encode(data).decode()}
        status, _, body = request(url, "/v1/audio/speech", speech, timeout=300)
        answers.append((status, json.loads(body)))
    seconds = time.monotonic() - start
    _, peak = peak_kb(proc.pid)
    assert len(answers) == 6
    for status, body in answers:
        assert status == 400 and "at most 60 s" in body["error"]["message"], body
    assert [body["error"]["param"] for _, body in answers[2::3]] == ["ref_audio", "ref_audio"]
    assert (peak - rss) / 1024 < GROWTH_LIMIT_MB, (peak - rss, seconds)  # the time is reported, not asserted
    assert json.loads(request(url, "/health")[2])["status"] == "ok"


# ------------------------------------------------------------------ the voices folder: quotas, files written together
def stub_synth():
    """A Base checkpoint's stand-in for the store's tests: `voice` builds nothing (the clip checks still run)."""
    import types

    return types.SimpleNamespace(kind="base", speakers=[],
                                 voice=lambda wav=None, text=None, **_: types.SimpleNamespace(
                                     mode="icl" if text else "xvector"))


def clip_bytes() -> bytes:
    from qtts_lib import paths

    return paths.voice_wav().read_bytes()  # 5.68 s of 16-bit 24 kHz mono (272,684 bytes; 545 KB kept as float32)


def listing(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def quota_server(synth, tmp_path):
    """An in-process server over a voices folder holding alice (`serving.Served`): (url, its store, the folder)."""
    from serving import Served, alice_folder

    folder = alice_folder(tmp_path)
    served = Served(synth)
    _, url, _ = served.start(folder, max_frames=6, chunk_frames=2, queue_places=2, max_batch=1)
    yield url, served.voices, folder
    served.stop()


@pytest.mark.parametrize("limit", ["count", "bytes"])
def test_an_upload_past_a_quota_is_refused_with_a_403_and_nothing_written(quota_server, limit):
    """With room for one more voice and one consent recording (by count: 2 voices, alice counted, and 1 consent;
    by size: 1 MB of voices beside alice's 0.27 MB, 0.4 MB of consents), the first of each is made and the second
    refused with a 403 `quota_exceeded` that names the option and says how to free room, no file written; after a
    DELETE there is room again."""
    from qtts_lib.runtime.app.server.voices import Quota

    url, store, folder = quota_server
    store.quota, store.consent_quota = (Quota(2, 300), Quota(1, 200)) if limit == "count" else \
        (Quota(200, 1.0), Quota(200, 0.4))
    voice_option, consent_option = ("--max-voices", "--max-consents") if limit == "count" else \
        ("--voices-mb", "--consents-mb")
    clip = clip_bytes()

    def add_voice(name):
        return upload(url, "/v1/voices", {"name": name}, {"audio": ("clip.wav", clip, "audio/wav")})

    def add_consent():
        return upload(url, "/v1/audio/voice_consents", {"name": "Carol", "language": "en"},
                      {"recording": ("carol.wav", clip, "audio/wav")})

    assert add_voice("one")[0] == 201
    status, consent = add_consent()
    assert status == 200, consent
    before = listing(folder)
    for (status, body), option, delete in ((add_voice("two"), voice_option, "DELETE /v1/voices/"),
                                           (add_consent(), consent_option, "DELETE /v1/audio/voice_consents/")):
        error = body["error"]
        assert status == 403 and error["code"] == "quota_exceeded", body
        assert option in error["message"] and delete in error["message"], error
    assert listing(folder) == before and "two" not in store.names()
    assert request(url, "/v1/voices/one", method="DELETE")[0] == 200
    assert request(url, f"/v1/audio/voice_consents/{consent['id']}", method="DELETE")[0] == 200
    assert add_voice("two")[0] == 201 and add_consent()[0] == 200


def test_quota_totals_are_read_from_disk_and_survive_a_restart(tmp_path):
    """The store counts the files in the folder, so a store opened again on it (a restart) sees the same totals and
    refuses the same upload: by count and by size, for voices (clip, transcript, id) and for consent recordings."""
    import asyncio

    from qtts_lib import paths
    from qtts_lib.runtime.app.server.voices import MB, Consents, Quota, QuotaExceeded, Voices

    clip, text = clip_bytes(), (paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip()

    async def fill():
        voices = Voices(stub_synth(), tmp_path, log=lambda m: None, quota=Quota(2, 300))
        consents = Consents(tmp_path / "consents", lambda m: None)
        try:
            await voices.add("one", clip, text)
            consent = await consents.add("Carol", "en", clip, "carol.wav", Quota(1, 200))
            await voices.add("two", clip, None, consent=consent["id"])
            with pytest.raises(QuotaExceeded, match="--max-voices"):
                await voices.add("three", clip, None)
            with pytest.raises(QuotaExceeded, match="--max-consents"):
                await consents.add("Dan", "en", clip, "dan.wav", Quota(1, 200))
            return voices.stored(), consents.stored()
        finally:
            voices.close()

    async def again(voices_stored, consents_stored):
        count, size = voices_stored
        voices = Voices(stub_synth(), tmp_path, log=lambda m: None, quota=Quota(count, 300))
        consents = Consents(tmp_path / "consents", lambda m: None)
        try:
            assert voices.stored() == voices_stored and consents.stored() == consents_stored
            assert count == 2 and size > 2 * len(clip) and consents_stored[0] == 1
            with pytest.raises(QuotaExceeded, match="--max-voices"):
                await voices.add("three", clip, None)
            voices.quota = Quota(200, (size + 1000) / MB)  # room for a transcript, not a clip
            with pytest.raises(QuotaExceeded, match="--voices-mb"):
                await voices.add("three", clip, None)
            with pytest.raises(QuotaExceeded, match="--max-consents"):
                await consents.add("Dan", "en", clip, "dan.wav", Quota(1, 200))
            with pytest.raises(QuotaExceeded, match="--consents-mb"):
                await consents.add("Dan", "en", clip, "dan.wav", Quota(200, (consents_stored[1] + 1000) / MB))
            assert voices.stored() == voices_stored and consents.stored() == consents_stored
        finally:
            voices.close()

    asyncio.run(again(*asyncio.run(fill())))


def test_what_a_cut_short_write_left_is_removed_at_start(tmp_path):
    """An id with no clip beside it, a recording with no record, and temporary `.*.part*` files are removed when the
    store opens, each logged; a text file with no clip is logged and left (it may be the user's); whole voices and
    consents, and files that are none of these, stay."""
    from qtts_lib.runtime.app.server.voices import Consents, Voices

    clip = clip_bytes()
    consents = tmp_path / "consents"
    consents.mkdir()
    (tmp_path / "alice.wav").write_bytes(clip)
    (tmp_path / "alice.txt").write_text("Hello.", encoding="utf-8")
    (tmp_path / "alice.json").write_text('{"id": "voice_a", "consent": "cons_1"}', encoding="utf-8")
    (tmp_path / "bob.txt").write_text("Hello.", encoding="utf-8")
    (tmp_path / "carol.json").write_text('{"id": "voice_c", "consent": "cons_1"}', encoding="utf-8")
    (tmp_path / ".dan.part.wav").write_bytes(clip[:1000])
    (tmp_path / "notes.md").write_text("not a voice's", encoding="utf-8")
    record = {"id": "cons_1", "created_ns": 1, "name": "Carol", "language": "en", "filename": "c.wav",
              "recording": "cons_1.wav"}
    (consents / "cons_1.json").write_text(json.dumps(record), encoding="utf-8")
    (consents / "cons_1.wav").write_bytes(clip)
    (consents / "cons_2.wav").write_bytes(clip)
    (consents / ".cons_3.part.json").write_text("{", encoding="utf-8")
    logged = []
    voices = Voices(stub_synth(), tmp_path, log=logged.append)
    try:
        store = Consents(consents, logged.append)
        assert listing(tmp_path) == ["alice.json", "alice.txt", "alice.wav", "bob.txt", "consents",
                                     "consents/cons_1.json", "consents/cons_1.wav", "notes.md"]
        assert voices.names() == ["alice"] and voices.by_id() == {"voice_a": "alice"} and list(store.records) == \
            ["cons_1"]
        assert sum("bob.txt" in line and "left in place" in line for line in logged) == 1, logged
        for removed in ("carol.json", ".dan.part.wav", "cons_2.wav", ".cons_3.part.json"):
            assert sum(removed in line for line in logged) == 1, (removed, logged)
    finally:
        voices.close()


def failing_clip_write(monkeypatch, suffix: str) -> None:
    """The store's next write of a file ending in `suffix` fails as a full disk does: part of it written, then
    ENOSPC."""
    import errno

    from qtts_lib.runtime.app.server import voices as store

    real = store._write_atomically

    def write(path, work):
        if not path.name.endswith(suffix):
            return real(path, work)

        def cut_short(part):
            part.write_bytes(b"RIFF")
            raise OSError(errno.ENOSPC, "No space left on device")

        return real(path, cut_short)

    monkeypatch.setattr(store, "_write_atomically", write)


def test_a_voice_whose_clip_write_fails_leaves_no_file_and_no_voice(tmp_path, monkeypatch):
    """The clip is written last; when its write fails (a full disk) the transcript and id written before it are
    removed: no file, no name, no id, now or when the store opens again. A consent's record likewise: when it
    cannot be written, the recording written before it goes."""
    import asyncio

    from qtts_lib import paths
    from qtts_lib.runtime.app.server.voices import Consents, Voices

    clip, text = clip_bytes(), (paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip()
    (tmp_path / "alice.wav").write_bytes(clip)
    before = listing(tmp_path)

    async def add():
        voices = Voices(stub_synth(), tmp_path, log=lambda m: None)
        consents = Consents(tmp_path / "consents", lambda m: None)
        try:
            failing_clip_write(monkeypatch, ".wav")
            with pytest.raises(OSError, match="No space"):
                await voices.add("eve", clip, text, consent="cons_1")
            assert voices.names() == ["alice"] and voices.by_id() == {} and voices.info()[0]["name"] == "alice"
            monkeypatch.undo()
            failing_clip_write(monkeypatch, ".json")  # the recording (cons_....wav) is written, the record fails
            with pytest.raises(OSError, match="No space"):
                await consents.add("Eve", "en", clip, "eve.wav")
            assert list(consents.records) == []
        finally:
            voices.close()

    asyncio.run(add())
    assert [f for f in listing(tmp_path) if f != "consents"] == before
    monkeypatch.undo()
    again = Voices(stub_synth(), tmp_path, log=lambda m: None)
    try:
        assert again.names() == ["alice"] and again.by_id() == {}
    finally:
        again.close()
