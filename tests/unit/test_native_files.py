"""Spark's dledger-files read with the C loop (entry.native.scan_entries) against its Python
loop: the same rows, the same errors, over stores with NOOPs, several terms and data files,
upstream's unverified records, a flipped byte anywhere, and every option that changes what
the loop checks or returns (pushed index and term ranges, no body column, no body check,
uncommitted entries, tasks cut inside a file)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from dledger import entry
from dledger.entry import MAGIC_NOOP
from dledger.spark.files import CorruptStoreError, plan, read_file
from dledger.spark.pushdown import Pushed
from dledger.store.file import FileLedgerStore

FILE_SIZE = 64 << 10


def build(d: Path, seed: int) -> Path:
    """A closed store: NOOPs and entries of three terms over a few data files, committed short
    of its end."""
    rng = random.Random(seed)
    s = FileLedgerStore(d, data_file_size=FILE_SIZE, index_file_size=32 * 512, retention_check_interval_ms=3_600_000)
    try:
        for term in (1, 2, 4):
            s.append_as_leader([b""], term, magic=MAGIC_NOOP)
            for _ in range(rng.randint(1, 4)):
                s.append_as_leader([rng.randbytes(rng.randint(0, 700)) for _ in range(rng.randint(1, 40))], term)
        s.save_term(4, None)
        s.set_committed(s.end_index - rng.randint(0, 5))
    finally:
        s.close()
    return d


def read(d: Path, **kw: object) -> tuple[list[tuple[object, ...]], str]:
    """Every row the tasks of a read return (in task order), and the error that ended it."""
    rows: list[tuple[object, ...]] = []
    try:
        for p in plan(d, **kw):  # type: ignore[arg-type]
            for b in read_file(p):
                cols = [b.column(k).to_pylist() for k in range(b.num_columns)]
                rows.extend(zip(*cols, strict=True))
    except CorruptStoreError as e:
        return rows, str(e)
    return rows, ""


def both(d: Path, **kw: object) -> tuple[tuple[list[tuple[object, ...]], str], tuple[list[tuple[object, ...]], str]]:
    saved = entry.native
    try:
        c = read(d, **kw)
        entry.native = None
        py = read(d, **kw)
    finally:
        entry.native = saved
    return c, py


OPTIONS: list[dict[str, object]] = [
    {"include_uncommitted": False},
    {"include_uncommitted": True},
    {"include_uncommitted": False, "bytes_per_partition": 20_000},
    {"include_uncommitted": False, "pushed": Pushed(index_lo=30, index_hi=90)},
    {"include_uncommitted": True, "pushed": Pushed(term_lo=2, term_hi=4)},
    {"include_uncommitted": False, "bodies": False},
    {"include_uncommitted": False, "bodies": False, "verify_bodies": False},
    {"include_uncommitted": False, "records": True},
]


@pytest.mark.parametrize("seed", range(6))
def test_an_intact_store_reads_the_same(tmp_path: Path, seed: int) -> None:
    d = build(tmp_path / "s", seed)
    assert entry.native is not None
    for kw in OPTIONS:
        c, py = both(d, **kw)
        same_as(c, py, kw)
        assert c[0] or kw.get("pushed")


@pytest.mark.parametrize("seed", range(12))
def test_a_flipped_byte_reads_the_same(tmp_path: Path, seed: int) -> None:
    """One byte of a data file flipped (header, body or blank): the same rows before the damage
    and the same error naming it, or the same rows where the damage is not read."""
    d = build(tmp_path / "s", seed)
    rng = random.Random(1000 + seed)
    files = sorted((d / "data").iterdir())
    f = rng.choice(files)
    used = max(1, min(f.stat().st_size, FILE_SIZE) - 1)
    with open(f, "r+b") as fh:
        at = rng.randrange(min(used, 40_000))
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ rng.randint(1, 255)]))
    for kw in OPTIONS:
        try:
            c, py = both(d, **kw)
        except Exception as e:
            pytest.skip(f"planning refused the damaged store: {e}")
        same_as(c, py, (kw, at))


def same_as(c: tuple[list[tuple[object, ...]], str], py: tuple[list[tuple[object, ...]], str], why: object) -> None:
    """The same rows and error; a read that fails may have handed Spark a different number of
    rows before its error (the task fails either way): then one's rows begin the other's."""
    assert c[1] == py[1], why
    if c[1]:
        short, long = sorted((c[0], py[0]), key=len)
        assert long[: len(short)] == short, why
    else:
        assert c[0] == py[0], why
