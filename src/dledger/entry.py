"""Binary codecs of entry records and index units (docs/format.md).

Hot paths work on whole buffers: `encode_into` lays a batch of bodies straight
into a writable buffer (an mmap of the data file) and `scan` validates a run of
records in place. Neither builds a Python object per entry; per-entry work is a
few C calls (struct pack/unpack, zlib.crc32).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

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
_CHAIN = struct.Struct(">qqI")

MAGIC_NORMAL = 1
MAGIC_NOOP = 2
MAGIC_CONFIG_CHANGE = 3
# ours: an idempotent producer's session marker, just before the NORMAL entries it describes
# (core.producers); readers of NORMAL entries skip it like a NOOP
MAGIC_SESSION = 4
MAGIC_BLANK = -1  # 0xFFFFFFFF read as a signed int
ENTRY_MAGICS = frozenset((MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG_CHANGE, MAGIC_SESSION))

assert HEADER_SIZE == 48 and INDEX_UNIT_SIZE == 32


class Entry(msgspec.Struct, frozen=True, gc=False):
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


def encode_entry(
    body: bytes, index: int, term: int, pos: int, prev_chain: int = 0, magic: int = MAGIC_NORMAL
) -> bytes:
    """One record as bytes; for tests and tools, not for hot paths."""
    buf = bytearray(HEADER_SIZE + len(body))
    encode_into(buf, 0, [body], 0, 1, index, term, pos, prev_chain, magic)
    return bytes(buf)


def encode_into(
    out: bytearray | memoryview | object,
    offset: int,
    bodies: Sequence[bytes],
    start: int,
    stop: int,
    index: int,
    term: int,
    pos: int,
    prev_chain: int,
    magic: int = MAGIC_NORMAL,
    units: object | None = None,
    units_offset: int = 0,
    positions: array[int] | None = None,
) -> int:
    """Write records for bodies[start:stop] contiguously at out[offset:].

    Record k gets index `index + k`, position `pos + (bytes before it)`; if
    `units` is given its index unit is written at units[units_offset + 32k].
    Returns the chain CRC of the last record. The caller sized `out`.
    """
    pack_header = HEADER.pack_into
    pack_unit = INDEX_UNIT.pack_into
    chain_pack = _CHAIN.pack
    crc32 = zlib.crc32
    chain = prev_chain
    off = offset
    uoff = units_offset
    for k in range(start, stop):
        body = bodies[k]
        n = len(body)
        size = HEADER_SIZE + n
        bcrc = crc32(body)
        chain = crc32(chain_pack(index, term, bcrc), chain)
        out[off + HEADER_SIZE : off + size] = body  # type: ignore[index]
        pack_header(out, off, magic, size, index, term, pos, 0, chain, bcrc, n)  # type: ignore[arg-type]
        if units is not None:
            pack_unit(units, uoff, magic, pos, size, index, term)  # type: ignore[arg-type]
            uoff += INDEX_UNIT_SIZE
        if positions is not None:
            positions.append(pos)
        off += size
        pos += size
        index += 1
    return chain


@dataclass(frozen=True, slots=True)
class ScanResult:
    """How far a scan got: `consumed` bytes holding `count` valid records."""

    consumed: int
    count: int
    last_chain: int
    last_term: int
    stop: str  # "end" (buffer or limit reached), "blank", "zero", or "corrupt: <reason>"


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
    CRC. Stops at the first record that fails, a blank, zero bytes, or a record
    running past `end`. With `strict` a failing record raises CorruptRecord
    instead (followers must reject bad pushes, recovery cuts them). If `units`
    is given an index unit is appended per valid record. At most `max_count`
    records are taken when it is not negative.
    """
    unpack_header = HEADER.unpack_from
    chain_pack = _CHAIN.pack
    crc32 = zlib.crc32
    mv = memoryview(buf)  # type: ignore[arg-type]
    off = start
    count = 0
    chain = prev_chain
    term_floor = prev_term
    stop = "end"
    try:
        while off + 8 <= end and count != max_count:
            magic = int.from_bytes(mv[off : off + 4], "big", signed=True)
            if magic not in ENTRY_MAGICS:
                if magic == MAGIC_BLANK:
                    stop = "blank"
                elif magic == 0 and not any(mv[off : off + 8]):
                    stop = "zero"
                else:
                    if strict:
                        raise CorruptRecord(f"bad magic {magic}", off, index)
                    stop = f"corrupt: bad magic {magic}"
                break
            if off + HEADER_SIZE > end:
                if strict:
                    raise CorruptRecord("truncated header", off, index)
                stop = "end"
                break
            (_, size, idx, term, rpos, channel, ccrc, bcrc, bsize) = unpack_header(mv, off)
            reason = None
            if size != HEADER_SIZE + bsize or bsize < 0:
                reason = f"bad size {size} (body {bsize})"
            elif off + size > end:
                # before the field checks: a follower scans up to the room left in a data
                # file, and the record past it legitimately carries the next file's pos
                if strict:
                    reason = "record runs past the end of the buffer"
                else:
                    stop = "end"
                    break
            elif idx != index:
                reason = f"index {idx}, expected {index}"
            elif rpos != pos:
                reason = f"pos {rpos}, expected {pos}"
            elif term < term_floor:
                reason = f"term {term} below previous term {term_floor}"
            elif channel != 0:
                reason = f"bad channel {channel} (reserved, must be 0)"
            if reason is None:
                if crc32(mv[off + HEADER_SIZE : off + size]) != bcrc:
                    reason = "body crc mismatch"
                else:
                    next_chain = crc32(chain_pack(idx, term, bcrc), chain)
                    if next_chain != ccrc:
                        reason = "chain crc mismatch"
                    else:
                        chain = next_chain
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
    return ScanResult(off - start, count, chain, term_floor, stop)


def decode_entry(buf: bytes | bytearray | memoryview | object, offset: int = 0) -> Entry:
    """Decode and verify one record (header sanity and body CRC)."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    try:
        if len(mv) - offset < HEADER_SIZE:
            raise CorruptRecord("truncated header", offset)
        magic, size, idx, term, rpos, _ch, ccrc, bcrc, bsize = HEADER.unpack_from(mv, offset)
        if magic not in ENTRY_MAGICS:
            raise CorruptRecord(f"bad magic {magic}", offset)
        if size != HEADER_SIZE + bsize or bsize < 0 or offset + size > len(mv):
            raise CorruptRecord(f"bad size {size}", offset)
        if _ch != 0:
            raise CorruptRecord(f"bad channel {_ch} (reserved, must be 0)", offset)
        body = bytes(mv[offset + HEADER_SIZE : offset + size])
    finally:
        mv.release()
    if zlib.crc32(body) != bcrc:
        raise CorruptRecord("body crc mismatch", offset)
    return Entry(idx, term, rpos, magic, body, ccrc, bcrc)


def iter_headers(buf: bytes | bytearray | memoryview, start: int = 0) -> list[tuple[int, ...]]:
    """Headers of the contiguous records in buf (no CRC check), for pushes and tools."""
    out = []
    off = start
    end = len(buf)
    while off + HEADER_SIZE <= end:
        h = HEADER.unpack_from(buf, off)
        if h[0] not in ENTRY_MAGICS or h[1] < HEADER_SIZE:
            break
        out.append(h)
        off += h[1]
    return out
