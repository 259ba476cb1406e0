"""Offline tools that change a stopped member's store: `dledger store truncate|import|export|repair-checkpoint`.

Each takes the store's lock (store/lock.py: never under a running member), judges the log
first as recovery would (store/verdict.py) and writes in an order after which a crash at
any point leaves a store a member opens (docs/format.md, "Recovery"):

- `truncate`: the operator's explicit cut, the one recovery's refusal message names. The
  checkpoint is written first, naming the last record kept as the durable one: from then on
  anything after it is a torn tail recovery may cut, so zeroing the rest and deleting later
  files can stop anywhere. Refused at or below the committed index unless forced.
- `import`: fills the CRC fields upstream DLedger leaves 0, wherever such records lie; each
  filled record's chain CRC follows the record before it, so the records after a filled one
  are chained again too. A data directory half filled in place would chain neither way, so the
  filled files are written beside it (`data.import/`, synced) and swapped with `data/` in one
  atomic rename (renameat2 RENAME_EXCHANGE): a crash leaves the old data or the new. The
  checkpoint before the swap says it proves nothing durable (`"proves_durable": false`):
  it holds for both, and recovery then treats the store as one without a checkpoint (only a
  last record cut short is torn), so damage found later is refused, never cut as a torn
  tail; the one after the swap names the last record. `data/` must be a directory of the
  store's files (and plain files, carried over as they are): a symlink, a subdirectory or a
  special file in it is refused before anything is written, so no file of the user's is lost.
- `export`: an upstream-readable copy in another directory (the source is only read).
- `repair-checkpoint`: moves aside (never deletes) a checkpoint a member refuses to start
  on (unreadable, or claiming a committed index beyond the data) and writes none, so the
  member opens as on a store without one (nothing past the log begin proven torn).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import shutil
import stat
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.codes import ResponseCode
from dledger.entry import (
    BLANK,
    BLANK_SIZE,
    HEADER,
    HEADER_SIZE,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MAGIC_BLANK,
    MAGIC_NOOP,
    MAGIC_SESSION,
    chain_crc,
    scan,
)
from dledger.fsutil import fsync_path
from dledger.store.admin import check_store_dir
from dledger.store.base import StoreError
from dledger.store.checkpoint import write_atomic, write_currterm
from dledger.store.lock import StoreDirLock
from dledger.store.offline import (
    CHECKPOINT,
    UnreadableFile,
    chain_before,
    data_extents,
    file_name,
    list_files,
    next_nonzero,
    read_checkpoint,
    read_currterm,
)
from dledger.store.verdict import ReadOnlyFiles, Verdict, judge

log = logging.getLogger(__name__)

# upstream DLedger's defaults (DLedgerConfig): mappedFileSizeForEntryData 1 GiB,
# mappedFileSizeForEntryIndex 32 * 5 * 1024 * 1024 (160 MiB)
UPSTREAM_DATA_FILE_SIZE = 1 << 30
UPSTREAM_INDEX_FILE_SIZE = INDEX_UNIT_SIZE * 5 * 1024 * 1024
UPSTREAM_MAGICS = frozenset((1, 2, 3))  # DLedgerEntryType.isValid: NORMAL, NOOP, CONFIG_CHANGE
_CRCS = struct.Struct(">II")  # chain CRC, body CRC: bytes 36-43 of a record header
_CRC_OFFSET = 36
IMPORT_DIR = "data.import"
SYNC_BATCH = 64 << 20  # import: fsync the filled copy every this many bytes


def _refuse(msg: str) -> StoreError:
    return StoreError(ResponseCode.DISK_ERROR, msg)


def _judged(d: Path, what: str) -> Verdict:
    """The store judged as recovery would; refused (nothing changed) when a member would not
    open it for a reason the tool cannot settle."""
    v = judge(d)
    if v.checkpoint_problem:
        raise _refuse(f"{what} needs the committed index the checkpoint holds. Nothing was changed. "
                      f"{v.checkpoint_problem}")  # which names the way out
    if v.gap:
        raise _refuse(f"{v.gap}. Nothing was changed.")
    if v.size_problem:  # a truncate or import would not change the files' sizes
        raise _refuse(v.size_problem if "Nothing was changed" in v.size_problem
                      else f"{v.size_problem}. Nothing was changed.")
    return v


def records(files: list[Any], pos: int, index: int, stop: int) -> Iterator[tuple[Any, int, tuple[int, ...]]]:
    """(file, offset, header) of records `index`..`stop`-1 from position `pos`, stepping over
    the blank records that close files. Only for a log `judge` found valid that far: a
    header out of place is an error, not an end."""
    k = next((k for k, f in enumerate(files) if f.start <= pos < f.start + f.size), len(files))
    while index < stop:
        if k >= len(files):
            raise _refuse(f"record {index} at position {pos} is missing")
        f = files[k]
        off = pos - f.start
        if off + BLANK_SIZE > f.size or BLANK.unpack_from(f.mm, off)[0] == MAGIC_BLANK:
            k += 1
            if k < len(files):
                pos = files[k].start
            continue
        h = HEADER.unpack_from(f.mm, off)
        if h[2] != index or h[4] != pos:
            raise _refuse(f"{f.path} offset {off}: expected record {index} at position {pos}, found "
                          f"index {h[2]} pos {h[4]}")
        yield f, off, h
        pos += h[1]
        index += 1


def _write_checkpoint(d: Path, v: Verdict, committed: int, trusted: dict[str, int] | None,
                      proves_durable: bool = True) -> None:
    """dledger's checkpoint (the form FileLedgerStore writes) for the log `v` judged. With
    `proves_durable` False it names no position known fsynced (recovery cuts nothing past the
    log begin but a last record cut short), though it keeps the committed index and begin."""
    state: dict[str, object] = {"version": 1, "committed_index": committed, "trusted": trusted}
    if not proves_durable:
        state["proves_durable"] = False
    b = v.begin
    if b.chain_crc is not None:  # else left out: recovery derives the begin from the data again
        state.update(begin_index=b.index, begin_term=b.term, begin_pos=b.pos, begin_chain_crc=b.chain_crc)
    write_atomic(d / CHECKPOINT, state)


def _zero_from(path: Path, lo: int) -> None:
    """Zero `path` from byte `lo` to its end (only where it holds data) and fsync it."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        zeros = bytes(1 << 20)
        for a, b in list(data_extents(fd, lo, size)):
            while a < b:
                n = min(len(zeros), b - a)
                os.pwrite(fd, zeros[:n], a)
                a += n
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_files_from(directory: Path, pos: int) -> list[str]:
    """Delete the files of `directory` that start at or after `pos`, the last first, so a crash
    leaves a contiguous list; fsync the directory."""
    gone = []
    for f in reversed(list_files(directory)):
        if f.start < pos:
            break
        f.path.unlink()
        gone.append(f.path.name)
    if gone:
        fsync_path(directory)
    return gone


