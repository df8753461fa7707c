"""The kept prompt heads (`scheduler.Prefixes`) are bounded by memory: small caches of plain Mats, no model."""
import ncnn
import numpy as np
import pytest

from qtts_lib.runtime.pipeline.scheduler import PREFIX_BUDGET_MB, Prefixes, cache_bytes

MB = 2**20


class Cache:
    """What `Prefixes` needs of a `KvCache`: its positions, its blobs (Mats) and a copy."""

    def __init__(self, positions: int, nbytes: int):
        self.past = positions
        self.blobs = {"cache_k_in0": ncnn.Mat(nbytes // 4)}  # fp32: memory of its own
        self.copies = 0

    def copy(self):
        self.copies += 1
        out = Cache(self.past, 4)
        out.blobs = {n: m.clone() for n, m in self.blobs.items()}
        return out


def head(i: int, positions: int = 9) -> np.ndarray:
    return np.full((positions, 4), i, np.float32)


def kept(prefixes: Prefixes, heads: list[int]) -> list[int]:
    return [i for i in heads if prefixes.get(head(i)) is not None]


def test_a_cache_counts_its_mats_memory():
    assert cache_bytes(Cache(9, MB)) == MB
    assert PREFIX_BUDGET_MB * MB == Prefixes().budget


def test_many_small_heads_fit_the_budget():
    prefixes = Prefixes(budget_mb=1)
    for i in range(20):
        prefixes.put(head(i), Cache(9, 16 * 1024))
    assert len(prefixes) == 20 and prefixes.nbytes == 20 * 16 * 1024 <= prefixes.budget
    assert kept(prefixes, list(range(20))) == list(range(20))


def test_the_least_recently_used_go_first_and_the_bytes_stay_under_the_budget():
    prefixes = Prefixes(budget_mb=1)
    for i in range(3):
        prefixes.put(head(i), Cache(9, 400 * 1024))
        assert prefixes.nbytes <= prefixes.budget
    assert len(prefixes) == 2 and kept(prefixes, [0, 1, 2]) == [1, 2]  # 0, the oldest, made room for 2


def test_a_hit_makes_a_head_the_most_recent():
    prefixes = Prefixes(budget_mb=1)
    prefixes.put(head(0), Cache(9, 400 * 1024))
    prefixes.put(head(1), Cache(9, 400 * 1024))
    assert prefixes.get(head(0)) is not None        # 0 is now used more recently than 1
    prefixes.put(head(2), Cache(9, 400 * 1024))
    assert kept(prefixes, [0, 1, 2]) == [0, 2] and prefixes.nbytes == 800 * 1024


def test_a_head_larger_than_the_budget_is_not_kept_nor_copied():
    prefixes = Prefixes(budget_mb=1)
    prefixes.put(head(0), Cache(9, 400 * 1024))
    big = Cache(9, 2 * MB)
    prefixes.put(head(1), big)
    assert big.copies == 0 and kept(prefixes, [0, 1]) == [0] and prefixes.nbytes == 400 * 1024


def test_putting_a_head_again_replaces_it():
    prefixes = Prefixes(budget_mb=1)
    prefixes.put(head(0), Cache(9, 400 * 1024))
    prefixes.put(head(0), Cache(9, 500 * 1024))
    assert len(prefixes) == 1 and prefixes.nbytes == 500 * 1024


def test_a_cache_must_hold_the_head_it_is_put_for():
    with pytest.raises(ValueError, match="positions"):
        Prefixes().put(head(0, positions=9), Cache(8, 1024))


def test_bounded_cache_keeps_the_most_recently_used_within_bytes_and_count():
    from qtts_lib.runtime.pipeline.bounded import BoundedCache

    cache = BoundedCache(max_bytes=100, max_count=3)
    for key in "abc":
        assert cache.put(key, key.upper(), 30)
    assert cache.get("a") == "A"            # a is now the most recently used
    assert cache.put("d", "D", 30)          # a fourth: b, the least recently used, leaves
    assert [k for k in "abcd" if k in cache] == ["a", "c", "d"] and cache.nbytes == 90
    assert cache.put("e", "E", 60)          # bytes: c, then a, leave until 60 fits beside d
    assert [k for k in "acde" if k in cache] == ["d", "e"] and cache.nbytes == 90
    assert not cache.put("d", "D2", 101)    # larger than the whole budget: refused, the old d gone too
    assert "d" not in cache and cache.get("d") is None and cache.nbytes == 60 and len(cache) == 1
