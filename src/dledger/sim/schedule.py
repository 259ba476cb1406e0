"""Random fault schedules by seed, run on SimCluster, with Raft's invariants checked.

A seed fixes everything: group size, flush mode, network faults, the order of
crashes, restarts, partitions and client appends. `run_seed(seed)` returns a
report; a failing seed prints its trace and replays exactly with the same seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dledger.codes import ResponseCode
from dledger.sim.cluster import NetConfig, SimCluster


@dataclass
class SimReport:
    seed: int
    members: int
    flush: str
    ok: bool
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    acked: int = 0
    faults: int = 0
    sim_ms: int = 0

    def summary(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return (f"seed {self.seed}: {state} ({self.members} members, flush={self.flush}, {self.acked} acked, "
                f"{self.faults} faults, {self.sim_ms} ms simulated)")


def run_seed(seed: int, steps: int = 14) -> SimReport:
    r = random.Random(seed)
    n = r.choice((3, 5))
    flush = r.choice(("sync", "async"))
    net = NetConfig(1, r.choice((3, 10, 30)), loss=r.choice((0.0, 0.02, 0.1)), duplicate=r.choice((0.0, 0.05)))
    c = SimCluster(n, seed=seed, net=net, tick_ms=20, flush=flush)
    report = SimReport(seed, n, flush, True)
    bodies: dict[int, bytes] = {}
    down: list[str] = []
    for step in range(steps):
        report.faults += _fault(c, r, n, flush, down)
        for k in range(r.randint(1, 6)):
            body = [f"{seed}-{step}-{k}-{j}".encode() for j in range(r.randint(1, 3))]
            cid = c.append(r.choice(c.ids), body)
            bodies[cid] = body[0]
        c.run(r.randint(50, 800))
    _settle(c, down, report)
    _final_checks(c, bodies, report)
    report.sim_ms = c.now
    report.ok = not report.violations
    report.trace = c.trace
    return report


def _fault(c: SimCluster, r: random.Random, n: int, flush: str, down: list[str]) -> int:
    """One scheduled fault (or none). In async mode a crash keeps the page cache
    (process crash): losing acknowledged-but-unflushed writes there is by design."""
    x = r.random()
    if x < 0.2 and len(down) < (n - 1) // 2:
        m = r.choice(sorted(set(c.ids) - set(down)))
        if r.random() < 0.5 and c.leader() is not None and c.leader() not in down:
            m = c.leader() or m
        c.crash(m, lose_unsynced=(flush == "sync"))
        down.append(m)
        return 1
    if x < 0.35 and down:
        c.start(down.pop(0))
        return 1
    if x < 0.5:
        ids = list(c.ids)
        r.shuffle(ids)
        k = r.randint(1, n - 1)
        c.partition(ids[:k], ids[k:])
        return 1
    if x < 0.6:
        c.heal()
    return 0


def _settle(c: SimCluster, down: list[str], report: SimReport) -> None:
    """Heal everything; the group must elect and commit again within a bound."""
    c.heal()
    c.net.loss = 0.0
    while down:
        c.start(down.pop(0))
    if not c.run_until(lambda: c.leader() is not None, 15_000):
        report.violations.append("no leader within 15 s after the last fault healed")
        return
    leader = c.leader()
    assert leader is not None
    deadline = c.now + 15_000
    while True:  # an unknown outcome (TERM_CHANGED, timeout) is retried, as a user would
        cid = c.append(c.leader() or leader, [b"final"])
        c.run_until(lambda cid=cid: cid in c.client_results, max(deadline - c.now, 1))  # type: ignore[misc]
        if cid in c.client_results and c.client_results[cid].code == ResponseCode.SUCCESS:
            break
        if c.now >= deadline:
            report.violations.append(f"final append not committed within 15 s: {c.client_results.get(cid)}")
            return
    top = c.stores[c.leader() or leader].committed_index
    converged = c.run_until(lambda: all(c.stores[i].committed_index >= top for i in c.ids), 15_000)
    if not converged:
        state = {i: (c.stores[i].end_index, c.stores[i].committed_index) for i in c.ids}
        report.violations.append(f"members did not catch up to commit {top} within 15 s: {state}")


def _final_checks(c: SimCluster, bodies: dict[int, bytes], report: SimReport) -> None:
    c.check_log_matching()
    report.violations.extend(c.violations)
    leader = c.leader()
    if leader is None:
        return
    store = c.stores[leader]
    for cid, res in sorted(c.client_results.items()):
        if res.code != ResponseCode.SUCCESS or cid not in bodies:
            continue
        report.acked += 1
        e = store.get(res.index) if res.index <= store.end_index else None
        if e is None or e.body != bodies[cid] or e.term != res.term:
            report.violations.append(f"acknowledged append {cid} missing at index {res.index}")
