"""Atomic batch writes (`transactional`) and `isolation=read_committed` reads (spark.isolation).

A transactional job runs in a driver process of its own, held in the middle of its write
(a task waits for a file after appending part of its rows): read_committed readers, batch
and streaming, see none of its rows, nor anything appended after its first row, until its
driver commits; read_uncommitted readers see them as they come. An aborted job's rows
(a task failing after appending) are never shown, and do not hold readers back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dledger.spark.isolation import CONTROL_PREFIX
from integration.harness import wait_until

from .helpers import Group, read_all

pytestmark = pytest.mark.spark

_HELD_DRIVER = textwrap.dedent("""
    import os, sys, time
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from dledger.spark import register
    peers, group, tag, rows, flag = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def held(ids):
        for k, row in enumerate(ids):
            if k == 200 and TaskContext.get().partitionId() == 0:
                while not os.path.exists(flag):  # the test looks at the readers meanwhile
                    time.sleep(0.1)
            yield (f"{tag}-{row[0]}",)

    df = spark.range(rows, numPartitions=2).rdd.mapPartitions(held).toDF("body string")
    df.write.format("dledger").mode("append").option("peers", peers).option("group", group) \\
        .option("transactional", "true").option("batchSize", "50").save()
    print("WRITTEN", flush=True)
