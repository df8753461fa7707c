"""A map that keeps its most recently used entries within a byte budget (and, if given, a count). Introduced in 17.

`scheduler.Prefixes` keeps the talker caches of prompt heads in one; the server's `refs.RefVoices` the voices of
clips sent with requests (chapter 18). The caller says what an entry costs (`put(key, value, size)`); the least
recently used entries (put, or found by `get`) leave first, and an entry larger than the whole budget is not kept.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class BoundedCache:
    def __init__(self, max_bytes: int, max_count: int | None = None):
        if max_bytes < 0 or (max_count is not None and max_count < 0):
            raise ValueError(f"a cache of {max_bytes} bytes and {max_count} entries")
        self.max_bytes, self.max_count = max_bytes, max_count
        self.nbytes = 0  # what the kept entries cost now
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def fits(self, size: int) -> bool:
        """Whether an entry of `size` bytes would be kept at all (alone, the budget empty)."""
        return size <= self.max_bytes and self.max_count != 0

    def get(self, key: Hashable):
        """The value kept under `key`, now the most recently used, or None."""
        kept = self._entries.get(key)
        if kept is None:
            return None
        self._entries.move_to_end(key)
        return kept[0]

    def discard(self, key: Hashable) -> None:
        if key in self._entries:
            self.nbytes -= self._entries.pop(key)[1]

    def put(self, key: Hashable, value, size: int) -> bool:
        """Keep `value` under `key` (replacing what was there) as the most recently used, the least recently used
        leaving until the rest fit; False, and nothing kept under `key`, where it does not fit even alone."""
        self.discard(key)
        if not self.fits(size):
            return False
        while self._entries and (self.nbytes + size > self.max_bytes
                                 or (self.max_count is not None and len(self._entries) >= self.max_count)):
            self.nbytes -= self._entries.popitem(last=False)[1][1]
        self._entries[key] = (value, size)
        self.nbytes += size
        return True
