"""One offline view of a store directory (docs/format.md, "On disk"), read without writing.

What a member's store directory holds, read the same way by every reader that is not the
running store: recovery (store/recovery.py), `dledger store inspect|repair-term`
(store/admin.py), Spark's `format("dledger-files")` (spark/files.py), and the mapped file
lists (store/mapped_file.py) for the names of their files.

- Data and index files: named by their logical start offset, 20 digits (`NAME`, the only
  copy of that rule); `list_files` and `first_gap`.
- `checkpoint` and `currterm`: one rule for both. A missing file is None (a new store has
  neither); a file that exists but cannot be read (not JSON or Java Properties, a field of
  the wrong type) is an `UnreadableFile` error naming the file and what is wrong. Both forms
  are read: dledger's JSON and upstream DLedger's Properties (`currTerm=`, `voteLeader=`;
  an older upstream `checkpoint` with `committedIndex=`, which proves nothing durable).
  `currterm` is written in the Properties form (store/checkpoint.py), so upstream reads
  dledger's term and vote. Upstream replaces `currterm` by writing `currterm.tmp`, copying
  the old one to `currterm.bak`, deleting it and renaming: a crash there leaves no
  `currterm`, and the highest term of those two is taken (a term only grows).
  dledger writes both files atomically (temp, fsync, rename), so an unreadable one is damage, and
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

import errno
import itertools
import json
import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.codes import ResponseCode
from dledger.core.messages import LIMIT
from dledger.entry import BLANK_SIZE, ENTRY_MAGICS, HEADER, HEADER_SIZE, MAGIC_BLANK, header_fault, unverified
from dledger.store.base import StoreError
from dledger.store.properties import PropertiesError, parse_properties

log = logging.getLogger(__name__)

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


def _read_raw(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnreadableFile(path, e.strerror or str(e)) from e


def _is_json(raw: bytes) -> bool:
    """dledger's form (JSON, an object when sound) rather than upstream DLedger's Java Properties."""
    if raw.lstrip()[:1] in (b"{", b"["):
        return True
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _read_properties(path: Path, raw: bytes) -> dict[str, str]:
    try:
        return parse_properties(raw)
    except PropertiesError as e:
        raise UnreadableFile(path, f"not JSON, and not Java Properties: {e}") from e


def _prop_int(path: Path, props: dict[str, str], key: str) -> int | None:
    """An integer as Java's Long.parseLong reads it; None when the key is absent."""
    if key not in props:
        return None
    v = props[key].strip(" \t\f")
    if not re.fullmatch(r"[+-]?\d{1,19}", v):
        raise UnreadableFile(path, f"{key} is {props[key]!r}, not an integer")
    return int(v)


