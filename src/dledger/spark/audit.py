"""`dledger audit DIR...`: compare members' store directories offline, on Spark or in process.

Each directory is read with the offline reader in records mode (every record,
NOOPs included, with what validation found). Two members hold the same prefix
up to index i exactly when their records at i have the same (term, chain CRC)
(docs/format.md), so the first index where the copies differ, or where any copy fails
validation, is the first divergence; without one the members agree up to the
highest index that at least two of them hold. A lagging member is not a
divergence: it just holds fewer entries.

Stores with little data are compared in this process, with the same reader (its Arrow batches
aggregated by pyarrow): starting a JVM and Spark's Python workers costs about a minute, far
more than reading a few megabytes. Sizes are the records' bytes, not the data files' (a data
file is preallocated to its full size when created).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dledger.entry import HEADER_SIZE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member: str
    path: str
    first_index: int | None
    last_index: int | None
    records: int
    errors: int
    bytes: int = 0  # the records' bytes (headers and bodies)
    file_bytes: int = 0  # what the data files take (preallocated: a new file has its full size at once)


@dataclass(frozen=True, slots=True)
class Copy:
    """One member's record at the divergent index."""

    member: str
    term: int
    chain_crc: int
    error: str | None
    file: str
    file_offset: int


@dataclass
class AuditReport:
    members: list[MemberSummary]
    agree_up_to: int
    divergence_index: int | None = None
    copies: list[Copy] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.divergence_index is None

    def record(self) -> dict[str, object]:
        """The report as one JSON object (`dledger audit -o json`): `divergence` is null when
        the members agree."""
        divergence = None if self.divergence_index is None else {
            "index": self.divergence_index,
            "copies": [{"member": c.member, "term": c.term, "chain_crc": c.chain_crc, "error": c.error,
                        "file": c.file, "file_offset": c.file_offset} for c in self.copies],
        }
        return {
            "ok": self.ok,
            "agree_up_to": self.agree_up_to,
            "members": [{"member": m.member, "path": m.path, "first_index": m.first_index,
                         "last_index": m.last_index, "records": m.records, "errors": m.errors,
                         "bytes": m.bytes, "file_bytes": m.file_bytes}
                        for m in self.members],
            "divergence": divergence,
        }

    def rows(self) -> list[dict[str, object]]:
        """A row per member (`-o table`), with its record at the divergent index if any."""
        out: list[dict[str, object]] = []
        for m in self.members:
            row: dict[str, object] = {"member": m.member, "first_index": m.first_index, "last_index": m.last_index,
                                      "records": m.records, "bytes": human_bytes(m.bytes), "errors": m.errors,
                                      "path": m.path}
            if self.divergence_index is not None:
                copies = [c for c in self.copies if c.member == m.member]
                row["at divergence"] = [_describe(c) for c in copies] or "no record"
                row["where"] = [f"{c.file} offset {c.file_offset}" for c in copies]
            out.append(row)
        return out

    def verdict(self) -> str:
        if self.divergence_index is None:
            return f"agree up to index {self.agree_up_to}"
        return f"first divergence at index {self.divergence_index} (members agree up to index {self.agree_up_to})"

    def lines(self) -> list[str]:
        out = []
        for m in self.members:
            span = "no records" if m.first_index is None else f"indexes {m.first_index}..{m.last_index}"
            out.append(f"{m.member}: {span} ({m.records} records, {human_bytes(m.bytes)}) in {m.path}")
        out.append(self.verdict())
        for c in self.copies:
            out.append(f"  {c.member}: {_describe(c)} ({c.file} offset {c.file_offset})")
        return out


def human_bytes(n: int) -> str:
    """1536 -> "1.5 KiB": a size as people read it."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _describe(c: Copy) -> str:
    return f"INVALID: {c.error}" if c.error else f"term {c.term} chain_crc 0x{c.chain_crc:08x}"


def member_labels(dirs: Sequence[Path]) -> list[str]:
    """Directory names (n0, n1, ...) when they are distinct, else the paths themselves."""
    names = [d.resolve().name for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def _records(spark: SparkSession, dirs: Sequence[Path], include_uncommitted: bool) -> DataFrame:
    frames = []
    for label, d in zip(member_labels(dirs), dirs, strict=True):
        frames.append(
            spark.read.format("dledger-files")
            .option("mode", "records")
            .option("member", label)
            .option("includeUncommitted", str(include_uncommitted).lower())
            .load(str(d))
            .select("member", "index", "term", "chain_crc", "error", "file", "file_offset", "body_size")
        )
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    return df


LOCAL_LIMIT = 256 << 20  # records' bytes up to which the audit runs in this process (no --master)


def data_dir_of(d: Path) -> Path:
    """The data/ directory of a member's store or of a broker replica's (commitlog/data)."""
    return d / "commitlog" / "data" if (d / "commitlog" / "data").is_dir() else d / "data"


def file_bytes(d: Path) -> int:
    """What the store's data files take on disk as listed (each preallocated to its full size)."""
    return sum(f.stat().st_size for f in data_dir_of(d).glob("*") if f.is_file())


