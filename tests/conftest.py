"""The whole suite: test workers run side by side (pytest-xdist, `make test`) each draw ports
from their own slice of the range (dledger.ports), and the Spark tests share one worker (one
SparkSession, one JVM)."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit():
        os.environ["DLEDGER_PORT_SLICE"] = f"{worker[2:]}/{count}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.path).replace(os.sep, "/") or "spark" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("spark"))
