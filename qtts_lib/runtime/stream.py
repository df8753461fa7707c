"""Streaming decode: audio for each few frames as they are generated, equal to the whole decode. Introduced in 11.

The codec decoder is causal: causal convolutions, and a transformer whose sliding window (72 frames, so 71
frames back per layer) only looks left. A sample of frame k therefore depends on frames k-R..k only, with R
the *receptive field* (`receptive_field`): pre-conv 2 + layers x 71 + about 10 frames of the conv stack.
Decoding frames [a, b) with c frames of left context (`codes[a-c:b]`, then dropping the first c·1920
samples) gives the one-shot samples of [a, b) to float rounding once c >= R; with less context it is an
approximation whose error falls as c grows (`context_snr` measures it; chapter 11 plots it).

On the CPU, `StreamDecoder` does not decode anything twice: `Codec.incremental` continues one decode as frames
arrive (the transformer with a KV cache, the convolution stages from their kept left context), which is exact
and costs about one whole decode. Decoding each piece again with its left context (below) is the way on a GPU,
and the way to trade exactness for time when asked (`context_frames`).

`StreamDecoder` reproduces `Codec.decode`, the runtime's (and the reference's) whole-utterance decode:
- up to 300 frames `Codec.decode` is one graph call over all frames (the one-shot decode);
- past 300 frames the reference decodes chunks of 300 frames, each with only 25 frames of left context
  (`chunked_decode(300, 25)`), which is *not* the one-shot decode. The stream follows the same chunk
  boundaries: its left context never reaches back past the start of the reference chunk's context, so it
  reproduces the reference's long decode too, not a one-shot decode that the reference never makes.
Within one reference chunk, each emitted piece [a, b) is decoded from max(a - context_frames, chunk's context
start). When that is the chunk's context start, the piece *is* the reference's computation cut at b
(causality); when context_frames >= R (the default), the frames it leaves out are beyond every sample's
reach. Either way it equals the reference's samples to float rounding (~120 dB measured). With less context
it is within the SNR that `context_snr` measures for that context.

The wire formats (stdout, HTTP): 16-bit little-endian PCM at 24 kHz mono, raw (`pcm`, as OpenAI's
speech API) or behind a WAV header whose sizes say "unknown length" (0xFFFFFFFF, `wav`), which players
that read a pipe (ffplay, sox, aplay, mpv) accept.
"""
from __future__ import annotations

import math
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from .audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from .codec import CHUNK_FRAMES, LEFT_CONTEXT_FRAMES, Codec
from .net import release_threads

UNKNOWN_SIZE = 0xFFFFFFFF  # a WAV size field meaning "streamed, length not known"


# ------------------------------------------------------------ how much left context
def receptive_field(config: dict) -> int:
    """Frames of left context after which a decoded sample cannot change (from decoder_config).

    Each term is a layer's left reach in samples at its own rate, divided by that rate's samples per frame:
    pre_conv (kernel 3) at 1/frame; the transformer, (window - 1) per layer; per upsampling ratio a
    transposed conv with kernel = stride (no reach) and a ConvNeXt depthwise kernel 7 (6 back); the
    decoder's kernel-7 input conv; per upsample rate r a transposed conv of kernel 2r (1 input sample back)
    and residual units of kernel 7 at dilations 1, 3, 9 (6·13 back); the kernel-7 output conv."""
    reach = 2.0 + config["num_hidden_layers"] * (config["sliding_window"] - 1)
    per_frame = 1
    for f in config["upsampling_ratios"]:
        per_frame *= f
        reach += 6 / per_frame
    reach += 6 / per_frame
    for r in config["upsample_rates"]:
        reach += 1 / per_frame
        per_frame *= r
        reach += 6 * (1 + 3 + 9) / per_frame
    reach += 6 / per_frame
    return math.ceil(reach)


def decode_with_context(codec: Codec, codes: np.ndarray, start: int, stop: int, context: int) -> np.ndarray:
    """Samples of frames [start, stop) decoded from codes[start - context : stop] (context clipped at 0)."""
    lo = max(0, start - context)
    return codec.decode_once(codes[lo:stop])[(start - lo) * SAMPLES_PER_FRAME:]


def context_snr(codec: Codec, codes: np.ndarray, start: int, stop: int, contexts) -> list[float]:
    """SNR (dB) of frames [start, stop) decoded with each left context vs the one-shot decode of [0, stop)."""
    ref = codec.decode_once(codes[:stop])[start * SAMPLES_PER_FRAME:]
    return [snr_db(decode_with_context(codec, codes, start, stop, c), ref) for c in contexts]


def snr_db(ours: np.ndarray, ref: np.ndarray) -> float:
    """10·log10(Σref² / Σ(ours-ref)²), inf when equal (`qtts_lib.check.snr_db`, without the package)."""
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    noise = float(np.sum((a - b) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(b**2)) / noise)


