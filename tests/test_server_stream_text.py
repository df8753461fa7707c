"""`qtts serve`'s WebSocket, /v1/audio/speech/stream: a text sent in pieces, as a language model writes it, is spoken
as it comes; its audio is the HTTP answer's for the whole text, byte for byte, with a `speech.segment` per segment;
the API key and the browser's origin guard it as they guard /v1/."""
import base64
import json
import time

import pytest
import websocket
from serving import request, start_server, stop_server

KEY = "secret-for-tests"
SENTENCES = [  # about 40 tokens each: a segment (60 tokens at most) holds one, decided while the next comes in
    "The morning train left the old station a little after six o'clock that day, and most of the long wooden seats in "
    "every one of its narrow carriages were still completely empty.",
    "A tired woman sitting by the window read the same page of her heavy library book three times over before she "
    "finally gave up and watched the wet green fields go slowly by.",
    "At the second stop a young boy carrying an old black violin case sat down across from her and smiled warmly, as "
    "if the two of them had somehow met somewhere long before.",
    "Neither of them said a single word until the broad river came into view at last, wide and grey and slow under a "
    "low heavy sky that promised rain well before noon.",
    "Then he asked her whether she happened to know the name of the long iron bridge just ahead, and she told him "
    "quietly that as far as she knew it had no name at all.",
    "He laughed, opened the worn case on his knees, and played a tune so soft and quiet that only the two of them "
    "could hear it over the steady sound of the wheels.",
]
START = {"type": "speech.start", "voice": "alice", "response_format": "pcm", "seed": 7}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("stream"), "--api-key", KEY, "--max-frames", "24")
    yield url
    stop_server(proc)


def connect(url: str, key: str | None = KEY, **options):
    headers = [f"Authorization: Bearer {key}"] if key else []
    return websocket.create_connection(url.replace("http", "ws", 1) + "/v1/audio/speech/stream", timeout=120,
                                       header=headers, **options)


def words(text: str, n: int = 4) -> list[str]:
    parts = text.split(" ")
    return [" ".join(parts[i:i + n]) + " " for i in range(0, len(parts), n)]


def closed(ws) -> bool:
    """Whether the server closes the connection next (a close frame: websocket-client's recv gives "")."""
    try:
        return ws.recv() == "" and not ws.connected
    except websocket.WebSocketConnectionClosedException:
        return True


def listen(ws) -> tuple[bytes, list[dict], dict]:
    """Every message until speech.audio.done: (the audio's bytes, the segments, the done message)."""
    audio, segments = b"", []
    while True:
        message = json.loads(ws.recv())
        if message["type"] == "speech.audio.delta":
            audio += base64.b64decode(message["audio"])
        elif message["type"] == "speech.segment":
            segments.append(message)
        elif message["type"] == "speech.audio.done":
            return audio, segments, message
        else:
            raise AssertionError(f"unexpected message {message}")


def test_streamed_text_is_spoken_as_it_comes_and_equals_the_http_answer(server):
    """The first two sentences in pieces of four words, 40 ms apart: audio comes back before the rest of the text is
    sent (an x-vector segment starts on its first words); after text.done the pcm equals, byte for byte, the HTTP
    answer for the whole text and seed, and each segment's span lies inside the audio, in order."""
    ws = connect(server)
    ws.send(json.dumps(START))
    pieces = words(" ".join(SENTENCES))
    early = len(words(SENTENCES[0] + " " + SENTENCES[1]))
    for piece in pieces[:early]:
        ws.send(json.dumps({"type": "text.delta", "text": piece}))
        time.sleep(0.04)
    first = json.loads(ws.recv())  # before the rest of the text is sent
    assert first["type"] == "speech.audio.delta", first
    audio = base64.b64decode(first["audio"])
    for piece in pieces[early:]:
        ws.send(json.dumps({"type": "text.delta", "text": piece}))
    ws.send(json.dumps({"type": "text.done"}))
    rest, segments, done = listen(ws)
    audio += rest
    ws.close()
    status, _, whole = request(server, "/v1/audio/speech", {"input": " ".join(SENTENCES), "voice": "alice",
                                                            "response_format": "pcm", "seed": 7},
                               headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and len(whole) > 0
    assert audio == whole, f"{len(audio)} bytes streamed, {len(whole)} over HTTP"
    assert done["seed"] == 7 and done["usage"]["output_tokens"] > 0
    seconds = len(audio) / 2 / 24000
    assert len(segments) >= 3
    assert all(0 <= s["start"] < s["end"] <= seconds + 1e-6 for s in segments)
    assert all(a["end"] <= b["start"] for a, b in zip(segments, segments[1:]))
    assert "".join(s["text"] for s in segments).replace(" ", "") == "".join(SENTENCES).replace(" ", "")


def test_a_websocket_without_the_key_or_from_another_origin_is_refused(server):
    with pytest.raises(websocket.WebSocketBadStatusException) as no_key:
        connect(server, key=None)
    with pytest.raises(websocket.WebSocketBadStatusException) as wrong:
        connect(server, key="not-the-key")
    with pytest.raises(websocket.WebSocketBadStatusException) as elsewhere:
        connect(server, origin="http://elsewhere.example")
    assert no_key.value.status_code == wrong.value.status_code == elsewhere.value.status_code == 403
    browser = websocket.create_connection(server.replace("http", "ws", 1) + f"/v1/audio/speech/stream?api_key={KEY}",
                                          timeout=60, origin=server)  # a page of this server: its own origin
    browser.close()


@pytest.mark.parametrize("message, param", [
    ({"type": "text.delta", "text": "Hello."}, "type"),                       # no speech.start first
    ({**START, "input": "Hello."}, "input"),                                  # the text comes in deltas
    ({**START, "voice": "nobody"}, "voice"),
    ({**START, "speed": 9}, "speed"),
])
def test_a_bad_start_is_one_error_then_the_close(server, message, param):
    ws = connect(server)
    ws.send(json.dumps(message))
    error = json.loads(ws.recv())
    assert error["type"] == "error" and error["error"]["param"] == param, error
    assert closed(ws)


def test_a_bad_message_after_the_start_is_an_error(server):
    ws = connect(server)
    ws.send(json.dumps(START))
    ws.send(json.dumps({"type": "text.delta", "text": 5}))
    error = json.loads(ws.recv())
    assert error["type"] == "error" and error["error"]["param"] == "text", error
    assert closed(ws)
