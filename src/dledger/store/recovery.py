"""Recovery of a FileLedgerStore on open.

1. Begin of the log and the trusted point come from `checkpoint` (read by
   store/offline.py: an unreadable one is a DISK_ERROR, never guessed around;
   without a log begin in it, the begin is derived from the first record): the
   last record known durable. It must still be there, else DISK_ERROR: durable,
   acknowledged data is never silently dropped. A trusted record (or one before
   it in the same data file) that rotted but whose extent is certain — from the
   checkpoint, its header or its index unit as written — is kept and reported in
   `recovered_corrupt`: the member repairs it from the leader's copy (core.node)
   instead of refusing to start.
2. From there every record is validated (magic, size, index continuity, pos,
   body CRC, chain CRC) across files; the first invalid one is the cut point.
3. A cut inside the committed log is a DISK_ERROR naming file and offset;
   otherwise the torn tail is zeroed (with its index units) and later files are
   deleted.
4. Index units are rebuilt from the data records the scan validated. Below
   the trusted point only the trusted record's own unit is checked when the
   index files are whole (the rest was fsynced with the checkpoint); else the
   units of its data file are checked and rebuilt where damaged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dledger.codes import ResponseCode
from dledger.entry import (
    BLANK,
    ENTRY_MAGICS,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MAGIC_BLANK,
    CorruptRecord,
    chain_follows,
    decode_entry,
    header_fault,
    scan,
)
from dledger.store.base import CorruptEntryError, StoreError
from dledger.store.mapped_file import MappedFile, MappedFileList
from dledger.store.offline import (
    ZEROS,
    Checkpoint,
    chain_before,
    data_extents,
    derive_begin_of,
    first_record_index,
    read_checkpoint,
    repair_checkpoint_hint,
)

log = logging.getLogger(__name__)


class RecoverableStore(Protocol):
    """What recovery reads and sets of a file store: its files and the log's bounds. The
    store calls `recover` and `rebuild_units`; recovery knows nothing else of it."""

    dir: Path
    data: MappedFileList
    index: MappedFileList
    begin_index: int
    begin_term: int
    begin_pos: int
    begin_chain_crc: int
    end_index: int
    end_term: int
    end_chain_crc: int
    write_pos: int
    committed_index: int
    durable_index: int
    recovered_corrupt: tuple[int, str] | None
    unverified: int  # records of upstream DLedger's (CRC fields 0) found by the last recovery scan

    def raw_unit(self, index: int) -> tuple[int, int, int, int, int] | None:
        """The index unit of `index` if it is intact and matches its record, else None."""


@dataclass(frozen=True, slots=True)
class ScanStart:
    index: int
    pos: int
    chain: int | None  # None: adopt the first record's chain (no checkpoint to check it)
    term: int
    trusted_pos: int | None = None
    verified: bool = False  # the trusted record (index - 1) matched the checkpoint


def recover(store: RecoverableStore) -> int | None:
    """Read first, decide, then write: a refusal (StoreError DISK_ERROR) changes no byte.
    Returns the checkpoint's trusted index when its record was found in place, whole and as
    the checkpoint names it (None: no trusted record, or a rotten one): what the rest of that
    checkpoint (its markers) may be taken for."""
    ckpt = read_checkpoint(store.dir)  # UnreadableFile (DISK_ERROR): never guess the committed index
    begin_chain = _load_begin(store, ckpt)
    committed = ckpt.committed_index if ckpt else -1
    start = _trusted_start(store, ckpt, begin_chain)
    end = scan_forward(store, start)
    # only dledger's own checkpoint names a position known fsynced: without it nothing past
    # the log begin is proven torn but a last record cut short (docs/format.md, "Recovery")
    check_cut(store, end, committed, proven=ckpt is not None and ckpt.proves_durable, begin=store.begin_index)
    # --- from here on recovery writes
    _drop_leftovers(store)
    if start.trusted_pos is not None:
        _check_units(store, start.index - 1, start.trusted_pos)
    for first, units in end.units:
        _write_units(store, first, units)
    if end.units_upto < end.index - 1:  # too many to hold: the rest rebuilt from the headers
        rebuild_units(store, end.units_upto + 1, end.units_pos, end.index - 1, verify=True, prev_chain=end.units_chain)
    _cut(store, end)
    store.end_index = end.index - 1
    store.end_term = end.term if end.index > store.begin_index else store.begin_term
    store.end_chain_crc = end.chain if end.chain is not None else store.begin_chain_crc
    store.write_pos = end.pos
    store.unverified = end.unverified
    first_unsynced = start.pos
    for f in store.data.files:
        if f.end > first_unsynced:
            f.sync()  # after a process crash the tail may be only in the page cache
    store.durable_index = store.end_index
    store.committed_index = min(committed, store.end_index)
    log.info(
        "recovered %s: entries [%d, %d], committed %d%s",
        store.dir, store.begin_index, store.end_index, store.committed_index,
        f", {end.unverified} unverified (upstream DLedger's, CRC fields 0)" if end.unverified else "",
    )
    return start.index - 1 if start.verified else None


def _load_begin(store: RecoverableStore, ckpt: Checkpoint | None) -> int | None:
    """Set the store's log begin; returns the chain CRC before it (None: unknown, the
    first record's own is taken, see offline.derive_begin)."""
    begin = ckpt.begin if ckpt is not None else None
    if begin is None:
        if ckpt is not None:
            log.warning("checkpoint of %s lacks the log begin; deriving it from the data", store.dir)
        f0 = store.data.files[0] if store.data.files else None
        begin = derive_begin_of(f0.path if f0 else None, f0.start if f0 else 0, f0.size if f0 else 0)
    store.begin_index, store.begin_term, store.begin_pos = begin.index, begin.term, begin.pos
    chain = begin.chain_crc
    if chain is None:  # a derived begin past index 0: the chain its first record says came before
        f = store.data.locate(begin.pos)
        chain = chain_before(HEADER.unpack_from(f.mm, begin.pos - f.start))
    store.begin_chain_crc = chain or 0
    return begin.chain_crc


