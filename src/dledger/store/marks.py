"""Where the log's rare entries of one magic are (CONFIG_CHANGE, SESSION markers), kept so
that `indexes_with_magic` need not scan the whole index for them.

A member's start looks up every CONFIG_CHANGE entry of its log (core.changes.recover_configs)
and folds the SESSION markers of the committed log (core.producers): each a scan of the index
files, 32 bytes an entry, 3.2 GiB and tens of seconds for 100 million entries
(docs/performance.md, "Restart cost"). The store notes the indexes of those entries as it
appends them and keeps them in its checkpoint, through its durable entry (docs/format.md):
a cache of the index, complete for [log begin, `upto`], ignored when missing or past the
log's end, dropped (the index is scanned as before) when the entries are not rare.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterable

from dledger.store.base import positions_of

MAX_MARKS = 10_000  # indexes kept per magic at most; beyond, they are not rare: scan the index


class MagicMarks:
    """The indexes of the entries of `magic`, complete from the log begin through `upto`
    (None: not kept, the index is scanned). All calls under the store's lock."""

    def __init__(self, magic: int) -> None:
        self.magic = magic
        self.word = int.from_bytes(magic.to_bytes(4, "big", signed=True), sys.byteorder, signed=True)
        self.indexes: list[int] = []
        self.upto: int | None = -1

    def load(self, kept: tuple[int, tuple[int, ...]] | None, begin: int, end: int, trusted: int | None) -> None:
        """Take the checkpoint's marks when they lie within the log recovery kept and within
        its verified trusted record (`trusted`, None: none verified, the marks are not taken:
        they were written only through it, so more is a stale or foreign checkpoint); an empty
        log is complete without them; else nothing is known yet (the first scan learns them)."""
        self.indexes, self.upto = [], begin - 1
        if end < begin:
            self.upto = end
        elif kept is not None and trusted is not None and begin - 1 <= kept[0] <= min(end, trusted):
            self.upto = kept[0]
            self.indexes = [i for i in kept[1] if begin <= i <= kept[0]]

    def appended(self, first: int, last: int, magic: int) -> None:
        """Entries first..last, all of `magic`, were appended."""
        if self.upto == first - 1:
            if magic == self.magic:
                self._add(range(first, last + 1))
            if self.upto is not None:
                self.upto = last

    def appended_units(self, first: int, units: bytes | bytearray, count: int) -> None:
        """Entries first.. with these `count` index units were appended (a follower's push)."""
        if self.upto == first - 1:
            words = array("i")
            words.frombytes(units[: count * 32])
            self._add(first + k for k in positions_of(words[0::8], self.word, 0, count))
            if self.upto is not None:
                self.upto = first + count - 1

    def truncated(self, end: int) -> None:
        """The log now ends at `end`."""
        if self.upto is not None:
            self.upto = min(self.upto, end)
        self.indexes = [i for i in self.indexes if i <= end]

    def reset(self, end: int) -> None:
        """The log is empty, ending at `end`: complete (kept again if it was dropped)."""
        self.indexes, self.upto = [], end

    def state(self, begin: int, durable: int) -> dict[str, object] | None:
        """What the checkpoint keeps: only through the durable entry (a crash may cut the rest)."""
        if self.upto is None:
            return None
        upto = min(self.upto, durable)
        if upto < begin - 1:
            return None
        return {"upto": upto, "indexes": [i for i in self.indexes if begin <= i <= upto]}

    def find(self, first: int, last: int, begin: int, scan: Callable[[int, int], list[int]]) -> list[int]:
        """Indexes of `magic` in [first, last] (within the log): the kept ones, and a scan
        (`scan(a, b)`: the index files' answer for [a, b]) of the rest, from where the marks end
        when that at most doubles the scan, so the marks reach `last` afterwards."""
        if first > last:
            return []
        upto = self.upto
        if upto is None:
            return scan(first, last)
        known = [i for i in self.indexes if first <= i <= last]
        start = max(begin, upto + 1)
        if start > last:
            return known
        if first - start > last - first + 1:
            return scan(first, last)  # far past where the marks end: not worth learning here
        found = scan(start, last)
        if start > upto + 1:
            self.indexes = []  # the log begin moved past them: kept again from it
        self.upto = last
        self._add(found)
        return known + [i for i in found if i >= first]

    def _add(self, indexes: Iterable[int]) -> None:
        self.indexes.extend(indexes)
        if len(self.indexes) > MAX_MARKS:
            self.indexes, self.upto = [], None
