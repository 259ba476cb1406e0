"""Issue 26's controller-mode attacks replayed against real controller and broker processes
(`local_broker_cluster`), each asserting its outcome: refused with its code, nothing changed or
persisted, no acknowledged send lost.

Without TLS (loopback only) every connection may send anything, so what must hold there is
that forgeries do no harm: a NOTIFY is only a hint (the broker asks the controller leader), an
alter must come over the master's heartbeat connection, a heartbeat forged on another
connection and closed does not end a lease. With mutual TLS the certificates decide: a client
certificate steers nothing and is no replica, a replica's certificate speaks for its own id.

Waits are for conditions with generous deadlines; nothing timed is asserted (the lease test
compares when the election was seen with the lease's deadline, with margins of seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.broker.client import BrokerClient
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_packets import Ack, Handshake
from dledger.broker.local import local_broker_cluster
from dledger.broker.server import EPOCH_FILE
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import RequestCode, ResponseCode
from dledger.controller import messages as m
from dledger.controller.client import ControllerClient
from dledger.local_cluster import client_tls
from dledger.ports import free_port_run
from dledger.runtime.transport import Message, TransportClient
from dledger.security.certs import broker_file_stem
from dledger.security.tls import TlsConfig, client_context
from integration.harness import wait_until

pytestmark = pytest.mark.integration

ALL_ACK = ["--all-ack-in-sync-state-set"]
NOTIFY = int(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)
UNAUTHENTICATED = int(ResponseCode.UNAUTHENTICATED)
LEASE_S = 1.0  # the brokers' lease_ms default
HEARTBEAT_S = 0.3  # their heartbeat_interval_ms default
DRIFT_S = 2.5  # broker_lease_drift_ms in the lease test


def deployment(root: Path, sets: int = 1, tls: bool = False) -> local_broker_cluster:
    base = free_port_run(3 + 2 * 2 * sets)
    return local_broker_cluster(root, controllers=3, broker_sets=sets, replicas=2, base_port=base,
                                broker_args=ALL_ACK, tls_dir=root / "tls" if tls else None)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_broker_cluster]:
    """The default deployment: no TLS, loopback only, one set of two replicas."""
    with deployment(tmp_path_factory.mktemp("plain")) as d:
        yield d


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_broker_cluster]:
    """Mutual TLS, two sets of two replicas."""
    with deployment(tmp_path_factory.mktemp("secure"), sets=2, tls=True) as d:
        yield d


# --- helpers -------------------------------------------------------------------------------


def master_and_slave(d: local_broker_cluster, broker: str = "b0") -> tuple[str, str]:
    """The set's master once both replicas are in its SyncStateSet, and the other replica."""
    def ready() -> str | None:
        key = d.master_of(broker)
        return key if key and len(d.info(key).sync_state_set) == 2 else None

    master = wait_until(ready, 60, f"{broker}: a master with both replicas in sync")
    wait_until(lambda: electing(d), 60, "a controller leader past its grace (it would elect)")
    return master, next(k for k in d.specs if k != master and d.specs[k].name == broker)


def electing(d: local_broker_cluster) -> bool:
    """The controller leader has led for one heartbeat timeout: it elects for dead masters
    (before that nothing an attacker does can cause an election, so the replays would prove
    nothing)."""
    async def ask() -> bool:
        async with controllers(d, d.tls) as c:
            return any(not isinstance(v, str) and v.is_leader and v.electing for v in (await c.metadata()).values())

    return asyncio.run(ask())


def controllers(d: local_broker_cluster, tls: TlsConfig | None = None) -> ControllerClient:
    return ControllerClient(d.controller, timeout=10.0, tls=tls)


def replica_info(d: local_broker_cluster, broker: str = "b0") -> m.Response:
    async def ask() -> m.Response:
        async with controllers(d, d.tls) as c:
            return await c.get_replica_info(broker)

    resp = asyncio.run(ask())
    assert resp.code == RC.SUCCESS, resp
    return resp


