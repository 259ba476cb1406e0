"""`format("dledger-files")` cut inside data files (bytesPerPartition), with pushed filters
and a declared (pruned) schema. The store is written in-process (small data files, several
terms, NOOPs), so every record and every cut is known to the test."""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from dledger.entry import HEADER, HEADER_SIZE, INDEX_UNIT, INDEX_UNIT_SIZE, MAGIC_NOOP
from dledger.spark.files import (
    CorruptStoreError,
    FilePartition,
    IndexFiles,
    IndexUnavailable,
    boundary_at,
    first_index_at,
    plan,
    read_file,
)
from dledger.spark.pushdown import Pushed
from dledger.store.file import FileLedgerStore

pytestmark = pytest.mark.spark

FILE_SIZE = 65536
INDEX_FILE_SIZE = 32 * 1024  # the index spans two files: searches cross them
SMALL = "16384"  # bytesPerPartition of the split reads: ~4 tasks per data file (each a Spark task: ~0.1 s)

Row = tuple[str, int, int, int, bytes]


@dataclass
class Store:
    dir: Path  # <base>/grp/n0
    rows: list[Row]  # every NORMAL entry: (group, index, term, pos, body)
    records: int  # records, NOOPs included


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    d = tmp_path_factory.mktemp("split") / "grp" / "n0"
    s = FileLedgerStore(d, data_file_size=FILE_SIZE, index_file_size=INDEX_FILE_SIZE)
    rng = random.Random(7)
    rows: list[Row] = []
    try:
        for term in range(1, 5):
            s.append_as_leader([b""], term, magic=MAGIC_NOOP)
            for _ in range(6):
                bodies = [rng.randbytes(rng.randrange(1, 700)) for _ in range(50)]
                r = s.append_as_leader(bodies, term)
                rows += [("grp", r.first_index + k, term, r.positions[k], b) for k, b in enumerate(bodies)]
        s.set_committed(s.end_index)
        records = s.end_index + 1
    finally:
        s.close()
    assert len(list((d / "data").iterdir())) >= 6
    return Store(d, rows, records)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock"))
    return dst


def _df(spark: SparkSession, path: Path, schema: str | None = None, **options: str) -> DataFrame:
    reader = spark.read.format("dledger-files")
    if schema is not None:
        reader = reader.schema(schema)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(str(path))


def _rows(df: DataFrame) -> list[Row]:
    return sorted((r["group"], r["index"], r["term"], r["pos"], bytes(r["body"])) for r in df.collect())


def _split_tasks(path: Path, pushed: Pushed | None = None) -> list[FilePartition]:
    return plan(path, include_uncommitted=False, bytes_per_partition=int(SMALL), pushed=pushed)


# --- finding boundaries, without Spark ---------------------------------------------------------------------------


def test_first_index_at_is_a_binary_search() -> None:
    rng = random.Random(3)
    written: list[int] = []
    pos = 1000
    for _ in range(5000):
        written.append(pos)
        pos += 48 + rng.randrange(0, 300)
    positions: list[int | None] = [*written, *[None] * 300]  # then units never written: the index ends
    calls = 0

    def pos_of(i: int) -> int | None:
        nonlocal calls
        calls += 1
        return positions[i - 100]  # indexes start at 100

    lo, hi = 100, 100 + len(positions)
    for start in [0, 1000, 1001, written[2500], written[2500] + 1, written[-1], written[-1] + 1,
                  *rng.sample(range(1000, pos), 200)]:
        calls = 0
        want = next((100 + k for k, p in enumerate(positions) if p is None or p >= start), hi)
        assert first_index_at(pos_of, lo, hi, start) == want, start
        assert calls <= math.ceil(math.log2(len(positions))) + 1
    assert first_index_at(pos_of, 100, 5100, written[-1] + 1) == 5100  # no record at or after it
    assert first_index_at(pos_of, 200, 200, 0) == 200  # empty range


