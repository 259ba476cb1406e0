"""The controller leader's decisions (controller.leader), one test per rule, without a network:
time is passed in, outputs are values. Then the group's in-process API the controller
service drives them through (GroupRuntime.propose/query/status, DLedgerServer.mount), on a
real single-member group."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import pytest

from dledger.codes import ControllerResponseCode as RC
from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.elect_policy import LiveInfo
from dledger.controller.leader import ControllerLeader, Notify, Propose, Refuse, Wait
from dledger.controller.machine import BrokerSetBrief, ControllerStateMachine
from dledger.controller.service import ControllerService
from dledger.core.messages import AppendRequest, GetRequest, QueryRequest, ReadRequest, encode
from dledger.ports import free_ports
from dledger.runtime.server import DLedgerServer, GroupRefused, GroupRuntime, ServiceMount
from dledger.runtime.transport import Caller, Message, Respond, TransportClient
from dledger.security.roles import ALL_ROLES, Access
from dledger.statemachine.api import AppliedEntry

TIMEOUT, DRIFT = 1500, 200  # the heartbeat timeout (the new leader's grace) and the lease drift
SET = BrokerSetBrief("b", 1, 1, frozenset({1, 2}), frozenset({1, 2}))  # master 1 at epoch 1, 2 in sync


def _leader(**kw: object) -> ControllerLeader:
    return ControllerLeader(ControllerConfig(broker_heartbeat_timeout_ms=TIMEOUT, broker_lease_drift_ms=DRIFT,
                                             **kw))  # type: ignore[arg-type]


def _beat(c: ControllerLeader, broker_id: int, now: int, conn: Hashable = "c", *, epoch: int = 1,
          lease_ms: int = 0, sure: bool = True) -> m.Response:
    return c.heartbeat(m.BrokerHeartbeat("k", f"h{broker_id}:1", "b", broker_id, epoch=epoch, lease_ms=lease_ms),
                       now, conn, sure)


def _leading(c: ControllerLeader, since: int = 0) -> None:
    """Lead at term 1 from `since`, past the grace, both brokers beating until then."""
    assert c.tick(since, 1, [SET]) == []
    for t in range(since, since + TIMEOUT + 1, 300):
        _beat(c, 1, t, "m")
        _beat(c, 2, t, "s")


# --- the scan ----------------------------------------------------------------------------------


def test_a_new_leader_elects_nothing_for_one_heartbeat_timeout() -> None:
    """#5712: a leader that has not yet heard every broker would see them all dead."""
    c = _leader()
    _beat(c, 2, 5000)  # only the replica beats: the master is dead
    assert c.tick(5000, 7, [SET]) == []
    _beat(c, 2, 6400)
    assert c.tick(6499, 7, [SET]) == []
    assert c.tick(6500, 7, [SET]) == [m.ElectMaster(broker_name="b")]


def test_the_grace_starts_again_with_each_term() -> None:
    c = _leader()
    _leading(c)
    assert c.may_elect(1, TIMEOUT)
    c.tick(2000, None)  # lost leadership
    assert c.tick(2100, 2, [SET]) == [] and not c.may_elect(2, 2100 + TIMEOUT - 1)
    assert c.may_elect(2, 2100 + TIMEOUT)


def test_the_scan_elects_once_the_master_s_heartbeats_timed_out_not_before() -> None:
    c = _leader()
    _leading(c)  # the master's last heartbeat at 1500
    for t in range(1800, 3100, 300):
        _beat(c, 2, t, "s")
    assert c.tick(3000, 1, [SET]) == []
    assert c.tick(3001, 1, [SET]) == [m.ElectMaster(broker_name="b")]


def test_the_scan_elects_only_once_the_lease_and_drift_ended() -> None:
    """The master's lease granted at 1600 holds the set until 1600 + 1000 + 200, whatever
    happens to its connection."""
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    c.connection_closed("m", 1700)  # its process is gone
    _beat(c, 2, 2500, "s")
    assert c.tick(2800, 1, [SET]) == []
    assert c.tick(2801, 1, [SET]) == [m.ElectMaster(broker_name="b")]