def _sync_files(directory: Path) -> None:
    for f in list_files(directory):
        fsync_path(f.path)


# --- truncate -----------------------------------------------------------------------------


def _record_at(v: Verdict, index: int) -> tuple[int, int, int, int]:
    """(pos, size, term, chain CRC field) of record `index` (< v.end_index): from its index
    unit when the header there agrees, else by walking the records from the log begin."""
    data = ReadOnlyFiles(v.files)
    try:
        for uf in list_files(v.store_dir / "index"):
            at = index * INDEX_UNIT_SIZE
            if uf.start <= at and at + INDEX_UNIT_SIZE <= uf.end:
                with open(uf.path, "rb") as fh:
                    fh.seek(at - uf.start)
                    raw = fh.read(INDEX_UNIT_SIZE)
                if len(raw) == INDEX_UNIT_SIZE:
                    _, pos, size, idx, _ = INDEX_UNIT.unpack(raw)
                    f = next((f for f in data.files if f.start <= pos and pos + HEADER_SIZE <= f.end), None)
                    if f is not None and idx == index:
                        h = HEADER.unpack_from(f.mm, pos - f.start)
                        if (h[1], h[2], h[4]) == (size, index, pos):
                            return pos, size, int(h[3]), int(h[6])
                break
        for _f, _off, h in records(data.files, v.begin.pos, v.begin.index, index + 1):
            if h[2] == index:
                return int(h[4]), int(h[1]), int(h[3]), int(h[6])
    finally:
        data.close()
    raise _refuse(f"record {index} not found")  # records() raises first


_RESYNC_TRIES = 1 << 16  # byte offsets tried per data file to find a record again past damage