def test_boundaries_found_through_the_index_match_the_records(store: Store, tmp_path: Path) -> None:
    """Each cut starts at the first record at or after every 4096 bytes of its file, right
    after the record whose header the task is given; the tasks cover every record once."""
    tasks = _split_tasks(store.dir)
    by_pos = {pos: (index, term) for _, index, term, pos, _ in store.rows}
    for t in tasks:
        if t.end_link is None:
            continue
        assert t.end_pos is not None
        nxt = next(u for u in tasks if u.scan_from == t.end_pos)
        assert nxt.first_index == t.end_link.index + 1 and nxt.prev_chain == t.end_link.chain_crc
        assert nxt.prev_term == t.end_link.term
        cut = (t.end_pos - t.file_start) // int(SMALL) * int(SMALL) + t.file_start
        assert t.end_link.pos < cut <= t.end_pos  # the first record at or after the cut
        if t.end_pos in by_pos:
            assert by_pos[t.end_pos][0] == nxt.first_index
    read = [r for t in tasks for b in read_file(t) for r in zip(b.column("index").to_pylist(),
                                                                 b.column("pos").to_pylist(), strict=True)]
    assert read == [(i, p) for _, i, _, p, _ in store.rows]
    t = next(t for t in tasks if t.end_link is not None)
    assert t.end_link is not None
    with IndexFiles(store.dir / "index") as units, open(t.path, "rb") as f:
        b = boundary_at(units, f.fileno(), t.path, t.file_start, t.scan_from, t.file_start + FILE_SIZE,
                        t.end_link.index + 1)
        assert b is not None and (b.pos, b.prev) == (t.end_pos, t.end_link)
        assert boundary_at(units, f.fileno(), t.path, t.file_start, t.scan_from, t.file_start + FILE_SIZE,
                           10**6) is None  # past what the index holds


def _damage_unit(store_dir: Path, index: int, delta: int) -> None:
    path = store_dir / "index" / f"{index * INDEX_UNIT_SIZE // INDEX_FILE_SIZE * INDEX_FILE_SIZE:020d}"
    with open(path, "r+b") as f:
        f.seek(index * INDEX_UNIT_SIZE % INDEX_FILE_SIZE)
        magic, pos, size, idx, term = INDEX_UNIT.unpack(f.read(INDEX_UNIT_SIZE))
        f.seek(index * INDEX_UNIT_SIZE % INDEX_FILE_SIZE)
        f.write(INDEX_UNIT.pack(magic, pos + delta, size, idx, term))