def test_no_election_while_no_replica_lives() -> None:
    c = _leader()
    _leading(c)
    assert c.tick(5000, 1, [SET]) == []  # master and replica both silent


def test_a_set_without_master_is_elected_for_once_a_candidate_lives() -> None:
    """After a failed election (no master, epoch > 0): a SyncStateSet member, or any replica
    when unclean elections are enabled."""
    orphan = BrokerSetBrief("b", None, 2, frozenset({1}), frozenset({1, 2}))
    c = _leader()
    _leading(c)
    for t in (3000, 3300):
        _beat(c, 2, t, "s")
    assert c.tick(3400, 1, [orphan]) == []  # 2 lives, but is not in sync
    _beat(c, 1, 3400, "m")
    assert c.tick(3400, 1, [orphan]) == [m.ElectMaster(broker_name="b")]
    u = _leader(enable_elect_unclean_master=True)
    _leading(u)
    _beat(u, 2, 3300, "s")
    assert u.tick(3400, 1, [orphan]) == [m.ElectMaster(broker_name="b")]


def test_one_scan_election_per_set_at_a_time() -> None:
    c = _leader()
    _leading(c)
    _beat(c, 2, 3000, "s")
    assert c.tick(3100, 1, [SET]) == [m.ElectMaster(broker_name="b")]
    assert c.tick(3200, 1, [SET]) == []  # still in flight
    c.scan_election_done("b", m.Response(int(RC.CONTROLLER_ELECT_MASTER_FAILED)))
    assert c.elections == 0
    assert c.tick(3300, 1, [SET]) == [m.ElectMaster(broker_name="b")]
    c.scan_election_done("b", m.Response(master_broker_id=2, master_epoch=2))
    assert c.elections == 1


def test_a_follower_scans_nothing_and_forgets_the_masters() -> None:
    """Not leading: no elections, and (its masters forgotten) no lease grants until a scan as
    leader learns the masters again."""
    c = _leader()
    _leading(c)
    _beat(c, 2, 3000, "s")
    assert c.tick(3100, None, [SET]) == []
    assert not _beat(c, 1, 3100, "m", lease_ms=1000).lease_granted


def test_a_cleaned_set_is_not_elected_for_and_its_master_gets_no_lease() -> None:
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    assert c.tick(1700, 1, []) == []  # an admin cleaned set b: the state no longer holds it
    assert not _beat(c, 1, 1800, "m", lease_ms=1000).lease_granted
    _beat(c, 2, 3900, "s")
    assert c.tick(4000, 1, []) == []


def test_the_scan_expires_dead_brokers() -> None:
    c = _leader()
    _beat(c, 1, 0)
    c.tick(TIMEOUT + 1, None)
    assert c.table.brokers == {}


# --- heartbeats, leases, alters, commands -------------------------------------------------------


def test_a_lease_goes_only_to_the_known_master_of_a_sure_leader() -> None:
    c = _leader()
    _leading(c)
    assert not _beat(c, 1, 1600, "m", lease_ms=1000, sure=False).lease_granted  # its Raft lease may have ended
    assert not _beat(c, 2, 1600, "s", lease_ms=1000).lease_granted  # not the master
    assert not _beat(c, 1, 1600, "m", lease_ms=1000, epoch=0).lease_granted  # an old epoch's master
    assert not _beat(c, 1, 1600, "m", lease_ms=TIMEOUT).lease_granted  # lease + drift past the timeout
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted


def test_a_lease_end_never_moves_back() -> None:
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    _beat(c, 1, 1700, "m")  # lease_ms=0 (a forgery, or a master that lost its role)
    c.connection_closed("m", 1700)
    assert c.election_step(m.ElectMaster("k", "b", 2, designate_elect=True), 1800) == Wait(1000)


def test_an_alter_comes_over_the_master_s_own_heartbeat_connection() -> None:
    c = _leader()
    _beat(c, 1, 0, "m")
    alter = m.AlterSyncStateSet("b", 1, 1, [1, 2], 1)
    assert c.alter_refusal(alter, "m") is None
    _beat(c, 1, 10, "forger")  # a heartbeat forged on another connection does not move the home
    assert c.alter_refusal(alter, "forger") is not None