def smallest_context(contexts, snrs, min_db: float = 60.0) -> int | None:
    """The smallest context from which every larger one measured reaches min_db (None if none does)."""
    ok = [c for i, c in enumerate(contexts) if all(s >= min_db for s in snrs[i:])]
    return min(ok) if ok else None


# ------------------------------------------------------------ the streaming decoder
class StreamDecoder:
    """Feed frames one at a time (`push`); get back the samples of every full chunk of `chunk_frames`
    frames; `finish` returns the rest. Concatenated, the pieces equal `codec.decode(prefix + frames)`
    minus the prefix's samples (see the module docstring for exactly how equal).

    `prefix`: frames decoded in front but never emitted (an ICL voice clip's codes, as the reference does).

    Two ways to decode a piece:
    - incremental (the default on the CPU, `context_frames=None`): one `Codec.incremental` decode per reference
      chunk, fed each piece once. Nothing is decoded twice, so streaming costs about what one whole decode
      costs, and every piece is exact.
    - re-decode (`context_frames` given, or a codec without the CPU form, e.g. on a GPU): each piece is decoded
      again with `context_frames` frames of left context (default `receptive_field`, exact); less is cheaper and
      approximate (chapter 11 measures how approximate)."""

    def __init__(self, codec: Codec, chunk_frames: int = 4, context_frames: int | None = None,
                 prefix: np.ndarray | None = None):
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be at least 1, not {chunk_frames}")
        self.codec, self.chunk = codec, chunk_frames
        self.incremental = context_frames is None and getattr(codec, "parts", None) is not None
        self.context = receptive_field(codec.config) if context_frames is None else context_frames
        self.frames: list[np.ndarray] = [] if prefix is None else list(np.asarray(prefix, np.int64))
        self.emitted = len(self.frames)  # frames whose samples are out (or never will be: the prefix)
        self._inc, self._inc_chunk, self._fed = None, None, 0  # the incremental decode of the current chunk

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        self.frames.append(np.asarray(frame, np.int64))
        out = []
        while len(self.frames) - self.emitted >= self.chunk:
            out.append(self._decode(self.emitted, self.emitted + self.chunk))
        return out

    def finish(self) -> np.ndarray:
        return self._decode(self.emitted, len(self.frames))

    def _decode(self, a: int, b: int) -> np.ndarray:
        codes = np.stack(self.frames[:b]) if b > 0 else np.zeros((0, 16), np.int64)
        parts = []
        while a < b:  # split at the reference's 300-frame chunk boundaries
            chunk_start = a // CHUNK_FRAMES * CHUNK_FRAMES
            end = min(b, chunk_start + CHUNK_FRAMES)
            floor = chunk_start - LEFT_CONTEXT_FRAMES if chunk_start - LEFT_CONTEXT_FRAMES > 0 else 0
            if self.incremental:
                if self._inc_chunk != chunk_start:  # a new reference chunk: decoded from its own context start
                    self._inc, self._inc_chunk, self._fed = self.codec.incremental(), chunk_start, floor
                if self._fed < a:  # context (or prefix) frames: decoded, not emitted
                    self._inc.push(codes[self._fed:a])
                parts.append(self._inc.push(codes[a:end]))
                self._fed = end
            else:
                lo = max(floor, a - self.context)
                parts.append(self.codec.decode_once(codes[lo:end])[(a - lo) * SAMPLES_PER_FRAME:])
            a = end
        self.emitted = b
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


# ------------------------------------------------------------ the synthesizer, streamed
class Cancelled(Exception):
    """The consumer stopped reading: the generation loop ends at its next frame."""


class _Tap:
    """The synthesizer seen through a tap: every frame the loop completes also goes to `sink`, and
    the final whole-utterance decode is skipped (the stream has decoded it piece by piece).
    `Synthesizer.synthesize` runs unchanged on it, so the stream is the product's one pipeline."""

    codec_process = None  # synthesize on the tap runs the loop here; the stream's decoder does the decoding

    def __init__(self, synth, sink: Callable[[np.ndarray], None], stop: threading.Event):
        self._synth, self._sink, self._stop = synth, sink, stop
        self.codec = _NoDecode()

    def __getattr__(self, name):
        return getattr(self._synth, name)

    def generate(self, *args, **kwargs):
        return type(self._synth).generate(self, *args, **kwargs)

    def _predict_frame(self, *args):
        if self._stop.is_set():
            raise Cancelled
        frame = self._synth._predict_frame(*args)
        self._sink(frame.codes)
        return frame


class _NoDecode:
    def decode_with_voice(self, codes, voice_codes=None) -> np.ndarray:
        return np.zeros(0, np.float32)


