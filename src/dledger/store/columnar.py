"""A stretch of records checked at once: the fast path of LedgerStore.read_columns.

A bulk reader (the Spark source) asks for thousands of contiguous records at once. Checking
them one by one in Python (header rules, body CRC, chain CRC link, the index's copy of each
header) cost ~2 us per record, most of a columnar READ's cost on the member. Here the same
rules run over the whole stretch: in C where the optional extension is built
(`dledger._records.check_columns`, ~0.3 us a record of 220 bytes, mostly the body CRC), else
over numpy arrays: the headers gathered at the offsets the index units give, every rule one
vectorised comparison, the chain CRC-32 computed for all records at once (a table lookup per
byte of the 20 bytes it covers, across the whole stretch), the body CRC one zlib call per
record.

numpy is imported by the first numpy check only (~13 MiB of resident memory that a member
serving no bulk reader, or one with the C check, never pays). Both answer only "all good": on
any failed rule they return None and the caller's per-record loop reads the stretch again,
and names (and repairs) what it finds, exactly as before. So a damaged record or index unit
costs speed, never a different answer.
"""

from __future__ import annotations

import zlib
from array import array
from functools import cache
from itertools import compress
from typing import TYPE_CHECKING, NamedTuple

from dledger import entry
from dledger.entry import ENTRY_MAGICS, HEADER_SIZE, INDEX_UNIT_SIZE

if TYPE_CHECKING:
    import numpy as np

class _Layouts(NamedTuple):
    """The on-disk layouts as numpy sees them (docs/format.md, "On disk"), big-endian as stored."""

    header: np.dtype
    unit: np.dtype
    header_bytes: np.ndarray
    chain_bytes: np.ndarray  # the bytes of a header the chain CRC covers, as chain_crc packs them
    entry_magics: np.ndarray
    crc_table: np.ndarray


@cache
def _layouts() -> _Layouts:
    import numpy as np

    header = np.dtype([("magic", ">i4"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8"), ("pos", ">i8"),
                       ("channel", ">i4"), ("chain", ">u4"), ("body_crc", ">u4"), ("body_size", ">i4")])
    unit = np.dtype([("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8")])
    assert header.itemsize == HEADER_SIZE and unit.itemsize == INDEX_UNIT_SIZE
    # zlib's CRC-32 table (reflected polynomial 0xEDB88320)
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0xEDB88320), t >> 1).astype(np.uint32)
    return _Layouts(header, unit, np.arange(HEADER_SIZE, dtype=np.int64), np.r_[8:24, 40:44],
                    np.array(sorted(ENTRY_MAGICS), dtype=np.int32), t)


