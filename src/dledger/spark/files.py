"""`format("dledger-files")`: a member's store directory read offline, read-only (docs/format.md, docs/spark.md).

Nothing is written and no recovery runs, so it is safe on a copy, on a stopped
member, or (for the committed part) next to a live one.

Partitions: a data file is cut every `bytesPerPartition` bytes. A task starts at
the first record at or after its start offset and reads the records that start
before its end offset (the last one may run past it), so each record is read by
exactly one task. Record boundaries come from the `index/` files (a binary
search for the first index whose unit has pos >= the offset), never from
guessing in the data bytes, and each is checked against the data headers of the
record there and of the one before it. A task that starts mid-file is given the
header of the record before its first (its chain CRC and term), and the task
before it checks at its end that it stopped exactly after that record, with
that chain CRC: the chain is verified across cuts as in one scan. Without a
usable index (missing, damaged, not covering the file) a file is one task, as
before, and the reason is logged. Cuts are placed at indexes up to the
committed index + 1 only: an uncommitted tail stays in one task. The driver
reads the first record header of each file; the last task of file k gets the
first header of file k+1, so chains are checked across files without reading a
record twice.

Filters on `index`, `term` and `group` (pushFilters) drop whole tasks (the
index tells which indexes a byte range holds, their first records which
terms), start a task at the first index wanted (a cut at that index) and end it
after the last; rows are masked exactly. A declared narrower schema
(`.schema("index long, term long")`) prunes columns; without `body`, bodies are
not copied out of the mapping but still CRC-checked in place, unless
`verifyBodies` is false.

What is validated, for every record read (the header rules are entry.record_fault's, the
ones recovery and followers apply; the directory, its file names and the checkpoint are read
through store/offline.py, as recovery and `dledger store inspect` read them):
- magic (NORMAL, NOOP, CONFIG_CHANGE; a blank 0xFFFFFFFF closes a file and its
  length must reach the end of the file), size (48 + body size, within the file),
  channel 0;
- index continuity (within a file, and file k's last index + 1 == file k+1's
  first index), pos (a record's own logical position; file k+1 starts at the
  offset in its name), terms never going down;
- body CRC-32 (not with verifyBodies=false on a body-less schema), and the
  chain CRC of every record from its predecessor's (across files and cuts
  too). The first record of the directory is checked against the checkpoint's
  `begin_chain_crc` (0 for a log that begins at index 0).
- the log reaches the checkpoint's committed index (committed entries are never
  removed, so a log that ends before it lost data); not when a filter left out
  the task that holds the end of the log.
- Not read: `currterm`. The `index/` files are read by the driver only, to
  find where to cut files (and what a filter lets it skip); the records
  themselves are always validated from the data files.

Only records up to the committed index of `checkpoint` are read (all with
`includeUncommitted`, where a torn tail past the committed index ends the
read with a warning, as recovery would cut it). A store without dledger's
checkpoint (upstream DLedger's: it records no committed index, so read it with
`includeUncommitted`) has no torn tail but a last record cut short: the driver
first applies recovery's rule (store/verdict.py) and fails the read where a
member would refuse to start. Upstream's records, whose CRC fields are 0, are
read unverified (entry.unverified).

A task's records are checked in C where the extension is built
(`dledger._records.scan_entries`: the common case, rows out as the columns of
a columnar READ answer, ~0.3 us a row against ~2 us); any record it leaves (a
fault, a limit, upstream's) goes through the Python loop below, which names it.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from dledger import entry
from dledger.broker.confirm_file import read_confirm
from dledger.entry import (
    BLANK,
    ENTRY_MAGICS,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MAGIC_NORMAL,
    chain_crc,
    chain_follows,
    magic_stop,
    record_fault,
    unverified,
)
from dledger.spark.options import (
    FILES_OPTIONS,
    OptionError,
    catalog_hint,
    check_names,
    get_bool,
    get_str,
    no_options,
)
from dledger.spark.pushdown import Pushed, push
from dledger.spark.schema import (
    ARROW_ENTRY_SCHEMA,
    ARROW_RECORD_SCHEMA,
    ENTRY_SCHEMA,
    RECORD_SCHEMA,
    buffers_batch,
    declared_columns,
    entry_batch,
)
from dledger.store.offline import (
    Checkpoint,
    UnreadableFile,
    chain_before,
    derive_begin_of,
    first_gap,
    list_files,
    read_header,
)
from dledger.store.offline import read_checkpoint as _read_checkpoint
from dledger.store.verdict import judge

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

log = logging.getLogger(__name__)

BATCH_ROWS = 4096  # rows per Arrow batch
FAST_BYTES = 8 << 20  # record bytes per call of the C loop at most: a few ms, then the GIL is free
NO_LIMIT = (1 << 63) - 1
# Bytes of a data file per task: 8 tasks for a full 1 GiB data file. Measured (one core, page
# cache): a task scans 400 MiB/s of 1 KiB records, 85 MiB/s of 100 B records, 450 MiB/s of
# 16 KiB ones, so 128 MiB is 0.3-1.5 s of work against a task overhead of tens of ms. On Spark
# (local[2], a 480 MiB file) 32m to 256m read at the same rate, 8m took twice as long. It is
# also Spark's own default for files (spark.sql.files.maxPartitionBytes).
DEFAULT_BYTES_PER_PARTITION = 128 << 20
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


class CorruptStoreError(RuntimeError):
    """A record failed validation; the message names the file and the offset in it."""


@dataclass(frozen=True, slots=True)
class Head:
    """A record header, as the driver read it (the first of a file, or the one before a cut)."""

    index: int
    term: int
    pos: int
    chain_crc: int
    body_crc: int


@dataclass
class FilePartition(InputPartition):
    """A byte range of one data file: its records from `scan_from` to `end_pos` (the whole
    rest of the file when None); `next_head` is the next file's first record (None for the
    last file, and for a task that does not end its file)."""

    member: str
    group: str
    path: str
    file_start: int  # logical position of the file's first byte (its name)
    scan_from: int  # logical position of the first record to read (the log begin may lie inside)
    first_index: int
    prev_chain: int | None  # chain CRC before the first record, when known
    next_head: Head | None
    last_index: int  # read records up to this index (inclusive)
    committed_index: int
    begin_index: int
    records: bool = False  # mode "records": one row per record with validation results
    prev_term: int = -1  # term of the record before the first (a task that starts mid-file)
    # a task that ends before its file does: it reads the records that start before
    # `end_pos` and must stop exactly after `end_link`, the record the next task starts after
    end_pos: int | None = None
    end_link: Head | None = None
    emit_from: int = 0  # rows below this index are validated but not returned (index filter)
    term_lo: int = 0  # rows with a term outside [term_lo, term_hi) are not returned (term filter)
    term_hi: int | None = None
    bodies: bool = True  # copy bodies out (False: the declared schema has no body column)
    verify_bodies: bool = True  # check body CRCs (False: only with bodies=False and verifyBodies=false)


@dataclass(frozen=True, slots=True)
class StoreLayout:
    member: str
    group: str
    committed_index: int
    begin_index: int
    begin_pos: int
    begin_chain_crc: int | None
    files: list[tuple[Path, int, int]]  # (path, logical start, size)
    store_dir: Path  # the directory holding data/ and index/ (commitlog/ for a broker replica)
    # dledger's checkpoint names what was fsynced: damage past it is a torn tail. Without it
    # (upstream DLedger's store, a lost checkpoint) only a last record cut short is (plan)
    proven: bool = True


def _meets(lo: int, hi: int | None, want_lo: int, want_hi: int | None) -> bool:
    """Whether [lo, hi) meets [want_lo, want_hi) (None: unbounded)."""
    return (want_hi is None or lo < want_hi) and (hi is None or hi > want_lo)


def read_checkpoint(store_dir: Path) -> Checkpoint | None:
    """The checkpoint (store/offline.py), read without writing anything; None when missing.
    An unreadable one fails the read (CorruptStoreError): without it the committed index,
    so what the read may return, is unknown."""
    try:
        ckpt = _read_checkpoint(store_dir)
    except UnreadableFile as e:
        raise CorruptStoreError(e.message) from e
    if ckpt is None:
        log.warning("%s has no checkpoint: no entry is known committed (upstream DLedger's stores have none): "
                    "read them with includeUncommitted=true", store_dir)
    return ckpt


def layout(store_dir: Path, group: str | None = None, member: str | None = None) -> StoreLayout:
    """What the driver learns from the directory listing and the checkpoint (a broker
    replica's directory: its commitlog/, committed up to its confirmed index)."""
    confirmed: int | None = None
    if (store_dir / "commitlog").is_dir():
        member, group = member or store_dir.resolve().name, group or store_dir.resolve().parent.name
        confirmed = read_confirm(store_dir)[1]
        store_dir = store_dir / "commitlog"
    data_dir = store_dir / "data"
    if not data_dir.is_dir():
        raise OptionError(f"{store_dir} is not a dledger store directory (no data/ in it)")
    ckpt = read_checkpoint(store_dir)
    listed = list_files(data_dir)
    if (gap := first_gap(listed)) is not None:
        a, b = gap
        raise CorruptStoreError(f"{b.path}: data file starts at {b.start}, but {a.path.name} ends at {a.end} "
                                "(a data file is missing or has the wrong size)")
    begin = ckpt.begin if ckpt is not None else None
    if begin is None:  # as recovery: the first record of the first file
        first = listed[0] if listed else None
        begin = derive_begin_of(first.path if first else None, first.start if first else 0,
                                first.size if first else 0)
    begin_chain = begin.chain_crc
    if begin_chain is None and listed and listed[0].start <= begin.pos < listed[0].end:
        # the record before the begin is gone: the chain before it is the one the first record follows
        h = read_header(listed[0].path, begin.pos - listed[0].start)
        begin_chain = chain_before(h) if h is not None else None
    return StoreLayout(
        member=member or store_dir.resolve().name,
        group=group or store_dir.resolve().parent.name,
        committed_index=confirmed if confirmed is not None else (ckpt.committed_index if ckpt else -1),
        begin_index=begin.index,
        begin_pos=begin.pos,
        begin_chain_crc=begin_chain,
        files=[(f.path, f.start, f.size) for f in listed],
        store_dir=store_dir,
        proven=confirmed is not None or (ckpt is not None and ckpt.proves_durable),
    )


def _first_head(path: Path, offset: int) -> Head | None:
    """The header of the record at `offset` of `path` (None: no record there yet)."""
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(HEADER_SIZE)
    if len(raw) < 8 or not any(raw[:8]):
        return None
    magic = int.from_bytes(raw[:4], "big", signed=True)
    if magic not in ENTRY_MAGICS or len(raw) < HEADER_SIZE:
        raise CorruptStoreError(f"{path}: corrupt record at offset {offset}: bad magic {magic} in the first record")
    _, _size, index, term, pos, _ch, ccrc, bcrc, _bsize = HEADER.unpack(raw)
    return Head(index, term, pos, ccrc, bcrc)


# --- the index files, for cutting data files ----------------------------------------------------------------


class IndexUnavailable(Exception):
    """The index files cannot tell where records start (missing, damaged, not matching the data)."""


@dataclass(frozen=True, slots=True)
class Unit:
    """An index unit (docs/format.md): magic, pos, size, index, term."""

    magic: int
    pos: int
    size: int
    index: int
    term: int


class IndexFiles:
    """The `index/` files of a store, read-only (pread, nothing mapped, nothing written)."""

    def __init__(self, index_dir: Path) -> None:
        self.dir = index_dir
        if not index_dir.is_dir():
            raise IndexUnavailable(f"{index_dir} is missing")
        listed = list_files(index_dir)
        self.files: list[tuple[int, int, Path]] = [(f.start, f.size, f.path) for f in listed]
        if not self.files:
            raise IndexUnavailable(f"{index_dir} holds no index file")
        if (gap := first_gap(listed)) is not None:
            a, b = gap
            raise IndexUnavailable(f"{b.path} starts at {b.start}, but {a.path.name} ends at {a.end}")
        self._starts = [start for start, _, _ in self.files]
        last_start, last_size, _ = self.files[-1]
        self.end_index = (last_start + last_size) // INDEX_UNIT_SIZE  # no unit at or past this index
        self._fds: dict[int, int] = {}
        self.reads = 0  # units read (a binary search reads few)

    def unit(self, index: int) -> Unit | None:
        """The unit of `index`; None where no index file holds it or it was never written (zeros)."""
        at = index * INDEX_UNIT_SIZE
        k = bisect.bisect_right(self._starts, at) - 1
        if index < 0 or k < 0:
            return None
        start, size, path = self.files[k]
        if at + INDEX_UNIT_SIZE > start + size:
            return None
        fd = self._fds.get(k)
        if fd is None:
            fd = self._fds[k] = os.open(path, os.O_RDONLY)
        raw = os.pread(fd, INDEX_UNIT_SIZE, at - start)
        self.reads += 1
        if len(raw) < INDEX_UNIT_SIZE or not any(raw):
            return None
        return Unit(*INDEX_UNIT.unpack(raw))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> IndexFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_index_at(pos_of: Callable[[int], int | None], lo: int, hi: int, start: int) -> int:
    """The first index in [lo, hi) whose record starts at or after logical position `start`
    (hi when none does): a binary search over the index units, `pos_of(i)` being the pos in
    unit i. Positions grow with the index, so the search is exact on a sound index; a unit
    that is missing (None: never written, past the end of the index) counts as at or after
    `start`, so the search stops where the index stops. The answer is only a candidate:
    `boundary_at` checks it against the data."""
    while lo < hi:
        mid = (lo + hi) // 2
        p = pos_of(mid)
        if p is None or p >= start:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True, slots=True)
