"""`format("dledger-files")` on a store written by upstream DLedger's own DLedgerMmapFileStore
(the fixture beside the clone; `expected.tsv` is what upstream's get(i) returns). Upstream
records no committed index, so it is read with includeUncommitted; its records (CRC fields 0)
are read unverified; a damaged header in its middle fails the read, naming file and offset,
where a member would refuse to start (not a silent end of the log)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from unit.upstream_fixture import FIXTURE, copy_fixture
from unit.upstream_fixture import expected as upstream_rows

pytestmark = pytest.mark.spark

DATA_FILE_SIZE = 64 << 10

if not (FIXTURE / "dledger-n0").is_dir():
    pytest.skip(f"upstream DLedger's store fixture is not at {FIXTURE}", allow_module_level=True)


def expected() -> list[tuple[int, int, int, int, int, str]]:
    """(index, term, pos, magic, body length, sha256(body)) per upstream's get(i)."""
    return [(i, t, p, m, n, h) for i, t, p, m, _, n, _, h in upstream_rows()]


def test_entries_equal_upstreams_get(spark: SparkSession, tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    rows = (spark.read.format("dledger-files").option("includeUncommitted", "true").load(str(d))
            .orderBy("index").collect())
    got = [(r["index"], r["term"], r["pos"], hashlib.sha256(bytes(r["body"])).hexdigest()) for r in rows]
    want = [(i, t, p, h) for i, t, p, m, _, h in expected() if m == 1]  # entries: NORMAL records
    assert got == want
    assert len(want) > 390


def test_records_equal_upstreams_get(spark: SparkSession, tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    rows = (spark.read.format("dledger-files").option("mode", "records").option("includeUncommitted", "true")
            .load(str(d)).orderBy("index").collect())
    got = [(r["index"], r["term"], r["pos"], r["magic"], r["body_size"]) for r in rows]
    assert got == [(i, t, p, m, n) for i, t, p, m, n, _ in expected()]
    assert all(r["error"] is None for r in rows)
    assert {(r["chain_crc"], r["body_crc"]) for r in rows} == {(0, 0)}  # upstream's: unverified


def test_a_flipped_header_byte_mid_store_fails_the_read(spark: SparkSession, tmp_path: Path) -> None:
    """Upstream's records have no CRC, so a flipped body byte cannot be seen: flip a header
    byte (the index field of record 200)."""
    d = copy_fixture(tmp_path)
    pos = expected()[200][2]
    name = d / "data" / f"{pos - pos % DATA_FILE_SIZE:020d}"
    fd = os.open(name, os.O_RDWR)
    try:
        b = os.pread(fd, 1, pos % DATA_FILE_SIZE + 15)
        os.pwrite(fd, bytes([b[0] ^ 0x04]), pos % DATA_FILE_SIZE + 15)
    finally:
        os.close(fd)
    with pytest.raises(Exception, match=rf"refuse to start on this store: {name} offset {pos % DATA_FILE_SIZE}: "
                                        r"record 200 fails its check"):
        spark.read.format("dledger-files").option("includeUncommitted", "true").load(str(d)).collect()


def _all_rows(spark: SparkSession, d: Path) -> list[tuple[int, int, bytes]]:
    rows = (spark.read.format("dledger-files").option("includeUncommitted", "true").load(str(d))
            .orderBy("index").collect())
    return [(r["index"], r["term"], bytes(r["body"])) for r in rows]


def test_upstreams_store_after_its_first_file_was_deleted_reads_whole(spark: SparkSession, tmp_path: Path) -> None:
    """Upstream's retention deleted the first data file: the log begins above 0, with no
    checkpoint naming the chain before it."""
    d = copy_fixture(tmp_path)
    (d / "data" / ("0" * 20)).unlink()
    got = [(i, t) for i, t, _ in _all_rows(spark, d)]
    want = [(i, t) for i, t, p, m, _, _ in expected() if m == 1 and p >= DATA_FILE_SIZE]
    assert got == want and want[0][0] > 0


def test_a_verified_store_beginning_above_0_without_checkpoint_reads_whole(spark: SparkSession,
                                                                          tmp_path: Path) -> None:
    """dledger's own records (chain CRCs filled) whose first data file is gone and no
    checkpoint: the chain before the begin is the one its first record follows
    (offline.chain_before), so every row is read, as a member reads them."""
    from dledger.store.file import FileLedgerStore

    d = tmp_path / "s"
    s = FileLedgerStore(d, data_file_size=4096, index_file_size=320, retention_check_interval_ms=3_600_000)
    s.append_as_leader([b"%04d" % i * 25 for i in range(60)], 3)
    first_kept = next(i for i in range(60) if s.get(i).pos >= 4096)
    s.close()
    (d / "checkpoint").unlink()
    (d / "data" / ("0" * 20)).unlink()
    assert _all_rows(spark, d) == [(i, 3, b"%04d" % i * 25) for i in range(first_kept, 60)]
