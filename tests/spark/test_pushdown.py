"""Filter pushdown and column pruning of `format("dledger")` batch reads.

Results are compared with the unfiltered client read filtered in Python; what the members
sent is read from their metrics (dledger_read_entries, dledger_read_body_bytes), so a
filter that is only shown in the plan but not applied at the source fails here.
"""

from __future__ import annotations

import io
import json
import random
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.functions import col

from dledger.local_cluster import local_cluster
from dledger.ports import port_free
from dledger.runtime.client import DLedgerClient, Entry
from dledger.spark import PUSHDOWN_CONF, register
from dledger.spark.online import leader_view
from dledger.spark.plan_probe import LAST_REUSING, scoped_reads, spark_release
from integration.harness import wait_until

from .helpers import Group, make_peers, read_all

pytestmark = pytest.mark.spark

Row = tuple[str, int, int, int, bytes]


@dataclass
class Metered(Group):
    metrics_ports: list[int] = field(default_factory=list)


def _metrics_base() -> int:
    """A port with the next two free too (member nK serves metrics on base + K)."""
    rng = random.SystemRandom()
    while True:
        base = rng.randint(30000, 50000)
        if all(port_free(base + k) for k in range(3)):
            return base


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Metered]:
    """A group of its own (no other test reads it) with metrics, entries in two terms."""
    data_dir = tmp_path_factory.mktemp("pushdown")
    peers, base = make_peers(), _metrics_base()
    cluster = local_cluster(peers, "metered", data_dir, metrics_base_port=base)
    cluster.__enter__()
    g = Metered("metered", peers, data_dir, DLedgerClient(peers, "metered"), [base + k for k in range(3)])
    try:
        for k in range(4):  # bodies of 7 to 110 bytes, none empty
            g.client.append_batch([f"pd-{k}-{i}-".encode() * (1 + i % 10) for i in range(150)])
        lead = wait_until(lambda: leader_view(g.client), 60, "a leader").self_id
        target = next(m for m in g.client.peers if m != lead)
        g.client.transfer_leadership(target)  # the next entries are of a later term
        wait_until(lambda: leader_view(g.client).self_id == target, 60, f"{target} leads")
        for k in range(2):
            g.client.append_batch([f"pd-next-{k}-{i}".encode() for i in range(100)])
        yield g
    finally:
        g.client.close()
        cluster.__exit__()


def _served(g: Metered) -> tuple[int, int]:
    """(entries, body bytes) the members have sent in read answers, summed."""
    entries = body = 0
    for port in g.metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "dledger_read_entries_total":
                    entries += int(s.value)
                elif s.name == "dledger_read_body_bytes_total":
                    body += int(s.value)
    return entries, body


def _load(spark: SparkSession, g: Group, schema: str | None = None, **options: str) -> DataFrame:
    reader = spark.read.format("dledger").option("peers", g.peers).option("group", g.name)
    if schema is not None:
        reader = reader.schema(schema)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _rows(df: DataFrame) -> list[Row]:
    return sorted((r["group"], r["index"], r["term"], r["pos"], bytes(r["body"])) for r in df.collect())


def _entries(g: Group) -> list[Entry]:
    return read_all(g.client)


def _plan(df: DataFrame) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        df.explain("formatted")
    return out.getvalue()


def _pushed_line(plan: str) -> str:
    return next((line for line in plan.splitlines() if line.startswith("PushedFilters")), "")


def _measured(g: Metered, df: DataFrame) -> tuple[list[Row], int, int]:
    """The rows of `df` (all five columns), and the entries and body bytes the members sent
    for them."""
    e0, b0 = _served(g)
    rows = _rows(df)
    e1, b1 = _served(g)
    return rows, e1 - e0, b1 - b0


# (the filter Spark gets, its meaning in Python, what the plan must list as pushed)
Case = tuple[Callable[[list[Entry]], Column], Callable[[Entry, list[Entry]], bool], Callable[[list[Entry]], list[str]]]


def _at(es: list[Entry], frac: float) -> int:
    return es[int(len(es) * frac)].index


