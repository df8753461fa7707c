"""`qtts serve`'s WebSocket, `/v1/audio/speech/stream`: text streamed in, audio streamed out. Introduced in 20.

A language model writes its answer a token at a time; this route speaks it as it comes. The client sends JSON text
frames:

    {"type": "speech.start", "voice": "alice", "response_format": "pcm", "seed": 7, ...}   # a speech request's
                                                                                          # fields but `input`
    {"type": "text.delta", "text": "The morning train left "}                             # any number of these
    {"type": "text.done"}

and gets back `{"type": "speech.audio.delta", "audio": BASE64}` (the bytes of `response_format`, as they are
encoded), `{"type": "speech.segment", "text": ..., "start": s, "end": s}` once a segment's audio has all been sent
(seconds in this stream's audio), then `{"type": "speech.audio.done", "seed": N, "usage": {...}}`, and the server
closes. Anything wrong (a bad message, a refused request, a text past the budget, a client silent for
`IDLE_SECONDS` while its text is open) is one `{"type": "error", "error": {...}}`, as the HTTP errors read, then the
close.

The text goes to the engine as it comes (`Engine.speak_text`): each segment starts as soon as the segmenter can
decide it from the text so far, and the audio is the one the HTTP route gives for the whole text, seed and pieces.

The API key guards this route as every /v1/ path (`http.Gate`): `Authorization: Bearer KEY`, or, from a browser,
which cannot set a header on a WebSocket, `?api_key=KEY`. A browser's `Origin` must be the server's own or one given
with `--cors-origin`; a refused handshake is answered 403.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time

import numpy as np

from ...errors import InputError
from .engine import EngineFailed, Unavailable
from .reply import Reply, unavailable
from .schema import RequestError

IDLE_SECONDS = 30.0      # a client whose text is open and that sends nothing this long is closed with an error
MAX_MESSAGE_BYTES = 64 * 1024  # one client message at most (a speech.start, or a text.delta)


class Closed(Exception):
    """The client has gone."""


async def speech_stream(api, websocket) -> None:
    """One streamed request on `websocket` (Starlette's), served by `api` (`http.Api`): its start, its text and
    its audio (module docstring). However it ends, the request's place is freed."""
    await websocket.accept()
    received = time.monotonic()
    try:
        start = await _message(websocket, IDLE_SECONDS)
        if start.get("type") != "speech.start":
            raise RequestError(400, f"the first message is a speech.start, not {start.get('type')!r}", "type")
        fields = {k: v for k, v in start.items() if k != "type"}
        if "input" in fields:
            raise RequestError(400, "speech.start takes no input: the text comes in text.delta messages", "input")
        speech = api.parse(json.dumps({**fields, "input": "."}).encode())  # every field checked as HTTP's
        speech = dataclasses.replace(speech, text=None)
        voice = await api.voice_of(speech)
        try:
            job = await api.engine.speak_text(speech, voice)
        except Unavailable as e:
            raise unavailable(e) from None
    except RequestError as e:
        return await _fail(websocket, e)
    except Closed:
        return
    try:
        reply = await Reply.open(job, api.metrics, received, api.send_timeout)
    except BaseException as e:
        job.close()
        if isinstance(e, InputError):
            return await _fail(websocket, RequestError(501, str(e), "response_format", kind="server_error",
                                                       code="format_unavailable"))
        raise
    reading = asyncio.ensure_future(_read_text(websocket, job))
    try:
        await _speak(websocket, reply, reading)
    except RequestError as e:
        await _fail(websocket, e)
    except Closed:
        pass
    finally:
        reading.cancel()
        reply.close()


async def _read_text(websocket, job) -> None:
    """The client's text messages into the job, until text.done; a bad or late message raises `RequestError`."""
    while True:
        message = await _message(websocket, IDLE_SECONDS)
        kind = message.get("type")
        if kind == "text.delta":
            text = message.get("text")
            if not isinstance(text, str):
                raise RequestError(400, "a text.delta carries its text as a string in `text`", "text")
            job.feed(text)
        elif kind == "text.done":
            job.finish()
            break
        else:
            raise RequestError(400, f"expected text.delta or text.done, not {kind!r}", "type")
    while True:  # after text.done the client only listens: anything but its leaving is an error
        message = await _message(websocket, None)
        raise RequestError(400, f"the text is done; {message.get('type')!r} came after it", "type")


async def _speak(websocket, reply: Reply, reading: asyncio.Future) -> None:
    """The job's audio and segments to the client as they come, while `reading` takes its text; ends with
    speech.audio.done (or the reader's error)."""
    job = reply.job
    items = asyncio.ensure_future(anext(job))
    try:
        while True:
            await asyncio.wait({items, reading}, return_when=asyncio.FIRST_COMPLETED)
            if reading.done() and not reading.cancelled() and reading.exception() is not None:
                raise reading.exception()
            if not items.done():
                continue
            try:
                item = items.result()
            except StopAsyncIteration:
                break
            except InputError as e:
                raise RequestError(400, str(e), "text", code="over_budget" if "budget" in str(e) else None) from None
            except EngineFailed as e:
                raise RequestError(500, f"the engine failed: {e}", kind="server_error", code="engine_error") from None
            except Unavailable as e:  # waited past --max-wait for one of the streams' places
                raise unavailable(e) from None
            if isinstance(item, np.ndarray):
                chunk = await reply.encode(item)
                if chunk:
                    await _send(websocket, {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()})
            else:
                await _send(websocket, {"type": "speech.segment", **item.as_dict()})
            items = asyncio.ensure_future(anext(job))
        rest = await reply.rest()
        reply.outcome = "done"
        if rest:
            await _send(websocket, {"type": "speech.audio.delta", "audio": base64.b64encode(rest).decode()})
        await _send(websocket, {"type": "speech.audio.done", "seed": reply.seed, "usage": reply.usage()})
        await websocket.close()
    finally:
        items.cancel()


async def _message(websocket, timeout: float | None) -> dict:
    """The client's next message as a JSON object; `Closed` when it has gone, `RequestError` when the message is
    not one or does not come within `timeout` seconds."""
    try:
        message = await asyncio.wait_for(websocket.receive(), timeout)
    except TimeoutError:
        raise RequestError(408, f"no message for {timeout:.0f} s while the text is open", code="idle_timeout") \
            from None
    if message["type"] == "websocket.disconnect":
        raise Closed
    text = message.get("text")
    if text is None:
        raise RequestError(400, "messages are JSON text frames, not binary ones")
    if len(text) > MAX_MESSAGE_BYTES:
        raise RequestError(413, f"a message is at most {MAX_MESSAGE_BYTES} bytes; send the text in smaller deltas")
    try:
        obj = json.loads(text)
    except ValueError:
        raise RequestError(400, "a message is not JSON") from None
    if not isinstance(obj, dict):
        raise RequestError(400, "a message is a JSON object with a `type`")
    return obj


async def _send(websocket, message: dict) -> None:
    try:
        await websocket.send_text(json.dumps(message, separators=(",", ":")))
    except Exception as e:  # noqa: BLE001 - the client has gone (the ASGI server's own exception type)
        raise Closed from e


async def _fail(websocket, e: RequestError) -> None:
    """The error as the HTTP errors read, then the close (policy violation for a client's fault)."""
    try:
        await websocket.send_text(json.dumps({"type": "error", **e.body()}, separators=(",", ":")))
        await websocket.close(code=1008 if e.status < 500 else 1011)
    except Exception:  # noqa: BLE001 - the client has gone already
        pass
