"""Spark connectors for dledger (docs/spark.md): PySpark >= 4.2 Python Data Source API.

    from dledger.spark import register
    register(spark)
    spark.read.format("dledger").option("peers", P).load()
    spark.read.format("dledger-files").load("data/default/n0")

Needs the `spark` extra (`pip install 'dledger[spark]'`) on the driver and on
every executor: Spark runs the readers and writers in executor Python workers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource

log = logging.getLogger(__name__)

__all__ = ["PUSHDOWN_CONF", "register"]

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"  # as spark.plan_probe names it


def register(spark: SparkSession) -> None:
    """Register `format("dledger")` and `format("dledger-files")` on this session, their
    readers taking filters (pushdown) where that is safe: see `_pushdown`."""
    from dledger.spark.files import DLedgerFilesDataSource
    from dledger.spark.source import DLedgerDataSource

    pushdown = _pushdown(spark)
    for cls in (DLedgerDataSource, DLedgerFilesDataSource):
        spark.dataSource.register(cls if pushdown else _without_pushdown(cls))
    log.debug("registered dledger and dledger-files on %s (filter pushdown %s)", spark, pushdown)


def _pushdown(spark: SparkSession) -> bool:
    """Whether our readers may have pushFilters in this session.

    PySpark calls a reader's pushFilters only where PUSHDOWN_CONF is true, and where it is
    false it refuses to plan any reader that has one (DATA_SOURCE_PUSHDOWN_DISABLED): a
    reader cannot tell at run time which it is, so the choice is made here, per session.

    The conf set by the user decides. Unset (Spark's default), pushdown is turned on (the conf
    set to true) where this Spark plans each query's read afresh (spark.plan_probe); PySpark
    4.3 does not: it keeps the read planned for a filtered query of a loaded DataFrame for the
    later queries of that DataFrame that push no filter, which then silently read the filtered
    rows, and no source can see it happen. There the readers take no filters (Spark filters
    after the scan: always right), unless the user sets the conf and calls load() per query.
    """
    value = spark.conf.get(PUSHDOWN_CONF, None)
    if value is not None:
        on = value.strip().lower() == "true"
        if not on:
            log.info("%s is %s in this session: dledger reads filter after the scan", PUSHDOWN_CONF, value)
        return on
    from dledger.spark.plan_probe import scoped_reads

    if scoped_reads(spark):
        spark.conf.set(PUSHDOWN_CONF, "true")
        log.info("filter pushdown on (%s set to true): this Spark plans each query's read afresh", PUSHDOWN_CONF)
        return True
    log.info("filter pushdown off: Spark %s reuses a DataFrame's filtered read for its unfiltered queries "
             "(set %s to true and call load() per query to have it)", spark.version, PUSHDOWN_CONF)
    return False


def _without_pushdown(cls: type[DataSource]) -> type[DataSource]:
    """`cls` with `pushdown = False`: its reader() then returns a reader without pushFilters."""
    return type(f"{cls.__name__}NoPushdown", (cls,), {"pushdown": False, "__doc__": cls.__doc__})
