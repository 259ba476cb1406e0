"""The controller's requests without Raft (upstream's ReplicasInfoManagerTest,
with the same expectations; and the [improve] list): every request goes through the state
machine's apply as a log entry would, liveness is the command's facts, and docs/controller.md's guarantees
are checked after every step."""

from __future__ import annotations

import pytest

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller import processor
from dledger.controller.elect_policy import LiveInfo
from dledger.controller.machine import ControllerStateMachine
from dledger.controller.state import ElectMasterEvent
from dledger.statemachine.api import AppliedEntry, MemoryReader, MemoryWriter

B = "broker-a"


class Controller:
    """A ControllerStateMachine fed commands as log entries, checking the guarantees after each."""

    def __init__(self) -> None:
        self.sm = ControllerStateMachine()
        self.index = 0
        self.alive: dict[int, LiveInfo] = {}
        self.unclean = False
        self.events: list[object] = []
        self.principal = ""  # the sender's certificate name, as the service writes it into the command

    def live(self, *ids: int, **infos: LiveInfo) -> None:
        self.alive = {i: LiveInfo() for i in ids}
        self.alive.update({int(k[1:]): v for k, v in infos.items()})

    def __call__(self, req: m.WriteRequest | m.ReadRequest) -> m.Response:
        before = {n: (s.master_epoch, s.sync_state_set_epoch, s.master_id, set(s.sync_state_set))
                  for n, s in self.sm.state.sets.items()}
        cmd = m.Command(req, {B: dict(self.alive)}, self.unclean, self.principal)
        if isinstance(req, m.ReadRequest):
            return m.decode_response(self.sm.query(m.encode(cmd)))
        (raw,) = self.sm.apply([AppliedEntry(self.index, 1, m.encode(cmd))])
        self.index += 1
        self.events.extend(self.sm.last_events)
        resp = m.decode_response(raw)
        self._check(req, resp, before)
        return resp

    def _check(self, req: object, resp: m.Response,
               before: dict[str, tuple[int, int, int | None, set[int]]]) -> None:
        for name, s in self.sm.state.sets.items():
            if name in before:
                assert s.master_epoch >= before[name][0] and s.sync_state_set_epoch >= before[name][1]
        now = self.sm.state.get(getattr(req, "broker_name", ""))
        if resp.code == RC.SUCCESS and isinstance(req, m.ElectMaster | m.AlterSyncStateSet):
            assert now is not None and now.master_id in now.sync_state_set
        if resp.code == RC.SUCCESS and isinstance(req, m.AlterSyncStateSet):
            epoch, sss_epoch, master, _ = before[req.broker_name]
            assert (req.master_broker_id, req.master_epoch, req.sync_state_set_epoch) == (master, epoch, sss_epoch)

    def set_view(self) -> tuple[int | None, int, int, list[int]]:
        s = self.sm.state.get(B)
        assert s is not None
        return s.master_id, s.master_epoch, s.sync_state_set_epoch, sorted(s.sync_state_set)


def addr(i: int) -> str:
    return f"127.0.0.1:{9000 + i}"


def register_new_broker(c: Controller, broker_id: int, expected_master: int | None) -> None:
    """upstream's registerNewBroker helper."""
    nxt = c(m.GetNextBrokerId("cluster", B))
    assert nxt.code == RC.SUCCESS and nxt.next_broker_id == broker_id
    applied = c(m.ApplyBrokerId("cluster", B, broker_id, f"{addr(broker_id)};{broker_id}"))
    assert applied.code == RC.SUCCESS
    info = c(m.GetSyncStateData([B])).replicas_info
    assert info is not None
    assert any(r.broker_id == broker_id and r.broker_address == addr(broker_id)
               for r in info[B].not_in_sync_replicas + info[B].in_sync_replicas)
    reg = c(m.RegisterBroker("cluster", B, broker_id, addr(broker_id)))
    assert reg.code == RC.SUCCESS and reg.master_broker_id == expected_master


