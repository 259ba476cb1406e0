"""A local controller mode deployment: a controller group and broker sets as processes, for
`dledger cluster --mode controller`, the demo, the benchmarks and the tests."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dledger.address import format_address
from dledger.broker import messages as bm
from dledger.broker.client import BrokerClient
from dledger.codes import DLedgerError, ResponseCode
from dledger.config import Peer, format_peers, parse_peers
from dledger.local_cluster import client_tls, local_certs, local_cluster, stop_processes
from dledger.ports import port_free
from dledger.security.certs import broker_file_stem

log = logging.getLogger(__name__)

CLUSTER = "DefaultCluster"


@dataclass(frozen=True)
class BrokerSpec:
    name: str  # the broker set
    replica: int  # 0.. within the set
    port: int
    ha_port: int
    store_dir: Path
    host: str = "127.0.0.1"  # an IPv6 literal without brackets ("::1")

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def ha_address(self) -> str:
        return format_address(self.host, self.ha_port)

    @property
    def key(self) -> str:
        return f"{self.name}/r{self.replica}"


class local_broker_cluster:
    """Controllers on base_port.., then each broker's client port and HA port."""

    def __init__(self, data_dir: Path, controllers: int = 3, broker_sets: int = 2, replicas: int = 2,
                 base_port: int = 30911, broker_args: list[str] | None = None,
                 controller_args: list[str] | None = None, tls_dir: Path | None = None, *,
                 group: str = "controller", flush: str = "async", metrics_base_port: int = 0,
                 host: str = "127.0.0.1") -> None:
        """`tls_dir`: where the deployment's certificates are (made there when missing, by
        local_certs: controllers cK.pem, broker replicas bS-rR.pem, client.pem, admin.pem);
        None: no TLS. `host`: where every process listens (a loopback address: "::1" for IPv6)."""
        self.host = host
        self.data_dir = data_dir
        self.tls_dir = tls_dir
        self.tls = client_tls(tls_dir)
        self.admin_tls = client_tls(tls_dir, "admin")
        self.peers = format_peers({f"c{k}": Peer(f"c{k}", host, base_port + k) for k in range(controllers)})
        self.controller_ports = [base_port + k for k in range(controllers)]
        self.controller = ";".join(format_address(host, p) for p in self.controller_ports)
        self.broker_args = broker_args or []
        self.specs: dict[str, BrokerSpec] = {}
        port = base_port + controllers
        for s in range(broker_sets):
            for r in range(replicas):
                spec = BrokerSpec(f"b{s}", r, port, port + 1, data_dir / "brokers" / f"b{s}" / f"r{r}", host)
                self.specs[spec.key] = spec
                port += 2
        if tls_dir is not None:
            local_certs(tls_dir, controllers=list(parse_peers(self.peers)), brokers=list(self.specs))
        self.controllers = local_cluster(self.peers, group, data_dir / "controllers", flush,
                                         metrics_base_port=metrics_base_port, extra=controller_args or [],
                                         command="controller", tls_dir=tls_dir)
        self.brokers: dict[str, subprocess.Popen[bytes]] = {}
        self._clients: dict[str, BrokerClient] = {}

    def add_replica(self, name: str, port: int, ha_port: int) -> str:
        """One more replica of `name` (start it with start_broker); its key."""
        replica = sum(1 for s in self.specs.values() if s.name == name)
        spec = BrokerSpec(name, replica, port, ha_port, self.data_dir / "brokers" / name / f"r{replica}", self.host)
        self.specs[spec.key] = spec
        if self.tls_dir is not None:
            local_certs(self.tls_dir, controllers=list(parse_peers(self.peers)), brokers=list(self.specs))
        return spec.key

    @property
    def broker_names(self) -> list[str]:
        return sorted({s.name for s in self.specs.values()})

    def busy_ports(self) -> list[str]:
        busy = [f"{p} (controller c{k})" for k, p in enumerate(self.controller_ports) if not port_free(p)]
        for s in self.specs.values():
            busy += [f"{port} ({s.key})" for port in (s.port, s.ha_port) if not port_free(port)]
        return busy

    def start_broker(self, key: str, extra: list[str] | None = None) -> subprocess.Popen[bytes]:
        s = self.specs[key]
        cmd = [sys.executable, "-m", "dledger", "broker", "--cluster", CLUSTER, "--name", s.name,
               "--controller", self.controller, "--listen", s.address, "--ha-listen", s.ha_address,
               "--store-dir", str(s.store_dir), *self.broker_args, *(extra or [])]
        t = client_tls(self.tls_dir, broker_file_stem(key))
        if t is not None:
            cmd += ["--tls-cert", t.cert, "--tls-key", t.key, "--tls-ca", t.ca]
        p = subprocess.Popen(cmd)
        self.brokers[key] = p
        return p

    def kill_broker(self, key: str) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        p = self.brokers.pop(key)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def stop_broker(self, key: str) -> None:
        stop_processes([self.brokers.pop(key)])

    def __enter__(self) -> local_broker_cluster:
        self.controllers.__enter__()
        try:
            for key in self.specs:
                self.start_broker(key)
            self.wait_masters(60.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        stop_processes(self.brokers.values())
        self.brokers.clear()
        self.controllers.__exit__()

    def client(self, broker: str, timeout: float = 10.0) -> BrokerClient:
        """A new client of a broker set (the caller closes it)."""
        return BrokerClient(self.controller, broker, timeout, tls=self.tls)

    def _shared(self, broker: str) -> BrokerClient:
        if broker not in self._clients:
            self._clients[broker] = self.client(broker, timeout=2.0)
        return self._clients[broker]

    def info(self, key: str) -> bm.RuntimeInfo:
        """A running replica's own view (role, epochs, offsets)."""
        return self._shared(self.specs[key].name).info(self.specs[key].address)

    def master_of(self, broker: str) -> str | None:
        """The key of the broker set's acknowledging master: a replica that says it is master
        and holds its lease (a deposed master cut off from the controllers may still think it
        is master until it hears of the new one, but it acknowledges nothing)."""
        for key, s in self.specs.items():
            if s.name == broker and key in self.brokers:
                try:
                    info = self.info(key)
                except DLedgerError:
                    continue
                if info.role == "MASTER" and info.lease_ms_left > 0:
                    return key
        return None

    def wait_masters(self, timeout: float) -> None:
        """Until every broker set has a master and every running replica has its role."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for key, p in self.brokers.items():
                if p.poll() is not None:
                    raise DLedgerError(ResponseCode.NETWORK_ERROR, f"broker {key} exited with code {p.returncode}")
            try:
                roles = {key: self.info(key).role for key in self.brokers}
            except DLedgerError:
                roles = {}
            if roles and "FENCED" not in roles.values() and all(
                    any(roles.get(k) == "MASTER" for k in roles if k.startswith(f"{n}/")) for n in self.broker_names):
                return
            time.sleep(0.2)
        raise DLedgerError(ResponseCode.TIMEOUT, f"broker sets did not get their masters in {timeout:.0f} s")