CASES: dict[str, Case] = {
    ">=": (lambda es: col("index") >= _at(es, 0.8), lambda e, es: e.index >= _at(es, 0.8),
           lambda es: [f"GreaterThanOrEqual(index,{_at(es, 0.8)})"]),
    "<": (lambda es: col("index") < _at(es, 0.1), lambda e, es: e.index < _at(es, 0.1),
          lambda es: [f"LessThan(index,{_at(es, 0.1)})"]),
    "==": (lambda es: col("index") == _at(es, 0.5), lambda e, es: e.index == _at(es, 0.5),
           lambda es: [f"EqualTo(index,{_at(es, 0.5)})"]),
    "between": (lambda es: col("index").between(_at(es, 0.3), _at(es, 0.4)),
                lambda e, es: _at(es, 0.3) <= e.index <= _at(es, 0.4),
                lambda es: [f"GreaterThanOrEqual(index,{_at(es, 0.3)})", f"LessThanOrEqual(index,{_at(es, 0.4)})"]),
    "in": (lambda es: col("index").isin(_at(es, 0.6), _at(es, 0.6) + 1, _at(es, 0.6) + 2),
           lambda e, es: _at(es, 0.6) <= e.index <= _at(es, 0.6) + 2,
           lambda es: [f"In(index, [{_at(es, 0.6)},{_at(es, 0.6) + 1},{_at(es, 0.6) + 2}]"]),
    # an IN with gaps narrows the read to [min, max] and leaves the membership to Spark
    "in-gaps": (lambda es: col("index").isin(_at(es, 0.7), _at(es, 0.75)),
                lambda e, es: e.index in (_at(es, 0.7), _at(es, 0.75)), lambda es: []),
    "term": (lambda es: col("term") == es[-1].term, lambda e, es: e.term == es[-1].term,
             lambda es: [f"EqualTo(term,{es[-1].term})"]),
    "index and term": (lambda es: (col("index") > _at(es, 0.2)) & (col("term") < es[-1].term),
                       lambda e, es: e.index > _at(es, 0.2) and e.term < es[-1].term,
                       lambda es: [f"GreaterThan(index,{_at(es, 0.2)})", f"LessThan(term,{es[-1].term})"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_filters_equal_python_filtering_and_are_pushed(spark: SparkSession, metered: Metered, case: str) -> None:
    spark_filter, keep, shown = CASES[case]
    es = _entries(metered)
    assert len({e.term for e in es}) >= 2  # the term cases see several terms
    df = _load(spark, metered).filter(spark_filter(es))
    pushed = _pushed_line(_plan(df))
    for f in shown(es):
        assert f in pushed, (f, pushed)
    rows = _rows(df)
    want = [(metered.name, e.index, e.term, e.pos, e.body) for e in es if keep(e, es)]
    assert want and rows == want


@pytest.mark.parametrize("case", [">=", "<", "==", "between", "in", "in-gaps"])
def test_index_filters_read_only_the_range(spark: SparkSession, metered: Metered, case: str) -> None:
    """The members send the matching entries only (the unfiltered read sends them all)."""
    spark_filter, keep, _ = CASES[case]
    es = _entries(metered)
    rows, sent, _ = _measured(metered, _load(spark, metered).filter(spark_filter(es)))
    span = [e for e in es if keep(e, es)]
    assert len(rows) == len(span)
    if case == "in-gaps":  # [min, max] of the values is read
        span = [e for e in es if _at(es, 0.7) <= e.index <= _at(es, 0.75)]
    # each entry once, unless a task retried a read; far from the whole log anyway (an
    # unfiltered read sends it all: see test_session_with_pushdown_off_still_reads)
    assert len(span) <= sent < len(span) + 100 < len(es)


def test_no_row_can_match_reads_nothing(spark: SparkSession, metered: Metered) -> None:
    for cond in (col("index") < 0, col("group") == "nosuch", (col("index") > 100) & (col("index") < 50)):
        rows, sent, _ = _measured(metered, _load(spark, metered).filter(cond))
        assert rows == [] and sent == 0, cond


def test_schema_without_body_sends_no_bodies(spark: SparkSession, metered: Metered) -> None:
    es = _entries(metered)
    df = _load(spark, metered, "term long, index long")
    assert df.columns == ["term", "index"]
    e0, b0 = _served(metered)
    got = sorted((r["term"], r["index"]) for r in df.collect())
    e1, b1 = _served(metered)
    assert got == sorted((e.term, e.index) for e in es)
    assert e1 - e0 >= len(es) and b1 - b0 == 0
    # the same read with the body column: the bodies come
    df = _load(spark, metered, "body binary, index long").filter(col("index") >= _at(es, 0.5))
    assert df.columns == ["body", "index"]
    e0, b0 = _served(metered)
    got2 = sorted((r["index"], bytes(r["body"])) for r in df.collect())
    e1, b1 = _served(metered)
    tail = [e for e in es if e.index >= _at(es, 0.5)]
    assert got2 == [(e.index, e.body) for e in tail]
    assert b1 - b0 >= sum(len(e.body) for e in tail) > 0


def test_declared_schema_any_subset_any_order(spark: SparkSession, metered: Metered) -> None:
    es = _entries(metered)
    df = _load(spark, metered, "pos long, group string not null, term long").filter(col("term") == es[0].term)
    assert df.columns == ["pos", "group", "term"]
    got = sorted(tuple(r) for r in df.collect())
    assert got == sorted((e.pos, metered.name, e.term) for e in es if e.term == es[0].term)


@pytest.mark.parametrize(("schema", "problem"), [
    ("idx long, term long", "unknown column 'idx'"),
    ("index int", "column 'index' of type int, expected long"),
    ("body string", "column 'body' of type string, expected binary"),
])
def test_bad_declared_schema_fails_naming_the_valid_columns(spark: SparkSession, metered: Metered, schema: str,
                                                            problem: str) -> None:
    """Spark shows a declared schema to the source only when it plans the read (PySpark
    calls no Python at load() then), so the first action is where it fails."""
    with pytest.raises(Exception, match=problem) as err:
        _load(spark, metered, schema).collect()
    assert "Valid columns: group string, index long, term long, pos long, body binary" in str(err.value)


@pytest.fixture(scope="module")
def other(group: Group) -> Group:
    group.client.append_batch([f"other-{i}".encode() for i in range(30)])
    return group


def test_group_filter_drops_groups_before_reading(spark: SparkSession, metered: Metered, other: Group) -> None:
    groups = json.dumps({metered.name: metered.peers, other.name: other.peers})
    df = spark.read.format("dledger").option("groups", groups).load()
    only_other = df.filter(col("group") == other.name)
    assert f"EqualTo(group,{other.name})" in _pushed_line(_plan(only_other))
    rows, sent, _ = _measured(metered, only_other)
    assert rows == [(other.name, e.index, e.term, e.pos, e.body) for e in read_all(other.client)]
    assert sent == 0  # the metered group was not read at all
    both = df.filter(col("group").isin(metered.name, other.name) & (col("index") >= _at(_entries(metered), 0.9)))
    rows, sent, _ = _measured(metered, both)
    cut = _at(_entries(metered), 0.9)
    want = sorted([(metered.name, e.index, e.term, e.pos, e.body) for e in _entries(metered) if e.index >= cut]
                  + [(other.name, e.index, e.term, e.pos, e.body) for e in read_all(other.client) if e.index >= cut])
    assert rows == want
    assert len(_entries(metered)) > sent >= len([r for r in rows if r[0] == metered.name]) > 0


def test_queries_of_one_dataframe_with_different_filters_are_exact(spark: SparkSession, metered: Metered) -> None:
    """With pushdown on, each query that pushes filters gets a read planned for its own
    filters, whatever the queries of the same DataFrame pushed before."""
    es = _entries(metered)
    df = _load(spark, metered)
    total = len(es)
    cases: list[tuple[Column, Callable[[Entry], bool]]] = [
        (col("index") < _at(es, 0.2), lambda e: e.index < _at(es, 0.2)),
        (col("index") >= _at(es, 0.7), lambda e: e.index >= _at(es, 0.7)),
        (col("index").between(_at(es, 0.4), _at(es, 0.5)), lambda e: _at(es, 0.4) <= e.index <= _at(es, 0.5)),
        (col("term") == es[-1].term, lambda e: e.term == es[-1].term),
        (col("index") < _at(es, 0.2), lambda e: e.index < _at(es, 0.2)),
    ]
    for cond, keep in cases:
        rows, sent, _ = _measured(metered, df.filter(cond))
        assert rows == [(metered.name, e.index, e.term, e.pos, e.body) for e in es if keep(e)]
        if "term" not in str(cond):
            assert sent < total  # pushed: only the range was read


def test_the_probe_tells_what_this_spark_does(spark: SparkSession, metered: Metered) -> None:
    """spark.plan_probe's answer is what a dledger DataFrame does here: a filtered query, then
    an unfiltered one of the same DataFrame, with pushdown on. PySpark up to 4.3 reuses the
    filtered read (so register() leaves pushdown off by default there)."""
    scoped = scoped_reads(spark, probe=True)
    es = _entries(metered)
    cut = _at(es, 0.5)
    df = _load(spark, metered)
    assert df.filter(col("index") < cut).count() == len([e for e in es if e.index < cut])
    whole = df.count()
    assert (whole == len(es)) == scoped, (whole, len(es), scoped)
    if spark_release(spark.version) <= LAST_REUSING:
        assert not scoped


def test_pushdown_is_off_by_default_where_unsafe_and_reads_stay_right(spark: SparkSession, metered: Metered) -> None:
    """Unset, on a Spark that reuses a filtered read (4.3), the conf stays unset and the readers
    take no filters: a loaded DataFrame reused by a filtered and then an unfiltered query gives
    both answers right (see dledger.spark._pushdown)."""
    if scoped_reads(spark):
        pytest.skip("this Spark plans each query's read afresh: pushdown is on by default")
    spark.conf.unset(PUSHDOWN_CONF)
    try:
        register(spark)
        assert spark.conf.get(PUSHDOWN_CONF, None) in (None, "false")
        df = _load(spark, metered)
        cut = _at(_entries(metered), 0.5)
        assert df.filter(col("index") < cut).count() == len([e for e in _entries(metered) if e.index < cut])
        assert df.count() == len(_entries(metered))
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")
        register(spark)


def test_session_with_pushdown_off_still_reads(spark: SparkSession, metered: Metered) -> None:
    """PySpark refuses a reader with pushFilters where the conf is false; register() keeps
    the user's false and registers readers without it. (The session's own: Spark refuses to
    register a name again in a newSession() of a session that has it.)"""
    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        register(spark)
        assert spark.conf.get(PUSHDOWN_CONF) == "false"
        _read_without_pushdown(spark, metered)
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")
        register(spark)


def _read_without_pushdown(spark: SparkSession, metered: Metered) -> None:
    es = _entries(metered)
    cut = _at(es, 0.8)
    df = _load(spark, metered).filter(col("index") >= cut)
    assert f"GreaterThanOrEqual(index,{cut})" not in _pushed_line(_plan(df))
    rows, sent, _ = _measured(metered, df)
    assert rows == [(metered.name, e.index, e.term, e.pos, e.body) for e in es if e.index >= cut]
    assert sent >= len(es)  # Spark filtered after reading everything
    # the declared schema still prunes the bodies
    df = _load(spark, metered, "index long").filter(col("index") >= cut)
    e0, b0 = _served(metered)
    got = sorted(r["index"] for r in df.collect())
    e1, b1 = _served(metered)
    assert got == [r[1] for r in rows]
    assert e1 - e0 >= len(es) and b1 - b0 == 0


def test_stream_with_declared_schema(spark: SparkSession, metered: Metered, tmp_path: Path) -> None:
    es = _entries(metered)
    start = _at(es, 0.5)
    q = (spark.readStream.format("dledger").schema("index long, body binary").option("peers", metered.peers)
         .option("group", metered.name).option("startingIndex", json.dumps({metered.name: start})).load()
         .writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the AvailableNow run did not end"
    assert q.exception() is None
    out = spark.read.parquet(str(tmp_path / "out"))
    assert out.columns == ["index", "body"]
    assert sorted((r["index"], bytes(r["body"])) for r in out.collect()) == [(e.index, e.body) for e in es
                                                                            if e.index >= start]
