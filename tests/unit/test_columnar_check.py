"""The array checks of a stretch of records (store.columnar, read_columns' fast path): they
agree with zlib and with the per-record loop, and any damage makes them step aside (None),
so the loop names it."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import numpy as np
import pytest

from dledger.entry import HEADER_SIZE, INDEX_UNIT_SIZE, MAGIC_NOOP, MAGIC_NORMAL
from dledger.store.columnar import check_run, crc32_rows
from dledger.store.file import FileLedgerStore

from .codecs import CODECS, use_codec

# every test here runs on the C check and on the numpy one
codec = pytest.fixture(scope="module", autouse=True, params=CODECS)(use_codec)

NORMAL = frozenset([MAGIC_NORMAL])


def test_crc32_rows_is_zlibs_crc32_with_a_start_value() -> None:
    rng = random.Random(5)
    rows = [rng.randbytes(20) for _ in range(300)]
    starts = [rng.getrandbits(32) for _ in rows]
    got = crc32_rows(np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), 20), np.array(starts, np.uint32))
    assert got.tolist() == [zlib.crc32(r, s) for r, s in zip(rows, starts, strict=True)]


@pytest.fixture
def store(tmp_path: Path) -> FileLedgerStore:
    s = FileLedgerStore(tmp_path / "s", data_file_size=1 << 20, index_file_size=64 * INDEX_UNIT_SIZE * 4)
    rng = random.Random(9)
    for term in (1, 2):
        s.append_as_leader([b""], term, magic=MAGIC_NOOP)
        s.append_as_leader([rng.randbytes(rng.randrange(0, 300)) for _ in range(120)], term)
    s.set_committed(s.end_index)
    return s


def _run(s: FileLedgerStore, first: int, count: int, budget: int = 1 << 30, magics: frozenset[int] = NORMAL,
         bodies: bool = True) -> object:
    raw = s.read_raw(first, 1 << 30)
    try:
        units = s._index_units(first, min(count, raw.count))
        assert units is not None
        f = s.get(first)
        return check_run(raw.data, first, units, (f.term, f.pos, f.magic, f.chain_crc, f.body_crc), magics, bodies,
                         budget, True)
    finally:
        raw.data.release()


def test_an_intact_stretch_gives_what_the_per_record_loop_gives(store: FileLedgerStore) -> None:
    for first, count, budget, magics in ((0, 242, 1 << 30, NORMAL), (3, 100, 5000, NORMAL),
                                         (0, 242, 1 << 30, frozenset([MAGIC_NOOP])), (130, 1, 0, NORMAL)):
        run = _run(store, first, count, budget, magics)
        assert run is not None
        es = store.read(first, run.scanned, 1 << 30)  # type: ignore[attr-defined]
        kept = [e for e in es if e.magic in magics]
        assert np.frombuffer(run.indexes, np.int64).tolist() == [e.index for e in kept]  # type: ignore[attr-defined]
        assert np.frombuffer(run.terms, np.int64).tolist() == [e.term for e in kept]  # type: ignore[attr-defined]
        assert np.frombuffer(run.positions, np.int64).tolist() == [e.pos for e in kept]  # type: ignore[attr-defined]
        assert run.bodies == b"".join(e.body for e in kept)  # type: ignore[attr-defined]
        assert run.size == sum(e.size for e in es)  # type: ignore[attr-defined]
        assert run.size <= budget or run.scanned == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("where", ["body", "chain crc", "term", "channel", "magic", "unit pos", "unit size",
                                   "unit magic", "unit term"])
def test_any_damage_makes_it_step_aside(store: FileLedgerStore, where: str) -> None:
    """The stretch and its units as read, one byte of them flipped: no answer (the caller's
    loop then reads the stretch record by record, and names or repairs the damage)."""
    raw = store.read_raw(0, 1 << 30)
    data, count = bytearray(raw.data), raw.count
    raw.data.release()
    units = store._index_units(0, count)
    assert units is not None
    f = store.get(0)
    first = (f.term, f.pos, f.magic, f.chain_crc, f.body_crc)

    def run(d: bytearray, u: bytes) -> object:
        return check_run(memoryview(d), 0, u, first, NORMAL, True, 1 << 30, True)

    assert run(data, units) is not None
    victim = next(i for i in range(60, count) if store.get(i).body)
    pos = store.get(victim).pos - f.pos
    field = {"body": HEADER_SIZE + 1, "chain crc": 37, "term": 23, "channel": 35, "magic": 3}
    unit_field = {"unit pos": 11, "unit size": 15, "unit magic": 3, "unit term": 31}
    if where in field:
        data[pos + field[where]] ^= 0x21
    else:
        u = bytearray(units)
        u[victim * INDEX_UNIT_SIZE + unit_field[where]] ^= 0x21
        units = bytes(u)
    assert run(data, units) is None
