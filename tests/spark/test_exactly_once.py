"""Exactly-once writes (spark.sink): each row once, whatever fails while it is written.

Real faults: the group's leader SIGKILLed in the middle of a batch write, a streaming
driver SIGKILLed (its whole process group) in the middle of a micro-batch, a query stopped
in the middle of one; and a task's retry, which runs with the same producer id as the
attempt before it (a write run again under its writeId is the same thing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dledger.local_cluster import local_cluster
from integration.harness import wait_until

from .helpers import Group, read_all, running_group, start_group

pytestmark = pytest.mark.spark

ROWS = 100_000


@pytest.fixture
def own_group(tmp_path: Path) -> Iterator[tuple[local_cluster, Group]]:
    with running_group(tmp_path / "own", "eo") as pair:
        yield pair


def _committed_rows(g: Group, start: int) -> int:
    try:
        return g.client.metadata().committed_index - start
    except Exception:
        return -1


def _kill_leader(cluster: local_cluster, g: Group) -> str:
    leader = wait_until(lambda: g.client.metadata().leader_id, 60, "a leader")
    p = cluster.procs[leader]
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=20)
    return leader


def test_leader_killed_twice_during_a_batch_write_appends_each_row_once(
        spark: SparkSession, own_group: tuple[local_cluster, Group]) -> None:
    cluster, g = own_group
    start = g.committed_next()
    tag = uuid.uuid4().hex[:8]
    df = spark.range(ROWS).selectExpr(f"concat('{tag}-', cast(id as string)) as body").repartition(4)
    killed: list[str] = []
    done = threading.Event()

    def kill_twice() -> None:  # the write runs on the main thread (PySpark's data sources are per thread)
        for at in (ROWS // 5, ROWS * 3 // 5):  # two points of the write
            while _committed_rows(g, start) < at:
                if done.wait(0.05):
                    return
            victim = _kill_leader(cluster, g)
            killed.append(victim)
            time.sleep(1.0)
            cluster.start_member(victim)

    killer = threading.Thread(target=kill_twice, daemon=True)
    killer.start()
    try:
        df.write.format("dledger").mode("append").option("peers", g.peers).option("group", g.name) \
            .option("batchSize", "1000").save()
    finally:
        done.set()
        killer.join(timeout=120)
    assert len(killed) == 2, f"the write ended after {len(killed)} kills"
    bodies = Counter(e.body for e in read_all(g.client, start))
    assert sum(bodies.values()) == ROWS, f"{sum(bodies.values())} rows for {ROWS} ids"
    assert set(bodies) == {f"{tag}-{i}".encode() for i in range(ROWS)}


def test_a_retried_task_appends_only_what_its_attempt_before_did_not(spark: SparkSession, group: Group) -> None:
    """A task's attempts share its producer id (writeId + partition): the rows an earlier
    attempt appended are answered, not stored again; a partition written half-way is completed."""
    start = group.committed_next()
    write_id = f"retry-{uuid.uuid4().hex}"
    rows = [(f"{write_id}-{i}",) for i in range(6000)]

    def write(n: int) -> None:
        spark.createDataFrame(rows[:n], "body string").coalesce(1).write.format("dledger").mode("append") \
            .option("peers", group.peers).option("writeId", write_id).option("batchSize", "700").save()

    write(2500)  # the first attempt got this far
    write(6000)  # the retry: the same rows, in the same order, then the rest
    write(6000)  # and once more: nothing new
    got = Counter(e.body for e in read_all(group.client, start) if e.body.startswith(write_id.encode()))
    assert sorted(got) == sorted(r[0].encode() for r in rows) and set(got.values()) == {1}


def test_a_write_id_reused_for_other_rows_fails_its_task(spark: SparkSession, group: Group) -> None:
    """Issue 26: other rows under numbers already stored were answered as duplicates and
    never stored, without a word. The leader compares bodies: the task fails, saying why."""
    start = group.committed_next()
    write_id = f"reused-{uuid.uuid4().hex}"

    def write(tag: str) -> None:
        spark.createDataFrame([(f"{write_id}/{tag}-{i}",) for i in range(100)], "body string").coalesce(1).write \
            .format("dledger").mode("append").option("peers", group.peers).option("writeId", write_id).save()

    write("first")
    with pytest.raises(Exception, match=r"SEQUENCE_REUSED \(436\).*make the plan deterministic"):
        write("other")
    got = [e.body for e in read_all(group.client, start) if e.body.startswith(write_id.encode())]
    assert sorted(got) == sorted(f"{write_id}/first-{i}".encode() for i in range(100))


def test_a_write_id_reused_for_more_other_rows_in_several_partitions_fails_the_job(
        spark: SparkSession, group: Group) -> None:
    """The issue's shape: 5 rows stored, then 7 other rows under the same writeId (5 of them
    had vanished as "duplicates"). Every partition whose numbers are taken fails; the job
    fails and stores none of the other rows, not even those past the stored numbers."""
    start = group.committed_next()
    write_id = f"reused7-{uuid.uuid4().hex}"

    def write(tag: str, n: int) -> None:
        spark.createDataFrame([(f"{write_id}/{tag}-{i}",) for i in range(n)], "body string").repartition(2) \
            .sortWithinPartitions("body").write.format("dledger").mode("append").option("peers", group.peers) \
            .option("writeId", write_id).option("batchSize", "100").save()

    write("first", 50)
    with pytest.raises(Exception, match=r"SEQUENCE_REUSED \(436\).*use a new writeId"):
        write("other", 70)
    got = [e.body for e in read_all(group.client, start) if e.body.startswith(write_id.encode())]
    assert sorted(got) == sorted(f"{write_id}/first-{i}".encode() for i in range(50))


def _write_rows(spark: SparkSession, g: Group, write_id: str, rows: list[str], batch: int = 40) -> None:
    """One partition (in order), `batch` rows per request."""
    spark.createDataFrame([(r,) for r in rows], "body string").coalesce(1).write.format("dledger") \
        .mode("append").option("peers", g.peers).option("group", g.name).option("writeId", write_id) \
        .option("batchSize", str(batch)).save()


def test_a_long_partition_retried_is_compared_whole(spark: SparkSession, group: Group) -> None:
    """Issue 26: a retry sends its partition again from number 0, and rows of requests older
    than the last 32 were answered as duplicates without being compared. Every one is now:
    the same rows are answered, one other row anywhere fails the task."""
    start = group.committed_next()
    write_id = f"long-{uuid.uuid4().hex}"
    rows = [f"{write_id}-{i}" for i in range(2000)]
    _write_rows(spark, group, write_id, rows[:1600])  # 40 requests
    _write_rows(spark, group, write_id, rows)  # the retry: 40 requests answered, 10 appended
    changed = [*rows[:100], f"{write_id}-other", *rows[101:]]
    with pytest.raises(Exception, match=r"SEQUENCE_REUSED \(436\)"):
        _write_rows(spark, group, write_id, changed)  # row 100: in the third request of 50
    got = Counter(e.body for e in read_all(group.client, start) if e.body.startswith(write_id.encode()))
    assert sorted(got) == sorted(r.encode() for r in rows) and set(got.values()) == {1}


def test_a_retry_older_than_the_span_budget_fails_saying_why(spark: SparkSession, tmp_path: Path) -> None:
    """Over max_producer_spans a producer keeps its first and 32 latest requests' places: a
    retry re-sending rows in between cannot be compared, and fails at once (438)."""
    cluster, g = start_group(tmp_path / "spans", "spans", {"max_producer_spans": 40})
    try:
        start = g.committed_next()
        write_id = f"spans-{uuid.uuid4().hex}"
        rows = [f"{write_id}-{i}" for i in range(2000)]
        _write_rows(spark, g, write_id, rows)  # 50 requests: over the budget, the middle ones trimmed
        with pytest.raises(Exception, match=r"DUPLICATE_UNVERIFIABLE \(438\).*raise max_producer_spans"):
            _write_rows(spark, g, write_id, rows)
        got = Counter(e.body for e in read_all(g.client, start) if e.body.startswith(write_id.encode()))
        assert sorted(got) == sorted(r.encode() for r in rows) and set(got.values()) == {1}
    finally:
        g.client.close()
        cluster.__exit__()


def test_without_idempotence_a_retry_duplicates(spark: SparkSession, group: Group) -> None:
    """The opposite case, so the test above can fail: plain appends store a retried row twice."""
    start = group.committed_next()
    tag = f"plain-{uuid.uuid4().hex}"
    df = spark.createDataFrame([(f"{tag}-{i}",) for i in range(50)], "body string").coalesce(1)
    for _ in range(2):
        df.write.format("dledger").mode("append").option("peers", group.peers).option("writeId", tag) \
            .option("idempotent", "false").save()
    got = Counter(e.body for e in read_all(group.client, start) if e.body.startswith(tag.encode()))
    assert set(got.values()) == {2}


_DRIVER = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from dledger.spark import register
    src_peers, dst_peers, ckpt, trigger = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    src = (spark.readStream.format("dledger").option("peers", src_peers).option("group", "src")
           .option("startingIndex", "earliest").option("maxEntriesPerTrigger", "20000").load())
    w = (src.selectExpr("body").writeStream.format("dledger").option("peers", dst_peers).option("group", "dst")
         .option("batchSize", "200").option("checkpointLocation", ckpt))
    q = (w.trigger(availableNow=True) if trigger == "now" else w.trigger(processingTime="1 second")).start()
    q.awaitTermination()
    print("DONE", flush=True)
""")