class Boundary:
    """Where a task starts inside a file: record `index` at `pos`, after record `prev`."""

    index: int
    pos: int
    term: int
    prev: Head


def _header_at(fd: int, path: str, file_start: int, pos: int) -> tuple[int, ...]:
    raw = os.pread(fd, HEADER_SIZE, pos - file_start)
    if len(raw) < HEADER_SIZE:
        raise IndexUnavailable(f"{path}: no record header at offset {pos - file_start}")
    return HEADER.unpack(raw)


def boundary_at(units: IndexFiles, fd: int, path: str, file_start: int, scan_from: int, file_end: int,
                index: int) -> Boundary | None:
    """Record `index` as the first record of a task, with the header of the record before it.

    The units of `index` and `index - 1` must agree with the data headers at their pos (magic,
    size, index, term, pos) and the two records must be adjacent, both in this file after
    `scan_from`: then `index` starts right after a record that starts before it, whatever the
    rest of the index holds. None when the index holds no unit for it (not written yet);
    IndexUnavailable when a unit contradicts the data (a damaged index)."""
    u, up = units.unit(index), units.unit(index - 1)
    if u is None or up is None:
        return None
    problems = []
    if u.index != index or up.index != index - 1:
        problems.append(f"units of index {index - 1}, {index} hold indexes {up.index}, {u.index}")
    elif not scan_from <= up.pos < u.pos < file_end or up.pos + up.size != u.pos:
        problems.append(f"units of index {index - 1}, {index} hold pos {up.pos} (size {up.size}), {u.pos}, "
                        f"not adjacent records in {path} [{scan_from}, {file_end})")
    else:
        for unit in (up, u):
            magic, size, idx, term, pos, _ch, _ccrc, _bcrc, _bsize = _header_at(fd, path, file_start, unit.pos)
            if (magic, size, idx, term, pos) != (unit.magic, unit.size, unit.index, unit.term, unit.pos):
                problems.append(f"unit {unit} does not match the record header at offset {unit.pos - file_start} "
                                f"(magic {magic}, size {size}, index {idx}, term {term}, pos {pos})")
                break
    if problems:
        raise IndexUnavailable(f"{units.dir}: " + "; ".join(problems))
    h = _header_at(fd, path, file_start, up.pos)
    return Boundary(index, u.pos, u.term, Head(h[2], h[3], h[4], h[6], h[7]))