def test_a_damaged_or_missing_index_leaves_files_whole(store: Store, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    whole = plan(store.dir, include_uncommitted=False)
    tasks = _split_tasks(store.dir)
    victim = next(t for t in tasks if t.end_link is not None)
    damaged = _copy(store.dir, tmp_path / "damaged" / "grp" / "n0")
    assert victim.end_link is not None
    _damage_unit(damaged, victim.end_link.index + 1, 16)
    with IndexFiles(damaged / "index") as units, open(victim.path, "rb") as f, \
            pytest.raises(IndexUnavailable, match="not adjacent records"):
        boundary_at(units, f.fileno(), victim.path, victim.file_start, victim.scan_from,
                    victim.file_start + FILE_SIZE, victim.end_link.index + 1)
    with caplog.at_level(logging.WARNING, "dledger.spark.files"):
        got = _split_tasks(damaged)
    assert "the index does not match the data" in caplog.text
    def in_victim(ts: list[FilePartition]) -> int:
        return sum(t.file_start == victim.file_start for t in ts)

    assert in_victim(got) == 1 < in_victim(tasks)  # that file whole, the others still cut
    assert len(got) == len(tasks) - in_victim(tasks) + 1
    assert [r for t in got for b in read_file(t) for r in b.column("index").to_pylist()] == \
        [r[1] for r in store.rows]

    missing = _copy(store.dir, tmp_path / "missing" / "grp" / "n0")
    shutil.rmtree(missing / "index")
    caplog.clear()
    with caplog.at_level(logging.WARNING, "dledger.spark.files"):
        got = _split_tasks(missing)
    assert "index files unusable" in caplog.text and "is missing" in caplog.text
    assert len(got) == len(whole)  # one task per data file, as without cuts


def test_a_task_that_does_not_stop_at_its_link_fails(store: Store) -> None:
    """The handshake at a cut: a task must end exactly after the record the next one starts
    from, with that chain CRC (here the planner's link is made wrong instead of the data)."""
    t = next(t for t in _split_tasks(store.dir) if t.end_link is not None)
    assert t.end_link is not None
    wrong_chain = replace(t, end_link=replace(t.end_link, chain_crc=t.end_link.chain_crc ^ 1))
    with pytest.raises(CorruptStoreError, match=r"the next task starts from chain crc"):
        list(read_file(wrong_chain))
    wrong_index = replace(t, end_link=replace(t.end_link, index=t.end_link.index - 1))
    with pytest.raises(CorruptStoreError, match=rf"{t.path}: corrupt record at offset \d+ .*the next task starts "
                                                rf"after index {t.end_link.index - 1}"):
        list(read_file(wrong_index))
    as_records = replace(wrong_chain, records=True)
    errors = [e for b in read_file(as_records) for e in b.column("error").to_pylist() if e]
    assert len(errors) == 1 and "the next task starts from chain crc" in errors[0]


# --- reads on Spark ----------------------------------------------------------------------------------------------


def test_split_read_equals_the_unsplit_read(spark: SparkSession, store: Store) -> None:
    whole = _df(spark, store.dir, bytesPerPartition="1g")
    assert _rows(whole) == store.rows
    files = whole.rdd.getNumPartitions()
    for size in (SMALL, "12345", "64k"):  # ~4 tasks a file, cuts at odd offsets, one task a file
        df = _df(spark, store.dir, bytesPerPartition=size)
        rows = df.collect()
        assert len(rows) == len(store.rows), size  # each record exactly once
        assert _rows(df) == store.rows, size
        if size != "64k":
            assert df.rdd.getNumPartitions() > files
    assert _df(spark, store.dir, bytesPerPartition=SMALL).rdd.getNumPartitions() >= 6 * FILE_SIZE // int(SMALL) // 2

    def records(size: str) -> list[tuple[object, ...]]:
        return sorted(tuple(r) for r in _df(spark, store.dir, mode="records", bytesPerPartition=size).collect())

    split = records(SMALL)
    assert split == records("1g") and len(split) == store.records
    assert all(r[-1] is None for r in split)


def test_uncommitted_tail_is_not_cut(spark: SparkSession, store: Store, tmp_path: Path) -> None:
    """Cuts stop at the committed index + 1: an uncommitted tail is one task, where a torn
    record ends the read (a later task would read on past it)."""
    d = _copy(store.dir, tmp_path / "grp" / "n0")
    ckpt = json.loads((d / "checkpoint").read_text())
    cut = store.rows[len(store.rows) // 2][1]
    ckpt["committed_index"] = cut
    (d / "checkpoint").write_text(json.dumps(ckpt))
    tasks = plan(d, include_uncommitted=True, bytes_per_partition=int(SMALL))
    starts = [t.first_index for t in tasks if t.scan_from != t.file_start]  # tasks that start at a cut
    assert max(starts) <= cut + 1 < max(t.first_index for t in _split_tasks(store.dir) if t.scan_from != t.file_start)
    assert len(tasks) < len(_split_tasks(store.dir))
    assert _rows(_df(spark, d, bytesPerPartition=SMALL)) == [r for r in store.rows if r[1] <= cut]
    assert _rows(_df(spark, d, bytesPerPartition=SMALL, includeUncommitted="true")) == store.rows


def _reseal(store_dir: Path, pos: int) -> tuple[Path, int]:
    """Change the body of the record at `pos` and write its new body CRC; its chain CRC is
    left stale (what only the chain catches)."""
    path = store_dir / "data" / f"{pos // FILE_SIZE * FILE_SIZE:020d}"
    offset = pos % FILE_SIZE
    with open(path, "r+b") as f:
        f.seek(offset)
        head = list(HEADER.unpack(f.read(HEADER_SIZE)))
        body = bytearray(f.read(head[8]))
        body[0] ^= 0x01
        head[7] = zlib.crc32(body)
        f.seek(offset)
        f.write(HEADER.pack(*head) + bytes(body))
    return path, offset


def _flip_body_byte(store_dir: Path, pos: int) -> tuple[Path, int]:
    path = store_dir / "data" / f"{pos // FILE_SIZE * FILE_SIZE:020d}"
    with open(path, "r+b") as f:
        f.seek(pos % FILE_SIZE + HEADER_SIZE)
        b = f.read(1)
        f.seek(pos % FILE_SIZE + HEADER_SIZE)
        f.write(bytes([b[0] ^ 0x01]))
    return path, pos % FILE_SIZE


def _corrupt_read(spark: SparkSession, d: Path, path: Path, offset: int, index: int, reason: str) -> None:
    for size in (SMALL, "1g"):
        with pytest.raises(Exception, match=rf"{path}: corrupt record at offset {offset} \(index {index} "
                                            rf"expected\): {reason}"):
            _df(spark, d, bytesPerPartition=size).collect()
    bad = [(r["index"], r["error"]) for r in _df(spark, d, mode="records", bytesPerPartition=SMALL).collect()
           if r["error"]]
    assert bad == [(index, reason)]


def test_corruption_inside_a_split_task_is_found(spark: SparkSession, store: Store, tmp_path: Path) -> None:
    tasks = _split_tasks(store.dir)
    t = next(t for t in tasks[len(tasks) // 2:] if t.end_link is not None and t.end_link.index - t.first_index >= 2)
    index = t.first_index + 1  # neither the first nor the last record of its task
    _, _, _, pos, _ = next(r for r in store.rows if r[1] == index)
    d = _copy(store.dir, tmp_path / "grp" / "n0")
    path, offset = _flip_body_byte(d, pos)
    _corrupt_read(spark, d, path, offset, index, "body crc mismatch")


@pytest.mark.parametrize("side", ["first", "last"])
def test_the_chain_is_checked_across_a_cut(spark: SparkSession, store: Store, tmp_path: Path, side: str) -> None:
    """A record rewritten with a valid body CRC but a stale chain CRC, right at a cut: the
    first record of a task (checked against the link the planner read) or the last record
    of the task before (checked by that task, whose end must still match the link)."""
    tasks = _split_tasks(store.dir)
    t = next(t for t in tasks[len(tasks) // 2:] if t.end_link is not None)
    assert t.end_link is not None
    index = t.end_link.index + 1 if side == "first" else t.end_link.index
    _, _, _, pos, _ = next(r for r in store.rows if r[1] == index)
    d = _copy(store.dir, tmp_path / "grp" / "n0")
    path, offset = _reseal(d, pos)
    assert any(u.end_link is not None and u.end_link.index + (side == "first") == index for u in _split_tasks(d))
    _corrupt_read(spark, d, path, offset, index, "chain crc mismatch")


def _explain(df: DataFrame, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    df.explain("formatted")
    return capsys.readouterr().out


def test_an_index_filter_plans_fewer_tasks(spark: SparkSession, store: Store,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # each query loads again: Spark 4.3 keeps the read a pushdown planned for the rest of
    # the loaded DataFrame's queries (see test_a_loaded_dataframe_keeps_its_first_pushdown)
    def df() -> DataFrame:
        return _df(spark, store.dir, bytesPerPartition=SMALL)

    lo, hi = store.rows[300][1], store.rows[420][1]
    filtered = df().filter(f"index >= {lo} and index < {hi}")
    assert _rows(filtered) == [r for r in store.rows if lo <= r[1] < hi]
    assert filtered.rdd.getNumPartitions() < df().rdd.getNumPartitions() // 4
    assert f"PushedFilters: [GreaterThanOrEqual(index,{lo}), LessThan(index,{hi})]" in _explain(filtered, capsys)
    # the task that holds `lo` starts at it (a cut at that index, found through the index)
    first = min(_split_tasks(store.dir, pushed=Pushed(index_lo=lo, index_hi=hi)), key=lambda t: t.first_index)
    assert first.first_index == lo

    one = df().filter(f"index = {lo}")
    assert _rows(one) == [r for r in store.rows if r[1] == lo] and one.rdd.getNumPartitions() == 1
    assert _rows(df().filter("index in (5, 6, 7, 900)")) == [r for r in store.rows if r[1] in (5, 6, 7, 900)]
    with_pos = df().filter(f"index < {hi} and pos % 2 = 0")  # pos is left to Spark
    assert _rows(with_pos) == [r for r in store.rows if r[1] < hi and r[3] % 2 == 0]


def test_term_and_group_filters(spark: SparkSession, store: Store) -> None:
    def df() -> DataFrame:
        return _df(spark, store.dir, bytesPerPartition=SMALL)

    t2 = df().filter("term = 2")
    assert _rows(t2) == [r for r in store.rows if r[2] == 2]
    assert t2.rdd.getNumPartitions() < df().rdd.getNumPartitions() // 2
    assert _rows(df().filter("term >= 3 and index < 900")) == [r for r in store.rows if r[2] >= 3 and r[1] < 900]
    assert _rows(df().filter("group = 'grp' and term < 2")) == [r for r in store.rows if r[2] < 2]
    other = df().filter("group = 'other'")
    assert other.collect() == [] and other.rdd.getNumPartitions() <= 1
    rec = _df(spark, store.dir, mode="records", bytesPerPartition=SMALL).filter("term = 4 and magic = 2")
    assert [(r["index"], r["term"]) for r in rec.collect()] == [(store.rows[-300][1] - 1, 4)]  # its NOOP


@pytest.mark.xfail(reason="PySpark 4.3 caches a Python source's planned read (PythonDataSourceV2.readInfo) per "
                          "loaded DataFrame; a query with no pushable filter reuses what an earlier filtered "
                          "query of the same DataFrame planned", strict=False)
def test_a_loaded_dataframe_keeps_its_first_pushdown(spark: SparkSession, store: Store) -> None:
    """Spark's problem, not the source's (format("dledger") has it too): kept here so that a
    PySpark that fixes it shows up as XPASS. The workaround is one load() per query."""
    df = _df(spark, store.dir)
    assert df.filter("index < 10").count() == 9
    assert df.count() == len(store.rows)


def test_a_declared_schema_prunes_columns(spark: SparkSession, store: Store) -> None:
    df = _df(spark, store.dir, "index long, term long", bytesPerPartition=SMALL)
    assert df.columns == ["index", "term"]
    assert sorted(tuple(r) for r in df.collect()) == [(r[1], r[2]) for r in store.rows]
    swapped = _df(spark, store.dir, "body binary, group string, index long", bytesPerPartition=SMALL)
    assert sorted((r["index"], bytes(r["body"]), r["group"]) for r in swapped.filter("index < 100").collect()) == \
        [(r[1], r[4], r[0]) for r in store.rows if r[1] < 100]
    rec = _df(spark, store.dir, "error string, index long", mode="records", bytesPerPartition=SMALL)
    assert sorted(tuple(r) for r in rec.collect()) == [(None, i) for i in range(store.records)]

    for schema, says in (("index long, offset long", "unknown column 'offset'"),
                         ("index int", "column 'index' of type int, expected long"),
                         ("member string", "unknown column 'member'")):
        with pytest.raises(Exception, match=rf"{says}.*Valid columns: group string, index long, term long, "
                                            r"pos long, body binary"):
            _df(spark, store.dir, schema).collect()


def test_a_read_without_bodies_still_checks_them_unless_told(spark: SparkSession, store: Store,
                                                             tmp_path: Path) -> None:
    index = store.rows[500][1]
    d = _copy(store.dir, tmp_path / "grp" / "n0")
    path, offset = _flip_body_byte(d, store.rows[500][3])
    with pytest.raises(Exception, match=rf"{path}: corrupt record at offset {offset} .*body crc mismatch"):
        _df(spark, d, "index long", bytesPerPartition=SMALL).collect()
    headers_only = _df(spark, d, "index long, pos long", bytesPerPartition=SMALL, verifyBodies="false")
    assert sorted(tuple(r) for r in headers_only.collect()) == [(r[1], r[3]) for r in store.rows]
    with pytest.raises(Exception, match="body crc mismatch"):  # a body asked for is always checked
        _df(spark, d, verifyBodies="false", bytesPerPartition=SMALL).filter(f"index = {index}").collect()


@pytest.mark.parametrize(("value", "says"), [("0", "must be greater than 0"), ("-5", "expected a number of bytes"),
                                             ("lots", "expected a number of bytes")])
def test_bytes_per_partition_is_checked_at_load(spark: SparkSession, store: Store, value: str, says: str) -> None:
    with pytest.raises(Exception, match=f"option bytesPerPartition: {says}"):
        _df(spark, store.dir, bytesPerPartition=value)  # load() alone, no action


def test_a_session_without_python_pushdown_still_filters(spark: SparkSession, store: Store,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Where the session set spark.sql.python.filterPushdown.enabled to false, register()
    gives readers without pushFilters (Spark refuses to plan one that has it): every task is
    planned and Spark filters the rows."""
    from dledger.spark import PUSHDOWN_CONF, register

    before = spark.conf.get(PUSHDOWN_CONF) or "true"
    spark.conf.set(PUSHDOWN_CONF, "false")  # this session, then back (a new session would share the
    register(spark)  # registrations, and refuses them again: DATA_SOURCE_ALREADY_EXISTS)
    try:
        df = _df(spark, store.dir, bytesPerPartition=SMALL)
        lo, hi = store.rows[300][1], store.rows[420][1]
        filtered = df.filter(f"index >= {lo} and index < {hi}")
        assert _rows(filtered) == [r for r in store.rows if lo <= r[1] < hi]
        assert filtered.rdd.getNumPartitions() == df.rdd.getNumPartitions()
        assert "PushedFilters" not in _explain(filtered, capsys)
    finally:
        spark.conf.set(PUSHDOWN_CONF, before)
        register(spark)
