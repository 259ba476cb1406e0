"""Binary codecs of entry records and index units (docs/format.md).

Hot paths work on whole buffers: `encode_run` joins a batch's records into one
byte string (the leader's append) and `scan` validates a run of records in place.
Neither builds a Python object per entry that outlives the call; per-entry work is a
few C calls (struct pack/unpack, zlib.crc32). Where the optional C extension
`dledger._records` is built, both hand their loops to it (several times less CPU a
record; docs/performance.md); `DLEDGER_PURE_PYTHON=1` keeps the Python loops, which
stay the reference the C loops are tested against.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from dledger.codes import DLedgerError, ResponseCode

# magic, size, index, term, pos, channel, chain_crc, body_crc, body_size
HEADER = struct.Struct(">iiqqqiIIi")
HEADER_SIZE = HEADER.size
# magic, pos, size, index, term
INDEX_UNIT = struct.Struct(">iqiqq")
INDEX_UNIT_SIZE = INDEX_UNIT.size
# blank record that closes a data file: magic 0xFFFFFFFF, length of the rest of the file
BLANK = struct.Struct(">ii")
BLANK_SIZE = BLANK.size
MAGIC_SIZE = struct.Struct(">ii")  # a record header's first two fields: magic, size
_CHAIN = struct.Struct(">qqI")
CHAIN_FIELDS = _CHAIN  # what chain_crc packs, for loops that inline it

# 1 is also upstream DLedger's only record magic (DLedgerMmapFileStore.MAGIC_1, CURRENT_MAGIC)
# and 2 its NOOP record's: a store upstream wrote has nothing but these and blanks
MAGIC_NORMAL = 1
MAGIC_NOOP = 2
MAGIC_CONFIG_CHANGE = 3
# ours: an idempotent producer's session marker, just before the NORMAL entries it describes
# (core.producers); readers of NORMAL entries skip it like a NOOP
MAGIC_SESSION = 4
MAGIC_BLANK = -1  # 0xFFFFFFFF read as a signed int
ENTRY_MAGICS = frozenset((MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG_CHANGE, MAGIC_SESSION))

assert HEADER_SIZE == 48 and INDEX_UNIT_SIZE == 32

NATIVE_VERSION = 3  # _records.c's RECORDS_VERSION: raised with every change of its functions
log = logging.getLogger(__name__)


class NativeRecords(Protocol):
    """The C extension's functions (src/dledger/_records.c, typed in _records.pyi)."""

    def encode_run(self, bodies: Sequence[bytes], start: int, stop: int, index: int, term: int, pos: int,
                   prev_chain: int, magic: int, /) -> tuple[bytes, bytes, bytes, int]: ...

    def scan_run(self, buf: object, start: int, end: int, index: int, pos: int, prev_chain: int, term_floor: int,
                 units: bytearray | None, max_count: int, /) -> tuple[int, int, int, int]: ...

    def check_columns(self, data: object, first: int, units: bytes, term: int, pos: int, magic: int, chain: int,
                      body_crc: int, magic_mask: int, bodies: bool, budget: int, take_one: bool, /
                      ) -> tuple[bytes, bytes, bytes, bytes, bytes, int, int, bool] | None: ...

    def body_ends(self, sizes: object, /) -> bytes: ...

    def scan_entries(self, buf: object, start: int, size: int, index: int, pos: int, chain: int, term_floor: int,
                     last_index: int, end_pos: int, emit_from: int, term_lo: int, term_hi: int, bodies: bool,
                     verify_bodies: bool, max_rows: int, max_bytes: int, /
                     ) -> tuple[int, int, int, int, int, int, bytes, bytes, bytes, bytes, bytes]: ...


