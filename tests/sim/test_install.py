"""InstallSnapshot in the simulator (issue 12), deterministic: a member whose disk was replaced
gets the leader's snapshot in small chunks; chunks lost on the way are sent again from the last
one acknowledged (never from 0); a crash in the middle of an install starts it over and ends
with the same state; the member shows its progress in METADATA while it lasts."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core.messages import InstallSnapshotRequest, MetadataRequest, MetadataResponse
from dledger.kv.commands import Put, encode
from dledger.sim.cluster import SimCluster
from dledger.sim.disk import SimDiskStore

pytestmark = pytest.mark.sim


def _compacted(seed: int, **cfg: Any) -> tuple[SimCluster, str]:
    """A KV group whose members snapshotted and compacted; one follower's disk replaced (empty)."""
    c = SimCluster(3, seed=seed, state_machines=True, snapshot_threshold_entries=10, snapshot_margin_entries=0,
                   install_chunk_bytes=32, **cfg)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    ids = [c.append(leader, [encode(Put(f"k{k}".encode(), b"v" * (k % 9)))]) for k in range(80)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 20_000)
    c.run(1_000)
    assert c.stores[leader].begin_index > 10
    x = next(m for m in c.ids if m != leader)
    c.crash(x)
    c.stores[x] = SimDiskStore()
    c.machines.snapshots[x] = []
    return c, x


def _offsets_to(c: SimCluster, x: str) -> list[int]:
    """Record the offset of every install chunk sent to x (in send order)."""
    seen: list[int] = []
    send = c._send

    def spy(src: str, a: Any) -> None:
        if a.peer == x and a.code == RequestCode.INSTALL_SNAPSHOT:
            assert isinstance(a.msg, InstallSnapshotRequest)
            seen.append(a.msg.offset)
        send(src, a)

    c._send = spy  # type: ignore[method-assign]
    return seen


def _caught_up(c: SimCluster, x: str) -> bool:
    lead = c.leader()
    if lead is None or c.nodes[x] is None:
        return False
    a, la = c._node(x).applier, c._node(lead).applier
    return a is not None and la is not None and a.applied_index >= la.applied_index >= 0


def _same_state(c: SimCluster) -> None:
    dumps = {m: c.machines.digest(m) for m in c.ids}
    assert len(set(dumps.values())) == 1, dumps


def test_a_replaced_disk_installs_the_snapshot_in_chunks_resuming_after_losses() -> None:
    c, x = _compacted(4)
    offsets = _offsets_to(c, x)
    c.net.loss = 0.1  # chunks and answers are lost now and then (each costs a request timeout)
    c.start(x)
    assert c.run_until(lambda: _caught_up(c, x), 120_000)
    c.net.loss = 0.0
    assert len(set(offsets)) > 3, f"one chunk only: {offsets}"
    assert len(offsets) > len(set(offsets)), "no chunk was ever lost and sent again"
    # a lost chunk (or answer) is sent again from where the follower is, never from the start
    assert all(b >= a for a, b in itertools.pairwise(offsets) if b != 0), offsets
    assert c.stores[x].begin_index > 10 and c.machines.installs >= 1
    _same_state(c)
    assert not c.violations


def test_a_crash_in_the_middle_of_an_install_starts_it_over() -> None:
    c, x = _compacted(5)
    offsets = _offsets_to(c, x)
    c.start(x)
    assert c.run_until(lambda: len(offsets) >= 3 and max(offsets) > 0, 10_000)
    meta = _metadata(c, x)
    assert meta.install_index >= 0 and 0 < meta.install_bytes < meta.install_total, meta
    c.crash(x)  # the partial copy is gone (a .tmp- directory deleted at start)
    assert not c.machines.snapshots[x]
    c.start(x)
    assert c.run_until(lambda: _caught_up(c, x), 30_000)
    assert 0 in offsets[3:], "the install did not start over"
    assert _metadata(c, x).install_index == -1
    _same_state(c)
    assert not c.violations


def _metadata(c: SimCluster, member: str) -> MetadataResponse:
    token = ("test", member, c.now)
    c._node(member).handle(RequestCode.METADATA, MetadataRequest(), b"", token, c.now)
    c._flush(member)
    resp = c.test_answers.pop(token)
    assert isinstance(resp, MetadataResponse) and resp.code == ResponseCode.SUCCESS
    return resp