def mock_meta_data(c: Controller, alter: bool = True) -> None:
    """upstream's mockMetaData: 1, 2, 3 registered; 1 elected; 2 and 3 get STILL_EXIST; the
    master widens the SyncStateSet to all three."""
    c.live(1, 2, 3)
    for i in (1, 2, 3):
        register_new_broker(c, i, None)
    first = c(m.ElectMaster("cluster", B, 1))
    assert (first.code, first.master_broker_id, first.master_epoch, first.sync_state_set_epoch) == (0, 1, 1, 1)
    for i in (2, 3):
        again = c(m.ElectMaster("cluster", B, i))
        assert (again.code, again.master_broker_id, again.master_epoch) == (RC.CONTROLLER_MASTER_STILL_EXIST, 1, 1)
    if alter:
        resp = c(m.AlterSyncStateSet(B, 1, 1, [1, 2, 3], 1))
        assert resp.code == RC.SUCCESS and resp.new_sync_state_set_epoch == 2


@pytest.fixture
def c() -> Controller:
    return Controller()


def test_register_broker_success(c: Controller) -> None:
    mock_meta_data(c)
    reg = c(m.RegisterBroker("cluster", B, 2, addr(2)))
    assert (reg.master_broker_id, reg.master_epoch, reg.sync_state_set_epoch) == (1, 1, 2)
    info = c(m.GetSyncStateData([B])).replicas_info
    assert info is not None and len(info[B].in_sync_replicas) == 3 and not info[B].not_in_sync_replicas


def test_register_with_master_exist_resp(c: Controller) -> None:
    mock_meta_data(c, alter=False)
    reg = c(m.RegisterBroker("cluster", B, 3, addr(3)))
    assert reg.code == RC.SUCCESS and reg.master_broker_id == 1 and reg.master_address == addr(1)
    assert reg.sync_state_set_epoch == 1
    info = c(m.GetSyncStateData([B])).replicas_info
    assert info is not None and len(info[B].in_sync_replicas) == 1 and len(info[B].not_in_sync_replicas) == 2


def test_register_with_old_master_inactive(c: Controller) -> None:
    mock_meta_data(c)
    c.live(3)
    reg = c(m.RegisterBroker("cluster", B, 3, addr(3)))
    assert reg.master_broker_id is None  # a dead master is not named (#5631)
    won = c(m.ElectMaster("cluster", B, 3))
    assert won.code == RC.SUCCESS
    assert c.set_view() == (3, 2, 3, [3])


def test_elect_master_old_master_still_alive(c: Controller) -> None:
    mock_meta_data(c)
    assert c(m.ElectMaster(broker_name=B)).code == RC.CONTROLLER_MASTER_STILL_EXIST


def test_elect_master_prefers_higher_epoch(c: Controller) -> None:
    mock_meta_data(c)
    c.live(b2=LiveInfo(1, 2), b3=LiveInfo(0, 3))
    resp = c(m.ElectMaster(broker_name=B))
    assert (resp.code, resp.master_broker_id, resp.master_epoch) == (0, 2, 2)


def test_elect_master_prefers_higher_offset_when_epochs_are_equal(c: Controller) -> None:
    mock_meta_data(c)
    c.live(b2=LiveInfo(1, 2), b3=LiveInfo(1, 3))
    assert c(m.ElectMaster(broker_name=B)).master_broker_id == 3


def test_elect_master_prefers_lower_priority_when_epoch_and_offset_are_equal(c: Controller) -> None:
    mock_meta_data(c)
    c.live(b1=LiveInfo(1, 3, 3), b2=LiveInfo(1, 3, 2), b3=LiveInfo(1, 3, 1))
    c.alive.pop(1)  # the master is dead
    assert c(m.ElectMaster(broker_name=B)).master_broker_id == 3


def test_elect_master_offsets_2_pow_31_apart(c: Controller) -> None:
    """#10578: upstream's (int)(a - b) picked the replica 2 GiB behind."""
    mock_meta_data(c)
    c.live(b2=LiveInfo(1, 1), b3=LiveInfo(1, 1 + 2**31))
    assert c(m.ElectMaster(broker_name=B)).master_broker_id == 3


def test_elect_master(c: Controller) -> None:
    """upstream's testElectMaster: a new master when 1 dies; an admin naming dead 1 fails; an
    admin naming the current master gets STILL_EXIST; naming 1 once alive (the master dead) works."""
    mock_meta_data(c)
    c.live(2, 3)
    resp = c(m.ElectMaster(broker_name=B))
    assert resp.code == RC.SUCCESS and resp.master_broker_id != 1 and resp.master_epoch == 2
    new = resp.master_broker_id
    assert c(m.ElectMaster("cluster", B, 1, True)).code == RC.CONTROLLER_ELECT_MASTER_FAILED
    assert new is not None
    still = c(m.ElectMaster("cluster", B, new, True))
    assert still.code == RC.CONTROLLER_MASTER_STILL_EXIST
    # 1 is back and in sync again; the current master dies: the admin names 1
    assert c(m.AlterSyncStateSet(B, new, 2, [1, new], 3)).code == RC.CONTROLLER_BROKER_NOT_ALIVE
    c.live(1, new)
    assert c(m.AlterSyncStateSet(B, new, 2, [1, new], 3)).code == RC.SUCCESS
    c.live(1)
    named = c(m.ElectMaster("cluster", B, 1, True))
    assert (named.code, named.master_broker_id, named.master_epoch) == (0, 1, 3)


