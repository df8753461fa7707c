"""The model's three embedding lookups: text, codec, and the code predictor's acoustic tables. Introduced in 07.

- text: the talker's text embedding and its `text_projection` MLP (`talker_text_embed`), tabulated after the
  projection: one row per text id (151,936), the talker's width, written once next to the exports (`text_table`);
- codec: the talker's codec table (codebook 0, the special codec ids and the built-in speakers' rows);
- acoustic: the code predictor's 15 tables, one per codebook 1..15, fused into one (row s·codebook + code).
The two codec tables are read into numpy once, through their own graphs (exact row copies), so a lookup in the
generation loop is an index, not a graph call; the graphs are not kept, so each weight is held once.

The projection works on each row alone, so its table is the graph's rows for every id, equal to float rounding (the
graph's own rows differ by about 5e-8 with the number of ids per call). Kept as a graph, it held its 1.27 GB of
weights in RAM at full size and ran the MLP over each prompt's text (4.3 ms a prompt on a 2-core Zen 3 VM); the table
costs vocab x hidden x 4 bytes on disk (622 MB at full size, written once in 39 s there) and is memory-mapped, read at
random: a process holds the pages of the rows it has read (two 4 kB pages a row at most). Linux maps a file's pages
in the units the page cache holds them, so the writer drops its pages from the cache (written, they stay cached in
2 MB folios there, and one row read maps 2 MB); reading the file whole (a copy, a backup) caches it in large folios
again, until they are evicted. Every device looks text up in this CPU table.
"""
from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np

from ..binding.net import Net
from ..errors import MissingArtifact
from .config import ModelConfig

TABLE_VERSION = 1                     # bump when the text table's form changes: the cached file is rewritten
TABLE_FILE = "talker_text_table.npy"  # under the ncnn directory; its key beside it, `talker_text_table.json`
TABLE_CHUNK = 4096                    # ids per graph call while the text table is written


def read_table(ncnn_dir, name: str, rows: int, threads: int = 2) -> np.ndarray:
    """Every row of an embedding graph, (rows, hidden) float32, computed once on the CPU."""
    return Net(ncnn_dir, name, threads, "cpu")(np.arange(rows, dtype=np.int32))[0]


def text_table(ncnn_dir, rows: int, threads: int = 2, log=None) -> np.ndarray:
    """The `talker_text_embed` graph's rows for ids 0..rows-1, (rows, hidden) float32, memory-mapped read-only from
    `TABLE_FILE` under `ncnn_dir`; computed on first use on the CPU (`TABLE_CHUNK` ids a call) and again when the
    graph's files change. The cache is keyed by `TABLE_VERSION`, `rows` and the size and mtime of the graph's
    .param/.bin; the table is written under a temporary name and renamed, the key last."""
    src = Path(ncnn_dir)
    param, weights = src / "talker_text_embed.param", src / "talker_text_embed.bin"
    for f in (param, weights):
        if not f.is_file():
            raise MissingArtifact(f"{f} not found; run notebooks/04_export_align.py to export the modules")
    path, meta = src / TABLE_FILE, (src / TABLE_FILE).with_suffix(".json")
    key = {"version": TABLE_VERSION, "rows": int(rows),
           **{f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in (param, weights)}}
    if meta.is_file() and path.is_file():
        try:
            if json.loads(meta.read_text()) == key:
                table = mapped_rows(path)
                if table.dtype == np.float32 and table.ndim == 2 and len(table) == rows:
                    return table
        except (ValueError, OSError):
            pass
    meta.unlink(missing_ok=True)
    if log:
        log(f"writing the talker's text table (once; {rows} ids through talker_text_embed, into {path})")
    net = Net(src, "talker_text_embed", threads, "cpu")
    first = net(np.arange(min(TABLE_CHUNK, rows), dtype=np.int32))[0]
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("wb") as f:  # the .npy header, then the rows chunk by chunk: one chunk in memory at a time
            np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                     "fortran_order": False, "shape": (rows, first.shape[1])})
            f.write(np.ascontiguousarray(first, np.float32))
            for start in range(len(first), rows, TABLE_CHUNK):
                f.write(np.ascontiguousarray(net(np.arange(start, min(start + TABLE_CHUNK, rows), dtype=np.int32))[0],
                                             np.float32))
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "posix_fadvise"):  # out of the page cache, where it sits in large folios (module docstring)
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    tmp_meta = meta.with_name(f"{meta.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(key, indent=1))
    os.replace(tmp_meta, meta)  # the key last: a half-written table is never taken as done
    return mapped_rows(path)


def mapped_rows(path) -> np.ndarray:
    """A .npy file memory-mapped read-only, the kernel told that it is read at random: a row read brings in its own
    pages (without the hint, on the Zen 3 VM, each fault read 8 MB around it and mapped 64 kB)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(f)
        if fortran_order:
            raise ValueError(f"{path}: a table in Fortran order")
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        offset = f.tell()
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)
    return np.ndarray(shape, dtype, buffer=mapping, offset=offset)


class Embeddings:
    def __init__(self, cfg: ModelConfig, threads: int = 2, log=None):
        """`log` hears about one-time work (writing the text table)."""
        self.codebook, self.groups = cfg.codebook, cfg.groups
        self.text_table = text_table(cfg.ncnn_dir, int(cfg.talker["text_vocab_size"]), threads, log)
        self.codec_table = read_table(cfg.ncnn_dir, "talker_codec_embed", int(cfg.talker["vocab_size"]), threads)
        self.acoustic_table = read_table(cfg.ncnn_dir, "predictor_embeds", (self.groups - 1) * self.codebook, threads)

    def text(self, ids) -> np.ndarray:
        """Text token ids -> (n, hidden), rows of the text table (a fresh array, not a view of the file)."""
        return self.text_table[np.asarray(ids, np.int64)]

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
