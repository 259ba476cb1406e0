"""Queries ride out leader changes (spark.retry), with default options only.

Real faults on a real 3-member group: the leader SIGSTOPped for 6 s while a batch read's only
task is in the middle of its range and has been reading for longer than 10 s (the old deadline
counted from the task's start), and a stream whose leader is SIGSTOPped and later SIGKILLed.
Both must deliver every index exactly once, in order. The same module checks what fails fast
(nothing listens at any member's address; a group the members do not serve) and what is
waited out to the deadline (members answer but none leads).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import udf

from dledger.local_cluster import local_cluster
from dledger.runtime.client import DLedgerClient
from integration.harness import wait_until

from .helpers import Group, make_peers, read_all, running_group

pytestmark = pytest.mark.spark

OLD_DEADLINE_S = 10.0  # timeoutSeconds' old default, counted from a task's start
STALL_S = 6.0


@pytest.fixture
def own_group(tmp_path: Path) -> Iterator[tuple[local_cluster, Group]]:
    with running_group(tmp_path / "own", "resil") as pair:
        yield pair


def _fill(g: Group, n: int, size: int) -> int:
    """Append n entries of `size` bytes; the index of the first."""
    start = g.committed_next()
    pad = b"x" * max(0, size - 16)
    for k in range(0, n, 1000):
        g.client.append_batch([b"%015d|" % i + pad for i in range(k, min(n, k + 1000))])
    return start


def _leader(cluster: local_cluster, g: Group) -> str:
    return str(wait_until(lambda: g.client.metadata().leader_id, 60, "a leader"))


def _stall(cluster: local_cluster, g: Group) -> str:
    """SIGSTOP the leader for STALL_S, then SIGCONT it."""
    leader = _leader(cluster, g)
    p = cluster.procs[leader]
    p.send_signal(signal.SIGSTOP)
    try:
        time.sleep(STALL_S)
    finally:
        p.send_signal(signal.SIGCONT)
    return leader


def _kill_and_restart(cluster: local_cluster, g: Group) -> str:
    leader = _leader(cluster, g)
    p = cluster.procs[leader]
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=20)
    time.sleep(1.0)
    cluster.start_member(leader)
    return leader


def _transfer(client: DLedgerClient, target: str) -> None:
    """Move leadership to `target`, asking again while it is not ready (catching up)."""
    def moved() -> bool:
        client.transfer_leadership(target)
        return True

    wait_until(moved, 60, f"a leadership transfer to {target}")


def _slow_indexes(df: DataFrame, progress: Path, pause: float, every: int = 2000) -> DataFrame:
    """The `index` column through a consumer that takes `pause` seconds per `every` rows and
    writes how far it got. It takes the bodies too: the rows buffered between the task's
    reader and it are then few (bounded by bytes), so the reader, paced by it, is still
    sending read requests when the stall comes."""
    path = str(progress)

    def consume(index: int, body: bytes) -> int:
        if index % every == 0:
            with open(path, "a") as f:
                f.write(f"{time.time()} {index} {len(body)}\n")
            time.sleep(pause)
        return index

    return df.select(udf(consume, "long")("index", "body").alias("index"))


def _progress(progress: Path) -> list[tuple[float, int]]:
    if not progress.exists():
        return []
    return [(float(t), int(i)) for t, i, _ in (line.split() for line in progress.read_text().splitlines() if line)]


Fault = Callable[[local_cluster, Group], str]


def _moved_on(progress: Path, lines: int) -> list[tuple[float, int]] | None:
    """The progress, once it has a few more lines than `lines`."""
    p = _progress(progress)
    return p if len(p) > lines + 2 else None


def _batch_read_through_a_stall(spark: SparkSession, cluster: local_cluster, g: Group, tmp_path: Path,
                                entries: int, pause: float, size: int = 1024, faults: tuple[Fault, ...] = (_stall,),
                                **options: str) -> None:
    """`faults` strike one after another while the task reads: the first once it has read for
    longer than the old deadline, each next one once the read has moved on after the last."""
    start = _fill(g, entries, size)
    end = g.committed_next()
    progress = tmp_path / "progress"
    stalled: list[str] = []
    failed: list[BaseException] = []

    def stall_mid_read() -> None:
        try:
            # the task has read for longer than the old deadline and is not done
            def long_reading() -> list[tuple[float, int]] | None:
                p = _progress(progress)
                return p if p and time.time() - p[0][0] > OLD_DEADLINE_S + 0.5 else None

            seen = wait_until(long_reading, 300, "a task reading for longer than 10 s")
            for fault in faults:
                assert seen[-1][1] < end - 1, "the read ended before the faults: raise entries or pause"
                stalled.append(fault(cluster, g))
                seen = wait_until(partial(_moved_on, progress, len(_progress(progress))), 300,
                                  "the read moving on after the fault")
        except BaseException as e:  # seen by the test below
            failed.append(e)

    staller = threading.Thread(target=stall_mid_read, daemon=True)
    staller.start()
    df = (spark.read.format("dledger").option("peers", g.peers).option("group", g.name)
          .option("startingIndex", json.dumps({g.name: start})).options(**options).load())
    got = [r["index"] for r in _slow_indexes(df, progress, pause).collect()]
    staller.join(timeout=120)
    assert not failed, failed
    assert len(stalled) == len(faults), "not every fault happened"
    p = _progress(progress)
    assert any(t > p[0][0] + OLD_DEADLINE_S for t, _ in p), "no batch came after the old deadline"
    expected = [e.index for e in read_all(g.client, start) if e.index < end]
    assert len(expected) == entries
    assert got == expected  # every index once, in order


def test_a_batch_read_rides_out_a_leader_stall_after_ten_seconds(
        spark: SparkSession, own_group: tuple[local_cluster, Group], tmp_path: Path) -> None:
    """The issue's reproduction, small: one task, the leader SIGSTOPped for 6 s once the task
    has read for more than 10 s and is mid-range; defaults only."""
    cluster, g = own_group
    _batch_read_through_a_stall(spark, cluster, g, tmp_path, entries=100_000, pause=0.5)


@pytest.mark.slow  # the size: 2M entries (minutes)
def test_a_2m_entry_batch_read_rides_out_a_leader_stall_and_kill(
        spark: SparkSession, own_group: tuple[local_cluster, Group], tmp_path: Path) -> None:
    cluster, g = own_group
    _batch_read_through_a_stall(spark, cluster, g, tmp_path, entries=2_000_000, pause=0.01, size=100,
                                faults=(_stall, _kill_and_restart),
                                entriesPerPartition="2000000")  # one task, as in the report


def test_a_stream_rides_out_a_stall_and_a_kill_and_elections_make_no_empty_batch(
        spark: SparkSession, own_group: tuple[local_cluster, Group], tmp_path: Path) -> None:
    """Entries appended all along; the leader SIGSTOPped 6 s, later SIGKILLed (and restarted),
    at last moved with no data after it: every index once, in order, and no micro-batch
    without rows (the new leaders' NOOP entries alone make none)."""
    cluster, g = own_group
    start = g.committed_next()
    batches: list[list[int]] = []
    stop = threading.Event()

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append([r["index"] for r in df.select("index").collect()])

    def append_all_along() -> None:
        writer = DLedgerClient(g.peers, g.name)
        try:
            k = 0
            while not stop.wait(0.1):
                try:
                    writer.append_batch([f"s-{k}-{i}".encode() for i in range(50)])
                    k += 1
                except Exception:  # a leader change: what got in is what the log holds
                    time.sleep(0.2)
        finally:
            writer.close()

    def seen() -> int:
        return max((i for b in batches for i in b), default=-1)

    q = (spark.readStream.format("dledger").option("peers", g.peers).option("group", g.name)
         .option("startingIndex", json.dumps({g.name: start})).load()
         .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="500 milliseconds").start())
    appender = threading.Thread(target=append_all_along, daemon=True)
    appender.start()
    try:
        for fault in (_stall, _kill_and_restart):
            wait_until(lambda: len([b for b in batches if b]) >= 2 or q.exception(), 300,
                       "micro-batches before the fault")
            assert q.exception() is None, q.exception()
            after = len(batches) + 2
            fault(cluster, g)
            wait_until(partial(lambda n: len(batches) >= n or q.exception(), after), 300,
                       "micro-batches after the fault")
            assert q.exception() is None, q.exception()
        stop.set()
        appender.join(timeout=60)
        end = g.committed_next()
        last = max(e.index for e in read_all(g.client, start))
        wait_until(lambda: seen() >= last or q.exception(), 300, "the stream reaching the last entry")
        # an election with nothing after it: its NOOP is committed, the stream sees no data
        leader = _leader(cluster, g)
        target = next(m for m in cluster.procs if m != leader)
        _transfer(g.client, target)
        wait_until(lambda: g.client.metadata().committed_index >= end, 60, "the new leader's NOOP committed")
        time.sleep(3.0)  # several triggers (0.5 s) over the NOOP-only range
        final = g.client.append_batch([b"after-the-election"])[0].index
        wait_until(lambda: seen() >= final or q.exception(), 300, "the entry after the election")
        assert q.exception() is None, q.exception()
    finally:
        stop.set()
        q.stop()
    got = [i for b in batches for i in b]
    assert got == [e.index for e in read_all(g.client, start)]  # every index once, in order
    assert all(batches), f"empty micro-batches at {[k for k, b in enumerate(batches) if not b]}"