def _records_past_damage(v: Verdict) -> int:
    """How many well-formed records lie past the record where the valid log stops (damage, or
    zeros with data after them), which a truncate also drops: each stretch is found again at
    the first non-zero bytes after the damage and at each later data file's start (records
    never span files), and read as long as its records follow one another."""
    if not (v.reason or v.refusal) or not v.files:
        return 0
    data = ReadOnlyFiles(v.files)
    found = 0
    try:
        for f in data.files:
            if f.end <= v.end_pos:
                continue
            off = max(v.end_extent, f.start) - f.start
            tries = _RESYNC_TRIES
            while off + HEADER_SIZE <= f.size and tries > 0:
                nz = next_nonzero(f.fd, off, f.size)  # only data extents: a preallocated file's hole is skipped
                if nz is None:
                    break
                at = max(off, nz - 3)  # a magic is a small big-endian int: its first bytes are 0
                h = HEADER.unpack_from(f.mm, at) if at + HEADER_SIZE <= f.size else None
                # a record names its own position: garbage that happens to parse almost never does
                chain = chain_before(h) if h is not None and h[4] == f.start + at else None
                res = scan(f.mm, at, f.size, int(h[2]), f.start + at, chain, int(h[3])) if h and chain is not None \
                    else None
                if res is None or res.count == 0:
                    off, tries = nz + 1, tries - 1  # the body of a damaged record: look further
                    continue
                found += res.count
                if res.stop in ("blank", "end"):
                    break
                off = at + res.consumed
    finally:
        data.close()
    return found


def truncate(store_dir: str | Path, from_index: int, force: bool = False) -> dict[str, object]:
    """Keep the entries before `from_index`, drop the rest (and whatever damage lies after
    them); the member then fetches the rest from the leader. Refused at or below the
    committed index unless `force` (those entries were acknowledged: the member must be caught
    up by the leader, and must not lead before it is)."""
    d = Path(store_dir)
    check_store_dir(d)
    lock = StoreDirLock(d)
    try:
        v = _judged(d, "truncate")
        n = from_index
        if n < v.begin.index:
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                             f"--from-index {n} is before the log begin {v.begin.index}. Nothing was changed.")
        damaged = bool(v.reason or v.refusal)  # something lies past the valid log
        if n >= v.end_index and not damaged:
            return _truncate_result(d, v, n, changed=False, warning="")
        if n > v.end_index:  # past damage: keeping it would leave a store no member opens
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                             f"records are valid only through {v.end_index - 1} (record {v.end_index} at "
                             f"{v.where}: {v.reason or 'zero, with data after it'}); truncate from {v.end_index} "
                             "or lower. Nothing was changed.")
        committed = v.committed_index
        warning = ""
        if n <= committed:
            if not force:
                raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"--from-index {n} is at or below the committed index {committed}: those entries "
                                 "were acknowledged to clients. Add --force to drop them anyway (the member must then "
                                 "be caught up by the leader). Nothing was changed.")
            warning = (f"dropped committed entries {n}..{committed}: start this member only while a leader holds "
                       "them, so it is caught up by the leader; it must not become leader with this log")
            log.warning("truncate of %s: %s", d, warning)
        past = _records_past_damage(v)
        if n == v.begin.index:
            # the checkpoint then holds the whole begin (its chain solved from the first record when
            # no checkpoint named it), so the next record appended keeps the begin's index
            new_pos, trusted = v.begin.pos, None
        else:
            pos, size, term, chain = _record_at(v, n - 1)
            new_pos = pos + size
            trusted = {"index": n - 1, "term": term, "pos": pos, "chain_crc": chain}
        # 1. the records kept are durable, 2. the checkpoint names the last of them: from here
        # on recovery may cut anything after it as a torn tail, so 3. (zeroing, deleting) can
        # stop anywhere and the store still opens
        _sync_files(d / "data")
        _fix_units(d, v, n)  # the checkpoint vouches for the units before its trusted record
        _write_checkpoint(d, v, min(committed, n - 1), trusted)
        f = next((f for f in v.files if f.start <= new_pos < f.end), None)
        if f is not None:
            _zero_from(f.path, new_pos - f.start)
        dropped = _drop_files_from(d / "data", new_pos if f is None else f.end)
        at = n * INDEX_UNIT_SIZE
        uf = next((u for u in list_files(d / "index") if u.start <= at < u.end), None)
        if uf is not None:
            _zero_from(uf.path, at - uf.start)
        dropped += _drop_files_from(d / "index", at if uf is None else uf.end)
        log.info("truncated %s from index %d (files deleted: %s)", d, n, ", ".join(dropped) or "none")
        return _truncate_result(d, v, n, changed=True, warning=warning, past=past)
    except OSError as e:
        raise _refuse(f"truncate of {d}: {e.strerror or e}; run it again") from e
    finally:
        lock.release()


