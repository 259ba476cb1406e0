"""One offline view of a store directory (docs/format.md, "On disk"), read without writing.

What a member's store directory holds, read the same way by every reader that is not the
running store: recovery (store/recovery.py), `dledger store inspect|repair-term`
(store/admin.py), Spark's `format("dledger-files")` (spark/files.py), and the mapped file
lists (store/mapped_file.py) for the names of their files.

- Data and index files: named by their logical start offset, 20 digits (`NAME`, the only
  copy of that rule); `list_files` and `first_gap`.
- `checkpoint` and `currterm`: one rule for both. A missing file is None (a new store has
  neither); a file that exists but cannot be read (not JSON, not an object, a field of the
  wrong type) is an `UnreadableFile` error naming the file and what is wrong. Both files
  are written atomically (temp, fsync, rename), so an unreadable one is damage, and
  guessing would lose something: without the committed index recovery could cut committed
  records as a torn tail, and a reader would take an empty log for the whole one; without
  the term a member could vote twice in one term. The error loses nothing: the caller
  refuses (recovery, Spark) or reports it (`dledger store inspect`).
- Integers in them are `as_int`: a JSON `true` is not the integer 1.
- The log begin: the checkpoint's, or, when it has none (a new store, a checkpoint from
  before retention), derived from the first record of the first data file (`derive_begin`).
- Record headers: the rules are dledger.entry's (`record_fault`, `header_fault`,
  `magic_stop`, also used by `entry.scan`); `read_header` reads one from a file, and
  `chain_before` solves the chain CRC before a first record whose predecessor is gone.
  The magics accepted are ENTRY_MAGICS: ours, which include upstream DLedger's (1 for its
  records, 2 for its NOOPs); a store upstream wrote lists, and its headers pass these rules,
  but its CRC fields are 0, so its records fail the CRC checks as damaged ones would.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.codes import ResponseCode
from dledger.entry import ENTRY_MAGICS, HEADER, HEADER_SIZE, header_fault, unverified
from dledger.store.base import StoreError

NAME = re.compile(r"^\d{20}$")  # a data or index file: its logical start offset, 20 digits
CHECKPOINT = "checkpoint"
CURRTERM = "currterm"


def file_name(start: int) -> str:
    return f"{start:020d}"


@dataclass(frozen=True, slots=True)
class StoreFile:
    """A data or index file: its logical start (its name) and its size on disk."""

    path: Path
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def list_files(directory: Path) -> list[StoreFile]:
    """The regular files of `directory` named by a 20-digit start, in order of start; [] when
    the directory is missing. Other names (a `.tmp`, an editor's backup) are not the store's."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    out = [StoreFile(Path(e.path), int(e.name), e.stat().st_size)
           for e in entries if NAME.match(e.name) and e.is_file()]
    out.sort(key=lambda f: f.start)
    return out


def first_gap(files: Sequence[StoreFile]) -> tuple[StoreFile, StoreFile] | None:
    """The first two neighbours where one does not start where the other ends (a file missing,
    or one of the wrong size); None when the files are contiguous."""
    for a, b in itertools.pairwise(files):
        if a.end != b.start:
            return a, b
    return None


def as_int(v: object) -> int | None:
    """`v` when it is an integer, else None. bool is a subclass of int in Python, but a JSON
    `true` where a number belongs is damage, not 1."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class UnreadableFile(StoreError):
    """`checkpoint` or `currterm` exists but cannot be read (DISK_ERROR); `path` names it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(ResponseCode.DISK_ERROR, f"{path} is unreadable ({why})")
        self.path = path
        self.why = why


def _read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing; UnreadableFile otherwise."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnreadableFile(path, e.strerror or str(e)) from e
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise UnreadableFile(path, f"not JSON: {e}") from e
    if not isinstance(data, dict):
        raise UnreadableFile(path, "not a JSON object")
    return data


def _field(path: Path, data: dict[str, Any], key: str, default: int | None = None) -> int:
    """An integer field; `default` when absent (None: required); UnreadableFile when it is of
    another type."""
    if key not in data and default is not None:
        return default
    v = as_int(data.get(key))
    if v is None:
        raise UnreadableFile(path, f"{key} is {data.get(key)!r}, not an integer")
    return v


@dataclass(frozen=True, slots=True)
class LogBegin:
    """The first entry of the log: its index, the term and chain CRC before it (the snapshot's
    last, or -1 and 0 for a log that starts at index 0), its position. chain_crc None: not
    known (derived from the data of a log that does not start at 0): a reader takes the
    first record's chain as given and checks all later ones."""

    index: int
    term: int
    pos: int
    chain_crc: int | None


@dataclass(frozen=True, slots=True)
class Trusted:
    """The last record known durable when the checkpoint was written (recovery's start)."""

    index: int
    term: int
    pos: int
    chain_crc: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    committed_index: int  # -1 when the checkpoint names none
    begin: LogBegin | None  # None: the checkpoint has no log begin (derive_begin)
    trusted: Trusted | None
    # dledger's own: past its trusted record (or the log begin) nothing was known fsynced, so
    # recovery may cut a torn tail there; upstream DLedger's names no such position
    proves_durable: bool = True


