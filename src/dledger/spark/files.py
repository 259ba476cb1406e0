"""`format("dledger-files")`: a member's store directory read offline, read-only (SPEC §2, §7).

Nothing is written and no recovery runs, so it is safe on a copy, on a stopped
member, or (for the committed part) next to a live one. One partition per data
file. The driver reads only the first record header of each file; the task of
file k gets the first header of file k+1, so chains are checked across files
without reading a record twice.

What is validated, for every record read:
- magic (NORMAL, NOOP, CONFIG_CHANGE; a blank 0xFFFFFFFF closes a file and its
  length must reach the end of the file), size (48 + body size, within the file),
  channel 0;
- index continuity (within a file, and file k's last index + 1 == file k+1's
  first index), pos (a record's own logical position; file k+1 starts at the
  offset in its name), terms never going down;
- body CRC-32, and the chain CRC of every record from its predecessor's
  (across files too). The first record of the directory is checked against the
  checkpoint's `begin_chain_crc` (0 for a log that begins at index 0).
- the log reaches the checkpoint's committed index (committed entries are never
  removed, so a log that ends before it lost data).
- Not read: `index/` files and `currterm`.

Only records up to the committed index of `checkpoint` are read (all with
`includeUncommitted`, where a torn tail past the committed index ends the
read with a warning, as recovery would cut it).
"""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import os
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from dledger.broker.confirm_file import read_confirm
from dledger.entry import (
    BLANK,
    ENTRY_MAGICS,
    HEADER,
    HEADER_SIZE,
    MAGIC_BLANK,
    MAGIC_NORMAL,
    chain_crc,
)
from dledger.spark.options import FILES_OPTIONS, OptionError, check_names, get_bool, get_str
from dledger.spark.schema import ARROW_RECORD_SCHEMA, ENTRY_SCHEMA, RECORD_SCHEMA, entry_batch

log = logging.getLogger(__name__)

_NAME = re.compile(r"^\d{20}$")
BATCH_ROWS = 4096  # rows per Arrow batch
NO_LIMIT = (1 << 63) - 1


class CorruptStoreError(RuntimeError):
    """A record failed validation; the message names the file and the offset in it."""


@dataclass(frozen=True, slots=True)
class Head:
    """The first record header of a data file, as the driver read it."""

    index: int
    term: int
    pos: int
    chain_crc: int
    body_crc: int


@dataclass
class FilePartition(InputPartition):
    """One data file; `next_head` is the next file's first record (None for the last file)."""

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


@dataclass(frozen=True, slots=True)
class StoreLayout:
    member: str
    group: str
    committed_index: int
    begin_index: int
    begin_pos: int
    begin_chain_crc: int | None
    files: list[tuple[Path, int, int]]  # (path, logical start, size)


def read_checkpoint(store_dir: Path) -> dict[str, object]:
    """The checkpoint JSON, read without writing anything; {} when missing."""
    p = store_dir / "checkpoint"
    try:
        data = json.loads(p.read_bytes())
    except FileNotFoundError:
        log.warning("%s has no checkpoint: no entry is known committed", store_dir)
        return {}
    except ValueError as e:
        raise CorruptStoreError(f"{p}: unreadable checkpoint: {e}") from e
    if not isinstance(data, dict):
        raise CorruptStoreError(f"{p}: checkpoint is not a JSON object")
    return data