def file_boundaries(units: IndexFiles, path: Path, file_start: int, scan_from: int, file_end: int,
                    first_index: int, hi: int, step: int, cut_at: Sequence[int] = ()) -> list[Boundary]:
    """Where the tasks of one data file start after its first: the first record at or after
    every `step` bytes of the file, and the records `cut_at` (a filter's first index); the
    file's indexes are [first_index, hi). Sorted, without repeats; a cut the index cannot
    place is left out (that task then reads on to the next one)."""
    def pos_of(i: int) -> int | None:
        u = units.unit(i)
        return None if u is None else u.pos

    found: dict[int, Boundary] = {}
    with open(path, "rb") as f:
        fd = f.fileno()
        wanted = [i for i in cut_at if first_index < i < hi]
        for s in range(file_start + step, file_end, step):
            if s <= scan_from:
                continue
            i = first_index_at(pos_of, first_index + 1, hi, s)
            if i < hi:
                wanted.append(i)
        for i in sorted(set(wanted)):
            b = boundary_at(units, fd, str(path), file_start, scan_from, file_end, i)
            if b is not None:
                found[i] = b
    return [found[i] for i in sorted(found)]


# --- planning ---------------------------------------------------------------------------------------------------


def plan(store_dir: Path, include_uncommitted: bool, records: bool = False, group: str | None = None,
         member: str | None = None, bytes_per_partition: int = DEFAULT_BYTES_PER_PARTITION,
         pushed: Pushed | None = None, bodies: bool = True, verify_bodies: bool = True) -> list[FilePartition]:
    """The tasks of a read: each data file that holds records in the range to read, cut
    every `bytes_per_partition` bytes where the index files allow, less the tasks that the
    `pushed` filters rule out (by the indexes and terms each one holds)."""
    lay = layout(store_dir, group, member)
    if not lay.proven:
        _refuse_as_recovery(lay, records)
    last_index = NO_LIMIT if include_uncommitted else lay.committed_index
    want = pushed or Pushed()
    if want.empty or (want.groups is not None and lay.group not in want.groups):
        log.info("%s: the filters %s rule out every row of group %s", store_dir, want, lay.group)
        return []
    heads: list[tuple[Path, int, int, int, Head]] = []
    for path, start, size in lay.files:
        if start + size <= lay.begin_pos:
            continue  # wholly before the log begin (about to be deleted)
        scan_from = max(start, lay.begin_pos)
        h = _first_head(path, scan_from - start)
        if h is None:
            continue  # allocated, nothing written yet
        if h.pos != scan_from:
            raise CorruptStoreError(f"{path}: corrupt record at offset {scan_from - start}: pos {h.pos}, "
                                    f"expected {scan_from}")
        heads.append((path, start, size, scan_from, h))
    task_last = last_index if want.index_hi is None else min(last_index, want.index_hi - 1)
    index = _Index(lay.store_dir / "index")
    out: list[FilePartition] = []
    try:
        for k, (path, start, size, scan_from, h) in enumerate(heads):
            if h.index > task_last:
                break
            nxt = heads[k + 1][4] if k + 1 < len(heads) else None
            if not (_meets(h.index, nxt.index if nxt else None, want.index_lo, want.index_hi)
                    and _meets(h.term, nxt.term + 1 if nxt else None, want.term_lo, want.term_hi)):
                continue
            prev_chain = None
            if k == 0 and h.index == lay.begin_index:
                prev_chain = lay.begin_chain_crc if lay.begin_chain_crc is not None else (0 if h.index == 0 else None)
            cuts = [want.index_lo] if h.index < want.index_lo else []
            bounds: list[Boundary] = []
            # cuts at indexes up to committed + 1 only: everything before such a cut is committed,
            # so sound, and an uncommitted tail stays in one task, where a torn record ends the
            # read as recovery would cut it (a later task would read on past it)
            hi = min(nxt.index if nxt else NO_LIMIT, lay.committed_index + 2)
            if (start + size - scan_from > bytes_per_partition or cuts) and hi > h.index + 1:
                bounds = index.boundaries(path, start, scan_from, start + size, h.index, hi, bytes_per_partition,
                                          cuts)
            starts: list[tuple[int, int, int, int | None, int, Boundary | None]] = [
                (scan_from, h.index, h.term, prev_chain, -1, None)]
            starts += [(b.pos, b.index, b.term, b.prev.chain_crc, b.prev.term, b) for b in bounds]
            for j, (pos, first, term, chain, prev_term, _) in enumerate(starts):
                following = starts[j + 1][5] if j + 1 < len(starts) else None
                if first > task_last:
                    break
                # a task holds indexes [first, the next task's first) and terms from its
                # first record's to the next task's first record's (terms never go down)
                edge = following or nxt
                if not (_meets(first, edge.index if edge else None, want.index_lo, want.index_hi)
                        and _meets(term, edge.term + 1 if edge else None, want.term_lo, want.term_hi)):
                    continue
                out.append(FilePartition(
                    lay.member, lay.group, str(path), start, pos, first, chain,
                    nxt if following is None else None, task_last, lay.committed_index, lay.begin_index, records,
                    prev_term=prev_term,
                    end_pos=following.pos if following is not None else None,
                    end_link=following.prev if following is not None else None,
                    emit_from=want.index_lo, term_lo=want.term_lo, term_hi=want.term_hi,
                    bodies=bodies, verify_bodies=verify_bodies or bodies))
    finally:
        index.close()
    log.info("%s: %d tasks over %d data files, committed index %d", store_dir, len(out), len(heads),
             lay.committed_index)
    return out