def _drop_leftovers(store: RecoverableStore) -> None:
    """Delete files wholly before the log begin: retention checkpoints the new begin before
    it deletes, so a crash in between leaves them behind."""
    while store.data.files and store.data.files[0].end <= store.begin_pos:
        log.warning("recovery of %s: deleting %s, before the log begin", store.dir, store.data.files[0].path)
        store.data.drop_first()
    while store.index.files and store.index.files[0].end <= store.begin_index * INDEX_UNIT_SIZE:
        store.index.drop_first()


def _trusted_start(store: RecoverableStore, ckpt: Checkpoint | None, begin_chain: int | None) -> ScanStart:
    t = ckpt.trusted if ckpt else None
    begin = ScanStart(store.begin_index, store.begin_pos, begin_chain, store.begin_term)
    if t is None or t.index < store.begin_index:
        return begin
    index, pos, term, chain = t.index, t.pos, t.term, t.chain_crc
    where = f"durable record {index} at position {pos}"
    try:
        f = store.data.locate(pos)
    except StoreError as e:
        raise StoreError(ResponseCode.DISK_ERROR, f"{where} is missing: {e.message}{_lost(store, ckpt, index)}") from e
    try:
        entry = decode_entry(f.mm, pos - f.start)
        if (entry.index, entry.term, entry.pos, entry.chain_crc) == (index, term, pos, chain):
            return ScanStart(index + 1, pos + entry.size, chain, term, pos, verified=True)
        reason = f"does not match the checkpoint (holds index {entry.index})"
    except CorruptRecord as e:
        reason = f"is corrupt: {e.reason}"
    # rotten: its extent from its header when that is the checkpoint's, else from its unit
    size = _whole_header(f, pos, index, term, chain)
    u = _unit_as_written(store, index) if size is None else None
    if u is not None and (u[1], u[4]) == (pos, term) and pos - f.start + u[2] <= f.size:
        size = u[2]
    if size is None:
        raise StoreError(ResponseCode.DISK_ERROR, f"{where} in {f.path} {reason}{_lost(store, ckpt, index)}")
    _note_rotten(store, index, f"{where} in {f.path} {reason}")
    return ScanStart(index + 1, pos + size, chain, term, pos)