def _int(data: Mapping[str, object], key: str, default: int) -> int:
    v = data.get(key, default)
    return int(v) if isinstance(v, (int, str)) else default


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
    files: list[tuple[Path, int, int]] = []
    for p in sorted(data_dir.iterdir()):
        if _NAME.match(p.name) and p.is_file():
            files.append((p, int(p.name), p.stat().st_size))
    for (p, start, size), (q, nstart, _) in itertools.pairwise(files):
        if start + size != nstart:
            raise CorruptStoreError(f"{q}: data file starts at {nstart}, but {p.name} ends at {start + size} "
                                    "(a data file is missing or has the wrong size)")
    begin_chain = ckpt.get("begin_chain_crc")
    return StoreLayout(
        member=member or store_dir.resolve().name,
        group=group or store_dir.resolve().parent.name,
        committed_index=confirmed if confirmed is not None else _int(ckpt, "committed_index", -1),
        begin_index=_int(ckpt, "begin_index", 0),
        begin_pos=_int(ckpt, "begin_pos", files[0][1] if files else 0),
        begin_chain_crc=int(begin_chain) if isinstance(begin_chain, int) else None,
        files=files,
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


def plan(store_dir: Path, include_uncommitted: bool, records: bool = False, group: str | None = None,
         member: str | None = None) -> list[FilePartition]:
    """One partition per data file that holds records in the range to read."""
    lay = layout(store_dir, group, member)
    last_index = NO_LIMIT if include_uncommitted else lay.committed_index
    heads: list[tuple[Path, int, int, Head]] = []
    for path, start, _size in lay.files:
        if start + _size <= lay.begin_pos:
            continue  # wholly before the log begin (about to be deleted)
        scan_from = max(start, lay.begin_pos)
        h = _first_head(path, scan_from - start)
        if h is None:
            continue  # allocated, nothing written yet
        if h.pos != scan_from:
            raise CorruptStoreError(f"{path}: corrupt record at offset {scan_from - start}: pos {h.pos}, "
                                    f"expected {scan_from}")
        heads.append((path, start, scan_from, h))
    out: list[FilePartition] = []
    for k, (path, start, scan_from, h) in enumerate(heads):
        if h.index > last_index:
            break
        prev_chain = None
        if k == 0 and h.index == lay.begin_index:
            prev_chain = lay.begin_chain_crc if lay.begin_chain_crc is not None else (0 if h.index == 0 else None)
        nxt = heads[k + 1][3] if k + 1 < len(heads) else None
        out.append(FilePartition(lay.member, lay.group, str(path), start, scan_from, h.index, prev_chain, nxt,
                                 last_index, lay.committed_index, lay.begin_index, records))
    log.info("%s: %d data files to read, committed index %d", store_dir, len(out), lay.committed_index)
    return out


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
    """Validate the records of one data file and yield them as Arrow batches.

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
            yield from _scan(p, mm, size)


def _scan(p: FilePartition, mm: mmap.mmap, size: int) -> Iterator[pa.RecordBatch]:
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    rows = _Rows()
    off = p.scan_from - p.file_start
    index, pos = p.first_index, p.scan_from
    chain = p.prev_chain
    term_floor = -1
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

    while True:
        if index > p.last_index:
            stop = "limit"
            break
        if off + 8 > size:
            break
        magic = int.from_bytes(mm[off : off + 4], "big", signed=True)
        if magic == MAGIC_BLANK:
            length = BLANK.unpack_from(mm, off)[1]
            if length != size - off:
                stop = fail(f"blank record of length {length}, expected {size - off} (the rest of the file)", off)
            else:
                stop = "blank"
            break
        if magic == 0 and not any(mm[off : off + 8]):
            stop = "zero"
            break
        if magic not in ENTRY_MAGICS:
            stop = fail(f"bad magic {magic}", off)
            break
        if off + HEADER_SIZE > size:
            stop = fail("truncated header", off)
            break
        (_, rsize, idx, term, rpos, channel, ccrc, bcrc, bsize) = unpack(mm, off)
        reason = None
        if rsize != HEADER_SIZE + bsize or bsize < 0:
            reason = f"bad size {rsize} (body {bsize})"
        elif off + rsize > size:
            reason = f"record of {rsize} bytes runs past the end of the file"
        elif idx != index:
            reason = f"index {idx}, expected {index}"
        elif rpos != pos:
            reason = f"pos {rpos}, expected {pos}"
        elif channel != 0:
            reason = f"bad channel {channel} (reserved, must be 0)"
        elif term < term_floor:
            reason = f"term {term} below the previous term {term_floor}"
        if reason is not None:
            stop = fail(reason, off)
            break
        body = mm[off + HEADER_SIZE : off + rsize]
        soft: list[str] = []
        if crc32(body) != bcrc:
            soft.append("body crc mismatch")
        if chain is not None and chain_crc(idx, term, bcrc, chain) != ccrc:
            soft.append("chain crc mismatch")
        if soft:
            if index > p.committed_index:
                fail("; ".join(soft), off)
                stop = "torn"
                break
            if not p.records:
                fail("; ".join(soft), off)
        chain = ccrc
        term_floor = term
        if p.records:
            rows.index.append(idx)
            rows.term.append(term)
            rows.pos.append(rpos)
            rows.magic.append(magic)
            rows.chain.append(ccrc)
            rows.bcrc.append(bcrc)
            rows.bsize.append(bsize)
            rows.offset.append(off)
            rows.error.append("; ".join(soft) if soft else None)
        elif magic == MAGIC_NORMAL and idx >= p.begin_index:
            rows.index.append(idx)
            rows.term.append(term)
            rows.pos.append(rpos)
            rows.body.append(body)
        if len(rows) >= BATCH_ROWS:
            yield _emit(p, rows)
            rows = _Rows()
        off += rsize
        pos += rsize
        index += 1

    if stop in ("blank", "zero", "end"):
        _check_link(p, stop, index, chain, term_floor, off, rows)
    if len(rows):
        yield _emit(p, rows)


def _emit(p: FilePartition, rows: _Rows) -> pa.RecordBatch:
    if p.records:
        return _records_batch(p, rows)
    return entry_batch(p.group, rows.index, rows.term, rows.pos, rows.body)


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
    if chain is not None and chain_crc(nxt.index, nxt.term, nxt.body_crc, chain) != nxt.chain_crc:
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


class DLedgerFilesReader(DataSourceReader):
    def __init__(self, store_dir: Path, include_uncommitted: bool, records: bool, group: str | None,
                 member: str | None) -> None:
        self.store_dir = store_dir
        self.include_uncommitted = include_uncommitted
        self.records = records
        self.group = group
        self.member = member

    def partitions(self) -> list[InputPartition]:
        return list(plan(self.store_dir, self.include_uncommitted, self.records, self.group, self.member))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, FilePartition):
            yield from read_file(partition)


class DLedgerFilesDataSource(DataSource):
    """`spark.read.format("dledger-files").load("<store_dir>")`.

    Options: `path` (the member's store directory), `includeUncommitted` [false],
    `group` [the directory's parent name, as `dledger cluster` lays it out],
    `mode` [entries | records], `member` [the directory's name; records mode].
    """

    @classmethod
    def name(cls) -> str:
        return "dledger-files"

    def _mode(self) -> bool:
        mode = (get_str(self.options, "mode") or "entries").lower()
        if mode not in ("entries", "records"):
            raise OptionError(f"option mode: expected entries or records, got {mode!r}")
        return mode == "records"

    def schema(self) -> str:
        check_names(self.options, FILES_OPTIONS, "dledger-files")
        return RECORD_SCHEMA if self._mode() else ENTRY_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        path = get_str(self.options, "path")
        if path is None:
            raise OptionError('format("dledger-files") needs a store directory: .load("<data_dir>/<group>/<member>")')
        return DLedgerFilesReader(Path(path), get_bool(self.options, "includeUncommitted", False), self._mode(),
                                  get_str(self.options, "group"), get_str(self.options, "member"))
