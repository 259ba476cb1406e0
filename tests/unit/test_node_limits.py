"""Bounded work per request on a Node driven by hand (issue 26): SNAPSHOT requests share the
snapshot being taken, long polls released by one big append are answered a budget per drain,
log lines a forged push triggers are rate-limited, and an install larger than the disk is
answered DISK_FULL."""

from __future__ import annotations

import logging
import random
import zlib
from typing import Any

import pytest

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core import reads as reads_module
from dledger.core.contexts import Applied, ChunkInstalled, SnapshotTaken
from dledger.core.messages import (
    AppendRequest,
    EntriesResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    PushRequest,
    ReadRequest,
    SnapshotFile,
    SnapshotRequest,
    SnapshotResponse,
)
from dledger.core.node import Action, Apply, InstallChunk, Node, Reply, TakeSnapshot
from dledger.entry import MAGIC_NOOP
from dledger.runtime.statemachines import StateMachineHost
from dledger.statemachine.applier import Applier
from dledger.store.memory import MemoryLedgerStore

PEERS = "n0-127.0.0.1:20000"
TWO = "n0-127.0.0.1:20000;n1-127.0.0.1:20001"


class Driver:
    """One member with a memory store and a virtual clock; applies are answered at once."""

    def __init__(self, peers: str = PEERS, applier: Applier | None = None) -> None:
        self.cfg = DLedgerConfig(self_id="n0", peers=peers, store_type="memory")
        self.store = MemoryLedgerStore(self.cfg.max_body_bytes)
        self.now = 0
        self.node = Node(self.cfg, self.store, self.now, random.Random(1), applier=applier)

    def drain(self) -> list[Action]:
        out: list[Action] = []
        for a in self.node.drain():
            if isinstance(a, Apply):
                self.node.complete(Applied([b""] * len(a.batch.entries)), self.now)
            else:
                out.append(a)
        return out

    def tick(self, ms: int = 10) -> list[Action]:
        self.now += ms
        self.node.tick(self.now)
        return self.drain()

    def lead(self) -> Driver:
        for _ in range(1000):
            if self.node.member.is_leader and self.store.committed_index >= 0:
                break
            self.tick()
        assert self.node.member.is_leader
        return self

    def send(self, code: int, msg: Any, token: Any, data: bytes = b"") -> None:
        self.node.handle(code, msg, data, token, self.now)


def _replies(actions: list[Action]) -> dict[Any, Any]:
    return {a.token: a.msg for a in actions if isinstance(a, Reply)}


# --- SNAPSHOT requests coalesce ----------------------------------------------------------------


def test_snapshot_requests_during_a_snapshot_share_it() -> None:
    """15 SNAPSHOT requests against a big state made puts' p99 go from 42 ms to 1.5 s: one
    snapshot at a time, and a request arriving meanwhile gets that snapshot's index."""
    d = Driver(applier=Applier(-1)).lead()
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"x"]), "put")
    d.drain()
    for k in range(5):
        d.send(RequestCode.SNAPSHOT, SnapshotRequest(), ("s", k))
    first = d.drain()
    taken = [a for a in first if isinstance(a, TakeSnapshot)]
    assert len(taken) == 1 and not _replies(first).keys() & {("s", k) for k in range(5)}
    d.send(RequestCode.APPEND, AppendRequest(bodies=[b"y"]), "put2")  # applied meanwhile: no matter
    for k in range(5, 10):
        d.send(RequestCode.SNAPSHOT, SnapshotRequest(), ("s", k))
    for _ in range(3):
        assert not any(isinstance(a, TakeSnapshot) for a in d.tick())
    d.node.complete(SnapshotTaken(taken[0].index, ""), d.now)
    answers = _replies(d.drain())
    snaps = [answers[("s", k)] for k in range(10)]
    assert all(isinstance(r, SnapshotResponse) and r.code == 200 and r.snapshot_index == taken[0].index
               for r in snaps)
    d.send(RequestCode.SNAPSHOT, SnapshotRequest(), "later")  # after it: a new one
    assert [a.index for a in d.drain() if isinstance(a, TakeSnapshot)] == [d.node.applier.applied_index]  # type: ignore[union-attr]


# --- long polls: a budget per drain --------------------------------------------------------------