def crc32_rows(rows: np.ndarray, start: np.ndarray) -> np.ndarray:
    """zlib.crc32(rows[k].tobytes(), start[k]) for every k at once (rows: uint8, one row per
    record, all of one length)."""
    import numpy as np

    table = _layouts().crc_table
    crc = start.astype(np.uint32) ^ np.uint32(0xFFFFFFFF)
    for j in range(rows.shape[1]):
        crc = table[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def body_ends(sizes: array[int]) -> bytes:
    """A columnar answer's `body_ends`: little-endian int32 offsets of each body's end into
    the joined bodies, 0 first (an answer stays far below 2 GiB)."""
    if entry.native is not None:
        return entry.native.body_ends(sizes)
    import numpy as np

    ends = np.zeros(len(sizes) + 1, "<i4")
    ends[1:] = np.cumsum(np.frombuffer(sizes, np.int64))
    return ends.tobytes()


class CheckedRun(NamedTuple):
    """What read_columns keeps of a stretch that passed every rule."""

    indexes: bytes  # native-order int64, one per kept entry (as array("q") holds them)
    terms: bytes
    positions: bytes
    body_sizes: bytes
    bodies: bytes  # the kept entries' bodies, one after another (b"" without bodies)
    scanned: int  # records passed, kept or not
    size: int  # their record bytes
    spent: bool  # the byte budget stopped it before the records it was given


def check_run(data: memoryview, first: int, units: bytes, first_header: tuple[int, int, int, int, int],
              magics: frozenset[int], bodies: bool, budget: int, take_one: bool) -> CheckedRun | None:
    """Records `first`, `first + 1`, ... as they lie from the start of `data`, one per index
    unit in `units` (the index's copy of each header), checked by read_columns' rules: each
    header's own rules (entry.header_fault), its fields against its unit, positions one after
    another, the body CRC, the chain CRC link to the record before (the first record's
    header against `first_header`: term, pos, magic, chain CRC, body CRC, from `get`).
    Records are taken while their total size stays within `budget` (the first always, with
    `take_one`). None when any rule fails: the caller checks record by record instead."""
    if entry.native is not None:
        mask = sum(1 << m for m in magics if 0 < m < 32)  # (entry magics are 1..4)
        run = entry.native.check_columns(data, first, units, *first_header, mask, bodies, budget, take_one)
        return None if run is None else CheckedRun(*run)
    return _check_run_numpy(data, first, units, first_header, magics, bodies, budget, take_one)


def _check_run_numpy(data: memoryview, first: int, units: bytes, first_header: tuple[int, int, int, int, int],
                     magics: frozenset[int], bodies: bool, budget: int, take_one: bool) -> CheckedRun | None:
    """check_run over numpy arrays: the fallback where the C extension is not built."""
    import numpy as np

    lay = _layouts()
    u = np.frombuffer(units, lay.unit)
    if not len(u):
        return None
    sizes = u["size"].astype(np.int64)
    total = np.cumsum(sizes)
    n = int(np.searchsorted(total, budget, side="right"))
    if take_one:
        n = max(n, 1)
    if n == 0:
        return CheckedRun(b"", b"", b"", b"", b"", 0, 0, True)
    spent = n < len(u)
    u, sizes = u[:n], sizes[:n]
    offs = u["pos"].astype(np.int64) - int(u["pos"][0])
    ends = offs + sizes
    if int(ends[-1]) > len(data) or (sizes < HEADER_SIZE).any() or (offs[1:] != ends[:-1]).any() or \
            (u["index"] != np.arange(first, first + n, dtype=np.int64)).any():
        return None
    raw = np.frombuffer(data, np.uint8)[offs[:, None] + lay.header_bytes]  # (n, 48): each record's header
    h = raw.view(lay.header).reshape(n)
    if not (np.isin(h["magic"], lay.entry_magics).all() and (h["magic"] == u["magic"]).all()
            and (h["size"] == sizes).all() and (h["index"] == u["index"]).all() and (h["term"] == u["term"]).all()
            and (h["pos"] == u["pos"]).all() and (h["channel"] == 0).all()
            and (h["body_size"] == sizes - HEADER_SIZE).all()):
        return None
    chain, body_crc = h["chain"], h["body_crc"]
    if (int(h["term"][0]), int(h["pos"][0]), int(h["magic"][0]), int(chain[0]), int(body_crc[0])) != first_header:
        return None
    upstream = (chain == 0) & (body_crc == 0)  # entry.unverified: upstream's records carry no CRCs
    slices = [data[a:b] for a, b in zip((offs + HEADER_SIZE).tolist(), ends.tolist(), strict=True)]
    crcs = np.fromiter(map(zlib.crc32, slices), np.uint32, n)
    if not ((crcs == body_crc) | upstream).all():
        return None
    if n > 1 and not ((crc32_rows(raw[1:, lay.chain_bytes], chain[:-1]) == chain[1:]) | upstream[1:]).all():
        return None
    keep = np.isin(h["magic"], np.fromiter(magics, np.int32))
    kept_sizes = (sizes - HEADER_SIZE)[keep]
    return CheckedRun(
        h["index"][keep].astype(np.int64).tobytes(), h["term"][keep].astype(np.int64).tobytes(),
        h["pos"][keep].astype(np.int64).tobytes(),
        kept_sizes.tobytes() if bodies else np.zeros(len(kept_sizes), np.int64).tobytes(),
        b"".join(compress(slices, keep.tolist())) if bodies else b"", n, int(total[n - 1]), spent)
