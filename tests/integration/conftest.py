"""Fixtures for the integration suite: groups of real member processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dledger.ports import free_port_run

from .harness import Cluster, MakeCluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """Start groups (`make_cluster(5, flush="sync")`); every process they started is
    stopped at teardown, whatever the test did."""
    clusters: list[Cluster] = []

    def make(n: int = 3, *, flush: str = "async", extra: Sequence[str] = (), metrics: bool = False,
             fault_injection: bool = True, tls_dir: Path | None = None, auth_token: str | None = None) -> Cluster:
        c = Cluster(n, tmp_path / f"cluster{len(clusters)}", flush=flush, extra=extra,
                    metrics_base_port=free_port_run(n) if metrics else 0, fault_injection=fault_injection,
                    tls_dir=tls_dir, auth_token=auth_token)
        clusters.append(c)
        c.start()
        return c

    try:
        yield make
    finally:
        for c in clusters:
            c.cleanup()