def _lost(store: RecoverableStore, ckpt: Checkpoint | None, index: int) -> str:
    """What to run when the checkpoint's durable record is lost beyond repair: a truncate from
    it rewrites the checkpoint to trust at most the record before it."""
    force = " --force" if ckpt is not None and index <= ckpt.committed_index else ""
    return (f". Nothing was changed. To keep the records before {index} (the member then fetches the rest "
            f"from the leader), run `dledger store truncate --store-dir {store.dir} --from-index {index}{force}`")


@dataclass(slots=True)
class ScanEnd:
    """Where the valid log ends (record `index` would start at `pos`) and why the scan
    stopped there (`reason` "" for a clean end); the index units of the records scanned."""

    index: int
    pos: int
    chain: int | None
    term: int
    reason: str
    extent: int  # where the record that failed ends (its size when its header is sound); = pos if none
    clean_to: int  # bytes up to here are the log's own (a blank closing a file at the end): not data after it
    unverified: int
    units: list[tuple[int, bytearray]]
    units_upto: int  # units collected through this index (memory bound); the rest rebuilt after
    units_pos: int
    units_chain: int | None


UNITS_HELD = 64 << 20  # index units kept in memory during the scan (2M records); the rest are rebuilt


def scan_forward(store: RecoverableStore, start: ScanStart) -> ScanEnd:
    """Validate records from `start` up to the first bad one, writing nothing."""
    index, pos, chain, term = start.index, start.pos, start.chain, start.term
    data = store.data
    reason = ""
    extent = pos
    n_unverified = 0
    held: list[tuple[int, bytearray]] = []
    held_bytes = 0
    upto, upto_pos, upto_chain = index - 1, pos, chain
    blank_at: int | None = None  # the blank we followed into the current file
    while data.files and data.first_start <= pos < data.files[-1].end:
        f = data.locate(pos)
        first_chain = chain
        if chain is None:  # no checkpoint: take the first record's chain as given
            first_chain = chain_before(HEADER.unpack_from(f.mm, pos - f.start)) if pos + HEADER_SIZE <= f.end else 0
        keep = held_bytes < UNITS_HELD and upto == index - 1
        units = bytearray() if keep else None
        res = scan(f.mm, pos - f.start, f.size, index, pos, first_chain or 0, term, units=units)
        if units is not None:
            held.append((index, units))
            held_bytes += len(units)
            upto = index + res.count - 1
        n_unverified += res.unverified
        if res.count:
            chain, term = res.last_chain, res.last_term
            blank_at = None
        index += res.count
        pos += res.consumed
        if units is not None:
            upto_pos, upto_chain = pos, chain
        if res.stop == "blank":
            length = BLANK.unpack_from(f.mm, pos - f.start)[1]
            if length == f.end - pos and f is not data.files[-1]:
                blank_at = pos
                pos = f.end
                continue
            if length != f.end - pos:
                reason, extent = f"blank record of bad length {length}", pos + BLANK.size
            else:  # the last file closed, its successor never created (upstream crashed in between)
                blank_at = pos
        elif res.stop != "zero":
            reason = res.stop.removeprefix("corrupt: ")
            extent = _extent(f, pos)
        break
    clean_to = pos
    if blank_at is not None:
        # no valid record after the blank: the log ends before it, as after a truncate,
        # so the next record goes where the leader's rule puts it (not at a file start)
        pos, clean_to = blank_at, blank_at + BLANK.size
    return ScanEnd(index, pos, chain, term, reason, max(extent, pos), clean_to, n_unverified, held, upto, upto_pos,
                   upto_chain)


def _extent(f: MappedFile, pos: int) -> int:
    """Where the record at `pos` ends by its own header, when the header is sound (only its
    CRCs or its place disagree); else where its header ends."""
    off = pos - f.start
    if off + HEADER_SIZE > f.size:
        return f.end
    h = HEADER.unpack_from(f.mm, off)
    if h[0] in ENTRY_MAGICS and h[1] == HEADER_SIZE + h[8] and h[8] >= 0 and off + h[1] <= f.size:
        return pos + int(h[1])
    return pos + HEADER_SIZE


SECTOR = 512  # the smallest unit a disk writes whole: a torn write leaves whole sectors unwritten (zero)


