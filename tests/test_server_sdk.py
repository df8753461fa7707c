"""`qtts serve` as OpenAI's own Python SDK meets it: speech in every format, streamed, every error an exception of the
SDK's kind; custom voices (consent recordings, a voice from a sample); the API key; the OpenAPI document and the
Prometheus metrics; OpenAI's defaults (mp3, its voice names) and a browser on another origin. One server (tiny-base,
an API key, nova an alias of bob, one other origin allowed)."""
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from serving import COMPRESSED, MAGIC, PADDING, decoded, request, samples_at_24k, start_server, stop_server

from qtts_lib import paths
from qtts_lib.runtime.app.server.schema import REQUEST_FIELDS

KEY = "sk-test-qtts"
MAX_FRAMES = 8
TEXT = "Hello there, from the SDK."
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
AUTH = {"Authorization": f"Bearer {KEY}"}
SEED = {"seed": 3}  # every request a fresh take otherwise: the formats are compared on one take
ORIGIN = "https://app.example"  # the one other origin the server is told a browser may call it from


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """The server's folder: its log, and its voices folder `voices/` (alice and bob, then what the tests add)."""
    return tmp_path_factory.mktemp("sdk")


@pytest.fixture(scope="module")
def served(tts, home):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    proc, url = start_server(home, "--max-frames", str(MAX_FRAMES), "--api-key", KEY, "--voice-alias", "nova=bob",
                             "--cors-origin", ORIGIN)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def pcm(client) -> np.ndarray:
    """The reference samples: this request in pcm (every format below carries these samples)."""
    raw = client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, response_format="pcm",
                                     extra_body=SEED).content
    assert len(raw) % 2 == 0 and 0 < len(raw) // 2 <= MAX_FRAMES * 1920
    return np.frombuffer(raw, "<i2")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_sdk_creates_speech_in_every_format(client, pcm, fmt):
    """Same request, same seed: every format carries pcm's samples (exactly in wav and flac, within the codec's
    padding in mp3, aac and opus); the content type is the format's."""
    answer = client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, response_format=fmt,
                                        extra_body=SEED)
    assert answer.response.headers["content-type"] == CONTENT_TYPES[fmt] and answer.response.headers["x-seed"] == "3"
    body = answer.content
    if fmt == "pcm":
        assert np.array_equal(np.frombuffer(body, "<i2"), pcm)
    elif fmt == "wav":
        assert body[:4] == b"RIFF" and np.array_equal(np.frombuffer(body[44:], "<i2"), pcm)
    elif fmt == "flac":
        samples, rate, codec = decoded(body)
        assert (rate, codec) == (24000, "flac") and np.array_equal(samples, pcm)
    else:
        n = samples_at_24k(fmt, body)
        assert len(pcm) <= n <= len(pcm) + PADDING[fmt], (fmt, n, len(pcm))
        samples = decoded(body)[0]
        assert np.abs(samples).max() > 0.01  # sound, not the silence of a broken pipeline


@pytest.mark.parametrize("fmt", COMPRESSED + ("pcm",))
def test_a_streamed_response_is_the_whole_response(client, fmt):
    """with_streaming_response reads the chunks as they come; joined they are the body `create` reads whole (the
    encoders run bit-exact: no random Ogg serial, no version strings)."""
    kwargs = dict(model="tts-1", voice="bob", input=TEXT, response_format=fmt, extra_body={"seed": 5})
    with client.audio.speech.with_streaming_response.create(**kwargs) as response:
        assert response.headers["content-type"] == CONTENT_TYPES[fmt]
        assert response.headers.get("transfer-encoding") == "chunked"  # sent as generated, no length known
        chunks = list(response.iter_bytes())
    assert b"".join(chunks) == client.audio.speech.create(**kwargs).content


def test_sdk_extra_fields_reach_the_sampler(client, pcm):
    again = client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, response_format="pcm",
                                       extra_body=SEED)
    greedy = client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, response_format="pcm",
                                        extra_body=SEED | {"greedy": True})
    assert again.content == pcm.tobytes() and greedy.content != pcm.tobytes()


ERRORS = [  # (what the SDK is asked, the exception it raises, the status, the `param` the body names)
    (dict(voice="carol"), openai.BadRequestError, 400, "voice"),
    (dict(response_format="ogg"), openai.BadRequestError, 400, "response_format"),
    (dict(speed=4.5), openai.BadRequestError, 400, "speed"),
    (dict(input=""), openai.BadRequestError, 400, "input"),
    (dict(instructions="Whisper."), openai.BadRequestError, 400, "instructions"),
    (dict(stream_format="json"), openai.BadRequestError, 400, "stream_format"),
    (dict(extra_body={"temperature": "hot"}), openai.BadRequestError, 400, "temperature"),
    (dict(extra_body={"top_k": 2.5}), openai.BadRequestError, 400, "top_k"),
    (dict(extra_body={"nonsense": 1}), openai.BadRequestError, 400, "nonsense"),
    (dict(model="gpt-5"), openai.NotFoundError, 404, "model"),
    (dict(input="x" * 70000), openai.APIStatusError, 413, None),
]


