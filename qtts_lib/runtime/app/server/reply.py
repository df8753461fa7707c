"""`qtts serve`'s answer to a speech request: the engine's audio pieces through the tempo filter and the encoder of
the request's format, streamed as an ASGI response (chunked bytes, or OpenAI's server-sent events). Introduced in 18.

FFmpeg's work (an mp3 frame, an atempo window) runs on a small pool of threads of its own (`ENCODING`), never on the
event loop: a slow encode holds up only its own stream, never /health or another request. Each reply hands the pool
one piece at a time and waits for its bytes before the next, so its pieces stay in order.
"""
from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

from ...audio.encode import Encoder
from ...audio.tempo import Tempo
from ...audio.wav import SAMPLE_RATE
from ...errors import AudioError, InputError
from ...pipeline.longform import Span
from .engine import EngineFailed, Job, Unavailable
from .schema import SEED_HEADER, RequestError

SEND_TIMEOUT = 30.0      # seconds a client may take no audio at all before it is dropped
ENCODE_THREADS = 2       # FFmpeg's threads, shared by every reply: encoding 24 kHz mono is far faster than real time
ENCODING = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="qtts-encode")  # threads start on first use


class Reply:
    """One speech request's answer, on the event loop: wait for its first audio (or its client leaving), then
    stream the rest (`AudioResponse`): each piece through the tempo filter (`audio.tempo.Tempo`, the request's
    `speed`) and the encoder of its format, as it comes. However it ends, `close` frees its place once and counts
    its outcome. Raises `InputError` when PyAV is missing for the format or the speed. The filter and the encoder
    are opened (`open`) and run on `ENCODING`'s threads, one piece of this reply at a time (`_off_loop`)."""

    def __init__(self, job: Job, metrics, received: float, send_timeout: float):
        self.job, self.metrics, self.received = job, metrics, received
        self.send_timeout, self.outcome = send_timeout, "abandoned"
        self.encoder = Encoder(job.speech.format)
        self.tempo = Tempo(job.speech.speed)
        self._work: Future | None = None  # the piece being encoded, if any

    @classmethod
    async def open(cls, job: Job, metrics, received: float, send_timeout: float) -> Reply:
        """A `Reply` made on an `ENCODING` thread, where FFmpeg opens its codec and filter graph."""
        return await asyncio.wrap_future(ENCODING.submit(cls, job, metrics, received, send_timeout))

    async def _off_loop(self, work, *args) -> bytes:
        """`work(*args)` on an `ENCODING` thread, awaited: the next piece is handed over only once this one is done."""
        self._work = ENCODING.submit(work, *args)
        return await asyncio.wrap_future(self._work)

    async def encode(self, piece) -> bytes:
        """One piece's bytes in the reply's format (tempo and encoder, off the event loop; maybe none yet)."""
        return await self._off_loop(self._piece, piece)

    async def rest(self) -> bytes:
        """The bytes the tempo filter and the encoder still hold, at the stream's end."""
        return await self._off_loop(self._rest)

    def _piece(self, value) -> bytes:
        return self.encoder.write(self.tempo.write(value))

    def _rest(self) -> bytes:
        return self.encoder.write(self.tempo.close()) + self.encoder.close()

    @property
    def seed(self) -> int:
        return self.job.speech.sampling.seed

    def usage(self) -> dict:
        """OpenAI's usage of the request: the input's text tokens in, the audio frames out (once done)."""
        tokens, frames = self.job.usage()
        return {"input_tokens": tokens, "output_tokens": frames, "total_tokens": tokens + frames}

    async def first(self, request):
        """("audio", piece), ("done", None) for an utterance with no audio at all (the model's end of speech at its
        first frame), ("refused"/"error"/"busy", exception), or None when the client left first."""
        taken = asyncio.ensure_future(anext(self.job))
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({taken, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not taken.done():
                return None
            try:
                return "audio", taken.result()
            except StopAsyncIteration:
                return "done", None
            except (InputError, AudioError) as e:
                return "refused", e
            except EngineFailed as e:
                return "error", e
            except Unavailable as e:
                return "busy", e
        finally:
            for task in (taken, gone):
                task.cancel()

    async def chunks(self, kind: str, value):
        """The encoded stream from the first message on; raises `BrokenStream` when the engine fails."""
        first = True
        while kind == "audio":
            if isinstance(value, Span):  # a segment's audio is all in (a request streamed as events asks for these)
                yield Span(value.text, value.start / self.tempo.speed, value.end / self.tempo.speed)
            elif chunk := await self._off_loop(self._piece, value):
                if first:
                    self.metrics.time_to_first_audio.observe(time.monotonic() - self.received)
                    first = False
                yield chunk
            try:
                value = await anext(self.job)
            except StopAsyncIteration:
                kind = "done"
            except EngineFailed as e:
                self.outcome = "error"
                raise BrokenStream(str(e)) from None
        rest = await self._off_loop(self._rest)
        self.outcome = "done"
        audio_s = self.encoder.samples / SAMPLE_RATE
        self.metrics.audio_seconds.inc(audio_s)
        if audio_s > 0:
            self.metrics.real_time_factor.observe((time.monotonic() - self.received) / audio_s)
        self.job.close()  # before the last chunk goes out: the client's next request finds its place free
        if rest:
            yield rest

    def close(self) -> None:
        self.job.close()
        if self.outcome != "done":  # after the piece being encoded, if any (on its thread): never beside it
            if self._work is None:
                self.encoder.discard()
            else:
                self._work.add_done_callback(lambda _: self.encoder.discard())
        self.metrics.streams.labels(self.job.speech.format, self.outcome).inc()


def unavailable(e: Unavailable) -> RequestError:
    """The engine's `Unavailable` as a 503: overloaded (with Retry-After), or the engine stopped."""
    if e.retry_after is None:
        return RequestError(503, str(e), kind="server_error", code="engine_stopped")
    return RequestError(503, str(e), kind="server_error", code="overloaded",
                        headers={"Retry-After": str(e.retry_after)})


class BrokenStream(Exception):
    """The engine failed after the stream's first audio: the response is cut off, not ended."""


async def _disconnected(receive) -> None:
    """Returns when the client has gone (its body already read, the next ASGI message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class AudioResponse:
    """The streamed answer (an ASGI response): the headers (the format's content type, X-Sample-Rate, X-Seed: the
    seed the request sampled with), then each encoded chunk as it comes; with `sse`, each chunk is a server-sent
    event instead (`speech.audio.delta`, its bytes in base64), and a `speech.audio.done` event with the usage ends
    the stream (OpenAI's `stream_format: "sse"`). Every send waits at most the reply's `send_timeout` for the client
    to take it; a client that does not is dropped. An engine error after the first audio, a client that left or one
    dropped: the body is cut off (the connection closes with no last chunk, and no done event), never ended as if
    complete. `Reply.close` runs however it ends."""

    def __init__(self, reply: Reply, first: tuple, media_type: str, sse: bool = False):
        self.reply, self.first, self.sse = reply, first, sse
        self.media_type = "text/event-stream" if sse else media_type

    async def __call__(self, scope, receive, send) -> None:
        reply = self.reply
        headers = [(b"content-type", self.media_type.encode()), (b"x-sample-rate", str(SAMPLE_RATE).encode()),
                   (SEED_HEADER.lower().encode(), str(reply.seed).encode())]
        if self.sse:
            headers.append((b"cache-control", b"no-cache"))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in reply.chunks(*self.first):
                if isinstance(chunk, Span):
                    body = sse_event({"type": "speech.segment", **chunk.as_dict()})
                else:
                    body = sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}) \
                        if self.sse else chunk
                if not await _send_or_leave(send, {"type": "http.response.body", "body": body, "more_body": True},
                                            gone, reply.send_timeout):
                    return
            last = sse_event({"type": "speech.audio.done", "usage": reply.usage()}) if self.sse else b""
            await send({"type": "http.response.body", "body": last, "more_body": False})
        except BrokenStream as e:
            print(f"qtts serve: error while streaming: {e.args[0]!r}", file=sys.stderr)
        finally:
            gone.cancel()
            reply.close()


def sse_event(data: dict) -> bytes:
    """One server-sent event holding `data` as JSON (a `data:` line, then the blank line that ends the event)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _send_or_leave(send, message: dict, gone: asyncio.Future, timeout: float) -> bool:
    """Send `message`, unless the client has left or takes nothing for `timeout` seconds: whether the client is
    still there to take more."""
    if gone.done():
        return False
    sending = asyncio.ensure_future(send(message))
    done, _ = await asyncio.wait({sending, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if sending in done:
        sending.result()
        return not gone.done()
    sending.cancel()
    if gone not in done:
        print(f"qtts serve: a client took no audio for {timeout:.0f} s: dropped", file=sys.stderr)
    return False