def _refuse_as_recovery(lay: StoreLayout, records: bool) -> None:
    """A store without dledger's checkpoint (upstream DLedger's, or one whose checkpoint was
    lost): a task past the committed index ends quietly at a record that fails its check, as
    at a torn tail, but here nothing names what was fsynced, so that is only right for a last
    record cut short. The driver applies recovery's own rule first (store/verdict.py, one
    scan of the data): where a member would refuse to start, entries mode fails naming the
    file, offset and reason; records mode (which reports damage row by row) logs it."""
    v = judge(lay.store_dir)
    if v.unverified:
        log.info("%s: %d records of upstream DLedger's (CRC fields 0) read unverified", lay.store_dir, v.unverified)
    if not v.refusal:
        return
    if records:
        log.warning("%s: a member would refuse to start on this store: %s", lay.store_dir, v.refusal)
        return
    raise CorruptStoreError(f"{lay.store_dir}: a member would refuse to start on this store: {v.refusal}")


class _Index:
    """The planner's view of the index files: opened on first use; whatever they cannot
    tell (missing, damaged) leaves a file uncut, logged once per cause."""

    def __init__(self, index_dir: Path) -> None:
        self.dir = index_dir
        self.files: IndexFiles | None = None
        self.unusable: str | None = None

    def boundaries(self, path: Path, file_start: int, scan_from: int, file_end: int, first_index: int, hi: int,
                   step: int, cuts: Sequence[int]) -> list[Boundary]:
        if self.unusable is not None:
            return []
        try:
            if self.files is None:
                self.files = IndexFiles(self.dir)
        except (IndexUnavailable, OSError) as e:
            self.unusable = str(e)
            log.warning("%s: index files unusable (%s): one task per data file", self.dir.parent, e)
            return []
        try:
            return file_boundaries(self.files, path, file_start, scan_from, file_end, first_index,
                                   min(hi, self.files.end_index), step, cuts)
        except (IndexUnavailable, OSError) as e:
            log.warning("%s: the index does not match the data (%s): one task for this data file", path, e)
            return []

    def close(self) -> None:
        if self.files is not None:
            self.files.close()