def raw(address: str, code: int, meta: bytes, tls: TlsConfig | None = None) -> Message:
    """One frame on a connection of its own, as an attacker with a socket sends it."""
    async def go() -> Message:
        t = TransportClient(ssl=client_context(tls) if tls else None)
        try:
            return await t.request(address, Message(code, meta), 10.0)
        finally:
            await t.close()

    return asyncio.run(go())


def ask_each(d: local_broker_cluster, req: m.Request, tls: TlsConfig | None) -> list[m.Response]:
    """`req` to every controller, on connections of the sender's own."""
    async def go() -> list[m.Response]:
        async with controllers(d, tls) as c:
            return [await c.call_at(a, req) for a in c.addresses]

    return asyncio.run(go())


def forge_heartbeats_then_close(d: local_broker_cluster, broker_id: int, times: int = 1) -> None:
    """A heartbeat for `broker_id` saying lease_ms=0 on the attacker's own connection to
    every controller, then those connections closed."""
    hb = m.encode(m.BrokerHeartbeat("DefaultCluster", "127.0.0.1:1", "b0", broker_id, lease_ms=0))

    async def go() -> None:
        for _ in range(times):
            t = TransportClient()
            try:
                for port in d.controller_ports:
                    await t.request(f"127.0.0.1:{port}", Message(int(RequestCode.BROKER_HEARTBEAT), hb), 10.0)
            finally:
                await t.close()

    asyncio.run(go())


def epochs_on_disk(d: local_broker_cluster, key: str) -> list[int]:
    return [e.epoch for e in EpochFileCache(d.specs[key].store_dir / EPOCH_FILE).entries]


def send_all(c: BrokerClient, prefix: str, n: int) -> dict[int, bytes]:
    return {c.send(f"{prefix}{i}".encode()).index: f"{prefix}{i}".encode() for i in range(n)}


def assert_kept(d: local_broker_cluster, c: BrokerClient, acked: dict[int, bytes]) -> None:
    """Every acknowledged send is on every replica of the set, at its index."""
    for key, spec in d.specs.items():
        if spec.name != "b0" or key not in d.brokers:
            continue

        def held(address: str = spec.address) -> bool:
            got = {r.index: r.body for r in c.read(0, 10_000, replica=address)}
            return all(got.get(i) == body for i, body in acked.items())

        wait_until(held, 30, f"every acknowledged send on {key}")


def lease_deadline(d: local_broker_cluster, key: str) -> float:
    """A time (monotonic) before which the replica's lease surely does not end."""
    before = time.monotonic()
    return before + d.info(key).lease_ms_left / 1000


def ha_handshake_refused(address: str, tls: TlsConfig, broker_id: int) -> bool:
    """Connect to an HA port with `tls`, handshake as `broker_id`: True when the master closes
    the connection without answering."""
    host, _, port = address.rpartition(":")

    async def go() -> bytes:
        try:
            reader, writer = await asyncio.open_connection(host, int(port), ssl=client_context(tls))
        except (OSError, ConnectionError):
            return b""
        try:
            writer.write(Handshake(broker_id).encode() + Ack(0).encode())
            await writer.drain()
            async with asyncio.timeout(30):
                return await reader.read(1 << 16)
        except (OSError, ConnectionError):
            return b""
        finally:
            writer.close()

    return asyncio.run(go()) == b""


# --- without TLS: forgeries do no harm -------------------------------------------------------