def _truncate_result(d: Path, v: Verdict, n: int, changed: bool, warning: str, past: int = 0) -> dict[str, object]:
    out: dict[str, object] = {
        "store_dir": str(d),
        "from_index": n,
        "changed": changed,
        "begin_index": v.begin.index,
        "end_index": min(v.end_index, n) - 1,
        # the valid records from n on, and the well-formed ones found past the damage
        "valid_entries_dropped": max(0, v.end_index - n) + past,
        "records_past_damage_dropped": past,
        "committed_index": min(v.committed_index, n - 1),
    }
    if (v.reason or v.refusal) and changed:
        out["damage_dropped"] = (v.trusted_problem.split(". Nothing was changed")[0] if v.trusted_problem
                                 else f"{v.reason or 'zero bytes with data after them'} at {v.where}")
    if warning:
        out["warning"] = warning
    return out


# --- import -------------------------------------------------------------------------------


class _WritableFile:
    def __init__(self, path: Path, start: int, size: int) -> None:
        self.path, self.start, self.size = path, start, size
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def sync(self) -> None:
        self.mm.flush()
        os.fsync(self.fd)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy `src` to a new file `dst` of the same size, writing only its data extents."""
    with open(src, "rb") as fi:
        size = os.fstat(fi.fileno()).st_size
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, size)
            for a, b in list(data_extents(fi.fileno(), 0, size)):
                while a < b:
                    chunk = os.pread(fi.fileno(), min(8 << 20, b - a), a)
                    os.pwrite(fd, chunk, a)
                    a += len(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    """Swap two directory entries in one atomic step (Linux renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def import_store(store_dir: str | Path) -> dict[str, object]:
    """Fill the CRC fields of upstream DLedger's unverified records (both 0), so every record
    verifies from then on; also makes every index unit equal its record's header (upstream
    writes magic 1 in the unit of a NOOP appended as leader). Idempotent: a store with no
    unverified record keeps its data as it is."""
    d = Path(store_dir)
    check_store_dir(d)
    lock = StoreDirLock(d)
    swapped = unproven = False
    stage = d / IMPORT_DIR
    try:
        _check_import_layout(d)
        if stage.exists():  # an earlier import stopped: data/ is whole (old or new), this is not
            log.warning("import of %s: removing %s left by an earlier import that stopped", d, stage)
            shutil.rmtree(stage)
            fsync_path(d)
        v = _judged(d, "import")
        if v.refusal:
            raise _refuse(f"import needs a store a member opens; {v.refusal}")
        if v.unverified == 0:
            units = _fix_units(d, v, v.end_index)
            return {"store_dir": str(d), "filled": 0, "entries": v.end_index - v.begin.index,
                    "index_units_fixed": units, "note": "no unverified record: nothing to fill"}
        # the checkpoint during the swap proves nothing durable: it holds for the old data and the
        # new, and a crash before the last checkpoint leaves nothing recovery would cut as torn
        _write_checkpoint(d, v, min(v.committed_index, v.end_index - 1), None, proves_durable=False)
        unproven = True
        stage.mkdir()
        listed = {f.path.name for f in v.files}
        for e in os.scandir(d / "data"):  # everything of data/ goes over: the store's files, filled
            if e.name in listed:
                _copy_sparse(Path(e.path), stage / e.name)
            else:
                shutil.copy2(e.path, stage / e.name, follow_symlinks=False)  # not the store's: as it is
        fsync_path(stage)
        filled, last = _fill(stage, v)
        fsync_path(stage)
        try:
            exchange(stage, d / "data")
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOSYS):
                raise _refuse(f"import of {d}: this file system cannot swap two directories atomically "
                              f"(renameat2 RENAME_EXCHANGE: {e.strerror}); nothing of data/ was changed") from e
            raise
        swapped = True
        fsync_path(d)
        shutil.rmtree(stage)  # the old data, now under the stage's name
        fsync_path(d)
        units = _fix_units(d, v, v.end_index)
        _write_checkpoint(d, v, min(v.committed_index, v.end_index - 1), last)
        log.info("imported %s: %d records filled", d, filled)
        return {"store_dir": str(d), "filled": filled, "entries": v.end_index - v.begin.index,
                "index_units_fixed": units}
    except OSError as e:
        if swapped:
            state = ("data/ holds the filled records, but the checkpoint does not yet name what is durable "
                     "(a member opens the store strictly: nothing past the log begin is cut as torn)")
        elif unproven:
            state = "data/ was not changed (the checkpoint now names no durable record until an import finishes)"
        else:
            state = "data/ was not changed"
        raise _refuse(f"import of {d}: {e.strerror or e}; {state}; free what is needed and run it again") from e
    finally:
        if not swapped or stage.exists():
            _remove_stage(stage)
        lock.release()


