"""`pipeline.embeddings`: the talker's text table (the `talker_text_embed` graph's rows, written once next to the
exports) against the graph, its cache, and `Embeddings.text`'s rows."""
import json
import mmap
import os
import re
import shutil

import numpy as np
import pytest

from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.pipeline.config import ModelConfig
from qtts_lib.runtime.pipeline.embeddings import TABLE_CHUNK, TABLE_FILE, Embeddings, text_table

TOL = 1e-6  # of a batch's largest |value|: the graph's rows differ with the number of ids per call by float rounding


@pytest.fixture(scope="module")
def cfg(exported):
    return ModelConfig.load(exported)


def _ids(rows: int, n: int, seed: int) -> np.ndarray:
    """`n` random ids, the first and last of the vocabulary and those around a chunk's edge among them."""
    ids = np.random.default_rng(seed).integers(0, rows, n)
    return np.concatenate([[0, TABLE_CHUNK - 1, TABLE_CHUNK, rows - 1], ids]).astype(np.int32)


def test_text_table_rows_are_the_graphs(cfg):
    rows = int(cfg.talker["text_vocab_size"])
    table = text_table(cfg.ncnn_dir, rows)
    assert isinstance(table.base, mmap.mmap) and not table.flags.writeable
    assert table.shape == (rows, int(cfg.talker["hidden_size"])) and table.dtype == np.float32
    net = Net(cfg.ncnn_dir, "talker_text_embed", 2, "cpu")
    for seed, n in ((0, 1), (1, 13), (2, 300)):  # batches of several sizes, as prompts call it
        ids = _ids(rows, n, seed)
        want = net(ids)[0]
        tol = TOL * np.abs(want).max()
        assert np.abs(want[1:] - want[:-1]).max() > 1000 * tol  # rows that tell ids apart
        np.testing.assert_allclose(table[ids], want, rtol=0, atol=tol)


def _mapped_kb(path) -> int:
    """kB of `path`'s mapping resident in this process (Linux's /proc/self/smaps)."""
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", open("/proc/self/smaps").read()):
        if block.split("\n", 1)[0].endswith(str(path)):
            return int(re.search(r"^Rss:\s+(\d+) kB", block, re.M).group(1))
    raise AssertionError(f"{path} is not mapped")


def test_text_table_is_rebuilt_when_the_graph_changes(cfg, tmp_path):
    src = tmp_path / "ncnn"
    src.mkdir()
    for f in ("talker_text_embed.param", "talker_text_embed.bin", "manifest.json"):
        shutil.copy2(cfg.ncnn_dir / f, src / f)
    rows = int(cfg.talker["text_vocab_size"])
    heard = []
    table = text_table(src, rows, log=heard.append)
    assert len(heard) == 1 and (src / TABLE_FILE).is_file()
    key_file = (src / TABLE_FILE).with_suffix(".json")
    key = json.loads(key_file.read_text())
    bin_ = src / "talker_text_embed.bin"
    assert key["talker_text_embed.bin"] == [bin_.stat().st_size, bin_.stat().st_mtime_ns]
    assert not [p.name for p in src.iterdir() if ".tmp" in p.name]
    ids = _ids(rows, 50, 3)
    want = np.array(table[ids])
    if os.path.exists("/proc/self/smaps"):  # only the rows read are resident: two 4 kB pages a row at most
        assert _mapped_kb(src / TABLE_FILE) <= len(ids) * 8 < table.nbytes // 1024 // 10
    del table
    # the cached file is what a second call returns: zeroed, it reads zeros, and nothing is written
    np.lib.format.open_memmap(src / TABLE_FILE, mode="r+")[:] = 0
    assert not text_table(src, rows, log=heard.append)[ids].any() and len(heard) == 1
    # the graph's .bin touched (same bytes, a new mtime): the key differs, the table is written again
    st = bin_.stat()
    os.utime(bin_, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    rebuilt = text_table(src, rows, log=heard.append)
    assert len(heard) == 2
    np.testing.assert_array_equal(rebuilt[ids], want)  # the same graph, the same chunks: the same rows
    assert json.loads(key_file.read_text())["talker_text_embed.bin"][1] == st.st_mtime_ns + 1_000_000_000
    # a different row count (another config) is another key too
    assert text_table(src, TABLE_CHUNK + 5, log=heard.append).shape[0] == TABLE_CHUNK + 5 and len(heard) == 3


def test_text_gives_fresh_writable_rows(cfg):
    emb = Embeddings(cfg)
    assert not hasattr(emb, "text_net")
    ids = [cfg.config["tts_pad_token_id"], 9707, 11, 1879]
    rows = emb.text(ids)
    assert type(rows) is np.ndarray and rows.flags.writeable
    assert not np.shares_memory(rows, emb.text_table)
    want = rows.copy()
    rows += 1.0
    np.testing.assert_array_equal(emb.text(ids), want)  # the table is untouched
    np.testing.assert_array_equal(emb.text(ids[1:2]), want[1:2])
    assert emb.text([]).shape == (0, want.shape[1])
