"""The Spark connectors' defaults, measured (issue 15): rows/s over a sweep of each knob.

`python benchmarks/spark_sweep.py [--rows 200000] [--repeat 2] [--json]`
`python benchmarks/spark_sweep.py --parquet [--rows 1000000] [--body-bytes 220]`

`--parquet`: the default options only, side by side with Parquet on the same disk in one
run: a batch write of the same cached rows to dledger and to Parquet (alternating, the best
of `--repeat`), then full reads into Spark's `noop` sink: the online read (all columns),
`dledger-files` on the leader's store, and the body-only Parquet files. Prints rows/s, the
ratios and the load average.

`--read-path`: no Spark; one task's read of the whole log in this process, the per-entry
path (READ answered with entries, an Arrow batch built from Python lists, what the source
did before columnar reads) against the columnar one (`spark.online.read_range`),
alternating, the best of `--repeat` each: the members' and the task's cost per row.

`--write-path`: no Spark; one task's write in this process (`append_batches` as
`DLedgerWriter.write` calls it, Arrow batches of 10,000 rows of one `body` column, default
options), `--repeat` times: rows/s and CPU microseconds per row of this process, the
leader and the followers.

Without `--parquet`, a sweep of each knob:

One 3-member group (file store, flush=async) and one local[2] SparkSession on this machine,
each configuration run `--repeat` times (the best counts), side by side in one run:

- batch write: `batchSize` 500 … 10,000 (idempotent, the default), and 5,000 with
  `idempotent=false` (what the producer sessions cost);
- batch read: `entriesPerPartition` 10,000 … 250,000, and the best one with a declared
  schema without `body` (pruning);
- streaming read (AvailableNow into the `noop` sink): the same `entriesPerPartition` values;
- `dledger-files` on the leader's store: `bytesPerPartition` 4 MiB … one task per file.
Bodies are 100 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dledger.config import Peer, format_peers
from dledger.local_cluster import local_cluster
from dledger.ports import free_ports
from dledger.runtime.client import DLedgerClient

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import tree_cpu_s, wait_converged  # noqa: E402  (run as a script: the repository root first)

MiB = 1 << 20


@contextmanager
def _group() -> Iterator[tuple[str, dict[str, subprocess.Popen[bytes]], Path]]:
    """A 3-member group "sweep" (file store, flush=async) in a directory of its own: (peers,
    member processes, the directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", p) for k, p in enumerate(free_ports(3))})
        with local_cluster(peers, "sweep", Path(tmp), "async", "file") as procs:
            yield peers, procs, Path(tmp)


def best_rate(rows: int, repeat: int, run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return rows / best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--parquet", action="store_true", help="the defaults against Parquet (see above)")
    ap.add_argument("--body-bytes", type=int, default=220, help="with --parquet or --read-path")
    ap.add_argument("--read-path", action="store_true", help="entries against columns, no Spark (see above)")
    ap.add_argument("--write-path", action="store_true", help="one task's write, no Spark (see above)")
    args = ap.parse_args()
    if args.read_path:
        return read_path(args.rows, args.repeat, args.body_bytes, args.json)
    if args.write_path:
        return write_path(args.rows, args.repeat, args.body_bytes, args.json)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from dledger.spark import register

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if args.parquet:
        return against_parquet(spark, args.rows, args.repeat, args.body_bytes, args.json)
    out: dict[str, dict[str, float]] = {"write": {}, "read": {}, "stream": {}, "files": {}}
    with _group() as (peers, _, tmp):
        client = DLedgerClient(peers, "sweep")
        n = args.rows
        df = spark.range(n).selectExpr("rpad(cast(id as string), 100, 'x') as body").repartition(2).cache()
        df.count()

        def write(opts: dict[str, str]) -> Callable[[], None]:
            w = df.write.format("dledger").mode("append").option("peers", peers).option("group", "sweep")
            for k, v in opts.items():
                w = w.option(k, v)
            return w.save

        for bs in (500, 1000, 2000, 5000, 10000):
            out["write"][f"batchSize={bs}"] = best_rate(n, args.repeat, write({"batchSize": str(bs)}))
        out["write"]["batchSize=5000 idempotent=false"] = best_rate(
            n, args.repeat, write({"batchSize": "5000", "idempotent": "false"}))
        total = client.metadata().committed_index + 1  # every entry the reads below see (NOOPs, markers too)

        def read(epp: int, schema: str | None = None, stream: bool = False) -> Callable[[], None]:
            def run() -> None:
                r = spark.readStream if stream else spark.read
                r = r.format("dledger").option("peers", peers).option("group", "sweep") \
                    .option("entriesPerPartition", str(epp))
                if schema:
                    r = r.schema(schema)
                if stream:
                    q = r.option("startingIndex", "earliest").load().writeStream.format("noop") \
                        .option("checkpointLocation", tempfile.mkdtemp(dir=tmp)).trigger(availableNow=True).start()
                    q.awaitTermination()
                else:
                    r.load().count()
            return run

        for epp in (10_000, 50_000, 100_000, 250_000):
            out["read"][f"entriesPerPartition={epp}"] = best_rate(total, args.repeat, read(epp))
            out["stream"][f"entriesPerPartition={epp}"] = best_rate(total, args.repeat, read(epp, stream=True))
        top = max(out["read"], key=out["read"].__getitem__).split("=")[1]
        out["read"][f"entriesPerPartition={top} schema without body"] = best_rate(
            total, args.repeat, read(int(top), "index long, term long"))
        client.close()
        store = Path(tmp) / "sweep" / "n0"
        for bpp in (4 * MiB, 16 * MiB, 64 * MiB, 1 << 30):
            name = f"bytesPerPartition={bpp // MiB}MiB"
            out["files"][name] = best_rate(total, args.repeat, lambda bpp=bpp: spark.read.format("dledger-files")
                                           .option("bytesPerPartition", str(bpp)).load(str(store)).count())
    spark.stop()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for part, rates in out.items():
            base = next(iter(rates.values()))
            for k, v in rates.items():
                print(f"{part:7s} {k:48s} {v:10,.0f} rows/s  ({v / base:.2f}x)")
    return 0


def read_path(n: int, repeat: int, body_bytes: int, as_json: bool) -> int:
    """Per-entry reads against columnar ones, in this process (see the module docstring)."""
    from dledger.spark.online import RangeReadSpec, read_range, wait_leader_view
    from dledger.spark.options import ClientOptions
    from dledger.spark.schema import entry_batch

    load0 = os.getloadavg()
    best = {"entries": 0.0, "columns": 0.0}
    with _group() as (peers, _, _):
        client = DLedgerClient(peers, "sweep")
        bodies = [str(i).encode().ljust(body_bytes, b"x") for i in range(n)]
        for k in range(0, n, 5000):
            client.append_batch(bodies[k : k + 5000])
        end = client.metadata().committed_index + 1
        leader = wait_leader_view(client, "sweep", 30).self_id

        def entries() -> int:
            index = rows = 0
            while index < end:
                es = client.read(index, 2000, member=leader)
                if not es:
                    break
                rows += entry_batch("sweep", [x.index for x in es], [x.term for x in es], [x.pos for x in es],
                                    [x.body for x in es]).num_rows
                index = es[-1].index + 1
            return rows

        spec = RangeReadSpec("sweep", peers, 0, end, True, 60.0, ClientOptions.from_options({}))

        def columns() -> int:
            return sum(b.num_rows for b in read_range(spec))

        for _ in range(repeat):
            for name, run in (("entries", entries), ("columns", columns)):
                t0 = time.perf_counter()
                got = run()
                rate = got / (time.perf_counter() - t0)
                if got != n:
                    raise AssertionError(f"{name}: {got} rows, expected {n}")
                best[name] = max(best[name], rate)
        client.close()
    load1 = os.getloadavg()
    report = {"rows": n, "body_bytes": body_bytes, "repeat": repeat, "rows_per_s": best,
              "columns/entries": best["columns"] / best["entries"], "loadavg_before": load0, "loadavg_after": load1}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for k, v in best.items():
            print(f"read path {k:8s} {v:12,.0f} rows/s")
        print(f"columns/entries {report['columns/entries']:.2f}x; load average before {load0[0]:.2f}, "
              f"after {load1[0]:.2f}")
    return 0


def write_path(n: int, repeat: int, body_bytes: int, as_json: bool) -> int:
    """One task's write in this process, CPU per row by process (see the module docstring)."""
    import uuid

    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from benchmarks.common import proc_cpu_s
    from dledger.spark.sink import WriteConfig, append_batches

    def cpu(pid: int) -> float:
        return proc_cpu_s(pid) or 0.0

    bodies = [str(i).encode().ljust(body_bytes, b"x") for i in range(n)]
    batches = [pa.RecordBatch.from_arrays([pa.array(bodies[k : k + 10_000], pa.binary())], ["body"])
               for k in range(0, n, 10_000)]
    del bodies
    runs: list[dict[str, float]] = []
    load0 = os.getloadavg()
    with _group() as (peers, procs, _):
        with DLedgerClient(peers, "sweep") as client:
            leader = client.metadata().leader_id
        lead = procs[str(leader)].pid
        followers = [p.pid for m, p in procs.items() if m != leader]
        cfg = WriteConfig.from_options({"peers": peers, "group": "sweep"},
                                       StructType([StructField("body", BinaryType())]))
        append_batches(cfg, iter(batches[:1]), (uuid.uuid4().hex, 0))  # connections, a session
        for _ in range(repeat):
            t0, c0, l0, f0 = time.perf_counter(), time.process_time(), cpu(lead), sum(map(cpu, followers))
            msg = append_batches(cfg, iter(batches), (uuid.uuid4().hex, 0))
            took = time.perf_counter() - t0
            if msg.rows != n:
                raise AssertionError(f"{msg.rows} rows appended, expected {n}")
            runs.append({"rows_per_s": n / took, "task_us": (time.process_time() - c0) / n * 1e6,
                         "leader_us": (cpu(lead) - l0) / n * 1e6,
                         "followers_us": (sum(map(cpu, followers)) - f0) / n * 1e6})
    report = {"rows": n, "body_bytes": body_bytes, "runs": runs, "loadavg_before": load0,
              "loadavg_after": os.getloadavg()}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for r in runs:
            print(f"write path {r['rows_per_s']:10,.0f} rows/s; CPU us/row: task {r['task_us']:.2f}, leader "
                  f"{r['leader_us']:.2f}, followers {r['followers_us']:.2f}")
    return 0


def _part(cmd: str) -> str:
    """Which part of a Spark job a process of this run is (tree_cpu_s)."""
    if "-m dledger" in cmd:
        return "members"
    if cmd.split(" ", 1)[0].endswith("java"):
        return "Spark JVM"
    if "pyspark" in cmd:
        return "Spark Python workers"
    return "driver"


class CpuParts:
    """CPU microseconds per row of each part of the job (members, the JVM, its Python workers,
    this driver), summed over the timed phases of one name: what a rate is made of."""

    def __init__(self) -> None:
        self.spent: dict[str, dict[str, float]] = {}

    def timed(self, name: str, run: Callable[[], Any]) -> float:
        before = tree_cpu_s(os.getpid(), _part)
        t0 = time.perf_counter()
        run()
        took = time.perf_counter() - t0
        after = tree_cpu_s(os.getpid(), _part)
        parts = self.spent.setdefault(name, {})
        for k, v in after.items():
            parts[k] = parts.get(k, 0.0) + v - before.get(k, 0.0)
        return took

    def per_row(self, rows: dict[str, int]) -> dict[str, dict[str, float]]:
        return {name: {k: round(v / rows[name] * 1e6, 2) for k, v in sorted(parts.items())}
                for name, parts in self.spent.items()}


def against_parquet(spark: Any, n: int, repeat: int, body_bytes: int, as_json: bool) -> int:
    """dledger's defaults against Parquet, back to back (see the module's docstring)."""
    load0 = os.getloadavg()
    out: dict[str, float] = {}
    cpu = CpuParts()
    with _group() as (peers, _, tmp):
        df = spark.range(n).selectExpr(f"rpad(cast(id as string), {body_bytes}, 'x') as body") \
            .repartition(2).cache()
        df.count()
        pq = str(Path(tmp) / "pq")
        # Spark starts its Python daemon and a worker of each kind at their first use (seconds of
        # CPU): a read and a write of nothing first, so no timed phase pays for that
        reader = spark.read.format("dledger").option("peers", peers).option("group", "sweep")
        reader.load().write.format("noop").mode("overwrite").save()
        df.limit(0).write.format("dledger").mode("append").option("peers", peers).option("group", "sweep").save()

        def to_dledger() -> None:
            df.write.format("dledger").mode("append").option("peers", peers).option("group", "sweep").save()

        def to_parquet() -> None:
            df.write.mode("overwrite").parquet(pq)

        w_d = w_p = float("inf")
        for _ in range(repeat):  # alternating: both see the same machine load
            w_d = min(w_d, cpu.timed("write dledger", to_dledger))
            w_p = min(w_p, cpu.timed("write parquet", to_parquet))
        out["write dledger"], out["write parquet"] = n / w_d, n / w_p
        df.unpersist()
        client = DLedgerClient(peers, "sweep")
        total = client.metadata().committed_index + 1
        wait_converged(peers, "sweep", 300.0, lambda m: print(m, file=sys.stderr))
        client.close()
        rows = n * repeat  # what the reads return (NOOPs and session markers are not rows)
        store = str(Path(tmp) / "sweep" / "n0")
        # the best of `repeat` rounds, each reading all three back to back
        best = {"read dledger": float("inf"), "read dledger-files": float("inf"), "read parquet": float("inf")}
        for _ in range(repeat):
            for name, load in (
                ("read dledger", lambda: spark.read.format("dledger").option("peers", peers)
                 .option("group", "sweep").load()),
                ("read dledger-files", lambda: spark.read.format("dledger-files").load(store)),
                ("read parquet", lambda: spark.read.parquet(pq)),
            ):
                def to_noop(load: Callable[[], Any] = load) -> None:
                    load().write.format("noop").mode("overwrite").save()

                best[name] = min(best[name], cpu.timed(name, to_noop))
        out["read dledger"] = rows / best["read dledger"]
        out["read dledger-files"] = rows / best["read dledger-files"]
        out["read parquet"] = n / best["read parquet"]
        seconds = pushdown_cost(spark, peers, rows, repeat)
    spark.stop()
    load1 = os.getloadavg()
    per_row = cpu.per_row({"write dledger": n * repeat, "write parquet": n * repeat,
                           "read dledger": rows * repeat, "read dledger-files": rows * repeat,
                           "read parquet": n * repeat})
    return _report(out, seconds, n, body_bytes, repeat, total, load0, load1, as_json, per_row)


def pushdown_cost(spark: Any, peers: str, rows: int, repeat: int) -> dict[str, float]:
    """Seconds of a 1,000-row `index` range in the middle of the log, counted, with pushdown
    as register() left it on this Spark and with it turned on (a load() per query)."""
    from pyspark.sql.functions import col

    from dledger.spark import PUSHDOWN_CONF, register

    lo = rows // 2

    def query() -> None:
        df = spark.read.format("dledger").option("peers", peers).option("group", "sweep").load()
        assert df.filter((col("index") >= lo) & (col("index") < lo + 1000)).count() <= 1000

    out: dict[str, float] = {}
    before = spark.conf.get(PUSHDOWN_CONF, None)
    for name, value in (("default", before), ("on", "true")):
        if value is None:
            spark.conf.unset(PUSHDOWN_CONF)
        else:
            spark.conf.set(PUSHDOWN_CONF, value)
        register(spark)
        out[f"1000-row index range, pushdown {name} ({spark.conf.get(PUSHDOWN_CONF, None) or 'unset'})"] = min(
            _timed(query) for _ in range(repeat))
    return out


def _timed(run: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _report(out: dict[str, float], seconds: dict[str, float], n: int, body_bytes: int, repeat: int, total: int,
            load0: tuple[float, float, float], load1: tuple[float, float, float], as_json: bool,
            cpu_per_row: dict[str, dict[str, float]]) -> int:
    ratios = {"write parquet/dledger": out["write parquet"] / out["write dledger"],
              "read parquet/dledger": out["read parquet"] / out["read dledger"],
              "read dledger-files/dledger": out["read dledger-files"] / out["read dledger"]}
    report = {"rows": n, "body_bytes": body_bytes, "repeat": repeat, "log_entries": total,
              "rows_per_s": out, "ratios": ratios, "seconds": seconds, "cpu_us_per_row": cpu_per_row,
              "loadavg_before": load0, "loadavg_after": load1}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:24s} {v:12,.0f} rows/s")
        for k, v in ratios.items():
            print(f"{k:28s} {v:6.2f}x")
        for k, v in seconds.items():
            print(f"{k:60s} {v:7.2f} s")
        for k, parts in cpu_per_row.items():
            print(f"{k:24s} CPU us/row: " + ", ".join(f"{p} {v:.2f}" for p, v in parts.items())
                  + f"; total {sum(parts.values()):.2f}")
        print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
              f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
