"""Writes: batch and streaming appends read back; errors carry the response code."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from .helpers import Group, read_all

pytestmark = pytest.mark.spark


def test_batch_write_then_read_back(spark: SparkSession, group: Group) -> None:
    start = group.committed_next()
    tag = uuid.uuid4().hex
    texts = [f"{tag}-{i}" for i in range(700)]
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "n int, body string").repartition(2)
    df.write.format("dledger").mode("append").option("peers", group.peers).option("batchSize", "64").save()
    blobs = [bytes([i % 256]) * (i % 7) + tag.encode() for i in range(50)]
    spark.createDataFrame([(b,) for b in blobs], "body binary").write.format("dledger").mode("append") \
        .option("peers", group.peers).save()

    written = [e.body for e in read_all(group.client, start)]
    assert sorted(written) == sorted([t.encode() for t in texts] + blobs)  # each row once
    back = spark.read.format("dledger").option("peers", group.peers) \
        .option("startingIndex", json.dumps({group.name: start})).load()
    assert sorted(bytes(r["body"]) for r in back.collect()) == sorted(written)


def test_streaming_write(spark: SparkSession, group: Group, tmp_path: Path) -> None:
    start = group.committed_next()
    src = tmp_path / "in"
    src.mkdir()
    tag = uuid.uuid4().hex
    for f in range(3):
        (src / f"part{f}.json").write_text("".join(json.dumps({"body": f"{tag}-{f}-{i}"}) + "\n" for i in range(40)))
    q = (spark.readStream.format("json").schema("body string").load(str(src))
         .writeStream.format("dledger").option("peers", group.peers)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the AvailableNow run did not end"
    assert q.exception() is None
    got = sorted(e.body.decode() for e in read_all(group.client, start))
    assert got == sorted(f"{tag}-{f}-{i}" for f in range(3) for i in range(40))


def test_write_needs_a_body_column(spark: SparkSession, group: Group) -> None:
    df = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(Exception, match="body"):
        df.write.format("dledger").mode("append").option("peers", group.peers).save()


def test_append_error_fails_with_the_response_code(spark: SparkSession, group: Group) -> None:
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match=r"UNKNOWN_GROUP \(400\)"):
        df.write.format("dledger").mode("append").option("peers", group.peers).option("group", "nosuch").save()