def check_cut(store: RecoverableStore, end: ScanEnd, committed: int, proven: bool, begin: int) -> None:
    """Refuse (DISK_ERROR, nothing changed) unless what lies past `end.pos` is provably torn:
    past the checkpoint's fsynced position (`proven`), or, without one, a last record cut
    short — every byte after it zero, and zeros from a sector boundary inside it on (how a
    write interrupted by a power loss looks on a preallocated file: etcd's WAL has the same
    rule). Never inside the committed log."""
    where = _where(store, end.pos)
    if end.index <= committed:
        if not end.reason and _last_nonzero(store, end.pos) <= max(end.pos, end.clean_to):
            # a clean end below the committed index: the checkpoint claims more than the data holds
            raise StoreError(
                ResponseCode.DISK_ERROR,
                f"the checkpoint says entries through {committed} are committed, but the log ends cleanly at "
                f"{end.index - 1} ({where}): the data or the checkpoint is not this store's. Nothing was "
                f"changed. If the data is right, {repair_checkpoint_hint(store.dir)}",
            )
        raise StoreError(
            ResponseCode.DISK_ERROR,
            f"corrupt record in the committed log at {where}: {end.reason or 'missing'}; "
            f"committed index is {committed} but records are valid only through {end.index - 1}. "
            f"Nothing was changed. {_what_to_run(store.dir, begin, end.index)}",
        )
    if proven:
        return
    last = _last_nonzero(store, end.pos)
    if last <= max(end.pos, end.clean_to):
        return  # a clean end: nothing written past it
    if end.reason:
        boundary = last + (-(last - store.data.first_start) % SECTOR)  # zero from here on
        if last <= end.extent and boundary < end.extent:
            log.warning("recovery of %s: the last record (index %d at %s) was cut short (%s); dropping it",
                        store.dir, end.index, where, end.reason)
            return
        why = f"record {end.index} fails its check ({end.reason})"
    else:
        why = f"record {end.index} should start there but the bytes are zero"
    upstream = (
        f" The log before it is upstream DLedger's (CRC fields 0), whose truncate leaves the bytes of the "
        f"entries it removed after the log's end: if upstream wrote this store last, it ends at entry "
        f"{end.index - 1} for upstream too, and the truncate below drops only those leftovers."
        if end.unverified else ""
    )
    raise StoreError(
        ResponseCode.DISK_ERROR,
        f"{where}: {why}, and data follows up to {_where(store, last)}: not a torn tail (the store has no "
        f"checkpoint naming what was fsynced), so it is damage or another writer's. Nothing was changed."
        f"{upstream} {_what_to_run(store.dir, begin, end.index)}",
    )


def _what_to_run(store_dir: Path, begin: int, index: int) -> str:
    """The way out of a refusal. A truncate is named only when it keeps entries: with no valid
    record at the log's begin, it would drop everything, and that is for a person to decide
    after looking (the records may be sound but not where this store's begin says)."""
    look = f"Run `dledger store inspect --store-dir {store_dir}` to see the log"
    if index <= begin:
        return (f"{look}: no valid record was found where the log begins (index {index}), so there is "
                "nothing a truncate would keep.")
    return (f"{look}; to keep the entries before {index} and drop the rest (the member then fetches them from "
            f"the leader), run `dledger store truncate --store-dir {store_dir} --from-index {index}`")


def _where(store: RecoverableStore, pos: int) -> str:
    data = store.data
    if data.files and data.first_start <= pos < data.files[-1].end:
        f = data.locate(pos)
        return f"{f.path} offset {pos - f.start}"
    return f"position {pos}"


def _last_nonzero(store: RecoverableStore, pos: int) -> int:
    """The position just past the last non-zero byte at or after `pos` in the data files
    (`pos` when there is none). Holes of sparse files are skipped (SEEK_DATA), so a
    preallocated file costs what was written in it."""
    for f in reversed(store.data.files):
        if f.end <= pos:
            break
        lo = max(pos, f.start) - f.start
        for a, b in reversed(list(data_extents(f.fd, lo, f.size))):
            hi = b
            while hi > a:
                n = min(len(ZEROS), hi - a)
                chunk = f.mm[hi - n : hi]
                if chunk != ZEROS[:n]:  # memcmp: a zero chunk (the common case) costs no byte loop
                    return int(f.start + hi - n + len(chunk.rstrip(b"\0")))
                hi -= n
    return pos