@pytest.mark.parametrize("change,kind,status,param", ERRORS)
def test_each_error_is_an_sdk_exception(client, change, kind, status, param):
    kwargs = dict(model="tts-1", voice="alice", input="Hi.", response_format="wav") | change
    with pytest.raises(kind) as caught:
        client.audio.speech.create(**kwargs)
    e = caught.value
    assert e.status_code == status and e.param == param and e.type == "invalid_request_error" and e.message


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_without_the_key_the_sdk_gets_an_authentication_error(served, key):
    bare = openai.OpenAI(base_url=served + "/v1", api_key=key or "unused", max_retries=0,
                         default_headers={} if key else {"Authorization": ""})
    with pytest.raises(openai.AuthenticationError) as caught:
        bare.audio.speech.create(model="tts-1", voice="alice", input="Hi.")
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bare.models.list()
    for path in ("/metrics", "/v1/models", "/v1/voices", "/v1/audio/voices", "/v1/audio/voice_consents",
                 "/openapi.json"):
        assert request(served, path)[0] == 401
    for path in ("/health", "/"):  # what stays open: liveness and the page (which asks for the key)
        assert request(served, path)[0] == 200


def test_the_key_comes_from_the_option_or_the_environment(monkeypatch):
    from qtts_lib.runtime.app import server
    from qtts_lib.runtime.app.cli import parser

    args = lambda *extra: parser().parse_args(["serve", "--checkpoint", "tiny-base", *extra])  # noqa: E731
    monkeypatch.delenv(server.API_KEY_ENV, raising=False)
    assert server.api_key_of(args()) is None and args().host == "127.0.0.1"  # default: local, no key
    monkeypatch.setenv(server.API_KEY_ENV, "from-env")
    assert server.api_key_of(args()) == "from-env" and server.api_key_of(args("--api-key", "given")) == "given"
    monkeypatch.setenv(server.API_KEY_ENV, "")
    assert server.api_key_of(args()) is None


def test_without_a_response_format_the_answer_is_mp3_as_openais(client, pcm):
    """OpenAI's default format is mp3: an SDK call that names none, saved as .mp3, holds mp3 bytes."""
    answer = client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, extra_body=SEED)
    body = answer.content
    assert answer.response.headers["content-type"] == "audio/mpeg" and body.startswith(MAGIC["mp3"]), body[:8]
    samples, rate, codec = decoded(body)
    assert rate == 24000 and codec.startswith("mp3") and len(pcm) <= len(samples) <= len(pcm) + PADDING["mp3"]


def test_openais_voice_names_speak_the_servers_voices(client, pcm):
    """alloy (no alias): the default voice, the first in name order (alice); nova: bob, as --voice-alias says; both
    bit for bit the voice they name, same seed."""
    speak = lambda voice: client.audio.speech.create(  # noqa: E731
        model="tts-1", voice=voice, input=TEXT, response_format="pcm", extra_body=SEED).content
    assert speak("alloy") == pcm.tobytes() and speak("nova") == speak("bob") != pcm.tobytes()


def test_a_clip_sent_through_the_sdk_speaks_as_the_voice_of_that_clip(client, pcm):
    """The SDK needs a `voice`; `ref_audio` in extra_body speaks instead: voice.wav is alice's clip (bob, named,
    would speak otherwise)."""
    import base64

    clip = base64.b64encode(paths.voice_wav().read_bytes()).decode()
    kwargs = dict(model="tts-1", voice="bob", input=TEXT, response_format="pcm")
    answer = client.audio.speech.create(**kwargs, extra_body=SEED | {"ref_audio": clip})
    assert answer.content == pcm.tobytes() != client.audio.speech.create(**kwargs, extra_body=SEED).content


def test_the_voices_are_listed_as_an_openai_list_with_the_names_that_speak_them(served):
    status, _, body = request(served, "/v1/audio/voices", headers=AUTH)
    listing = json.loads(body)
    assert status == 200 and listing["object"] == "list"
    voices = {v["name"]: v for v in listing["data"]}
    assert {"alice", "bob"} <= set(voices) and all(v["object"] == "audio.voice" for v in voices.values())
    assert voices["alice"]["default"] and "alloy" in voices["alice"]["aliases"] and "nova" not in voices["alice"][
        "aliases"]
    assert voices["bob"]["aliases"] == ["nova"] and voices["bob"]["mode"] == "icl" and voices["bob"]["id"] == "bob"


