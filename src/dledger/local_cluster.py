"""A local group of member processes (`dledger server` or `dledger controller` each) for the `cluster` command,
the demos, the benchmarks and the tests.

It lives below the CLI, not in it, so the modules the CLI imports (bench, demos) can
start groups without importing the CLI back.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dledger.codes import DLedgerError, ResponseCode
from dledger.config import parse_peers
from dledger.ports import port_free
from dledger.runtime.client import DLedgerClient
from dledger.security.tls import TlsConfig

log = logging.getLogger(__name__)


class local_cluster:
    """Start member processes, wait until every one answers, stop them all on exit.

    `extra` is appended to every member's `dledger server` arguments, e.g.
    `["--enable-fault-injection"]` for tests that partition members. `tls_dir` holds what
    `dledger certs` made (member nK uses nK.pem; this module's own client uses client.pem);
    `auth_token` is given to every member and to that client.
    """

    def __init__(self, peers: str, group: str, data_dir: Path, flush: str = "async", store_type: str = "file",
                 metrics_base_port: int = 0, extra: list[str] | None = None, *, tls_dir: Path | None = None,
                 auth_token: str | None = None, command: str = "server", ready_poll_s: float = 0.2) -> None:
        self.command = command  # "server", or "controller": a controller group (controller.command)
        self.ready_poll_s = ready_poll_s  # how often the start asks whether the group is ready
        self.tls_dir = tls_dir
        self.auth_token = auth_token
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
        cmd = [sys.executable, "-m", "dledger", self.command, "--group", self.group, "--id", member,
               "--peers", self.peers, "--store-dir", str(self.data_dir / self.group / member),
               "--flush", self.flush, "--store", self.store_type, *self.extra]
        if self.metrics_base_port:
            cmd += ["--metrics-port", str(self.metrics_base_port + k)]
        if self.tls_dir is not None:
            d = self.tls_dir
            cmd += ["--tls-cert", str(d / f"{member}.pem"), "--tls-key", str(d / f"{member}-key.pem"),
                    "--tls-ca", str(d / "ca.pem")]
        env = None
        if self.auth_token:  # by the environment, so it does not show in `ps`
            env = {**os.environ, "DLEDGER_AUTH_TOKEN": self.auth_token}
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)  # its "listening" line: ours says peers
        log.debug("started %s/%s as process %d", self.group, member, p.pid)
        self.procs[member] = p
        return p

    def __enter__(self) -> dict[str, subprocess.Popen[bytes]]:
        # before any member starts: a member that cannot listen exits, while whatever holds
        # its port (another group?) answers in its place and the group looks ready
        check_ports_free(self.peers, self.metrics_base_port)
        for member in parse_peers(self.peers):
            self.start_member(member)
        try:
            wait_ready(self.peers, self.group, 30.0, self.procs, poll_s=self.ready_poll_s, **self.client_options())
        except BaseException:
            self.__exit__()
            raise
        return self.procs

    def __exit__(self, *exc: object) -> None:
        stop_processes(self.procs.values())

    def client_options(self, role: str = "client") -> dict[str, Any]:
        """`tls` and `auth_token` for a DLedgerClient of this group (`role`: whose certificate,
        client or admin)."""
        return {"tls": client_tls(self.tls_dir, role), "auth_token": self.auth_token}


def local_certs(tls_dir: Path, *, members: Iterable[str] = (), controllers: Iterable[str] = (),
                brokers: Iterable[str] = ()) -> Path:
    """A development CA and the certificates a local deployment needs (members, controllers,
    broker replicas `set/replica`, a client and an admin), made once and then reused; made
    again, CA and all, when one is missing."""
    from dledger.security.certs import broker_file_stem, make_certs

    members, controllers, brokers = list(members), list(controllers), list(brokers)
    stems = ["ca", "client", "admin", *members, *controllers, *(broker_file_stem(b) for b in brokers)]
    if not all((tls_dir / f"{stem}.pem").exists() for stem in stems):
        make_certs(tls_dir, members, force=True, controllers=controllers, brokers=brokers)
    return tls_dir


def client_tls(tls_dir: Path | None, name: str = "client") -> TlsConfig | None:
    """The client certificate `dledger certs` wrote into `tls_dir`."""
    if tls_dir is None:
        return None
    return TlsConfig(str(tls_dir / "ca.pem"), str(tls_dir / f"{name}.pem"), str(tls_dir / f"{name}-key.pem"))


class PortsInUse(DLedgerError):
    """Ports a local group needs are taken; `busy` names them, e.g. `20911 (n0)`."""

    def __init__(self, busy: list[str]) -> None:
        super().__init__(ResponseCode.NETWORK_ERROR,
                         f"ports already in use on 127.0.0.1: {', '.join(busy)}; stop what listens there "
                         "or choose other ports")
        self.busy = busy


def busy_ports(peers: str, metrics_base_port: int = 0) -> list[str]:
    """The ports of `peers` (member nK's and, when `metrics_base_port` is set, its metrics port
    metrics_base_port + K) that cannot be bound on 127.0.0.1 now, each as `port (who)`."""
    busy = []
    for k, (member, peer) in enumerate(parse_peers(peers).items()):
        if not port_free(peer.port):
            busy.append(f"{peer.port} ({member})")
        if metrics_base_port and not port_free(metrics_base_port + k):
            busy.append(f"{metrics_base_port + k} ({member} metrics)")
    return busy


def check_ports_free(peers: str, metrics_base_port: int = 0) -> None:
    """Raise PortsInUse naming every port of the group that is taken."""
    busy = busy_ports(peers, metrics_base_port)
    if busy:
        raise PortsInUse(busy)


def stop_processes(procs: Iterable[subprocess.Popen[Any]], timeout: float = 15.0) -> None:
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
               procs: dict[str, subprocess.Popen[bytes]] | None = None, *, tls: TlsConfig | None = None,
               auth_token: str | None = None, poll_s: float = 0.2) -> None:
    """Until every member answers METADATA and a leader is known (asked every `poll_s`)."""
    deadline = time.monotonic() + timeout
    with DLedgerClient(peers, group, timeout=1.0, tls=tls, auth_token=auth_token) as c:
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
            time.sleep(poll_s)
    raise DLedgerError(ResponseCode.TIMEOUT, f"group {group} did not become ready in {timeout:.0f} s")


__all__ = ["PortsInUse", "busy_ports", "check_ports_free", "client_tls", "local_certs", "local_cluster",
           "stop_processes", "wait_ready"]
