"""Writes: batch and streaming appends read back; errors carry the response code."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.producer import IdempotentProducer
from dledger.spark.options import ClientOptions
from dledger.spark.sink import WriteConfig, _Appender

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


def test_an_unverifiable_duplicate_fails_the_task_at_once_saying_what_to_do() -> None:
    """DUPLICATE_UNVERIFIABLE (438): sending the rows again cannot mend it, so the task fails
    at once (not after writeTimeoutSeconds of retries), naming the remedies."""
    sent: list[list[bytes]] = []

    class Client:
        producer = IdempotentProducer("w/p0")

        def append_span(self, bodies: list[bytes]) -> object:
            sent.append(bodies)
            raise DLedgerError(ResponseCode.DUPLICATE_UNVERIFIABLE, "sequence 40 cannot be compared")

    appender = _Appender.__new__(_Appender)
    appender.cfg = WriteConfig("g", "n0-127.0.0.1:1", 10, ClientOptions(), write_timeout=1.0)
    appender.group, appender.rows, appender.pending = "g", 0, [b"r0", b"r1"]
    with pytest.raises(RuntimeError, match=r"DUPLICATE_UNVERIFIABLE \(438\).*older than the leader can still "
                                           r"compare.*raise max_producer_spans.*or use a new writeId"):
        appender._append(Client())  # type: ignore[arg-type]
    assert len(sent) == 1


def test_requests_are_cut_where_a_body_by_body_walk_cuts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """_Appender.add takes slices, yet each request ends at the `batch_size`-th body or at the
    body that reaches MAX_BATCH_BYTES, as a walk body by body does (the same requests on a retry)."""
    from dledger.spark import sink

    limit = 1000
    monkeypatch.setattr(sink, "MAX_BATCH_BYTES", limit)
    sizes = [1, 0, 7, 300, 450, 5, 999, 1000, 2500, 3, 3, 3, 0, 0, 240, 260, 250, 250] * 4
    batches = [[bytes([k % 251]) * n for k, n in enumerate(sizes[a:b], a)]
               for a, b in ((0, 5), (5, 6), (6, 30), (30, 31), (31, 72))]

    def walk(batch_size: int) -> list[list[bytes]]:
        out: list[list[bytes]] = []
        pending: list[bytes] = []
        for body in (b for batch in batches for b in batch):
            pending.append(body)
            if len(pending) >= batch_size or sum(map(len, pending)) >= limit:
                out.append(pending)
                pending = []
        return out + ([pending] if pending else [])

    for batch_size in (1, 2, 3, 7, 10, 10_000):
        sent: list[list[bytes]] = []
        appender = _Appender.__new__(_Appender)
        appender.cfg = WriteConfig("g", "n0-127.0.0.1:1", batch_size, ClientOptions())
        appender.pending, appender.pending_bytes = [], 0

        def flush(a: _Appender = appender, sent: list[list[bytes]] = sent) -> None:
            if a.pending:
                sent.append(a.pending)
            a.pending, a.pending_bytes = [], 0

        appender.flush = flush  # type: ignore[method-assign]
        for batch in batches:
            appender.add(batch)
        appender.flush()
        assert sent == walk(batch_size), batch_size
