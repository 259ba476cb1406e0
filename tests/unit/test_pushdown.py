"""dledger.spark.pushdown without Spark: what is taken, what is left, and that the reader's
bounds and mask keep exactly the rows the filters keep (hypothesis against plain Python)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from dledger.spark.pushdown import INT64_MAX, Pushed, push

ALL = ("group", "index", "term", "pos", "body")

Row = dict[str, Any]


def _batch(rows: list[Row]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([
        pa.field("group", pa.string()), pa.field("index", pa.int64()), pa.field("term", pa.int64()),
        pa.field("pos", pa.int64()), pa.field("body", pa.binary())]))


def _holds(f: Filter, row: Row) -> bool:
    """Spark's meaning of a pushed filter on a row without nulls."""
    if isinstance(f, Not):
        return not _holds(f.child, row)
    if isinstance(f, IsNull):
        return False
    if isinstance(f, IsNotNull):
        return True
    v, x = f.value, row[f.attribute[0]]  # type: ignore[attr-defined]
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return bool(x == v)
    if isinstance(f, GreaterThan):
        return bool(x > v)
    if isinstance(f, GreaterThanOrEqual):
        return bool(x >= v)
    if isinstance(f, LessThan):
        return bool(x < v)
    if isinstance(f, LessThanOrEqual):
        return bool(x <= v)
    if isinstance(f, In):
        return x in v
    if isinstance(f, StringStartsWith):
        return bool(x.startswith(v))
    raise AssertionError(f)


def _rest_ids(rest: list[Filter]) -> set[int]:
    return {id(f) for f in rest}


# --- examples -------------------------------------------------------------------------------


def test_index_comparisons_become_one_range() -> None:
    fs: list[Filter] = [GreaterThanOrEqual(("index",), 10), LessThan(("index",), 20), GreaterThan(("index",), 11),
                        LessThanOrEqual(("index",), 18)]
    pushed, rest = push(fs, ALL)
    assert rest == []
    assert (pushed.index_lo, pushed.index_hi) == (12, 19)
    assert pushed.index_range(0, 100) == (12, 19)
    assert pushed.index_range(15, 17) == (15, 17)
    assert pushed.index_range(50, 100) == (50, 50)  # empty, and inside [begin, end)
    assert pushed.index_range(0, 5) == (5, 5)
    assert not pushed.empty


def test_equal_and_contiguous_in_are_exact_gapped_in_narrows_but_stays_with_spark() -> None:
    eq = EqualTo(("index",), 7)
    pushed, rest = push([eq], ALL)
    assert (pushed.index_lo, pushed.index_hi, rest) == (7, 8, [])
    run = In(("term",), (3, 2, 4, 3))
    pushed, rest = push([run], ALL)
    assert (pushed.term_lo, pushed.term_hi, rest) == (2, 5, [])
    gaps = In(("index",), (100, 500))
    pushed, rest = push([gaps], ALL)
    assert rest[0] is gaps and len(rest) == 1
    assert pushed.index_range(0, 1000) == (100, 501)


def test_group_filters() -> None:
    pushed, rest = push([In(("group",), ("a", "b", "c")), EqualTo(("group",), "b")], ALL)
    assert pushed.groups == frozenset({"b"}) and rest == []
    pushed, _ = push([EqualTo(("group",), "a"), EqualTo(("group",), "b")], ALL)
    assert pushed.groups == frozenset() and pushed.empty


def test_what_is_left_to_spark_is_the_same_objects() -> None:
    left: list[Filter] = [
        Not(EqualTo(("index",), 3)),  # NOT
        IsNull(("index",)), IsNotNull(("term",)),  # null tests
        EqualTo(("pos",), 5),  # another column
        GreaterThan(("index",), 2.5),  # not an integer
        EqualTo(("index",), True),  # a bool is no long
        LessThan(("index",), 1 << 64),  # beyond int64
        EqualTo(("group",), 1),  # not a string
        StringStartsWith(("group",), "a"),
        EqualNullSafe(("index",), 4),
        EqualTo(("index", "x"), 4),  # a nested path
        In(("index",), (1, None)),
    ]
    taken = GreaterThanOrEqual(("index",), 4)
    pushed, rest = push([*left[:5], taken, *left[5:]], ALL)
    assert len(rest) == len(left) and all(a is b for a, b in zip(rest, left, strict=True))
    assert pushed == Pushed(index_lo=4)


def test_only_columns_the_rows_have() -> None:
    fs: list[Filter] = [EqualTo(("group",), "a"), GreaterThan(("term",), 1), GreaterThan(("INDEX",), 1)]
    pushed, rest = push(fs, ["Index", "body"])
    assert rest == fs[:2] and pushed == Pushed(index_lo=2)


def test_empty_and_extreme_bounds() -> None:
    assert push([LessThan(("index",), 0)], ALL)[0].empty
    assert push([LessThan(("term",), -5)], ALL)[0].empty
    assert push([In(("index",), ())], ALL)[0].empty
    assert push([GreaterThan(("index",), INT64_MAX)], ALL)[0].empty
    top = push([LessThanOrEqual(("index",), INT64_MAX)], ALL)[0]
    assert top == Pushed() and not top.empty
    p = push([EqualTo(("term",), INT64_MAX)], ALL)[0]
    rows = [{"group": "g", "index": 1, "term": INT64_MAX, "pos": 0, "body": b""},
            {"group": "g", "index": 2, "term": 5, "pos": 0, "body": b""}]
    assert p.mask(_batch(rows)).column("index").to_pylist() == [1]
    assert Pushed(index_hi=0).mask(_batch(rows)).num_rows == 0


