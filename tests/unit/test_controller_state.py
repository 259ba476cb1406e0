"""The controller's state and events (docs/controller.md, "What is guaranteed") and its elect
policy, without Raft: upstream's worked trace, the events' apply rules and quirks, a snapshot
round trip, and the election order with offsets 2^31 apart (#10578)."""

from __future__ import annotations

import pytest

from dledger.controller.elect_policy import LiveInfo, elect
from dledger.controller.state import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    BrokerSet,
    CleanBrokerDataEvent,
    ControllerState,
    ElectMasterEvent,
    UpdateBrokerAddressEvent,
)


def _view(b: BrokerSet) -> tuple[int | None, int, int, set[int]]:
    return b.master_id, b.master_epoch, b.sync_state_set_epoch, b.sync_state_set


def _registered(ids: tuple[int, ...] = (1, 2, 3)) -> ControllerState:
    s = ControllerState()
    for i in ids:
        assert s.next_broker_id("b") == i
        s.apply(ApplyBrokerIdEvent("c", "b", f"127.0.0.1:{9000 + i}", i, f"127.0.0.1:{9000 + i};code{i}"))
    return s


def test_the_worked_trace_of_the_reference() -> None:
    """register 1,2,3; broker 1 elected first; the master widens the SyncStateSet; broker 1
    dies and another is elected with the epochs moving as upstream's."""
    s = _registered()
    b = s.get("b")
    assert b is not None and (b.next_assign_id, b.master_epoch, b.sync_state_set_epoch) == (4, 0, 0)
    assert b.first_election and b.master_id is None and b.master_address is None
    s.apply(ElectMasterEvent("b", True, 1))
    assert _view(b) == (1, 1, 1, {1})
    assert b.master_address == "127.0.0.1:9001"
    s.apply(AlterSyncStateSetEvent("b", frozenset({1, 2, 3})))
    assert (b.sync_state_set, b.sync_state_set_epoch) == ({1, 2, 3}, 2)
    new = elect(b.sync_state_set, None, b.master_id, None, alive=lambda i: i != 1)
    assert new in (2, 3)
    s.apply(ElectMasterEvent("b", True, new))
    assert _view(b) == (new, 2, 3, {new})


def test_event_rules_and_upstream_quirks() -> None:
    s = _registered((1, 2))
    b = s.get("b")
    assert b is not None
    s.apply(ApplyBrokerIdEvent("c", "b", "elsewhere", 2, "other"))  # a retried apply adds nothing
    assert b.replicas[2].address == "127.0.0.1:9002" and b.next_assign_id == 3
    s.apply(ApplyBrokerIdEvent("c", "b", "x:1", 7, "x:1;k"))  # next id counts adds, not the max id
    assert b.next_assign_id == 4
    s.apply(ElectMasterEvent("b", True, 1))
    s.apply(AlterSyncStateSetEvent("b", frozenset({1, 2})))
    s.apply(ElectMasterEvent("b", False))  # no candidate: the epoch moves, the SyncStateSet stays
    assert (b.master_id, b.master_epoch, b.sync_state_set) == (None, 2, {1, 2})
    s.apply(UpdateBrokerAddressEvent("c", "b", 2, "127.0.0.1:9999"))
    assert b.replicas[2].address == "127.0.0.1:9999" and b.replicas[2].check_code == "127.0.0.1:9002;code2"
    epochs = (b.master_epoch, b.sync_state_set_epoch)
    s.apply(CleanBrokerDataEvent("b", frozenset({2})))
    assert 2 not in b.replicas and b.sync_state_set == {1} and (b.master_epoch, b.sync_state_set_epoch) == epochs
    s.apply(CleanBrokerDataEvent("b", None))
    assert s.get("b") is None and s.next_broker_id("b") == 1
    s.apply(ElectMasterEvent("nobody", True, 1))  # an unknown set: nothing changes
    assert s.get("nobody") is None


def test_a_snapshot_round_trips() -> None:
    s = _registered()
    for e in (ElectMasterEvent("b", True, 2), AlterSyncStateSetEvent("b", frozenset({2, 3}))):
        s.apply(e)
    other = ControllerState()
    other.load(s.dump())
    assert other.dump() == s.dump() and other.get("b") == s.get("b")
    other.load(None)
    assert other.sets == {}


def test_elect_policy_order_and_preferred_ids() -> None:
    sss = {1, 2, 3}
    info = {1: LiveInfo(1, 5), 2: LiveInfo(1, 2), 3: LiveInfo(0, 3)}
    alive_all: dict[int, bool] = {1: True, 2: True, 3: True}

    def pick(prefer: int | None = None, old: int | None = None, dead: tuple[int, ...] = (),
             unclean: set[int] | None = None) -> int | None:
        return elect(sss, unclean, old, prefer, alive=lambda i: alive_all.get(i, True) and i not in dead,
                     live_info=info.get)

    assert pick(old=1) == 1  # the old master stays while alive
    assert pick(old=1, dead=(1,)) == 2  # higher epoch first
    info[3] = LiveInfo(1, 3)
    assert pick(old=1, dead=(1,)) == 3  # then higher offset
    info[2], info[3] = LiveInfo(1, 3, 2), LiveInfo(1, 3, 1)
    assert pick(old=1, dead=(1,)) == 3  # then the lower priority value
    assert pick(prefer=1, old=2, dead=(1,)) is None  # a preferred id must be a live candidate: no fallback
    assert pick(prefer=2, old=2) == 2 and pick(prefer=1, old=2) == 1
    assert pick(dead=(1, 2, 3)) is None
    assert pick(dead=(1, 2, 3), unclean={1, 2, 3, 4}) == 4  # unclean: any live replica


@pytest.mark.parametrize("gap", [2**31, 2**31 + 5, 2**40])
def test_offsets_far_apart_compare_as_integers(gap: int) -> None:
    """#10578: `(int)(o2 - o1)` overflowed past 2 GiB and picked the less up-to-date replica."""
    info = {2: LiveInfo(1, 1000), 3: LiveInfo(1, 1000 + gap)}
    assert elect({1, 2, 3}, None, 1, None, alive=lambda i: i != 1, live_info=info.get) == 3
