"""The whole suite: test workers run side by side (pytest-xdist, `make test`) each draw ports
from their own slice of the range (dledger.ports), and the Spark tests share one worker (one
SparkSession, one JVM, each module's group started once)."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

SPARK_DIR = "tests/spark/"


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit():
        os.environ["DLEDGER_PORT_SLICE"] = f"{worker[2:]}/{count}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SPARK_DIR):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` that keeps tests/spark on one worker, and each module with a
    module-scoped fixture (a group, a broker deployment, certificates) on one worker, by
    their node ids; every other test goes alone to whichever worker is free.

    xdist's own grouping appends `@spark` to a marked test's node id, which pytest 9 no
    longer lets it do: the mark alone grouped nothing, and the Spark tests ran on both
    workers (two JVMs, each module's group fixture started twice), as did the tests of a
    module sharing a fixture (each worker set it up). The doc pages that run Spark start
    their own in the page's interpreter and need no group."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    @functools.cache
    def shares_a_module_fixture(path: str) -> bool:
        try:
            return 'scope="module"' in (config.rootpath / path).read_text()
        except OSError:
            return False

    class OneWorkerPerSharedFixture(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SPARK_DIR):
                return "spark"
            path = nodeid.split("::", 1)[0]
            return path if shares_a_module_fixture(path) else super()._split_scope(nodeid)

    return OneWorkerPerSharedFixture(config, log)
