"""`dledger compact` on a Node driven by hand: what it refuses (a state machine's group, an
index not committed, nothing committed), and what it does on a plain log (a snapshot with the
producer table first, then the compaction point, answered with the begin it reaches)."""

from __future__ import annotations

import msgspec
import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core import node as node_mod
from dledger.core import producers as producers_mod
from dledger.core.contexts import SnapshotTaken
from dledger.core.messages import AppendRequest, SnapshotRequest, SnapshotResponse
from dledger.core.node import TakeSnapshot
from dledger.statemachine.applier import Applier
from dledger.store.base import CorruptEntryError
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


def _folded_in(t: TakeSnapshot) -> int:
    return int(msgspec.msgpack.decode(t.producers)[0]) if t.producers else -1


def test_compact_snapshot_is_never_labelled_past_the_folded_producer_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table folded short of the commit index (a restart, a big catch-up: FOLD_CHUNK per
    drain) caps the snapshot: a follower installing one labelled later would begin its log after
    markers its table never folded, and accept a retry of an append stored there as new."""
    d = Driver().lead()
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"p0", b"p1"], producer="p", sequence=0, epoch=1), "idem")
    for _ in range(5):
        d.drain()
    assert not d.node.producers.empty
    monkeypatch.setattr(producers_mod, "FOLD_CHUNK", 1)  # folding lags (as with a long log)
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"e%d" % k for k in range(20)]), "put")
    d.drain()
    committed = d.store.committed_index
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=True, through=committed), "c")
    taken = [a for a in d.drain() if isinstance(a, TakeSnapshot)]
    assert len(taken) == 1
    t = taken[0]
    assert t.index < committed and _folded_in(t) >= t.index, (t.index, _folded_in(t), committed)
    d.node.complete(SnapshotTaken(t.index, ""), d.now)
    r = _replies(d.drain())["c"]
    assert isinstance(r, SnapshotResponse) and r.code == 200 and r.snapshot_index == t.index, r
    assert f"compacted through {t.index} only" in r.message, r
    # the periodic save of the table (_save_producers) is capped the same way
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"p2"], producer="p", sequence=2, epoch=1), "idem2")
    d.drain()
    d.now += node_mod.PRODUCERS_SAVE_MS
    saves = [a for a in d.tick() if isinstance(a, TakeSnapshot)]
    assert saves and all(s.index <= _folded_in(s) for s in saves), [(s.index, _folded_in(s)) for s in saves]
    assert saves[0].index < d.store.committed_index


def test_no_plain_snapshot_while_an_installed_table_is_read() -> None:
    """While a plain log's installed producer table is restored (on the worker), the table in
    memory is the one it replaces: a snapshot then would carry that one under the new label."""
    d = Driver().lead()
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"p0"], producer="p", sequence=0, epoch=1), "idem")
    d.drain()
    d.node._producers_restoring = True
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=True, through=-1), "c")
    for _ in range(3):
        assert not any(isinstance(a, TakeSnapshot) for a in d.tick(node_mod.PRODUCERS_SAVE_MS))
    d.node._producers_restoring = False
    taken = [a for a in d.drain() if isinstance(a, TakeSnapshot)]
    assert len(taken) == 1 and taken[0].index <= _folded_in(taken[0])


def test_a_negative_through_other_than_minus_one_is_refused() -> None:
    """-1 alone means "the commit index": -5 is a mistake, not a synonym."""
    d = Driver().lead()
    for compact in (True, False):
        d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=compact, through=-5), ("neg", compact))
        r = _replies(d.drain())[("neg", compact)]
        assert isinstance(r, SnapshotResponse) and r.code == ResponseCode.UNEXPECTED_ARGUMENT, r
        assert "-5" in r.message, r
    assert _compact(d, -1, "commit") is None  # -1 still works: it waits for its snapshot


def test_a_compaction_step_that_fails_answers_its_waiters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotten record where the compaction would begin (compaction_begin reads its unit):
    the waiters get the error at once (not a client timeout), and the member marks the record."""
    d = Driver().lead()
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"e%d" % k for k in range(20)]), "put")
    d.drain()
    committed = d.store.committed_index

    def rotten(through: int) -> int:
        raise CorruptEntryError(through + 1, f"entry {through + 1}: body crc mismatch")

    monkeypatch.setattr(d.store, "compaction_begin", rotten)
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=True, through=10), "c1")
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(compact=True, through=12), "c2")
    taken = [a for a in d.drain() if isinstance(a, TakeSnapshot)]
    assert [t.index for t in taken] == [committed]
    d.node.complete(SnapshotTaken(committed, ""), d.now)
    answers = _replies(d.drain())
    for token in ("c1", "c2"):
        r = answers[token]
        assert isinstance(r, SnapshotResponse) and r.code == ResponseCode.DISK_ERROR, r
        assert "body crc mismatch" in r.message, r
    assert d.node.corrupt is not None and d.node.corrupt[0] == 11