def test_a_command_carries_the_leader_s_facts() -> None:
    c = _leader(enable_elect_unclean_master=True)
    _beat(c, 1, 0)
    req = m.GetSyncStateData(["b", "x"])
    assert c.command(req, 10, "cn") == m.Command(req, {"b": {1: LiveInfo(1, -1)}, "x": {}}, True, "cn")
    reg = m.RegisterBroker("k", "b", 1, "h1:1")
    assert c.command(reg, TIMEOUT + 1) == m.Command(reg, {"b": {}}, True, "")


# --- elections -------------------------------------------------------------------------------


def test_an_election_waits_out_the_lease_then_is_proposed_with_its_facts() -> None:
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    c.connection_closed("m", 1600)
    _beat(c, 2, 2000, "s")
    req = m.ElectMaster("k", "b", 2, designate_elect=True)  # an admin's: it would replace the lease holder
    assert c.election_step(req, 2000, deadline_ms=9000) == Wait(800)
    assert c.election_step(req, 2799, deadline_ms=9000) == Wait(1)
    assert c.election_step(req, 2801, principal="cn") == Propose(
        m.Command(req, {"b": {2: LiveInfo(1, -1)}}, False, "cn"))


def test_an_election_past_its_deadline_is_refused() -> None:
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    step = c.election_step(m.ElectMaster("k", "b", 2, designate_elect=True), 1700, deadline_ms=2000)
    assert isinstance(step, Refuse) and step.response.code == RC.CONTROLLER_ELECT_MASTER_FAILED


def test_an_election_keeping_the_live_lease_holder_goes_at_once() -> None:
    """The policy keeps a live old master: no reason to wait for its lease."""
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 1), 1700), Propose)
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 2, designate_elect=True), 1700), Wait)


def test_after_the_master_registers_again_an_election_waits_out_its_lease() -> None:
    """The registration takes the master's role away (the policy no longer keeps it), so a
    live lease holder is no reason to elect at once: a registration forged for a live
    master must not bring a second one while its lease holds. A scan that sees the new epoch
    without a master (or a newer one) keeps it so."""
    c = _leader()
    _leading(c)
    assert _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    c.command(m.RegisterBroker("k", "b", 1, "h1:1"), 1650)
    assert c.election_step(m.ElectMaster("k", "b", 1), 1700) == Wait(1100)
    c.tick(1750, 1, [BrokerSetBrief("b", None, 2, frozenset({1, 2}), frozenset({1, 2}), fresh_epoch=2)])
    assert c.election_step(m.ElectMaster("k", "b", 1), 1800) == Wait(1000)
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 1), 2800), Propose)


def test_after_a_master_restart_the_scan_waits_for_every_candidate_s_fresh_report() -> None:
    c = _leader()
    _leading(c)
    restarted = BrokerSetBrief("b", None, 2, frozenset({1, 2}), frozenset({1, 2}), fresh_epoch=2)
    for t in range(1800, 3100, 300):
        _beat(c, 1, t, "m")
        _beat(c, 2, t, "s")
    assert c.tick(3000, 1, [restarted]) == []  # both report at view -1
    c.heartbeat(m.BrokerHeartbeat("k", "h1:1", "b", 1, epoch=1, master_epoch=2), 3100, "m", True)
    assert c.tick(3100, 1, [restarted]) == []  # 2 has not reported since
    c.heartbeat(m.BrokerHeartbeat("k", "h2:1", "b", 2, epoch=1, master_epoch=2), 3200, "s", True)
    assert c.tick(3200, 1, [restarted]) == [m.ElectMaster(broker_name="b")]


