"""The C record loops (dledger._records) against the pure-Python ones they replace: the same
bytes out of encode_run, the same ScanResult, units and CorruptRecord out of scan, over runs
that are damaged anywhere, mixed with upstream's unverified records, cut short, or scanned from
odd starts and past the buffer's end (docs/format.md, "On disk")."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dledger import entry
from dledger.entry import BLANK, HEADER_SIZE, MAGIC_BLANK, CorruptRecord, ScanResult, encode_run, scan

T = TypeVar("T")
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def both(fn: Callable[[], T]) -> tuple[T | tuple[str, str, int, int], T | tuple[str, str, int, int]]:
    """fn's outcome on the C loops and on the Python ones (an exception as its fields)."""
    out = []
    saved = entry.native
    for native in (saved, None):
        entry.native = native
        try:
            out.append(fn())
        except CorruptRecord as e:
            out.append(("CorruptRecord", e.reason, e.offset, e.index))  # type: ignore[arg-type]
        finally:
            entry.native = saved
    return out[0], out[1]


def unverified_record(body: bytes, index: int, term: int, pos: int) -> bytes:
    """A record as upstream DLedger writes it: both CRC fields 0 (entry.unverified)."""
    return entry.HEADER.pack(1, HEADER_SIZE + len(body), index, term, pos, 0, 0, 0, len(body)) + body


@st.composite
def runs(draw: st.DrawFn) -> tuple[bytes, int, int, int, int]:
    """A run of records (some upstream's), then damage: (buffer, first index, first pos, chain
    before it, term floor)."""
    index = draw(st.integers(0, 2**40))
    pos = draw(st.integers(0, 2**40))
    chain = draw(st.integers(0, 2**32 - 1))
    term = draw(st.integers(0, 2**20))
    buf = bytearray()
    i, p, c = index, pos, chain
    for _ in range(draw(st.integers(0, 6))):
        bodies = draw(st.lists(st.binary(max_size=80), min_size=1, max_size=4))
        if draw(st.integers(0, 4)) == 0:
            for b in bodies:
                rec = unverified_record(b, i, term, p)
                buf += rec
                i, p, c = i + 1, p + len(rec), 0
        else:
            magic = draw(st.sampled_from(sorted(entry.ENTRY_MAGICS)))
            records, _, _, c = entry._encode_run_py(bodies, 0, len(bodies), i, term, p, c, magic)
            buf += records
            i, p = i + len(bodies), p + len(records)
        term += draw(st.integers(0, 2))
    tail = draw(st.sampled_from(["none", "blank", "zeros", "junk"]))
    if tail == "blank":
        buf += BLANK.pack(MAGIC_BLANK, 100)
    elif tail == "zeros":
        buf += bytes(draw(st.integers(1, 60)))
    elif tail == "junk":
        buf += draw(st.binary(min_size=1, max_size=60))
    for _ in range(draw(st.integers(0, 3))):  # damage anywhere: flips, then maybe a cut
        if buf:
            at = draw(st.integers(0, len(buf) - 1))
            buf[at] ^= draw(st.integers(1, 255))
    if buf and draw(st.booleans()):
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    floor = draw(st.sampled_from([-1, 0, max(0, term - 3)]))
    return bytes(buf), index, pos, chain, floor


@SETTINGS
@given(run=runs(), strict=st.booleans(), with_units=st.booleans(), max_count=st.integers(-1, 8),
       start_shift=st.integers(-1, 3), end_shift=st.integers(-60, 60), step=st.sampled_from([1, 60, 200, 4 << 20]))
