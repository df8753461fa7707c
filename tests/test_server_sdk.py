"""`qtts serve` as OpenAI's own Python SDK meets it: speech in every format, streamed, every error an exception of the
SDK's kind; the API key; the OpenAPI document and the Prometheus metrics. One server (tiny-base, an API key)."""
import json

import numpy as np
import openai
import pytest
from serving import COMPRESSED, PADDING, decoded, request, samples_at_24k, start_server, stop_server

from qtts_lib.runtime.app.schema import REQUEST_FIELDS

KEY = "sk-test-qtts"
MAX_FRAMES = 8
TEXT = "Hello there, from the SDK."
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
AUTH = {"Authorization": f"Bearer {KEY}"}
SEED = {"seed": 3}  # every request a fresh take otherwise: the formats are compared on one take


@pytest.fixture(scope="module")
def served(tts, tmp_path_factory):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    proc, url = start_server(tmp_path_factory.mktemp("sdk"), "--max-frames", str(MAX_FRAMES), "--api-key", KEY)
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
    for path in ("/metrics", "/v1/models", "/v1/voices", "/openapi.json"):  # the schema names the voices
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
    assert tuple(request_schema["properties"]) == REQUEST_FIELDS and set(request_schema["required"]) == {"input",
                                                                                                         "voice"}
    assert request_schema["properties"]["response_format"]["enum"] == list(FORMATS)
    assert request_schema["additionalProperties"] is False
    assert set(speech["responses"]["200"]["content"]) == set(CONTENT_TYPES.values()) | {"text/event-stream"}
    assert "alice" in request_schema["properties"]["voice"]["examples"]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for code in ("400", "401", "404", "413", "503"):
        assert speech["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")


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
    assert grew("qtts_batch_size_count") >= 1  # one observation per scheduler step (a frame or more each)
    assert grew("qtts_batch_size_bucket", le="1.0") == grew("qtts_batch_size_count")  # alone: batches of one
    assert after[("qtts_queue_depth", ())] == 0 and after[("qtts_requests_speaking", ())] == 0
    assert after[("qtts_max_batch", ())] == 4