# --- what fails fast, and what is waited out -------------------------------------------------


def test_a_group_nobody_listens_for_fails_in_seconds_naming_the_peers(spark: SparkSession) -> None:
    peers = make_peers()
    addresses = [p.split("-", 1)[1] for p in peers.split(";")]
    with pytest.raises(Exception, match=r"no member is reachable") as read:
        spark.read.format("dledger").option("peers", peers).load().collect()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match=r"no member is reachable") as write:
        df.write.format("dledger").mode("append").option("peers", peers).save()
    for e in (read, write):
        assert all(a in str(e.value) for a in addresses), str(e.value)[:2000]
        assert "still failing after" not in str(e.value)  # not the deadline (minutes)


def test_an_unknown_group_says_so(spark: SparkSession, group: Group) -> None:
    with pytest.raises(Exception, match=r"UNKNOWN_GROUP \(400\).*serve no group of that name") as e:
        spark.read.format("dledger").option("peers", group.peers).option("group", "nosuch").load().collect()
    assert "still failing" not in str(e.value)


def test_a_group_without_a_leader_is_waited_for_until_the_deadline(
        spark: SparkSession, own_group: tuple[local_cluster, Group]) -> None:
    """One member of three left: it answers, no leader can be elected. Reads and writes wait
    (the deadline is set short here), then fail saying how long they tried."""
    cluster, g = own_group
    leader = _leader(cluster, g)
    for m in [leader, next(m for m in cluster.procs if m != leader)]:
        cluster.procs[m].send_signal(signal.SIGKILL)
        cluster.procs[m].wait(timeout=20)
    with pytest.raises(Exception, match=r"still failing after .*option timeoutSeconds = 4 s") as read:
        spark.read.format("dledger").option("peers", g.peers).option("group", g.name) \
            .option("timeoutSeconds", "4").load().collect()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match=r"still failing after .*option writeTimeoutSeconds = 4 s") as write:
        df.write.format("dledger").mode("append").option("peers", g.peers).option("group", g.name) \
            .option("writeTimeoutSeconds", "4").save()
    for e in (read, write):
        assert "no member is reachable" not in str(e.value)