def record_bytes_estimate(d: Path) -> int:
    """The records' bytes from the log begin to the committed entry's end, from the checkpoint
    and one index unit, without reading the data; the data files' size where the index cannot
    tell (so such a store is never taken for a small one)."""
    from dledger.spark.files import IndexFiles, IndexUnavailable, layout

    try:
        lay = layout(d)
        if lay.committed_index < lay.begin_index:
            return 0
        with IndexFiles(lay.store_dir / "index") as units:
            u = units.unit(lay.committed_index)
        if u is None or u.index != lay.committed_index:
            return file_bytes(d)
        return max(0, u.pos + u.size - lay.begin_pos)
    except (IndexUnavailable, OSError, RuntimeError, ValueError):
        return file_bytes(d)


def run_audit(spark: SparkSession, dirs: Sequence[Path], include_uncommitted: bool = False,
              progress: Callable[[str], None] = lambda _: None) -> AuditReport:
    """Compare the members' records; the work (scans, CRCs, the join by index) runs on Spark;
    `progress` hears what it is doing (the CLI prints it: a big store takes a while)."""
    from pyspark.sql import functions as F

    from dledger.spark import register

    if not dirs:
        raise ValueError("audit needs at least one store directory")
    register(spark)
    df = _records(spark, dirs, include_uncommitted).cache()
    try:
        progress(f"reading and checking every record of {len(dirs)} member(s), about "
                 f"{human_bytes(sum(map(record_bytes_estimate, dirs)))} of records")
        labels = member_labels(dirs)
        per_member = {
            r["member"]: r
            for r in df.groupBy("member").agg(
                F.min("index").alias("first"),
                F.max("index").alias("last"),
                F.count("*").alias("n"),
                F.count("error").alias("errors"),
                F.sum(F.col("body_size").cast("long") + HEADER_SIZE).alias("bytes"),
            ).collect()
        }
        members = []
        for label, d in zip(labels, dirs, strict=True):
            r = per_member.get(label)
            members.append(MemberSummary(label, str(d), r["first"] if r else None, r["last"] if r else None,
                                         r["n"] if r else 0, r["errors"] if r else 0,
                                         (r["bytes"] or 0) if r else 0, file_bytes(d)))
        progress("comparing the members index by index (" + ", ".join(
            f"{m.member}: {m.records:,} records" for m in members) + ")")
        per_index = df.groupBy("index").agg(
            F.countDistinct("member").alias("holders"),
            F.countDistinct("term", "chain_crc").alias("variants"),
            F.count("error").alias("errors"),
        )
        bad = per_index.filter("errors > 0 OR variants > 1").agg(F.min("index")).first()
        first_bad = bad[0] if bad is not None else None
        shared = per_index.filter("holders >= 2" if len(dirs) > 1 else "holders >= 1")
        if first_bad is None:
            top = shared.agg(F.max("index")).first()
            agree = top[0] if top is not None and top[0] is not None else -1
            return AuditReport(members, agree)
        copies = [
            Copy(r["member"], r["term"], r["chain_crc"], r["error"], r["file"], r["file_offset"])
            for r in df.filter(F.col("index") == first_bad).orderBy("member", F.col("error").asc_nulls_first())
            .collect()
        ]
        return AuditReport(members, first_bad - 1, first_bad, copies)
    finally:
        df.unpersist()


