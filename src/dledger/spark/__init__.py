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

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Register `format("dledger")` and `format("dledger-files")` on this session; their
    readers take filters (pushdown) only where the session set PUSHDOWN_CONF to true."""
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

    Opt-in, not turned on for the user: PySpark 4.3 caches the read it planned once per
    loaded DataFrame (PythonDataSourceV2.readInfo), and a filtered query replaces it, so a
    later query of the same DataFrame that pushes no filter silently reads the filtered rows
    (`df.filter("index < 10").count()` then `df.count()` gives 9 for both). A session that
    turns the conf on must load() once per query. Without it our sources are registered as
    variants whose readers have no pushFilters (Spark filters after the scan; correct).
    """
    value = spark.conf.get(PUSHDOWN_CONF, None)
    on = value is not None and value.strip().lower() == "true"
    if not on:
        log.info("%s is not true in this session: dledger reads filter after the scan", PUSHDOWN_CONF)
    return on


def _without_pushdown(cls: type[DataSource]) -> type[DataSource]:
    """`cls` with `pushdown = False`: its reader() then returns a reader without pushFilters."""
    return type(f"{cls.__name__}NoPushdown", (cls,), {"pushdown": False, "__doc__": cls.__doc__})