def _driver(src: Group, dst: Group, ckpt: Path, trigger: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-c", _DRIVER, src.peers, dst.peers, str(ckpt), trigger],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.mark.slow  # a minute (two drivers, a SIGKILL): make soak; the demo restarts a stream from its checkpoint
def test_streaming_sink_survives_a_killed_driver_and_a_stop_mid_batch(spark: SparkSession, tmp_path: Path) -> None:
    src_cluster, src = start_group(tmp_path / "src", "src")
    dst_cluster, dst = start_group(tmp_path / "dst", "dst")
    try:
        total = 60_000
        for k in range(0, total, 5000):
            src.client.append_batch([f"s-{i}".encode() for i in range(k, k + 5000)])
        ckpt, log = tmp_path / "ckpt", tmp_path / "driver.log"
        # 1. the driver machine dies in the middle of a micro-batch (a batch is 20,000 rows)
        driver = _driver(src, dst, ckpt, "continuous", log)
        seen = wait_until(lambda: (n := _committed_rows(dst, 0)) > 2000 and n, 300, "the sink writing")
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        assert seen < total
        # 2. restarted from its checkpoint, stopped in the middle of a batch (in this process)
        q = (spark.readStream.format("dledger").option("peers", src.peers).option("group", "src")
             .option("startingIndex", "earliest").option("maxEntriesPerTrigger", "20000").load()
             .selectExpr("body").writeStream.format("dledger").option("peers", dst.peers).option("group", "dst")
             .option("batchSize", "200").option("checkpointLocation", str(ckpt))
             .trigger(processingTime="1 second").start())
        before = _committed_rows(dst, 0)
        wait_until(lambda: _committed_rows(dst, 0) > before + 300 or not q.isActive, 300, "the restart writing")
        q.stop()
        # 3. and run to the end
        driver = _driver(src, dst, ckpt, "now", log)
        assert driver.wait(timeout=600) == 0, log.read_text()[-3000:]
        bodies = Counter(e.body for e in read_all(dst.client, 0))
        dups = [b for b, n in bodies.items() if n > 1]
        assert not dups, f"{len(dups)} rows appended twice, e.g. {dups[:3]}"
        assert set(bodies) == {f"s-{i}".encode() for i in range(total)}
    finally:
        for g, c in ((src, src_cluster), (dst, dst_cluster)):
            g.client.close()
            c.__exit__()


_RETRYING_DRIVER = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from dledger.spark import register
    peers, group, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # local[2, 4]: a failed task is tried again, up to 4 times (plain local[2] fails the job)
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def fail_first_attempt(ids):
        tc = TaskContext.get()
        for k, row in enumerate(ids):
            # the first attempt hands the writer a null body after 3,000 rows: the writer has
            # appended those (500 a request) when it fails the task on the null
            yield (None,) if tc.attemptNumber() == 0 and k == 3000 else (f"r-{row[0]}",)

    df = spark.range(rows, numPartitions=2).rdd.mapPartitions(fail_first_attempt).toDF("body string")
    df.write.format("dledger").mode("append").option("peers", peers).option("group", group) \
        .option("batchSize", "500").save()
    print("WRITTEN", flush=True)
""")


def test_tasks_that_fail_after_appending_are_retried_and_append_each_row_once(tmp_path: Path) -> None:
    """Real task retries (a driver with local[2,4]): each task's first attempt dies after its
    first requests were appended; the second attempt sends the same rows under the same
    producer id and numbers. Exactly the rows, once each."""
    cluster, g = start_group(tmp_path / "g", "retry")
    try:
        rows = 20_000
        start = g.committed_next()
        log = tmp_path / "driver.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        p = subprocess.run([sys.executable, "-c", _RETRYING_DRIVER, g.peers, g.name, str(rows)], env=env,
                           stdout=log.open("wb"), stderr=subprocess.STDOUT, timeout=600)
        out = log.read_text()
        assert p.returncode == 0 and "WRITTEN" in out, out[-3000:]
        assert "has a null body" in out  # the first attempts did fail (and were retried)
        bodies = Counter(e.body for e in read_all(g.client, start))
        assert sum(bodies.values()) == rows, f"{sum(bodies.values())} rows for {rows}"
        assert set(bodies) == {f"r-{i}".encode() for i in range(rows)}
    finally:
        g.client.close()
        cluster.__exit__()