def test_forged_notifies_change_nothing_and_persist_nothing(plain: local_broker_cluster) -> None:
    """Issue 26: two forged NOTIFYs (the slave told it is master at epoch E+1, the master told
    it is that slave's slave) plus a fake HA master erased every acknowledged record; one with
    epoch 2**31-1 left the set without a master and was written into the epoch file. A NOTIFY
    is now only a hint: the broker asks the controller leader, which holds none of it."""
    d = plain
    master, slave = master_and_slave(d)
    fake_ha = socket.create_server(("127.0.0.1", 0))
    fake_ha.setblocking(False)
    fake = f"127.0.0.1:{fake_ha.getsockname()[1]}"
    with fake_ha, d.client("b0") as c:
        acked = send_all(c, "before-", 30)
        truth = replica_info(d)
        ids = {k: d.info(k).broker_id for k in (master, slave)}
        queries = {k: d.info(k).replica_info_queries for k in (master, slave)}
        e = truth.master_epoch or 0
        notes = [(slave, m.NotifyBrokerRoleChanged("b0", f"{d.specs[slave].address}|{fake}", e + 1, e + 1,
                                                   ids[slave], [ids[slave]])),
                 (master, m.NotifyBrokerRoleChanged("b0", f"127.0.0.1:1|{fake}", e + 1, e + 1, ids[slave],
                                                    [ids[slave]]))]
        notes += [(k, m.NotifyBrokerRoleChanged("b0", f"127.0.0.1:1|{fake}", 2**31 - 1, 2**31 - 1, 99, [99]))
                  for k in (slave, master)]
        for key, note in notes:
            assert raw(d.specs[key].address, NOTIFY, m.encode(note)).code == ResponseCode.SUCCESS  # a hint, taken
        def asked_again() -> bool:  # each asked the controller after the hints, and once more
            return all(d.info(k).replica_info_queries >= n + 2 for k, n in queries.items())

        wait_until(asked_again, 30, "both replicas asked the controller again")
        after = replica_info(d)
        assert (after.master_broker_id, after.master_epoch) == (truth.master_broker_id, truth.master_epoch)
        assert d.info(master).role == "MASTER" and d.info(slave).role == "SLAVE"
        assert {d.info(k).master_epoch for k in (master, slave)} == {truth.master_epoch}
        for key in (master, slave):
            assert max(epochs_on_disk(d, key)) <= (after.master_epoch or 0), epochs_on_disk(d, key)
        with pytest.raises(BlockingIOError):
            fake_ha.accept()  # nobody connected to the fake HA master
        acked |= send_all(c, "after-", 30)
        assert_kept(d, c, acked)


def test_a_burst_of_notifies_costs_one_query_at_a_time(plain: local_broker_cluster) -> None:
    """Many NOTIFYs in a burst: at most one replica-info query in flight (and one after it)."""
    d = plain
    _, slave = master_and_slave(d)
    before = d.info(slave).replica_info_queries
    note = m.encode(m.NotifyBrokerRoleChanged("b0", "127.0.0.1:1", 2**31 - 1, 0, 99, [99]))

    async def burst() -> list[int]:
        t = TransportClient()
        try:
            answers = await asyncio.gather(*(t.request(d.specs[slave].address, Message(NOTIFY, note), 30.0)
                                             for _ in range(300)))
        finally:
            await t.close()
        return [a.code for a in answers]

    assert set(asyncio.run(burst())) == {ResponseCode.SUCCESS}
    asked = wait_until(lambda: d.info(slave).replica_info_queries - before or None, 30, "a query after the burst")
    assert asked < 100, asked  # one per hint would be 300
    assert d.info(slave).role == "SLAVE"


def test_an_alter_from_anyone_but_the_master_is_refused(plain: local_broker_cluster) -> None:
    """Issue 26: an alter-sync-state-set from a non-master with the current (readable) epochs
    was accepted. It must come over the connection the master's own heartbeats arrive on."""
    d = plain
    master, _ = master_and_slave(d)
    truth = replica_info(d)
    master_id = truth.master_broker_id
    assert master_id is not None
    shrink = m.AlterSyncStateSet("b0", master_id, truth.master_epoch or 0, [master_id],
                                 truth.sync_state_set_epoch or 0)
    answers = ask_each(d, shrink, None)
    assert UNAUTHENTICATED in {a.code for a in answers}, answers  # the leader's answer
    assert {a.code for a in answers} <= {UNAUTHENTICATED, RC.CONTROLLER_NOT_LEADER}
    leader = next(a for a in answers if a.code == UNAUTHENTICATED)
    assert "heartbeats" in leader.remark
    after = replica_info(d)
    assert (after.sync_state_set, after.sync_state_set_epoch) == (truth.sync_state_set, truth.sync_state_set_epoch)
    with d.client("b0") as c:
        assert c.send(b"still two copies").epoch == truth.master_epoch
    assert len(d.info(master).sync_state_set) == 2