def test_no_lease_while_an_election_is_in_flight_or_an_admin_revokes() -> None:
    c = _leader()
    _leading(c)
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 1), 1600), Propose)
    assert not _beat(c, 1, 1600, "m", lease_ms=1000).lease_granted
    c.election_ended("b", None, 1600)  # surely not stored (refused before the append)
    assert _beat(c, 1, 1700, "m", lease_ms=1000).lease_granted
    assert c.revoke("b", 1800) == 1100  # the wait until the lease granted at 1700 ended
    assert not _beat(c, 1, 1900, "m", lease_ms=1000).lease_granted
    c.end_revoke("b")
    assert _beat(c, 1, 2000, "m", lease_ms=1000).lease_granted


def test_an_election_whose_answer_was_lost_holds_leases_until_a_scan_shows_it_applied() -> None:
    """Timed out (or the term changed): it may still take effect, so the old master gets no
    lease until a scan reads a state applied at or past the index its entry can be at."""
    c = _leader()
    _leading(c)
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 2, designate_elect=True), 1600), Propose)
    c.election_ended("b", None, 1600, doubt=(1, 40))  # term 1, the leader's last index 40
    assert not _beat(c, 1, 1700, "m", lease_ms=1000).lease_granted
    c.tick(1800, 1, [SET])  # no index known: still in doubt
    c.tick(1900, 1, [SET], applied_index=39, last_index=41)  # not yet applied that far
    assert not _beat(c, 1, 2000, "m", lease_ms=1000).lease_granted
    c.tick(2100, 1, [SET], applied_index=40, last_index=41)  # the state shows it: master 1 stays
    assert _beat(c, 1, 2200, "m", lease_ms=1000).lease_granted


def test_an_election_in_doubt_stays_so_across_a_leadership_change() -> None:
    """Not leading: still in doubt. Leading again in a newer term: the entry commits, if ever,
    at or before the new leader's last index, which the applied state must then pass."""
    c = _leader()
    _leading(c)
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 2, designate_elect=True), 1600), Propose)
    c.election_ended("b", None, 1600, doubt=(1, 40))
    c.tick(1700, None)
    c.tick(1800, 2, [SET], applied_index=45, last_index=50)  # term 2: re-bounded to 50
    for t in range(1800, 1800 + TIMEOUT + 1, 300):
        _beat(c, 1, t, "m")
    assert not _beat(c, 1, 3400, "m", lease_ms=1000).lease_granted
    c.tick(3500, 2, [SET], applied_index=50, last_index=52)
    assert _beat(c, 1, 3600, "m", lease_ms=1000).lease_granted


def test_concurrent_admin_revokes_are_counted() -> None:
    """Two admins elect in one set: the first one finishing does not let leases resume."""
    c = _leader()
    _leading(c)
    c.revoke("b", 1600)
    c.revoke("b", 1600)
    c.end_revoke("b")
    assert not _beat(c, 1, 1700, "m", lease_ms=1000).lease_granted
    c.end_revoke("b")
    assert _beat(c, 1, 1800, "m", lease_ms=1000).lease_granted


def test_an_election_s_answer_makes_its_master_the_one_leases_go_to() -> None:
    c = _leader()
    _leading(c)
    assert isinstance(c.election_step(m.ElectMaster("k", "b", 2), 1600), Propose)
    c.election_ended("b", m.Response(master_broker_id=2, master_epoch=2), 1600)
    assert not _beat(c, 1, 1700, "m", lease_ms=1000).lease_granted
    assert _beat(c, 2, 1700, "s", epoch=2, lease_ms=1000).lease_granted


# --- notifications ---------------------------------------------------------------------------


def _won(epoch: int = 2) -> m.Response:
    return m.Response(master_broker_id=2, master_address="h2:1", master_epoch=epoch, sync_state_set=[2, 3],
                      sync_state_set_epoch=5, broker_addrs={1: "h1:1|h1:2", 2: "h2:1|h2:2", 3: "h3:1"})


def test_the_set_s_live_replicas_are_told_of_a_new_master_at_their_request_address() -> None:
    c = _leader()
    _beat(c, 2, 0)
    _beat(c, 3, 0)  # broker 1 never beat: not told
    assert isinstance(c.election_step(m.ElectMaster(broker_name="b"), 0), Propose)
    note = m.NotifyBrokerRoleChanged("b", "h2:1", 2, 5, 2, [2, 3])
    assert c.election_ended("b", _won(), 10) == [Notify(2, "h2:1", note), Notify(3, "h3:1", note)]


