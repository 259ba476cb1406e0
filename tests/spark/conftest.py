"""Spark tests: one SparkSession for the whole run, real member processes over TCP.

The directory is skipped, with the reason, where Java or the `spark` extra is missing.
Nothing asserts on time: waits poll a condition until a generous deadline.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dledger.spark.java import java_problem

from .helpers import Group, start_group

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _skip_reason() -> str | None:
    if (problem := java_problem()) is not None:
        return f"the Spark tests: {problem}"
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        return "pyspark/pyarrow not installed: pip install -e '.[spark]'"
    return None


SKIP_REASON = _skip_reason()


class _SkippedModule(pytest.Module):
    """Stands for a test module that cannot even be imported here (it imports pyspark)."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        pytest.skip(SKIP_REASON or "", allow_module_level=True)


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    # a skip raised while importing a conftest breaks `pytest tests/spark`, so skip per module
    if SKIP_REASON and module_path.name.startswith("test_"):
        return _SkippedModule.from_parent(parent, path=module_path)
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test run: local[2], no UI, 2 shuffle partitions."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from dledger.spark import PUSHDOWN_CONF, register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("dledger-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="dledger-warehouse-"))  # catalog tests
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set(PUSHDOWN_CONF, "true")  # opt in (dledger.spark._pushdown says why it is not the default)
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """A live group shared by the read, stream and write tests (each computes what it
    expects from the client, never from other tests' leftovers)."""
    cluster, g = start_group(tmp_path_factory.mktemp("live"))
    try:
        yield g
    finally:
        g.client.close()
        cluster.__exit__()