def test_a_forged_heartbeat_then_a_closed_connection_fails_nobody_over(plain: local_broker_cluster) -> None:
    """Issue 26: a heartbeat forged for the master on the attacker's own connection, then
    closed, made the controller fail the master over at once while its lease ran: two leased
    masters. The master keeps its role; it is granted its lease again after the forgeries."""
    d = plain
    master, _ = master_and_slave(d)
    truth = replica_info(d)
    assert truth.master_broker_id is not None
    forge_heartbeats_then_close(d, truth.master_broker_id, times=5)
    forged_at = time.monotonic()
    wait_until(lambda: lease_deadline(d, master) > forged_at + LEASE_S, 30, "a lease granted after the forgeries")
    after = replica_info(d)
    assert (after.master_broker_id, after.master_epoch) == (truth.master_broker_id, truth.master_epoch)
    with d.client("b0") as c:
        assert c.send(b"same master").epoch == truth.master_epoch


def test_a_forged_close_does_not_shorten_a_stopped_masters_lease(tmp_path: Path) -> None:
    """The master stops (SIGSTOP: its heartbeats stop, its connections stay open) and a
    heartbeat forged for it on another connection is closed at once: the controller must not
    elect before the master's lease plus drift ran out. The drift is raised to 2.5 s so the
    comparison has seconds of margin: the last replica-info poll that still saw the old epoch
    was sent after the lease's latest possible end."""
    with deployment(tmp_path) as d:
        master, slave = master_and_slave(d)
        props = f"broker_lease_drift_ms={int(DRIFT_S * 1000)}\nbroker_heartbeat_timeout_ms=5000\n"
        assert all(r.code == RC.SUCCESS for r in ask_each(d, m.UpdateControllerConfig(props), None))
        wait_until(lambda: electing(d), 60, "the leader past its grace (one heartbeat timeout, now 5 s)")
        with d.client("b0", timeout=3.0) as c:
            acked = send_all(c, "before-", 20)
        truth = replica_info(d)
        old = truth.master_epoch
        assert truth.master_broker_id is not None
        pid = d.brokers[master].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            forge_heartbeats_then_close(d, truth.master_broker_id)
            polls = asyncio.run(_poll_until_new_epoch(d, old or 0))
        finally:
            os.kill(pid, signal.SIGCONT)
        # its last heartbeat reached the controllers at most one heartbeat interval before the
        # stop: no election may come before that + lease + drift. The last answer that still
        # named the old epoch was given before the election (polls go every 20 ms: 0.2 s slack)
        earliest = stopped - HEARTBEAT_S + LEASE_S + DRIFT_S
        last_old = max((t for t, epoch in polls if epoch == old), default=stopped)
        assert last_old >= earliest - 0.2, f"elected within {last_old - stopped:.3f} s of the stop, inside the " \
                                           f"lease and its drift ({earliest - stopped:.1f} s)"
        wait_until(lambda: d.info(slave).role == "MASTER", 60, "the slave became master")
        with d.client("b0", timeout=10.0) as c:
            acked |= send_all(c, "after-", 5)
            assert_kept(d, c, acked)


async def _poll_until_new_epoch(d: local_broker_cluster, old: int) -> list[tuple[float, int | None]]:
    """(answer time, master epoch) of replica-info polls until the epoch moved past `old`."""
    polls: list[tuple[float, int | None]] = []
    deadline = time.monotonic() + 60
    async with controllers(d) as c:
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                resp = await c.get_replica_info("b0")
                if resp.code == RC.SUCCESS:
                    polls.append((time.monotonic(), resp.master_epoch))
                    if (resp.master_epoch or 0) > old:
                        return polls
            await asyncio.sleep(0.02)
    raise AssertionError(f"no election within 60 s: {polls[-3:]}")


