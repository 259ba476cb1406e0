"""FileLedgerStore: DLedger's mmap file store (DLedgerMmapFileStore), docs/format.md.

Layout: `data/` holds records, `index/` one 32-byte unit per index,
`checkpoint` the commit index and the last durable record (the point recovery
trusts), `currterm` the term and vote, `lock` the flock of the one process
that has the store open (store/lock.py).

Invariants the code keeps:
- records are contiguous; a record is written only where `size + 8` bytes
  remain, so a blank always fits to close the file;
- records and index units are written with pwrite, never through the mapping
  (which only serves reads): see MappedFile; a torn write leaves a record whose
  CRCs fail, and recovery cuts it;
- removed records (truncate, recovery cut) are zeroed, so a later recovery can
  never bring them back;
- `checkpoint` never names a record that a later truncate removed: truncate
  rewrites it under the same lock the flusher writes it with.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from dledger.codes import ResponseCode
from dledger.entry import (
    BLANK,
    BLANK_SIZE,
    ENTRY_MAGICS,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MAGIC_BLANK,
    MAGIC_CONFIG_CHANGE,
    MAGIC_NORMAL,
    MAGIC_SESSION,
    MAGIC_SIZE,
    CorruptRecord,
    DLedgerEntry,
    chain_follows,
    decode_entry,
    encode_run,
    scan,
)
from dledger.ratelog import RateLimitedLog
from dledger.store.base import (
    AppendedBatch,
    CorruptEntryError,
    LedgerStore,
    RawRange,
    StoreError,
    TermVote,
    os_error,
    positions_of,
    push_error,
)
from dledger.store.checkpoint import write_atomic, write_currterm
from dledger.store.flusher import FlushService
from dledger.store.lock import StoreDirLock
from dledger.store.mapped_file import DATA, INDEX, MappedFile, MappedFileList, check_store_files, checkpoint_for_sizes
from dledger.store.marks import MagicMarks
from dledger.store.offline import (
    CURRTERM,
    UnreadableFile,
    read_currterm,
)
from dledger.store.recovery import rebuild_units, recover
from dledger.store.retention import Candidate, Plan, aged_out, disk_usage_ratio, plan_deletions

log = logging.getLogger(__name__)

EAGER_RETENTION_S = 10.0  # after a compaction request, retention looks every few hundred ms this long

DiskUsage = Callable[[], tuple[float, int]]


class FileLedgerStore(LedgerStore):
    def __init__(
        self,
        store_dir: str | Path,
        *,
        data_file_size: int = 1 << 30,
        index_file_size: int = 32 * 5_242_880,
        max_body_bytes: int = 4 << 20,
        flush: str = "async",
        flush_interval_ms: int = 10,
        checkpoint_interval_ms: int = 1000,
        file_reserved_hours: float = 72.0,
        retention_hours: float = 0.0,
        disk_space_ratio_to_check_expired: float = 0.70,
        disk_space_ratio_to_force_clean: float = 0.85,
        retention_check_interval_ms: int = 10_000,
        disk_usage: DiskUsage | None = None,
        force_clean_until: float | None = None,
        disk_full_ratio: float | None = None,
        floor_only: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Retention (store/retention.py): `retention_hours` (data files last written longer ago
        go whatever the disk usage; 0: off), `file_reserved_hours`, the two disk ratios and
        `force_clean_until` (how far forced deletion brings usage down; None: the check ratio)
        and `disk_full_ratio` (above it, with nothing more to delete, client appends are
        refused; None: the force ratio) are the policy; `floor_only`: only `set_retention_floor`
        bounds it, not the commit index (a broker's log: its owner knows which records its
        replicas still need, and nothing is deleted before it says); `clock` (wall seconds)
        ages the files, `disk_usage` measures the disk (tests pass fakes)."""
        super().__init__(min(max_body_bytes, data_file_size - HEADER_SIZE - BLANK_SIZE))
        if index_file_size % INDEX_UNIT_SIZE:
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, "index_file_size must be a multiple of 32")
        self.dir = Path(store_dir)
        self._warn = RateLimitedLog(log).warning
        self.dir.mkdir(parents=True, exist_ok=True)
        # first, before anything reads or writes the files: one writer per directory
        self._dir_lock = StoreDirLock(store_dir)
        try:
            self.sync_mode = flush == "sync"
            self.file_reserved_hours = file_reserved_hours
            self.retention_hours = retention_hours
            self.check_expired_ratio = disk_space_ratio_to_check_expired
            self.force_clean_ratio = disk_space_ratio_to_force_clean
            self.force_clean_until = force_clean_until
            self.disk_full_ratio = disk_full_ratio
            self._floor_only = floor_only
            self._clock = clock
            self._disk_usage: DiskUsage = disk_usage or (lambda: disk_usage_ratio(self.dir))
            # the sizes are the store's own when it has files (a store upstream DLedger or an
            # older configuration wrote); the configured ones are for new files of a new store
            ckpt = checkpoint_for_sizes(self.dir)
            # both lists checked, read-only, before either is opened: a refusal changes nothing
            data_file_size, index_file_size = check_store_files(self.dir, ckpt, data_file_size, index_file_size)
            self.data = MappedFileList(self.dir / DATA, data_file_size, checked=True)
            try:
                # a cache of the record headers: a short index file is extended, its units rebuilt
                self.index = MappedFileList(self.dir / INDEX, index_file_size, INDEX_UNIT_SIZE, checked=True)
            except BaseException:
                self.data.close()
                raise
            self.max_body_bytes = min(self.max_body_bytes, self.data.file_size - HEADER_SIZE - BLANK_SIZE)
            self.begin_pos = 0
            self.write_pos = 0
            self._flushed_pos = 0  # data before it is fsynced
            # index units before this byte of the index are fsynced (the checkpoint syncs every
            # index file written since, before it names a trusted record past them: recovery
            # trusts the units below that record unread). 0 on open: an older release synced
            # only the last two index files, so the first checkpoint syncs them all once
            self._units_synced = 0
            self.disk_full = False  # retention found nothing to delete above the force ratio (soft)
            self._no_space = False  # a write failed for want of space (hard)
            self._retention_floor: int | None = None
            self._compaction_floor = 0  # a snapshot covers the entries before it (set_compaction_point)
            self._retention_holder = ""  # who set the floor
            self._retention_held_by = ""  # set while that floor keeps files disk pressure would delete
            self._failed: BaseException | None = None
            self.unverified = 0  # upstream's records (CRC fields 0) recovery's scan found past the trusted one
            self._closed = False
            self._trunc_floor = 1 << 62  # lowest end index a truncate set during a flush
            self._ckpt_lock = threading.Lock()  # outermost: checkpoint state must match the files
            self._sync_lock = threading.Lock()  # innermost: fds are not closed during an fsync
            self._flush_lock = threading.Lock()  # outside the others: one flush_once at a time
            self._term_vote = self._read_term()
            # where the CONFIG_CHANGE and SESSION entries are (store/marks.py)
            self._marks = {m: MagicMarks(m) for m in MARKED_MAGICS}
            try:
                # a refusal has changed no file, not even a short one's size
                trusted = recover(self)
                for m in self._marks.values():
                    m.load((ckpt.markers or {}).get(m.magic) if ckpt is not None else None, self.begin_index,
                           self.end_index, trusted)
                # recovery read the headers of the trusted record's data file through the
                # mapping (its index check): none of it stays resident in the member
                for mf in (*self.data.files, *self.index.files):
                    mf.release(0, mf.size)
                self.data.extend_short()
                self.index.extend_short()
                self._flushed_pos = self.write_pos  # recovery fsynced the data files
                if self.recovered_corrupt is None or self._trusted_record_fault() is None:
                    self._write_checkpoint_locked()  # else the old one stays: never trust a rotten header
                self._prepare_ahead()
            except BaseException:
                self.data.close()
                self.index.close()
                raise
            self._flusher = FlushService(
                self,
                self.sync_mode,
                flush_interval_ms / 1000,
                checkpoint_interval_ms / 1000,
                retention_check_interval_ms / 1000,
            )
            self._flusher.start()
        except BaseException:
            self._dir_lock.release()
            raise

    # --- appends -------------------------------------------------------------

    def pos_of_next(self) -> int:
        return self.write_pos

    def first_pos(self) -> int:
        return self.begin_pos

    def begins_file(self, pos: int) -> bool:
        return pos % self.data.file_size == 0

    def append_as_leader(
        self, bodies: Sequence[bytes], term: int, magic: int = MAGIC_NORMAL
    ) -> AppendedBatch:
        with self._lock:
            self._check_writable()
            if magic == MAGIC_NORMAL and (full := self.pressure_error()) is not None:
                raise full  # a leader's NOOP and followers' appends still go: see pressure_error
            self.check_bodies(bodies, term)
            first, orig_pos = self.end_index + 1, self.write_pos
            try:
                positions = self._encode_and_write(bodies, term, magic)
            except BaseException as e:
                self._undo_append(first, orig_pos)  # all or nothing: drop what an earlier file got
                raise self._as_store_error(e, "append") from e
            for m in self._marks.values():
                m.appended(first, self.end_index, magic)
            self._prepare_ahead()
        if self.sync_mode:
            self._flusher.request()
        return AppendedBatch(first, term, positions)

    def _encode_and_write(self, bodies: Sequence[bytes], term: int, magic: int) -> array[int]:
        """Encode the records into the scratch buffers, one run per data file, and write
        each run with one pwrite (plus one for its index units)."""
        positions: array[int] = array("q")
        index = self.end_index + 1
        chain = self.end_chain_crc
        k, n = 0, len(bodies)
        while k < n:
            f = self.data.ensure(self.write_pos)
            room = f.end - self.write_pos - BLANK_SIZE
            j, used = n, HEADER_SIZE * (n - k) + sum(map(len, bodies[k:]))  # all fit: the common case
            if used > room:  # the records that fit before the file's end
                j, used = k, 0
                while j < n and used + HEADER_SIZE + len(bodies[j]) <= room:
                    used += HEADER_SIZE + len(bodies[j])
                    j += 1
            if j == k:
                self._close_file(f)
                continue
            uf, ucap = self._unit_room(index)
            if j - k > ucap:
                j = k + ucap
                used = HEADER_SIZE * (j - k) + sum(map(len, bodies[k:j]))
            records, units, at, chain = encode_run(bodies, k, j, index, term, self.write_pos, chain, magic)
            positions.extend(at)
            f.write(self.write_pos - f.start, records)
            uf.write(index * INDEX_UNIT_SIZE - uf.start, units)
            index += j - k
            self.write_pos += used
            self.end_index = index - 1
            self.end_term = term
            self.end_chain_crc = chain
            k = j
        return positions

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> int:
        with self._lock:
            self._check_writable()
            self._first_record_index(data)
            orig_end, orig_pos = self.end_index, self.write_pos
            try:
                self._append_records(memoryview(data))
            except BaseException as e:
                self._undo_append(orig_end + 1, orig_pos)
                raise self._as_store_error(e, "append") from e
            self._prepare_ahead()
        if self.sync_mode:
            self._flusher.request()
        return self.end_index

    def _undo_append(self, first: int, orig_pos: int) -> None:
        """Drop what a failed append wrote from entry `first` (at `orig_pos`) on. If the undo
        fails too, the files no longer match what the store believes: it fails for good."""
        try:
            if self.end_index >= first:
                self._truncate_locked(first)
            # no record kept past `first`, but a failed write may have left record bytes past
            # the end (a recovery would bring back an append whose caller saw it fail), or a
            # blank closed the last file (the next push, which may fit there, would be refused
            # for its pos): zero all of it
            with self._sync_lock:
                self._zero_data_from(orig_pos, to_file_end=True)
            self.write_pos = orig_pos
        except (OSError, StoreError) as e:
            log.error("%s: undoing a failed append failed: %s; the store refuses further writes", self.dir, e)
            self.fail(e)

    def _as_store_error(self, e: BaseException, what: str) -> BaseException:
        """OS errors surface as DISK_FULL / DISK_ERROR, so callers see a response code; a
        full disk also marks the store full until retention finds room again."""
        err = os_error(e, f"{what} in {self.dir}") if isinstance(e, OSError) else e
        if isinstance(err, StoreError) and err.code == ResponseCode.DISK_FULL:
            self._no_space = True
        return err

    def _append_records(self, data: memoryview) -> None:
        off, n = 0, len(data)
        while off < n:
            if n - off < HEADER_SIZE:
                raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, f"{n - off} stray bytes after the last record")
            size = int.from_bytes(data[off + 4 : off + 8], "big", signed=True)
            f = self.data.ensure(self.write_pos)
            room = f.end - self.write_pos - BLANK_SIZE
            if size > room:
                if self.write_pos == f.start or size < HEADER_SIZE:
                    raise StoreError(
                        ResponseCode.UNEXPECTED_ARGUMENT, f"record of {size} bytes cannot be stored"
                    )
                self._close_file(f)
                continue
            uf, ucap = self._unit_room(self.end_index + 1)
            units = bytearray()
            res = scan(
                data, off, min(n, off + room), self.end_index + 1, self.write_pos,
                self.end_chain_crc, self.end_term, units=units, max_count=ucap,
            )
            if res.stop.startswith("corrupt") or res.stop in ("blank", "zero") or res.count == 0:
                # name the record that failed, not the start of the push
                raise push_error(res.stop, off + res.consumed, self.end_index + 1 + res.count)
            f.write(self.write_pos - f.start, data[off : off + res.consumed])
            uf.write((self.end_index + 1) * INDEX_UNIT_SIZE - uf.start, units)
            for m in self._marks.values():
                m.appended_units(self.end_index + 1, units, res.count)
            off += res.consumed
            self.write_pos += res.consumed
            self.end_index += res.count
            self.end_term = res.last_term
            self.end_chain_crc = res.last_chain

    def _prepare_ahead(self) -> None:
        """Have the next data and index files created ahead, on a thread, once the log is within
        half a file (at most AHEAD_MARGIN bytes) of the end of its last one: crossing into a new
        file then costs the appender no file system call (MappedFileList.prepare)."""
        for files, pos in ((self.data, self.write_pos), (self.index, (self.end_index + 1) * INDEX_UNIT_SIZE)):
            last = files.last
            if last is None:
                files.prepare(pos - pos % files.file_size)
            elif pos >= last.end - min(files.file_size // 2, AHEAD_MARGIN):
                files.prepare(last.end)

    def _close_file(self, f: MappedFile) -> None:
        """Write the blank record that closes `f` and move to the next file."""
        f.write(self.write_pos - f.start, BLANK.pack(MAGIC_BLANK, f.end - self.write_pos))
        self.write_pos = f.end

    def _unit_room(self, index: int) -> tuple[MappedFile, int]:
        """The index file for `index` and how many units fit in it from there."""
        p = index * INDEX_UNIT_SIZE
        uf = self.index.ensure(p)
        return uf, (uf.end - p) // INDEX_UNIT_SIZE

    def _check_writable(self) -> None:
        err = self.write_error()
        if err is not None:
            raise err

    def write_error(self) -> StoreError | None:
        if self._closed:
            return StoreError(ResponseCode.DISK_ERROR, "store is closed")
        if self._failed is not None:
            return StoreError(ResponseCode.DISK_ERROR, f"store failed: {self._failed}")
        if self._no_space:
            return StoreError(ResponseCode.DISK_FULL, f"no space left on the disk holding {self.dir}")
        return None

    def pressure_error(self) -> StoreError | None:
        if not self.disk_full:
            return None
        held = f" (retention held back: {self._retention_held_by})" if self._retention_held_by else ""
        return StoreError(ResponseCode.DISK_FULL, f"disk holding {self.dir} is full and retention can free "
                                                  f"nothing more{held}: refusing client appends")

    # --- reads ---------------------------------------------------------------

    def unit(self, index: int) -> tuple[int, int, int, int, int]:
        """The index unit of `index`: (magic, pos, size, index, term), repaired if damaged."""
        u = self.raw_unit(index)
        if u is None:
            self._repair_units(index)
            u = self.raw_unit(index)
            if u is None:
                raise CorruptEntryError(index, f"index unit of {index} is damaged")
        return u

    def indexes_with_magic(self, first: int, last: int, magic: int) -> list[int]:
        """The magics straight from the index files' bytes, or, for the rare entries a start
        looks up (MARKED_MAGICS), where the store noted them (store/marks.py)."""
        with self._lock:
            first, last = max(first, self.begin_index), min(last, self.end_index)
            m = self._marks.get(magic)
            if m is None:
                return self._scan_magic(first, last, magic)
            return m.find(first, last, self.begin_index, lambda a, b: self._scan_magic(a, b, magic))

    def _scan_magic(self, index: int, last: int, magic: int) -> list[int]:
        """Each unit read as eight native ints, every eighth is a magic (as stored, big-endian).
        Read with pread in chunks, not through the mapping: a scan of the whole log left the
        whole index mapped into the member. A unit inside the log without an entry's magic
        (zeros: an index page a power loss took) is damage: rebuilt from the data headers as
        `unit()` does, never skipped (the entry it hid may be the one looked for)."""
        want = int.from_bytes(magic.to_bytes(4, "big", signed=True), sys.byteorder, signed=True)
        out: list[int] = []
        repaired = -1  # the last index a repair covered: a unit still bad there is beyond repair
        while index <= last:
            uf = self.index.locate(index * INDEX_UNIT_SIZE)
            off = index * INDEX_UNIT_SIZE - uf.start
            n = min(last - index + 1, (uf.end - uf.start - off) // INDEX_UNIT_SIZE, MAGIC_SCAN_UNITS)
            got = uf.pread(off, n * INDEX_UNIT_SIZE)
            n = len(got) // INDEX_UNIT_SIZE
            if n == 0:
                raise StoreError(ResponseCode.DISK_ERROR, f"{uf.path} ends before offset {off}")
            words = array("i")
            words.frombytes(got[: n * INDEX_UNIT_SIZE])
            magics = words[0::8]
            if sum(magics.count(w) for w in _MAGIC_WORDS) != n:  # (count runs in C: the common case)
                bad = [k for k, w in enumerate(magics) if w not in _MAGIC_WORDS]
                if index + bad[0] <= repaired:
                    raise CorruptEntryError(index + bad[0], f"index unit of {index + bad[0]} is damaged")
                self._repair_units(index + bad[0], index + bad[-1])
                repaired = index + bad[-1]
                continue  # read the chunk again
            out.extend(index + k for k in positions_of(magics, want, 0, n))
            index += n
        return out

    def raw_unit(self, index: int) -> tuple[int, int, int, int, int] | None:
        p = index * INDEX_UNIT_SIZE
        files = self.index.files
        if not files or not files[0].start <= p < files[-1].end:
            return None
        uf = self.index.locate(p)
        u: tuple[int, int, int, int, int] = INDEX_UNIT.unpack_from(uf.mm, p - uf.start)
        if u[3] != index or u[0] not in ENTRY_MAGICS or u[2] < HEADER_SIZE:
            return None
        # the index is a cache of the data headers: a unit that disagrees with the header
        # it points at (a damaged pos, size or term) is rebuilt, never trusted
        files = self.data.files
        if not files or not files[0].start <= u[1] < files[-1].end:
            return None
        f = self.data.locate(u[1])
        off = u[1] - f.start
        if off + HEADER_SIZE > f.size:
            return None
        h = HEADER.unpack_from(f.mm, off)
        # not the magic: a valid magic flipped to another (NORMAL <-> CONFIG_CHANGE) is the
        # record's rot, which get/verify report; a rebuild from the header would hide it
        if (h[1], h[2], h[3], h[4]) != (u[2], u[3], u[4], u[1]):
            return None
        return u

    def _repair_units(self, index: int, upto: int | None = None) -> None:
        """Rebuild units from the nearest good one before `index` through `upto` (None:
        `index`) by walking data headers."""
        upto = index if upto is None else upto
        j = index - 1
        while j >= self.begin_index and self.raw_unit(j) is None:
            j -= 1
        u = self.raw_unit(j) if j >= self.begin_index else None
        start_pos = u[1] + u[2] if u is not None else self.begin_pos
        prev_chain = self.begin_chain_crc
        if u is not None:
            pf = self.data.locate(u[1])
            prev_chain = HEADER.unpack_from(pf.mm, u[1] - pf.start)[6]
        log.warning("%s: rebuilding index units %d..%d from the data files", self.dir, j + 1, upto)
        rebuild_units(self, j + 1, start_pos, upto, verify=False, prev_chain=prev_chain)

    def term_at(self, index: int) -> int:
        with self._lock:
            if index == self.begin_index - 1:
                return self.begin_term
            self._check_readable(index)
            return self.unit(index)[4]

    def tail_bytes(self, from_index: int) -> int | None:
        with self._lock:
            self._check_readable(from_index)
            pos = self.unit(from_index)[1]
            f = self.data.locate(pos)
            if self.write_pos < f.end:  # the open file: its last record ends at write_pos
                return self.write_pos - pos
            if self.write_pos > f.end:  # the log goes on in a later file: one read stops at f's end
                return None
            try:  # a full file, or one a BLANK closed: where its last record ends, the index says
                _, p, s, _, _ = self.unit(self.end_index)
            except CorruptEntryError:
                return None  # not known: the push is read (and the damage met) as any other
            return p + s - pos

    def read_raw(self, from_index: int, max_bytes: int) -> RawRange:
        with self._lock:
            self._check_readable(from_index)
            _, pos, size, _, _ = self.unit(from_index)
            f = self.data.locate(pos)
            limit = min(pos + max(max_bytes, size), f.end)
            # largest j whose record ends within limit (ends grow with j; other files end past f.end)
            lo, hi, end = from_index, self.end_index, pos + size
            if lo < hi and self.write_pos <= limit:
                # the whole tail fits (no record ends past write_pos), as a push of the tail asks:
                # the last record's unit, still checked (a rotten one is never sent unseen)
                try:
                    _, p, s, _, _ = self.unit(hi)
                except CorruptEntryError:
                    hi -= 1  # the records before it, as far as they fit
                else:
                    if p + s <= limit:
                        lo, end = hi, p + s
            while lo < hi:
                mid = (lo + hi + 1) // 2
                _, p, s, _, _ = self.unit(mid)
                if p + s <= limit:
                    lo, end = mid, p + s
                else:
                    hi = mid - 1
            base = memoryview(f.mm)
            view = base[pos - f.start : end - f.start]
            base.release()
            return RawRange(view, from_index, lo - from_index + 1)

    def get(self, index: int) -> DLedgerEntry:
        with self._lock:
            self._check_readable(index)
            try:
                return self._get_locked(index)
            except CorruptEntryError:
                raise
            except StoreError as e:
                if e.code != ResponseCode.DISK_ERROR:
                    raise
                raise CorruptEntryError(index, f"entry {index}: {e.message}") from e

    def _index_magic(self, index: int) -> int:
        return self.unit(index)[0]

    def _unit_runs(self, first: int, count: int) -> Iterator[tuple[int, bytes | None]]:
        """The index units of `count` entries from `first` as stored, a stretch per index file
        read in one slice; (index, None) for the rest once a file cannot give them so (the
        caller asks unit() for those). The caller holds the lock."""
        index, last = first, first + count - 1
        while index <= last:
            uf = self.index.locate(index * INDEX_UNIT_SIZE)
            off = index * INDEX_UNIT_SIZE - uf.start
            n = min(last - index + 1, (uf.end - uf.start - off) // INDEX_UNIT_SIZE)
            if n <= 0:
                yield index, None
                return
            yield index, uf.mm[off : off + n * INDEX_UNIT_SIZE]
            index += n

    def _index_units(self, first: int, count: int) -> bytes | None:
        """The units of `count` entries from `first` straight from the index files' bytes (a
        damaged one fails read_columns' array checks, and its per-record loop repairs it)."""
        with self._lock:
            if count <= 0 or first < self.begin_index or first + count - 1 > self.end_index:
                return None
            parts: list[bytes] = []
            for _, units in self._unit_runs(first, count):
                if units is None:
                    return None
                parts.append(units)
            return parts[0] if len(parts) == 1 else b"".join(parts)

    def check_magics(self, raw: RawRange) -> None:
        """LedgerStore.check_magics with the index's magics read in one pass: a record whose
        magic equals its unit's passes, as it does there (a damaged unit is rebuilt from that
        record's header); a mismatch, or a unit that cannot be read so, takes the check unit
        by unit, which repairs a damaged unit or names the rot. (A leader pushing committed
        entries to the slower follower spent a tenth of its CPU in a unit() per record.) Only
        the magic is compared here: rot in another header field of a record whose magic is
        intact is refused by the follower's scan, and the leader then finds its own copy
        damaged (the rejected-record path) one round trip later."""
        if raw.count <= 0:
            return
        try:
            want = self._index_magics(raw.first_index, raw.count)
        except StoreError:
            want = ()
        data, off, end = raw.data, 0, len(raw.data)
        unpack = MAGIC_SIZE.unpack_from
        for k in range(raw.count):
            if off + 8 > end:
                return  # a damaged size: the follower's own checks reject the push
            magic, size = unpack(data, off)
            if k >= len(want) or magic != want[k]:
                super().check_magics(raw)
                return
            off += max(size, HEADER_SIZE)

    def _index_magics(self, first: int, count: int) -> Sequence[int]:
        """Straight from the index files' bytes, as indexes_with_magic reads them (a damaged
        unit's magic may be wrong here: read_columns asks unit() again on a mismatch)."""
        out: list[int] = []
        with self._lock:
            for index, units in self._unit_runs(first, count):
                if units is None:
                    out.extend(self._index_magic(i) for i in range(index, first + count))
                    break
                words = array("i")
                words.frombytes(units)
                if sys.byteorder == "little":
                    words.byteswap()  # stored big-endian
                out.extend(words[0::8])
        return out

    def verify_entry(self, index: int) -> DLedgerEntry:
        """get (the header against the unit, magic included, and the chain CRC link), then the
        single-record check of a push (entry.scan: magic, channel, pos, ...).

        Read with pread, not through the mappings (`_verified_by_pread`): the scrub walks the
        whole committed log with this, and pages it faulted in stayed mapped into the member
        (readahead maps whole folios ahead of it), so its resident memory grew with the log.
        Only when something disagrees do the checks below, through the mappings, decide, name
        the fault and repair a damaged unit."""
        with self._lock:
            self._check_readable(index)
            entry = self._verified_by_pread(index)
            if entry is not None:
                return entry
            entry = self.get(index)
            self._check_record(index, entry.pos, entry.size, entry.term, None)
            return entry

    def _verified_by_pread(self, index: int) -> DLedgerEntry | None:
        """The entry at `index` when every check of `verify_entry` passes reading its unit, its
        record and its predecessor's unit and header with pread; None when any does not (the
        caller then checks again through the mappings, which say why)."""
        u = self._pread_unit(index)
        if u is None:
            return None
        magic, pos, size, _, term = u
        if index == self.begin_index:
            prev_chain, prev_term = self.begin_chain_crc, self.begin_term
        else:
            pu = self._pread_unit(index - 1)
            ph = self._pread_data(pu[1], HEADER_SIZE) if pu is not None else None
            if pu is None or ph is None:
                return None
            h = HEADER.unpack(ph)
            if (h[1], h[2], h[3], h[4]) != (pu[2], pu[3], pu[4], pu[1]):
                return None
            prev_chain, prev_term = int(h[6]), int(h[3])
        data = self._pread_data(pos, size)
        if data is None:
            return None
        try:
            entry = decode_entry(data, 0)
            res = scan(data, 0, size, index, pos, prev_chain, prev_term, strict=True, max_count=1)
        except CorruptRecord:
            return None
        if (entry.index, entry.pos, entry.size, entry.term, entry.magic) != (index, pos, size, term, magic) \
                or res.count != 1 or res.consumed != size \
                or not chain_follows(index, entry.term, entry.body_crc, prev_chain, entry.chain_crc):
            return None
        return entry

    def _pread_unit(self, index: int) -> tuple[int, int, int, int, int] | None:
        """The index unit of `index` read with pread, when it is well formed and names a record
        within a data file (not checked against the record: the caller does that)."""
        p = index * INDEX_UNIT_SIZE
        files = self.index.files
        if not files or not files[0].start <= p < files[-1].end:
            return None
        uf = self.index.locate(p)
        b = uf.pread(p - uf.start, INDEX_UNIT_SIZE)
        if len(b) < INDEX_UNIT_SIZE:
            return None
        u: tuple[int, int, int, int, int] = INDEX_UNIT.unpack(b)
        return u if u[3] == index and u[0] in ENTRY_MAGICS and u[2] >= HEADER_SIZE else None

    def _pread_data(self, pos: int, n: int) -> bytes | None:
        """`n` bytes of the log at `pos` with pread; None unless one data file holds them all."""
        files = self.data.files
        if not files or not files[0].start <= pos < files[-1].end:
            return None
        f = self.data.locate(pos)
        if pos + n > f.end:
            return None
        b = f.pread(pos - f.start, n)
        return b if len(b) == n else None

    def _get_locked(self, index: int) -> DLedgerEntry:
        magic, pos, size, _, term = self.unit(index)
        f = self.data.locate(pos)
        try:
            entry = decode_entry(f.mm, pos - f.start)
        except CorruptRecord as e:
            raise CorruptEntryError(index, f"entry {index} in {f.path}: {e.message}") from e
        if entry.index != index or entry.pos != pos or entry.size != size or entry.term != term \
                or entry.magic != magic:
            raise CorruptEntryError(
                index, f"{f.path} offset {pos - f.start}: record does not match index unit of {index}",
            )
        # the chain CRC covers index, term and body CRC: a damaged header field that
        # the unit cannot reveal (the unit may have been rebuilt from it) shows here
        prev = self.chain_at(index - 1)
        if not chain_follows(index, entry.term, entry.body_crc, prev, entry.chain_crc):
            raise CorruptEntryError(
                index,
                f"{f.path} offset {pos - f.start}: chain CRC of entry {index} does not "
                f"follow entry {index - 1}",
            )
        return entry

    def chain_at(self, index: int) -> int:
        with self._lock:
            if index == self.begin_index - 1:
                return self.begin_chain_crc
            self._check_readable(index)
            _, p, _, _, _ = self.unit(index)
            f = self.data.locate(p)
            return int(HEADER.unpack_from(f.mm, p - f.start)[6])

    def release_pages(self, first: int, last: int) -> None:
        """Unmap the pages of records `first`..`last` and of their index units (MappedFile.release),
        up to the page holding `last`'s end (it may hold the next record, released with the
        next range), and the RELEASE_BEHIND bytes before them: a fault maps a whole large
        folio of the page cache, so reading one record maps again pages of the one before."""
        with self._lock:
            first, last = max(first, self.begin_index), min(last, self.end_index)
            if first > last or self._closed:
                return
            try:
                lo = self._record_slot(first)[0]
                pos, size = self._record_slot(last)[:2]
            except StoreError:
                return  # a damaged unit: the scrub reports it; its pages stay
            _release(self.data, lo - RELEASE_BEHIND, pos + size)
            _release(self.index, first * INDEX_UNIT_SIZE - RELEASE_BEHIND, (last + 1) * INDEX_UNIT_SIZE)

    def _record_slot(self, index: int) -> tuple[int, int, int, int | None]:
        """From the index unit as written, not checked against the (maybe damaged) header."""
        p = index * INDEX_UNIT_SIZE
        uf = self.index.locate(p)
        magic, pos, size, idx, term = INDEX_UNIT.unpack_from(uf.mm, p - uf.start)
        if idx != index or magic not in ENTRY_MAGICS or size < HEADER_SIZE:
            raise CorruptEntryError(index, f"index unit of {index} is damaged: cannot repair its record")
        return pos, size, term, magic

    def _write_record(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        f = self.data.locate(pos)
        if pos + len(data) > f.end:
            raise StoreError(ResponseCode.DISK_ERROR, f"record at {pos} would cross the end of {f.path}")
        f.write(pos - f.start, data)
        try:
            with self._sync_lock:
                f.sync()
        except OSError as e:
            raise self._as_store_error(e, "repair") from e
        log.warning("%s: rewrote the record at %s offset %d (%d bytes) from the leader's copy",
                    self.dir, f.path.name, pos - f.start, len(data))

    # --- truncate, reset ------------------------------------------------------

    def truncate(self, from_index: int) -> None:
        with self._ckpt_lock, self._lock:
            self._check_writable()
            self._check_truncate(from_index)
            # the checkpoint first: one naming a record the truncate zeroes would make the next
            # open refuse the store (DISK_ERROR) after a crash between the two
            self.durable_index = min(self.durable_index, from_index - 1)
            try:
                self._write_checkpoint_locked()
            except (OSError, StoreError) as e:
                raise self._as_store_error(e, "truncate") from e  # nothing removed yet
            try:
                self._truncate_locked(from_index)
            except (OSError, StoreError) as e:
                # half-zeroed records: the files no longer match the state
                self.fail(e)
                raise self._as_store_error(e, "truncate") from e

    def _truncate_locked(self, from_index: int) -> None:
        if from_index > self.end_index:
            return
        if from_index == self.begin_index:
            new_pos, term, chain = self.begin_pos, self.begin_term, self.begin_chain_crc
        else:
            _, p, s, _, term = self.unit(from_index - 1)
            new_pos = p + s
            pf = self.data.locate(p)
            chain = HEADER.unpack_from(pf.mm, p - pf.start)[6]
        with self._sync_lock:
            self._zero_data_from(new_pos)
            self._zero_units(from_index, self.end_index + 1)
        self.write_pos = new_pos
        self._flushed_pos = min(self._flushed_pos, new_pos)
        self._units_synced = min(self._units_synced, from_index * INDEX_UNIT_SIZE)
        self.end_index = from_index - 1
        for m in self._marks.values():
            m.truncated(self.end_index)
        self.end_term = term
        self.end_chain_crc = chain
        self._trunc_floor = min(self._trunc_floor, self.end_index)
        self.durable_index = min(self.durable_index, self.end_index)

    def _zero_data_from(self, pos: int, to_file_end: bool = False) -> None:
        """Zero the records from `pos` to the write position (and a closing blank; with
        `to_file_end`, to the end of its file), drop later files, and fsync, so no recovery
        can bring the removed records back."""
        files = self.data.files
        if files and files[0].start <= pos < files[-1].end:
            f = self.data.locate(pos)
            in_file = f.start <= self.write_pos < f.end and not to_file_end
            end = self.write_pos - f.start if in_file else f.size
            f.zero(pos - f.start, max(end, pos - f.start))
            f.sync()
        self.data.drop_after(pos)

    def _zero_units(self, begin: int, end: int) -> None:
        """Zero the index units of [begin, end) and drop the index files after them."""
        p, q = begin * INDEX_UNIT_SIZE, end * INDEX_UNIT_SIZE
        files = self.index.files
        if files and files[0].start <= p < files[-1].end:
            uf = self.index.locate(p)
            uf.zero(p - uf.start, min(q, uf.end) - uf.start)
            uf.sync()
        self.index.drop_after(p)

    def reset(self, begin_index: int, begin_term: int, begin_chain_crc: int, begin_pos: int) -> None:
        """The checkpoint naming the new, empty log is written before a file is deleted: after
        a crash in between, recovery deletes the files before the new begin and cuts at the
        first record after it that does not chain on (a checkpoint naming a deleted record
        made the store refuse to open)."""
        with self._ckpt_lock, self._lock:
            self._check_writable()
            self._check_reset(begin_index)
            self.begin_index = begin_index
            self.begin_term = self.end_term = begin_term
            self.begin_chain_crc = self.end_chain_crc = begin_chain_crc
            self.begin_pos = self.write_pos = self._flushed_pos = begin_pos
            self._units_synced = begin_index * INDEX_UNIT_SIZE  # no index file yet: nothing to sync
            self.end_index = begin_index - 1
            for m in self._marks.values():
                m.reset(self.end_index)  # an empty log: complete
            self.committed_index = max(self.committed_index, begin_index - 1)
            self.durable_index = self.end_index
            # a flush running now must not record its (old log's) position as flushed: indexes
            # of the two logs say nothing of each other's positions
            self._trunc_floor = -2
            try:
                self._write_checkpoint_locked()
                with self._sync_lock:
                    self.data.drop_all()
                    self.index.drop_all()
            except (OSError, StoreError) as e:  # memory and disk disagree now: fail the store
                self.fail(e)
                raise self._as_store_error(e, "reset") from e

    # --- flush, checkpoint, retention (called from the flush thread) -----------

    def request_flush(self) -> None:
        self._flusher.request()

    def flush(self) -> int:
        self.flush_once()
        return self.durable_index

    def flush_once(self) -> None:
        """fsync the data written since the last flush and publish the durable index. One
        flush at a time (the flush thread, or `flush()` from a caller): a second one would
        reset the truncate floor the first relies on."""
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        with self._lock:
            target, target_pos = self.end_index, self.write_pos
            if target == self.durable_index and target_pos == self._flushed_pos:
                return
            files = [f for f in self.data.files if f.end > self._flushed_pos and f.start <= target_pos]
            self._trunc_floor = 1 << 62
        started = time.monotonic()
        with self._sync_lock:
            for f in files:
                if not f.closed:
                    f.sync()
        if self.fsync_observer is not None:
            self.fsync_observer(time.monotonic() - started)
        with self._lock:
            # set under the lock (a truncate after it lowers it again): entries a truncate
            # removed during the fsync, and what was re-appended there, are not durable
            if self._trunc_floor >= target:
                self._flushed_pos = target_pos
            durable = self._set_durable(min(target, self._trunc_floor))
        self._publish_durable(durable)

    def write_checkpoint(self) -> None:
        """The flush thread's periodic checkpoint. Its fsyncs run outside the store lock, so
        appends on the event loop never wait for them (they did: a stall every second);
        `_ckpt_lock` keeps truncate, reset and retention, which rewrite it, from interleaving."""
        with self._ckpt_lock:
            with self._lock:
                if self._closed:
                    return
                try:
                    reason = self._trusted_record_fault()
                    if reason is not None:
                        raise CorruptEntryError(self.durable_index, reason)
                    state, index_files, synced = self._checkpoint_state()
                except StoreError as e:  # CorruptEntryError too: a rotten header at the trusted point
                    # the previous checkpoint stays valid; the member repairs the record meanwhile
                    self._warn("checkpoint", "checkpoint skipped: %s", e.message)
                    return
            try:
                self._persist_checkpoint(state, index_files, synced)
            except OSError as e:
                err = self._as_store_error(e, "checkpoint")
                if not isinstance(err, StoreError) or err.code != ResponseCode.DISK_FULL:
                    raise
                # the previous checkpoint stays valid (truncate rewrites its own): retry later
                log.warning("%s: checkpoint not written: %s", self.dir, err.message)

    def _trusted_record_fault(self) -> str | None:
        """Why the record a checkpoint would trust (the durable one) fails verification, or
        None: the trusted point is read from its header, never from a damaged one."""
        durable = self.durable_index
        return self.verify(durable) if durable >= self.begin_index else None

    def _write_checkpoint_locked(self) -> None:
        self._persist_checkpoint(*self._checkpoint_state())

    def _checkpoint_state(self) -> tuple[dict[str, object], list[MappedFile], int]:
        """What the checkpoint says now, the index files that must be synced first, and the
        index byte through which units are fsynced once they are: every index file written
        since the last checkpoint up to the trusted record's unit, not only the newest (a file
        the log filled and left in between was otherwise never synced, yet trusted on open)."""
        durable = self.durable_index
        trusted = None
        if durable >= self.begin_index:
            _, p, _, _, term = self.unit(durable)
            f = self.data.locate(p)
            trusted = {"index": durable, "term": term, "pos": p, "chain_crc": HEADER.unpack_from(f.mm, p - f.start)[6]}
        state: dict[str, object] = {
            "version": 1,
            "committed_index": min(self.committed_index, durable),
            "begin_index": self.begin_index,
            "begin_term": self.begin_term,
            "begin_pos": self.begin_pos,
            "begin_chain_crc": self.begin_chain_crc,
            "trusted": trusted,
            "data_file_size": self.data.file_size,
            "index_file_size": self.index.file_size,
        }
        marks = {str(m.magic): m.state(self.begin_index, durable) for m in self._marks.values()}
        state["markers"] = {k: v for k, v in marks.items() if v is not None}
        hi = (durable + 1) * INDEX_UNIT_SIZE
        files = [uf for uf in self.index.files if uf.end > self._units_synced and uf.start < hi]
        return state, files, hi

    def _persist_checkpoint(self, state: dict[str, object], index_files: list[MappedFile], synced: int) -> None:
        """Callers hold `_ckpt_lock`, which guards `_units_synced` (truncate and reset lower it)."""
        with self._sync_lock:
            for uf in index_files:
                if not uf.closed:
                    uf.sync()  # index units up to the trusted point need no rebuild next time
        # (a unit `unit()` repairs later below this point is not synced again: a power loss
        # brings back the damage, which the next use repairs again)
        self._units_synced = max(self._units_synced, synced)
        write_atomic(self.dir / "checkpoint", state)

    def set_retention_floor(self, index: int | None, holder: str = "") -> None:
        with self._lock:
            self._retention_floor = index
            self._retention_holder = holder if index is not None else ""

    def _drop_covered(self, floor: int) -> None:
        self._compaction_floor = max(self._compaction_floor, floor)  # the flush thread's next pass

    def retention_hold(self) -> tuple[int | None, str]:
        with self._lock:
            return self._retention_floor, self._retention_holder

    def request_retention(self) -> None:
        # the floors a compaction waits for (a producer table saved, a follower's heartbeat)
        # move within a few heartbeats: look often for a while
        self._flusher.retention_soon(EAGER_RETENTION_S)

    def compaction_begin(self, through: int) -> int:
        with self._lock:
            nxt = through + 1
            if nxt <= self.begin_index or not self.data.files:
                return self.begin_index
            pos = self.unit(nxt)[1] if nxt <= self.end_index else self.write_pos
            files = self.data.files
            k = max((i for i, f in enumerate(files) if f.start <= pos), default=0)
            for f in reversed(files[: k + 1]):  # (never the last file: retention keeps it)
                first = self._first_index_in(f)
                if first is not None:
                    return max(first, self.begin_index)
            return self.begin_index

    @property
    def retention_held_by(self) -> str:
        return self._retention_held_by

    def run_retention(self) -> None:
        """Delete old data files when the disk fills, when they are older than `retention_hours`
        or a snapshot covers them, never one the live range needs."""
        with self._ckpt_lock, self._lock:
            if self._closed:
                return
            ratio, total = self._disk_usage()
            committed_floor = self.committed_index + 1
            floor = committed_floor
            if self._floor_only:  # nothing goes before the owner names a floor
                floor = committed_floor = self._retention_floor if self._retention_floor is not None else 0
            elif self._retention_floor is not None:
                floor = min(floor, self._retention_floor)
            # one list (a stat() per file) per pass: the floors below the committed one take a
            # prefix of it (eager retention, after a compaction request, runs passes every few hundred ms)
            listed = self._retention_candidates(committed_floor)  # (floor <= committed_floor)
            below = _below(listed, floor)
            plan = self._plan_retention(below, ratio, total)
            self._note_held_back(floor, committed_floor, listed, plan.delete, ratio, total)
            # a snapshot (or `dledger compact`) covers these whatever the disk usage, within the same
            # floors; so do files past the age limit
            covered = len(_below(listed, min(floor, self._compaction_floor)))
            aged = aged_out(below, self._clock(), self.retention_hours) if self.retention_hours > 0 else 0
            if max(plan.delete, covered, aged):
                self._drop_first_data_files(max(plan.delete, covered, aged))
            self.disk_full = plan.disk_full
            if not plan.disk_full:
                self._no_space = False  # room again: writes may be tried anew
            if plan.disk_full:
                log.error("disk full: usage %.0f%% and nothing more can be deleted%s", ratio * 100,
                          f" (held back by {self._retention_held_by})" if self._retention_held_by else "")

    def _plan_retention(self, candidates: list[Candidate], ratio: float, total: int) -> Plan:
        return plan_deletions(
            candidates, ratio, total, self._clock(), self.file_reserved_hours,
            self.check_expired_ratio, self.force_clean_ratio, self.force_clean_until,
            self.disk_full_ratio,
        )

    def _note_held_back(self, floor: int, committed_floor: int, listed: list[tuple[int, Candidate]], deleting: int,
                        ratio: float, total: int) -> None:
        """Record (and log once) when a follower's floor keeps files retention would delete:
        the leader keeps what a live follower needs (a plain log's follower heard from
        recently, one installing a snapshot, one being repaired), and says so instead of
        failing silently."""
        held = ""
        if floor < committed_floor and self._plan_retention(_below(listed, committed_floor), ratio,
                                                            total).delete > deleting:
            held = f"{self._retention_holder} needs index {floor}"
        if held and not self._retention_held_by:
            log.warning("retention under disk pressure (usage %.0f%%) keeps files still needed: %s",
                        ratio * 100, held)
        self._retention_held_by = held

    def _retention_candidates(self, floor: int) -> list[tuple[int, Candidate]]:
        """Leading data files whose every entry lies below `floor`, each with the first index
        of the file after it (its entries lie below that); never the last file."""
        out = []
        files = self.data.files
        for f, nxt in itertools.pairwise(files):
            first_next = self._first_index_in(nxt)
            if first_next is None or first_next > floor:
                break
            out.append((first_next, Candidate(f.size, _mtime(f))))
        return out

    def _first_index_in(self, f: MappedFile) -> int | None:
        h = HEADER.unpack_from(f.mm, 0)
        if h[0] in ENTRY_MAGICS and h[4] == f.start and self.begin_index <= h[2] <= self.end_index:
            return int(h[2])
        return None

    def _drop_first_data_files(self, n: int) -> None:
        """Move the log begin past the first `n` data files, checkpoint it, then delete them:
        after a crash in between, recovery deletes the leftovers (the other order left a
        checkpoint naming deleted files: every read failed after a reopen)."""
        nxt = self.data.files[n]
        new_begin = HEADER.unpack_from(nxt.mm, 0)[2]
        _, p, _, _, term = self.unit(new_begin - 1)
        pf = self.data.locate(p)
        self.begin_chain_crc = HEADER.unpack_from(pf.mm, p - pf.start)[6]
        self.begin_term = term
        self.begin_index = new_begin
        self.begin_pos = nxt.start
        self._write_checkpoint_locked()
        with self._sync_lock:
            for _ in range(n):
                log.info("retention: deleting %s", self.data.files[0].path)
                self.data.drop_first()
            while self.index.files and self.index.files[0].end <= new_begin * INDEX_UNIT_SIZE:
                self.index.drop_first()

    def fail(self, error: BaseException) -> None:
        self._failed = error

    # --- currterm --------------------------------------------------------------

    def save_term(self, term: int, voted_for: str | None) -> None:
        try:
            write_currterm(self.dir / CURRTERM, term, voted_for)  # upstream's form: it reads it too
        except OSError as e:
            raise os_error(e, f"saving the term in {self.dir}") from e
        self._term_vote = TermVote(term, voted_for)

    def load_term(self) -> TermVote:
        return self._term_vote

    def _read_term(self) -> TermVote:
        try:
            tf = read_currterm(self.dir)  # offline.py's rule: missing is None, damaged an error
        except UnreadableFile as e:
            raise StoreError(ResponseCode.DISK_ERROR, f"{e.message}; refusing to forget a vote") from e
        return TermVote(0, None) if tf is None else TermVote(tf.term, tf.voted_for)

    # --- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._flusher.stop()
        if self._failed is None:
            self.flush_once()
            self.write_checkpoint()
        with self._lock:
            self._closed = True
            self.data.close()
            self.index.close()
            self._dir_lock.release()  # last: another writer may open the directory now


AHEAD_MARGIN = 256 << 20  # how far before the end of its last file the next one is created ahead
MARKED_MAGICS = (MAGIC_CONFIG_CHANGE, MAGIC_SESSION)  # rare entries a start looks up: kept (store/marks.py)
MAGIC_SCAN_UNITS = 1 << 17  # index units per read of indexes_with_magic (4 MiB)
# the entry magics as `_scan_magic` reads them (big-endian ints as native words)
_MAGIC_WORDS = frozenset(int.from_bytes(m.to_bytes(4, "big", signed=True), sys.byteorder, signed=True)
                         for m in ENTRY_MAGICS)
RELEASE_BEHIND = 4 << 20  # twice the largest folio (2 MiB) a fault may map at once


def _release(files: MappedFileList, lo: int, hi: int) -> None:
    """Release the pages of logical bytes [lo, hi) of `files`: from the page holding `lo` (the
    rest of it was read with the records before) to the last whole page before `hi`."""
    lo -= lo % mmap.PAGESIZE
    for f in files.files:
        if f.end > lo and f.start < hi:
            f.release(max(lo, f.start) - f.start, min(hi, f.end) - f.start)


def _below(listed: list[tuple[int, Candidate]], floor: int) -> list[Candidate]:
    """The leading candidates whose entries all lie below `floor` (the first indexes grow)."""
    out = []
    for first_next, c in listed:
        if first_next > floor:
            break
        out.append(c)
    return out


def _mtime(f: MappedFile) -> float:
    try:
        return f.path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