def _read_object(path: Path, raw: bytes | None = None) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing; UnreadableFile otherwise."""
    if raw is None:
        raw = _read_raw(path)
    if raw is None:
        return None
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
    # the size of the store's data and index files (None: not recorded, a checkpoint written
    # before they were, or upstream's): a file shorter than it is one whose creation or last
    # writes a crash cut short (store/mapped_file.py, `store_file_size`)
    data_file_size: int | None = None
    index_file_size: int | None = None
    # by magic, the indexes of the log's entries of that magic from its begin through `upto`
    # (a cache of the index, so a start need not scan all of it: store/marks.py)
    markers: dict[int, tuple[int, tuple[int, ...]]] | None = None


_BEGIN_KEYS = ("begin_index", "begin_term", "begin_pos", "begin_chain_crc")


def repair_checkpoint_hint(d: Path | str) -> str:
    """What to run on a checkpoint a member refuses to start on (every such refusal names it)."""
    return (f"run `dledger store repair-checkpoint --store-dir {d}` to move it aside (nothing is deleted); "
            "the member then opens as on a store without one")


def read_checkpoint(store_dir: Path) -> Checkpoint | None:
    """The store's checkpoint; None when there is none; UnreadableFile when it is damaged,
    its message naming the way out (repair_checkpoint_hint)."""
    try:
        return _read_checkpoint(store_dir)
    except UnreadableFile as e:
        if "repair-checkpoint" in e.why:
            raise
        raise UnreadableFile(e.path, f"{e.why}; {repair_checkpoint_hint(store_dir)}") from e


def _read_checkpoint(store_dir: Path) -> Checkpoint | None:
    """The log begin is taken only whole (all four fields), as recovery always did; a missing
    `trusted` or a null one is none; any field present with a value of the wrong type makes
    the whole file unreadable rather than defaulted."""
    path = store_dir / CHECKPOINT
    raw = _read_raw(path)
    if raw is None:
        return None
    if not _is_json(raw):  # upstream DLedger's (before it moved to snapshots): endIndex, committedIndex
        committed = _prop_int(path, _read_properties(path, raw), "committedIndex")
        if committed is None:  # upstream always writes it
            raise UnreadableFile(path, "neither JSON nor upstream DLedger's Properties form (no committedIndex)")
        return Checkpoint(committed, None, None, proves_durable=False)
    data = _read_object(path, raw)
    assert data is not None
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
    data_size, index_size = (_field(path, data, k) if k in data else None
                             for k in ("data_file_size", "index_file_size"))
    # false while a rewrite of the records (`dledger store import`) may have left bytes past the
    # trusted record that no fsync covered; absent in every checkpoint a member writes: true
    durable = data.get("proves_durable", True)
    if not isinstance(durable, bool):
        raise UnreadableFile(path, f"proves_durable is {durable!r}, not true or false")
    return Checkpoint(_field(path, data, "committed_index", -1), begin, trusted, durable, data_size, index_size,
                      _markers(data.get("markers")))


def _markers(v: object) -> dict[int, tuple[int, tuple[int, ...]]]:
    """The checkpoint's cache of where the rare entries are, by magic; a malformed entry is
    taken as none (the store scans its index then), never as a reason to refuse the checkpoint."""
    out: dict[int, tuple[int, tuple[int, ...]]] = {}
    if not isinstance(v, dict):
        return out
    for k, m in v.items():
        if not isinstance(k, str) or not k.lstrip("-").isdigit() or not isinstance(m, dict):
            continue
        upto, indexes = m.get("upto"), m.get("indexes")
        if type(upto) is int and isinstance(indexes, list) and all(type(i) is int for i in indexes):
            out[int(k)] = (upto, tuple(indexes))
    return out


@dataclass(frozen=True, slots=True)
class TermFile:
    term: int
    voted_for: str | None


CURRTERM_LEFTOVERS = ("currterm.tmp", "currterm.bak")  # upstream DLedger's IOUtils.string2File


def read_currterm(store_dir: Path) -> TermFile | None:
    """The store's `currterm` (dledger's JSON or upstream DLedger's Properties form); None when
    there is none; UnreadableFile when it is damaged (a member refuses to start rather than
    forget a vote).

    Without `currterm`, upstream's `currterm.tmp` (what it was writing) and `currterm.bak`
    (what it replaced) are what a crash inside its replace left: the highest term of them is
    taken, with its vote (the newer file on a tie), never a lower one; one of them that
    cannot be read is refused like `currterm` itself."""
    tf = _read_term_file(store_dir / CURRTERM)
    if tf is not None:
        return tf
    found = [(name, t) for name in CURRTERM_LEFTOVERS if (t := _read_term_file(store_dir / name)) is not None]
    if not found:
        return None
    name, best = max(found, key=lambda nt: nt[1].term)  # the first (currterm.tmp) on a tie
    log.warning(
        "%s: no %s, but %s (left by a crash while upstream DLedger replaced it): taking %s's term %d, vote %s",
        store_dir, CURRTERM, " and ".join(f"{n} (term {t.term})" for n, t in found), name, best.term,
        best.voted_for or "none",
    )
    return best


def _read_term_file(path: Path) -> TermFile | None:
    raw = _read_raw(path)
    if raw is None:
        return None
    if not _is_json(raw):  # upstream DLedger's MemberState: currTerm=, voteLeader= ("" for none)
        props = _read_properties(path, raw)
        term = _prop_int(path, props, "currTerm")
        if term is None:
            raise UnreadableFile(path, "no currTerm in it (neither JSON nor upstream DLedger's Properties form)")
        return TermFile(_check_term(path, term), props.get("voteLeader") or None)
    data = _read_object(path, raw)
    assert data is not None
    term = as_int(data.get("term"))
    if term is None:
        raise UnreadableFile(path, "no integer term in it")
    voted = data.get("voted_for")
    if voted is not None and not isinstance(voted, str):  # never read as "no vote": that could vote twice
        raise UnreadableFile(path, f"voted_for is {voted!r}, not a member id or null")
    return TermFile(_check_term(path, term), voted or None)


JAVA_LONG_MAX = (1 << 63) - 1


def _check_term(path: Path, term: int) -> int:
    """`term` when a member can run in it. Upstream DLedger's term is a Java long, never
    negative: beyond that the file is damaged (upstream's Long.parseLong fails too). A term at
    dledger's wire limit or above is readable but unusable: no message or record can carry it."""
    if term < 0 or term > JAVA_LONG_MAX:
        raise UnreadableFile(path, f"term {term} is not a term (0 to 2**63-1)")
    if term >= LIMIT:
        raise UnreadableFile(
            path, f"term {term} is at or beyond dledger's limit 2**62-1, so no message or record could carry it: "
            f"run `dledger store repair-term --store-dir {path.parent}` to set it to the last entry's term")
    return term


class LayoutError(StoreError):
    """The directory given to a member is ambiguous between dledger's layout and upstream
    DLedger's (UNEXPECTED_ARGUMENT): nothing is created, the user says which store is meant."""

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.UNEXPECTED_ARGUMENT, message)


