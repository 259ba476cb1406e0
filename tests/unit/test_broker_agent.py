"""BrokerAgent's rules, one test each, without sockets or a clock: the agent is fed controller
answers, HA progress and sends as values, and its effects are read back (docs/brokers.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from dledger.broker import messages as bm
from dledger.broker.agent import (
    REQUEST_DEADLINE_MS,
    AgentSettings,
    AwaitDurable,
    BrokerAgent,
    CallController,
    ConfirmMoved,
    Effect,
    FollowMaster,
    Register,
    ResetHA,
    SaveConfirm,
    SendDone,
    SendHeartbeat,
)
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig
from dledger.broker.ha_service import AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.broker.replica import BrokerRole, Change
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller import messages as m
from dledger.store.base import StoreError
from dledger.store.memory import MemoryLedgerStore

HA = HAConfig(heartbeat_ms=100, housekeeping_ms=1000, transfer_batch_bytes=1 << 16, max_not_catchup_ms=500)
SETTINGS = AgentSettings("c", "b0", "h:1|h:2", heartbeat_interval_ms=300, sync_metadata_ms=1000,
                         check_sync_state_set_ms=1000, slave_timeout_ms=3000)
OK = int(RC.SUCCESS)
ONE_COPY = AckSettings()
E = TypeVar("E")


def make(broker_id: int = -1, acks: AckSettings = ONE_COPY, wait_durable: bool = False,
         now: int = 0) -> BrokerAgent:
    settings = replace(SETTINGS, wait_durable=wait_durable)
    return BrokerAgent(settings, BrokerLog(MemoryLedgerStore()), EpochFileCache(), HA, acks, lease_ms=1000,
                       now_ms=now, broker_id=broker_id)


def of(effects: Sequence[Effect], kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: Sequence[Effect], kind: type[E]) -> E:
    found = of(effects, kind)
    assert len(found) == 1, (kind, effects)
    return found[0]


def info(master: int | None, epoch: int, sss: Sequence[int] = (), sss_epoch: int = 1,
         code: int = OK) -> m.Response:
    address = None if master is None else f"h{master}:1|h{master}:2"
    return m.Response(code, master_broker_id=master, master_address=address, master_epoch=epoch,
                      sync_state_set=list(sss), sync_state_set_epoch=sss_epoch)


def granted() -> list[m.Response]:
    return [m.Response(OK, lease_granted=True)]


def started(role: str = "master", broker_id: int = 1, acks: AckSettings = ONE_COPY,
            wait_durable: bool = False) -> BrokerAgent:
    """An agent registered as `broker_id`, master (or slave of 2) at epoch 1, with its lease."""
    a = make(broker_id, acks, wait_durable)
    out = a.tick(0)
    reg = one(out, Register)
    a.heartbeat_answered(one(out, SendHeartbeat).token, 0, [])  # the first periodic one: next at 300
    master = broker_id if role == "master" else 2
    out = a.register_answered(reg.token, 1, broker_id, info(master, 1, [master]))
    beat = one(out, SendHeartbeat)
    out = a.heartbeat_answered(beat.token, 2, [])
    if role == "master":
        lease = one(out, SendHeartbeat)  # a new master asks for its lease at once
        a.heartbeat_answered(lease.token, 3, granted())
        assert a.role == BrokerRole.MASTER and a.replica.lease_valid(3)
    else:
        assert a.role == BrokerRole.SLAVE
    return a


def role(a: BrokerAgent) -> BrokerRole:
    """(Read through a call: mypy narrows a property it saw compared before.)"""
    return a.role


def periodic_beat(a: BrokerAgent, out: Sequence[Effect]) -> SendHeartbeat:
    beat = one(out, SendHeartbeat)
    assert isinstance(beat, SendHeartbeat)
    return beat


# --- registration --------------------------------------------------------------------------

def test_startup_registers_then_heartbeats_then_takes_the_role_the_registration_names() -> None:
    a = make()
    out = a.tick(0)
    assert of(out, SendHeartbeat) == []  # no id yet: no heartbeat
    reg = one(out, Register)
    out = a.register_answered(reg.token, 5, 1, info(1, 1, [1]))
    beat = one(out, SendHeartbeat)  # counted alive before anything else
    assert a.role == BrokerRole.FENCED and beat.request.broker_id == 1 and beat.request.lease_ms == 0
    out = a.heartbeat_answered(beat.token, 6, [])
    assert role(a) == BrokerRole.MASTER and a.replica.master_epoch == 1
    assert one(out, ResetHA) and one(out, SendHeartbeat).request.lease_ms == 1000


def test_a_registration_naming_no_master_asks_for_an_election() -> None:
    a = make()
    reg = one(a.tick(0), Register)
    beat = one(a.register_answered(reg.token, 1, 1, m.Response(OK)), SendHeartbeat)
    elect = one(a.heartbeat_answered(beat.token, 2, []), CallController)
    assert elect.request == m.ElectMaster("c", "b0", 1)
    out = a.answered(elect.token, 3, info(2, 1, [2]))
    assert a.role == BrokerRole.SLAVE
    follow = one(out, FollowMaster)
    assert follow.master_id == 2 and follow.ha_address == "h2:2" and follow.client is a.replica.slave


def test_heartbeats_report_the_highest_master_epoch_heard_from_the_controller() -> None:
    """After a master restart the controller ranks replicas only by reports made at or past
    the epoch the restart made (docs/brokers.md): a heartbeat says the highest epoch this
    process heard, with or without a master (a registration or replica info naming none)."""
    a = make(broker_id=1)
    out = a.tick(0)
    assert periodic_beat(a, out).request.master_epoch == -1  # a restarted process has heard nothing yet
    reg = one(out, Register)
    beat = one(a.register_answered(reg.token, 1, 1, m.Response(OK, master_epoch=4)), SendHeartbeat)
    assert beat.request.master_epoch == 4 and beat.request.epoch == -1  # (its epoch file's last epoch)
    elect = one(a.heartbeat_answered(beat.token, 2, []), CallController)
    assert elect.request == m.ElectMaster("c", "b0", 1)  # no master named: it asks for an election
    a.answered(elect.token, 3, m.Response(int(RC.CONTROLLER_ELECT_MASTER_FAILED), master_epoch=9))
    assert a.heard_epoch == 4  # a refusal says nothing
    s = started("slave")
    out = s.tick(1010)
    assert periodic_beat(s, out).request.master_epoch == 1
    s.heartbeat_answered(one(out, SendHeartbeat).token, 1010, [])
    s.answered(one(out, CallController).token, 1011, info(None, 2, [1, 2]))  # the master restarted: epoch 2
    assert s.heard_epoch == 2 and s.replica.master_epoch == 1
    assert periodic_beat(s, s.tick(1310)).request.master_epoch == 2


def test_startup_is_retried_after_the_startup_pause() -> None:
    a = make()
    reg = one(a.tick(0), Register)
    assert a.register_answered(reg.token, 10, -1, None) == []  # not registered
    assert of(a.tick(509), Register) == []
    reg = one(a.tick(510), Register)
    beat = one(a.register_answered(reg.token, 600, 1, m.Response(OK)), SendHeartbeat)
    elect = one(a.heartbeat_answered(beat.token, 601, []), CallController)
    a.answered(elect.token, 602, m.Response(int(RC.CONTROLLER_ELECT_MASTER_FAILED)))  # no master yet
    assert a.role == BrokerRole.FENCED and of(a.tick(1101), Register) == []
    assert one(a.tick(1102), Register)


def test_a_known_id_heartbeats_from_the_start() -> None:
    a = make(broker_id=3)
    assert periodic_beat(a, a.tick(0)).request.broker_id == 3


def test_an_unknown_set_registers_again() -> None:
    """CONTROLLER_BROKER_METADATA_NOT_EXIST (the controller lost our set): register again."""
    a = started("slave")
    query = one(a.tick(1010), CallController)
    assert query.request == m.GetReplicaInfo("b0")
    reg = one(a.answered(query.token, 1011, m.Response(int(RC.CONTROLLER_BROKER_METADATA_NOT_EXIST))), Register)
    assert a.register_answered(reg.token, 1012, 1, m.Response(OK)) == []
    assert a.role == BrokerRole.SLAVE  # the role comes from replica info, as ever
    assert one(a.tick(2012), CallController).request == m.GetReplicaInfo("b0")


# --- roles ------------------------------------------------------------------------------------

def test_a_notify_is_a_hint_that_makes_one_query_at_a_time() -> None:
    a = started("slave")
    query = one(a.hint(100), CallController)
    assert query.request == m.GetReplicaInfo("b0") and a.replica_info_queries == 1
    assert a.hint(101) == [] and a.hint(102) == []  # one in flight however many arrive
    again = one(a.answered(query.token, 103, info(2, 1, [2])), CallController)  # and one after it
    assert again.request == m.GetReplicaInfo("b0")
    assert a.answered(again.token, 104, info(2, 1, [2])) == [] and a.replica_info_queries == 2


def test_a_hint_before_a_role_is_taken_is_asked_once_following() -> None:
    a = make(broker_id=1)
    reg = one(a.tick(0), Register)
    assert of(a.hint(1), CallController) == []
    beat = one(a.register_answered(reg.token, 2, 1, info(2, 1, [2])), SendHeartbeat)
    out = a.heartbeat_answered(beat.token, 3, [])
    assert a.role == BrokerRole.SLAVE and one(out, CallController).request == m.GetReplicaInfo("b0")


def test_only_a_controller_answer_with_a_higher_epoch_changes_the_role() -> None:
    a = started("slave")
    query = one(a.hint(100), CallController)
    # the controller still says epoch 1 (whatever the NOTIFY claimed): nothing changes
    assert a.answered(query.token, 101, info(1, 1, [1])) == []
    assert a.role == BrokerRole.SLAVE and a.replica.master_id == 2
    query = one(a.tick(1101), CallController)
    out = a.answered(query.token, 1102, info(1, 2, [1]))
    assert role(a) == BrokerRole.MASTER and a.replica.master_epoch == 2
    assert one(out, ResetHA) and one(out, SendHeartbeat).request.lease_ms == 1000


def test_a_higher_epoch_without_a_master_asks_for_an_election_whose_answer_is_not_used() -> None:
    a = started("slave")
    query = one(a.tick(1010), CallController)
    elect = one(a.answered(query.token, 1011, info(None, 2)), CallController)
    assert elect.request == m.ElectMaster("c", "b0", 1)
    assert a.answered(elect.token, 1012, info(1, 2, [1])) == []  # known from replica info only
    assert a.role == BrokerRole.SLAVE and a.replica.master_epoch == 1


def test_replica_info_is_polled_every_sync_metadata_ms() -> None:
    a = started("slave")
    assert of(a.tick(1001), CallController) == []
    query = one(a.tick(1002), CallController)
    assert a.answered(query.token, 1500, None) == []  # no answer
    assert of(a.tick(2499), CallController) == []
    assert one(a.tick(2500), CallController).request == m.GetReplicaInfo("b0")


def test_a_role_change_fails_the_sends_still_waiting() -> None:
    a = started("master", acks=AckSettings(all_ack=True))
    confirm_set(a, [1, 2])
    out = a.send(7, [b"x"], 10)
    assert of(out, SendDone) == []
    query = one(a.hint(20), CallController)
    out = a.answered(query.token, 21, info(2, 2, [2]))
    done = one(out, SendDone)
    assert a.role == BrokerRole.SLAVE and isinstance(done.result, DLedgerError)
    assert done.result.code == ResponseCode.FLUSH_SLAVE_TIMEOUT


# --- the lease heartbeat ------------------------------------------------------------------------

def test_heartbeats_follow_the_previous_answer_by_the_interval() -> None:
    a = make(broker_id=1)
    beat = periodic_beat(a, a.tick(0))
    assert of(a.tick(1000), SendHeartbeat) == []  # the previous one is not answered yet
    a.heartbeat_answered(beat.token, 1000, [])
    assert of(a.tick(1299), SendHeartbeat) == []
    assert periodic_beat(a, a.tick(1300))


def test_the_lease_runs_from_the_heartbeats_send_time_for_its_epoch_only() -> None:
    a = started("master")
    beat = periodic_beat(a, a.tick(300))
    assert beat.request.lease_ms == 1000
    a.heartbeat_answered(beat.token, 900, granted())
    assert a.replica.lease_valid(1299) and not a.replica.lease_valid(1300)  # from 300, not 900
    out = a.tick(1200)
    beat, query = periodic_beat(a, out), one(out, CallController)
    a.heartbeat_answered(beat.token, 1201, [])  # no grant: nothing renewed
    assert not a.replica.lease_valid(1300)
    # a grant for a heartbeat sent at an earlier epoch is not this epoch's lease
    beat = periodic_beat(a, a.tick(1501))
    a.answered(query.token, 2001, info(1, 2, [1]))  # master again at epoch 2
    a.heartbeat_answered(beat.token, 2002, granted())
    assert not a.replica.lease_valid(2003)


# --- the alter loop -----------------------------------------------------------------------------

def confirm_set(a: BrokerAgent, members: list[int]) -> None:
    """The controller's SyncStateSet for the master's epoch (replica info)."""
    ha = a.replica.master_ha
    assert ha is not None
    a.replica.sync_state_set_read(a.replica.master_epoch, set(members), a.replica.sync_state_set_epoch + 1)


def test_one_alter_at_a_time_and_an_unanswered_one_is_sent_again_after_the_pause() -> None:
    a = started("master")
    ha = a.replica.master_ha
    assert ha is not None
    ha.tracker._propose(frozenset({1, 2}))
    alter = one(a.proposal(10), CallController)
    assert isinstance(alter.request, m.AlterSyncStateSet) and alter.request.sync_state_set == [1, 2]
    ha.tracker._propose(frozenset({1, 2, 3}))
    assert a.proposal(11) == []  # the loop runs: one change at a time
    assert a.answered(alter.token, 50, None) == []  # no answer: a pause
    assert of(a.tick(549), CallController) == []
    again = one(a.tick(550), CallController)
    assert again.request == alter.request  # sent again as it was
    out = a.answered(again.token, 560, m.Response(OK, new_sync_state_set_epoch=2, sync_state_set=[1, 2]))
    nxt = one(out, CallController)  # then the next change, at once
    assert isinstance(nxt.request, m.AlterSyncStateSet) and nxt.request.sync_state_set == [1, 2, 3]
    assert a.replica.sync_state_set == {1, 2} and a.replica.sync_state_set_epoch == 2


def test_an_unauthenticated_alter_is_sent_again_after_the_pause() -> None:
    a = started("master")
    assert a.replica.master_ha is not None
    a.replica.master_ha.tracker._propose(frozenset({1, 2}))
    alter = one(a.proposal(10), CallController)
    assert a.answered(alter.token, 20, m.Response(int(ResponseCode.UNAUTHENTICATED), "not over")) == []
    assert one(a.tick(520), CallController).request == alter.request


def test_a_refused_alter_is_resolved_by_reading_the_controllers_set() -> None:
    a = started("master")
    assert a.replica.master_ha is not None
    a.replica.master_ha.tracker._propose(frozenset({1, 2}))
    alter = one(a.proposal(10), CallController)
    read = one(a.answered(alter.token, 20, m.Response(int(RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH))),
               CallController)
    assert read.request == m.GetReplicaInfo("b0")
    assert a.answered(read.token, 30, info(1, 1, [1], sss_epoch=1)) == []  # not applied, and nothing else wanted
    assert not a.replica.unresolved and a.replica.master_ha.tracker.effective == {1}


def test_a_slave_not_caught_up_is_proposed_out_on_the_check_period() -> None:
    a = started("master")
    confirm_set(a, [1, 2])
    assert of(a.tick(999), CallController) == []
    alter = one(a.tick(1000), CallController)  # 2 never connected
    assert isinstance(alter.request, m.AlterSyncStateSet) and alter.request.sync_state_set == [1]


# --- sends and acks -------------------------------------------------------------------------------

def connect_slave(a: BrokerAgent, slave_id: int = 2) -> tuple[object, SlaveClient]:
    ha = a.replica.master_ha
    assert ha is not None
    key = object()
    ha.opened(key, 0)
    client = SlaveClient(slave_id, BrokerLog(MemoryLedgerStore()), EpochFileCache(), HA)
    ha.on_data(key, b"".join(client.connected(0)), 0)
    return key, client


def replicate(ha: MasterHA, key: object, client: SlaveClient, now: int) -> None:
    conn = ha.connections[key]
    for _ in range(20):
        down = b"".join(conn.output(now, ha.confirm_offset, 1 << 20))
        up = b"".join(client.receive(down, now)) if down else b""
        if up:
            ha.on_data(key, up, now)
        if not down and not up:
            return


def test_a_send_is_refused_unless_master_with_a_lease() -> None:
    slave = started("slave")
    done = one(slave.send(1, [b"x"], 10), SendDone)
    assert isinstance(done.result, DLedgerError) and done.result.code == ResponseCode.SERVICE_NOT_AVAILABLE
    master = started("master")
    done = one(master.send(1, [b"x"], 5000), SendDone)  # the lease expired at 1003
    assert isinstance(done.result, DLedgerError) and done.result.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert master.log.max_offset == 0  # refused before the write


def test_a_send_below_min_in_sync_replicas_is_refused_before_the_write() -> None:
    a = started("master", acks=AckSettings(in_sync_replicas=2, min_in_sync_replicas=2))
    done = one(a.send(1, [b"x"], 10), SendDone)
    assert isinstance(done.result, DLedgerError) and done.result.code == ResponseCode.IN_SYNC_REPLICAS_NOT_ENOUGH
    assert a.log.max_offset == 0


def test_one_copy_acks_at_once() -> None:
    a = started("master", acks=AckSettings(in_sync_replicas=1))
    done = one(a.send(1, [b"x", b"y"], 10), SendDone)
    assert isinstance(done.result, bm.SendResponse)
    assert (done.result.epoch, done.result.first_index, len(done.result.offsets)) == (1, 0, 2)


@pytest.mark.parametrize("acks", [AckSettings(in_sync_replicas=2), AckSettings(all_ack=True)])
def test_a_send_waits_for_the_in_sync_copies(acks: AckSettings) -> None:
    a = started("master", acks=acks)
    ha = a.replica.master_ha
    assert ha is not None
    key, client = connect_slave(a)
    confirm_set(a, [1, 2])
    assert of(a.send(1, [b"x"], 10), SendDone) == []
    assert a.slave_acked(11) == []  # nothing replicated yet
    replicate(ha, key, client, 12)
    done = one(a.slave_acked(12), SendDone)
    assert isinstance(done.result, bm.SendResponse) and done.result.epoch == 1


def test_all_ack_waits_for_every_member_in_sync_replicas_for_any_two() -> None:
    for acks, acked in ((AckSettings(in_sync_replicas=2), True), (AckSettings(all_ack=True), False)):
        a = started("master", acks=acks)
        ha = a.replica.master_ha
        assert ha is not None
        key, client = connect_slave(a, 2)
        connect_slave(a, 3)  # connected, never acks this send
        confirm_set(a, [1, 2, 3])
        a.send(1, [b"x"], 10)
        replicate(ha, key, client, 12)
        assert bool(of(a.slave_acked(12), SendDone)) == acked


def test_a_send_not_acknowledged_in_time_fails_with_flush_slave_timeout() -> None:
    a = started("master", acks=AckSettings(all_ack=True))
    confirm_set(a, [1, 2])
    a.send(1, [b"x"], 10)
    assert of(a.tick(3009), SendDone) == []
    done = one(a.tick(3010), SendDone)
    assert isinstance(done.result, DLedgerError) and done.result.code == ResponseCode.FLUSH_SLAVE_TIMEOUT


def test_a_send_acked_after_the_lease_expired_is_not_acknowledged() -> None:
    a = started("master", acks=AckSettings(all_ack=True))
    ha = a.replica.master_ha
    assert ha is not None
    key, client = connect_slave(a)
    confirm_set(a, [1, 2])
    a.send(1, [b"x"], 10)
    replicate(ha, key, client, 1500)
    done = one(a.slave_acked(1500), SendDone)  # the lease ended at 1003
    assert isinstance(done.result, DLedgerError) and done.result.code == ResponseCode.FLUSH_SLAVE_TIMEOUT


def test_flush_sync_waits_for_the_fsync_before_the_acks() -> None:
    a = started("master", wait_durable=True)
    out = a.send(1, [b"x"], 10)
    wait = one(out, AwaitDurable)
    assert of(out, SendDone) == [] and wait.index == 0
    done = one(a.durable(20, wait.index), SendDone)
    assert isinstance(done.result, bm.SendResponse)


def test_a_failed_fsync_answers_the_sends_waiting_for_it() -> None:
    a = started("master", wait_durable=True)
    first = one(a.send(1, [b"x"], 10), AwaitDurable)
    second = one(a.send(2, [b"y"], 11), AwaitDurable)
    error = StoreError(ResponseCode.DISK_ERROR, "fsync failed")
    done = one(a.durable_failed(12, first.index, error), SendDone)
    assert done == SendDone(1, error)
    assert one(a.durable(13, second.index), SendDone).send_id == 2  # the next fsync worked


def test_the_confirm_offset_is_saved_every_second() -> None:
    a = started("slave")
    assert of(a.tick(999), SaveConfirm) == []
    assert one(a.tick(1000), SaveConfirm) == SaveConfirm(-1)


def test_a_slaves_progress_moves_its_readers() -> None:
    a = started("slave")
    assert a.slave_progress(10) == [ConfirmMoved()]


# --- failures: an input that raises, an answer that never comes ------------------------------------

def fail_once(a: BrokerAgent, error: Exception) -> None:
    """Its replica's change_role fails the first time (MasterHA reading a failing store, an
    epoch file that cannot be written), then works."""
    real, calls = a.replica.change_role, []

    def change_role(*args: Any) -> Change:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*args)

    a.replica.change_role = change_role  # type: ignore[method-assign,assignment]


def test_a_store_error_while_taking_a_role_at_startup_is_retried() -> None:
    a = make()
    fail_once(a, StoreError(ResponseCode.DISK_ERROR, "slot unreadable"))
    reg = one(a.tick(0), Register)
    beat = one(a.register_answered(reg.token, 1, 1, info(1, 1, [1])), SendHeartbeat)
    assert a.heartbeat_answered(beat.token, 2, []) == []  # no role: fenced, and retried
    assert a.role == BrokerRole.FENCED
    reg = one(a.tick(502), Register)
    beat = one(a.register_answered(reg.token, 503, 1, info(1, 1, [1])), SendHeartbeat)
    a.heartbeat_answered(beat.token, 504, [])
    assert role(a) == BrokerRole.MASTER


def test_a_store_error_in_a_role_change_while_following_is_retried_at_the_next_poll() -> None:
    a = started("slave")
    fail_once(a, StoreError(ResponseCode.DISK_ERROR, "slot unreadable"))
    query = one(a.tick(1010), CallController)
    assert a.answered(query.token, 1011, info(1, 2, [1])) == []
    assert a.role == BrokerRole.SLAVE and a.replica.master_epoch == 1
    query = one(a.tick(2011), CallController)
    a.answered(query.token, 2012, info(1, 2, [1]))
    assert role(a) == BrokerRole.MASTER and a.replica.master_epoch == 2


def test_an_input_that_raises_leaves_the_chain_going() -> None:
    """A bug (any exception) in handling an answer: the driver logs it; the chain still polls."""
    a = started("slave")
    fail_once(a, RuntimeError("a bug"))
    query = one(a.tick(1010), CallController)
    with pytest.raises(RuntimeError):
        a.answered(query.token, 1011, info(1, 2, [1]))
    query = one(a.tick(2011), CallController)
    assert query.request == m.GetReplicaInfo("b0")
    a.answered(query.token, 2012, info(1, 2, [1]))
    assert role(a) == BrokerRole.MASTER


def test_an_input_that_raises_leaves_the_alter_loop_going() -> None:
    a = started("master")
    ha = a.replica.master_ha
    assert ha is not None
    ha.tracker._propose(frozenset({1, 2}))
    alter = one(a.proposal(10), CallController)

    real = a.replica.alter_answered

    def broken(req: m.AlterSyncStateSet, resp: m.Response | None) -> None:
        real(req, resp)
        raise RuntimeError("a bug")

    a.replica.alter_answered = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        a.answered(alter.token, 20, m.Response(OK, new_sync_state_set_epoch=2, sync_state_set=[1, 2]))
    a.replica.alter_answered = real  # type: ignore[method-assign]
    assert a.replica.sync_state_set == {1, 2}
    assert of(a.tick(519), CallController) == []
    a.tick(520)  # the pause after the failure: the loop runs again
    ha.tracker._propose(frozenset({1, 3}))
    nxt = one(a.proposal(530), CallController)
    assert isinstance(nxt.request, m.AlterSyncStateSet) and nxt.request.sync_state_set == [1, 3]


def test_an_answer_that_never_comes_counts_as_none_after_the_deadline() -> None:
    """The backstop for a driver that lost an answer: the chain, the alter loop and the
    heartbeats go on."""
    a = started("master")
    out = a.tick(1010)
    query, beat = one(out, CallController), periodic_beat(a, out)  # never answered
    assert a.replica.master_ha is not None
    a.replica.master_ha.tracker._propose(frozenset({1, 2}))
    alter = one(a.proposal(1020), CallController)  # nor this
    assert query.token != alter.token and beat.token
    assert of(a.tick(REQUEST_DEADLINE_MS), CallController) == []
    out = a.tick(REQUEST_DEADLINE_MS + 1020)
    assert of(out, CallController) == []  # the step is over, the alter paused
    out = a.tick(REQUEST_DEADLINE_MS + 1520)
    assert one(out, CallController).request == alter.request  # sent again after the pause
    assert periodic_beat(a, out)
    assert one(a.tick(REQUEST_DEADLINE_MS + 2020), CallController).request == m.GetReplicaInfo("b0")


def test_a_new_mastership_does_not_send_the_old_ones_alter_again() -> None:
    a = started("master")
    assert a.replica.master_ha is not None
    a.replica.master_ha.tracker._propose(frozenset({1, 2}))
    alter = one(a.proposal(10), CallController)
    a.answered(alter.token, 20, None)  # no answer: to be sent again at 520
    query = one(a.hint(30), CallController)
    a.answered(query.token, 31, info(1, 2, [1]))  # master again, at epoch 2
    assert role(a) == BrokerRole.MASTER and a.replica.master_epoch == 2
    alters = [c.request for c in of(a.tick(520), CallController) if isinstance(c.request, m.AlterSyncStateSet)]
    assert alters == []  # epoch 1's is fenced: its tracker is gone
    assert not a.replica.unresolved


def test_flush_sync_also_makes_the_replica_count_durable_copies_only() -> None:
    assert started("master", wait_durable=True).replica.ack_durable
    assert not started("master").replica.ack_durable
    assert make(wait_durable=True).replica.ack_durable