def test_a_browser_on_an_allowed_origin_may_call_it_and_others_not(served):
    """--cors-origin: the preflight of a speech request (no key: a browser sends none on it) is answered for that
    origin, with X-Seed readable by the page; another origin gets no leave to read anything."""
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    status, headers, _ = request(served, "/v1/audio/speech", method="OPTIONS", headers=preflight | {"Origin": ORIGIN})
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in headers["access-control-allow-headers"].lower()
    body = {"input": "Hi.", "voice": "alice", "response_format": "pcm", "seed": 1}
    status, headers, _ = request(served, "/v1/audio/speech", body, headers=AUTH | {"Origin": ORIGIN})
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 200 and "x-seed" in headers["access-control-expose-headers"].lower()
    other = {"Origin": "https://elsewhere.example"}
    status, headers, _ = request(served, "/v1/audio/speech", method="OPTIONS", headers=preflight | other)
    assert status == 400 and "access-control-allow-origin" not in {k.lower() for k in headers}


def test_the_sdk_lists_the_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-base"] and models[0].qtts["formats"] == list(FORMATS)


def test_the_openapi_document_describes_what_the_server_takes(served):
    status, headers, body = request(served, "/openapi.json", headers=AUTH)
    doc = json.loads(body)
    assert status == 200 and headers["content-type"] == "application/json" and doc["openapi"].startswith("3.1")
    speech = doc["paths"]["/v1/audio/speech"]["post"]
    request_schema = doc["components"]["schemas"]["SpeechRequest"]
    assert speech["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/SpeechRequest")
    # `voice` or `ref_audio`: the request's own clip speaks instead of a named voice
    assert tuple(request_schema["properties"]) == REQUEST_FIELDS and request_schema["required"] == ["input"]
    assert "ref_audio" in request_schema["properties"]["voice"]["description"]
    assert {"ref_audio", "ref_text"} <= set(request_schema["properties"])
    assert request_schema["properties"]["response_format"]["enum"] == list(FORMATS)
    assert request_schema["properties"]["response_format"]["default"] == "mp3"  # OpenAI's default
    assert request_schema["additionalProperties"] is False
    assert set(speech["responses"]["200"]["content"]) == set(CONTENT_TYPES.values()) | {"text/event-stream"}
    assert "alice" in request_schema["properties"]["voice"]["examples"]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for code in ("400", "401", "404", "413", "503"):
        assert speech["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    custom = {path: set(doc["paths"][path]) for path in doc["paths"] if path.startswith("/v1/audio/voice")}
    assert custom == {"/v1/audio/voices": {"get", "post"}, "/v1/audio/voices/{voice_id}": {"delete"},
                      "/v1/audio/voice_consents": {"get", "post"},
                      "/v1/audio/voice_consents/{consent_id}": {"get", "post", "delete"}}
    listed = doc["paths"]["/v1/audio/voices"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert listed["$ref"].endswith("/ListedVoices")
    assert doc["components"]["schemas"]["ListedVoices"]["properties"]["object"]["const"] == "list"
    made = doc["paths"]["/v1/audio/voices"]["post"]
    assert made["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/AudioVoice")
    assert set(made["requestBody"]["content"]["multipart/form-data"]["schema"]["required"]) == {
        "name", "audio_sample", "consent"}
    assert all(op["security"] == [{"bearer": []}] for path in custom for op in doc["paths"][path].values())


def scrape(url: str) -> dict:
    """/metrics parsed by prometheus_client's own parser: {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    status, headers, body = request(url, "/metrics", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def test_metrics_count_requests_streams_the_batch_and_time_to_audio(served, client):
    before = scrape(served)
    client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, response_format="mp3")
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="tts-1", voice="carol", input=TEXT)
    after = scrape(served)

    def grew(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert grew("qtts_requests_total", path="/v1/audio/speech", status="200") == 1
    assert grew("qtts_requests_total", path="/v1/audio/speech", status="400") == 1
    assert grew("qtts_speech_streams_total", format="mp3", outcome="done") == 1
    assert grew("qtts_time_to_first_audio_seconds_count") == 1 and grew("qtts_real_time_factor_count") == 1
    assert 0 < grew("qtts_audio_seconds_total") <= MAX_FRAMES * 0.08 + 1e-9
    # one observation per scheduler step that makes frames (its first piece's held pieces are handed out in steps
    # of their own, not counted): at most one a frame here
    assert 1 <= grew("qtts_batch_size_count") <= MAX_FRAMES
    assert grew("qtts_batch_size_bucket", le="1.0") == grew("qtts_batch_size_count")  # alone: batches of one
    assert after[("qtts_queue_depth", ())] == 0 and after[("qtts_requests_speaking", ())] == 0
    assert after[("qtts_max_batch", ())] == 4


# ------------------------------------------------------------ custom voices: OpenAI's consent recordings and voices
def clip_file(samples: np.ndarray, name: str = "clip.wav"):
    """Samples as the file tuple the SDK uploads: (name, wav bytes, content type)."""
    buf = io.BytesIO()
    sf.write(buf, samples, 24000, format="WAV", subtype="FLOAT")
    return name, buf.getvalue(), "audio/wav"


def own_clip() -> np.ndarray:
    """A clip no voice of the server has (alice and bob are voice.wav): voice.wav backwards."""
    return sf.read(str(paths.voice_wav()), dtype="float32")[0][::-1].copy()


def speak(client, voice, **fields) -> bytes:
    return client.audio.speech.create(model="tts-1", voice=voice, input=TEXT, response_format="pcm",
                                      extra_body=SEED | fields).content


def test_consent_recordings_round_trip_through_the_sdk(client, home):
    """Create (kept in voices/consents/ with the recording as uploaded), retrieve, update, list page by page,
    delete: each answer the SDK's own object."""
    consents = client.audio.voice_consents
    recording = clip_file(own_clip(), "consent.wav")
    first = consents.create(name="Dana, speaking", language="en-US", recording=recording)
    second = consents.create(name="Eli", language="fr", recording=clip_file(own_clip()))
    assert first.object == "audio.voice_consent" and first.id.startswith("cons_") and first.id != second.id
    assert (first.name, first.language) == ("Dana, speaking", "en-US") and first.created_at > 1.6e9
    folder = home / "voices" / "consents"
    assert (folder / f"{first.id}.wav").read_bytes() == recording[1]
    assert consents.retrieve(first.id) == first
    renamed = consents.update(first.id, name="Dana")
    assert renamed.name == "Dana" and renamed.id == first.id and consents.retrieve(first.id).name == "Dana"
    page = consents.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    listed = [c.id for c in consents.list(limit=1)]  # the SDK follows the cursor (`after`) page by page
    assert listed[-2:] == [first.id, second.id] and len(listed) == len(set(listed))
    gone = consents.delete(first.id)
    assert gone.id == first.id and gone.deleted and gone.object == "audio.voice_consent"
    with pytest.raises(openai.NotFoundError):
        consents.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        consents.delete(first.id)
    assert first.id not in [c.id for c in consents.list()] and second.id in [c.id for c in consents.list()]
    assert not list(folder.glob(f"{first.id}*")) and len(list(folder.glob(f"{second.id}*"))) == 2
    consents.delete(second.id)


def test_a_voice_from_a_sample_speaks_as_its_clip_does_through_post_voices(client, served, home):
    """A voice made by the SDK from a sample and a consent speaks, by its id or by its name, exactly as the same clip
    uploaded through POST /v1/voices does (same seed: the same bits), and not as alice (another clip) does; a second
    server over the same folder finds the id and the consent; deleting it by its id removes its files."""
    sample = own_clip()
    consent = client.audio.voice_consents.create(name="Fay", language="en", recording=clip_file(sample))
    voice = client.audio.voices.create(name="fay", audio_sample=clip_file(sample), consent=consent.id)
    assert voice.object == "audio.voice" and voice.type == "audio_sample" and voice.name == "fay"
    assert voice.id.startswith("voice_") and voice.created_at > 1.6e9
    by_id = speak(client, {"id": voice.id})
    uploaded = httpx.post(served + "/v1/voices", data={"name": "fay-plain"}, files={"audio": clip_file(sample)},
                          headers=AUTH, timeout=120)
    assert uploaded.status_code == 201, uploaded.text
    assert by_id == speak(client, "fay-plain") == speak(client, "fay") and by_id != speak(client, "alice")
    listed = {v["name"]: v for v in httpx.get(served + "/v1/voices", headers=AUTH).json()["voices"]}
    assert listed["fay"]["id"] == voice.id and listed["fay"]["mode"] == "xvector" and listed["fay-plain"]["id"] is None

    (home / "again").mkdir()
    again, again_url = start_server(home / "again", "--voices", str(home / "voices"), "--max-frames", str(MAX_FRAMES),
                                    "--api-key", KEY)
    try:
        restarted = openai.OpenAI(base_url=again_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        assert restarted.audio.voice_consents.retrieve(consent.id) == consent
        assert speak(restarted, {"id": voice.id}) == by_id
    finally:
        stop_server(again)

    gone = client.audio.voices.delete(voice.id)
    assert (gone.id, gone.deleted, gone.object) == (voice.id, True, "audio.voice.deleted")
    assert not list((home / "voices").glob("fay.*"))
    with pytest.raises(openai.BadRequestError):
        speak(client, {"id": voice.id})
    with pytest.raises(openai.NotFoundError):
        client.audio.voices.delete(voice.id)
    assert client.audio.voice_consents.retrieve(consent.id) == consent  # a voice's consent outlives it
    client.audio.voice_consents.delete(consent.id)
    assert httpx.delete(served + "/v1/voices/fay-plain", headers=AUTH).status_code == 200


def test_custom_voice_refusals_are_sdk_errors(client, home):
    """An unknown consent, a prompt-designed voice, a silent recording or sample, a name taken: each a 400 (409)
    the SDK raises, naming the field; nothing is written."""
    sample = clip_file(own_clip())
    silent = clip_file(np.zeros(3 * 24000, np.float32))
    consent = client.audio.voice_consents.create(name="Gus", language="en-GB", recording=sample)
    refused = [  # (the call, the SDK's exception, the field it names, the error's code, words of its message)
        (lambda: client.audio.voices.create(name="gus", audio_sample=sample, consent="cons_0000"),
         openai.BadRequestError, "consent", "consent_not_found", "no consent recording"),
        (lambda: client.audio.voices.create(name="gus", prompt="A calm, low voice.", type="prompt"),
         openai.BadRequestError, "type", "prompt_voice_unsupported", "from a prompt"),
        (lambda: client.audio.voices.create(name="gus", audio_sample=silent, consent=consent.id),
         openai.BadRequestError, "audio_sample", "bad_clip", "silent"),
        (lambda: client.audio.voices.create(name="a voice", audio_sample=sample, consent=consent.id),
         openai.BadRequestError, "name", None, "not a voice name"),
        (lambda: client.audio.voices.create(name="alice", audio_sample=sample, consent=consent.id),
         openai.ConflictError, "name", "voice_exists", "exists"),
        (lambda: client.audio.voice_consents.create(name="Gus", language="en", recording=silent),
         openai.BadRequestError, "recording", "bad_recording", "silent"),
        (lambda: client.audio.voice_consents.create(name="Gus", language="not a tag", recording=sample),
         openai.BadRequestError, "language", None, "BCP 47"),
        (lambda: client.audio.voice_consents.list(after="cons_0000"), openai.BadRequestError, "after", None,
         "no consent recording's id"),
        (lambda: client.audio.voices.delete("voice_0000"), openai.NotFoundError, "voice_id", "voice_not_found",
         "no voice"),
    ]
    consents_before = sorted(p.name for p in (home / "voices" / "consents").iterdir())
    for call, kind, param, code, words in refused:
        with pytest.raises(kind) as caught:
            call()
        e = caught.value
        assert (e.param, e.code) == (param, code) and words in e.message, e
    assert not list((home / "voices").glob("gus*")) and not list((home / "voices").glob("a voice*"))
    assert sorted(p.name for p in (home / "voices" / "consents").iterdir()) == consents_before
    client.audio.voice_consents.delete(consent.id)


def test_without_a_voices_folder_consents_are_kept_in_memory():
    """A server with no voices folder keeps its consent records in memory (listed page by page, renamed, deleted);
    a recording that is no voice clip is refused before any record is made."""
    import asyncio

    from qtts_lib.runtime.app.server.voices import Consents
    from qtts_lib.runtime.errors import AudioError

    consents = Consents(None, log=print)
    sample = clip_file(own_clip())[1]
    made = [asyncio.run(consents.add(f"label {i}", "en", sample, "c.wav")) for i in range(3)]
    assert [r["id"] for r in consents.page(None, 2)[0]] == [r["id"] for r in made[:2]]
    assert consents.page(made[1]["id"], 2) == ([made[2]], False) and consents.page(None, 2)[1]
    assert consents.rename(made[0]["id"], "renamed")["name"] == "renamed" and made[0]["id"] in consents
    consents.delete(made[0]["id"])
    assert made[0]["id"] not in consents and len(consents.page(None, 10)[0]) == 2
    with pytest.raises(AudioError, match="silent"):
        asyncio.run(consents.add("mute", "en", clip_file(np.zeros(48000, np.float32))[1], "mute.wav"))
    assert len(consents.page(None, 10)[0]) == 2
