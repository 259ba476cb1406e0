"""A broker's commit log: dledger's own store seen as AutoSwitch HA sees it, by byte offset.

HA offsets are record positions (`pos`, docs/format.md): a replica's max offset is where its next
record goes, and a record's term is the master epoch it was written in. Records never span
data files; a file closed by a blank leaves a gap between the end of its last record and
the next file's start, so an offset names a record boundary when it is a record's start,
the log's end, or falls in such a gap (the next record then starts at the next file).
Everything the HA logic asks goes through this class, so the simulator can give it a
memory store and the broker a file store.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.codes import ResponseCode
from dledger.entry import DLedgerEntry
from dledger.store.base import AppendedBatch, LedgerStore, StoreError


class BrokerLog:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    @property
    def max_offset(self) -> int:
        return self.store.pos_of_next()

    @property
    def durable_offset(self) -> int:
        """The end of the records fsynced so far (a memory store: all of them)."""
        s = self.store
        return self.max_offset if s.durable_index >= s.end_index else self.end_of(s.durable_index)

    @property
    def min_offset(self) -> int:
        return self.store.first_pos()

    @property
    def end_index(self) -> int:
        return self.store.end_index

    def end_of(self, index: int) -> int:
        """The offset just past entry `index` (the min offset before the first entry)."""
        if index < self.store.begin_index:
            return self.min_offset
        pos, size, _ = self.store.slot(index)
        return pos + size

    def index_at(self, offset: int) -> int:
        """The first entry at or after `offset`, which must be a record boundary
        (end_index + 1 at the log's end); StoreError INDEX_LESS_THAN_LOCAL_BEGIN below the min
        offset, INDEX_OUT_OF_RANGE otherwise."""
        s = self.store
        if offset < self.min_offset:  # (retention deleted it: as DLedger's reads below the begin)
            raise StoreError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                             f"offset {offset} is below the log's min offset {self.min_offset} (deleted by "
                             "retention)")
        if offset > self.max_offset:
            raise StoreError(ResponseCode.INDEX_OUT_OF_RANGE,
                             f"offset {offset} outside the log [{self.min_offset}, {self.max_offset}]")
        lo, hi = s.begin_index, s.end_index + 1  # first entry whose pos >= offset
        while lo < hi:
            mid = (lo + hi) // 2
            if s.slot(mid)[0] >= offset:
                hi = mid
            else:
                lo = mid + 1
        if self.end_of(lo - 1) > offset:
            raise StoreError(ResponseCode.INDEX_OUT_OF_RANGE, f"offset {offset} is inside entry {lo - 1}")
        return lo

    def retain_from(self, offset: int) -> None:
        """Retention may delete the data files whose records all end at or before `offset`
        (a record boundary or not: one that straddles it is kept)."""
        self.store.set_retention_floor(self.last_index_within(offset) + 1, f"the replicas need offset {offset}")

    def append(self, bodies: Sequence[bytes], epoch: int) -> AppendedBatch:
        return self.store.append_as_leader(bodies, epoch)

    def read_records(self, offset: int, max_bytes: int, limit: int) -> tuple[int, bytes]:
        """(first record's offset, whole records) from `offset` on, none ending past `limit`
        (an epoch's end: no frame spans two epochs); empty bytes when none fits."""
        index = self.index_at(offset)
        if index > self.store.end_index:
            return offset, b""
        pos, size, _ = self.store.slot(index)
        if pos + size > limit:
            return pos, b""
        raw = self.store.read_raw(index, min(max_bytes, limit - pos))
        data = bytes(raw.data)
        raw.data.release()
        if pos + len(data) > limit:  # read_raw takes at least one record: cut at the limit
            n, end = raw.first_index, pos
            while n < raw.first_index + raw.count and self.end_of(n) <= limit:
                end = self.end_of(n)
                n += 1
            data = data[: end - pos]
        return pos, data

    def append_records(self, data: bytes) -> int:
        """A master's records, verbatim (index, position and chain CRC are checked); the new
        max offset."""
        self.store.append_as_follower(data)
        return self.max_offset

    def truncate_to(self, offset: int) -> None:
        """Cut the log at `offset` (a record boundary); the store zeroes and fsyncs the cut
        records before returning, so no recovery brings them back (#10666)."""
        index = self.index_at(offset)
        if index <= self.store.end_index:
            self.store.truncate(index)

    def last_index_within(self, offset: int) -> int:
        """The last entry ending at or before `offset` (begin_index - 1 when none does)."""
        lo, hi = self.store.begin_index - 1, self.store.end_index
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.end_of(mid) <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def entries(self, from_index: int, max_entries: int, up_to_offset: int) -> list[DLedgerEntry]:
        """Entries from `from_index` that end at or before `up_to_offset` (the confirm offset)."""
        s = self.store
        if from_index > s.end_index or max_entries <= 0:
            return []
        last = min(s.end_index, from_index + max_entries - 1)
        if self.end_of(last) > up_to_offset:
            last = self.last_index_within(up_to_offset)
        if last < from_index:
            return []
        return s.read(from_index, last - from_index + 1)
