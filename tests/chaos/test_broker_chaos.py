"""A nemesis over real controller and broker processes (issue 14), while writers send with
all-ack: the master SIGKILLed; the master cut off from the controllers but not from its
slaves; the master and the controller leader killed together (#7689); a slave cut off until
it leaves the SyncStateSet, then healed. At the end: every acknowledged record is in the
master's log at its index, the replicas hold the same confirmed records, and `dledger audit`
finds their stores in agreement offline.

Waits are for conditions with generous deadlines; nothing timed is asserted.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dledger.broker.local import local_broker_cluster
from dledger.codes import DLedgerError
from dledger.controller.client import ControllerClient
from dledger.ports import free_port_run
from integration.harness import wait_until

pytestmark = pytest.mark.chaos

ARGS = ["--all-ack-in-sync-state-set", "--enable-fault-injection"]


class Writers:
    def __init__(self, d: local_broker_cluster, n: int = 3) -> None:
        self.d, self.stop = d, threading.Event()
        self.acked: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(n)]

    def _run(self, k: int) -> None:
        with self.d.client("b0", timeout=3.0) as c:
            seq = 0
            while not self.stop.is_set():
                body = f"w{k}-{seq}".encode()
                seq += 1
                try:
                    r = c.send(body)
                except DLedgerError:
                    time.sleep(0.05)
                    continue
                with self.lock:
                    self.acked[r.index] = body

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def writes_go_on(w: Writers, what: str) -> None:
    before = w.count()
    wait_until(lambda: w.count() > before + 20, 60, f"sends acknowledged after {what}")


def controller_leader(d: local_broker_cluster) -> str:
    import asyncio

    async def ask() -> str:
        async with ControllerClient(d.controller, timeout=2.0) as c:
            for info in (await c.metadata()).values():
                if not isinstance(info, str) and info.controller_leader_id:
                    return info.controller_leader_id
        return ""

    return wait_until(lambda: asyncio.run(ask()), 30, "a controller leader")


def full_master(d: local_broker_cluster) -> str:
    """The master, once every running replica is in its SyncStateSet (else a failover may
    rightly have no candidate: no unclean elections)."""
    def ready() -> str | None:
        master = d.master_of("b0")
        return master if master and len(d.info(master).sync_state_set) == len(d.brokers) else None

    return wait_until(ready, 60, "a master with every replica in sync")


def kill_master(d: local_broker_cluster, w: Writers, rng: random.Random) -> None:
    master = full_master(d)
    d.kill_broker(master)
    writes_go_on(w, f"SIGKILL of master {master}")
    d.start_broker(master)


def isolate_master(d: local_broker_cluster, w: Writers, rng: random.Random) -> None:
    master = full_master(d)
    with d.client("b0") as c:
        c.inject_faults(d.specs[master].address, blocked=d.controller.split(";"))
        wait_until(lambda: d.master_of("b0") not in (None, master), 60, "another master")
        writes_go_on(w, f"isolating master {master} from the controllers")
        c.inject_faults(d.specs[master].address)
    wait_until(lambda: d.info(master).role == "SLAVE", 60, f"{master} back as a slave")


def kill_master_and_controller_leader(d: local_broker_cluster, w: Writers, rng: random.Random) -> None:
    master = full_master(d)
    leader = controller_leader(d)
    proc = d.controllers.procs.pop(leader)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    d.kill_broker(master)
    writes_go_on(w, f"SIGKILL of master {master} and controller leader {leader}")
    d.controllers.start_member(leader)
    d.start_broker(master)


def cut_slave(d: local_broker_cluster, w: Writers, rng: random.Random) -> None:
    master = full_master(d)
    slave = rng.choice([k for k in d.brokers if k != master])
    slave_id = wait_until(lambda: d.info(slave).broker_id, 30, f"{slave} answering")
    with d.client("b0") as c:
        c.inject_faults(d.specs[slave].address, ha_cut=True)
        wait_until(lambda: slave_id not in d.info(d.master_of("b0") or master).sync_state_set, 60,
                   f"{slave} out of the SyncStateSet")
        writes_go_on(w, f"cutting {slave} off")
        c.inject_faults(d.specs[slave].address)
    wait_until(lambda: slave_id in d.info(d.master_of("b0") or master).sync_state_set, 60,
               f"{slave} back in the SyncStateSet")


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_nemesis_over_controllers_and_brokers(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    steps = [kill_master, isolate_master, kill_master_and_controller_leader, cut_slave]
    rng.shuffle(steps)
    base = free_port_run(3 + 2 * 3)
    d = local_broker_cluster(tmp_path, controllers=3, broker_sets=1, replicas=3, base_port=base, broker_args=ARGS)
    with d:
        with Writers(d) as w:
            writes_go_on(w, "the start")
            for step in steps:
                step(d, w, rng)
            writes_go_on(w, "the last fault")
        master = wait_until(lambda: d.master_of("b0"), 60, "a master")
        top = d.info(master).max_offset
        wait_until(lambda: all(d.info(k).confirm_offset >= top for k in d.brokers), 60, "every replica confirmed")
        with d.client("b0") as c:
            logs = {k: _read_all(c, d.specs[k].address) for k in d.brokers}
        first = logs[master]
        assert all(log == first for log in logs.values()), {k: len(v) for k, v in logs.items()}
        by_index = dict(first)
        lost = {i: b for i, b in w.acked.items() if by_index.get(i) != b}
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {list(lost.items())[:3]}"
        assert len(w.acked) > 100
        stores = [str(d.specs[k].store_dir) for k in sorted(d.brokers)]
    if shutil.which("java") and importlib.util.find_spec("pyspark"):
        out = subprocess.run([sys.executable, "-m", "dledger", "audit", *stores, "--master", "local[1]"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "agree" in out.stdout, (out.stdout, out.stderr[-2000:])


def _read_all(c: object, address: str) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while True:
        page = c.read(len(out), 10_000, replica=address)  # type: ignore[attr-defined]
        out.extend((r.index, r.body) for r in page)
        if len(page) < 10_000:
            return out
