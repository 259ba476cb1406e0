"""Whether this Spark keeps a filtered read out of later queries of the same DataFrame.

PySpark 4.3 caches the read it planned for a loaded DataFrame (`PythonDataSourceV2.readInfo`,
one per `load()`): a query whose filters reach the source replaces it, a query with no filter
the source is asked about reuses it without calling any Python code. So after
`df.filter("index < 10").count()`, `df.count()` reads the filtered rows again. No source can
notice: the second query's tasks get the same pickled reader and partitions as the first's,
and nothing on the driver runs. Later Spark releases keep the read per scan instead.

`scoped_reads(spark)` answers no at once for the releases known to reuse the read (up to
4.3); for a later one it finds out by trying it on a tiny Python source of its own (two
one-partition jobs: about a second on an idle machine, as they start Python workers). The
answer is kept per Spark version for the life of the process. `register` turns pushdown on
by default only where it is yes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition, LessThan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
PROBE_FORMAT = "dledger_plan_probe"
_ROWS = 4  # the probe source's rows: x = 0 .. 3
_known: dict[str, bool] = {}
LAST_REUSING = (4, 3)  # the newest release known to reuse the read (PySpark 4.3.0, checked by the tests)


def spark_release(version: str) -> tuple[int, int]:
    """(major, minor) of a Spark version string; (0, 0) when it cannot tell."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


class _ProbeReader(DataSourceReader):
    """Rows x < bound: all of them unless a filter x < n was pushed."""

    def __init__(self) -> None:
        self.bound = _ROWS

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if isinstance(f, LessThan) and f.attribute == ("x",) and isinstance(f.value, int):
                self.bound = min(self.bound, f.value)
            else:
                yield f

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(self.bound)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        bound = partition.value if isinstance(partition.value, int) else _ROWS
        for x in range(max(0, min(bound, _ROWS))):
            yield (x,)


class _ProbeSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return PROBE_FORMAT

    def schema(self) -> str:
        return "x int"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ProbeReader()


def scoped_reads(spark: SparkSession, probe: bool = False) -> bool:
    """True when a query pushing no filter does not reuse the read planned for an earlier,
    filtered query of the same DataFrame (see the module docstring). `probe`: try it even
    on a release known to reuse it (what the tests do, to keep LAST_REUSING honest)."""
    version = spark.version
    if version in _known and not probe:
        return _known[version]
    if not probe and spark_release(version) <= LAST_REUSING:
        _known[version] = False
        return False
    before = spark.conf.get(PUSHDOWN_CONF, None)
    try:
        spark.conf.set(PUSHDOWN_CONF, "true")
        spark.dataSource.register(_ProbeSource)
        df = spark.read.format(PROBE_FORMAT).load()
        filtered = df.filter("x < 1").count()
        whole = df.count()
    except Exception as e:  # a Spark without Python sources' pushdown, or a refusal: not safe
        log.info("the filter pushdown probe failed (%s): pushdown stays off by default", e)
        return False
    finally:
        if before is None:
            spark.conf.unset(PUSHDOWN_CONF)
        else:
            spark.conf.set(PUSHDOWN_CONF, before)
    ok = filtered == 1 and whole == _ROWS
    log.info("Spark %s %s the read planned for a filtered query of a DataFrame (%d then %d rows of %d)", version,
             "scopes" if ok else "reuses", filtered, whole, _ROWS)
    _known[version] = ok
    return ok