def stream_synthesis(synth, text: str, language: str, voice, chunk_frames: int = 4,
                     context_frames: int | None = None, **kwargs) -> Iterator[np.ndarray]:
    """`Synthesizer.stream`: yields float32 24 kHz pieces as frames are generated; returns the `Result`
    (codes, EOS step, warnings; its wav is None). The loop runs in a worker thread; closing the generator
    stops it at the next frame. kwargs go to `synthesize` (max_new_tokens, greedy, seed, on_frame, ...)."""
    if getattr(synth, "codec_process", None) is not None:  # decoded in a second process (runtime.pipeline)
        if context_frames is not None:
            raise ValueError("context_frames re-decodes in this process; a codec process decodes incrementally")
        decoder = synth.codec_process.decoder(chunk_frames, voice.codes)
    else:
        decoder = StreamDecoder(synth.codec, chunk_frames, context_frames, voice.codes)
    out: queue.Queue = queue.Queue()
    stop = threading.Event()

    def sink(frame):
        for piece in decoder.push(frame):
            out.put(("audio", piece))

    def work():
        try:
            result = type(synth).synthesize(_Tap(synth, sink, stop), text, language, voice, **kwargs)
            result.wav = None
            out.put(("audio", decoder.finish()))
            out.put(("done", result))
        except Cancelled:
            out.put(("done", None))
        except BaseException as e:  # handed to the consumer's thread, raised there
            out.put(("error", e))

    release_threads()  # this thread's OpenMP pool would starve the worker's on a machine with few cores
    worker = threading.Thread(target=work, name="qtts-stream", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = out.get()
            if kind == "audio":
                if len(value):
                    yield value
            elif kind == "error":
                raise value
            else:
                return value
    finally:
        stop.set()
        worker.join()
        if hasattr(decoder, "close"):
            decoder.close()  # a remote decoder stops listening (what its process still sends is dropped)


def drain(pieces: Iterator[np.ndarray], sink: Callable[[np.ndarray], None]):
    """Send every piece to `sink`; return the generator's return value (the `Result`)."""
    while True:
        try:
            sink(next(pieces))
        except StopIteration as end:
            return end.value


# ------------------------------------------------------------ wire formats
def wav_header(sample_rate: int = SAMPLE_RATE, data_bytes: int = UNKNOWN_SIZE) -> bytes:
    """A 44-byte header for 16-bit mono PCM; the default sizes say "length unknown" (streaming)."""
    riff = UNKNOWN_SIZE if data_bytes == UNKNOWN_SIZE else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
            sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", data_bytes))


def pcm16(wav: np.ndarray) -> bytes:
    """float samples in [-1, 1] -> 16-bit little-endian PCM bytes (rounded, clipped)."""
    return (np.clip(np.asarray(wav, np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class WavFile:
    """A float32 wav (the format `save_wav` writes) written piece by piece: the sizes in the header are
    rewritten after every piece, so the file is a complete wav whenever a player opens it."""

    def __init__(self, path, sample_rate: int = SAMPLE_RATE):
        self.file, self.sample_rate, self.samples = open(path, "wb"), sample_rate, 0
        self._header()

    def _header(self) -> None:
        data = self.samples * 4
        self.file.seek(0)
        self.file.write(b"RIFF" + struct.pack("<I", 50 + data) + b"WAVEfmt "
                        + struct.pack("<IHHIIHHH", 18, 3, 1, self.sample_rate, self.sample_rate * 4, 4, 32, 0)
                        + b"fact" + struct.pack("<II", 4, self.samples) + b"data" + struct.pack("<I", data))
        self.file.seek(0, 2)

    def write(self, wav: np.ndarray) -> None:
        self.file.write(np.asarray(wav, "<f4").tobytes())
        self.samples += len(wav)
        self._header()
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def write_stream(output, pieces: Iterator[np.ndarray]):
    """Write pieces as they come: to a `WavFile`, or with output "-" to stdout as 16-bit PCM behind a
    WAV header of unknown length (for piping into a player). Returns (the `Result`, samples written)."""
    import sys

    samples = 0
    if str(output) == "-":
        out = sys.stdout.buffer
        out.write(wav_header())

        def sink(piece):
            out.write(pcm16(piece))
            out.flush()
    else:
        out = WavFile(output)
        sink = out.write
    try:
        def counted(piece):
            nonlocal samples
            sink(piece)
            samples += len(piece)
        result = drain(pieces, counted)
    finally:
        if str(output) != "-":
            out.close()
    return result, samples


# ------------------------------------------------------------ time to first audio
def ttfa_ms(synth, text: str, language: str, voice, chunk_frames: int = 4, repeats: int = 3,
            **kwargs) -> dict:
    """Time to first audio: from calling `stream` to its first piece, median of `repeats` (ms).

    Each run stops after the first piece. The prompt, prefill, chunk_frames frames and one codec call are
    inside; loading the graphs and building the voice are not (a server does those once)."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pieces = stream_synthesis(synth, text, language, voice, chunk_frames=chunk_frames, **kwargs)
        next(pieces)
        runs.append((time.perf_counter() - t0) * 1000.0)
        pieces.close()
    return {"ttfa_ms": float(np.median(runs)), "runs_ms": runs, "chunk_frames": chunk_frames,
            "ms_per_chunk_of_audio": chunk_frames * SAMPLES_PER_FRAME / SAMPLE_RATE * 1000.0}