def test_scan_agrees_with_python(run: tuple[bytes, int, int, int, int], strict: bool, with_units: bool,
                                 max_count: int, start_shift: int, end_shift: int, step: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with entry.scan's C steps cut small: records then straddle a step's end."""
    monkeypatch.setattr(entry, "NATIVE_STEP", step)
    buf, index, pos, chain, floor = run
    start = 0 if start_shift < 0 else start_shift
    end = max(start, len(buf) + end_shift)  # also past the buffer's end: Python's loop says what happens

    def go() -> tuple[ScanResult | str, bytes | None]:
        units = bytearray(b"kept") if with_units else None
        try:
            res: ScanResult | str = scan(buf, start, end, index, pos + start, chain, floor, units=units,
                                         strict=strict, max_count=max_count)
        except Exception as e:
            if isinstance(e, CorruptRecord):
                raise
            res = type(e).__name__
        return res, None if units is None else bytes(units)

    c, py = both(go)
    assert c == py


@SETTINGS
@given(run=runs())
def test_scan_agrees_on_a_mapping_like_buffer(run: tuple[bytes, int, int, int, int]) -> None:
    """Followers scan memoryviews of a push, recovery a mmap: any buffer object does."""
    buf, index, pos, chain, floor = run
    c, py = both(lambda: scan(memoryview(bytearray(buf)), 0, len(buf), index, pos, chain, floor))
    assert c == py


@SETTINGS
@given(bodies=st.lists(st.binary(max_size=300), max_size=12), index=st.integers(0, 2**62),
       term=st.integers(0, 2**62), pos=st.integers(0, 2**62), chain=st.integers(0, 2**32 - 1),
       magic=st.sampled_from(sorted(entry.ENTRY_MAGICS)), kind=st.sampled_from(["bytes", "bytearray", "memoryview"]),
       data=st.data())
def test_encode_run_agrees_with_python(bodies: list[bytes], index: int, term: int, pos: int, chain: int,
                                       magic: int, kind: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(bodies)))
    stop = data.draw(st.integers(start, len(bodies)))
    typed: list[bytes] = [b if kind == "bytes" else bytearray(b) if kind == "bytearray" else memoryview(b)  # type: ignore[misc]
                          for b in bodies]
    c, py = both(lambda: encode_run(typed, start, stop, index, term, pos, chain, magic))
    assert c == py


def test_encode_run_refuses_what_python_refuses() -> None:
    """A body that is no buffer fails on both loops with a TypeError."""
    saved = entry.native
    try:
        for native in (saved, None):
            entry.native = native
            with pytest.raises(TypeError):
                encode_run([b"ok", "text"], 0, 2, 1, 1, 0, 0, 1)  # type: ignore[list-item]
    finally:
        entry.native = saved


def test_encode_run_bad_range_raises() -> None:
    with pytest.raises(IndexError):
        entry.native.encode_run([b"a"], 0, 2, 1, 1, 0, 0, 1)  # type: ignore[union-attr]


def test_codecs_built_and_switchable() -> None:
    """`pip install -e .` (make test's venv) compiles the C loops; DLEDGER_PURE_PYTHON=1 turns
    them off in a new process, which still encodes and scans."""
    code = ("from dledger import entry; r = entry.encode_run([b'x'], 0, 1, 1, 1, 0, 0); "
            "print(entry.native is None, entry.scan(r[0], 0, len(r[0]), 1, 0, 0).count)")
    assert entry.native is not None, "dledger._records is not built: pip install -e . compiles it (needs gcc, zlib.h)"
    for env, want in (({"DLEDGER_PURE_PYTHON": "1"}, "True 1"), ({"DLEDGER_PURE_PYTHON": ""}, "False 1")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == want


@st.composite
def stretches(draw: st.DrawFn) -> tuple[bytes, bytes, int, tuple[int, int, int, int, int]]:
    """Records as a store lays them out (some upstream's), with their index units, then one
    byte of either maybe flipped: (records, units, first index, the first record's header as
    the store's `get` gives it: term, pos, magic, chain CRC, body CRC)."""
    first = draw(st.integers(0, 2**40))
    pos = draw(st.integers(0, 2**40))
    term = draw(st.integers(0, 2**20))
    data, units = bytearray(), bytearray()
    i, p, c = first, pos, draw(st.integers(0, 2**32 - 1))
    for _ in range(draw(st.integers(1, 5))):
        bodies = draw(st.lists(st.binary(max_size=60), min_size=1, max_size=4))
        magic = draw(st.sampled_from(sorted(entry.ENTRY_MAGICS)))
        if draw(st.integers(0, 4)) == 0:
            for b in bodies:
                rec = unverified_record(b, i, term, p)
                data += rec
                units += entry.INDEX_UNIT.pack(1, p, len(rec), i, term)
                i, p, c = i + 1, p + len(rec), 0
        else:
            records, us, _, c = entry._encode_run_py(bodies, 0, len(bodies), i, term, p, c, magic)
            data += records
            units += us
            i, p = i + len(bodies), p + len(records)
        term += draw(st.integers(0, 1))
    h = entry.HEADER.unpack_from(data, 0)
    head = (h[3], h[4], h[0], h[6], h[7])
    where = draw(st.sampled_from(["none", "data", "units"]))
    if where != "none":
        buf = data if where == "data" else units
        buf[draw(st.integers(0, len(buf) - 1))] ^= draw(st.integers(1, 255))
    return bytes(data), bytes(units), first, head


@SETTINGS
@given(s=stretches(), magics=st.frozensets(st.sampled_from(sorted(entry.ENTRY_MAGICS)), min_size=1),
       bodies=st.booleans(), take_one=st.booleans(), budget=st.integers(0, 1000), units_cut=st.integers(0, 3))
def test_column_check_agrees_with_numpy(s: tuple[bytes, bytes, int, tuple[int, int, int, int, int]],
                                        magics: frozenset[int], bodies: bool, take_one: bool, budget: int,
                                        units_cut: int) -> None:
    """store.columnar.check_run in C against the numpy one. They may differ only where a
    damaged unit's size is below a header's: numpy finds its budget cut by a binary search
    that such a size misleads, the C check walks; then a C answer must still be numpy's or
    numpy steps aside (either way the caller's per-record loop is the judge)."""
    from dledger.store.columnar import check_run

    data, units, first, head = s
    units = units[: len(units) - 32 * units_cut] if units_cut * 32 < len(units) else units
    c, py = both(lambda: check_run(memoryview(data), first, units, head, magics, bodies, budget, take_one))
    sizes = [entry.INDEX_UNIT.unpack_from(units, k)[2] for k in range(0, len(units), 32)]
    if all(x >= HEADER_SIZE for x in sizes):
        assert c == py
    else:
        assert c is None or py is None or c == py


def test_body_ends_agree_with_numpy() -> None:
    from array import array

    from dledger.store.columnar import body_ends

    for sizes in ([], [0], [5, 0, 7, 1 << 20], list(range(1000))):
        c, py = both(lambda sizes=sizes: body_ends(array("q", sizes)))  # type: ignore[misc]
        assert c == py


def record(index: int, term: int, pos: int, body: bytes, prev: int) -> tuple[bytes, int]:
    """A valid record and its chain CRC."""
    records, _, _, chain = entry._encode_run_py([body], 0, 1, index, term, pos, prev, 1)
    return records, chain


@pytest.mark.parametrize("body_size", [2**31 - 48, 2**31 - 16, 2**31 - 1])
def test_a_body_size_whose_record_size_wraps_is_refused(body_size: int) -> None:
    """48 + a body size near 2^31 wraps in 32 bits to what the size field holds: a record
    that claims gigabytes past a 100-byte buffer (a peer's push, a damaged file). Refused
    as the Python loop refuses it, nothing read past the buffer."""
    size = (HEADER_SIZE + body_size) - (1 << 32)
    buf = entry.HEADER.pack(1, size, 0, 1, 0, 0, 0, 12345, body_size) + b"x" * 52
    c, py = both(lambda: scan(buf, 0, len(buf), 0, 0, 0))
    assert c == py
    assert isinstance(c, ScanResult) and c.count == 0 and c.stop.startswith("corrupt: bad size")
    c, py = both(lambda: scan(buf, 0, len(buf), 0, 0, 0, strict=True))
    assert c == py and c[0] == "CorruptRecord"  # type: ignore[index]


@pytest.mark.parametrize("field", ["index", "pos"])
def test_index_and_position_do_not_wrap_past_int64(field: str) -> None:
    """A record at the last int64 index (position) followed by one at the first negative one:
    the second is refused, not taken as the next."""
    i0, p0 = (2**63 - 1, 0) if field == "index" else (5, 2**63 - 49)
    first, chain = record(i0, 1, p0, b"x", 0)
    def wrap(v: int) -> int:
        return v - 2**64 if v >= 2**63 else v

    second, _ = record(wrap(i0 + 1), 1, wrap(p0 + len(first)), b"y", chain)
    buf = first + second
    c, py = both(lambda: scan(buf, 0, len(buf), i0, p0, 0))
    assert c == py
    assert isinstance(c, ScanResult) and c.count == 1


def test_encode_run_refuses_an_index_past_int64() -> None:
    for native in (entry.native, None):
        saved = entry.native
        entry.native = native
        try:
            with pytest.raises((OverflowError, struct.error)):
                encode_run([b"a", b"b"], 0, 2, 2**63 - 1, 1, 0, 0, 1)
        finally:
            entry.native = saved


@pytest.mark.parametrize(("start", "end"), [(-(2**40), 16), (-48, 16), (0, -(2**63)), (8, 4), (0, 2**62)])
def test_scan_run_outside_the_buffer_walks_nothing_or_stops(start: int, end: int) -> None:
    """Starts and ends outside the buffer, called directly (entry.scan never passes them):
    no record is taken from outside it."""
    assert entry.native is not None
    buf = record(0, 1, 0, b"abc", 0)[0] + bytes(16)
    off, count, _, _ = entry.native.scan_run(buf, start, end, 0, 0, 0, -1, bytearray(), -1)
    assert count == (1 if (start, end) == (0, 2**62) else 0)
    assert off == (len(buf) - 16 if count else start)
