"""Helpers of the Spark tests: real local groups, polling without timing assertions."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dledger.config import Peer, format_peers
from dledger.local_cluster import local_cluster
from dledger.ports import free_ports
from dledger.runtime.client import DLedgerClient, Entry
from integration.harness import wait_until


def make_peers(n: int = 3) -> str:
    return format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", p) for k, p in enumerate(free_ports(n))})


def read_all(client: DLedgerClient, start: int = 0) -> list[Entry]:
    """Every committed NORMAL entry from `start`, through the client."""
    out: list[Entry] = []
    while True:
        chunk = client.read(start, 5000)
        if not chunk:
            return out
        out.extend(chunk)
        start = chunk[-1].index + 1


@dataclass
class Group:
    name: str
    peers: str
    data_dir: Path
    client: DLedgerClient

    def committed_next(self) -> int:
        """The leader's committed index + 1: where a reader started now begins."""
        from dledger.spark.online import leader_view

        return wait_until(lambda: leader_view(self.client), 60, "leader view").committed_index + 1


@contextlib.contextmanager
def running_group(data_dir: Path, name: str) -> Iterator[tuple[local_cluster, Group]]:
    """start_group for one test: on the way out, members a test left SIGSTOPped are resumed
    (a stopped member would hang the cluster's exit), the client closed, the group stopped."""
    cluster, g = start_group(data_dir, name)
    try:
        yield cluster, g
    finally:
        for p in cluster.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        g.client.close()
        cluster.__exit__()


def start_group(data_dir: Path, name: str = "default",
                config: dict[str, int | str] | None = None) -> tuple[local_cluster, Group]:
    """A local 3-member group; `config` entries go to the members' TOML (e.g. small data files)."""
    peers = make_peers()
    extra: list[str] = []
    if config:
        toml = data_dir / f"{name}.toml"
        data_dir.mkdir(parents=True, exist_ok=True)
        toml.write_text("".join(f"{k} = {v}\n" for k, v in config.items()))
        extra = ["--config", str(toml)]
    cluster = local_cluster(peers, name, data_dir, extra=extra)
    cluster.__enter__()
    return cluster, Group(name, peers, data_dir, DLedgerClient(peers, name))