def test_nobody_is_told_of_a_failed_election_or_when_pushes_are_off() -> None:
    c = _leader()
    _beat(c, 2, 0)
    assert c.election_ended("b", m.Response(int(RC.CONTROLLER_ELECT_MASTER_FAILED)), 0) == []
    assert c.election_ended("b", None, 0) == []
    off = _leader(notify_broker_role_changed=False)
    _beat(off, 2, 0)
    assert off.election_ended("b", _won(), 0) == []


def test_a_push_is_not_repeated_while_one_as_new_is_in_flight() -> None:
    c = _leader()
    _beat(c, 2, 0)
    assert len(c.election_ended("b", _won(2), 0)) == 1
    assert c.election_ended("b", _won(2), 0) == []  # the same epoch is on its way
    assert [p.note.master_epoch for p in c.election_ended("b", _won(3), 0)] == [3]  # a newer one replaces it
    c.notify_done("h2:1", 2)  # the superseded push ending changes nothing
    assert c.election_ended("b", _won(3), 0) == []
    c.notify_done("h2:1", 3)
    assert len(c.election_ended("b", _won(3), 0)) == 1


# --- the group's in-process API (a real single-member group) ---------------------------------


def _member(tmp_path: Path, metrics: bool = False) -> tuple[DLedgerConfig, ControllerStateMachine]:
    port, metrics_port = free_ports(2)
    cfg = DLedgerConfig(group="ctl", self_id="c0", peers=f"c0-127.0.0.1:{port}", store_dir=str(tmp_path),
                        store_type="memory", metrics_port=metrics_port if metrics else 0)
    return cfg, ControllerStateMachine()


def _client_requests(server: DLedgerServer) -> dict[tuple[str, str], float]:
    """dledger_requests_total of kind client: (request, code) -> value."""
    assert server.metrics is not None
    return {(s.labels["request"], s.labels["code"]): s.value for fam in server.metrics.registry.collect()
            for s in fam.samples if s.name == "dledger_requests_total" and s.labels["kind"] == "client"}