def test_all_replicas_shutdown_and_restart(c: Controller) -> None:
    """SyncStateSet {1}, 1 dead: one ElectMasterEvent(false), no master, epoch 2, set kept;
    the controller's retries bump nothing more (upstream: up to three epochs per failure)."""
    mock_meta_data(c, alter=False)
    c.live(2, 3)
    c.events.clear()
    for _ in range(3):
        assert c(m.ElectMaster(broker_name=B)).code == RC.CONTROLLER_MASTER_NOT_AVAILABLE
    assert c.events == [ElectMasterEvent(B, False)]
    assert c.set_view() == (None, 2, 1, [1])
    info = c(m.GetReplicaInfo(B))
    assert info.master_address is None and info.master_broker_id is None
    assert c(m.ElectMaster("cluster", B, 2)).code == RC.CONTROLLER_ELECT_MASTER_FAILED  # not in the set
    c.live(1, 2, 3)
    back = c(m.ElectMaster("cluster", B, 1))
    assert (back.code, back.master_broker_id, back.master_epoch) == (0, 1, 3)


def test_unclean_election(c: Controller) -> None:
    """testEnableElectUnCleanMaster: with unclean election a live replica outside the set wins."""
    mock_meta_data(c, alter=False)
    c.live(2)
    c.unclean = True
    resp = c(m.ElectMaster(broker_name=B))
    assert (resp.code, resp.master_broker_id) == (0, 2)
    assert c.set_view() == (2, 2, 2, [2])


def test_first_election_needs_a_registered_replica(c: Controller) -> None:
    """Ours, not upstream's: the first election took any id, registered or not."""
    c.live(1)
    register_new_broker(c, 1, None)
    assert c(m.ElectMaster("cluster", B, 7)).code == RC.CONTROLLER_ELECT_MASTER_FAILED
    assert c(m.ElectMaster("cluster", B, 7, True)).code == RC.CONTROLLER_ELECT_MASTER_FAILED
    assert c(m.ElectMaster(broker_name=B)).code == RC.CONTROLLER_MASTER_NOT_AVAILABLE  # nobody in the set yet
    assert c.set_view() == (None, 0, 0, [])  # and that moved no epoch: broker 1 can still be first
    assert c(m.ElectMaster("cluster", B, 1)).code == RC.SUCCESS
    assert c(m.ElectMaster("nope", "unknown", 1)).code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_clean_broker_data(c: Controller) -> None:
    mock_meta_data(c)
    c.live(1, 2, 3)
    alive = c(m.CleanBrokerData("cluster", B, "3"))
    assert alive.code == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    whole = c(m.CleanBrokerData("cluster", B))
    assert (whole.code, whole.remark) == (RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                                          f"Broker {B} is still alive, clean up failure")
    assert c(m.CleanBrokerData("cluster", B, "1;x")).code == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    c.live(1)
    assert c(m.CleanBrokerData("cluster", B, "2;3")).code == RC.SUCCESS
    assert c.set_view() == (1, 1, 2, [1])  # no epoch moves on a clean
    unknown = c(m.CleanBrokerData("cluster", "broker12", clean_living_broker=True))
    assert (unknown.code, unknown.remark) == (RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                                              "Broker broker12 is not existed,clean broker data failure.")
    assert c(m.CleanBrokerData("cluster", B, clean_living_broker=True)).code == RC.SUCCESS
    assert c.sm.state.get(B) is None
    assert c(m.GetReplicaInfo(B)).code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST


