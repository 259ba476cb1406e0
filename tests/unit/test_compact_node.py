"""`dledger compact` on a Node driven by hand: what it refuses (a state machine's group, an
index not committed, nothing committed), and what it does on a plain log (a snapshot with the
producer table first, then the compaction point, answered with the begin it reaches)."""

from __future__ import annotations

from dledger.codes import RequestCode, ResponseCode
from dledger.core.contexts import SnapshotTaken
from dledger.core.messages import AppendRequest, SnapshotRequest, SnapshotResponse
from dledger.core.node import TakeSnapshot
from dledger.statemachine.applier import Applier
from unit.test_node_limits import Driver, _replies


def _compact(d: Driver, through: int, token: object) -> SnapshotResponse | None:
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=True, through=through), token)
    r = _replies(d.drain()).get(token)
    assert r is None or isinstance(r, SnapshotResponse)
    return r


def test_compact_refuses_a_state_machine_group_and_uncommitted_indexes() -> None:
    d = Driver(applier=Applier(-1)).lead()
    r = _compact(d, -1, "sm")
    assert r is not None and r.code == ResponseCode.UNSUPPORTED and "dledger snapshot" in r.message, r

    d = Driver().lead()
    committed = d.store.committed_index
    r = _compact(d, committed + 5, "ahead")
    assert r is not None and r.code == ResponseCode.INDEX_OUT_OF_RANGE, r
    assert f"index {committed + 5} is not committed" in r.message and "only committed" in r.message, r


def test_compact_snapshots_then_drops_the_log_before_the_point() -> None:
    d = Driver().lead()
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"e%d" % k for k in range(20)]), "put")
    d.drain()
    committed = d.store.committed_index
    assert committed >= 20
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=True, through=10), "c")
    taken = [a for a in d.drain() if isinstance(a, TakeSnapshot)]
    assert [t.index for t in taken] == [committed]  # the producer table is saved first
    assert d.store.begin_index == 0  # nothing goes before the snapshot is written
    d.node.complete(SnapshotTaken(committed, ""), d.now)
    r = _replies(d.drain())["c"]
    assert isinstance(r, SnapshotResponse) and r.code == 200 and r.snapshot_index == 10, r
    assert r.begin_index == 11 and d.store.begin_index == 11  # the memory store drops at once
    r2 = _compact(d, 5, "again")  # already behind the begin: said, nothing to do
    assert r2 is not None and r2.code == 200 and r2.begin_index == 11 and "already compacted" in r2.message
