"""Broker sets on real processes (issue 14): three `dledger controller` members and `dledger
broker` replicas on 127.0.0.1, upstream's AutoSwitchRoleIntegrationTest and AutoSwitchHATest
scenarios (upstream's AutoSwitchHATest), the old master truncating its unconfirmed tail, and the master
lease (a master cut off from the controllers stops acknowledging).

Every wait is for a condition with a generous deadline; assertions on epochs say "at least":
on a noisy machine a heartbeat may be late and cause an extra election, which must not break
anything asserted here.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dledger.broker.client import BrokerClient
from dledger.broker.local import local_broker_cluster
from dledger.codes import DLedgerError, ResponseCode
from dledger.ports import free_port_run

from .harness import wait_until

pytestmark = pytest.mark.integration

ALL_ACK = ["--all-ack-in-sync-state-set"]


def deployment(tmp_path: Path, replicas: int = 2, args: list[str] | None = None,
               spare: int = 0) -> local_broker_cluster:
    base = free_port_run(3 + 2 * (replicas + spare))
    return local_broker_cluster(tmp_path, controllers=3, broker_sets=1, replicas=replicas, base_port=base,
                                broker_args=args if args is not None else ALL_ACK)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[local_broker_cluster]:
    with deployment(tmp_path) as d:
        yield d


def roles(d: local_broker_cluster) -> dict[str, str]:
    return {k: d.info(k).role for k in d.brokers}


def the_master(d: local_broker_cluster) -> str:
    return wait_until(lambda: d.master_of("b0"), 30, "a master")


def the_slave(d: local_broker_cluster) -> str:
    master = the_master(d)
    return next(k for k in d.brokers if k != master)


def in_sync(d: local_broker_cluster, n: int) -> bool:
    return len(d.info(d.master_of("b0") or "").sync_state_set) == n


def bodies_at(c: BrokerClient, address: str) -> list[bytes]:
    return [r.body for r in c.read(0, 10_000, replica=address)]


def test_replicate_failover_and_rejoin(pair: local_broker_cluster) -> None:
    """testChangeMaster: the master is killed; the slave is master at a higher epoch and keeps
    every acknowledged record; the old master returns as a slave and gets the new data."""
    d = pair
    master, slave = the_master(d), the_slave(d)
    wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2")
    with d.client("b0") as c:
        acked = [r for r in (c.send(f"m{i}".encode()) for i in range(40))]
        assert [r.index for r in acked] == list(range(40)) and {r.epoch for r in acked} == {1}
        batch = c.send_batch([b"b%d" % i for i in range(100)])
        assert [r.index for r in batch] == list(range(40, 140))
        wait_until(lambda: d.info(slave).max_offset == d.info(master).max_offset, 30, "the slave caught up")
        before = d.info(slave)
        d.kill_broker(master)
        wait_until(lambda: d.info(slave).role == "MASTER", 30, "the slave became master")
        assert d.info(slave).master_epoch >= 2 and d.info(slave).max_offset >= before.max_offset
        after = c.send(b"after failover")
        assert after.epoch >= 2 and after.index == 140
        d.start_broker(master)
        wait_until(lambda: d.info(master).role == "SLAVE", 30, "the old master rejoined as slave")
        wait_until(lambda: d.info(master).max_offset == d.info(slave).max_offset, 30, "the old master caught up")
        expected = [f"m{i}".encode() for i in range(40)] + [b"b%d" % i for i in range(100)] + [b"after failover"]
        assert bodies_at(c, d.specs[slave].address) == expected
        wait_until(lambda: bodies_at(c, d.specs[master].address) == expected, 30, "the old master's records")


def test_old_master_truncates_its_unacknowledged_tail(tmp_path: Path) -> None:
    """A record written on the master but never sent to the slave (replication paused, then
    the master killed) is not acknowledged; the old master rejoins under the new master and
    cuts it from its log at the consistent point, on disk."""
    with deployment(tmp_path, args=[*ALL_ACK, "--enable-fault-injection"]) as d:
        master, slave = the_master(d), the_slave(d)
        wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2")
        with d.client("b0", timeout=3.0) as c, d.client("b0", timeout=3.0) as doomed:
            for i in range(5):
                c.send(b"ok%d" % i)
            wait_until(lambda: d.info(slave).max_offset == d.info(master).max_offset, 30, "the slave caught up")
            agreed = d.info(master).max_offset
            c.inject_faults(d.specs[master].address, ha_paused=True)
            outcome: list[object] = []
            sender = threading.Thread(target=lambda: outcome.append(_try(lambda: doomed.send(b"never acked"))))
            sender.start()
            wait_until(lambda: d.info(master).max_offset > agreed, 30, "the record written on the master")
            d.kill_broker(master)
            sender.join(30)
            assert outcome and isinstance(outcome[0], DLedgerError), outcome  # never acknowledged
            wait_until(lambda: d.info(slave).role == "MASTER", 60, "the slave became master")
            c.send(b"new master")
            d.start_broker(master)
            wait_until(lambda: d.info(master).role == "SLAVE" and d.info(master).truncated_at is not None, 30,
                       "the old master truncated")
            assert d.info(master).truncated_at == agreed
            expected = [b"ok%d" % i for i in range(5)] + [b"new master"]
            wait_until(lambda: bodies_at(c, d.specs[master].address) == expected, 30, "the old master's log")


def _try(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except DLedgerError as e:
        return e


def test_sync_state_set_shrinks_and_expands(pair: local_broker_cluster) -> None:
    """testCheckSyncStateSet / testOptionAllAckInSyncStateSet: with the slave gone the set
    shrinks to the master and all-ack sends go on; the slave back, it expands again."""
    d = pair
    master, slave = the_master(d), the_slave(d)
    wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2")
    d.kill_broker(slave)
    wait_until(lambda: in_sync(d, 1), 30, "SyncStateSet of 1")
    with d.client("b0") as c:
        assert c.send(b"alone").index == 0
        d.start_broker(slave)
        wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2 again")
        assert c.send(b"together").index == 1
        assert bodies_at(c, d.specs[slave].address)[:1] == [b"alone"]
    assert d.info(master).role == "MASTER"


def test_min_in_sync_replicas_refuses_sends(tmp_path: Path) -> None:
    with deployment(tmp_path, args=["--in-sync-replicas", "2", "--min-in-sync-replicas", "2"]) as d:
        slave = the_slave(d)
        wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2")
        with d.client("b0", timeout=3.0) as c:
            assert c.send(b"two copies").index == 0
            d.kill_broker(slave)
            wait_until(lambda: in_sync(d, 1), 30, "SyncStateSet of 1")
            with pytest.raises(DLedgerError) as e:
                c.send(b"one copy")
            assert e.value.code == ResponseCode.IN_SYNC_REPLICAS_NOT_ENOUGH


def test_master_cut_off_from_the_controllers_stops_acknowledging(pair: local_broker_cluster) -> None:
    """The lease (beyond upstream, #7017): with every controller stopped the master refuses
    sends once its lease ends; the controllers back, it acknowledges again."""
    d = pair
    master = the_master(d)
    with d.client("b0", timeout=3.0) as c:
        c.send(b"before")
        controllers = list(d.controllers.procs.values())
        for p in controllers:
            os.kill(p.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: d.info(master).lease_ms_left == 0, 30, "the lease ended")
            with pytest.raises(DLedgerError) as e:
                c.send(b"during")
            assert e.value.code in (ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.TIMEOUT,
                                    ResponseCode.NETWORK_ERROR)
        finally:
            for p in controllers:
                os.kill(p.pid, signal.SIGCONT)
        wait_until(lambda: d.info(the_master(d)).lease_ms_left > 0, 60, "a lease again")
        assert c.send(b"after").index >= 1


def test_add_a_replica_that_catches_up_from_zero(tmp_path: Path) -> None:
    """testAddBroker; and testRestartWithChangedAddress: the new replica keeps its id when it
    comes back on other ports."""
    d = deployment(tmp_path, spare=2)
    with d, d.client("b0") as c:
        c.send_batch([b"r%d" % i for i in range(300)])
        base = max(p for s in d.specs.values() for p in (s.port, s.ha_port))
        key = d.add_replica("b0", base + 1, base + 2)
        d.start_broker(key)
        wait_until(lambda: d.info(key).role == "SLAVE", 30, "the new replica's role")
        wait_until(lambda: d.info(key).max_offset == d.info(the_master(d)).max_offset, 30, "caught up")
        broker_id = d.info(key).broker_id
        assert broker_id == 3
        wait_until(lambda: len(bodies_at(c, d.specs[key].address)) == 300, 30, "confirmed on the new replica")
        d.stop_broker(key)
        spec = d.specs[key]
        d.specs[key] = type(spec)(spec.name, spec.replica, base + 3, base + 4, spec.store_dir)
        d.start_broker(key)
        wait_until(lambda: d.info(key).role == "SLAVE", 30, "back on new ports")
        assert d.info(key).broker_id == broker_id


def test_send_and_read_from_the_command_line(pair: local_broker_cluster) -> None:
    import json
    import subprocess
    import sys

    d = pair
    the_master(d)
    cmd = [sys.executable, "-m", "dledger"]
    sent = subprocess.run([*cmd, "send", "--controller", d.controller, "--broker", "b0", "one", "two"],
                          capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    acks = [json.loads(line) for line in sent.stdout.splitlines()]
    assert [a["index"] for a in acks] == [0, 1] and acks[1]["offset"] > acks[0]["offset"]
    read = subprocess.run([*cmd, "read", "--controller", d.controller, "--broker", "b0", "--from", "1"],
                          capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr
    assert [json.loads(line)["body"] for line in read.stdout.splitlines()] == ["two"]
    table = subprocess.run([*cmd, "send", "--controller", d.controller, "--broker", "b0", "-o", "table", "three"],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "offset" in table.stdout and "{" not in table.stdout, table
    read = subprocess.run([*cmd, "read", "--controller", d.controller, "--broker", "b0", "--from", "1", "-o", "table"],
                          capture_output=True, text=True, timeout=60)
    assert read.returncode == 0 and "two" in read.stdout and "three" in read.stdout and "epoch" in read.stdout, read
    read = subprocess.run([*cmd, "read", "--controller", d.controller, "--broker", "b0", "--from", "2", "--base64"],
                          capture_output=True, text=True, timeout=60)
    assert [json.loads(line)["body"] for line in read.stdout.splitlines()] == ["dGhyZWU="]  # as `read --peers`
    bad = subprocess.run([*cmd, "send", "--controller", d.controller, "--broker", "nope", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "no broker set named 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_deployment_with_mutual_tls(tmp_path: Path) -> None:
    """Controllers, brokers, the HA port and clients all on mutual TLS: replication and a
    failover work; a client without a certificate gets nowhere."""
    from dledger.broker.client import BrokerClient

    certs = tmp_path / "certs"  # local_broker_cluster makes the certificates there
    d = local_broker_cluster(tmp_path / "run", controllers=3, broker_sets=1, replicas=2,
                             base_port=free_port_run(7), broker_args=ALL_ACK, tls_dir=certs)
    with d, d.client("b0") as c:
        master, slave = the_master(d), the_slave(d)
        wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2")
        assert c.send(b"secret").index == 0
        wait_until(lambda: bodies_at(c, d.specs[slave].address) == [b"secret"], 30, "replicated over TLS")
        d.kill_broker(master)
        wait_until(lambda: d.info(slave).role == "MASTER", 30, "failover")
        assert c.send(b"after").index == 1
        with BrokerClient(d.controller, "b0", timeout=2.0) as plain, pytest.raises(DLedgerError):
            plain.send(b"no certificate")