def _load_native() -> NativeRecords | None:
    """The C loops (src/dledger/_records.c), unless the environment asks for pure Python or
    they were not built (the extension is optional: no compiler, no zlib headers)."""
    if os.environ.get("DLEDGER_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from dledger import _records
    except ImportError:
        return None
    if getattr(_records, "VERSION", None) != NATIVE_VERSION:  # built from an older _records.c
        log.warning("dledger._records is stale (version %s, want %d): using the Python loops; "
                    "pip install -e . rebuilds it", getattr(_records, "VERSION", None), NATIVE_VERSION)
        return None
    return _records


# bytes the C scan checks per call, at most (more when one record is larger): ~2 ms, so other
# threads (the flusher, a member's event loop beside a long recovery) get the GIL between calls
NATIVE_STEP = 4 << 20
# the C scan knows the entry magics as 1..4: keep them so, or teach it
assert frozenset(range(1, 5)) == ENTRY_MAGICS
native: NativeRecords | None = _load_native()


def unverified(chain: int, body_crc: int) -> bool:
    """A record upstream DLedger wrote: it never fills the two CRC fields (both 0). Read as
    unverified, as upstream does, wherever it is: a store may go from upstream to dledger and
    back, so upstream's records can follow dledger's. The chain starts again from 0 after one
    (docs/format.md, "Opening upstream DLedger's stores"), so the record dledger writes next
    is still checked; a damaged record rarely passes for one (its header rules still hold: a
    zeroed sector over the CRC fields zeroes the body size too, unless the body is empty)."""
    return chain == 0 and body_crc == 0

# --- the record-header rules (docs/format.md, "On disk"), written once ----------------------------
# Every reader of records applies these: `scan` (followers, recovery, `dledger store inspect`),
# `decode_entry`, Spark's dledger-files scan and the offline view (store/offline.py). Only what a
# reader does with a failure differs (stop, cut, raise, report a row).

RUNS_PAST = "record runs past the end of the buffer"


def magic_stop(buf: bytes | bytearray | memoryview | object, off: int) -> str:
    """Why the 8 bytes at `off` start no entry record (their magic is not in ENTRY_MAGICS):
    "blank" (the blank record that closes a data file), "zero" (never written), else
    "corrupt: bad magic N"."""
    magic = int.from_bytes(buf[off : off + 4], "big", signed=True)  # type: ignore[index]
    if magic == MAGIC_BLANK:
        return "blank"
    if magic == 0 and not any(buf[off : off + 8]):  # type: ignore[index]
        return "zero"
    return f"corrupt: bad magic {magic}"


def record_fault(size: int, body_size: int, index: int, pos: int, channel: int, term: int, room: int,
                 want_index: int, want_pos: int, term_floor: int) -> str | None:
    """The first header rule a record breaks, None when it keeps them all (its magic is an
    entry's): size is 48 + body size and fits in the `room` bytes from the record's start
    (`RUNS_PAST` when not), it holds the index and position expected, its term does not go
    below the previous record's, channel 0. CRCs are checked by the caller (body_crc_fault,
    chain_crc): some readers report them without stopping."""
    if size != HEADER_SIZE + body_size or body_size < 0:
        return f"bad size {size} (body {body_size})"
    if size > room:
        return RUNS_PAST
    if index != want_index:
        return f"index {index}, expected {want_index}"
    if pos != want_pos:
        return f"pos {pos}, expected {want_pos}"
    if term < term_floor:
        return f"term {term} below previous term {term_floor}"
    if channel != 0:
        return f"bad channel {channel} (reserved, must be 0)"
    return None


def header_fault(h: tuple[int, ...], room: int) -> str | None:
    """The rules one header `h` (HEADER.unpack) can be checked against alone, without its
    neighbours: an entry's magic, then record_fault's size and channel rules."""
    if h[0] not in ENTRY_MAGICS:
        return f"bad magic {h[0]}"
    return record_fault(h[1], h[8], h[2], h[4], h[5], h[3], room, h[2], h[4], h[3])


class DLedgerEntry(msgspec.Struct, frozen=True, gc=False):
    """A decoded entry; built only where a caller asks for objects (get, read)."""

    index: int
    term: int
    pos: int
    magic: int
    body: bytes
    chain_crc: int
    body_crc: int

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)