def _check_import_layout(d: Path) -> None:
    """Refuse, before anything is written, a data/ that import could not carry over whole:
    the swap replaces the directory entry `data`, so a symlink there (data kept on another
    disk) would be replaced by a local copy, and the old tree removed with what is in it."""
    data = d / "data"
    if data.is_symlink():
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                         f"{data} is a symbolic link (to {os.path.realpath(data)}): import swaps the directory "
                         f"entry `data`, which would replace the link by a copy. Run it on the store directory "
                         f"the files are in (move them back, or give a --store-dir whose data/ is a real "
                         f"directory). Nothing was changed.")
    odd = []
    for e in os.scandir(data):
        st = e.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            odd.append(f"{e.name} (a symbolic link)")
        elif stat.S_ISDIR(st.st_mode):
            odd.append(f"{e.name}/ (a directory)")
        elif not stat.S_ISREG(st.st_mode):
            odd.append(f"{e.name} (not a regular file)")
    if odd:
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                         f"{data} holds {', '.join(sorted(odd))}: import rewrites data/ as a whole and carries "
                         f"over only the store's files and plain files. Move them out of data/ and run it "
                         f"again. Nothing was changed.")
    stage = d / IMPORT_DIR
    if stage.is_symlink() or (stage.exists() and not stage.is_dir()):
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                         f"{stage} is not a directory an earlier import left: import writes its copy there. "
                         f"Move it away and run it again. Nothing was changed.")


def _remove_stage(stage: Path) -> None:
    """Remove the import's copy (before the swap: the partial filled copy; after it: the old
    data, already replaced) when the import stops; never the store's data/."""
    try:
        if stage.is_dir() and not stage.is_symlink():
            shutil.rmtree(stage)
            fsync_path(stage.parent)
    except OSError as e:
        log.warning("import: could not remove %s (%s); the next import removes it", stage, e.strerror or e)


def _fill(stage: Path, v: Verdict) -> tuple[int, dict[str, int] | None]:
    """Recompute body and chain CRCs of every record in the copies under `stage`, front to
    back (a chain depends on the one before). Returns the records filled and the last one's
    checkpoint entry."""
    files: list[_WritableFile] = []
    for sf in v.files:
        if sf.size == 0:
            break  # an empty file holds nothing (and cannot be mapped): the log ended before it
        files.append(_WritableFile(stage / sf.path.name, sf.start, sf.size))
    filled = 0
    last: dict[str, int] | None = None
    try:
        chain = v.begin.chain_crc or 0
        pending = 0
        for f, off, h in records(files, v.begin.pos, v.begin.index, v.end_index):
            ccrc, bcrc = h[6], h[7]
            if ccrc == 0 and bcrc == 0:
                bcrc = zlib.crc32(f.mm[off + HEADER_SIZE : off + h[1]])
                filled += 1
            chain = chain_crc(h[2], h[3], bcrc, chain)
            if (chain, bcrc) != (h[6], h[7]):
                _CRCS.pack_into(f.mm, off + _CRC_OFFSET, chain, bcrc)
                pending += h[1]
                if pending >= SYNC_BATCH:
                    f.sync()
                    pending = 0
            last = {"index": h[2], "term": h[3], "pos": h[4], "chain_crc": chain}
        for f in files:
            f.sync()
    finally:
        for f in files:
            f.close()
    return filled, last