""")


def _read(spark: SparkSession, g: Group, start: int, isolation: str) -> list[tuple[int, bytes]]:
    df = spark.read.format("dledger").option("peers", g.peers).option("group", g.name) \
        .option("startingIndex", json.dumps({g.name: start})).option("isolation", isolation).load()
    return [(r["index"], bytes(r["body"])) for r in df.select("index", "body").collect()]


def _tagged(rows: list[tuple[int, bytes]], tag: str) -> list[bytes]:
    return sorted(b for _, b in rows if b.startswith(tag.encode()))


@pytest.mark.slow  # a second Spark driver (1-2 min on a loaded machine); CI: the aborted job below, unit/test_isolation
def test_read_committed_sees_a_job_only_once_its_driver_commits(
        spark: SparkSession, group: Group, tmp_path: Path) -> None:
    tag, rows = f"txn-{uuid.uuid4().hex[:8]}", 600
    start = group.committed_next()
    group.client.append(f"before-{tag}".encode())  # a plain append before the job: always shown
    flag, log, ckpt = tmp_path / "release", tmp_path / "driver.log", tmp_path / "ckpt"
    out = tmp_path / "out"

    def stream_once() -> list[bytes]:
        """A read_committed stream run to what is available (from its checkpoint): all it
        showed so far."""
        q = (spark.readStream.format("dledger").option("peers", group.peers).option("group", group.name)
             .option("startingIndex", json.dumps({group.name: start})).option("isolation", "read_committed")
             .load().select("index", "body").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        assert q.awaitTermination(240), "the stream did not end"
        assert q.exception() is None
        return [bytes(r["body"]) for r in spark.read.parquet(str(out)).collect()]

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    driver = subprocess.Popen([sys.executable, "-c", _HELD_DRIVER, group.peers, group.name, tag, str(rows),
                               str(flag)], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        # partition 1 appends its 300 rows and finishes; partition 0 holds (its first rows may still be
        # buffered on their way to the writer): the job is open
        wait_until(lambda: sum(e.body.startswith(tag.encode()) for e in read_all(group.client, start)) >= 300 or
                   driver.poll() is not None, 300, "the job's first rows in the log")
        assert driver.poll() is None, log.read_text()[-3000:]
        group.client.append(f"during-{tag}".encode())  # after the job's first row: held back with it
        assert len(_tagged(_read(spark, group, start, "read_uncommitted"), tag)) >= 300
        committed = _read(spark, group, start, "read_committed")
        assert _tagged(committed, tag) == [], "read_committed showed rows of an open job"
        assert [b for _, b in committed if b.endswith(tag.encode())] == [f"before-{tag}".encode()]
        assert [b for b in stream_once() if tag.encode() in b] == [f"before-{tag}".encode()]
        flag.touch()
        assert driver.wait(timeout=300) == 0 and "WRITTEN" in log.read_text(), log.read_text()[-3000:]
        want = sorted(f"{tag}-{i}".encode() for i in range(rows))
        committed = _read(spark, group, start, "read_committed")
        assert _tagged(committed, tag) == want
        assert f"during-{tag}".encode() in [b for _, b in committed]
        # the commit record is in the log, and no row of either reader (Kafka hides control records)
        assert any(e.body.startswith(CONTROL_PREFIX) for e in read_all(group.client, start))
        everything = _read(spark, group, start, "read_uncommitted")
        assert sorted(everything) == sorted(committed) and _tagged(everything, tag) == want
        seen = stream_once()  # the stream goes on past the committed job: each row once
        assert sorted(b for b in seen if b.startswith(tag.encode())) == want
        assert f"during-{tag}".encode() in seen
    finally:
        flag.touch()
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_an_aborted_job_is_never_shown_and_holds_no_reader_back(spark: SparkSession, group: Group) -> None:
    tag = f"abort-{uuid.uuid4().hex[:8]}"
    start = group.committed_next()
    # the one task appends 100 rows (50 a request), then meets a null body and fails: the job aborts
    data = [(f"{tag}-{i}",) for i in range(120)] + [(None,)]
    df = spark.createDataFrame(data, "body string").coalesce(1)
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(conf) or "10000"
    spark.conf.set(conf, "50")  # the null arrives in a later Arrow batch than the first rows
    try:
        with pytest.raises(Exception, match="null body"):
            df.write.format("dledger").mode("append").option("peers", group.peers).option("group", group.name) \
                .option("transactional", "true").option("batchSize", "50").save()
    finally:
        spark.conf.set(conf, before)
    group.client.append(f"after-{tag}".encode())
    stored = [e.body for e in read_all(group.client, start) if e.body.startswith(tag.encode())]
    assert len(stored) >= 50, "the failed task appended nothing: the test would prove nothing"
    assert _tagged(_read(spark, group, start, "read_uncommitted"), tag) == sorted(stored)
    committed = _read(spark, group, start, "read_committed")
    assert _tagged(committed, tag) == []
    assert f"after-{tag}".encode() in [b for _, b in committed]
    # the abort record is in the log, and no row of a read_uncommitted reader either, nor counted
    in_log = read_all(group.client, start)
    assert sum(e.body.startswith(CONTROL_PREFIX) for e in in_log) == 1
    uncommitted = [(i, b) for i, b in _read(spark, group, start, "read_uncommitted") if i <= in_log[-1].index]
    assert not any(b.startswith(CONTROL_PREFIX) for _, b in uncommitted)
    assert len(uncommitted) == len(in_log) - 1
    counted = spark.read.format("dledger").option("peers", group.peers).option("group", group.name) \
        .option("startingIndex", json.dumps({group.name: start})) \
        .option("endingIndex", json.dumps({group.name: in_log[-1].index + 1})).load().count()
    assert counted == len(in_log) - 1


def test_isolation_and_transactional_options_are_checked(spark: SparkSession, group: Group) -> None:
    with pytest.raises(Exception, match="option isolation: read_uncommitted or read_committed"):
        spark.read.format("dledger").option("peers", group.peers).option("isolation", "serializable").load() \
            .collect()
    with pytest.raises(Exception, match="option transactional is for batch writes"):
        spark.readStream.format("dledger").option("peers", group.peers).load().select("body").writeStream \
            .format("dledger").option("peers", group.peers).option("transactional", "true") \
            .option("checkpointLocation", "/tmp/dledger-txn-ckpt-" + uuid.uuid4().hex).start().awaitTermination(60)
