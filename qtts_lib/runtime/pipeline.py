"""Decode in a second process while this one generates. Introduced in 10.

    synth = Synthesizer(model_dir, threads=1, codec_process=True)   # the loop on one core, the codec on another
    qtts say --threads 1 --codec-process ...

Chapter 10 (section 6, `python -m qtts_lib.overlap`) measured when it can pay on two cores: the pipeline runs at the
slower of its halves, so it beats generating and then decoding on both cores when the codec's time on both cores is
more than what the loop loses on one. On the EPYC VM, int8, one run gave 91.7 vs 111.1 ms per frame and another
97.1 vs 97.3 (fp16: 185.4 vs 172.1, then 150.8 vs 163.0): no more than the VM's noise. On the Intel VM the split
was not faster (179 vs 174). Threads would not overlap: the ncnn binding holds the GIL inside `extract`.

`CodecProcess` starts a child Python that loads the codec (`runtime.codec.Codec`, CPU form) and runs a
`stream.StreamDecoder` (incremental, every frame decoded once) per utterance on the frames this process sends as the
loop makes them; the child sends the audio back piece by piece. Concatenated, the pieces are what
`StreamDecoder` makes in this process (the same arithmetic: bitwise equal on the same machine and thread count),
which chapter 11 holds to `synthesize`'s whole decode (>= 100 dB).

The wire: a 9-byte header (kind, utterance id, payload bytes) and a payload. To the child: B (begin: chunk frames,
then the prefix codes, int64), F (one frame of codes, 16 int64), E (end). From the child: R (ready), A (float32
samples), D (done), X (an error's text). Pieces of an utterance nobody waits for any more are dropped.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

HEADER = struct.Struct("<cII")  # kind, utterance id, payload bytes
ADAPTIVE_MIN_FRAMES = 2  # synthesize's decodes in the child: at least this many frames at once (but the last)


def _write_message(f, kind: bytes, uid: int, payload: bytes = b"") -> None:
    f.write(HEADER.pack(kind, uid, len(payload)) + payload)
    f.flush()


class _Inbox:
    """A pipe's messages, read from its raw fd, with a look at whether another one is waiting (select); both
    ends use it (the child's stdin, the parent's view of the child's stdout)."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, bytearray(), False

    def _complete(self) -> bool:
        if len(self.buf) < HEADER.size:
            return False
        return len(self.buf) >= HEADER.size + HEADER.unpack_from(self.buf)[2]

    def waiting(self) -> bool:
        """A whole message is here already, or bytes of one are readable without blocking."""
        import select

        return self._complete() or (not self.eof and bool(select.select([self.fd], [], [], 0)[0]))

    def read(self):
        while not self._complete():
            data = os.read(self.fd, 1 << 16)
            if not data:
                self.eof = True
                return None
            self.buf += data
        kind, uid, size = HEADER.unpack_from(self.buf)
        payload = bytes(self.buf[HEADER.size:HEADER.size + size])
        del self.buf[:HEADER.size + size]
        return kind, uid, payload


class CodecProcessError(RuntimeError):
    """The codec process failed or exited."""


class CodecProcess:
    """A child Python decoding frames as they are sent (module docstring). `decoder(...)` gives the object a
    stream feeds; `close()` (or the end of this process) stops the child."""

    def __init__(self, ncnn_dir: str | Path, decoder_config: dict, threads: int = 1):
        if threads < 1:
            raise ValueError(f"the codec process needs at least 1 thread, not {threads}")
        self.threads = threads
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qtts_lib.runtime.pipeline", str(ncnn_dir), json.dumps(decoder_config),
             str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._inbox = _Inbox(self.proc.stdout.fileno())
        first = self._inbox.read()
        if first is None or first[0] != b"R":
            self.proc.kill()
            text = first[2].decode(errors="replace") if first else "it exited while loading"
            raise CodecProcessError(f"the codec process did not start: {text}")
        self._lock = threading.Lock()  # one writer at a time
        self._queues: dict[int, queue.Queue] = {}
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, name="qtts-codec-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            message = self._inbox.read()
            if message is None:
                for q in list(self._queues.values()):
                    q.put((b"X", b"the codec process exited"))
                return
            kind, uid, payload = message
            q = self._queues.get(uid)
            if q is not None:
                q.put((kind, payload))

    def _send(self, kind: bytes, uid: int, payload: bytes = b"") -> None:
        try:
            with self._lock:
                _write_message(self.proc.stdin, kind, uid, payload)
        except (BrokenPipeError, ValueError) as e:
            raise CodecProcessError(f"the codec process is gone (exit {self.proc.poll()})") from e

    def decoder(self, chunk_frames: int = 4, prefix: np.ndarray | None = None) -> RemoteDecoder:
        """A `StreamDecoder` in the child (incremental; `prefix`: frames decoded in front, never emitted).
        `chunk_frames` 0: pieces of any length, decoded whenever the child is free (`serve`; for `synthesize`)."""
        if chunk_frames < 0:
            raise ValueError(f"chunk_frames must be at least 1 (or 0: adaptive), not {chunk_frames}")
        return RemoteDecoder(self, next(self._ids), chunk_frames, prefix)

    def decode_with_voice(self, codes: np.ndarray, voice_codes: np.ndarray | None = None) -> np.ndarray:
        """A whole utterance's codes at once (what `Codec.decode_with_voice` returns, decoded in the child)."""
        dec = self.decoder(0, voice_codes)
        pieces = [p for frame in np.asarray(codes, np.int64) for p in dec.push(frame)]
        return np.concatenate(pieces + [dec.finish()]).astype(np.float32)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __del__(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()


class RemoteDecoder:
    """`StreamDecoder`'s interface over a `CodecProcess`: `push(frame)` sends the frame and returns the pieces that
    have come back so far (the child decodes while this process generates); `finish()` waits for the rest."""

    def __init__(self, process: CodecProcess, uid: int, chunk_frames: int, prefix: np.ndarray | None):
        self.process, self.uid, self.chunk = process, uid, chunk_frames
        self.queue: queue.Queue = queue.Queue()
        process._queues[uid] = self.queue
        prefix = np.zeros((0, 16), np.int64) if prefix is None else np.asarray(prefix, np.int64).reshape(-1, 16)
        process._send(b"B", uid, struct.pack("<i", chunk_frames) + prefix.astype("<i8").tobytes())
        self.done = False

    def _take(self, kind: bytes, payload: bytes, pieces: list) -> None:
        if kind == b"A":
            pieces.append(np.frombuffer(payload, "<f4").astype(np.float32))
        elif kind == b"D":
            self.done = True
        elif kind == b"X":
            self.close()
            raise CodecProcessError(payload.decode(errors="replace"))

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        self.process._send(b"F", self.uid, np.asarray(frame, "<i8").reshape(16).tobytes())
        pieces: list[np.ndarray] = []
        while True:
            try:
                kind, payload = self.queue.get_nowait()
            except queue.Empty:
                return [p for p in pieces if len(p)]
            self._take(kind, payload, pieces)

    def finish(self) -> np.ndarray:
        self.process._send(b"E", self.uid)
        pieces: list[np.ndarray] = []
        while not self.done:
            self._take(*self.queue.get(), pieces)
        self.close()
        return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)

    def close(self) -> None:
        """Stop listening (a cancelled stream): what the child still sends for this utterance is dropped."""
        self.process._queues.pop(self.uid, None)


# ---------------------------------------------------------------- the child
def serve(ncnn_dir: Path, decoder_config: dict, threads: int, stdin_fd: int, stdout,
          min_piece: int = ADAPTIVE_MIN_FRAMES) -> None:
    """The child's loop: one `StreamDecoder` per utterance, fed frame by frame. Chunk 0 (what `synthesize` asks
    for) decodes adaptively: whenever no message is waiting and at least `min_piece` frames are, all of them at
    once, so the decode keeps pace with the loop (behind, its pieces grow and cost less per frame) and what is
    left after the last frame is short."""
    import traceback

    from .codec import Codec
    from .stream import StreamDecoder

    try:
        codec = Codec(ncnn_dir, decoder_config, threads, "cpu")
    except Exception:
        _write_message(stdout, b"X", 0, traceback.format_exc().encode())
        return
    _write_message(stdout, b"R", 0)
    inbox = _Inbox(stdin_fd)
    decoders: dict[int, StreamDecoder] = {}
    adaptive = False

    def send(uid, audio):
        if len(audio):
            _write_message(stdout, b"A", uid, np.ascontiguousarray(audio, "<f4").tobytes())

    while True:
        if adaptive and not inbox.waiting():
            ((uid, dec),) = decoders.items()
            if len(dec.frames) - dec.emitted >= min_piece:
                try:
                    send(uid, dec.finish())  # everything that has come so far (finish does not end a decoder)
                except Exception:
                    decoders, adaptive = {}, False
                    _write_message(stdout, b"X", uid, traceback.format_exc().encode())
                continue
        message = inbox.read()
        if message is None:
            return
        kind, uid, payload = message
        try:
            if kind == b"B":
                (chunk,) = struct.unpack_from("<i", payload)
                prefix = np.frombuffer(payload[4:], "<i8").reshape(-1, 16).astype(np.int64)
                adaptive = chunk == 0
                decoders = {uid: StreamDecoder(codec, chunk if chunk else 1 << 30, None,
                                               prefix if len(prefix) else None)}
            elif kind == b"F":
                dec = decoders.get(uid)
                if dec is not None:
                    for piece in dec.push(np.frombuffer(payload, "<i8").astype(np.int64)):
                        send(uid, piece)
            elif kind == b"E":
                dec = decoders.pop(uid, None)
                adaptive = adaptive and bool(decoders)
                if dec is not None:
                    send(uid, dec.finish())
                _write_message(stdout, b"D", uid)
        except Exception:
            decoders, adaptive = {}, False
            _write_message(stdout, b"X", uid, traceback.format_exc().encode())


if __name__ == "__main__":
    wire = os.fdopen(os.dup(1), "wb")  # the protocol keeps the real stdout; anything printed goes to stderr
    os.dup2(2, 1)
    serve(Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.stdin.fileno(), wire)
