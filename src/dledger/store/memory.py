"""MemoryLedgerStore: the log in one bytearray, for tests, simulation and `--store memory`.

It keeps the exact record format of the file store (without file boundaries),
so replication and CRC checks behave the same; nothing survives the process.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

from dledger.codes import ResponseCode
from dledger.entry import MAGIC_NORMAL, CorruptRecord, DLedgerEntry, encode_run, scan
from dledger.store.base import (
    AppendedBatch,
    CorruptEntryError,
    LedgerStore,
    RawRange,
    StoreError,
    TermVote,
    positions_of,
    push_error,
)


class MemoryLedgerStore(LedgerStore):
    def __init__(self, max_body_bytes: int = 4 << 20) -> None:
        super().__init__(max_body_bytes)
        self._buf = bytearray()
        self._base_pos = 0  # logical position of _buf[0]
        self._offsets: array[int] = array("q")  # offset in _buf of entry begin_index + k
        self._terms: array[int] = array("q")
        self._magics: array[int] = array("b")  # as the file store's index units keep it
        self._term_vote = TermVote(0, None)

    def pos_of_next(self) -> int:
        return self._base_pos + len(self._buf)

    def first_pos(self) -> int:
        return self._base_pos

    def append_as_leader(
        self, bodies: Sequence[bytes], term: int, magic: int = MAGIC_NORMAL
    ) -> AppendedBatch:
        with self._lock:
            self.check_bodies(bodies, term)
            first = self.end_index + 1
            records, _, positions, chain = encode_run(bodies, 0, len(bodies), first, term,
                                                     self._base_pos + len(self._buf), self.end_chain_crc, magic)
            self._buf += records
            base = self._base_pos
            self._offsets.extend(p - base for p in positions)
            self._terms.extend([term] * len(bodies))
            self._magics.extend([magic] * len(bodies))
            self.end_index += len(bodies)
            self.end_term = term
            self.end_chain_crc = chain
            self.durable_index = self.end_index
            return AppendedBatch(first, term, positions)

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> int:
        with self._lock:
            first = self._first_record_index(data)
            units = bytearray()
            try:
                res = scan(
                    data, 0, len(data), first, self.pos_of_next(), self.end_chain_crc,
                    self.end_term, units=units, strict=True,
                )
            except CorruptRecord as e:
                # a bad push is the sender's fault, not a local DISK_ERROR: same codes as
                # the file store
                raise push_error("corrupt: " + e.reason, e.offset, e.index) from e
            if res.consumed != len(data):
                raise StoreError(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"push has {len(data) - res.consumed} trailing bytes after whole records",
                )
            off = len(self._buf)
            self._buf += data
            for k in range(res.count):
                # unit layout: magic(4) pos(8) size(4) index(8) term(8)
                u = units[k * 32 : k * 32 + 32]
                self._offsets.append(int.from_bytes(u[4:12], "big") - self._base_pos)
                self._terms.append(int.from_bytes(u[24:32], "big", signed=True))
                self._magics.append(int.from_bytes(u[0:4], "big", signed=True))
            assert self._offsets[-res.count] == off
            self.end_index += res.count
            self.end_term = res.last_term
            self.end_chain_crc = res.last_chain
            self.durable_index = self.end_index
            return self.end_index

    def truncate(self, from_index: int) -> None:
        with self._lock:
            self._check_truncate(from_index)
            self._drop_from(from_index)

    def _drop_from(self, from_index: int) -> None:
        """Remove entries from `from_index` on, unchecked (the simulator's power loss uses it)."""
        with self._lock:
            if from_index > self.end_index:
                return
            k = from_index - self.begin_index
            del self._buf[self._offsets[k] :]
            del self._offsets[k:]
            del self._terms[k:]
            del self._magics[k:]
            self.end_index = from_index - 1
            if k == 0:
                self.end_term, self.end_chain_crc = self.begin_term, self.begin_chain_crc
            else:
                self.end_term = self._terms[k - 1]
                self.end_chain_crc = self.chain_at(from_index - 1)  # the header's: a rotten body is repaired apart
            self.durable_index = min(self.durable_index, self.end_index)

    def reset(self, begin_index: int, begin_term: int, begin_chain_crc: int, begin_pos: int) -> None:
        with self._lock:
            self._check_reset(begin_index)
            self._buf = bytearray()
            self._base_pos = begin_pos
            self._offsets = array("q")
            self._terms = array("q")
            self._magics = array("b")
            self.begin_index = begin_index
            self.begin_term = self.end_term = begin_term
            self.begin_chain_crc = self.end_chain_crc = begin_chain_crc
            self.end_index = begin_index - 1
            self.committed_index = max(self.committed_index, begin_index - 1)
            self.durable_index = self.end_index

    _compact_to = -1  # a snapshot covers the log before it (set_compaction_point)
    _floor_index: int | None = None  # the retention floor

    def set_retention_floor(self, index: int | None, holder: str = "") -> None:
        with self._lock:
            self._floor_index = index
            self._compact()  # the floor may have held compaction back until now

    def _drop_covered(self, floor: int) -> None:
        self._compact_to = max(self._compact_to, floor)
        self._compact()

    def _compact(self) -> None:
        """Drop what a snapshot covers, as far as `_compact_limit` allows."""
        floor = min(self._compact_to, self._compact_limit())
        if floor > self.begin_index:
            self.drop_prefix(floor)

    def _compact_limit(self) -> int:
        """Never past the commit or durable index, the retention floor, nor the last entry."""
        floor = min(self.committed_index + 1, self.durable_index + 1, self.end_index)
        return floor if self._floor_index is None else min(floor, self._floor_index)

    def drop_prefix(self, begin_index: int) -> None:
        """Delete the entries before `begin_index` (retention); the log then begins there."""
        with self._lock:
            if not self.begin_index < begin_index <= self.end_index:
                return
            prev_term, prev_chain = self.term_at(begin_index - 1), self.chain_at(begin_index - 1)
            k = begin_index - self.begin_index
            cut = self._offsets[k]
            del self._buf[:cut]
            self._base_pos += cut
            self._offsets = array("q", (o - cut for o in self._offsets[k:]))
            del self._terms[:k]
            del self._magics[:k]
            self.begin_index, self.begin_term, self.begin_chain_crc = begin_index, prev_term, prev_chain

    def tail_bytes(self, from_index: int) -> int | None:
        with self._lock:
            self._check_readable(from_index)
            return len(self._buf) - self._offsets[from_index - self.begin_index]

    def read_raw(self, from_index: int, max_bytes: int) -> RawRange:
        with self._lock:
            self._check_readable(from_index)
            k = from_index - self.begin_index
            start = self._offsets[k]
            limit = start + max_bytes
            # records k..m-1 end at offsets[m] (or the buffer end): take the largest m within limit
            m = len(self._offsets) if len(self._buf) <= limit else bisect.bisect_right(self._offsets, limit) - 1
            m = max(m, k + 1)
            end = self._offsets[m] if m < len(self._offsets) else len(self._buf)
            # a copy: a view would pin the bytearray and forbid appends
            return RawRange(memoryview(bytes(self._buf[start:end])), from_index, m - k)

    def indexes_with_magic(self, first: int, last: int, magic: int) -> list[int]:
        with self._lock:
            b = self.begin_index
            lo, hi = max(first, b) - b, min(last, self.end_index) - b + 1
            return [b + k for k in positions_of(self._magics, magic, lo, hi)]

    def _record_slot(self, index: int) -> tuple[int, int, int, int | None]:
        k = index - self.begin_index
        start = self._offsets[k]
        end = self._offsets[k + 1] if k + 1 < len(self._offsets) else len(self._buf)
        return self._base_pos + start, end - start, self._terms[k], self._magics[k]

    def get(self, index: int) -> DLedgerEntry:
        with self._lock:
            entry = super().get(index)
            pos = self._base_pos + self._offsets[index - self.begin_index]
            if entry.pos != pos or entry.magic != self._magics[index - self.begin_index]:
                raise CorruptEntryError(index, f"record of entry {index} does not match the index (pos {entry.pos}, "
                                               f"magic {entry.magic}; the index {pos}, "
                                               f"{self._magics[index - self.begin_index]})")
            return entry

    def _write_record(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        off = pos - self._base_pos
        self._buf[off : off + len(data)] = data

    def term_at(self, index: int) -> int:
        if index == self.begin_index - 1:
            return self.begin_term
        self._check_readable(index)
        return self._terms[index - self.begin_index]

    def save_term(self, term: int, voted_for: str | None) -> None:
        self._term_vote = TermVote(term, voted_for)

    def load_term(self) -> TermVote:
        return self._term_vote