def _fix_units(d: Path, v: Verdict, stop: int) -> int:
    """Make the index unit of every record before `stop` equal its header, in place. A
    checkpoint naming a trusted record vouches for the units before it (recovery rebuilds only
    those after it), and upstream writes magic 1 in the unit of a NOOP it appended as leader
    (its record says 2). Crash-safe: units are derived data, each either form after a crash,
    and no checkpoint trusting them is written before they are synced."""
    data = ReadOnlyFiles(list_files(d / "data"))
    ufiles = [f for f in list_files(d / "index") if f.size]
    fixed = 0
    try:
        fds = {u.path: os.open(u.path, os.O_RDWR | os.O_CLOEXEC) for u in ufiles}
        try:
            for _, _, h in records(data.files, v.begin.pos, v.begin.index, stop):
                at = h[2] * INDEX_UNIT_SIZE
                u = next((u for u in ufiles if u.start <= at and at + INDEX_UNIT_SIZE <= u.end), None)
                if u is None:
                    continue  # no index file there: recovery rebuilds what is missing
                want = INDEX_UNIT.pack(h[0], h[4], h[1], h[2], h[3])
                if os.pread(fds[u.path], INDEX_UNIT_SIZE, at - u.start) != want:
                    os.pwrite(fds[u.path], want, at - u.start)
                    fixed += 1
            for fd in fds.values():
                os.fsync(fd)
        finally:
            for fd in fds.values():
                os.close(fd)
    finally:
        data.close()
    return fixed


# --- repair-checkpoint ---------------------------------------------------------------------


def repair_checkpoint(store_dir: str | Path) -> dict[str, object]:
    """Move aside a checkpoint a member refuses to start on: one that cannot be read, or one
    claiming a committed index beyond the end of the valid data (upstream DLedger's
    `committedIndex`, say, over a log cut shorter). It is renamed to
    `checkpoint.unreadable-<UTC time>` (nothing deleted) and none is written: the member then
    opens as on a store without one (nothing past the log begin proven torn; a committed index
    of -1 until the leader tells it more). Refused when the checkpoint is sound."""
    d = Path(store_dir)
    check_store_dir(d)
    lock = StoreDirLock(d)
    try:
        path = d / CHECKPOINT
        why = ""
        try:
            ckpt = read_checkpoint(d)
        except UnreadableFile as e:
            ckpt, why = None, e.message
        if not why:
            if ckpt is None:
                raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, f"{d} has no checkpoint: nothing to repair")
            end = judge(d).end_index - 1
            if ckpt.committed_index <= end:
                raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"{path} is readable and its committed index {ckpt.committed_index} is within the "
                                 f"data (through {end}): nothing to repair. Nothing was changed.")
            why = f"it claims committed index {ckpt.committed_index}, but the data holds records only through {end}"
        base = f"{CHECKPOINT}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        aside, n = d / base, 1
        while os.path.lexists(aside):  # never over an earlier one
            aside, n = d / f"{base}.{n}", n + 1
        os.rename(path, aside)
        fsync_path(d)
        log.warning("repair-checkpoint of %s: moved %s aside to %s (%s)", d, path, aside.name, why)
        return {"store_dir": str(d), "checkpoint": str(path), "moved_to": str(aside), "why": why,
                "note": "no checkpoint now: the member opens as on a store without one"}
    except OSError as e:
        raise _refuse(f"repair-checkpoint of {d}: {e.strerror or e}") from e
    finally:
        lock.release()


# --- export -------------------------------------------------------------------------------


