"""Catalog tables: PySpark (4.3) hands a Python data source no options when a catalog table is
read, so `CREATE TABLE … USING dledger` fails at CREATE with what to do instead, a table made
another way fails clearly when read, and a temporary view works for reads and inserts."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql import SparkSession

from .helpers import Group, read_all

pytestmark = pytest.mark.spark


def test_create_table_fails_at_create_naming_temporary_views(spark: SparkSession, group: Group) -> None:
    with pytest.raises(Exception, match=r"CREATE TABLE … USING dledger is not supported.*TEMPORARY VIEW"):
        spark.sql(f"CREATE TABLE t_dl USING dledger OPTIONS (peers '{group.peers}', group '{group.name}')")
    assert not spark.catalog.tableExists("t_dl")


def test_a_table_with_a_declared_schema_fails_clearly_when_read(spark: SparkSession, group: Group) -> None:
    spark.sql(f"CREATE TABLE t_dl2 (body binary) USING dledger OPTIONS (peers '{group.peers}')")
    try:
        with pytest.raises(Exception, match=r"option peers is missing.*no option reached it at all "
                                            r"\(a catalog table\? docs/spark.md, 'Catalog tables'\)"):
            spark.table("t_dl2").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS t_dl2")


def test_a_temporary_view_reads_and_inserts(spark: SparkSession, group: Group) -> None:
    start = group.committed_next()
    tag = uuid.uuid4().hex
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW v_dl USING dledger "
              f"OPTIONS (peers '{group.peers}', group '{group.name}', startingIndex '{{\"{group.name}\": {start}}}')")
    spark.sql(f"INSERT INTO v_dl (body) SELECT cast(concat('{tag}-', id) as binary) FROM range(5)")
    got = sorted(bytes(r["body"]) for r in spark.sql("SELECT body FROM v_dl").collect()
                 if bytes(r["body"]).startswith(tag.encode()))
    assert got == sorted(f"{tag}-{i}".encode() for i in range(5))
    assert sorted(e.body for e in read_all(group.client, start) if e.body.startswith(tag.encode())) == got