def _cut(store: RecoverableStore, end: ScanEnd) -> None:
    """Drop everything from `end.pos` (record `end.index`) on; `check_cut` allowed it."""
    pos, index, reason = end.pos, end.index, end.reason
    data = store.data
    inside = bool(data.files) and data.first_start <= pos < data.files[-1].end
    f = data.locate(pos) if inside else None
    if reason:
        log.warning("recovery of %s: cutting the log at %s (index %d): %s", store.dir, _where(store, pos), index,
                    reason)
    if f is not None:
        f.zero(pos - f.start, f.size)
    later = [g for g in data.files if g.start > pos]
    # a file holding no data at all (a hole, or 0 bytes) was created ahead of the log, or its
    # creation was cut short: it never held a record
    empty = [g.path.name for g in later if not any(data_extents(g.fd, 0, g.size))]
    if empty:
        log.info("recovery of %s: deleting empty data files past the log's end (created ahead): %s", store.dir,
                 empty)
    if len(empty) < len(later):
        log.warning("recovery of %s: deleting data files past the cut: %s", store.dir,
                    [g.path.name for g in later if g.path.name not in empty])
    data.drop_after(pos)
    p = index * INDEX_UNIT_SIZE
    if store.index.files and store.index.first_start <= p < store.index.files[-1].end:
        uf = store.index.locate(p)
        uf.zero(p - uf.start, uf.size)
    store.index.drop_after(p)


def _whole_header(f: Any, pos: int, index: int, term: int, chain: int) -> int | None:
    """The size of the record at `pos` when its header is exactly the one expected (index,
    term, pos, chain CRC) and its size fits the file: then only its body (or body CRC) rotted."""
    off = pos - f.start
    if off + HEADER_SIZE > f.size:
        return None
    h = HEADER.unpack_from(f.mm, off)
    ok = header_fault(h, f.size - off) is None
    return int(h[1]) if ok and (h[2], h[3], h[4], h[6]) == (index, term, pos, chain) else None


def _unit_as_written(store: RecoverableStore, index: int) -> tuple[int, int, int, int, int] | None:
    """The index unit of `index` without checking it against its record header (which may
    be the damaged part), when it is well formed."""
    p = index * INDEX_UNIT_SIZE
    if not store.index.files or not store.index.first_start <= p < store.index.files[-1].end:
        return None
    uf = store.index.locate(p)
    u: tuple[int, int, int, int, int] = INDEX_UNIT.unpack_from(uf.mm, p - uf.start)
    return u if u[0] in ENTRY_MAGICS and u[3] == index and u[2] >= HEADER_SIZE else None


def _note_rotten(store: RecoverableStore, index: int, reason: str) -> None:
    log.error("recovery of %s: durable record %d is rotten (%s); keeping it, to be repaired from "
              "the leader's copy", store.dir, index, reason)
    if store.recovered_corrupt is None:
        store.recovered_corrupt = (index, reason)


def _write_units(store: RecoverableStore, index: int, units: bytes | bytearray) -> None:
    """Write consecutive index units starting at `index`, across index files."""
    p = index * INDEX_UNIT_SIZE
    done = 0
    while done < len(units):
        uf = store.index.ensure(p + done)
        off = p + done - uf.start
        n = min(len(units) - done, uf.size - off)
        uf.write(off, units[done : done + n])
        done += n