def test_long_polls_released_by_one_append_are_answered_a_budget_per_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    page, budget, body = 16 << 10, 64 << 10, 10 << 10
    monkeypatch.setattr(reads_module, "LONG_POLL_PAGE_BYTES", page)
    monkeypatch.setattr(reads_module, "LONG_POLL_DRAIN_BYTES", budget)
    d = Driver().lead()
    start = d.store.end_index + 1
    polls = {("poll", k): start + (k % 3) for k in range(30)}  # parked at three indexes
    for token, at in polls.items():
        d.send(RequestCode.READ, ReadRequest(from_index=at, consistency="leader", wait_ms=30_000), token)
    assert not _replies(d.drain())
    bodies = [bytes([k]) * body for k in range(12)]
    d.send(RequestCode.APPEND, AppendRequest(bodies=bodies), "append")
    answered: dict[Any, EntriesResponse] = {}
    per_drain: list[int] = []
    order: list[int] = []
    while len(answered) < len(polls):
        got = {t: r for t, r in _replies(d.drain()).items() if t in polls}
        assert got, "a drain answered no parked poll"
        per_drain.append(sum(len(e.body) + 48 for r in got.values() for e in r.entries))
        order += [polls[t] for t in got]
        answered.update(got)
    assert len(per_drain) >= 3 and all(n <= budget + page + body for n in per_drain), per_drain
    assert order == sorted(order)  # in index order
    for token, r in answered.items():
        at = polls[token]
        assert r.code == 200 and 1 <= len(r.entries) <= page // body + 1  # a page, not a plain READ's 16 MiB
        n = len(r.entries)
        assert [e.index for e in r.entries] == list(range(at, at + n)) and r.next_index == at + n
        assert [e.body for e in r.entries] == bodies[at - start : at - start + n]
    d.send(RequestCode.READ, ReadRequest(from_index=start, consistency="leader"), "plain")
    assert len(_replies(d.drain())["plain"].entries) == 12  # a plain READ is not cut to the page


# --- log lines a forged push triggers -------------------------------------------------------------


def _follower_with_committed_entries() -> Driver:
    d = Driver(TWO)
    leader = MemoryLedgerStore()
    leader.append_as_leader([b""], 1, magic=MAGIC_NOOP)
    leader.append_as_leader([b"a", b"b"], 1)
    raw = leader.read_raw(0, 1 << 20)
    data = bytes(raw.data)
    raw.data.release()
    push = PushRequest(leader_id="n1", remote_id="n0", term=1, type=int(PushType.APPEND), prev_index=-1,
                       prev_term=-1, first_index=0, count=3, committed_index=2)
    d.send(RequestCode.PUSH, push, "append", data)
    assert _replies(d.drain())["append"].code == 200 and d.store.committed_index == 2
    return d


def test_a_refused_push_sent_a_thousand_times_logs_a_bounded_number_of_lines(
        caplog: pytest.LogCaptureFixture) -> None:
    """A forged TRUNCATE below the commit index (an old leader logged "refusing to truncate
    committed entries" at ~175 KB/s for ever): refused every time, logged once per 10 s."""
    d = _follower_with_committed_entries()
    forged = PushRequest(leader_id="n1", remote_id="n0", term=2, type=int(PushType.TRUNCATE), prev_index=0,
                         prev_term=1, committed_index=0)
    with caplog.at_level(logging.INFO, logger="dledger"):
        for k in range(1000):
            d.now += 1
            d.send(RequestCode.PUSH, forged, ("t", k))
            assert _replies(d.drain())[("t", k)].code == ResponseCode.INCONSISTENT_STATE
        core = [r for r in caplog.records if r.name.startswith("dledger.core")]
        assert 1 <= len(core) <= 4, [r.getMessage() for r in core]
        assert any("refusing to truncate committed entries" in r.getMessage() for r in core)
        d.now += 10_000
        d.send(RequestCode.PUSH, forged, "after")
        d.drain()
    assert d.store.end_index == 2
    assert any("999 more like this suppressed" in r.getMessage() for r in caplog.records)


# --- an install bigger than the disk --------------------------------------------------------------


def test_an_install_declaring_more_than_the_disk_has_is_answered_disk_full() -> None:
    """A forged install declaring 2**61 bytes wrote 544 MB in 3 s: the first chunk is refused
    before anything is written, and the answer is DISK_FULL with the reason."""
    d = Driver(TWO)
    host = StateMachineHost(d.cfg, None)
    try:
        req = InstallSnapshotRequest(leader_id="n1", remote_id="n0", term=1, last_index=1_000_000, last_term=1,
                                     files={"a": SnapshotFile(1 << 61, 0)}, offset=0, crc=zlib.crc32(b"x" * 64))
        d.send(RequestCode.INSTALL_SNAPSHOT, req, "install", b"x" * 64)
        chunk = next(a for a in d.drain() if isinstance(a, InstallChunk))
        with pytest.raises(Exception) as err:
            host.install_chunk(chunk.meta, chunk.offset, chunk.data, chunk.crc)
        assert not list(host.snapshots.dir.iterdir())  # nothing written, not even a temporary directory
        # (as the runtime reports a worker's failure to the node)
        failure = f"{type(err.value).__name__}: {err.value}"
        d.node.complete(ChunkInstalled("install", chunk.meta, 0, False, failure), d.now)
        answer = _replies(d.drain())["install"]
        assert isinstance(answer, InstallSnapshotResponse) and answer.code == ResponseCode.DISK_FULL
        assert "No space left" in answer.reason and str(1 << 61) in answer.reason
    finally:
        host.close()