def test_alter_sync_state_set_checks_in_order(c: Controller) -> None:
    """upstream's validation order, each step's code; then two alters on the same epoch: one wins."""
    mock_meta_data(c, alter=False)
    assert c(m.AlterSyncStateSet("nope", 1, 1, [1, 2], 1)).code == RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
    assert c(m.AlterSyncStateSet(B, 1, 1, [1], 1)).code == RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED  # same set
    assert c(m.AlterSyncStateSet(B, 2, 1, [1, 2], 1)).code == RC.CONTROLLER_INVALID_MASTER
    assert c(m.AlterSyncStateSet(B, 1, 0, [1, 2], 1)).code == RC.CONTROLLER_FENCED_MASTER_EPOCH
    assert c(m.AlterSyncStateSet(B, 1, 1, [1, 2], 0)).code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    assert c(m.AlterSyncStateSet(B, 1, 1, [1, 9], 1)).code == RC.CONTROLLER_INVALID_REPLICAS
    c.live(1, 3)
    assert c(m.AlterSyncStateSet(B, 1, 1, [1, 2], 1)).code == RC.CONTROLLER_BROKER_NOT_ALIVE
    c.live(1, 2, 3)
    assert c(m.AlterSyncStateSet(B, 1, 1, [2, 3], 1)).code == RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED  # no master
    first, second = c(m.AlterSyncStateSet(B, 1, 1, [1, 2], 1)), c(m.AlterSyncStateSet(B, 1, 1, [1, 3], 1))
    assert (first.code, second.code) == (RC.SUCCESS, RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH)
    assert c.set_view() == (1, 1, 2, [1, 2])


def test_apply_broker_id_one_winner_and_idempotent_retries(c: Controller) -> None:
    assert c(m.ApplyBrokerId("cluster", B, 2, "a;1")).code == RC.CONTROLLER_BROKER_ID_INVALID  # 1 comes first
    assert c(m.ApplyBrokerId("cluster", B, 1, "127.0.0.1:1;1")).code == RC.SUCCESS
    assert c(m.ApplyBrokerId("cluster", B, 1, "127.0.0.1:2;2")).code == RC.CONTROLLER_BROKER_ID_INVALID
    assert c(m.ApplyBrokerId("cluster", B, 1, "127.0.0.1:1;1")).code == RC.SUCCESS  # the lost answer's retry
    s = c.sm.state.get(B)
    assert s is not None and s.next_assign_id == 2 and s.replicas[1].address == "127.0.0.1:1"


def test_register_with_a_new_address_updates_it(c: Controller) -> None:
    c.live(1)
    register_new_broker(c, 1, None)
    c.events.clear()
    assert c(m.RegisterBroker("cluster", B, 1, "10.0.0.1:1")).code == RC.SUCCESS
    s = c.sm.state.get(B)
    assert s is not None and s.replicas[1].address == "10.0.0.1:1" and len(c.events) == 1
    assert c(m.RegisterBroker("cluster", B, 5, "x")).code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert c(m.RegisterBroker("cluster", "nope", 1, "x")).code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_reads(c: Controller) -> None:
    mock_meta_data(c)
    info = c(m.GetReplicaInfo(B))
    assert (info.master_broker_id, info.master_address, info.master_epoch, info.sync_state_set) == (1, addr(1), 1,
                                                                                                     [1, 2, 3])
    data = c(m.GetSyncStateData([B, "unknown"]))
    assert data.replicas_info is not None and list(data.replicas_info) == [B]
    assert c(m.GetSyncStateData([])).code == RC.SYSTEM_ERROR
    assert c(m.ApplyBrokerId("cluster", "a-first", 1, f"{addr(7)};7")).code == RC.SUCCESS
    every = c(m.GetSyncStateData(all_sets=True)).replicas_info  # (ours: `dledger admin broker-sets`)
    assert every is not None and list(every) == ["a-first", B] and every[B] == data.replicas_info[B]
    with pytest.raises(ValueError):
        c.sm.query(m.encode(m.Command(m.ElectMaster(broker_name=B))))


def test_serialize_and_a_bad_entry(c: Controller) -> None:
    """testSerialize, through the state machine's snapshot; an entry that is not a command is
    a code-1 result and changes nothing."""
    mock_meta_data(c)
    w = MemoryWriter()
    c.sm.snapshot(w)
    other = ControllerStateMachine()
    other.restore(MemoryReader(w.files))
    assert other.state.dump() == c.sm.state.dump() and other.state.get(B) == c.sm.state.get(B)
    other.restore(None)
    assert other.state.sets == {}
    before = c.sm.state.dump()
    (raw,) = c.sm.apply([AppliedEntry(99, 1, b"\xc1 not a command")])
    assert m.decode_response(raw).code == RC.SYSTEM_ERROR and c.sm.state.dump() == before


