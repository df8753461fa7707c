"""The codec decoder over its exported graph: codes (T, 16) -> 24 kHz waveform. Introduced in 06.

The graph (chapter 04) takes the 16 codebooks packed for one fused embedding table
(`pack_codes`), a sliding-window causal mask and rope tables. The reference decodes long
outputs in chunks (`chunked_decode(chunk_size=300, left_context_size=25)`): each chunk is
decoded with up to 25 frames of left context whose samples are then dropped. The first
chunk equals a one-shot decode, later ones do not (25 frames is far less than the
transformer's reach), so matching the reference means chunking exactly as it does.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from . import rope, speed
from .audio import SAMPLES_PER_FRAME
from .net import Net, parse_device

CHUNK_FRAMES, LEFT_CONTEXT_FRAMES = 300, 25  # the reference's chunked_decode defaults


def pack_codes(codes: np.ndarray, codebook_size: int) -> tuple[np.ndarray, np.ndarray]:
    """codes (T, 16) -> semantic (1, T) int32 and acoustic (15·T,) int32.

    Codebooks 1..15 share one fused table in the graph, so codebook g+1 is offset by
    g·codebook_size, and the rows are flattened group-major (index g·T + t)."""
    codes = np.asarray(codes, np.int64)
    semantic = codes[:, 0][None].astype(np.int32)
    offsets = np.arange(codes.shape[1] - 1)[:, None] * codebook_size
    acoustic = (codes[:, 1:].T + offsets).reshape(-1).astype(np.int32)
    return semantic, acoustic


FAST_DIR = "fast"  # under the ncnn directory: the CPU form of the codec graph, written on first load


def fast_graph(ncnn_dir, tiles: dict[int, int] | None = None) -> Path:
    """The directory holding `speed.codec_fast_bin` of the exported codec decoder (with a copy of the manifest),
    written on first use and rewritten when the exported files or the rewrite change. `tiles`: input channels ->
    time tiles (`speed.codec_time_tiles` of the decoder config; none: no convolution is cut along time).

    The cache is keyed by the size and mtime of the exported .param/.bin, `speed.CODEC_FAST_BIN_VERSION` and the
    tiles, recorded in `fast/codec_decoder.json`; files are written under temporary names and renamed, the key last.
    (Loading the rewritten bytes from memory is not an option: the binding's `load_model_mem` keeps pointers
    into a buffer Python may free.)"""
    src = Path(ncnn_dir)
    param, weights, manifest = src / "codec_decoder.param", src / "codec_decoder.bin", src / "manifest.json"
    out = src / FAST_DIR
    tiles = {int(c): int(n) for c, n in (tiles or {}).items()}
    key = {"version": speed.CODEC_FAST_BIN_VERSION, "tiles": {str(c): n for c, n in sorted(tiles.items())},
           **{f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in (param, weights, manifest)}}
    meta = out / "codec_decoder.json"
    done = [out / "codec_decoder.param", out / "codec_decoder.bin", out / "manifest.json"]
    if meta.is_file() and all(f.is_file() for f in done):
        try:
            if json.loads(meta.read_text()) == key:
                return out
        except ValueError:
            pass
    out.mkdir(exist_ok=True)
    meta.unlink(missing_ok=True)
    text, data = speed.codec_fast_bin(param.read_text(), weights.read_bytes(),
                                      tiles_of=(lambda c: tiles.get(c, 0)) if tiles else None)
    tmps = [f.with_name(f"{f.name}.tmp{os.getpid()}") for f in done + [meta]]
    tmps[0].write_text(text)
    tmps[1].write_bytes(data)
    shutil.copyfile(manifest, tmps[2])
    tmps[3].write_text(json.dumps(key))
    for t, f in zip(tmps, done + [meta]):  # the key last: a half-written cache is never taken as done
        os.replace(t, f)
    return out


class Codec:
    """`decode(codes)` as the reference does it; `decode_once` for one graph call."""

    def __init__(self, ncnn_dir, config: dict, threads: int = 2, device: str = "cpu", fast: bool | None = None):
        self.config = config  # speech_tokenizer/config.json's decoder_config
        # On the CPU the graph is loaded in its faster equivalent form (`speed.codec_fast_bin`: 1-D convolutions
        # as 2-D ones with h = 1, which reach ncnn's packed kernels, polyphase upsampling, the long convolutions
        # cut along time, other wide ones along input channels), cached next to the exported files (`fast_graph`).
        fast = parse_device(device) is None if fast is None else fast
        graph = fast_graph(ncnn_dir, speed.codec_time_tiles(config)) if fast else ncnn_dir
        self.net = Net(graph, "codec_decoder", threads, device)

    def decode_once(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> wav (1920·T,) in one graph call (no chunking)."""
        c = self.config
        T = len(codes)
        semantic, acoustic = pack_codes(codes, c["codebook_size"])
        mask = rope.causal_mask(T, window=c["sliding_window"])
        cos, sin = rope.tables(c["head_dim"], c["rope_theta"], 0, T)
        return self.net(semantic, acoustic, mask, cos, sin)[0].reshape(-1)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> wav (1920·T,), chunked exactly as the reference's chunked_decode."""
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
