"""Membership changes mixed into the simulator's seeded fault schedules (`--membership`): learners
added with empty stores, promoted when caught up, voters and leaders removed and left running.
Besides Raft's invariants, after every event: at most one leader per term across configurations,
a committed configuration never rolls back, a removed member never leads (sim.cluster); at the
end, no acknowledged append lost."""

from __future__ import annotations

import os
from typing import Any

import pytest

from dledger.codes import ResponseCode
from dledger.kv.commands import Put, encode
from dledger.sim.cluster import SimCluster
from dledger.sim.schedule import run_seed

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("DLEDGER_SIM_MEMBERSHIP_SEEDS", "200"))  # `make soak`: 2,000
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



def _leader(c: SimCluster) -> str:
    return c.wait_leader()


def _change(c: SimCluster, op: str, target: str, addr: str = "") -> None:
    r = c.change(op, target, addr)
    assert r.code == ResponseCode.SUCCESS, r


@pytest.mark.parametrize("machines", [False, True])
def test_every_original_member_replaced_under_appends_loses_nothing(machines: bool) -> None:
    """Add a learner, promote it, remove an original member (the leader when it is one), three
    times, while appends flow: every acknowledged append is in the final group's log, whose
    members are all new; the removed members, left running, cause no election."""
    extra: dict[str, Any] = dict(state_machines=True, snapshot_threshold_entries=10,
                                    snapshot_margin_entries=2) if machines else {}
    c = SimCluster(3, seed=11, tick_ms=20, **extra)
    originals = list(c.ids)
    sent: dict[int, bytes] = {}

    def write(k: int) -> None:
        body = encode(Put(b"k%d" % (k % 7), b"v%d" % k)) if machines else b"e%d" % k
        sent[c.append(_leader(c), [body])] = body

    k = 0
    for old in originals:
        new = f"n{len(c.ids)}"
        _change(c, "add-learner", new, c.address(new))
        c.add_member(c.config(_leader(c)))
        for _ in range(10):
            write(k)
            k += 1
            c.run(30)
        _change(c, "promote", new)
        for _ in range(5):
            write(k)
            k += 1
            c.run(30)
        _change(c, "remove", old)
    # (a removed leader leads its term until its hand-over is elected)
    assert c.run_until(lambda: c.leader() in ("n3", "n4", "n5"), 10_000)
    leader = _leader(c)
    final = c.config(leader)
    assert set(final.voters) == {"n3", "n4", "n5"} and not final.learners
    c.run(2_000)
    term = c._node(leader).role_view().term
    c.run(60_000)  # the removed members keep running a minute: no election
    assert c.leader() == leader and c._node(leader).role_view().term == term
    assert all(c.nodes[o] is not None and c._node(o).status().not_a_member for o in originals)
    acked = {cid: r for cid, r in c.client_results.items() if r.code == ResponseCode.SUCCESS and cid in sent}
    assert len(acked) > len(sent) // 2  # the writer was served through the changes
    store = c.stores[leader]
    for cid, r in acked.items():
        if r.index >= store.begin_index:
            e = store.get(r.index)
            assert e.body == sent[cid] and e.term == r.term
    if machines:
        assert c.machines.installs > 0 or all(c.stores[m].begin_index == 0 for m in final.members)
    assert not c.violations