# --- with TLS: certificates decide ------------------------------------------------------------


def replica_tls(d: local_broker_cluster, key: str) -> TlsConfig:
    t = client_tls(d.tls_dir, broker_file_stem(key))
    assert t is not None
    return t


def test_a_client_certificate_cannot_steer_or_pose_as_a_replica(secure: local_broker_cluster) -> None:
    """Issue 26: the CA's ordinary client certificate could update the controller config
    (broker_heartbeat_timeout_ms=1 stopped every set), clean a live set for good, force
    elections, beat for any broker, and ack as a slave. Each is refused 430."""
    d = secure
    master, slave = master_and_slave(d)
    truth = replica_info(d)
    assert truth.master_broker_id is not None
    slave_id = d.info(slave).broker_id
    steer: list[m.Request] = [
        m.UpdateControllerConfig("broker_heartbeat_timeout_ms=1\nenable_elect_unclean_master=true\n"),
        m.CleanBrokerData("DefaultCluster", "b0", clean_living_broker=True),
        m.ElectMaster("DefaultCluster", "b0", slave_id, designate_elect=True),
        m.ElectMaster(broker_name="b0"),
        m.ElectMaster("DefaultCluster", "b0", slave_id),
        m.BrokerHeartbeat("DefaultCluster", "127.0.0.1:1", "b0", truth.master_broker_id, lease_ms=0),
        m.BrokerHeartbeat("DefaultCluster", "127.0.0.1:1", "b0", 7),
        m.AlterSyncStateSet("b0", truth.master_broker_id, truth.master_epoch or 0, [truth.master_broker_id],
                            truth.sync_state_set_epoch or 0),
    ]
    for req in steer:
        answers = ask_each(d, req, d.tls)
        assert {a.code for a in answers} == {UNAUTHENTICATED}, (type(req).__name__, answers)

    async def config() -> str:
        async with controllers(d, d.admin_tls) as c:
            return (await c.call_at(c.addresses[0], m.GetControllerConfig())).properties or ""

    assert "broker_heartbeat_timeout_ms=1500" in asyncio.run(config())
    assert d.tls is not None and ha_handshake_refused(f"127.0.0.1:{d.specs[master].ha_port}", d.tls, slave_id)
    after = replica_info(d)
    assert (after.master_broker_id, after.master_epoch, after.sync_state_set) == (
        truth.master_broker_id, truth.master_epoch, truth.sync_state_set)
    with d.client("b0") as c:
        assert c.send(b"all-ack, both copies").epoch == truth.master_epoch


def test_only_a_controller_certificate_may_notify_a_broker(secure: local_broker_cluster) -> None:
    d = secure
    master, slave = master_and_slave(d)
    note = m.encode(m.NotifyBrokerRoleChanged("b0", "127.0.0.1:1", 2**31 - 1, 0, 99, [99]))
    for who, tls in (("client", d.tls), ("admin", d.admin_tls), ("replica", replica_tls(d, master))):
        r = raw(d.specs[slave].address, NOTIFY, note, tls)
        assert r.code == UNAUTHENTICATED and b"controller role" in r.meta, (who, r)
    controller = client_tls(d.tls_dir, "c0")
    assert raw(d.specs[slave].address, NOTIFY, note, controller).code == ResponseCode.SUCCESS  # a hint, taken
    assert d.info(slave).role == "SLAVE"


