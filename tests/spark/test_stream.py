"""Streaming reads: exactly once across a restart, admission control, Trigger.AvailableNow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from integration.harness import wait_until

from .helpers import Group, read_all

pytestmark = pytest.mark.spark


def _stream(spark: SparkSession, g: Group, **options: str) -> DataFrame:
    reader = spark.readStream.format("dledger").option("peers", g.peers)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_restart_from_checkpoint_delivers_each_entry_once(spark: SparkSession, group: Group, tmp_path: Path) -> None:
    start = group.committed_next()
    for k in range(3):
        group.client.append_batch([f"stream-a-{k}-{i}".encode() for i in range(200)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run(available_now: bool) -> StreamingQuery:
        df = _stream(spark, group, startingIndex=json.dumps({group.name: start}), maxEntriesPerTrigger="150")
        w = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
        w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="500 milliseconds")
        return w.start()

    q = run(available_now=False)
    try:
        wait_until(lambda: any(p["numInputRows"] > 0 for p in q.recentProgress), 120, "a first micro-batch")
    finally:
        q.stop()
    first = spark.read.parquet(str(out)).count()
    assert 0 < first < 600  # stopped midway (at most 150 entries per micro-batch)

    for k in range(2):
        group.client.append_batch([f"stream-b-{k}-{i}".encode() for i in range(200)])
    q = run(available_now=True)
    assert q.awaitTermination(180), "the AvailableNow run did not end"
    assert q.exception() is None

    got = [(r["index"], bytes(r["body"])) for r in spark.read.parquet(str(out)).collect()]
    expected = [(e.index, e.body) for e in read_all(group.client, start)]
    assert len(expected) == 1000
    assert len(got) == len(set(got)), "duplicates in the sink"
    assert sorted(got) == expected


def test_max_entries_per_trigger_bounds_each_micro_batch(spark: SparkSession, group: Group, tmp_path: Path) -> None:
    start = group.committed_next()
    for k in range(5):
        group.client.append_batch([f"limit-{k}-{i}".encode() for i in range(100)])
    limit = 120
    batches: dict[int, list[int]] = {}

    def count(df: DataFrame, batch_id: int) -> None:
        batches[batch_id] = sorted(r["index"] for r in df.select("index").collect())

    q = (_stream(spark, group, startingIndex=json.dumps({group.name: start}), maxEntriesPerTrigger=str(limit))
         .writeStream.foreachBatch(count).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the AvailableNow run did not end"
    assert q.exception() is None
    sizes = [len(batches[b]) for b in sorted(batches)]
    assert all(n <= limit for n in sizes), sizes
    assert sum(sizes) == 500
    assert len([n for n in sizes if n]) >= math.ceil(500 / limit)
    flat = [i for b in sorted(batches) for i in batches[b]]
    assert flat == sorted(flat)  # micro-batches follow the log order
    assert flat == [e.index for e in read_all(group.client, start)]
