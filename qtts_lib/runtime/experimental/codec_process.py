"""Decode in a second process while this one generates: an experiment, not part of the product. Introduced in 14.

    from qtts_lib.runtime.experimental.codec_process import CodecProcess
    synth = Synthesizer(model_dir, threads=1, decoders=CodecProcess.for_checkpoint(model_dir))
    ...
    synth.close()                                   # stops the child

The pipeline runs at the slower of its halves, so it beats generating and then decoding on both cores only when the
codec's time on both cores is more than what the loop loses on one; chapter 14 (section 5, `python -m qtts_lib.bench
overlap`) measures it, and the measured gain has been within the noise of the machines this project runs on
(`data/bench/overlap/`). Threads would not overlap: the ncnn binding holds the GIL inside `extract`.

`CodecProcess` is a synthesizer's `decoders` (as `codec.stream.Decoders` is for this process): it starts a child
Python that loads the codec (`codec.decoder.Codec`, CPU form) and runs a `codec.stream.StreamDecoder` (incremental,
every frame decoded once) per utterance on the frames this process sends as the loop makes them; the child sends the
audio back piece by piece. Concatenated, the pieces are what `StreamDecoder` makes in this process (the same
arithmetic, bitwise equal for a stream's fixed pieces), and within float rounding of `synthesize`'s whole decode
(>= 100 dB) for `synthesize`'s pieces, whose size depends on timing.

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

from ..codec.decoder import Codec, check_codec_tier
from ..codec.stream import StreamDecoder
from ..errors import QttsError

HEADER = struct.Struct("<cII")  # kind, utterance id, payload bytes
ADAPTIVE_MIN_FRAMES = 2  # synthesize's decodes in the child: at least this many frames at once (but the last)
NEVER = 1 << 30          # a chunk length no utterance reaches
GROUPS = 16              # codes per frame on the wire (every 12 Hz checkpoint has 16 codebooks)


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


class CodecProcessError(QttsError, RuntimeError):
    """The codec process failed or exited."""


class CodecProcess:
    """A child Python decoding frames as they are sent (module docstring). `decoder(...)` gives the object the
    synthesizer feeds; `close()` (or the end of this process) stops the child."""

    @classmethod
    def for_checkpoint(cls, model_dir: str | Path, threads: int = 1, precision: str = "fp32") -> CodecProcess:
        config = json.loads((Path(model_dir) / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
        return cls(Path(model_dir) / "ncnn", config, threads, precision)

    def __init__(self, ncnn_dir: str | Path, decoder_config: dict, threads: int = 1, precision: str = "fp32"):
        """`precision`: the codec's tier in the child (`codec.decoder.CODEC_TIERS`)."""
        if threads < 1:
            raise ValueError(f"the codec process needs at least 1 thread, not {threads}")
        check_codec_tier(precision)
        self.threads = threads
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qtts_lib.runtime.experimental.codec_process", str(ncnn_dir),
             json.dumps(decoder_config),
             str(threads), precision], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
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

    def decoder(self, chunk_frames: int | None, prefix: np.ndarray | None = None) -> RemoteDecoder:
        """A `StreamDecoder` in the child (incremental; `prefix`: frames decoded in front, never emitted).
        `chunk_frames` None (what `synthesize` asks for): pieces of any length, decoded whenever the child is free
        (`child_loop`)."""
        if chunk_frames is not None and chunk_frames < 1:
            raise ValueError(f"chunk_frames must be at least 1 (or None: adaptive), not {chunk_frames}")
        return RemoteDecoder(self, next(self._ids), chunk_frames or 0, prefix)

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
        prefix = np.zeros((0, GROUPS), np.int64) if prefix is None else np.asarray(prefix, np.int64).reshape(-1, GROUPS)
        process._send(b"B", uid, struct.pack("<i", chunk_frames) + prefix.astype("<i8").tobytes())
        self.done = False

    held = False  # the child decodes ahead on its own and sends pieces as they are made: nothing held here

    def warm(self, frames: int | None = None) -> bool:
        return True

    def drain(self) -> list[np.ndarray]:
        return []

    def _take(self, kind: bytes, payload: bytes, pieces: list) -> None:
        if kind == b"A":
            pieces.append(np.frombuffer(payload, "<f4").astype(np.float32))
        elif kind == b"D":
            self.done = True
        elif kind == b"X":
            self.close()
            raise CodecProcessError(payload.decode(errors="replace"))

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        self.process._send(b"F", self.uid, np.asarray(frame, "<i8").reshape(GROUPS).tobytes())
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
def child_loop(ncnn_dir: Path, decoder_config: dict, threads: int, stdin_fd: int, stdout,
               min_piece: int = ADAPTIVE_MIN_FRAMES, precision: str = "fp32") -> None:
    """The child's loop: one `StreamDecoder` per utterance, fed frame by frame. Chunk 0 (what `synthesize` asks
    for) decodes adaptively: whenever no message is waiting and at least `min_piece` frames are, all of them at
    once, so the decode keeps pace with the loop (behind, its pieces grow and cost less per frame) and what is
    left after the last frame is short."""
    import traceback

    try:
        codec = Codec(ncnn_dir, decoder_config, threads, "cpu", precision=precision)
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
                prefix = np.frombuffer(payload[4:], "<i8").reshape(-1, codec.groups).astype(np.int64)
                adaptive = chunk == 0
                # adaptive: the decoder's own chunking never cuts a piece (the loop above decides when to decode)
                decoders = {uid: StreamDecoder(codec, chunk if chunk else NEVER, None,
                                               prefix if len(prefix) else None)}
            elif kind == b"F":
                dec = decoders.get(uid)
                if dec is not None:
                    for piece in dec.push(np.frombuffer(payload, "<i8").astype(np.int64)):
                        send(uid, piece)
                    while dec.held:  # the first piece's pieces, each sent as soon as it is made
                        for piece in dec.drain():
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
    child_loop(Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.stdin.fileno(), wire,
               precision=sys.argv[4])
