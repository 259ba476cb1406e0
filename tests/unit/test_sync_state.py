"""A master's SyncStateSet and confirm offset (upstream's AutoSwitchHAService), without a network."""

from __future__ import annotations

from dledger.broker.sync_state import SyncStateTracker


def test_expand_counts_the_union_until_the_controller_confirms() -> None:
    """#5663: while {1,2} is proposed, acks are counted over local | proposed."""
    t = SyncStateTracker(1)
    assert t.effective == frozenset({1}) and t.in_sync_replicas == 1
    assert t.maybe_expand(2, ack=90, floor=100, epoch_start=0) is None  # lacks acknowledged bytes
    assert t.maybe_expand(2, ack=100, floor=100, epoch_start=120) is None  # nothing of this epoch
    assert t.maybe_expand(2, ack=130, floor=100, epoch_start=120) == frozenset({1, 2})
    assert t.effective == frozenset({1, 2}) and t.in_sync_replicas == 2 and t.local == frozenset({1})
    assert t.maybe_expand(2, ack=140, floor=100, epoch_start=120) is None  # already asked
    t.confirmed({1, 2})
    assert t.local == frozenset({1, 2}) and t.proposed is None


def test_shrink_after_not_catching_up_or_never_connecting() -> None:
    t = SyncStateTracker(1, frozenset({1, 2, 3}))
    t.on_ack(2, caught_up_at=1000)
    assert t.caught_up_ms == {2: 1000}
    assert t.maybe_shrink(now_ms=2000, max_not_catchup_ms=15_000) == frozenset({1, 2})  # 3 never connected
    t.confirmed({1, 2})
    t.on_ack(2, caught_up_at=5000)
    t.on_ack(2, caught_up_at=None)  # an ack that does not show it caught up changes nothing
    assert t.caught_up_ms[2] == 5000
    assert t.maybe_shrink(now_ms=20_000, max_not_catchup_ms=15_000) is None
    assert t.maybe_shrink(now_ms=20_001, max_not_catchup_ms=15_000) == frozenset({1})
    assert t.connection_closed(2) is None  # already proposed out


def test_a_closed_connection_proposes_the_slave_out() -> None:
    t = SyncStateTracker(1, frozenset({1, 2}))
    assert t.connection_closed(2) == frozenset({1})
    assert t.effective == frozenset({1, 2})  # still counted until the controller confirms (union)
    t.confirmed({1})
    assert t.effective == frozenset({1})


def test_confirm_offset() -> None:
    t = SyncStateTracker(1, frozenset({1, 2, 3}))
    assert t.confirm_offset({2: 500}, master_max=800, current=300) == 300  # 3 not connected (#6662)
    assert t.confirm_offset({2: 500, 3: 650}, master_max=800, current=300) == 500
    # a fresh connection's -1 is no ack: nothing new is confirmed, and never -1 (#6728)
    assert t.confirm_offset({2: -1, 3: 650}, master_max=800, current=300) == 300
    assert t.confirm_offset({2: 700, 3: 650, 4: 10}, master_max=800, current=300) == 650  # 4 is not in the set
    assert SyncStateTracker(1).confirm_offset({}, master_max=800, current=0) == 800  # alone: all is confirmed
