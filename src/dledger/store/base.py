"""LedgerStore: the storage interface every Raft member writes through (DLedgerStore).

The two implementations (memory, file) share the argument checks, the decoded
read and the term search here, so they differ only in where bytes live.
"""

from __future__ import annotations

import errno
import logging
import threading
import zlib
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from dledger.codes import DLedgerError, ResponseCode
from dledger.entry import (
    CHAIN_FIELDS,
    HEADER,
    HEADER_SIZE,
    MAGIC_NORMAL,
    MAGIC_SIZE,
    CorruptRecord,
    DLedgerEntry,
    chain_follows,
    decode_entry,
    header_fault,
    scan,
    unverified,
)

if TYPE_CHECKING:
    from dledger.store.columnar import CheckedRun

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ColumnChunk:
    """LedgerStore.read_columns' answer: one value per kept entry in each list, the kept
    bodies in order in `bodies` (joined per stretch of the log read at once)."""

    indexes: array[int] = field(default_factory=lambda: array("q"))
    terms: array[int] = field(default_factory=lambda: array("q"))
    positions: array[int] = field(default_factory=lambda: array("q"))
    body_sizes: array[int] = field(default_factory=lambda: array("q"))
    bodies: list[bytes] = field(default_factory=list)
    scanned: int = 0  # entries passed, kept or not
    size: int = 0  # their record bytes
    next_index: int = 0  # the first entry not passed

    def add(self, run: CheckedRun) -> None:
        self.indexes.frombytes(run.indexes)
        self.terms.frombytes(run.terms)
        self.positions.frombytes(run.positions)
        self.body_sizes.frombytes(run.body_sizes)
        if run.bodies:
            self.bodies.append(run.bodies)
        self.scanned += run.scanned


class StoreError(DLedgerError):
    """A store operation failed; `code` says why (DISK_ERROR, DISK_FULL, …)."""