def test_ending_index_on_a_stream_fails_before_reading_saying_what_to_use(
        spark: SparkSession, group: Group, tmp_path: Path) -> None:
    """PySpark calls the source alike at read…load() and readStream…load(): the stream fails as
    it starts (its first step), not at a micro-batch, pointing to Trigger.AvailableNow."""
    q = (spark.readStream.format("dledger").option("peers", group.peers).option("endingIndex", "latest").load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        with pytest.raises(Exception, match=r"endingIndex is for batch reads only.*availableNow=True"):
            q.awaitTermination(300)
        assert q.lastProgress is None  # no micro-batch ran
    finally:
        q.stop()


def test_a_new_leaders_noop_is_no_new_offset(group: Group) -> None:
    """latestOffset (the driver's, called directly) over a range holding only the NOOP of an
    election: the offset stays; the next data entry moves it past both."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from dledger.spark.source import DLedgerStreamReader, ReadConfig

    reader = DLedgerStreamReader(ReadConfig.from_options({"peers": group.peers, "group": group.name},
                                                         streaming=True))
    try:
        offset = reader.initialOffset()
        before = group.committed_next()
        assert offset == {group.name: before}
        leader = wait_until(lambda: group.client.metadata().leader_id, 60, "a leader")
        target = next(m for m in group.client.peers if m != leader)
        _transfer(group.client, target)
        wait_until(lambda: group.committed_next() > before, 60, "the new leader's NOOP committed")
        assert reader.latestOffset(offset, ReadAllAvailable()) == offset
        index = group.client.append_batch([b"data after the noop"])[0].index
        wait_until(lambda: reader.latestOffset(offset, ReadAllAvailable())[group.name] > index, 60,
                   "an offset past the data")
    finally:
        reader.stop()