def member_store_dir(store_dir: Path, self_id: str) -> Path:
    """Where member `self_id` keeps its store when given `store_dir`: `store_dir` itself, or
    upstream DLedger's layout, `<storeBaseDir>/dledger-<selfId>/`, when `store_dir` holds no
    `data/` but `dledger-<selfId>/data/` is in it. Read-only.

    LayoutError (nothing created) when the choice would hide a store: both `data/` and
    `dledger-<selfId>/data/` exist (which one is this member's?), or `store_dir` holds no
    `data/` but another member's `dledger-<id>/data/` (a new empty store beside it would
    start, likely under a wrong `--id`, and later shadow the upstream one)."""
    own = store_dir / "data"
    upstream = store_dir / f"dledger-{self_id}"
    if (upstream / "data").is_dir():
        if own.is_dir():
            raise LayoutError(
                f"{store_dir} holds two stores: {own} (dledger's layout) and {upstream / 'data'} (upstream "
                f"DLedger's, of member {self_id}): give the one this member uses as --store-dir "
                f"({store_dir} or {upstream}) after moving the other away. Nothing was created")
        return upstream
    if not own.is_dir():
        others = sorted(p.name for p in _upstream_member_dirs(store_dir))
        if others:
            ids = ", ".join(name.removeprefix("dledger-") for name in others)
            raise LayoutError(
                f"{store_dir} holds no data/ and no dledger-{self_id}/, but upstream DLedger's store of "
                f"member {ids} ({', '.join(str(store_dir / n) for n in others)}): is --id {self_id} wrong? "
                f"Start with the id whose store it is, or give this member a --store-dir of its own. "
                "Nothing was created")
    return store_dir