_BEGIN_KEYS = ("begin_index", "begin_term", "begin_pos", "begin_chain_crc")


def read_checkpoint(store_dir: Path) -> Checkpoint | None:
    """The store's checkpoint; None when there is none; UnreadableFile when it is damaged.

    The log begin is taken only whole (all four fields), as recovery always did; a missing
    `trusted` or a null one is none; any field present with a value of the wrong type makes
    the whole file unreadable rather than defaulted."""
    path = store_dir / CHECKPOINT
    data = _read_object(path)
    if data is None:
        return None
    begin = None
    if all(k in data for k in _BEGIN_KEYS):
        index, term, pos, chain = (_field(path, data, k) for k in _BEGIN_KEYS)
        begin = LogBegin(index, term, pos, chain)
    else:
        for k in _BEGIN_KEYS:
            if k in data:
                _field(path, data, k)  # a partial begin is ignored, a damaged field is not
    trusted = None
    t = data.get("trusted")
    if isinstance(t, dict):
        trusted = Trusted(*(_field(path, t, k) for k in ("index", "term", "pos", "chain_crc")))
    elif t is not None:
        raise UnreadableFile(path, f"trusted is {t!r}, not an object")
    return Checkpoint(_field(path, data, "committed_index", -1), begin, trusted)


@dataclass(frozen=True, slots=True)
class TermFile:
    term: int
    voted_for: str | None


def read_currterm(store_dir: Path) -> TermFile | None:
    """The store's `currterm`; None when there is none; UnreadableFile when it is damaged
    (a member refuses to start rather than forget a vote)."""
    path = store_dir / CURRTERM
    data = _read_object(path)
    if data is None:
        return None
    term = as_int(data.get("term"))
    if term is None:
        raise UnreadableFile(path, "no integer term in it")
    voted = data.get("voted_for")
    return TermFile(term, voted if isinstance(voted, str) else None)


# --- record headers ---------------------------------------------------------------------------


def read_header(path: Path, offset: int) -> tuple[int, ...] | None:
    """The 48-byte header at `offset` of `path` (HEADER.unpack), None when fewer bytes are
    there. Not checked: see entry.header_fault."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, HEADER_SIZE, offset)
    finally:
        os.close(fd)
    return HEADER.unpack(raw) if len(raw) == HEADER_SIZE else None


def first_record_index(h: tuple[int, ...] | None, pos: int, room: int) -> int | None:
    """The index held by header `h` when it is a sound record at logical position `pos`."""
    if h is None or header_fault(h, room) is not None or h[4] != pos:
        return None
    return int(h[2])


def derive_begin(first: tuple[int, ...] | None, start: int, room: int) -> LogBegin:
    """The log begin of a store whose checkpoint does not name one: the first data file's
    first record (`first`, its header; None when the file is too short to hold one), at the
    file's start. A log that starts at index 0 starts the chain from 0; one that starts later
    (its files before it deleted) has an unknown chain before it. No sound record there:
    index 0 (the log is empty or the record is torn, as recovery then finds)."""
    index = first_record_index(first, start, room)
    if index is None or index == 0:
        return LogBegin(0, -1, start, 0)
    return LogBegin(index, -1, start, None)


def chain_before(h: tuple[int, ...]) -> int | None:
    """The chain value `prev` under which the record with header `h` has a valid chain CRC.

    Used when the record before the first one read is gone and its chain CRC not saved (a
    log that does not start at index 0, without a checkpoint naming its begin): the first
    record is then taken as given and all later ones are checked. crc32(msg, prev) is affine
    in prev over GF(2), so solve A·prev = target ^ crc32(msg, 0) with an XOR basis of the 32
    columns A·e_b."""
    if h[0] not in ENTRY_MAGICS:
        return None
    if unverified(h[6], h[7], 0):
        return 0  # upstream's record: its chain follows 0 (entry.unverified)
    msg = struct.pack(">qqI", h[2], h[3], h[7])
    base = zlib.crc32(msg, 0)
    basis: list[tuple[int, int]] = []  # (vector, which e_b combine to it), leading bits distinct
    for b in range(32):
        v, comb = zlib.crc32(msg, 1 << b) ^ base, 1 << b
        for bv, bc in basis:
            if v ^ bv < v:
                v, comb = v ^ bv, comb ^ bc
        if v:
            basis.append((v, comb))
            basis.sort(reverse=True)
    want, result = h[6] ^ base, 0
    for bv, bc in basis:
        if want ^ bv < want:
            want, result = want ^ bv, result ^ bc
    return result if want == 0 else None


__all__ = [
    "CHECKPOINT",
    "CURRTERM",
    "NAME",
    "Checkpoint",
    "LogBegin",
    "StoreFile",
    "TermFile",
    "Trusted",
    "UnreadableFile",
    "as_int",
    "chain_before",
    "derive_begin",
    "file_name",
    "first_gap",
    "first_record_index",
    "list_files",
    "read_checkpoint",
    "read_currterm",
    "read_header",
]
