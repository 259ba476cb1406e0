"""A local group of member processes (`dledger server` each) for the `cluster` command,
the demos, the benchmarks and the tests.

It lives below the CLI, not in it, so the modules the CLI imports (bench, demos) can
start groups without importing the CLI back.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from dledger.codes import DLedgerError, ResponseCode
from dledger.config import parse_peers
from dledger.runtime.client import DLedgerClient

log = logging.getLogger(__name__)


class local_cluster:
    """Start member processes, wait until every one answers, stop them all on exit.

    `extra` is appended to every member's `dledger server` arguments, e.g.
    `["--enable-fault-injection"]` for tests that partition members.
    """

    def __init__(self, peers: str, group: str, data_dir: Path, flush: str = "async", store_type: str = "file",
                 metrics_base_port: int = 0, extra: list[str] | None = None) -> None:
        self.peers = peers
        self.group = group
        self.data_dir = data_dir
        self.flush = flush
        self.store_type = store_type
        self.metrics_base_port = metrics_base_port
        self.extra = extra or []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start_member(self, member: str) -> subprocess.Popen[bytes]:
        k = list(parse_peers(self.peers)).index(member)
        cmd = [sys.executable, "-m", "dledger", "server", "--group", self.group, "--id", member,
               "--peers", self.peers, "--store-dir", str(self.data_dir / self.group / member),
               "--flush", self.flush, "--store", self.store_type, *self.extra]
        if self.metrics_base_port:
            cmd += ["--metrics-port", str(self.metrics_base_port + k)]
        p = subprocess.Popen(cmd)
        log.debug("started %s/%s as process %d", self.group, member, p.pid)
        self.procs[member] = p
        return p

    def __enter__(self) -> dict[str, subprocess.Popen[bytes]]:
        for member in parse_peers(self.peers):
            self.start_member(member)
        try:
            wait_ready(self.peers, self.group, 30.0, self.procs)
        except BaseException:
            self.__exit__()
            raise
        return self.procs

    def __exit__(self, *exc: object) -> None:
        stop_processes(self.procs.values())


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    """SIGTERM to all at once (they stop in parallel), then SIGKILL whoever is still up
    after `timeout` s."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("process %d ignored SIGTERM for %.0f s: killing it", p.pid, timeout)
            p.kill()
            p.wait()


def wait_ready(peers: str, group: str, timeout: float,
               procs: dict[str, subprocess.Popen[bytes]] | None = None) -> None:
    """Until every member answers METADATA and a leader is known."""
    deadline = time.monotonic() + timeout
    with DLedgerClient(peers, group, timeout=1.0) as c:
        while time.monotonic() < deadline:
            for member, p in (procs or {}).items():
                if p.poll() is not None:
                    raise DLedgerError(ResponseCode.NETWORK_ERROR, f"member {member} exited with code {p.returncode}")
            try:
                views = [c.metadata(m) for m in parse_peers(peers)]
                if all(v.leader_id for v in views):
                    return
            except DLedgerError:
                pass
            time.sleep(0.2)
    raise DLedgerError(ResponseCode.TIMEOUT, f"group {group} did not become ready in {timeout:.0f} s")


__all__ = ["local_cluster", "stop_processes", "wait_ready"]