async def _leader_status(g: GroupRuntime, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not g.status().is_leader:
        assert time.monotonic() < deadline, "no leader"
        await asyncio.sleep(0.05)


def test_propose_query_and_status_without_the_wire(tmp_path: Path) -> None:
    """Counted as a client's requests still (docs/metrics.md: the service is the group's client)."""
    cfg, machine = _member(tmp_path, metrics=True)

    async def main() -> None:
        server = DLedgerServer(cfg, {"ctl": machine})
        await server.start()
        try:
            g = server.groups["ctl"]
            await _leader_status(g)
            st, me = g.status(), cfg.peer_map["c0"].address
            assert (st.group, st.self_id, st.leader_id, st.leader_address, st.members) == \
                ("ctl", "c0", "c0", me, (("c0", me),))
            apply = m.Command(m.ApplyBrokerId("k", "b", 1, "h1:1;x"))
            assert m.decode_response(await g.propose(m.encode(apply))).code == RC.SUCCESS
            assert g.status().applied_index >= 0
            answer = m.decode_response(await g.query(m.encode(m.Command(m.GetNextBrokerId("k", "b")))))
            assert answer.next_broker_id == 2
            with pytest.raises(GroupRefused) as e:  # a write is not a read
                await g.query(m.encode(apply))
            assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
            assert machine.state.get("b") is not None
            briefs = await g.read_state(machine.brief)
            assert [b.name for b in briefs] == ["b"]
            assert _client_requests(server) == {("APPEND", "SUCCESS"): 1, ("QUERY", "SUCCESS"): 1,
                                                ("QUERY", "UNEXPECTED_ARGUMENT"): 1}
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_mounted_service_is_served_sealed_and_told_of_closed_connections(tmp_path: Path) -> None:
    cfg, machine = _member(tmp_path)
    code = 59_001
    lost: list[Caller] = []
    lost_too: list[Caller] = []

    def echo(msg: Message, respond: Respond, caller: Caller) -> None:
        respond(Message(200, msg.meta))

    def failing(_: Caller) -> None:
        raise RuntimeError("a broken listener must not keep the others from hearing")

    async def main() -> None:
        server = DLedgerServer(cfg, {"ctl": machine})
        server.mount("ctl", ServiceMount({code: echo}, {code: Access("ECHO", ALL_ROLES)},
                                         connection_lost=(lost.append, failing, lost_too.append)))
        with pytest.raises(ValueError, match="already served"):
            server.mount("ctl", ServiceMount({code: echo}, {code: Access("ECHO", ALL_ROLES)}))
        with pytest.raises(ValueError, match="no group"):
            server.mount("other", ServiceMount({}, {}))
        for raft in (RequestCode.PUSH, RequestCode.READ):  # the group's own codes are not a service's to take
            with pytest.raises(ValueError, match="already served"):
                server.mount("ctl", ServiceMount({raft: echo}, {raft: Access("ECHO", ALL_ROLES)}))
        await server.start()
        try:
            await _leader_status(server.groups["ctl"])
            addr = cfg.peer_map["c0"].address
            client = TransportClient()
            try:
                assert (await client.request(addr, Message(code, b"hi"), 10)).meta == b"hi"
                append = AppendRequest("ctl", bodies=[b"x"])
                raw = await client.request(addr, Message(RequestCode.APPEND, encode(append)), 10)
                assert raw.code == ResponseCode.UNSUPPORTED  # sealed: the service writes the log
                for c, req in ((RequestCode.GET, GetRequest("ctl", index=0)),  # nor does a client read it
                               (RequestCode.READ, ReadRequest("ctl", from_index=0)),
                               (RequestCode.QUERY, QueryRequest("ctl", request=b"x"))):
                    raw = await client.request(addr, Message(c, encode(req)), 10)
                    assert raw.code == ResponseCode.UNSUPPORTED, c
            finally:
                await client.close()
            with pytest.raises(RuntimeError):
                server.register_service({code + 1: echo}, {code + 1: Access("ECHO", ALL_ROLES)})
            deadline = time.monotonic() + 30
            while not (lost and lost_too):
                assert time.monotonic() < deadline, "no listener heard the connection close"
                await asyncio.sleep(0.05)
            assert lost[0] is lost_too[0]
        finally:
            await server.stop()

    asyncio.run(main())


class _Gated(ControllerStateMachine):
    """Applies only while `gate` is set (a slow apply: a proposal's answer times out while its
    entry is still to be applied)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def apply(self, entries: Sequence[AppliedEntry]) -> list[bytes]:
        self.gate.wait(30)
        return list(super().apply(entries))


async def _eventually(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def test_a_timed_out_proposal_is_counted_with_the_answer_it_gets(tmp_path: Path) -> None:
    cfg, _ = _member(tmp_path, metrics=True)
    machine = _Gated()

    async def main() -> None:
        server = DLedgerServer(cfg, {"ctl": machine})
        await server.start()
        try:
            g = server.groups["ctl"]
            await _leader_status(g)
            machine.gate.clear()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(g.propose(m.encode(m.Command(m.ApplyBrokerId("k", "b", 1, "h1:1;x")))), 0.2)
            assert _client_requests(server) == {}
            machine.gate.set()
            await _eventually(lambda: _client_requests(server) == {("APPEND", "SUCCESS"): 1},
                              "the timed-out proposal was never counted")
        finally:
            machine.gate.set()
            await server.stop()

    asyncio.run(main())


def test_no_lease_for_the_old_master_while_a_timed_out_election_may_still_apply(tmp_path: Path) -> None:
    """An admin's election whose answer timed out ("it may still take effect"): the old master
    gets no lease until a scan reads the state the entry was applied to."""
    cfg, _ = _member(tmp_path)
    machine = _Gated()
    config = ControllerConfig(request_timeout_ms=1000, broker_heartbeat_timeout_ms=1500, broker_lease_drift_ms=200,
                              scan_interval_ms=50)

    async def main() -> None:
        server = DLedgerServer(cfg, {"ctl": machine})
        svc = ControllerService(server, "ctl", config, machine)
        await server.start()
        await svc.start()

        def beat(i: int, lease: int = 0, epoch: int = 1) -> m.Response:  # as a leader whose Raft lease holds
            return svc.leader.heartbeat(m.BrokerHeartbeat("k", f"h{i}:1", "b", i, epoch=epoch, lease_ms=lease),
                                        time.monotonic_ns() // 1_000_000, f"conn{i}", True)

        async def beating() -> None:
            while True:
                beat(1)
                beat(2)
                await asyncio.sleep(0.1)

        beats = asyncio.get_running_loop().create_task(beating())
        try:
            await _leader_status(server.groups["ctl"])
            for i in (1, 2):
                assert (await svc.submit(m.ApplyBrokerId("k", "b", i, f"h{i}:1;x"))).code == RC.SUCCESS
                assert (await svc.submit(m.RegisterBroker("k", "b", i, f"h{i}:1"))).code == RC.SUCCESS
            r = await svc.submit(m.ElectMaster("k", "b", 1))
            assert (r.code, r.master_broker_id) == (RC.SUCCESS, 1)
            assert r.master_epoch is not None and r.sync_state_set_epoch is not None
            r = await svc.submit(m.AlterSyncStateSet("b", 1, r.master_epoch, [1, 2], r.sync_state_set_epoch))
            assert r.code == RC.SUCCESS
            await _eventually(lambda: beat(1, 1000).lease_granted, "a scan never noted master 1")
            await asyncio.sleep(1.3)  # the lease (+ drift) ended: the admin's election goes at once
            machine.gate.clear()  # its entry is logged, then not applied before its answer times out
            answers: list[int] = []
            await svc._serve(m.ElectMaster("k", "b", 2, designate_elect=True), lambda msg: answers.append(msg.code),
                             "")
            assert answers == [RC.SYSTEM_ERROR]
            assert not beat(1, 1000).lease_granted  # the election may still make 2 master
            await asyncio.sleep(0.3)  # scans run; the entry is still not applied
            assert not beat(1, 1000).lease_granted
            machine.gate.set()
            await _eventually(lambda: beat(2, 1000, epoch=2).lease_granted, "the new master never got a lease")
            s = machine.state.get("b")
            assert s is not None and (s.master_id, s.master_epoch) == (2, 2)
            assert not beat(1, 1000).lease_granted
        finally:
            machine.gate.set()
            beats.cancel()
            await svc.stop()
            await server.stop()

    asyncio.run(main())


def test_a_scan_whose_leadership_changed_during_its_state_read_decides_nothing(tmp_path: Path) -> None:
    """The term and leadership a scan acts on are re-read after the state read: a member that
    stepped down meanwhile must not elect or note masters on the old term's behalf."""
    cfg, machine = _member(tmp_path)

    async def main() -> None:
        server = DLedgerServer(cfg, {"ctl": machine})
        svc = ControllerService(server, "ctl", ControllerConfig(), machine)  # not started: no scan loop
        await server.start()
        try:
            g = server.groups["ctl"]
            await _leader_status(g)
            read_state = g.read_state
            ticks: list[int | None] = []
            tick = svc.leader.tick

            async def stepping_down(fn: Callable[[], list[BrokerSetBrief]]) -> list[BrokerSetBrief]:
                out = await read_state(fn)
                g.node.step_down("test: leadership lost during the scan's state read")
                return out

            def recorded(now: int, term: int | None, *args: object) -> list[m.ElectMaster]:
                ticks.append(term)
                return tick(now, term, *args)  # type: ignore[arg-type]

            g.read_state = stepping_down  # type: ignore[method-assign,assignment]
            svc.leader.tick = recorded  # type: ignore[method-assign,assignment]
            await svc._scan()
            assert ticks == []
            g.read_state = read_state  # type: ignore[method-assign]
            await _leader_status(g)
            await svc._scan()
            assert ticks == [g.status().term]
        finally:
            await server.stop()

    asyncio.run(main())
