"""A streaming pipeline on dledger, stopped midway and restarted from its checkpoint.

1. Events (JSON with an id and a type) are appended to a group: the first part
   through Spark's writer (`df.write.format("dledger")`), the rest through the
   client while the query is down.
2. A streaming query reads the group (`readStream.format("dledger")`, a few
   hundred entries per micro-batch), parses the events and writes them to
   Parquet with a checkpoint.
3. The query is stopped after a few micro-batches, more events are appended,
   and the query is restarted from its checkpoint with Trigger.AvailableNow.
4. The Parquet output must hold every event exactly once: same count, no
   duplicate id, no missing id. Counts per event type are printed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dledger.config import Peer, format_peers
from dledger.local_cluster import client_tls, local_cluster
from dledger.ports import free_ports
from dledger.runtime.client import DLedgerClient
from dledger.security.certs import make_certs
from dledger.spark.online import leader_view

log = logging.getLogger(__name__)

EVENT_TYPES = ("click", "view", "purchase", "signup")
FIRST_EVENTS = 3000
SECOND_EVENTS = 2000
PER_TRIGGER = 400
EVENT_SCHEMA = "id long, type string, user int"


@contextmanager
def _group(base_dir: Path, peers: str | None, group: str) -> Iterator[tuple[str, Path | None]]:
    """The given group, or a local 3-member one in base_dir for the duration, run with mutual
    TLS (certificates made in base_dir/certs); yields its peers and certificate directory."""
    if peers is not None:
        yield peers, None
        return
    ports = free_ports(3)
    members = {f"n{k}": Peer(f"n{k}", "127.0.0.1", p) for k, p in enumerate(ports)}
    tls_dir = base_dir / "certs"
    make_certs(tls_dir, list(members), force=True)
    local = format_peers(members)
    with local_cluster(local, group, base_dir / "cluster", tls_dir=tls_dir):
        yield local, tls_dir


def _tls_options(tls_dir: Path | None) -> dict[str, str]:
    """The Spark options of a group run with TLS: the client certificate `dledger certs` made."""
    if tls_dir is None:
        return {}
    return {"tlsCa": str(tls_dir / "ca.pem"), "tlsCert": str(tls_dir / "client.pem"),
            "tlsKey": str(tls_dir / "client-key.pem")}


def _event(k: int) -> str:
    return json.dumps({"id": k, "type": EVENT_TYPES[(k * 7) % len(EVENT_TYPES)], "user": k % 97})


def run_pipeline_demo(base_dir: str | Path | None = None, peers: str | None = None, group: str = "default",
                      master: str = "local[2]") -> bool:
    """Run the demo; True when the output holds every event exactly once."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything is on loopback anyway
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.query import StreamingQuery

    from dledger.spark import register

    with tempfile.TemporaryDirectory(prefix="dledger-pipeline-") as tmp:
        base = Path(base_dir) if base_dir is not None else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        out_dir, ckpt_dir = base / "events.parquet", base / "checkpoint"
        shutil.rmtree(out_dir, ignore_errors=True)  # a rerun in the same place starts afresh
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print(f"pipeline demo in {base}")
        t0 = time.monotonic()
        with _group(base, peers, group) as (group_peers, tls_dir):
            print(f"group {group}: {group_peers}{' (mutual TLS)' if tls_dir else ''}")
            sec = _tls_options(tls_dir)
            spark = (SparkSession.builder.master(master).appName("dledger-pipeline-demo")
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", "2")
                     .getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            try:
                register(spark)
                with DLedgerClient(group_peers, group, tls=client_tls(tls_dir)) as client:
                    # the query starts after whatever the group already holds
                    start = leader_view(client).committed_index + 1
                    ids = list(range(FIRST_EVENTS + SECOND_EVENTS))

                    spark.createDataFrame([(_event(k),) for k in ids[:FIRST_EVENTS]], "body string") \
                        .write.format("dledger").mode("append").option("peers", group_peers) \
                        .option("group", group).option("batchSize", "500").options(**sec).save()
                    print(f"appended {FIRST_EVENTS} events through df.write.format('dledger')")

                    def start_query(available_now: bool) -> StreamingQuery:
                        events = (spark.readStream.format("dledger").option("peers", group_peers)
                                  .option("group", group).option("startingIndex", json.dumps({group: start}))
                                  .option("maxEntriesPerTrigger", str(PER_TRIGGER)).options(**sec).load()
                                  .select(F.col("index"), F.from_json(F.col("body").cast("string"),
                                                                      EVENT_SCHEMA).alias("e"))
                                  .select("index", "e.id", "e.type", "e.user"))
                        w = events.writeStream.format("parquet").option("path", str(out_dir)) \
                            .option("checkpointLocation", str(ckpt_dir))
                        w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="3 seconds")
                        return w.start()

                    q = start_query(available_now=False)
                    done = 0
                    deadline = time.monotonic() + 90
                    while q.isActive and time.monotonic() < deadline:
                        progress = q.recentProgress
                        done = sum(p["numInputRows"] for p in progress)
                        if len([p for p in progress if p["numInputRows"] > 0]) >= 2 \
                                and not q.status["isTriggerActive"]:
                            # between two micro-batches: stopping inside one is just as safe (the
                            # checkpoint replays it), but Spark logs the interrupted write loudly
                            break
                        time.sleep(0.05)
                    q.stop()
                    first_rows = spark.read.parquet(str(out_dir)).count() if out_dir.exists() else 0
                    print(f"query stopped midway after {done} input rows ({first_rows} rows in the output)")

                    for k in range(0, SECOND_EVENTS, 500):
                        client.append_batch([_event(i).encode() for i in ids[FIRST_EVENTS + k:
                                                                           FIRST_EVENTS + k + 500]])
                    print(f"appended {SECOND_EVENTS} more events through the client while the query was down")

                q = start_query(available_now=True)
                q.awaitTermination()
                if q.exception() is not None:
                    print(f"query failed: {q.exception()}")
                    return False
                out = spark.read.parquet(str(out_dir))
                total = out.count()
                distinct = out.select("id").distinct().count()
                got_ids = {r["id"] for r in out.select("id").collect()}
                missing = set(ids) - got_ids
                extra = got_ids - set(ids)
                print(f"output: {total} rows, {distinct} distinct ids, expected {len(ids)}")
                for r in out.groupBy("type").count().orderBy("type").collect():
                    print(f"  {r['type']:>9}: {r['count']}")
                ok = total == len(ids) and distinct == len(ids) and not missing and not extra
                if not ok:
                    print(f"MISMATCH: {len(missing)} missing, {len(extra)} unexpected, "
                          f"{total - distinct} duplicates")
                print(f"{'OK' if ok else 'FAILED'}: exactly once across a restart "
                      f"({time.monotonic() - t0:.0f} s)")
                return ok
            finally:
                spark.stop()
