"""Broker sets as DataFrames (issue 14): options `controller` and `brokers`; batch and
streaming reads of confirmed records, offsets per broker set, and the sink through
BrokerClient; a failover under a stream loses and repeats nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dledger.broker.local import local_broker_cluster
from dledger.ports import free_port_run
from dledger.spark.options import OptionError, parse_brokers
from integration.harness import wait_until

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_broker_cluster]:
    base = free_port_run(3 + 2 * 4)
    with local_broker_cluster(tmp_path_factory.mktemp("brokers"), controllers=3, broker_sets=2, replicas=2,
                              base_port=base, broker_args=["--all-ack-in-sync-state-set"]) as d:
        yield d


def test_broker_options() -> None:
    assert parse_brokers({"controller": "h:1", "brokers": "b0, b1"}) == {"b0": "h:1", "b1": "h:1"}
    assert parse_brokers({"controller": "h:1", "brokers": '["b0"]'}) == {"b0": "h:1"}
    assert parse_brokers({"peers": "n0-h:1"}) is None
    with pytest.raises(OptionError, match="both"):
        parse_brokers({"controller": "h:1"})
    with pytest.raises(OptionError, match="either"):
        parse_brokers({"controller": "h:1", "brokers": "b0", "peers": "n0-h:1"})


def test_write_then_batch_read_both_broker_sets(spark: SparkSession, brokers: local_broker_cluster) -> None:
    d = brokers
    for name in ("b0", "b1"):
        rows = [(f"{name}-row-{i}",) for i in range(300)]
        (spark.createDataFrame(rows, "body string").repartition(2).write.format("dledger")
         .option("controller", d.controller).option("brokers", name).mode("append").save())
    df = (spark.read.format("dledger").option("controller", d.controller).option("brokers", "b0,b1").load())
    got = {(r["group"], r["body"].decode()) for r in df.collect()}
    for name in ("b0", "b1"):
        assert {b for g, b in got if g == name} >= {f"{name}-row-{i}" for i in range(300)}
    b0 = df.where("group = 'b0'").orderBy("index").collect()
    assert [r["index"] for r in b0] == list(range(len(b0)))  # queue offsets, no gap
    assert all(r["term"] >= 1 for r in b0) and b0[1]["pos"] > b0[0]["pos"]  # epoch, byte offset


def test_stream_across_a_failover_delivers_each_record_once(spark: SparkSession, brokers: local_broker_cluster,
                                                            tmp_path: Path) -> None:
    d = brokers
    with d.client("b1") as c:
        start = c.info().confirmed_index + 1
        c.send_batch([b"s1-%d" % i for i in range(200)])
        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        df = (spark.readStream.format("dledger").option("controller", d.controller).option("brokers", "b1")
              .option("startingIndex", json.dumps({"b1": start})).option("maxEntriesPerTrigger", "100").load())
        q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
             .trigger(processingTime="500 milliseconds").start())
        try:
            wait_until(lambda: any(p["numInputRows"] > 0 for p in q.recentProgress), 120, "a first micro-batch")
            master = d.master_of("b1")
            assert master is not None
            d.kill_broker(master)
            c.send_batch([b"s2-%d" % i for i in range(200)])  # to the new master
            d.start_broker(master)

            def done() -> bool:
                return spark.read.parquet(str(out)).count() >= 400

            wait_until(done, 180, "every record in the sink")
        finally:
            q.stop()
    bodies = [r["body"].decode() for r in spark.read.parquet(str(out)).orderBy("index").collect()]
    assert bodies == [f"s1-{i}" for i in range(200)] + [f"s2-{i}" for i in range(200)]
