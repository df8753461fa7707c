"""The model's three embedding lookups: text, codec, and the code predictor's acoustic tables. Introduced in 06.

- text: the talker's text embedding and its `text_projection` MLP, a graph (`talker_text_embed`): the vocabulary
  is 151,936 rows, too many to tabulate after the projection;
- codec: the talker's codec table (codebook 0, the special codec ids and the built-in speakers' rows);
- acoustic: the code predictor's 15 tables, one per codebook 1..15, fused into one (row s·codebook + code).
The two codec tables are read into numpy once, through their own graphs (exact row copies), so a lookup in the
generation loop is an index, not a graph call; the graphs are not kept, so each weight is held once.
"""
from __future__ import annotations

import numpy as np

from ..binding.net import Net
from .config import ModelConfig

SHORT, KEPT = 8, 256  # `Embeddings.text`: lists of at most SHORT ids are kept, KEPT of them at most


def read_table(ncnn_dir, name: str, rows: int, threads: int = 2) -> np.ndarray:
    """Every row of an embedding graph, (rows, hidden) float32, computed once on the CPU."""
    return Net(ncnn_dir, name, threads, "cpu")(np.arange(rows, dtype=np.int32))[0]


class Embeddings:
    def __init__(self, cfg: ModelConfig, threads: int = 2, device: str = "cpu"):
        self.codebook, self.groups = cfg.codebook, cfg.groups
        self.text_net = Net(cfg.ncnn_dir, "talker_text_embed", threads, device)
        self._kept: dict[bytes, np.ndarray] = {}
        self.codec_table = read_table(cfg.ncnn_dir, "talker_codec_embed", int(cfg.talker["vocab_size"]), threads)
        self.acoustic_table = read_table(cfg.ncnn_dir, "predictor_embeds", (self.groups - 1) * self.codebook, threads)

    def text(self, ids) -> np.ndarray:
        """Text token ids -> (n, hidden). A short list of ids (every prompt's special tokens and role prefix) is
        computed once and kept (`KEPT` of them): each call runs the projection MLP, whose weights it reads whole."""
        ids = np.asarray(ids, np.int32)
        if len(ids) > SHORT:
            return self.text_net(ids)[0]
        key = ids.tobytes()
        rows = self._kept.get(key)
        if rows is None:
            rows = self.text_net(ids)[0]
            if len(self._kept) >= KEPT:
                del self._kept[next(iter(self._kept))]
            self._kept[key] = rows
        return rows.copy()

    def codec(self, ids) -> np.ndarray:
        """Codec ids (codebook 0, or a special id, or a speaker's) -> (n, hidden)."""
        return self.codec_table[np.asarray(ids, np.int64)]

    def acoustic(self, s: int, code) -> np.ndarray:
        """Codebook s + 1's row for `code` (s = 0..14) -> (hidden,); for a list of codes, one row each (n, hidden)."""
        return self.acoustic_table[s * self.codebook + np.asarray(code, np.int64)]

    def frame(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, groups) -> (T, hidden): the codec table at codebook 0 plus the acoustic tables at 1..15 (what
        the talker is fed for a frame, before the text)."""
        codes = np.asarray(codes, np.int64)
        ids = codes[:, 1:] + np.arange(self.groups - 1) * self.codebook
        return self.codec(codes[:, 0]) + self.acoustic_table[ids].sum(1)
