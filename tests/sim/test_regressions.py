"""Named regressions of issue 10's review findings, each driven by the deterministic simulator.

Each scenario is the one the review's audit script built (../shared/audit/), reduced to what
it shows; each failed on the code before the fix.
"""

from __future__ import annotations

from typing import Any

import pytest

from dledger.codes import ResponseCode
from dledger.core.messages import Role
from dledger.sim.cluster import SimCluster
from dledger.store.base import AppendResult, StoreError

pytestmark = pytest.mark.sim


def _steady(seed: int, **cfg: object) -> tuple[SimCluster, str, str, str]:
    c = SimCluster(3, seed=seed, **cfg)  # type: ignore[arg-type]
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    a, b = [i for i in c.ids if i != leader]
    c.run(500)  # the NOOP committed everywhere, no flush pending
    return c, leader, a, b


def test_sync_commit_never_counts_a_follower_that_has_not_fsynced() -> None:
    """a_sync_compare: the follower's fsync stalls, the leader's APPEND times out and falls back
    to COMPARE, which the follower answers from its page cache. The entry must not be
    acknowledged (it was, fsynced on the leader alone); a whole-group power loss then loses
    nothing acknowledged."""
    c, leader, a, b = _steady(1, flush="sync")
    c.partition([leader, a], [b])
    c.stores[a].on_request = lambda: None  # a's fsync never completes
    cid = c.append(leader, [b"X"])
    c.run_until(lambda: cid in c.client_results, 5_000)
    res = c.client_results.get(cid)
    assert res is None or res.code != ResponseCode.SUCCESS, f"acknowledged while fsynced on the leader only: {res}"
    for m in (leader, a, b):
        c.crash(m, lose_unsynced=True)
    c.heal()
    for m in (a, b, leader):
        c.start(m)
    c.run(5_000)
    c.check_log_matching()
    assert not c.violations


def test_one_power_loss_after_a_slow_fsync_loses_nothing_acknowledged() -> None:
    """a2_one_power_loss: the follower's fsync takes 1.5 s (longer than max_push_timeout_ms);
    the entry may be acknowledged only once that fsync completed, so the follower's power loss
    and a partition of the old leader cannot lose it."""
    c, leader, a, b = _steady(1, flush="sync")
    c.partition([leader, a], [b])
    c.slow_disk(a, 1500, 1500)
    cid = c.append(leader, [b"X"])
    assert c.run_until(lambda: cid in c.client_results, 5_000)
    res = c.client_results[cid]
    assert res.code == ResponseCode.SUCCESS  # once a's fsync completed, its heartbeat answer reports it
    assert c.stores[a].synced_index >= res.index
    c.crash(a, lose_unsynced=True)
    c.partition([leader], [a, b])
    c.start(a)
    assert c.run_until(lambda: c.leader() not in (None, leader), 10_000)
    new = c.leader()
    assert new is not None
    assert c.stores[new].get(res.index).body == b"X"
    c.run(300)
    assert not c.violations


def test_a_late_durable_index_after_a_truncate_is_not_trusted() -> None:
    """b_publish_race at the node: the flush thread's durable index reaches the node after a
    truncate lowered it; answering the pending sync push on that stale value would claim an
    unsynced entry durable."""
    c, _, a, _ = _steady(2, flush="sync")
    node, store = c._node(a), c.stores[a]
    end = store.end_index
    store.append_as_leader([b"x1", b"x2"], store.end_term)  # a divergent unsynced tail
    store.request_flush()  # a flush starts, covering it
    stale = end + 2
    store.truncate(end + 1)
    store.append_as_leader([b"y1", b"y2"], store.end_term)
    node.on_durable(stale, c.now)  # the hint arrives late: it must be clamped
    assert store.durable_index <= store.synced_index
    assert node.handler.durable_match() <= store.synced_index


def _full_disk_wins(seed: int) -> tuple[SimCluster, str, str, dict[str, bool]] | None:
    """Crash the leader while `a`'s disk refuses appends; the run if `a` then won a vote."""
    c, leader, a, b = _steady(seed)
    st, node = c.stores[a], c._node(a)
    full = {"on": True, "won": False}
    orig_append, orig_become = st.append_as_leader, node.become_leader

    def append_as_leader(*args: Any, **kw: Any) -> AppendResult:
        if full["on"]:
            raise StoreError(ResponseCode.DISK_FULL, "disk full")
        return orig_append(*args, **kw)

    def become_leader() -> bool:
        full["won"] = True
        return bool(orig_become())

    st.append_as_leader = append_as_leader  # type: ignore[method-assign]
    node.become_leader = become_leader  # type: ignore[method-assign]
    c.crash(leader, lose_unsynced=False)
    c.run_until(lambda: c.leader() is not None, 10_000)
    return (c, a, b, full) if full["won"] else None


def test_a_leader_whose_noop_cannot_be_stored_steps_down_and_the_group_recovers() -> None:
    """d_noop_fail: a member whose disk is full wins an election; storing the NOOP fails. It
    used to stay LEADER with no dispatchers (heartbeating, so nobody else campaigned) until
    an IndexError; now it steps down, stays out of elections while its store fails, and
    another member leads and commits."""
    run = next((r for r in map(_full_disk_wins, range(40)) if r is not None), None)
    assert run is not None, "no seed made the member with the full disk win"
    c, a, b, full = run
    assert c._node(a).member.role != Role.LEADER
    assert c.run_until(lambda: c.leader() == b, 10_000), "the writable member did not take over"
    full["on"] = False
    cid = c.append(b, [b"after"])
    assert c.run_until(lambda: cid in c.client_results, 10_000)
    assert c.client_results[cid].code == ResponseCode.SUCCESS
    assert not c.violations


def test_a_member_with_a_failed_store_does_not_campaign_and_says_why() -> None:
    c, leader, a, _ = _steady(3)
    c.disk_fault(leader, "full")
    assert c.run_until(lambda: c.leader() not in (None, leader), 10_000), "the full-disk leader kept leading"
    c.run(3_000)
    assert c._node(leader).member.role == Role.FOLLOWER
    assert "full" in c._node(leader).metadata().store_error
    cid = c.append(a, [b"x"])
    assert c.run_until(lambda: cid in c.client_results, 10_000)
    assert c.client_results[cid].code == ResponseCode.SUCCESS
    assert not c.violations


def test_retention_keeps_what_a_lagging_follower_needs() -> None:
    """Retention under disk pressure used to delete files a lagging follower still needed
    (set_retention_floor was never called): the follower then looped forever."""
    c, leader, _, b = _steady(4, flush="sync")
    for m in c.ids:
        c.disk_fault(m, "pressure")
    c.crash(b, lose_unsynced=True)
    ids = [c.append(leader, [f"e{k}".encode()]) for k in range(60)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 10_000)
    c.run(2_000)
    c.start(b)
    top = c.stores[leader].committed_index
    assert c.run_until(lambda: c.stores[b].committed_index >= top, 15_000), (
        f"{b} stranded: leader begins at {c.stores[leader].begin_index}, {b} ends at {c.stores[b].end_index}")
    c.run(2_000)  # once it caught up, retention deletes again
    assert c.stores[leader].begin_index > 0
    assert not c.violations