def run_audit_local(dirs: Sequence[Path], include_uncommitted: bool = False,
                    progress: Callable[[str], None] = lambda _: None) -> AuditReport:
    """`run_audit` in this process: the same reader's tasks run one after another and pyarrow
    does the aggregation (for stores small enough that Spark's start-up would dominate)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dledger.spark.files import plan, read_file
    from dledger.spark.schema import ARROW_RECORD_SCHEMA

    if not dirs:
        raise ValueError("audit needs at least one store directory")
    labels = member_labels(dirs)
    progress(f"reading and checking every record of {len(dirs)} member(s) in this process, about "
             f"{human_bytes(sum(map(record_bytes_estimate, dirs)))} of records")
    batches: list[pa.RecordBatch] = []
    for label, d in zip(labels, dirs, strict=True):
        for task in plan(d, include_uncommitted, records=True, member=label):
            batches.extend(read_file(task))
    t = pa.Table.from_batches(batches, schema=ARROW_RECORD_SCHEMA)
    per_member = {r["member"]: r for r in t.group_by("member").aggregate([
        ("index", "min"), ("index", "max"), ("index", "count"), ("error", "count"), ("body_size", "sum"),
    ]).to_pylist()}
    members = []
    for label, d in zip(labels, dirs, strict=True):
        r = per_member.get(label)
        n = r["index_count"] if r else 0
        members.append(MemberSummary(label, str(d), r["index_min"] if r else None, r["index_max"] if r else None,
                                     n, r["error_count"] if r else 0,
                                     (r["body_size_sum"] or 0) + n * HEADER_SIZE if r else 0, file_bytes(d)))
    progress("comparing the members index by index (" + ", ".join(
        f"{m.member}: {m.records:,} records" for m in members) + ")")
    per_index = t.group_by("index").aggregate([("member", "count_distinct"), ("error", "count")])
    variants = t.group_by(["index", "term", "chain_crc"]).aggregate([]).group_by("index").aggregate(
        [("term", "count")])
    bad = [pc.min(per_index.filter(pc.greater(per_index["error_count"], 0))["index"]).as_py(),
           pc.min(variants.filter(pc.greater(variants["term_count"], 1))["index"]).as_py()]
    first_bad = min((b for b in bad if b is not None), default=None)
    if first_bad is None:
        shared = per_index.filter(pc.greater_equal(per_index["member_count_distinct"], 2 if len(dirs) > 1 else 1))
        top = pc.max(shared["index"]).as_py()
        return AuditReport(members, top if top is not None else -1)
    at = t.filter(pc.equal(t["index"], first_bad)).sort_by(
        [("member", "ascending"), ("error", "ascending")], null_placement="at_start")
    copies = [Copy(r["member"], r["term"], r["chain_crc"], r["error"], r["file"], r["file_offset"])
              for r in at.to_pylist()]
    return AuditReport(members, first_bad - 1, first_bad, copies)


def main_audit(dirs: Sequence[str], master: str | None, include_uncommitted: bool, output: str | None = None) -> int:
    """The `dledger audit` command: 0 when the members agree, 1 on a divergence or a failure.

    Without `master`, stores holding up to LOCAL_LIMIT bytes of records are compared in this
    process; with it (or more data) on Spark (`local[*]` when no master is named).
    The report goes to stdout as text lines, or with `output` as one JSON object ("json")
    or a table ("table"); progress and failures go to stderr, so stdout holds only the report."""
    paths = [Path(d) for d in dirs]
    for p in paths:
        if not (p / "data").is_dir() and not (p / "commitlog" / "data").is_dir():
            raise ValueError(f"{p} is not a dledger store directory (no data/ in it)")
    started = time.monotonic()

    def say(what: str) -> None:
        print(f"audit [{time.monotonic() - started:4.0f} s]: {what}", file=sys.stderr, flush=True)

    try:
        if master is None and sum(map(record_bytes_estimate, paths)) <= LOCAL_LIMIT:
            report = run_audit_local(paths, include_uncommitted, say)
            say("done")
        else:
            got = _audit_on_spark(paths, master or "local[*]", include_uncommitted, say)
            if got is None:
                return 1
            report = got
    except Exception as e:
        # a directory that cannot even be planned (say a data file whose first header is
        # garbage) fails inside Spark; show our message, not the JVM's wrapping of it
        print(f"audit failed: {_our_message(e)}", file=sys.stderr)
        return 1
    if output is None:  # the text the docs show and scripts may read
        for line in report.lines():
            print(line)
    else:
        from dledger.clitools import emit, emit_record

        if output == "json":
            emit_record(report.record(), "json")
        else:
            emit(report.rows(), "table", report.verdict())
    return 0 if report.ok else 1


def _audit_on_spark(paths: list[Path], master: str, include_uncommitted: bool,
                    say: Callable[[str], None]) -> AuditReport | None:
    """run_audit on the active Spark session or a new one on `master` (stopped after); None
    when Spark cannot start (said on stderr)."""
    from pyspark.sql import SparkSession

    from dledger.spark.java import java_problem

    # executors must run this interpreter, the one that has dledger installed
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    existing = SparkSession.getActiveSession()
    if existing is None and (problem := java_problem()) is not None:
        # before Spark's launcher says "JAVA_HOME is not set" and PySpark JAVA_GATEWAY_EXITED
        print(f"audit failed: {problem}", file=sys.stderr)
        return None
    say(f"starting Spark ({master})" if existing is None else "using the active Spark session")
    try:
        spark = existing or (
            SparkSession.builder.master(master).appName("dledger-audit").config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "8")
            .getOrCreate()
        )
    except Exception as e:  # no Java, a bad master URL, ...
        print(f"audit failed: cannot start Spark ({master}): {_our_message(e)}", file=sys.stderr)
        return None
    if existing is None:
        spark.sparkContext.setLogLevel("ERROR")
    try:
        report = run_audit(spark, paths, include_uncommitted, say)
        say("done")
        return report
    finally:
        if existing is None:
            spark.stop()


_OURS = re.compile(r"(?:CorruptStoreError|OptionError|DataLossError): (.+)")


def _our_message(e: BaseException) -> str:
    m = _OURS.search(str(e))
    if m:
        return m.group(1).strip()
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