def test_mask_uses_the_columns_present() -> None:
    p = Pushed(index_lo=2, term_hi=3, groups=frozenset({"a"}))
    batch = pa.RecordBatch.from_pydict({"index": [1, 2, 3], "body": [b"x", b"y", b"z"]})
    assert p.mask(batch).column("body").to_pylist() == [b"y", b"z"]
    assert Pushed().mask(batch) is batch


# --- properties -----------------------------------------------------------------------------

GROUPS = ("a", "b", "c")
NAMES = (*GROUPS, "z")  # "z": a group no row has
_small = st.one_of(st.integers(-2, 8), st.integers(-3, 30))  # mostly where the rows are
_number = st.one_of(_small, _small, st.sampled_from([2.5, True, -(1 << 70), 1 << 70]))


def _int_filter(column: str) -> st.SearchStrategy[Filter]:
    a = (column,)
    return st.one_of(
        st.builds(EqualTo, st.just(a), _number),
        st.builds(GreaterThan, st.just(a), _number),
        st.builds(GreaterThanOrEqual, st.just(a), _number),
        st.builds(LessThan, st.just(a), _number),
        st.builds(LessThanOrEqual, st.just(a), _number),
        st.builds(In, st.just(a), st.lists(_small, max_size=5).map(tuple)),
        st.builds(IsNotNull, st.just(a)),
    )


_group_filter: st.SearchStrategy[Filter] = st.one_of(
    st.builds(EqualTo, st.just(("group",)), st.sampled_from(NAMES)),
    st.builds(In, st.just(("group",)), st.lists(st.sampled_from(NAMES), max_size=3).map(tuple)),
    st.builds(StringStartsWith, st.just(("group",)), st.sampled_from(GROUPS)),
)
_leaf = st.one_of(_int_filter("index"), _int_filter("term"), _int_filter("pos"), _group_filter)
_filter = st.one_of(_leaf, _leaf, st.builds(Not, _leaf))

_row = st.fixed_dictionaries({
    "group": st.sampled_from(GROUPS),
    "index": st.integers(0, 20),  # never negative (docs/format.md)
    "term": st.integers(0, 6),
    "pos": st.integers(0, 40),
    "body": st.binary(max_size=3),
})


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(_row, max_size=30), filters=st.lists(_filter, max_size=5),
       columns=st.sets(st.sampled_from(ALL)).map(lambda s: {"index", *s}), begin=st.integers(0, 30),
       length=st.integers(0, 30))
def test_reader_plus_spark_keep_exactly_the_matching_rows(rows: list[Row], filters: list[Filter],
                                                          columns: set[str], begin: int, length: int) -> None:
    pushed, rest = push(filters, columns)
    ids = _rest_ids(rest)
    assert len(ids) == len(rest) <= len(filters) and ids <= {id(f) for f in filters}
    taken = [f for f in filters if id(f) not in ids]
    batch = _batch(rows)
    kept = pushed.mask(batch).to_pylist()
    want = [r for r in rows if all(_holds(f, r) for f in filters)]
    # nothing the filters keep is lost; Spark's pass over `rest` leaves exactly the matching rows
    assert [r for r in kept if all(_holds(f, r) for f in rest)] == want
    # what was taken is applied exactly (a gapped IN narrows further, and is in `rest`)
    assert all(all(_holds(f, r) for f in taken) for r in kept)
    if pushed.empty:
        assert want == [] and kept == []
    # the planned range loses no matching row of [begin, begin + length)
    lo, hi = pushed.index_range(begin, begin + length)
    assert begin <= lo <= hi <= begin + length
    assert all(lo <= r["index"] < hi for r in kept if begin <= r["index"] < begin + length)
    # only columns the rows have are judged
    if "group" not in columns:
        assert pushed.groups is None
    if "term" not in columns:
        assert (pushed.term_lo, pushed.term_hi) == (0, None)


def _exact_filter(column: str) -> st.SearchStrategy[Filter]:
    a = (column,)
    return st.one_of(
        *(st.builds(cls, st.just(a), _small) for cls in (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                                           LessThanOrEqual)),
        st.builds(In, st.just(a), st.tuples(_small, st.integers(0, 4)).map(lambda t: tuple(range(t[0], t[0] + t[1])))),
    )


_exact = st.one_of(_exact_filter("index"), _exact_filter("term"),
                   st.builds(EqualTo, st.just(("group",)), st.sampled_from(NAMES)),
                   st.builds(In, st.just(("group",)), st.lists(st.sampled_from(GROUPS), max_size=3).map(tuple)))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_row, max_size=30), filters=st.lists(_exact, max_size=5))
def test_taken_filters_alone_mask_exactly(rows: list[Row], filters: list[Filter]) -> None:
    """Filters the reader takes whole: Spark does not evaluate them again, so the mask alone
    must equal them."""
    pushed, rest = push(filters, ALL)
    assert rest == []
    assert pushed.mask(_batch(rows)).to_pylist() == [r for r in rows if all(_holds(f, r) for f in filters)]
