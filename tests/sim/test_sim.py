"""Deterministic simulation of the Raft core: many seeds, invariants after every event."""

from __future__ import annotations

import os

import pytest

from dledger.sim.cluster import SimCluster
from dledger.sim.schedule import run_seed

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("DLEDGER_SIM_SEEDS", "500"))
CHUNK = 50


@pytest.mark.parametrize("start", range(0, SEEDS, CHUNK))
def test_seeds_keep_raft_invariants(start: int) -> None:
    failures = []
    for seed in range(start, min(start + CHUNK, SEEDS)):
        rep = run_seed(seed)
        if not rep.ok:
            trace = "\n".join(rep.trace[-40:])
            failures.append(f"{rep.summary()}\n  " + "\n  ".join(rep.violations) + f"\n{trace}")
    assert not failures, "replay with: python -m dledger.sim --start SEED --seeds 1 --trace\n" + "\n".join(failures)


def test_a_seed_replays_exactly() -> None:
    a, b = run_seed(42), run_seed(42)
    assert a.trace == b.trace and a.acked == b.acked and a.sim_ms == b.sim_ms


def test_schedules_do_real_work() -> None:
    """Guard against a checker that passes because nothing happens."""
    reps = [run_seed(s) for s in range(20)]
    assert sum(r.acked for r in reps) > 200
    assert sum(r.faults for r in reps) > 60
    assert {r.flush for r in reps} == {"sync", "async"}


def test_power_loss_of_a_sync_leader_loses_nothing_acknowledged() -> None:
    c = SimCluster(3, seed=7, flush="sync")
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    ids = [c.append(leader, [f"e{i}".encode()]) for i in range(30)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 10_000)
    acked = {c.client_results[i].index for i in ids if c.client_results[i].code == 200}
    assert len(acked) == 30
    c.crash(leader, lose_unsynced=True)
    assert c.run_until(lambda: c.leader() not in (None, leader), 10_000)
    new = c.leader()
    assert new is not None
    assert all(c.stores[new].get(i).body.startswith(b"e") for i in acked)
    c.start(leader)
    c.run(3000)
    c.check_log_matching()
    assert not c.violations


def test_isolated_member_does_not_raise_the_term() -> None:
    """Pre-vote: a member cut off from the others keeps its term."""
    c = SimCluster(3, seed=3)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    follower = next(i for i in c.ids if i != leader)
    term = c._node(follower).member.term
    c.partition([follower], [i for i in c.ids if i != follower])
    c.run(5000)
    assert c._node(follower).member.term == term
    c.heal()
    c.run(2000)
    assert c.leader() == leader
