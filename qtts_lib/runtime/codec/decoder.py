"""The codec decoder over its exported graph: codes (T, 16) -> 24 kHz waveform. Introduced in 07.

The graph (chapter 04) takes the 16 codebooks packed for one fused embedding table
(`pack_codes`), a sliding-window causal mask and rope tables. The reference decodes long
outputs in chunks (`chunked_decode(chunk_size=300, left_context_size=25)`): each chunk is
decoded with up to 25 frames of left context whose samples are then dropped. The first
chunk equals a one-shot decode, later ones do not (25 frames is far less than the
transformer's reach), so matching the reference means chunking exactly as it does.

On the CPU the graph runs in a faster equivalent form (`codec.cpu_form`, chapter 12), cut in
parts at the input of each upsampling stage. Part 0 (codebooks, transformer, ConvNeXt upsampler) runs over
all frames; the stages after it are causal convolutions that reach only a few input samples back
(`reach` measures how many), so each runs over chunks of a few frames with that much left context, and a
chunk goes on to the next stage as soon as it is made (`run_parts`). A decode of any length then holds no
stage whole: at full size the codec's working memory stays in the low hundreds of MB instead of growing
by about 10 MB per frame, which also matters for speed where fresh memory is slow to touch (a VM).

`precision="bf16"` (CPU form only) runs the upsampling parts with ncnn's bf16 storage: weights and the
activations between layers held as bfloat16 (8 bits of mantissa), fp32 accumulation. `precision="int8"` keeps fp32
storage and makes the residual units of the last three decoder stages int8 convolutions, calibrated once, and the
ConvNeXt upsampler's projections int8 Gemms with run-time scales (`codec.int8_form`). Both
are approximations, measured against fp32 on the same codes (SNR, spectral distance, the codes Mimi hears) in
chapter 13; fp32 is the parity tier.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..audio.wav import SAMPLES_PER_FRAME
from ..binding import rope
from ..binding.cached import KvCache, layer_cache_outputs
from ..binding.net import Net, make_net, memory_pool, parse_device, run
from ..errors import InputError, PrecisionError
from ..rewrites.decode_step import cpu_graph
from .cpu_form import fast_graph, load_parts, manifest_axes
from .gpu_form import gpu_graph
from .int8_form import int8_graph, stage_of_part
from .parts import Part, PartChain, attention_inputs, pack_codes, run_codes, run_parts, transformer_output

CHUNK_FRAMES, LEFT_CONTEXT_FRAMES = 300, 25  # the reference's chunked_decode defaults


CODEC_TIERS = ("fp32", "bf16", "int8")


def check_codec_tier(precision: str, form: str = "cpu") -> str:
    """`precision` if the codec can run it in `form`, else a PrecisionError that says what can."""
    if precision not in CODEC_TIERS:
        raise PrecisionError(f"unknown codec precision {precision!r}; use one of {', '.join(CODEC_TIERS)}")
    if precision != "fp32" and form != "cpu":
        raise PrecisionError(f"the codec's {precision} tier runs its CPU form only; use fp32 on a GPU")
    return precision


class Codec:
    """`decode(codes)` as the reference does it; `decode_once` for one graph call's worth of frames.

    `form` "cpu" (the default on the CPU) loads the faster equivalent form of `codec.cpu_form` (1-D convolutions as
    2-D ones with h = 1, which reach ncnn's packed kernels, polyphase upsampling, long convolutions cut along time,
    other wide ones along input channels) in parts whose upsampling stages run chunk by chunk; "gpu" (the default
    on a GPU) `codec.gpu_form`: the codebooks on the CPU, everything after them one Vulkan graph with no layer
    left to the CPU; "exported" the graph pnnx wrote, as chapter 04 aligned it (on a GPU its layers without a
    Vulkan kernel run on the CPU mid-graph). `log` hears about one-time work (the int8 tier's calibration)."""

    def __init__(self, ncnn_dir: str | Path, config: dict, threads: int = 2, device: str = "cpu",
                 form: str | None = None, precision: str = "fp32", log=None):
        self.config = config  # speech_tokenizer/config.json's decoder_config
        self.groups = int(config["num_quantizers"])
        form = ("cpu" if parse_device(device) is None else "gpu") if form is None else form
        if form not in ("cpu", "gpu", "exported"):
            raise InputError(f"unknown codec form {form!r}; use cpu, gpu or exported")
        self.precision = check_codec_tier(precision, form)
        self.form, self.threads, self.device = form, threads, device
        self.parts: list[Part] | None = None
        self.net = None
        if form == "cpu":
            self.directory, desc = (int8_graph(ncnn_dir, config, threads, log) if precision == "int8"
                                    else fast_graph(ncnn_dir, config))
            self.in_axes = manifest_axes(self.directory / desc.get("manifest", "manifest.json"))
            self.part_files = [[self.directory / f for f in p["files"]] for p in desc["parts"]]
            # one memory pool for every part: far less fresh memory on the first decode (binding.net.memory_pool)
            self.parts = load_parts(self.directory, desc, threads, device, bf16=precision == "bf16",
                                    pool=memory_pool() if parse_device(device) is None else None, stateful=True)
            self.transformer_kv = self.directory / desc["transformer_kv"]
            # the transformer's cached form, loaded once: every incremental decode (a stream, one per 300-frame
            # chunk) runs it with a cache of its own
            kv_bin = (self.directory / desc["transformer_kv_bin"] if "transformer_kv_bin" in desc  # the int8 tier's
                      else self.part_files[1][1])
            self.transformer_net = make_net(self.transformer_kv, kv_bin, threads, device,
                                            cpu_graph if parse_device(device) is None else None)
            self.transformer_layers = sum(1 for line in self.transformer_kv.read_text().splitlines()
                                          if line.startswith("SDPA"))
            # where an incremental decode cuts its pieces (`IncrementalDecode.pieces`): the first decoder stage's
            # input in quarter frames, the second's in eighths, as (index among the upsampling parts, samples)
            stage = [next(k for k in range(len(self.parts)) if stage_of_part(k, config) == s) for s in (1, 2)]
            self.cuts = [(k - 2, max(1, self.parts[k].spf // d)) for k, d in zip(stage, (4, 8))]
        elif form == "gpu":
            (p0, b0), (p1, b1) = gpu_graph(ncnn_dir, config)
            self.in_axes = manifest_axes(Path(ncnn_dir) / "manifest.json")
            self.codes_net = Part(make_net(p0, b0, threads, "cpu"))  # Embed and MatMul: no Vulkan kernel
            self.net = make_net(p1, b1, threads, device)
        else:
            self.net = Net(ncnn_dir, "codec_decoder", threads, device)

    def decode_once(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, groups) -> wav (1920·T,): the exported graph's one call over all T frames (no chunking of the
        reference's kind). The CPU form computes the same samples part by part, the upsampling stages over
        chunks with the left context each needs (equal to the whole call to float rounding)."""
        c = self.config
        T = len(codes)
        if self.parts is not None:
            return run_parts(self.parts[2:], self.transformer_output(codes)).reshape(-1)
        if self.form == "gpu":
            x = run_codes(self.codes_net, codes, c, self.in_axes)
            return run(self.net, {"in0": x} | attention_inputs(c, T), ["out0"], name="codec (GPU form)")[0].reshape(-1)
        semantic, acoustic = pack_codes(codes, c["codebook_size"])
        mask = rope.causal_mask(T, window=c["sliding_window"])
        cos, sin = rope.tables(c["head_dim"], c["rope_theta"], 0, T)
        return self.net(semantic, acoustic, mask, cos, sin)[0].reshape(-1)

    def transformer_output(self, codes: np.ndarray) -> np.ndarray:
        """Parts 0 and 1 (codebooks, pre_conv, transformer) over all of `codes` (T, groups): what the upsampling
        parts (`parts[2:]`) are fed, (channels, T). The CPU form only."""
        return transformer_output(self.parts, codes, self.config, self.in_axes)

    def incremental(self) -> IncrementalDecode:
        """A decode fed a few frames at a time (`IncrementalDecode`; the CPU form only)."""
        if self.parts is None:
            raise ValueError("incremental decoding needs the codec's CPU form (form='cpu', device cpu)")
        return IncrementalDecode(self)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, groups) -> wav (1920·T,), chunked exactly as the reference's chunked_decode."""
        if len(codes) == 0:
            return np.zeros(0, np.float32)
        parts, start, T = [], 0, len(codes)
        while start < T:
            end = min(start + CHUNK_FRAMES, T)
            context = LEFT_CONTEXT_FRAMES if start - LEFT_CONTEXT_FRAMES > 0 else start
            wav = self.decode_once(codes[start - context : end])
            parts.append(wav[context * SAMPLES_PER_FRAME :])
            start = end
        return np.concatenate(parts)

    def decode_with_voice(self, codes: np.ndarray, voice_codes: np.ndarray | None = None) -> np.ndarray:
        """Decode; with the voice clip's codes (ICL), decode them in front and cut their share of
        the samples by frame ratio, as the reference does."""
        if voice_codes is None or len(voice_codes) == 0:
            return self.decode(codes)
        total = np.concatenate([voice_codes, codes])
        wav = self.decode(total)
        cut = int(len(voice_codes) / max(len(total), 1) * len(wav))
        return wav[cut:]


class IncrementalDecode:
    """`decode_once` of a growing code sequence, a few frames at a time: `push(codes)` returns the samples of
    those frames, equal (to float rounding) to what one `decode_once` over everything pushed so far gives there.

    Nothing is decoded twice. Part 0 (codebooks and pre_conv) is rerun on the new frames with its few frames of
    left context; the transformer runs only the new positions, with a KV cache (its `_kv` form, chapter 05's
    rewrite) and a mask that keeps the sliding window; the upsampling parts continue from their kept left
    context (`PartChain`). The caches grow with the positions pushed; `Codec.decode`'s reference chunks
    (300 frames) bound them in `stream.StreamDecoder`, which starts a new one per chunk. The transformer's net is
    the codec's (loaded once, `Codec.transformer_net`): a decode holds only its own state (its cache, the parts'
    left context and the last frames)."""

    def __init__(self, codec: Codec):
        self.codec, self.config = codec, codec.config
        self.net = codec.transformer_net
        layers = codec.transformer_layers
        self.cache, self.cache_outputs = KvCache(layers), layer_cache_outputs(layers)
        self.chain = PartChain(codec.parts[2:])
        self.codes = np.zeros((0, codec.groups), np.int64)

    def push(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, np.int64).reshape(-1, self.codec.groups)
        if len(codes) == 0:
            return np.zeros(0, np.float32)
        return self.chain.push(self._transformer(codes)).reshape(-1)

    def pieces(self, codes: np.ndarray) -> Iterator[tuple[np.ndarray, bool]]:
        """`push(codes)`'s samples in pieces as they are made, (piece, whether it is the last): an eighth of a frame
        first, an eighth again, then each piece as long as all before it (`Codec.cuts`). The parts before the decoder
        stages run whole: they read their weights once a call, whatever its length, and pass on few samples. The
        first stage takes a quarter frame a call (one sample), the first of them cut again into eighths at the second
        stage, from which on the work is per sample. Every piece must be taken before the next push."""
        codes = np.asarray(codes, np.int64).reshape(-1, self.codec.groups)
        for piece, last in self.chain.pieces(self._transformer(codes), self.codec.cuts):
            yield piece.reshape(-1), last

    def _transformer(self, codes: np.ndarray) -> np.ndarray:
        """Parts 0 and 1 on new frames: the codebooks with their left context, the transformer with its cache."""
        ctx = min(self.codec.parts[0].context, len(self.codes))
        window = np.concatenate([self.codes[len(self.codes) - ctx:], codes])
        x = run_codes(self.codec.parts[0], window, self.config, self.codec.in_axes)[..., ctx:]
        self.codes = window[len(window) - min(self.codec.parts[0].context, len(window)):]  # the next push's context
        inputs = {"in0": x} | attention_inputs(self.config, len(codes), self.cache.past) | self.cache.blobs
        out, *mats = run(self.net, inputs, ["out0", *self.cache_outputs], raw=self.cache_outputs,
                         name="codec transformer")
        self.cache.grow(self.cache_outputs, mats, len(codes))
        return out
