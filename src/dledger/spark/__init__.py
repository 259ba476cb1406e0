"""Spark connectors for dledger (SPEC §7): PySpark >= 4.2 Python Data Source API.

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

log = logging.getLogger(__name__)

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Register `format("dledger")` and `format("dledger-files")` on this session."""
    from dledger.spark.files import DLedgerFilesDataSource
    from dledger.spark.source import DLedgerDataSource

    spark.dataSource.register(DLedgerDataSource)
    spark.dataSource.register(DLedgerFilesDataSource)
    log.debug("registered dledger and dledger-files on %s", spark)
