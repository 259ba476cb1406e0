"""Random fault schedules by seed, run on SimCluster, with Raft's invariants checked.

A seed fixes everything: group size, flush mode, network faults, the order of
crashes, restarts, partitions, disk faults and client appends. `run_seed(seed)`
returns a report; a failing seed prints its trace and replays exactly with the
same seed.

Disk faults (half the seeds): fsyncs slower than every timeout, a failing write,
a failing fsync (the store fails until the disk is repaired), a full disk on one
or on all members, power loss of the whole group at once or in sequence (sync
mode only: in async mode losing the page cache of a majority loses acknowledged
appends by design), a member restarting onto a failed disk, retention under disk
pressure while a follower lags, bit rot in one member's committed record (one member at a
time: the others hold good copies), which must be found, kept from leading and repaired
before the run ends. Liveness: whenever the network is whole and a
majority of voters is up with fast, writable disks, an append must commit within
LIVENESS_MS of simulated time.

Membership (`membership=True`, `--membership`): between the faults, the leader is asked to
add a learner (started at once with a fresh empty store, as `dledger server --join`), to
promote a learner (refused while it is behind), or to remove a voter (the leader too) or a
learner; a removed member keeps running. The simulator checks that a committed configuration
never rolls back and that a removed member never leads (sim.cluster).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dledger.codes import ResponseCode
from dledger.controller.machine import ControllerStateMachine
from dledger.entry import DLedgerEntry
from dledger.kv.commands import Cas, Delete, Put, encode
from dledger.sim.cluster import NetConfig, SimCluster
from dledger.sim.controller import Referee, command
from dledger.sim.producers import SimProducers
from dledger.store.base import CorruptEntryError, LedgerStore

LIVENESS_MS = 15_000


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
    installs: int = 0  # snapshots members installed from a leader
    reads: int = 0  # linearizable and lease reads answered (and checked)
    changes: int = 0  # membership changes asked of the leader (--membership)
    configs: int = 0  # configurations seen committed
    sim_ms: int = 0

    def summary(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return (f"seed {self.seed}: {state} ({self.members} members, flush={self.flush}, {self.acked} acked, "
                f"{self.faults} faults, {self.sim_ms} ms simulated)")


def run_seed(seed: int, steps: int = 14, machine: str = "kv", idempotent: bool = False,
             membership: bool = False) -> SimReport:
    """`machine`: "kv" (a third of the seeds apply the log to a KV store, the rest are plain
    logs) or "controller" (every seed's members run the controller: sim.controller).
    `idempotent`: the appends come from idempotent producers (sim.producers), checked for
    bodies stored twice. `membership`: membership changes among the faults (their own random
    source: without them every seed runs as before)."""
    r = random.Random(seed)
    n = r.choice((3, 5))
    flush = r.choice(("sync", "async"))
    net = NetConfig(1, r.choice((3, 10, 30)), loss=r.choice((0.0, 0.02, 0.1)), duplicate=r.choice((0.0, 0.05)))
    # a third of the seeds apply the log to a KV store, snapshot often and compact behind it
    machines = r.random() < 0.35 or machine == "controller"
    referee = Referee() if machine == "controller" else None
    unclean = r.random() < 0.3 if referee is not None else False
    # small install chunks: a snapshot takes several, so installs are cut off and resumed
    extra = dict(state_machines=referee.machine if referee is not None else True,
                 snapshot_threshold_entries=r.choice((5, 20, 60)), snapshot_margin_entries=r.choice((0, 5, 30)),
                 install_chunk_bytes=r.choice((16, 64, 1024))) if machines else {}
    # odd membership seeds take unknown leaders only once vouched for, as members with TLS do
    c = SimCluster(n, seed=seed, net=net, tick_ms=20, flush=flush, strict_members=membership and seed % 2 == 1,
                   **extra)
    report = SimReport(seed, n, flush, True)
    disk_faults = r.random() < 0.5
    bodies: dict[int, bytes] = {}
    down: list[str] = []
    producers = SimProducers(c, random.Random(seed * 7 + 1)) if idempotent and referee is None else None
    changes = random.Random(seed * 31 + 3) if membership else None

    def produced(name: str, seq: int, count: int) -> list[bytes]:
        out = [f"{seed}-{name}-{seq + j}".encode() for j in range(count)]
        return [encode(Put(f"k{r.randint(0, 12)}".encode(), b)) for b in out] if machines else out  # unique

    for step in range(steps):
        report.faults += _fault(c, r, n, flush, down)
        if disk_faults:
            report.faults += _disk_fault(c, r, n, flush, down)
        if changes is not None:
            report.changes += _membership_change(c, changes)
        if producers is not None:
            producers.step(produced)
        for k in range(r.randint(1, 6) if producers is None else 0):
            body = [f"{seed}-{step}-{k}-{j}".encode() for j in range(r.randint(1, 3))]
            if referee is not None:  # controller commands, made from some member's applied state
                body = [command(r, _view(c, r), unclean) for _ in range(r.randint(1, 8))]
            elif machines:  # KV commands: a few keys, overwritten and deleted
                body = [_kv_command(r, b) for b in body]
            cid = c.append(r.choice(c.ids), body)
            bodies[cid] = body[0]
        for _ in range(r.randint(0, 3)):  # reads: the reads invariant (sim.cluster._check_read)
            c.read(r.choice(c.ids), r.choice(("linearizable", "lease")), addressed=r.random() < 0.4)
        c.run(r.randint(50, 800))
        if disk_faults and r.random() < 0.3 and _should_be_live(c):
            _commit_within(c, LIVENESS_MS, report, "with a healthy majority")
            if report.violations:
                break
    _settle(c, down, report)
    if producers is not None:
        producers.finish()
    _final_checks(c, bodies, report)
    if producers is not None and (leader := c.leader()) is not None:
        report.violations.extend(producers.check(leader))
        report.acked += len(producers.acked)
        report.faults += sum(p.resent for p in producers.producers)
    if referee is not None:
        report.violations.extend(referee.violations)
    report.sim_ms = c.now
    report.installs = c.machines.installs
    report.reads = c.reads_checked
    report.configs = len(c.configs)
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


def _disk_fault(c: SimCluster, r: random.Random, n: int, flush: str, down: list[str]) -> int:
    """One disk fault (or a repair, or none)."""
    up = sorted(set(c.ids) - set(down))
    m = r.choice(up)
    if r.random() < 0.5 and c.leader() in up:
        m = c.leader() or m
    x = r.random()
    if x < 0.12:
        c.slow_disk(m, 1200, 4000)
    elif x < 0.22:
        c.disk_fault(m, "write_error")
    elif x < 0.30:
        c.disk_fault(m, "fsync_error")
    elif x < 0.40:
        kind = r.choice(("full", "soft_full"))
        for i in (c.ids if r.random() < 0.3 else [m]):
            c.disk_fault(i, kind)
    elif x < 0.48:
        c.disk_fault(m, "pressure")
    elif x < 0.56 and flush == "sync":
        _power_loss_all(c, r, down)
    elif x < 0.62 and m not in down and len(down) < (n - 1) // 2:
        c.crash(m, lose_unsynced=flush == "sync")  # restarts onto a failed disk
        c.stores[m].failed = "disk failed while the member was down"
        c.start(m)
    elif x < 0.85:
        _repair(c, r, flush)
    elif x < 0.91:
        return _rot(c, r)
    else:
        return 0
    return 1


MAX_MEMBERS = 7  # voters and learners the membership changes grow a group to


def _membership_change(c: SimCluster, r: random.Random) -> int:
    """Ask the leader for one membership change (or none): add a learner and start it with an
    empty store, promote a learner, remove a voter (the leader too, a third of the time) while
    three remain, or remove a learner. Refusals (one pending, a learner behind, a leader not
    ready) are part of the schedule. Returns 1 if a change was asked."""
    leader = c.leader()
    if leader is None or r.random() < 0.4:
        return 0
    cfg = c.config(leader)
    x = r.random()
    if x < 0.35 and len(cfg.members) < MAX_MEMBERS:
        new = f"n{len(c.ids)}"
        token = c.change_members(leader, "add-learner", new, c.address(new))
        if token not in c.test_answers:  # not refused at once: the operator starts it (`--join`)
            c.add_member(c.config(leader))
    elif x < 0.65 and cfg.learners:
        c.change_members(leader, "promote", r.choice(sorted(cfg.learners)))
    elif x < 0.9 and len(cfg.voters) > 3:
        voters = sorted(cfg.voters)
        c.change_members(leader, "remove", leader if r.random() < 0.33 else r.choice(voters))
    elif cfg.learners:
        c.change_members(leader, "remove", r.choice(sorted(cfg.learners)))
    else:
        return 0
    return 1


def _check_applied(c: SimCluster, report: SimReport) -> None:
    """Every running member's state machine applies up to its commit index (none stopped):
    one that was away while the others compacted installs the leader's snapshot. A removed
    member is out of the group: nobody repairs or feeds it (it must know it was removed)."""
    def applied() -> bool:
        return all((st := n.role_view()).has_state_machine and st.applied_index >= c.stores[i].committed_index
                   for i, n in c.nodes.items() if n is not None and not n.not_a_member)

    if not c.run_until(applied, 10_000):
        views = {i: n.status() for i, n in c.nodes.items() if n is not None}
        state = {i: (st.applied_index if st.has_state_machine else None, c.stores[i].committed_index,
                     st.state_machine_error or None if st.has_state_machine else None) for i, st in views.items()}
        report.violations.append(f"state machines did not apply up to the commit index: {state}")


def _view(c: SimCluster, r: random.Random) -> ControllerStateMachine | None:
    """A running member's controller state, as a broker or a leader might have seen it."""
    up = [i for i in c.ids if c.nodes[i] is not None and i in c.machines.sms]
    sm = c.machines.sms[r.choice(up)] if up else None
    return sm if isinstance(sm, ControllerStateMachine) else None


def _kv_command(r: random.Random, value: bytes) -> bytes:
    key = f"k{r.randint(0, 12)}".encode()
    if r.random() < 0.15:
        return encode(Delete(key))
    if r.random() < 0.2:
        return encode(Cas(key, value, expect_index=r.randint(-1, 40)))
    return encode(Put(key, value))


def _rot(c: SimCluster, r: random.Random) -> int:
    """Flip a byte of a committed record on one member, while no other record is damaged
    (so good copies remain) and every member still holds that index (retention)."""
    if c.damaged():
        return 0
    m = r.choice([i for i in c.ids if i not in c.removed])  # (nobody repairs a removed member's records)
    st = c.stores[m]
    lo = max(s.begin_index for s in c.stores.values())
    if st.committed_index < lo:
        return 0
    # mostly the body; also header fields no CRC covers (the index alone reveals a magic flip)
    c.corrupt(m, r.randint(lo, st.committed_index), r.choice(("body", "body", "channel", "magic")))
    return 1


def _power_loss_all(c: SimCluster, r: random.Random, down: list[str]) -> None:
    """Every member loses power, at once or one after another; all restart in some order."""
    at_once = r.random() < 0.5
    for i in c.ids:
        if c.nodes[i] is not None:
            c.crash(i, lose_unsynced=True)
            if not at_once:
                c.run(r.randint(1, 200))
    down.clear()
    order = list(c.ids)
    r.shuffle(order)
    for i in order:
        c.run(r.randint(0, 300))
        c.start(i)


def _repair(c: SimCluster, r: random.Random, flush: str) -> None:
    """Clear one member's disk faults; a failed disk is replaced under a restarted member."""
    i = r.choice(c.ids)
    c.fsync_ms.pop(i, None)
    st = c.stores[i]
    st.full = st.soft_full = False
    if r.random() < 0.3:
        st.pressure = False
    if st.failed is not None and c.nodes[i] is not None:
        c.crash(i, lose_unsynced=flush == "sync")  # a failed fsync may have lost the page cache
        c.disk_fault(i, "repair")
        c.start(i)
    c.trace.append(f"{c.now} repaired disk of {i}")


def _should_be_live(c: SimCluster) -> bool:
    """The network is whole and a majority of the voters is up with fast disks that can write."""
    if c.blocked or c.fsync_ms:
        return False
    healthy = set(c.healthy_disks())
    # a majority of the voters of every configuration that may decide: the committed one and
    # those in force on running members (one not committed yet decides if its holders elect)
    voter_sets = {tuple(c.voters)} | {tuple(n.member.voters) for n in c.nodes.values() if n is not None}
    return all(len(healthy.intersection(v)) >= len(v) // 2 + 1 for v in voter_sets)


def _commit_within(c: SimCluster, bound_ms: int, report: SimReport, when: str) -> bool:
    """Some member leads and commits a new append within `bound_ms` of simulated time, on a
    reliable network (random loss tests safety: a bare majority under 10 % loss can lose
    one needed vote in every round for a while, as the final settle also assumes)."""
    loss, c.net.loss = c.net.loss, 0.0
    try:
        return _probe(c, bound_ms, report, when)
    finally:
        c.net.loss = loss


def _probe(c: SimCluster, bound_ms: int, report: SimReport, when: str) -> bool:
    deadline = c.now + bound_ms
    while True:  # an unknown outcome (TERM_CHANGED, timeout) is retried, as a user would
        cid = c.append(c.leader() or c.rng.choice(c.ids), [b"probe"])
        c.run_until(lambda cid=cid: cid in c.client_results, max(deadline - c.now, 1))  # type: ignore[misc]
        if cid in c.client_results and c.client_results[cid].code == ResponseCode.SUCCESS:
            return True
        if c.now >= deadline:
            if not _should_be_live(c):
                return False  # the group itself became full (retention held for a member): DISK_FULL is right
            report.violations.append(f"{c.now}: no append committed within {bound_ms} ms {when} "
                                     f"(leader {c.leader()}, last answer {c.client_results.get(cid)})")
            return False


def _settle(c: SimCluster, down: list[str], report: SimReport) -> None:
    """Heal everything (network and disks); the group must elect and commit again within
    a bound, and every member catch up."""
    c.heal()
    c.net.loss = 0.0
    c.fsync_ms.clear()
    for i in c.ids:
        st = c.stores[i]
        st.full = st.soft_full = st.write_error_once = st.fsync_error_once = False
        if st.failed is not None:
            if c.nodes[i] is not None:
                c.crash(i, lose_unsynced=c.sync)
                down.append(i)
            c.disk_fault(i, "repair")
    while down:
        c.start(down.pop(0))
    if not c.run_until(lambda: c.leader() is not None, 15_000):
        report.violations.append("no leader within 15 s after the last fault healed")
        return
    leader = c.leader()
    assert leader is not None
    if not _commit_within(c, 15_000, report, "after the last fault healed"):
        if not report.violations:
            report.violations.append(f"{c.now}: no append committed within 15000 ms after the last fault healed "
                                     f"(disks: {[(i, str(c.stores[i].pressure_error())) for i in c.ids]})")
        return
    top = c.stores[c.leader() or leader].committed_index
    # (removed members, and ones whose addition was lost, stay behind: no leader repairs them)
    members = list(c.config(c.leader() or leader).members)
    converged = c.run_until(lambda: all(c.stores[i].committed_index >= top for i in members), 15_000)
    final = c.config(c.leader() or leader)
    if converged and (differ := [i for i in members if c.nodes[i] is not None and c.config(i) != final]):
        report.violations.append(f"members caught up but hold another configuration than the leader's: {differ}")
    if not converged:
        state = {i: (c.stores[i].end_index, c.stores[i].committed_index) for i in members}
        report.violations.append(f"members did not catch up to commit {top} within 15 s: {state}")
    # bit rot: found by the scrub (a pass every 10 s) and repaired from the leader's copy;
    # below a member's log begin retention passed (no member needs the entry): beyond repair
    def repairable() -> list[tuple[str, int]]:
        floor = max(st.begin_index for st in c.stores.values())
        return [(m, i) for m, i in c.damaged() if i >= floor and m in members]

    if repairable() and not c.run_until(lambda: not repairable(), 40_000):
        report.violations.append(f"corrupt records not repaired within 40 s: {repairable()} "
                                 f"(leader {c.leader()})")


def _entry_or_none(store: LedgerStore, index: int) -> DLedgerEntry | None:
    """The verified entry, or None when it is beyond the log or its record is corrupt (below
    the leader's log begin a rotten copy cannot be repaired: another member's may serve)."""
    if index > store.end_index:
        return None
    try:
        return store.get(index)
    except CorruptEntryError:
        return None


def _final_checks(c: SimCluster, bodies: dict[int, bytes], report: SimReport) -> None:
    if c.machines.kv:
        _check_applied(c, report)
    c.check_log_matching()
    report.violations.extend(c.violations)
    leader = c.leader()
    if leader is None:
        return
    store = c.stores[leader]
    # retention may have deleted the prefix on the leader: older members may still hold it (not
    # the removed ones, nor the ones never added: their logs may hold what the group truncated)
    members = c.config(leader).members
    others = sorted((st for i, st in c.stores.items() if i in members), key=lambda st: st.begin_index)
    retained = others[-1].begin_index  # below this the group's retention floor has passed
    for cid, res in sorted(c.client_results.items()):
        if res.code != ResponseCode.SUCCESS or cid not in bodies:
            continue
        report.acked += 1
        holders = [store] if res.index >= store.begin_index else [
            st for st in others if st.begin_index <= res.index <= st.end_index]
        if not holders and all(res.index < st.begin_index for st in others):
            continue  # deleted everywhere by retention; checked when it was committed
        copies = [_entry_or_none(st, res.index) for st in holders]
        if res.index < retained and all(e is None for e in copies):
            continue  # retention deleted it on a member: a copy that rotted is beyond repair
        if not any(e is not None and e.body == bodies[cid] and e.term == res.term for e in copies):
            report.violations.append(f"acknowledged append {cid} missing at index {res.index}")