def _check_units(store: RecoverableStore, upto: int, trusted_pos: int) -> None:
    """Make sure the index units of the trusted region (through record `upto`, at
    `trusted_pos`) can be used, reading only what that needs.

    The units through the trusted record were fsynced before the checkpoint naming it
    (`FileLedgerStore._persist_checkpoint`), so when the index files cover the region, all of
    them were opened full size, and the trusted record's own unit matches its header, nothing
    below it is read: what could still be wrong there is rot, which the scrub finds and
    `FileLedgerStore.unit` repairs on use. A restart then costs the tail after the checkpoint,
    not the size of a data file (docs/performance.md, "Restart cost"). Otherwise the units of
    the trusted record's data file are checked and rebuilt where damaged (an index file cut
    short by a crash reads as zeros there); without index files for the region, all units from
    the log begin are rebuilt from the data files.
    """
    idx = store.index
    lo, hi = store.begin_index * INDEX_UNIT_SIZE, (upto + 1) * INDEX_UNIT_SIZE
    covered = bool(idx.files) and idx.first_start <= lo and idx.files[-1].end >= hi
    if covered and not any(uf.short for uf in idx.files if uf.end > lo and uf.start < hi):
        u = store.raw_unit(upto)
        if u is not None and u[1] == trusted_pos:
            return
    begin, pos = store.begin_index, store.begin_pos
    prev_chain: int | None = store.begin_chain_crc
    if covered:
        f = store.data.locate(trusted_pos)
        first = _first_index_at(store, f.start) if f.start > store.begin_pos else None
        u = _unit_as_written(store, first) if first is not None else None
        if u is None or u[1] != f.start:
            first = None  # a rotten index field: walk (and check) from the log begin instead
        if first is not None and first > begin:
            begin, pos = first, f.start
            u = store.raw_unit(first - 1)
            prev_chain = None if u is None else _chain_at(store, u[1])
    rebuild_units(store, begin, pos, upto, verify=covered, prev_chain=prev_chain)


def _chain_at(store: RecoverableStore, pos: int) -> int:
    f = store.data.locate(pos)
    return int(HEADER.unpack_from(f.mm, pos - f.start)[6])


def _first_index_at(store: RecoverableStore, pos: int) -> int | None:
    f = store.data.locate(pos)
    return first_record_index(HEADER.unpack_from(f.mm, pos - f.start), pos, f.end - pos)


def rebuild_units(
    store: RecoverableStore,
    index: int,
    pos: int,
    upto: int,
    verify: bool,
    prev_chain: int | None = None,
) -> None:
    """Walk data headers from record `index` at `pos` through `upto`, rewriting index
    units; with `verify`, a unit that already matches is left alone.

    Each header's chain CRC must follow the one before (`prev_chain` is the chain of
    entry index - 1, None when unknown): it covers index, term and body CRC, so a
    damaged header field never makes its way into a unit.
    """
    data = store.data
    rebuilt = 0
    chain = prev_chain
    while index <= upto:
        f = data.locate(pos)
        off = pos - f.start
        # a blank may sit in the last 8..47 bytes of a file: no whole header fits there
        magic = int.from_bytes(f.mm[off : off + 4], "big", signed=True)
        if magic == MAGIC_BLANK:
            pos = f.end
            continue
        h = HEADER.unpack_from(f.mm, off) if off + HEADER.size <= f.size else None
        bad = ""
        # the size is not under the chain CRC: it must agree with the body size beside it, or a
        # rotten one would be written into the unit (and the record could never be repaired)
        if h is None or header_fault(h, f.size - off) is not None or h[2] != index or h[4] != pos:
            bad = "no valid record header"
        elif chain is not None and not chain_follows(index, h[3], h[7], chain, h[6]):
            bad = "chain CRC mismatch"
        if bad:
            # recovery keeps a rotten record whose unit as written still gives its extent
            u = _unit_as_written(store, index) if verify else None
            if u is None or u[1] != pos or off + u[2] > f.size:
                raise CorruptEntryError(index, f"cannot rebuild index unit {index}: {bad} at {f.path} offset {off}")
            _note_rotten(store, index, f"{bad} at {f.path} offset {off}")
            chain, pos, index = None, pos + u[2], index + 1  # the next chain CRC is unchecked
            continue
        assert h is not None  # `bad` otherwise
        chain = h[6]
        unit = INDEX_UNIT.pack(h[0], pos, h[1], index, h[3])
        p = index * INDEX_UNIT_SIZE
        uf = store.index.ensure(p)
        uo = p - uf.start
        if not verify or uf.mm[uo : uo + INDEX_UNIT_SIZE] != unit:
            uf.write(uo, unit)
            rebuilt += 1
        pos += h[1]
        index += 1
    if rebuilt and verify:
        log.warning("recovery of %s: rebuilt %d damaged index units", store.dir, rebuilt)
