"""Filters Spark pushes into the `dledger` readers (PySpark's `DataSourceReader.pushFilters`).

Why: an index bound narrows the planned index range, so `filter(col("index") >= N)` reads
only from N, like `startingIndex`; a `group` filter drops whole groups before any member is
asked; a term bound only saves rows handed to Spark. Spark ANDs the filters it pushes; `push`
keeps those it can apply exactly (range bounds, then `Pushed.mask`) and gives the rest back,
by reference, for Spark to evaluate after the scan.

`index` and `term` are never negative (docs/format.md) and never null, so a lower bound of 0 and
"no upper bound" mean "no filter".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)


@dataclass(frozen=True, slots=True)
class Pushed:
    """What the pushed filters allow: half-open index and term ranges and a set of groups."""

    index_lo: int = 0  # inclusive
    index_hi: int | None = None  # exclusive; None = no bound
    term_lo: int = 0  # inclusive
    term_hi: int | None = None  # exclusive
    groups: frozenset[str] | None = None  # None = every group

    @property
    def empty(self) -> bool:
        """No row can match: the reader plans no partition and asks no member."""
        return (_empty(self.index_lo, self.index_hi) or _empty(self.term_lo, self.term_hi)
                or self.groups == frozenset())

    def index_range(self, begin: int, end: int) -> tuple[int, int]:
        """[begin, end) clamped to the pushed index bounds (an empty range stays inside it)."""
        start = min(max(begin, self.index_lo), end)
        stop = end if self.index_hi is None else min(end, self.index_hi)
        return start, max(start, stop)

    def mask(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of `batch` the filters keep, judged on its `index`, `term` and `group`
        columns (those present; `push` handles filters on present columns only)."""
        if self.empty:
            return batch.slice(0, 0)
        names = set(batch.schema.names)
        conds: list[pa.ChunkedArray | pa.Array] = []
        for name, lo, hi in (("index", self.index_lo, self.index_hi), ("term", self.term_lo, self.term_hi)):
            if name not in names:
                continue
            col = batch.column(name)
            if lo > 0:
                conds.append(pc.greater_equal(col, pa.scalar(lo, pa.int64())))
            if hi is not None and hi <= INT64_MAX:
                conds.append(pc.less(col, pa.scalar(hi, pa.int64())))
        if self.groups is not None and "group" in names:
            conds.append(pc.is_in(batch.column("group"), value_set=pa.array(sorted(self.groups), pa.string())))
        if not conds:
            return batch
        return batch.filter(reduce(pc.and_, conds))  # a null never matches, as in Spark


def _empty(lo: int, hi: int | None) -> bool:
    return lo > INT64_MAX or (hi is not None and hi <= lo)


def _is_int(v: object) -> bool:
    # bool is an int to Python, not to Spark; a value beyond int64 is no Arrow int64 scalar,
    # so Spark keeps such filters
    return isinstance(v, int) and not isinstance(v, bool) and _INT64_MIN <= v <= INT64_MAX


_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _bounds(f: Filter) -> tuple[int, int | None] | None:
    """The half-open range an integer filter allows, or None when it is not exactly one."""
    if isinstance(f, In):
        values = tuple(f.value)
        if not all(_is_int(x) for x in values):
            return None
        if not values:
            return 0, 0
        lo, hi = min(values), max(values) + 1
        # exact only when the values fill [lo, hi); otherwise the range still narrows the
        # read (see push) but Spark must check membership
        return (lo, hi) if len(set(values)) == hi - lo else None
    if not isinstance(f, _COMPARISONS) or not _is_int(f.value):
        return None
    v: int = f.value
    if isinstance(f, EqualTo):
        return v, v + 1
    if isinstance(f, GreaterThan):
        return v + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return v, None
    if isinstance(f, LessThan):
        return 0, v
    return 0, v + 1  # LessThanOrEqual


def _in_span(f: Filter) -> tuple[int, int] | None:
    """[min, max] + 1 of an In of integers that `_bounds` cannot take exactly."""
    if isinstance(f, In) and f.value and all(_is_int(x) for x in f.value):
        return min(f.value), max(f.value) + 1
    return None


def _group_values(f: Filter) -> frozenset[str] | None:
    if isinstance(f, EqualTo) and isinstance(f.value, str):
        return frozenset([f.value])
    if isinstance(f, In) and all(isinstance(x, str) for x in f.value):
        return frozenset(f.value)
    return None


def _intersect(lo: int, hi: int | None, lo2: int, hi2: int | None) -> tuple[int, int | None]:
    lo = max(lo, lo2)
    if hi2 is not None:
        hi = hi2 if hi is None else min(hi, hi2)
    if hi is not None and hi > INT64_MAX:  # above every long: no bound
        hi = None
    return lo, hi


def push(filters: Sequence[Filter], columns: Collection[str]) -> tuple[Pushed, list[Filter]]:
    """(what the reader applies, the filters left to Spark, the same objects) for the ANDed
    `filters`, on a reader whose rows have `columns`.

    Taken: =, >, >=, <, <= and IN with integers on `index` and `term`; = and IN with strings
    on `group`. An IN of integers with gaps narrows the range but is left to Spark too.
    Everything else (other columns, NOT, null tests, LIKE, other value types) is left.
    """
    present = {c.lower() for c in columns}
    index: tuple[int, int | None] = (0, None)
    term: tuple[int, int | None] = (0, None)
    groups: frozenset[str] | None = None
    rest: list[Filter] = []
    for f in filters:
        path: tuple[str, ...] = getattr(f, "attribute", ())
        name = path[0].lower() if len(path) == 1 else ""
        if name not in present:
            rest.append(f)
        elif name in ("index", "term"):
            b = _bounds(f)
            if b is None:
                rest.append(f)
                b = _in_span(f)
            if b is not None:
                if name == "index":
                    index = _intersect(*index, *b)
                else:
                    term = _intersect(*term, *b)
        elif name == "group" and (g := _group_values(f)) is not None:
            groups = g if groups is None else groups & g
        else:
            rest.append(f)
    return Pushed(index[0], index[1], term[0], term[1], groups), rest
