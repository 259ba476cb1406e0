"""SimDiskStore: a memory store whose writes are durable only once "fsynced", with faults.

The simulator decides when a flush completes (after a simulated fsync delay). As a
real fsync, a flush covers what was written when it *started*: entries appended while
it runs wait for the next one, and a truncate during it lowers what it covers. A crash
(power loss) drops every entry past the last flush, as the page cache is lost.
currterm is written through at once, as the file store does with fsync.

Faults the schedules inject: a slow disk (fsyncs slower than every timeout), a write
error on the next append, an fsync error (the store fails for good: DISK_ERROR until
the disk is repaired), a disk out of space (appends and currterm writes fail with
DISK_FULL), a disk above the force-clean ratio (`soft_full`: client appends refused, as
FileLedgerStore's retention decides), and disk pressure, under which retention deletes
the log prefix below the commit index and the retention floor, as
FileLedgerStore.run_retention does with whole files; when the floor keeps it from
deleting what the commit index allows, the disk counts as soft-full too (what the file
store concludes when usage stays above the force ratio). Bit rot: `corrupt(index)` flips
one byte of a stored record (in its body, or in its body CRC when the body is empty), as a
damaged sector would; the members must find it, keep it out of every answer and repair it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dledger.codes import ResponseCode
from dledger.entry import HEADER, HEADER_SIZE, MAGIC_NORMAL
from dledger.store.base import AppendedBatch, StoreError
from dledger.store.memory import MemoryLedgerStore

RETENTION_CHUNK = 4  # entries retention deletes at least at once (the file store deletes whole files)


class SimDiskStore(MemoryLedgerStore):
    def __init__(self) -> None:
        super().__init__()
        self.synced_index = -1  # what the disk really holds (the log up to here survives power loss)
        self.flush_requested = False  # a flush is wanted once the running one completes
        self.flushing = False
        self._flush_target = -1  # end index when the running flush started
        self._trunc_floor = 1 << 62  # lowest end a truncate set while it runs
        self.generation = 0  # bumped by a crash: a flush in flight then never completes
        self.on_request: Callable[[], None] | None = None  # the simulator schedules the fsync
        # faults
        self.full = False  # out of space: every write fails
        self.soft_full = False  # above the force-clean ratio: client appends refused
        self.held_full = False  # retention held back by the floor under pressure: the same
        self.failed: str | None = None
        self.write_error_once = False
        self.fsync_error_once = False
        self.pressure = False
        self.retention_floor: int | None = None
        self.holder = ""

    # --- faults as the file store reports them --------------------------------------------

    def write_error(self) -> StoreError | None:
        if self.failed is not None:
            return StoreError(ResponseCode.DISK_ERROR, f"store failed: {self.failed}")
        if self.full:
            return StoreError(ResponseCode.DISK_FULL, "disk full")
        return None

    def pressure_error(self) -> StoreError | None:
        if self.soft_full or self.held_full:
            return StoreError(ResponseCode.DISK_FULL, f"disk full, retention can free nothing more "
                                                      f"(held back: {self.holder or 'no'}): refusing client appends")
        return None

    def _check_write(self) -> None:
        err = self.write_error()
        if err is not None:
            raise err
        if self.write_error_once:
            self.write_error_once = False
            raise StoreError(ResponseCode.DISK_ERROR, "append: Input/output error")

    def corrupt(self, index: int, field: str = "body") -> None:
        """Flip a byte of the record of `index` (bit rot). `field` "body": its last body byte,
        or a byte of its body CRC field when the body is empty; "magic": one bit of the magic
        (NORMAL <-> CONFIG_CHANGE, a valid magic that only the index reveals); "channel": the
        reserved channel field. Nothing else changes."""
        k = index - self.begin_index
        off = self._offsets[k]
        end = self._offsets[k + 1] if k + 1 < len(self._offsets) else len(self._buf)
        if field == "magic":
            self._buf[off + 3] ^= 0x02  # 1 <-> 3, 2 -> 0
        elif field == "channel":
            self._buf[off + 35] ^= 0x01
        else:
            at = end - 1 if end - off > HEADER_SIZE else off + 40  # body_crc field: bytes 40..43 of the header
            self._buf[at] ^= 0x5A

    def term_chain(self, index: int) -> tuple[int, int, int]:
        """(term, chain CRC, magic) of the record of `index` from its header, without verifying
        its body: what the invariant checks compare (a rotten body is the repair's business;
        magic is not covered by the chain CRC, so it is compared apart)."""
        raw = self.read_raw(index, 0)
        try:
            h = HEADER.unpack_from(raw.data, 0)
        finally:
            raw.data.release()
        return int(h[3]), int(h[6]), int(h[0])

    # --- writes ------------------------------------------------------------------------------

    def append_as_leader(self, bodies: Sequence[bytes], term: int, magic: int = MAGIC_NORMAL) -> AppendedBatch:
        self._check_write()
        if magic == MAGIC_NORMAL and (full := self.pressure_error()) is not None:
            raise full
        res = super().append_as_leader(bodies, term, magic)
        self.durable_index = min(self.durable_index, self.synced_index)  # not durable until a flush
        return res

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> int:
        self._check_write()
        end = super().append_as_follower(data)
        self.durable_index = min(self.durable_index, self.synced_index)
        return end

    def truncate(self, from_index: int) -> None:
        if self.failed is not None:
            raise StoreError(ResponseCode.DISK_ERROR, f"store failed: {self.failed}")
        super().truncate(from_index)
        # a truncate is made durable at once (the file store zeroes and fsyncs)
        self.synced_index = min(self.synced_index, self.end_index)
        self.durable_index = min(self.durable_index, self.synced_index)
        self._trunc_floor = min(self._trunc_floor, self.end_index)

    def reset(self, begin_index: int, begin_term: int, begin_chain_crc: int, begin_pos: int) -> None:
        """An installed snapshot replaces the log: durable at once (the file store writes its
        checkpoint), like a truncate."""
        self._check_write()
        super().reset(begin_index, begin_term, begin_chain_crc, begin_pos)
        self.synced_index = self.end_index
        self._trunc_floor = min(self._trunc_floor, self.end_index)

    def save_term(self, term: int, voted_for: str | None) -> None:
        if self.full or self.failed is not None:
            raise StoreError(ResponseCode.DISK_FULL if self.full else ResponseCode.DISK_ERROR,
                             "saving the term: no space left on device" if self.full else f"failed: {self.failed}")
        super().save_term(term, voted_for)

    def set_retention_floor(self, index: int | None, holder: str = "") -> None:
        self.retention_floor = index
        self.holder = holder if index is not None else ""

    # --- flushes -----------------------------------------------------------------------------

    def request_flush(self) -> None:
        if self.failed is not None:
            return
        if self.flushing:
            self.flush_requested = True
            return
        self.flushing = True
        self.flush_requested = False
        self._flush_target = self.end_index
        self._trunc_floor = 1 << 62
        if self.on_request is not None:
            self.on_request()

    def complete_flush(self) -> int:
        """The simulated fsync finished: what was written when it started is durable.
        Returns the durable index, which the simulator delivers to the node later (as the
        runtime does through the event loop), by then possibly stale."""
        self.flushing = False
        if self.fsync_error_once:
            self.fsync_error_once = False
            self.failed = "fsync: Input/output error"  # fsyncgate: never retry a failed fsync
            return self.durable_index
        self.synced_index = max(self.synced_index, min(self._flush_target, self._trunc_floor, self.end_index))
        durable = self._set_durable(self.synced_index)
        if self.flush_requested:
            self.request_flush()
        return durable

    def sync_all(self) -> None:
        """A clean stop: everything written reaches the disk."""
        self.flushing = self.flush_requested = False
        self.synced_index = self.end_index
        self._set_durable(self.end_index)

    def crash(self) -> None:
        """Lose what was not flushed. The commit index kept is at most the durable one,
        as the file store's checkpoint keeps it."""
        self.generation += 1
        self.committed_index = min(self.committed_index, self.synced_index)
        if self.end_index > self.synced_index:
            self._drop_from(self.synced_index + 1)
        self.durable_index = self.end_index
        self.flushing = self.flush_requested = False
        self._flush_listeners.clear()

    # --- retention ----------------------------------------------------------------------------

    def _compact_limit(self) -> int:
        """As the memory store's, with what reached the disk for durable (run_retention retries)."""
        floor = min(self.committed_index + 1, self.synced_index + 1, self.end_index)
        return floor if self.retention_floor is None else min(floor, self.retention_floor)

    def run_retention(self) -> None:
        """Under disk pressure delete the prefix below the commit index and the floor; and what
        a snapshot covers, whatever the pressure."""
        if self._compact_to > self.begin_index:
            self._compact()
        self.held_full = False
        if not self.pressure:
            return
        # the log keeps its last entry; held: the floor keeps what the commit index alone would
        # let go (as FileLedgerStore._note_held_back: only when it blocks a deletion)
        could = min(self.committed_index + 1, self.synced_index + 1, self.end_index)
        floor = could if self.retention_floor is None else min(could, self.retention_floor)
        self.held_full = could - self.begin_index >= RETENTION_CHUNK > floor - self.begin_index
        if floor - self.begin_index >= RETENTION_CHUNK:
            self.drop_prefix(floor)
