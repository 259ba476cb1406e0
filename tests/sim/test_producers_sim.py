"""Idempotent producers under the simulator's faults (sim.producers): no body stored twice."""

from __future__ import annotations

import functools
import logging
import os

import pytest

from dledger.codes import ResponseCode
from dledger.core import producers
from dledger.sim.cluster import SimCluster
from dledger.sim.producers import SimProducers
from dledger.sim.schedule import run_seed

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("DLEDGER_SIM_SEEDS", "300")) // 2  # `make soak`: 2,500
CHUNK = 50


@pytest.mark.parametrize("start", range(0, SEEDS, CHUNK))
def test_producers_store_each_body_once(start: int) -> None:
    logging.disable(logging.CRITICAL)
    try:
        failures = [f"{r.summary()}: {r.violations[:3]}" for seed in range(start, min(start + CHUNK, SEEDS))
                    if not (r := run_seed(seed, idempotent=True)).ok]
    finally:
        logging.disable(logging.NOTSET)
    assert not failures, "replay with: python -m dledger.sim --idempotent --start SEED --seeds 1 --trace\n" + \
        "\n".join(failures)


def test_the_checker_catches_a_leader_that_forgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without deduplication the same seeds store bodies twice: the check is not vacuous,
    and the schedules do retry unknown outcomes and answer duplicates."""
    answered: list[int] = []
    check = SimProducers.check

    def counting(self: SimProducers, leader: str) -> list[str]:
        answered.append(self.duplicates_answered)
        return check(self, leader)

    monkeypatch.setattr(SimProducers, "check", counting)
    logging.disable(logging.CRITICAL)
    try:
        assert all(run_seed(s, idempotent=True).ok for s in range(60))
        assert sum(answered) > 10
        monkeypatch.setattr(producers.ProducerTable, "decide",
                            lambda self, *args, **kwargs: producers.Decision(0))
        assert not all(run_seed(s, idempotent=True).ok for s in range(60))
    finally:
        logging.disable(logging.NOTSET)


def test_a_follower_behind_a_plain_logs_retention_learns_the_producers_from_its_snapshot() -> None:
    """A plain log snapshots its producer table itself (at once under disk pressure) and sends
    that snapshot to a follower that needs entries retention deleted: the follower's table is
    the leader's, so it may lead next without taking a retry for new rows."""
    c = SimCluster(3, seed=4, flush="sync", retention_hold_ms=2_000)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    c.run(500)
    b = next(i for i in c.ids if i != leader)
    for m in c.ids:
        c.disk_fault(m, "pressure")
    c.crash(b, lose_unsynced=True)
    for k in range(60):  # as a producer does: the same sequence again until it is in (a full disk refuses)
        for _ in range(20):
            cid = c.append(c.leader() or leader, [f"e{k}".encode()], "P", k)
            assert c.run_until(functools.partial(c.client_results.__contains__, cid), 10_000)
            if c.client_results[cid].code == ResponseCode.SUCCESS:
                break
            c.run(200)
        assert c.client_results[cid].code == ResponseCode.SUCCESS
    leader = c.leader() or leader
    c.run(5_000)  # b is no longer live: retention deletes what it needs
    assert c.stores[leader].begin_index > c.stores[b].end_index + 1
    c.start(b)
    top = c.stores[leader].committed_index
    node = c.nodes[b]
    assert node is not None
    assert c.run_until(lambda: c.stores[b].committed_index >= top and node.producers.folded >= top
                       and not node._producers_restoring, 20_000)
    c.run(1_000)
    p = node.producers.lookup("P")
    assert p is not None and p.last_seq == 59, "the follower did not learn the producer from the snapshot"
    assert c.stores[b].begin_index > 0 and c.machines.installs >= 1
    assert not c.violations