def test_the_state_is_bounded(c: Controller, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any client may apply for ids: broker sets and replicas per set are bounded."""
    monkeypatch.setattr(processor, "MAX_BROKER_SETS", 2)
    monkeypatch.setattr(m, "MAX_SET", 2)
    for name in ("s1", "s2"):
        assert c(m.ApplyBrokerId("cluster", name, 1, "h;1")).code == RC.SUCCESS
    assert c(m.ApplyBrokerId("cluster", "s3", 1, "h;1")).code == RC.CONTROLLER_BROKER_ID_INVALID
    assert c(m.ApplyBrokerId("cluster", "s1", 2, "h;2")).code == RC.SUCCESS
    assert c(m.ApplyBrokerId("cluster", "s1", 3, "h;3")).code == RC.CONTROLLER_BROKER_ID_INVALID
    assert c(m.ApplyBrokerId("cluster", "s1", 2, "h;2")).code == RC.SUCCESS  # a retry still is


def as_cert(c: Controller, cn: str, req: m.WriteRequest | m.ReadRequest) -> m.Response:
    """`req` sent by the holder of certificate `cn`."""
    c.principal = cn
    try:
        return c(req)
    finally:
        c.principal = ""


def test_an_id_is_bound_to_the_certificate_that_applied_for_it(c: Controller) -> None:
    """Issue 26: the applicant's certificate name is logged with the id; registrations, a
    broker's elections and the master's alters from another certificate are refused 430 before
    anything else; the bindings travel in replica info, election and register answers."""
    c.live(1, 2)
    for i in (1, 2):
        assert as_cert(c, f"b/r{i}", m.ApplyBrokerId("cluster", B, i, f"{addr(i)};{i}")).code == RC.SUCCESS
    assert as_cert(c, "b/r2", m.ApplyBrokerId("cluster", B, 1, f"{addr(1)};1")).code == 430  # the same check code
    reg = as_cert(c, "b/r2", m.RegisterBroker("cluster", B, 1, addr(1)))
    assert reg.code == 430 and "bound to CN=b/r1" in reg.remark
    reg = as_cert(c, "b/r1", m.RegisterBroker("cluster", B, 1, addr(1)))
    assert reg.code == RC.SUCCESS and reg.principals == {1: "b/r1", 2: "b/r2"}
    assert as_cert(c, "b/r2", m.ElectMaster("cluster", B, 1)).code == 430
    elected = as_cert(c, "b/r1", m.ElectMaster("cluster", B, 1))
    assert elected.code == RC.SUCCESS and elected.principals == {1: "b/r1", 2: "b/r2"}
    assert as_cert(c, "b/r2", m.AlterSyncStateSet(B, 1, 1, [1, 2], 1)).code == 430  # a slave posing as master
    assert as_cert(c, "b/r1", m.AlterSyncStateSet(B, 1, 1, [1, 2], 1)).code == RC.SUCCESS
    assert c(m.AlterSyncStateSet(B, 1, 1, [1], 2)).code == RC.SUCCESS  # no certificate (token, loopback): unbound
    info = c(m.GetReplicaInfo(B))
    assert info.principals == {1: "b/r1", 2: "b/r2"}
    w = MemoryWriter()
    c.sm.snapshot(w)
    other = ControllerStateMachine()
    other.restore(MemoryReader(w.files))
    assert other.state.dump() == c.sm.state.dump() and other.principal_of(B, 2) == "b/r2"


def test_an_id_registered_before_bindings_is_bound_at_its_next_registration(c: Controller) -> None:
    """Old snapshots (no principal field) still load; an unbound id is bound to the first
    certificate that registers it, and only that one may register it afterwards."""
    old = (b'[{"cluster":"cluster","name":"broker-a","next_assign_id":2,"replicas":[{"id":1,"address":"h:1",'
           b'"check_code":"h:1;1"}],"master_id":null,"master_epoch":0,"sync_state_set":[],"sync_state_set_epoch":0}]')
    c.sm.state.load(old)
    assert c.sm.principal_of(B, 1) == ""
    c.live(1)
    reg = as_cert(c, "b/r1", m.RegisterBroker("cluster", B, 1, "h:1"))
    assert reg.code == RC.SUCCESS and reg.principals == {1: "b/r1"}
    assert c.sm.principal_of(B, 1) == "b/r1"
    assert as_cert(c, "b/r9", m.RegisterBroker("cluster", B, 1, "h:1")).code == 430
    assert c(m.RegisterBroker("cluster", B, 1, "h:1")).code == RC.SUCCESS  # without a certificate: no binding


# --- a master that registers again (ours: docs/brokers.md, "A master that restarts") ----------


def test_a_restarted_master_is_ranked_by_what_each_replica_reports_after_the_restart(c: Controller) -> None:
    """flush=async: master 1 lost power, its unflushed tail with it, while slave 2 holds that
    tail (acknowledged). Upstream kept 1 as master and 2 cut the tail. Here registering
    again takes 1's role away; the election waits until every live SyncStateSet member
    reported after the restart (`view`, the master epoch it had heard, at or past 2), then
    ranks what each holds now: 2, not 1 by its report from before the power loss."""
    mock_meta_data(c)  # master 1 at epoch 1, SyncStateSet {1, 2, 3}
    c.live(b1=LiveInfo(1, 900, view=1), b2=LiveInfo(1, 800, view=1), b3=LiveInfo(1, 700, view=1))
    reg = c(m.RegisterBroker("cluster", B, 1, addr(1)))
    assert (reg.code, reg.master_broker_id, reg.master_epoch) == (RC.SUCCESS, None, 2)
    assert c.set_view() == (None, 2, 2, [1, 2, 3])
    # 1 reported after its restart (600: what it kept); 2 and 3 not yet
    c.live(b1=LiveInfo(1, 600, view=2), b2=LiveInfo(1, 800, view=1), b3=LiveInfo(1, 700, view=1))
    for req in (m.ElectMaster(broker_name=B), m.ElectMaster("cluster", B, 1)):
        refused = c(req)
        assert refused.code == RC.CONTROLLER_ELECT_MASTER_FAILED and "[2, 3]" in refused.remark
        assert c.set_view() == (None, 2, 2, [1, 2, 3])  # nothing decided, no epoch spent
    c.live(b1=LiveInfo(1, 600, view=2), b2=LiveInfo(1, 800, view=2), b3=LiveInfo(1, 700, view=3))
    elected = c(m.ElectMaster("cluster", B, 1))
    assert (elected.code, elected.master_broker_id, elected.master_epoch) == (RC.SUCCESS, 2, 3)
    assert c.sm.state.sets[B].fresh_epoch == 0  # the next failover ranks as usual
    again = c(m.RegisterBroker("cluster", B, 1, addr(1)))  # 1, now a slave, is told its master
    assert (again.master_broker_id, again.master_epoch) == (2, 3)


def test_a_restarted_master_alone_in_sync_is_elected_again_once_it_reported(c: Controller) -> None:
    """A dead replica is no candidate (nothing waits for it); the restarted master, the only
    live member of the SyncStateSet, is master again at a new epoch."""
    mock_meta_data(c, alter=False)  # SyncStateSet {1}
    c.live(b1=LiveInfo(1, 900, view=1), b2=LiveInfo(1, 950, view=1))
    assert c(m.RegisterBroker("cluster", B, 1, addr(1))).master_broker_id is None
    c.live(b1=LiveInfo(1, 600, view=2), b2=LiveInfo(1, 950, view=1))  # 2 is not in sync: not waited for
    elected = c(m.ElectMaster(broker_name=B))
    assert (elected.code, elected.master_broker_id, elected.master_epoch) == (RC.SUCCESS, 1, 3)


def test_an_admin_may_name_a_replica_before_the_reports_came(c: Controller) -> None:
    mock_meta_data(c)
    c.live(b1=LiveInfo(1, 900, view=1), b2=LiveInfo(1, 800, view=1))
    c(m.RegisterBroker("cluster", B, 1, addr(1)))
    named = c(m.ElectMaster("cluster", B, 2, designate_elect=True))
    assert (named.code, named.master_broker_id) == (RC.SUCCESS, 2)


def test_the_wait_for_fresh_reports_survives_a_snapshot(c: Controller) -> None:
    mock_meta_data(c)
    c(m.RegisterBroker("cluster", B, 1, addr(1)))
    w = MemoryWriter()
    c.sm.snapshot(w)
    other = ControllerStateMachine()
    other.restore(MemoryReader(w.files))
    assert other.state.sets[B].fresh_epoch == 2 and other.brief()[0].fresh_epoch == 2