def test_a_replica_certificate_speaks_only_for_its_own_id(secure: local_broker_cluster) -> None:
    """A replica of b0 cannot beat, alter, register or ask for an election for b1, nor for
    another id of b0, and cannot handshake with b0's master as another replica."""
    d = secure
    master, slave = master_and_slave(d)
    other_master, _ = master_and_slave(d, "b1")
    b0, b1 = replica_info(d), replica_info(d, "b1")
    assert b0.principals is not None and sorted(b0.principals.values()) == sorted(
        k for k in d.specs if k.startswith("b0/"))
    master_id, slave_id = d.info(master).broker_id, d.info(slave).broker_id
    assert b0.principals[master_id] == master and b0.principals[slave_id] == slave
    tls = replica_tls(d, slave)

    def alter(info: m.Response, broker: str) -> m.AlterSyncStateSet:
        mid = info.master_broker_id or 0
        return m.AlterSyncStateSet(broker, mid, info.master_epoch or 0, [mid], info.sync_state_set_epoch or 0)

    b1_master = d.info(other_master).broker_id
    forged: list[m.Request] = [
        m.BrokerHeartbeat("DefaultCluster", "127.0.0.1:1", "b1", b1_master, lease_ms=0),
        alter(b1, "b1"),
        m.BrokerHeartbeat("DefaultCluster", "127.0.0.1:1", "b0", master_id, lease_ms=0),
        alter(b0, "b0"),
        m.ElectMaster("DefaultCluster", "b0", master_id),
    ]
    for req in forged:
        answers = ask_each(d, req, tls)
        codes = {a.code for a in answers}
        if isinstance(req, m.BrokerHeartbeat):  # every controller answers heartbeats
            assert codes == {UNAUTHENTICATED}, (req, answers)
        else:  # the leader refuses; the others send the sender to it
            assert UNAUTHENTICATED in codes and codes <= {UNAUTHENTICATED, RC.CONTROLLER_NOT_LEADER}, (req, answers)

    async def register() -> m.Response:
        async with controllers(d, tls) as c:
            return await c.register_broker("DefaultCluster", "b0", master_id, "127.0.0.1:1")

    assert asyncio.run(register()).code == UNAUTHENTICATED
    ha = f"127.0.0.1:{d.specs[master].ha_port}"
    assert ha_handshake_refused(ha, replica_tls(d, master), slave_id)  # the master's certificate as the slave
    assert ha_handshake_refused(ha, replica_tls(d, other_master), slave_id)  # b1's replica at b0's master
    assert ha_handshake_refused(ha, tls, 9)  # an id bound to nobody
    after = replica_info(d)
    assert (after.master_broker_id, after.master_epoch, after.sync_state_set, after.sync_state_set_epoch) == (
        b0.master_broker_id, b0.master_epoch, b0.sync_state_set, b0.sync_state_set_epoch)
    assert replica_info(d, "b1").master_epoch == b1.master_epoch
    assert d.info(slave).role == "SLAVE"
    with d.client("b0") as c:
        assert c.send(b"both copies").epoch == b0.master_epoch



def test_pipelined_long_polls_are_answered_beyond_a_cap(plain: local_broker_cluster) -> None:
    """200,000 PULLs pipelined with a 60 s wait on one connection (5 MB sent) parked as many
    tasks, each woken on every send: the master was deposed and the set flapped for 30 s. A
    connection now parks at most PARKED_PER_CONNECTION polls; the rest are answered at once."""
    from dledger.broker import messages as bm
    from dledger.broker.server import PARKED_PER_CONNECTION

    d = plain
    master, _ = master_and_slave(d)
    with d.client("b0") as c:
        end = c.send(b"before the polls").index
        poll = bm.encode(bm.PullRequest("b0", end + 1, 100, 60_000))

        async def flood() -> int:
            t = TransportClient()
            try:
                calls = [asyncio.ensure_future(t.request(d.specs[master].address,
                                                         Message(RequestCode.PULL_MESSAGE, poll), 90.0))
                         for _ in range(2_000)]
                deadline = time.monotonic() + 30  # well inside the polls' own 60 s wait
                while time.monotonic() < deadline:
                    answered = sum(1 for f in calls if f.done() and f.exception() is None)
                    if answered >= len(calls) - PARKED_PER_CONNECTION:
                        break
                    await asyncio.sleep(0.1)
                for f in calls:
                    f.cancel()
                return answered
            finally:
                await t.close()

        answered = asyncio.run(flood())
        assert answered >= 2_000 - PARKED_PER_CONNECTION, answered
        assert c.send(b"after the polls").index == end + 1
    assert d.master_of("b0") == master
