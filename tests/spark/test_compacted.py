"""Reading a log whose prefix a snapshot compacted away (issue 12): the source starts at the
log begin, and a start below it follows failOnDataLoss as Kafka's does (fail with a clear
error, or skip to the begin with a warning)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from dledger.kv import KVClient
from integration.harness import wait_until

from .helpers import Group, read_all, start_group

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    cluster, g = start_group(tmp_path_factory.mktemp("compacted"), "compacted", config={
        "data_file_size": 65536, "index_file_size": 32768, "retention_check_interval_ms": 200,
        "state_machine": '"kv"', "snapshot_threshold_entries": 100, "snapshot_margin_entries": 50,
    })
    try:
        kv = KVClient("", client=g.client)
        for k in range(600):
            kv.put(f"k{k:04d}", "v" * 200)
        wait_until(lambda: g.client.metadata().ledger_begin_index > 100, 60, "the leader compacts its log")
        seen: list[int] = []

        def settled() -> bool:  # compaction goes a retention pass (200 ms) at a time
            seen.append(g.client.metadata().ledger_begin_index)
            time.sleep(0.3)
            return len(seen) >= 4 and len(set(seen[-4:])) == 1

        wait_until(settled, 60, "compaction settles")
        yield g
    finally:
        g.client.close()
        cluster.__exit__()


def test_the_source_reads_from_the_log_begin_after_compaction(spark: SparkSession, compacted: Group) -> None:
    begin = compacted.client.metadata().ledger_begin_index
    df = spark.read.format("dledger").option("peers", compacted.peers).option("group", compacted.name).load()
    rows = sorted((r["index"], bytes(r["body"])) for r in df.collect())
    want = [(e.index, e.body) for e in read_all(compacted.client, begin)]
    assert rows[0][0] >= begin and rows == [r for r in want if r[0] <= rows[-1][0]]
    assert len(rows) >= 50  # what the margin and the tail past the last snapshot keep


def test_a_start_below_the_begin_fails_or_skips_as_failOnDataLoss_says(spark: SparkSession,
                                                                      compacted: Group) -> None:
    begin = compacted.client.metadata().ledger_begin_index
    reader = (spark.read.format("dledger").option("peers", compacted.peers).option("group", compacted.name)
              .option("startingIndex", json.dumps({compacted.name: 0})))
    with pytest.raises(Exception, match="below the log begin"):
        reader.load().collect()
    rows = reader.option("failOnDataLoss", "false").load().collect()
    assert min(r["index"] for r in rows) >= begin
