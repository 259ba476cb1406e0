"""Batch reads of a live group equal what the client reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from .helpers import Group, read_all, start_group

pytestmark = pytest.mark.spark


def _rows(df: DataFrame) -> list[tuple[str, int, int, int, bytes]]:
    return [(r["group"], r["index"], r["term"], r["pos"], bytes(r["body"])) for r in df.collect()]


def _expected(g: Group, start: int = 0, end: int | None = None) -> list[tuple[str, int, int, int, bytes]]:
    return [(g.name, e.index, e.term, e.pos, e.body) for e in read_all(g.client, start)
            if end is None or e.index < end]


@pytest.fixture(scope="module")
def filled(group: Group) -> Group:
    for k in range(6):
        group.client.append_batch([f"read-{k}-{i}".encode() * (1 + i % 5) for i in range(150)])
    group.client.append_batch([bytes(range(256)), b""])  # binary and empty bodies survive
    return group


def test_batch_read_equals_client_read(spark: SparkSession, filled: Group) -> None:
    df = spark.read.format("dledger").option("peers", filled.peers).option("entriesPerPartition", "250").load()
    assert df.schema.simpleString() == "struct<group:string,index:bigint,term:bigint,pos:bigint,body:binary>"
    expected = _expected(filled)
    assert len(expected) >= 902
    assert df.rdd.getNumPartitions() >= 4  # split by index ranges
    assert sorted(_rows(df)) == expected


def test_starting_and_ending_index_are_start_inclusive_end_exclusive(spark: SparkSession, filled: Group) -> None:
    df = (spark.read.format("dledger").option("peers", filled.peers)
          .option("startingIndex", json.dumps({"default": 100})).option("endingIndex", json.dumps({"default": 300}))
          .load())
    rows = sorted(_rows(df))
    assert rows == _expected(filled, 100, 300)
    assert rows[0][1] >= 100 and rows[-1][1] == 299


def test_ending_index_beyond_committed_stops_at_committed(spark: SparkSession, filled: Group) -> None:
    df = (spark.read.format("dledger").option("peers", filled.peers)
          .option("startingIndex", json.dumps({"default": 500})).option("endingIndex", json.dumps({"default": 10**9}))
          .load())
    assert sorted(_rows(df)) == _expected(filled, 500)


def test_bad_options_fail_with_the_option_name(spark: SparkSession, filled: Group) -> None:
    reader = spark.read.format("dledger").option("peers", filled.peers)
    with pytest.raises(Exception, match="startingIndex"):
        reader.option("startingIndex", "latest").load().collect()
    with pytest.raises(Exception, match="unknown group"):
        reader.option("startingIndex", '{"nosuch": 1}').load().collect()


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    cluster, g = start_group(tmp_path_factory.mktemp("second"), name="orders")
    try:
        g.client.append_batch([f"order-{i}".encode() for i in range(120)])
        yield g
    finally:
        g.client.close()
        cluster.__exit__()


def test_several_groups(spark: SparkSession, filled: Group, second: Group, tmp_path: Path) -> None:
    groups = {filled.name: filled.peers, second.name: second.peers}
    df = (spark.read.format("dledger").option("groups", json.dumps(groups))
          .option("startingIndex", json.dumps({filled.name: 600})).load())
    rows = _rows(df)
    assert sorted(r for r in rows if r[0] == second.name) == _expected(second)
    assert sorted(r for r in rows if r[0] == filled.name) == _expected(filled, 600)


def test_unknown_options_fail_at_load(spark: SparkSession, group: Group) -> None:
    """Spark ignores option names a source does not read; ours refuses them at load(), for
    streams too (not after start())."""
    with pytest.raises(Exception, match="did you mean startingIndex"):
        spark.read.format("dledger").option("peers", group.peers).option("startingOffsets", "earliest").load()
    with pytest.raises(Exception, match="did you mean startingIndex"):
        spark.readStream.format("dledger").option("peers", group.peers).option("startingOffsets", "x").load()
    with pytest.raises(Exception, match="maxEntriesPerTrigger"):
        spark.readStream.format("dledger").option("peers", group.peers).option("maxEntriesPerTrigger", "-1").load()