# --- scanning one file ------------------------------------------------------------------------------------


@dataclass
class _Rows:
    """Column buffers of the rows being built."""

    index: list[int] = field(default_factory=list)
    term: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    magic: list[int] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)
    bcrc: list[int] = field(default_factory=list)
    bsize: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    error: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.index)


def _records_batch(p: FilePartition, r: _Rows) -> pa.RecordBatch:
    n = len(r)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([p.member] * n, pa.string()),
            pa.array([p.group] * n, pa.string()),
            pa.array(r.index, pa.int64()),
            pa.array(r.term, pa.int64()),
            pa.array(r.pos, pa.int64()),
            pa.array(r.magic, pa.int32()),
            pa.array(r.chain, pa.int64()),
            pa.array(r.bcrc, pa.int64()),
            pa.array(r.bsize, pa.int32()),
            pa.array([p.path] * n, pa.string()),
            pa.array(r.offset, pa.int64()),
            pa.array(r.error, pa.string()),
        ],
        schema=ARROW_RECORD_SCHEMA,
    )


def read_file(p: FilePartition) -> Iterator[pa.RecordBatch]:
    """Validate the records of one task (a data file, or a byte range of one) and yield
    them as Arrow batches.

    Entries mode: committed NORMAL entries; the first invalid record raises
    CorruptStoreError. Records mode: one row per record, NOOPs included, with
    `error` set where validation failed; a body or chain CRC mismatch does not
    stop the scan (the header is still sound), a broken header does.
    """
    with open(p.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                yield from _scan(p, mm, view, size)
            finally:
                view.release()


def _scan(p: FilePartition, mm: mmap.mmap, view: memoryview, size: int) -> Iterator[pa.RecordBatch]:
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    fault = record_fault
    magics = ENTRY_MAGICS
    rows = _Rows()
    off = p.scan_from - p.file_start
    index, pos = p.first_index, p.scan_from
    last_pos = -1  # pos of the last record read
    chain = p.prev_chain
    term_floor = p.prev_term
    emit_from = max(p.emit_from, p.begin_index) if not p.records else p.emit_from
    term_lo, term_hi = p.term_lo, p.term_hi if p.term_hi is not None else NO_LIMIT
    end_pos = p.end_pos if p.end_pos is not None else NO_LIMIT
    stop = "end"

    def fail(reason: str, at: int) -> str:
        """Entries mode: raise (or, past the committed index, end quietly); records mode: an error row."""
        msg = f"{p.path}: corrupt record at offset {at} (index {index} expected): {reason}"
        if index > p.committed_index:
            log.warning("%s; past the committed index %d: ending the read there", msg, p.committed_index)
            return "torn"
        if not p.records:
            raise CorruptStoreError(msg)
        _error_row(rows, index, pos, -1, -1, at, reason)
        return "corrupt"

    fast = entry.native if not p.records else None
    while True:
        if fast is not None and chain is not None:
            # the C loop takes the common case, rows out as Arrow-ready columns; any record it
            # leaves (a fault, a limit, upstream's) is this loop's, one at a time
            (at, n, chain, term_floor, lp, nrows, ix, tm, ps, ends, bd) = fast.scan_entries(
                view, off, size, index, pos, chain, term_floor, p.last_index, end_pos, emit_from, term_lo, term_hi,
                p.bodies, p.verify_bodies, BATCH_ROWS, FAST_BYTES)
            if nrows:
                if len(rows):
                    yield _emit(p, rows)
                    rows = _Rows()
                yield _columns_batch(p, nrows, ix, tm, ps, ends, bd)
            if n:
                pos += at - off
                off, index, last_pos = at, index + n, lp
                continue
        if index > p.last_index:
            stop = "limit"
            break
        if pos >= end_pos:
            stop = "split"
            break
        if off + 8 > size:
            break
        magic = int.from_bytes(mm[off : off + 4], "big", signed=True)
        if magic not in magics:
            stop = magic_stop(mm, off)
            if stop == "blank":
                length = BLANK.unpack_from(mm, off)[1]
                if length != size - off:
                    stop = fail(f"blank record of length {length}, expected {size - off} (the rest of the file)", off)
            elif stop != "zero":
                stop = fail(stop.removeprefix("corrupt: "), off)
            break
        if off + HEADER_SIZE > size:
            stop = fail("truncated header", off)
            break
        (_, rsize, idx, term, rpos, channel, ccrc, bcrc, bsize) = unpack(mm, off)
        # entry.record_fault's rules, the common case decided inline as entry.scan does (a call
        # per record costs 2-4% of this loop, docs/performance.md); a failure asks it which rule.
        # A record running past the end of its file is a fault here: data files hold whole records.
        if (rsize == HEADER_SIZE + bsize and bsize >= 0 and rsize <= size - off and idx == index
                and rpos == pos and term >= term_floor and channel == 0):
            reason = None
        else:
            reason = fault(rsize, bsize, idx, rpos, channel, term, size - off, index, pos, term_floor)
        if reason is not None:
            stop = fail(reason, off)
            break
        emit = idx >= emit_from and term_lo <= term < term_hi
        normal = magic == MAGIC_NORMAL
        body = None
        soft: list[str] = []
        # A body not returned (filtered out, a NOOP, records mode, a schema without `body`) is
        # CRC-checked in place, never copied: measured, that alone makes a body-less read 1.25x
        # (1 KiB bodies) to 5x (16 KiB) faster than a full one. verify_bodies=False
        # (verifyBodies=false, only without a body column) skips the check too: another 1.4x
        # (1 KiB) to 4x (16 KiB), but a flipped body byte goes unseen; the chain CRC is still
        # checked, from the body CRC in the header. So checking stays the default.
        if emit and normal and p.bodies and not p.records:
            body = mm[off + HEADER_SIZE : off + rsize]
            if crc32(body) != bcrc:
                soft.append("body crc mismatch")
        elif p.verify_bodies and crc32(view[off + HEADER_SIZE : off + rsize]) != bcrc:
            soft.append("body crc mismatch")
        if chain is not None and chain_crc(idx, term, bcrc, chain) != ccrc:
            soft.append("chain crc mismatch")
        if soft and unverified(ccrc, bcrc):
            soft = []  # upstream DLedger's record: its CRC fields are 0 (docs/format.md)
        if soft:
            if index > p.committed_index:
                fail("; ".join(soft), off)
                stop = "torn"
                break
            if not p.records:
                fail("; ".join(soft), off)
        chain = ccrc
        term_floor = term
        last_pos = pos
        if term >= term_hi:
            stop = "limit"  # terms never go down: no later record of the range is wanted
            break
        if not emit:
            pass
        elif p.records:
            rows.index.append(idx)
            rows.term.append(term)
            rows.pos.append(rpos)
            rows.magic.append(magic)
            rows.chain.append(ccrc)
            rows.bcrc.append(bcrc)
            rows.bsize.append(bsize)
            rows.offset.append(off)
            rows.error.append("; ".join(soft) if soft else None)
        elif normal:
            rows.index.append(idx)
            rows.term.append(term)
            rows.pos.append(rpos)
            if body is not None:
                rows.body.append(body)
        if len(rows) >= BATCH_ROWS:
            yield _emit(p, rows)
            rows = _Rows()
        off += rsize
        pos += rsize
        index += 1

    if p.end_link is not None and stop in ("split", "blank", "zero", "end"):
        _check_split(p, stop, index, last_pos, chain, term_floor, off, rows)
    elif stop in ("blank", "zero", "end"):
        _check_link(p, stop, index, chain, term_floor, off, rows)
    if len(rows):
        yield _emit(p, rows)


def _columns_batch(p: FilePartition, n: int, indexes: bytes, terms: bytes, positions: bytes, ends: bytes,
                   bodies: bytes) -> pa.RecordBatch:
    """Rows the C loop (entry.native.scan_entries) laid out as a columnar READ answer's."""
    batch = buffers_batch(p.group, n, indexes, terms, positions, ends, bodies)
    if not p.bodies:  # as _emit: no body column asked for, nulls
        batch = batch.set_column(4, ARROW_ENTRY_SCHEMA.field(4), pa.nulls(n, pa.binary()))
    return batch


def _emit(p: FilePartition, rows: _Rows) -> pa.RecordBatch:
    if p.records:
        return _records_batch(p, rows)
    if not p.bodies:
        n = len(rows)
        return pa.RecordBatch.from_arrays(
            [pa.array([p.group] * n, pa.string()), pa.array(rows.index, pa.int64()),
             pa.array(rows.term, pa.int64()), pa.array(rows.pos, pa.int64()), pa.nulls(n, pa.binary())],
            schema=ARROW_ENTRY_SCHEMA)
    return entry_batch(p.group, rows.index, rows.term, rows.pos, rows.body)


def _check_split(p: FilePartition, stop: str, index: int, last_pos: int, chain: int | None, term: int, off: int,
                 rows: _Rows) -> None:
    """At the end of a task that ends inside its file: the next task starts right after
    record `p.end_link`, from its chain CRC and term, so this task must have stopped
    exactly after that record, with that chain CRC (what one scan of the file would check)."""
    link = p.end_link
    assert link is not None
    where = f"offset {link.pos - p.file_start}"
    problems: list[str] = []
    if stop != "split":
        problems.append(f"the records end at offset {off}, but the index places index {link.index} at {where} "
                        "and the next task's records after it")
    elif index != link.index + 1 or last_pos != link.pos:
        problems.append(f"the record before offset {p.end_pos - p.file_start if p.end_pos else off} has index "
                        f"{index - 1} at offset {last_pos - p.file_start}, but the next task starts after index "
                        f"{link.index} at {where}")
    elif chain != link.chain_crc or term != link.term:
        problems.append(f"index {link.index} has chain crc {chain} and term {term} here, but the next task "
                        f"starts from chain crc {link.chain_crc} and term {link.term}")
    if not problems:
        return
    if link.index > p.committed_index:  # the planner cuts no later than committed + 1: not seen
        log.warning("%s: task ends off its cut (%s); past the committed index", p.path, "; ".join(problems))
        return
    msg = f"{p.path}: corrupt record at offset {off} (index {index} expected): " + "; ".join(problems)
    if not p.records:
        raise CorruptStoreError(msg)
    _error_row(rows, index, -1, -1, -1, off, msg)


def _check_link(p: FilePartition, stop: str, index: int, chain: int | None, term: int, off: int,
                rows: _Rows) -> None:
    """At the end of file k: file k+1 must go on where file k stopped."""
    nxt = p.next_head
    if nxt is None:
        # the last file: zeros (or its closing blank) end the log, but not before the
        # committed index: committed entries are never removed
        if index <= p.committed_index:
            msg = (f"{p.path}: corrupt record at offset {off} (index {index} expected): the log ends at index "
                   f"{index - 1}, but the checkpoint has committed index {p.committed_index}")
            if not p.records:
                raise CorruptStoreError(msg)
            _error_row(rows, index, pos=-1, chain=-1, bcrc=-1, offset=off, error=msg)
        return
    problems: list[str] = []
    if stop != "blank":
        problems.append(f"{Path(p.path).name} ends at offset {off} without a closing blank record, "
                        "but a later data file holds records")
    if nxt.index != index:
        problems.append(f"its first record has index {nxt.index}, expected {index}")
    if nxt.term < term:
        problems.append(f"its first record has term {nxt.term}, below the previous term {term}")
    if chain is not None and not chain_follows(nxt.index, nxt.term, nxt.body_crc, chain, nxt.chain_crc):
        problems.append("its first record's chain crc does not follow the last record of the previous file")
    if not problems or nxt.index > p.committed_index:
        if problems:
            log.warning("%s: next data file does not follow (%s); past the committed index", p.path,
                        "; ".join(problems))
        return
    next_path = str(Path(p.path).with_name(f"{nxt.pos:020d}"))
    msg = f"{next_path}: corrupt record at offset 0: " + "; ".join(problems)
    if not p.records:
        raise CorruptStoreError(msg)
    _error_row(rows, nxt.index, nxt.pos, nxt.chain_crc, nxt.body_crc, 0, msg, term=nxt.term)


def _error_row(rows: _Rows, index: int, pos: int, chain: int, bcrc: int, offset: int, error: str,
               term: int = -1) -> None:
    """Records mode: a row that stands for a record that failed validation."""
    rows.index.append(index)
    rows.term.append(term)
    rows.pos.append(pos)
    rows.magic.append(-1)
    rows.chain.append(chain)
    rows.bcrc.append(bcrc)
    rows.bsize.append(-1)
    rows.offset.append(offset)
    rows.error.append(error)


# --- the data source ------------------------------------------------------------------------------------


def check_schema(schema: StructType, records: bool) -> tuple[str, ...]:
    """The declared schema's columns, in its order (pruning; spark.schema.declared_columns)."""
    return declared_columns(schema, RECORD_SCHEMA if records else ENTRY_SCHEMA,
                            f'format("dledger-files") ({"records" if records else "entries"} mode)', {"error"})


def parse_bytes(options: Mapping[str, str], name: str, default: int) -> int:
    """A byte count option: 134217728, or with a binary unit: 128m, 128MiB, 1g, 64k."""
    raw = get_str(options, name)
    if raw is None:
        return default
    m = _SIZE.match(raw)
    if m is None:
        raise OptionError(f"option {name}: expected a number of bytes (e.g. 134217728 or 128m), got {raw!r}")
    value = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]
    if value <= 0:
        raise OptionError(f"option {name}: must be greater than 0, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class FilesConfig:
    store_dir: Path
    include_uncommitted: bool
    records: bool
    group: str | None
    member: str | None
    bytes_per_partition: int
    verify_bodies: bool


class DLedgerFilesReader(DataSourceReader):
    """Without pushFilters: for sessions where `spark.sql.python.filterPushdown.enabled` is
    false (Spark refuses to plan a reader that has pushFilters there)."""

    def __init__(self, cfg: FilesConfig, schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.cfg = cfg
        self.columns = check_schema(schema, cfg.records)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")  # what Spark checks batches against
        self.pushed: Pushed | None = None

    def partitions(self) -> list[InputPartition]:
        c = self.cfg
        return list(plan(c.store_dir, c.include_uncommitted, c.records, c.group, c.member, c.bytes_per_partition,
                         self.pushed, bodies="body" in self.columns, verify_bodies=c.verify_bodies))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            return
        for batch in read_file(partition):
            if self.pushed is not None:
                batch = self.pushed.mask(batch)  # the scan already skips what they rule out: a check
            if not batch.num_rows:
                continue
            if not batch.schema.equals(self.arrow_schema):
                batch = pa.RecordBatch.from_arrays([batch.column(n) for n in self.columns], schema=self.arrow_schema)
            yield batch


class DLedgerFilesPushdownReader(DLedgerFilesReader):
    """With pushFilters: `index`, `term` (integer =, <, <=, >, >=, IN) and `group` (=, IN)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        pushed, rest = push(filters, self.columns)
        self.pushed = pushed
        log.info("%s: pushed %s; left to Spark: %s", self.cfg.store_dir, pushed, rest)
        return iter(rest)


class DLedgerFilesDataSource(DataSource):
    """`spark.read.format("dledger-files").load("<store_dir>")`.

    Options: `path` (the member's store directory), `includeUncommitted` [false],
    `group` [the directory's parent name, as `dledger cluster` lays it out],
    `mode` [entries | records], `member` [the directory's name; records mode],
    `bytesPerPartition` [128m: bytes of a data file per task], `verifyBodies` [true:
    a read whose declared schema has no `body` column still checks body CRCs; false
    reads only the headers].
    """

    # False in the subclass register() puts in place of this one where the session turned
    # Python filter pushdown off (as for format("dledger")): reads then plan without pushFilters
    pushdown: ClassVar[bool] = True

    @classmethod
    def name(cls) -> str:
        return "dledger-files"

    def _config(self) -> FilesConfig:
        check_names(self.options, FILES_OPTIONS, "dledger-files")
        mode = (get_str(self.options, "mode") or "entries").lower()
        if mode not in ("entries", "records"):
            raise OptionError(f"option mode: expected entries or records, got {mode!r}")
        path = get_str(self.options, "path")
        return FilesConfig(
            Path(path or ""), get_bool(self.options, "includeUncommitted", False), mode == "records",
            get_str(self.options, "group"), get_str(self.options, "member"),
            parse_bytes(self.options, "bytesPerPartition", DEFAULT_BYTES_PER_PARTITION),
            get_bool(self.options, "verifyBodies", True))

    def schema(self) -> str:
        """Called at load() (unless a schema is declared): options are checked here."""
        return RECORD_SCHEMA if self._config().records else ENTRY_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        cfg = self._config()
        if get_str(self.options, "path") is None:
            if no_options(self.options):
                raise OptionError(f"no options reached format 'dledger-files' (a catalog table?): "
                                  f"{catalog_hint('dledger-files')}")
            raise OptionError('format("dledger-files") needs a store directory: .load("<data_dir>/<group>/<member>")')
        return (DLedgerFilesPushdownReader if self.pushdown else DLedgerFilesReader)(cfg, schema)