class CorruptRecord(DLedgerError):
    """A record failed validation; `offset` is relative to the scanned buffer, `index` is the
    index the record should hold (-1 when the caller did not say)."""

    def __init__(self, reason: str, offset: int, index: int = -1) -> None:
        super().__init__(ResponseCode.DISK_ERROR, f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset
        self.index = index


def chain_crc(index: int, term: int, body_crc: int, prev: int) -> int:
    """chain_crc(i) = crc32(pack(">qqI", index, term, body_crc), chain_crc(i-1))."""
    return zlib.crc32(_CHAIN.pack(index, term, body_crc), prev)


def chain_before(index: int, term: int, body_crc: int, chain: int) -> int:
    """The `prev` for which chain_crc(index, term, body_crc, prev) == chain: what a log that
    begins at this record (a replica copying a log whose older records were deleted) takes
    as the chain CRC before it. CRC-32 is affine in its starting value, crc(d, x) = M x ^
    crc(d, 0), and M is invertible: x is solved for over GF(2), one bit column at a time."""
    data = _CHAIN.pack(index, term, body_crc)
    base = zlib.crc32(data, 0)
    pivots: dict[int, tuple[int, int]] = {}  # highest bit -> (M x, x) for the x reduced so far
    for k in range(32):
        v, x = zlib.crc32(data, 1 << k) ^ base, 1 << k
        while v:
            top = v.bit_length() - 1
            if top not in pivots:
                pivots[top] = (v, x)
                break
            pv, px = pivots[top]
            v, x = v ^ pv, x ^ px
    want, prev = chain ^ base, 0
    while want:
        pv, px = pivots[want.bit_length() - 1]  # (every bit has a pivot: M is invertible)
        want, prev = want ^ pv, prev ^ px
    return prev


def chain_follows(index: int, term: int, body_crc: int, prev: int, chain: int) -> bool:
    """Whether a record's chain CRC field `chain` follows `prev`, the one before it: equal to
    chain_crc, or both CRC fields 0 after a 0 (`unverified`, upstream's record)."""
    return chain_crc(index, term, body_crc, prev) == chain or unverified(chain, body_crc)


def encode_entry(
    body: bytes, index: int, term: int, pos: int, prev_chain: int = 0, magic: int = MAGIC_NORMAL
) -> bytes:
    """One record as bytes; for tests and tools, not for hot paths."""
    return encode_run([body], 0, 1, index, term, pos, prev_chain, magic)[0]


def encode_run(
    bodies: Sequence[bytes],
    start: int,
    stop: int,
    index: int,
    term: int,
    pos: int,
    prev_chain: int,
    magic: int = MAGIC_NORMAL,
) -> tuple[bytes, bytes, array[int], int]:
    """The records of bodies[start:stop], contiguous (record k: index `index + k`, position
    `pos + (bytes before it)`), with their index units: (records, units, each record's
    position, the chain CRC of the last record).

    Each header is packed on its own and the lot joined once: a quarter less CPU a record
    than packing and copying each body into a buffer (10,000 bodies of 220 bytes)."""
    if native is not None:
        records, units, at, chain = native.encode_run(bodies, start, stop, index, term, pos, prev_chain, magic)
        positions: array[int] = array("q")
        positions.frombytes(at)
        return records, units, positions, chain
    return _encode_run_py(bodies, start, stop, index, term, pos, prev_chain, magic)


def _encode_run_py(
    bodies: Sequence[bytes], start: int, stop: int, index: int, term: int, pos: int, prev_chain: int, magic: int
) -> tuple[bytes, bytes, array[int], int]:
    """encode_run's loop in Python: the fallback, and the reference the C loop is tested against."""
    pack_header = HEADER.pack
    pack_unit = INDEX_UNIT.pack
    chain_pack = _CHAIN.pack
    crc32 = zlib.crc32
    chain = prev_chain
    parts: list[bytes] = []
    units: list[bytes] = []
    positions = array("q")
    part, unit, at = parts.append, units.append, positions.append
    for k in range(start, stop):
        body = bodies[k]
        n = len(body)
        size = HEADER_SIZE + n
        bcrc = crc32(body)
        chain = crc32(chain_pack(index, term, bcrc), chain)
        part(pack_header(magic, size, index, term, pos, 0, chain, bcrc, n))
        part(body)
        unit(pack_unit(magic, pos, size, index, term))
        at(pos)
        pos += size
        index += 1
    return b"".join(parts), b"".join(units), positions, chain


@dataclass(frozen=True, slots=True)
class ScanResult:
    """How far a scan got: `consumed` bytes holding `count` valid records."""

    consumed: int
    count: int
    last_chain: int
    last_term: int
    stop: str  # "end" (buffer or limit reached), "blank", "zero", or "corrupt: <reason>"
    unverified: int = 0  # of the `count` records, upstream's (entry.unverified): CRCs not checked


def scan(
    buf: bytes | bytearray | memoryview | object,
    start: int,
    end: int,
    index: int,
    pos: int,
    prev_chain: int,
    prev_term: int = -1,
    units: bytearray | None = None,
    strict: bool = False,
    max_count: int = -1,
) -> ScanResult:
    """Validate consecutive records in buf[start:end].

    Checks magic, size, index continuity (first must be `index`), pos (first
    must be `pos`, then contiguous), non-decreasing term, body CRC and chain
    CRC (not of upstream's records, `unverified`: counted in the result).
    Stops at the first record that fails, a blank, zero bytes, or a record
    running past `end`. With `strict` a failing record raises CorruptRecord
    instead (followers must reject bad pushes, recovery cuts them). If `units`
    is given an index unit is appended per valid record. At most `max_count`
    records are taken when it is not negative.
    """
    unpack_header = HEADER.unpack_from
    chain_pack = _CHAIN.pack
    crc32 = zlib.crc32
    fault = record_fault
    mv = memoryview(buf)  # type: ignore[arg-type]
    off = start
    count = 0
    unchecked = 0
    chain = prev_chain
    term_floor = prev_term
    stop = "end"
    try:
        if native is not None and start >= 0 and (units is None or type(units) is bytearray):
            # the C loop takes the common case as far as it goes, a step at a time (it holds
            # the GIL: recovery scans whole data files); this loop decides the rest
            while count != max_count:
                lim = end
                if end - off >= 8:  # a step holds at least the next record, whatever its size
                    lim = min(end, off + max(NATIVE_STEP, int.from_bytes(mv[off + 4 : off + 8], "big", signed=True)))
                left = max_count - count if max_count >= 0 else -1
                at, n, chain, term_floor = native.scan_run(mv, off, lim, index, pos, chain, term_floor, units, left)
                pos += at - off
                index += n
                count += n
                off = at
                if n == 0 or lim >= end:
                    break
        while off + 8 <= end and count != max_count:
            # the whole header in one call where it fits (its first field is the magic): no
            # slice and int per record for the magic alone, on a follower's per-record path
            if off + HEADER_SIZE <= end:
                (magic, size, idx, term, rpos, channel, ccrc, bcrc, bsize) = unpack_header(mv, off)
            else:
                magic = int.from_bytes(mv[off : off + 4], "big", signed=True)
            if magic not in ENTRY_MAGICS:
                stop = magic_stop(mv, off)
                if strict and stop.startswith("corrupt: "):
                    raise CorruptRecord(stop.removeprefix("corrupt: "), off, index)
                break
            if off + HEADER_SIZE > end:
                if strict:
                    raise CorruptRecord("truncated header", off, index)
                stop = "end"
                break
            # record_fault's rules, all kept: the common case, decided without a call (this
            # loop is a follower's per-record path; a call costs ~5% of it, measured in
            # docs/performance.md). Any failure asks record_fault which rule, and why.
            # tests/unit/test_store_offline.py checks both agree rule by rule.
            if (size == HEADER_SIZE + bsize and bsize >= 0 and size <= end - off and idx == index
                    and rpos == pos and term >= term_floor and channel == 0):
                reason = None
            else:
                reason = fault(size, bsize, idx, rpos, channel, term, end - off, index, pos, term_floor)
                if reason is RUNS_PAST and not strict:
                    # a follower scans up to the room left in a data file, and the record past
                    # it legitimately carries the next file's pos: the end, not a fault
                    break
            if reason is None:
                if crc32(mv[off + HEADER_SIZE : off + size]) != bcrc:
                    reason = "body crc mismatch"
                else:
                    next_chain = crc32(chain_pack(idx, term, bcrc), chain)
                    if next_chain != ccrc:
                        reason = "chain crc mismatch"
                    else:
                        chain = next_chain
                if reason is not None and unverified(ccrc, bcrc):
                    reason = None  # upstream's record (unverified): decided off the common path
                    chain = 0
                    unchecked += 1
            if reason is not None:
                if strict:
                    raise CorruptRecord(reason, off, index)
                stop = "corrupt: " + reason
                break
            if units is not None:
                units += INDEX_UNIT.pack(magic, pos, size, idx, term)
            term_floor = term
            off += size
            pos += size
            index += 1
            count += 1
    finally:
        mv.release()
    return ScanResult(off - start, count, chain, term_floor, stop, unchecked)


def decode_entry(buf: bytes | bytearray | memoryview | object, offset: int = 0) -> DLedgerEntry:
    """Decode and verify one record (header sanity and body CRC; upstream's records, with both
    CRC fields 0, are taken unverified: the caller checks the chain, see `unverified`)."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    try:
        if len(mv) - offset < HEADER_SIZE:
            raise CorruptRecord("truncated header", offset)
        h = HEADER.unpack_from(mv, offset)
        magic, size, idx, term, rpos, _ch, ccrc, bcrc, _bsize = h
        reason = header_fault(h, len(mv) - offset)
        if reason is not None:
            raise CorruptRecord(reason, offset)
        body = bytes(mv[offset + HEADER_SIZE : offset + size])
    finally:
        mv.release()
    if zlib.crc32(body) != bcrc and not unverified(ccrc, bcrc):
        raise CorruptRecord("body crc mismatch", offset)
    return DLedgerEntry(idx, term, rpos, magic, body, ccrc, bcrc)


def iter_headers(buf: bytes | bytearray | memoryview, start: int = 0) -> list[tuple[int, ...]]:
    """Headers of the contiguous records in buf that keep header_fault's rules (no CRC check),
    for pushes and tools."""
    out = []
    off = start
    end = len(buf)
    while off + HEADER_SIZE <= end:
        h = HEADER.unpack_from(buf, off)
        if header_fault(h, end - off) is not None:
            break
        out.append(h)
        off += h[1]
    return out


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
Entry = DLedgerEntry