def _upstream_member_dirs(store_dir: Path) -> list[Path]:
    """The `dledger-<id>/` directories of `store_dir` that hold a `data/` (upstream's layout)."""
    try:
        entries = list(os.scandir(store_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [Path(e.path) for e in entries
            if e.name.startswith("dledger-") and e.is_dir() and (Path(e.path) / "data").is_dir()]


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


def derive_begin(header_at: Callable[[int], tuple[int, ...] | None], start: int, room: int) -> LogBegin:
    """The log begin of a store whose checkpoint does not name one: the first data file's
    first record (`header_at(offset)` reads a header of that file; None when the file is too
    short to hold one). Upstream DLedger, installing a snapshot, starts the file with a blank
    record as long as the bytes before the first record (MmapFileList.resetOffset): the log
    begins after it. A log that starts at index 0 starts the chain from 0; one that starts
    later (its files before it deleted) has an unknown chain before it. No sound record
    there: index 0 (the log is empty or the record is torn, as recovery then finds)."""
    first = header_at(0)
    if first is not None and first[0] == MAGIC_BLANK and BLANK_SIZE <= first[1] < room - HEADER_SIZE:
        skip = int(first[1])
        nxt = header_at(skip)
        if first_record_index(nxt, start + skip, room - skip) is not None:
            start, room, first = start + skip, room - skip, nxt
    index = first_record_index(first, start, room)
    if index is None or index == 0:
        return LogBegin(0, -1, start, 0)
    return LogBegin(index, -1, start, None)


def derive_begin_of(path: Path | None, start: int, size: int) -> LogBegin:
    """derive_begin for the first data file `path` (None: there is none). A log whose begin
    was reset inside the file (a snapshot installed, retention) without a checkpoint to say
    so starts at the first record after the zeros before it: an entry's magic (1-4) is
    three zero bytes and one more, so the record starts 3 bytes before the first non-zero."""
    if path is None:
        return derive_begin(lambda off: None, start, size)

    def header_at(off: int) -> tuple[int, ...] | None:
        return read_header(path, off) if off >= 0 else None

    begin = derive_begin(header_at, start, size)
    if begin.index != 0 or begin.pos != start:
        return begin
    first = header_at(0)
    if first is not None and any(first):
        return begin  # something at offset 0 (a record, or what recovery then reports)
    nz = first_nonzero(path, size)
    if nz is None or nz < 3:
        return begin
    at = nz - 3
    moved = derive_begin(lambda off: header_at(at + off), start + at, size - at)
    found = first_record_index(header_at(at), start + at, size - at) is not None
    return moved if found and moved.pos == start + at else begin


ZEROS = bytes(1 << 20)  # what a chunk of a preallocated file holds: compared with memcmp, not a byte loop


def data_extents(fd: int, lo: int, size: int) -> Iterator[tuple[int, int]]:
    """The [start, end) ranges of file `fd` from `lo` that hold data: the holes of a sparse
    (preallocated) file are skipped (SEEK_DATA / SEEK_HOLE)."""
    off = lo
    while off < size:
        try:
            a = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data past off
                return
            raise
        if a >= size:
            return
        b = min(os.lseek(fd, a, os.SEEK_HOLE), size)
        yield a, b
        off = b


def first_nonzero(path: Path, size: int) -> int | None:
    """The offset of the first non-zero byte of `path` (within `size`), None when all zero."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return next_nonzero(fd, 0, size)
    finally:
        os.close(fd)


def next_nonzero(fd: int, lo: int, size: int) -> int | None:
    """The offset of the first non-zero byte of file `fd` in [lo, size), None when all zero.
    Only its data extents are read: the holes of a preallocated file are skipped."""
    for a, b in data_extents(fd, lo, size):
        off = a
        while off < b:
            chunk = os.pread(fd, min(len(ZEROS), b - off), off)
            if not chunk:
                return None
            if chunk != ZEROS[: len(chunk)]:
                return off + len(chunk) - len(chunk.lstrip(b"\0"))
            off += len(chunk)
    return None


def chain_before(h: tuple[int, ...]) -> int | None:
    """The chain value `prev` under which the record with header `h` has a valid chain CRC.

    Used when the record before the first one read is gone and its chain CRC not saved (a
    log that does not start at index 0, without a checkpoint naming its begin): the first
    record is then taken as given and all later ones are checked. crc32(msg, prev) is affine
    in prev over GF(2), so solve A·prev = target ^ crc32(msg, 0) with an XOR basis of the 32
    columns A·e_b."""
    if h[0] not in ENTRY_MAGICS:
        return None
    if unverified(h[6], h[7]):
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
    "CURRTERM_LEFTOVERS",
    "NAME",
    "Checkpoint",
    "LayoutError",
    "LogBegin",
    "StoreFile",
    "TermFile",
    "Trusted",
    "UnreadableFile",
    "as_int",
    "chain_before",
    "data_extents",
    "derive_begin",
    "derive_begin_of",
    "file_name",
    "first_gap",
    "first_nonzero",
    "first_record_index",
    "list_files",
    "member_store_dir",
    "next_nonzero",
    "read_checkpoint",
    "read_currterm",
    "read_header",
]