class CorruptEntryError(StoreError):
    """A stored record fails verification (body CRC, header against the index, chain CRC
    link): DISK_ERROR naming the entry. The member holding it must not lead, and repairs
    the record from the leader's copy (see `LedgerStore.repair`)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(ResponseCode.DISK_ERROR, message)
        self.index = index


class PushRejected(StoreError):
    """A pushed record failed verification: `index` is the index it should hold, `reason`
    what failed (e.g. "body crc mismatch")."""

    def __init__(self, code: ResponseCode, message: str, index: int, reason: str) -> None:
        super().__init__(code, message)
        self.index = index
        self.reason = reason


class AppendedBatch(NamedTuple):
    """Where a leader append put its entries: one position per body, in order."""

    first_index: int
    term: int
    positions: array[int]

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.positions) - 1


@dataclass(frozen=True, slots=True)
class RawRange:
    """Whole records [first_index, first_index + count) as their exact stored bytes."""

    data: memoryview
    first_index: int
    count: int


class TermVote(NamedTuple):
    term: int
    voted_for: str | None


FlushListener = Callable[[int], None]


class LedgerStore(ABC):
    """Operations of DLedger's DLedgerStore plus what snapshots and durability need.

    Indexes: an empty log has end_index == begin_index - 1 (-1 at first).
    Single writer: appends, truncate and reset come from one thread; a flush
    thread may run beside it.
    """

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.begin_index = 0
        self.begin_term = -1  # term of entry begin_index - 1 (none yet)
        self.begin_chain_crc = 0
        self.end_index = -1
        self.end_term = -1
        self.end_chain_crc = 0
        self.committed_index = -1
        self.durable_index = -1
        # (index, reason) of the first committed record recovery found rotten and kept
        self.recovered_corrupt: tuple[int, str] | None = None
        self._flush_listeners: list[FlushListener] = []
        self.fsync_observer: Callable[[float], None] | None = None  # seconds per flush, for metrics
        self._lock = threading.RLock()

    # --- writes -------------------------------------------------------------

    @abstractmethod
    def append_as_leader(
        self, bodies: Sequence[bytes], term: int, magic: int = MAGIC_NORMAL
    ) -> AppendedBatch:
        """Assign index, term and pos to each body and store them as one batch."""

    @abstractmethod
    def append_as_follower(self, data: bytes | bytearray | memoryview) -> int:
        """Store the verbatim records pushed by a leader; returns the new end index.

        The first record must carry index end_index + 1; every record is
        verified (magic, size, pos, body CRC, chain CRC). On any error nothing
        is kept.
        """

    @abstractmethod
    def truncate(self, from_index: int) -> None:
        """Remove entries from_index..end_index (a follower's divergent tail)."""

    @abstractmethod
    def reset(self, begin_index: int, begin_term: int, begin_chain_crc: int, begin_pos: int) -> None:
        """Drop every entry and start an empty log whose next entry is begin_index at begin_pos."""

    def repair(self, index: int, data: bytes | bytearray | memoryview) -> None:
        """Overwrite the stored record of `index` in place with `data`, the same record as the
        leader holds it (bytes and position are equal on every member), and make it durable.

        Nothing moves: the record must verify by itself (body CRC) and carry the index, term,
        position, size and magic our index holds for `index`, and its chain CRC must follow our
        entry index - 1; else StoreError and nothing is written. Never used to change what an
        entry is, only to restore the bytes it had."""
        with self._lock:
            err = self.write_error()
            if err is not None:
                raise err
            self._check_readable(index)
            pos, size, term, magic = self._record_slot(index)
            self._check_repair_record(index, data, pos, size, term, magic)
            self._write_record(pos, data)
            reason = self.verify(index)
        if reason is not None:
            raise CorruptEntryError(index, f"entry {index} still fails verification after its repair: {reason}")

    def slot(self, index: int) -> tuple[int, int, int]:
        """(pos, size, term) of a stored entry, from the index: what byte-offset replication
        (a broker set's HA offsets) maps positions with."""
        with self._lock:
            self._check_readable(index)
            pos, size, term, _ = self._record_slot(index)
            return pos, size, term

    def begins_file(self, pos: int) -> bool:
        """Whether a data file begins at `pos`: the only places a log whose older files
        retention deleted can begin (a memory store has no files: 0 only)."""
        return pos == 0

    def first_pos(self) -> int:
        """The position of entry begin_index (where an empty log's next entry goes)."""
        raise StoreError(ResponseCode.UNSUPPORTED, f"{type(self).__name__} has no positions")

    def _record_slot(self, index: int) -> tuple[int, int, int, int | None]:
        """(pos, size, term, magic or None) of `index` as the index knows it, without trusting
        the record's own header."""
        raise StoreError(ResponseCode.UNSUPPORTED, f"{type(self).__name__} cannot repair records")

    def _write_record(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write a whole record at `pos` over the old one and make it durable."""
        raise StoreError(ResponseCode.UNSUPPORTED, f"{type(self).__name__} cannot repair records")

    def _check_repair_record(self, index: int, data: bytes | bytearray | memoryview, pos: int, size: int,
                             term: int, magic: int | None) -> None:
        if len(data) != size:
            raise StoreError(ResponseCode.INCONSISTENT_STATE,
                             f"repair of entry {index}: {len(data)} bytes, our record has {size}")
        try:
            e = decode_entry(data)
        except DLedgerError as err:
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                             f"repair of entry {index}: the record sent fails its own check: {err.message}") from err
        channel = HEADER.unpack_from(data, 0)[5]
        if (e.index, e.term, e.pos, channel) != (index, term, pos, 0) or magic not in (None, e.magic):
            raise StoreError(ResponseCode.INCONSISTENT_STATE,
                             f"repair of entry {index}: the record sent (index {e.index}, term {e.term}, pos {e.pos}) "
                             f"is not ours (term {term}, pos {pos})")
        if not chain_follows(index, e.term, e.body_crc, self.chain_at(index - 1), e.chain_crc):
            raise StoreError(ResponseCode.INCONSISTENT_STATE,
                             f"repair of entry {index}: its chain CRC does not follow our entry {index - 1}")
        if index < self.end_index:  # and our next record must still chain onto it (its header
            raw = self.read_raw(index + 1, 0)  # holds its term and body CRC, which rot of a body spares)
            try:
                fields = HEADER.unpack_from(raw.data, 0) if len(raw.data) >= HEADER_SIZE else None
            finally:
                raw.data.release()
            if fields is None or not chain_follows(index + 1, fields[3], fields[7], e.chain_crc, fields[6]):
                raise StoreError(ResponseCode.INCONSISTENT_STATE,
                                 f"repair of entry {index}: our entry {index + 1} does not chain onto the record sent")

    # --- reads --------------------------------------------------------------

    @abstractmethod
    def read_raw(self, from_index: int, max_bytes: int) -> RawRange:
        """Whole records from from_index, at least one, at most max_bytes when possible.

        The view may point into the store's own buffers: release it promptly
        and do not hold it across a truncate.
        """

    @abstractmethod
    def tail_bytes(self, from_index: int) -> int | None:
        """The bytes of the records from `from_index` through the end of the log when one
        `read_raw` could return them all (None: a data file ends before the log does), known
        without reading them: a leader deciding whether a push would leave small asks this first."""

    @abstractmethod
    def term_at(self, index: int) -> int:
        """Term of entry `index`; begin_term for begin_index - 1."""

    @abstractmethod
    def pos_of_next(self) -> int:
        """Byte position where the next record would start (before any file roll)."""

    def get(self, index: int) -> DLedgerEntry:
        """The entry at `index`, its body CRC verified (CorruptEntryError if it fails)."""
        raw = self.read_raw(index, 0)
        try:
            entry = decode_entry(raw.data)
        except CorruptRecord as e:
            raise CorruptEntryError(index, f"entry {index}: {e.reason}") from e
        finally:
            raw.data.release()
        if entry.index != index:
            raise CorruptEntryError(index, f"record for index {index} holds {entry.index}")
        return entry

    def chain_at(self, index: int) -> int:
        """The chain CRC field of the record at `index` as stored (no body check);
        begin_chain_crc for begin_index - 1."""
        if index == self.begin_index - 1:
            return self.begin_chain_crc
        return self._header_field(index, 6)

    def body_crc(self, index: int) -> int:
        """The body CRC field of the record at `index` as stored (its header: what a leader
        compares a producer's repeated body with, without checking the body)."""
        return self._header_field(index, 7)

    def _header_field(self, index: int, field: int) -> int:
        """Field `field` of the record header at `index` (entry.HEADER's order), unchecked."""
        raw = self.read_raw(index, 0)
        try:
            if len(raw.data) < HEADER_SIZE:
                raise CorruptEntryError(index, f"record of entry {index} has no whole header")
            return int(HEADER.unpack_from(raw.data, 0)[field])
        finally:
            raw.data.release()

    def release_pages(self, first: int, last: int) -> None:
        """Records `first`..`last` were read through and will not be soon again (the scrub):
        a store that maps its files drops their pages from this process, so its resident
        memory does not grow with the log (they stay in the page cache). Default: nothing."""

    def verify_entry(self, index: int) -> DLedgerEntry:
        """The entry at `index` once fully verified, with the same single-record check a
        follower applies to a push (entry.scan): magic, size, index, position, channel, term
        not below its predecessor's, body CRC, chain CRC following its predecessor's; then
        the term (and magic, where the index keeps it) against the index. CorruptEntryError
        names what failed."""
        with self._lock:
            self._check_readable(index)
            pos, size, term, magic = self._record_slot(index)
            self._check_record(index, pos, size, term, magic)
            return self.get(index)

    def check_magics(self, raw: RawRange) -> None:
        """Each record's magic against the index's. No CRC covers the magic, so a flip
        (NORMAL <-> CONFIG_CHANGE) shows only there: a leader checks the records it pushes to
        a follower catching up, so it never hands on rot its scrub has not reached yet."""
        data, off = raw.data, 0
        for index in range(raw.first_index, raw.first_index + raw.count):
            if off + 8 > len(data):
                return  # a damaged size: the follower's own checks reject the push
            magic, size = MAGIC_SIZE.unpack_from(data, off)
            want = self._index_magic(index)  # the file store rebuilds a damaged unit first
            if magic != want:
                raise CorruptEntryError(index, f"record of entry {index} says magic {magic}; the index {want}")
            off += max(size, HEADER_SIZE)

    def indexes_with_magic(self, first: int, last: int, magic: int) -> list[int]:
        """Indexes in [first, last] whose index entry holds `magic` (rare markers among many
        NORMAL entries: the stores override this with a scan that builds no object per entry).
        Candidates only: a caller reads the record itself before trusting one."""
        return [i for i in range(max(first, self.begin_index), min(last, self.end_index) + 1)
                if self._index_magic(i) == magic]

    def _index_magic(self, index: int) -> int:
        """The magic the index holds for `index` (not covered by the chain CRC)."""
        magic = self._record_slot(index)[3]
        return self.get(index).magic if magic is None else magic

    def _check_record(self, index: int, pos: int, size: int, term: int, magic: int | None) -> None:
        prev_chain, prev_term = self.chain_at(index - 1), self.term_at(index - 1)
        raw = self.read_raw(index, 0)
        try:
            data = raw.data
            if len(data) >= HEADER_SIZE:
                h = HEADER.unpack_from(data, 0)
                if (magic is not None and h[0] != magic) or h[3] != term:
                    raise CorruptEntryError(index, f"record of entry {index} says magic {h[0]}, term {h[3]}; "
                                                   f"the index {magic}, {term}")
            try:
                res = scan(data, 0, len(data), index, pos, prev_chain, prev_term, strict=True, max_count=1)
            except CorruptRecord as e:
                raise CorruptEntryError(index, f"entry {index}: {e.reason}") from e
            if res.count != 1 or res.consumed != size:
                raise CorruptEntryError(index, f"record of entry {index} is not the {size} bytes the index holds")
        finally:
            raw.data.release()

    def verify(self, index: int) -> str | None:
        """Why the record at `index` fails verification (see verify_entry), or None."""
        try:
            self.verify_entry(index)
        except CorruptEntryError as e:
            return e.message
        return None

    def read(self, from_index: int, max_entries: int = 1000, max_bytes: int = 4 << 20) -> list[DLedgerEntry]:
        """Decoded entries from from_index (all magics), stopping at the end of the log. Their
        records total at most `max_bytes` (the first entry is returned whatever its size)."""
        out: list[DLedgerEntry] = []
        index = from_index
        size = 0
        while len(out) < max_entries and index <= self.end_index and (not out or size < max_bytes):
            raw = self.read_raw(index, max(1, max_bytes - size))
            try:
                off = 0
                for k in range(min(raw.count, max_entries - len(out))):
                    try:
                        entry = decode_entry(raw.data, off)
                    except CorruptRecord as e:
                        raise CorruptEntryError(index, f"entry {index}: {e.reason}") from e
                    if entry.index != index:
                        raise CorruptEntryError(index, f"record for index {index} holds {entry.index}")
                    # headers are not covered by the body CRC: the first record of a range
                    # is checked by get(), each next one by its pos and chain CRC link
                    if k == 0:
                        ok = entry == self.get(index)
                    else:
                        prev = out[-1]
                        ok = entry.pos == prev.pos + prev.size and chain_follows(
                            index, entry.term, entry.body_crc, prev.chain_crc, entry.chain_crc
                        ) and entry.magic == self._index_magic(index)
                    if not ok:
                        raise CorruptEntryError(index, f"record of entry {index} has a damaged header")
                    if out and size + entry.size > max_bytes:
                        return out
                    out.append(entry)
                    size += entry.size
                    off += entry.size
                    index += 1
            finally:
                raw.data.release()
        return out

    def read_columns(self, from_index: int, max_entries: int, max_bytes: int, magics: frozenset[int],
                     bodies: bool = True) -> ColumnChunk:
        """What `read` validates, as columns: the entries from `from_index` whose magic is in
        `magics` (the others are passed over), their bodies joined into one bytes object.
        Why: a bulk reader (the Spark source) pays no object per entry on either side, and
        the checks are `read`'s, decided inline (one record's rules cost a call each there):
        the first record against `get`, each next one by its pos, its chain CRC link and
        the magic the index holds for it (`_index_magics`, read in bulk)."""
        out = ColumnChunk()
        index = from_index
        size = 0
        unpack = HEADER.unpack_from
        crc32 = zlib.crc32
        chain_pack = CHAIN_FIELDS.pack
        while out.scanned < max_entries and index <= self.end_index and (not out.scanned or size < max_bytes):
            raw = self.read_raw(index, max(1, max_bytes - size))
            try:
                mv = raw.data
                room = len(mv)
                count = min(raw.count, max_entries - out.scanned)
                run = self._checked_run(mv, index, count, magics, bodies, max_bytes - size, not out.scanned)
                if run is not None:
                    out.add(run)
                    size += run.size
                    index += run.scanned
                    if run.spent:
                        break
                    continue
                expect = self._index_magics(index, count)
                off = 0
                prev_pos = prev_chain = -1
                slices: list[memoryview] = []
                for k in range(count):
                    if room - off < HEADER_SIZE:
                        raise CorruptEntryError(index, f"entry {index}: truncated header")
                    h = unpack(mv, off)
                    magic, rsize, idx, term, rpos, _ch, ccrc, bcrc, _bs = h
                    reason = header_fault(h, room - off)
                    if reason is None and crc32(mv[off + HEADER_SIZE : off + rsize]) != bcrc \
                            and not unverified(ccrc, bcrc):
                        reason = "body crc mismatch"
                    if reason is not None:
                        raise CorruptEntryError(index, f"entry {index}: {reason} at offset {off}")
                    if idx != index:
                        raise CorruptEntryError(index, f"record for index {index} holds {idx}")
                    if k == 0:
                        first = self.get(index)  # the header against what the store holds
                        ok = (first.term, first.pos, first.magic, first.chain_crc, first.body_crc) == \
                            (term, rpos, magic, ccrc, bcrc)
                    else:
                        # a unit the bulk read found damaged is asked for again (unit() repairs it)
                        ok = rpos == prev_pos and (magic == expect[k] or magic == self._index_magic(index)) and (
                            crc32(chain_pack(index, term, bcrc), prev_chain) == ccrc or unverified(ccrc, bcrc))
                    if not ok:
                        raise CorruptEntryError(index, f"record of entry {index} has a damaged header")
                    if out.scanned and size + rsize > max_bytes:
                        break
                    if magic in magics:
                        out.indexes.append(idx)
                        out.terms.append(term)
                        out.positions.append(rpos)
                        if bodies:
                            slices.append(mv[off + HEADER_SIZE : off + rsize])
                            out.body_sizes.append(rsize - HEADER_SIZE)
                        else:
                            out.body_sizes.append(0)
                    size += rsize
                    off += rsize
                    prev_pos, prev_chain = rpos + rsize, ccrc
                    index += 1
                    out.scanned += 1
                else:
                    if slices:
                        out.bodies.append(b"".join(slices))
                    continue
                if slices:
                    out.bodies.append(b"".join(slices))
                break  # the byte budget is spent
            finally:
                raw.data.release()
        out.size = size
        out.next_index = index
        return out

    def _checked_run(self, data: memoryview, first: int, count: int, magics: frozenset[int], bodies: bool,
                     budget: int, take_one: bool) -> CheckedRun | None:
        """read_columns' fast path (store.columnar): the stretch checked as arrays against
        the index units, None when the store keeps no units to check against or any rule
        fails (the per-record loop then names the fault)."""
        units = self._index_units(first, count)
        if units is None:
            return None
        from dledger.store.columnar import check_run  # loaded by the first columnar read only

        f = self.get(first)  # the first header against what the store holds, as the loop does
        return check_run(data, first, units, (f.term, f.pos, f.magic, f.chain_crc, f.body_crc), magics, bodies,
                         budget, take_one)

    def _index_units(self, first: int, count: int) -> bytes | None:
        """The index units of `count` entries from `first` as stored, or None (a store
        without an index file)."""
        return None

    def _index_magics(self, first: int, count: int) -> Sequence[int]:
        """The magics the index holds for `count` entries from `first` (not covered by the
        chain CRC: a second copy)."""
        return [self._index_magic(first + k) for k in range(count)]

    def first_index_of_term(self, term: int) -> int:
        """Lowest index holding `term`, or -1 (DLedger's getFirstLogOfTargetTerm).

        Terms never decrease along the log, so a binary search over term_at.
        """
        lo, hi = self.begin_index, self.end_index
        if hi < lo or self.term_at(hi) < term:
            return -1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.term_at(mid) < term:
                lo = mid + 1
            else:
                hi = mid
        return lo if self.term_at(lo) == term else -1

    # --- commit, durability, persistent vote ---------------------------------

    def set_committed(self, index: int) -> None:
        """Record the commit index; it never moves backwards."""
        with self._lock:
            if index > self.end_index:
                raise StoreError(
                    ResponseCode.INDEX_OUT_OF_RANGE,
                    f"commit index {index} beyond ledger end {self.end_index}",
                )
            if index > self.committed_index:
                self.committed_index = index

    def add_flush_listener(self, listener: FlushListener) -> None:
        """Call `listener(durable_index)` after each flush, from the flush thread."""
        self._flush_listeners.append(listener)

    def _set_durable(self, index: int) -> int:
        """Raise the durable index to `index` (capped at the log end) under the store lock, so
        it can never name a record a concurrent truncate removed; returns the value now."""
        with self._lock:
            self.durable_index = max(self.durable_index, min(index, self.end_index))
            return self.durable_index

    def _publish_durable(self, index: int) -> None:
        """Tell the listeners the durable index moved. `index` is a hint already stale when
        it arrives (a truncate may have lowered it since): act on `durable_index`, which
        the store keeps true under its lock."""
        for listener in self._flush_listeners:
            try:
                listener(index)
            except Exception:  # a broken listener must not stop the flusher
                log.exception("flush listener failed")

    def request_flush(self) -> None:
        """Ask for a flush soon (sync mode); the default store is always durable."""

    def flush(self) -> int:
        """Flush everything written so far, blocking; returns the durable index."""
        durable = self._set_durable(self.end_index)
        self._publish_durable(durable)
        return durable

    def write_error(self) -> StoreError | None:
        """Why this store cannot take writes now (a failed fsync, a write that found no space),
        or None.

        A member whose store cannot write must not lead nor campaign (it would win and then
        fail every append); `dledger status` and the metrics show the reason."""
        return None

    def pressure_error(self) -> StoreError | None:
        """DISK_FULL while retention can free nothing more above the force-clean ratio: client
        appends are refused, but a leader's NOOP and followers' appends still go. A lagging
        member catching up is what frees the retention floor; refusing every write here (or
        keeping such members out of elections) deadlocked a group whose disks all filled
        while one member lagged."""
        return None

    @abstractmethod
    def save_term(self, term: int, voted_for: str | None) -> None:
        """Persist currterm before the caller acts on a new term or vote."""

    @abstractmethod
    def load_term(self) -> TermVote: ...

    def set_retention_floor(self, index: int | None, holder: str = "") -> None:
        """Entries from `index` on must be kept: `holder` (a lagging follower) still needs them.
        None: only the commit index bounds retention."""

    @property
    def retention_held_by(self) -> str:
        """The holder whose floor kept retention from freeing space under disk pressure, or ""."""
        return ""

    def set_compaction_point(self, index: int) -> None:
        """A snapshot covers the log through `index`: retention may delete those entries whatever
        the disk usage (whole files in the file store, on its next pass), though never past the
        commit or durable index nor the retention floor. The memory store drops them at once."""
        with self._lock:
            self._drop_covered(index + 1)

    def _drop_covered(self, floor: int) -> None:
        """Delete what lies before `floor`, now or once the floors allow (see set_compaction_point)."""

    def retention_hold(self) -> tuple[int | None, str]:
        """The retention floor last set and its holder (None, "": none)."""
        return None, ""

    def request_retention(self) -> None:
        """Look at retention soon, not only at its interval (a compaction point was just set)."""

    def compaction_begin(self, through: int) -> int:
        """The log begin once compaction through `through` is done and no floor holds it back
        (the file store deletes whole data files: the first index of the file holding the
        next entry)."""
        with self._lock:
            return max(self.begin_index, min(through + 1, self.end_index))

    def close(self) -> None:
        """Release resources; further calls fail."""

    # --- shared checks -------------------------------------------------------

    def check_bodies(self, bodies: Sequence[bytes], term: int) -> None:
        """Why `bodies` cannot be appended in `term` (raised), checked before anything is written."""
        if not bodies:
            raise StoreError(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "empty batch")
        if term < self.end_term:
            raise StoreError(
                ResponseCode.EXPIRED_TERM, f"term {term} is below the ledger end term {self.end_term}"
            )
        limit = self.max_body_bytes
        for i, body in enumerate(bodies):
            if len(body) > limit:
                raise StoreError(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"body {i} is {len(body)} bytes, over max_body_bytes {limit}",
                )

    def _check_readable(self, index: int) -> None:
        if index < self.begin_index:
            raise StoreError(
                ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                f"index {index} is below the ledger begin {self.begin_index}",
            )
        if index > self.end_index:
            raise StoreError(
                ResponseCode.INDEX_OUT_OF_RANGE,
                f"index {index} is beyond the ledger end {self.end_index}",
            )

    def _check_reset(self, begin_index: int) -> None:
        """A reset (an installed snapshot) never drops committed entries: the snapshot covers
        at least the commit index."""
        if begin_index - 1 < self.committed_index:
            raise StoreError(ResponseCode.INCONSISTENT_STATE,
                             f"refusing to reset the log to begin at {begin_index}: entries up to "
                             f"{self.committed_index} are committed")

    def _check_truncate(self, from_index: int) -> None:
        if not self.begin_index <= from_index <= self.end_index + 1:
            raise StoreError(
                ResponseCode.INDEX_OUT_OF_RANGE,
                f"truncate from {from_index} outside [{self.begin_index}, {self.end_index + 1}]",
            )
        if from_index <= self.committed_index:
            raise StoreError(
                ResponseCode.INCONSISTENT_STATE,
                f"refusing to truncate committed entries (from {from_index}, "
                f"committed {self.committed_index})",
            )
        # the new end's chain CRC (and the checkpoint's trusted point) come from its header:
        # a rotten one is repaired first (the leader's REPAIR), then the truncate goes through
        if self.begin_index <= from_index - 1 <= self.end_index:
            reason = self.verify(from_index - 1)
            if reason is not None:
                raise CorruptEntryError(from_index - 1, f"not truncating after a corrupt record: {reason}")

    def _first_record_index(self, data: bytes | bytearray | memoryview) -> int:
        if len(data) < HEADER_SIZE:
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, "push holds no whole record")
        index: int = HEADER.unpack_from(data, 0)[2]
        if index != self.end_index + 1:
            raise StoreError(
                ResponseCode.INCONSISTENT_INDEX,
                f"push starts at index {index}, expected {self.end_index + 1}",
            )
        return index


def positions_of(values: array[int], value: int, lo: int, hi: int) -> list[int]:
    """Where `value` occurs in values[lo:hi] (array.index runs in C)."""
    out: list[int] = []
    k = lo
    while k < hi:
        try:
            k = values.index(value, k, hi)
        except ValueError:
            break
        out.append(k)
        k += 1
    return out


def os_error(e: OSError, what: str) -> StoreError:
    """An OS error of a store operation as a response code: a full disk (or quota) is
    DISK_FULL, anything else DISK_ERROR."""
    code = ResponseCode.DISK_FULL if e.errno in (errno.ENOSPC, errno.EDQUOT) else ResponseCode.DISK_ERROR
    return StoreError(code, f"{what} failed: {e.strerror or e}")


def push_error(stop: str, offset: int, index: int) -> PushRejected:
    """A pushed record at `offset` of the push, which should hold entry `index`, failed."""
    reason = stop.removeprefix("corrupt: ")
    if reason.startswith("index"):
        code = ResponseCode.INCONSISTENT_INDEX
    elif reason.startswith("pos"):
        code = ResponseCode.INCONSISTENT_STATE
        reason += " (do all members use the same data_file_size?)"
    else:
        code = ResponseCode.UNEXPECTED_ARGUMENT
    return PushRejected(code, f"pushed record of entry {index} at offset {offset} rejected: {reason}", index,
                        stop.removeprefix("corrupt: "))


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
AppendResult = AppendedBatch
