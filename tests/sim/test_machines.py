"""State machines in the simulator (issue 12): KV stores on every member, snapshots and
compaction behind them, a power loss and a restart from a snapshot; every two members at the
same applied index hold the same state (checked after every apply by SimCluster)."""

from __future__ import annotations

import itertools

import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core.messages import QueryRequest
from dledger.kv.commands import Get, Put, decode_item, encode
from dledger.sim.cluster import SimCluster

pytestmark = pytest.mark.sim

_TOKENS = itertools.count()


def _puts(c: SimCluster, leader: str, keys: range) -> None:
    ids = [c.append(leader, [encode(Put(f"k{k % 7}".encode(), f"v{k}".encode()))]) for k in keys]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 20_000)
    assert all(c.client_results[i].code == ResponseCode.SUCCESS for i in ids)


@pytest.mark.parametrize("seed", range(3))
def test_members_snapshot_compact_and_rebuild_the_same_state(seed: int) -> None:
    c = SimCluster(3, seed=seed, state_machines=True, snapshot_threshold_entries=10, snapshot_margin_entries=2)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    _puts(c, leader, range(60))
    c.run(1_000)
    for m in c.ids:
        node = c._node(m)
        assert node.snapshot_index >= 40, (m, node.snapshot_index)
        assert c.stores[m].begin_index > 0, f"{m} kept its whole log"
    x = next(m for m in c.ids if m != c.leader())
    c.crash(x, lose_unsynced=True)
    leader = c.leader() or leader
    _puts(c, leader, range(60, 80))
    c.start(x)
    assert c.run_until(lambda: c._node(x).applier.applied_index  # type: ignore[union-attr]
                       >= c.stores[leader].committed_index, 10_000)
    token = ("test", next(_TOKENS))
    c._node(leader).handle(RequestCode.QUERY, QueryRequest(request=encode(Get(b"k2"))), b"", token, c.now)
    c._flush(leader)
    assert c.run_until(lambda: token in c.test_answers, 3_000)
    item = decode_item(c.test_answers[token].result)
    assert item is not None and item.value == b"v79"  # the last put of k2 (79 % 7 == 2)
    dumps = {m: c.machines.digest(m) for m in c.ids}
    assert len(set(dumps.values())) == 1
    assert not c.violations