@dataclass
class _Out:
    """Files of one kind being written in the copy: each exactly `size` bytes."""

    directory: Path
    size: int
    fd: int = -1
    start: int = -1

    def at(self, pos: int) -> tuple[int, int]:
        """The descriptor and offset for logical position `pos`, opening its file."""
        start = pos - pos % self.size
        if start != self.start:
            self.close()
            self.fd = os.open(self.directory / file_name(start), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.ftruncate(self.fd, self.size)
            self.start = start
        return self.fd, pos - start

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd, self.start = -1, -1


def export(store_dir: str | Path, out: str | Path, data_file_size: int = UPSTREAM_DATA_FILE_SIZE,
           index_file_size: int = UPSTREAM_INDEX_FILE_SIZE) -> dict[str, object]:
    """Write an upstream-readable copy of the store to the new directory `out`: the same
    indexes, terms and bodies; SESSION records (which upstream cannot read) as NOOPs with an
    empty body, as upstream writes its own; files of exactly the sizes upstream is configured
    with, each but the last closed by a blank record; `currterm` in upstream's Properties form. The CRC
    fields are dledger's (upstream ignores them), so the copy is also a verified dledger store."""
    d, o = Path(store_dir), Path(out)
    check_store_dir(d)
    if data_file_size < 4096 or data_file_size >= 1 << 31:
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, "--data-file-size must be in [4096, 2**31)")
    if index_file_size <= 0 or index_file_size % INDEX_UNIT_SIZE or index_file_size >= 1 << 31:
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                         "--index-file-size must be a positive multiple of 32 below 2**31")
    if o.exists() and (not o.is_dir() or any(o.iterdir())):
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, f"{o} exists and is not empty: refusing to overwrite it")
    lock = StoreDirLock(d)
    try:
        v = _judged(d, "export")
        if v.refusal:
            raise _refuse(f"export needs a store a member opens; {v.refusal}")
        try:
            tf = read_currterm(d)
        except UnreadableFile as e:
            raise _refuse(f"{e.message}: export needs the term and vote") from e
        (o / "data").mkdir(parents=True, exist_ok=True)
        (o / "index").mkdir(exist_ok=True)
        result = _export_records(d, o, v, data_file_size, index_file_size)
        term = tf.term if tf is not None else max(v.end_term, 0)
        vote = tf.voted_for if tf is not None and tf.voted_for else ""
        write_currterm(o / "currterm", term, vote or None)  # escaped as java.util.Properties reads it
        for sub in ("data", "index"):
            fsync_path(o / sub)
        fsync_path(o)
        result.update(store_dir=str(d), to=str(o), term=term, voted_for=vote or None,
                      data_file_size=data_file_size, index_file_size=index_file_size,
                      crc_fields="dledger's (body CRC and chain CRC filled; upstream ignores them)")
        return result
    except OSError as e:
        raise _refuse(f"export of {d} to {o}: {e.strerror or e}") from e
    finally:
        lock.release()


def _export_records(d: Path, o: Path, v: Verdict, dsize: int, isize: int) -> dict[str, object]:
    data = ReadOnlyFiles(v.files)
    dout, iout = _Out(o / "data", dsize), _Out(o / "index", isize)
    sessions = 0
    pos = 0
    chain = 0 if v.begin.index == 0 else (v.begin.chain_crc or 0)
    term = -1
    try:
        for f, off, h in records(data.files, v.begin.pos, v.begin.index, v.end_index):
            magic, index, term = h[0], h[2], h[3]
            body = bytes(f.mm[off + HEADER_SIZE : off + h[1]])
            if magic == MAGIC_SESSION:
                magic, body = MAGIC_NOOP, b""
                sessions += 1
            if magic not in UPSTREAM_MAGICS:
                raise _refuse(f"record {index} has magic {magic}, which upstream DLedger cannot read")
            size = HEADER_SIZE + len(body)
            if size + BLANK_SIZE > dsize:
                raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"record {index} ({size} bytes) does not fit a data file of {dsize} bytes")
            if pos % dsize + size + BLANK_SIZE > dsize:  # upstream's rule (MmapFileList.preAppend)
                fd, at = dout.at(pos)
                os.pwrite(fd, BLANK.pack(MAGIC_BLANK, dsize - at), at)
                pos += dsize - at
            bcrc = zlib.crc32(body)
            chain = chain_crc(index, term, bcrc, chain)
            fd, at = dout.at(pos)
            os.pwrite(fd, HEADER.pack(magic, size, index, term, pos, 0, chain, bcrc, len(body)) + body, at)
            ifd, iat = iout.at(index * INDEX_UNIT_SIZE)
            os.pwrite(ifd, INDEX_UNIT.pack(magic, pos, size, index, term), iat)
            pos += size
        if v.end_index == v.begin.index:
            dout.at(0)  # an empty log: upstream's first file, empty
    finally:
        dout.close()
        iout.close()
        data.close()
    return {"entries": v.end_index - v.begin.index, "begin_index": v.begin.index, "end_index": v.end_index - 1,
            "session_records_as_noop": sessions, "data_files": len(list_files(o / "data")),
            "index_files": len(list_files(o / "index"))}


__all__ = ["IMPORT_DIR", "UPSTREAM_DATA_FILE_SIZE", "UPSTREAM_INDEX_FILE_SIZE", "exchange", "export",
           "import_store", "records", "repair_checkpoint", "truncate"]
