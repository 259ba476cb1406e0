"""Membership changes mixed into the simulator's seeded fault schedules (`--membership`): learners
added with empty stores, promoted when caught up, voters and leaders removed and left running.
Besides Raft's invariants, after every event: at most one leader per term across configurations,
a committed configuration never rolls back, a removed member never leads (sim.cluster); at the
end, no acknowledged append lost."""

from __future__ import annotations

import os

import pytest

from dledger.sim.schedule import run_seed

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("DLEDGER_SIM_MEMBERSHIP_SEEDS", "300"))
CHUNK = 50
START = 700_000  # seeds of their own: the plain schedules keep theirs


@pytest.mark.parametrize("start", range(START, START + SEEDS, CHUNK))
def test_membership_seeds_keep_the_invariants(start: int) -> None:
    failures = []
    for seed in range(start, min(start + CHUNK, START + SEEDS)):
        rep = run_seed(seed, membership=True)
        if not rep.ok:
            trace = "\n".join(rep.trace[-40:])
            failures.append(f"{rep.summary()}\n  " + "\n  ".join(rep.violations) + f"\n{trace}")
    assert not failures, ("replay with: python -m dledger.sim --membership --start SEED --seeds 1 --trace\n"
                          + "\n".join(failures))


def test_membership_schedules_change_members() -> None:
    """Guard against a checker that passes because nothing happens: changes are asked and
    commit, members are removed (a leader among them) and added, appends are acknowledged."""
    reps = [run_seed(s, membership=True) for s in range(START, START + 30)]
    assert sum(r.changes for r in reps) > 40
    assert sum(r.configs for r in reps) > 20
    assert sum(r.acked for r in reps) > 300
    traces = [t for r in reps for t in r.trace]
    assert any("new member" in t for t in traces)
    assert any(": remove " in t for t in traces) and any(": promote " in t for t in traces)

