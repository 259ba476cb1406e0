"""Named regressions of issue 10's review findings, each driven by the deterministic simulator.

Each scenario is the one the review's audit script built (../shared/audit/), reduced to what
it shows; each failed on the code before the fix.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core.contexts import Durable
from dledger.core.messages import GetRequest, LeadershipTransferRequest, PushResponse, Role, encode
from dledger.sim.cluster import SimCluster
from dledger.sim.disk import SimDiskStore
from dledger.store.base import AppendedBatch, StoreError

pytestmark = pytest.mark.sim


_TOKENS = itertools.count()


def _steady(seed: int, **cfg: object) -> tuple[SimCluster, str, str, str]:
    c = SimCluster(3, seed=seed, **cfg)  # type: ignore[arg-type]
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    a, b = [i for i in c.ids if i != leader]
    c.run(500)  # the NOOP committed everywhere, no flush pending
    return c, leader, a, b


def test_sync_commit_never_counts_a_follower_that_has_not_fsynced() -> None:
    """a_sync_compare: the follower's fsync stalls, the leader's APPEND times out and falls back
    to COMPARE, which the follower answers from its page cache. The entry must not be
    acknowledged (it was, fsynced on the leader alone); a whole-group power loss then loses
    nothing acknowledged."""
    c, leader, a, b = _steady(1, flush="sync")
    c.partition([leader, a], [b])
    c.stores[a].on_request = lambda: None  # a's fsync never completes
    cid = c.append(leader, [b"X"])
    c.run_until(lambda: cid in c.client_results, 5_000)
    res = c.client_results.get(cid)
    assert res is None or res.code != ResponseCode.SUCCESS, f"acknowledged while fsynced on the leader only: {res}"
    for m in (leader, a, b):
        c.crash(m, lose_unsynced=True)
    c.heal()
    for m in (a, b, leader):
        c.start(m)
    c.run(5_000)
    c.check_log_matching()
    assert not c.violations


def test_one_power_loss_after_a_slow_fsync_loses_nothing_acknowledged() -> None:
    """a2_one_power_loss: the follower's fsync takes 1.5 s (longer than max_push_timeout_ms);
    the entry may be acknowledged only once that fsync completed, so the follower's power loss
    and a partition of the old leader cannot lose it."""
    c, leader, a, b = _steady(1, flush="sync")
    c.partition([leader, a], [b])
    c.slow_disk(a, 1500, 1500)
    cid = c.append(leader, [b"X"])
    assert c.run_until(lambda: cid in c.client_results, 5_000)
    res = c.client_results[cid]
    assert res.code == ResponseCode.SUCCESS  # once a's fsync completed, its heartbeat answer reports it
    assert c.stores[a].synced_index >= res.index
    c.crash(a, lose_unsynced=True)
    c.partition([leader], [a, b])
    c.start(a)
    assert c.run_until(lambda: c.leader() not in (None, leader), 10_000)
    new = c.leader()
    assert new is not None
    assert c.stores[new].get(res.index).body == b"X"
    c.run(300)
    assert not c.violations


def test_a_late_durable_index_after_a_truncate_is_not_trusted() -> None:
    """b_publish_race at the node: the flush thread's durable index reaches the node after a
    truncate lowered it; answering the pending sync push on that stale value would claim an
    unsynced entry durable."""
    c, _, a, _ = _steady(2, flush="sync")
    node, store = c._node(a), c.stores[a]
    end = store.end_index
    store.append_as_leader([b"x1", b"x2"], store.end_term)  # a divergent unsynced tail
    store.request_flush()  # a flush starts, covering it
    stale = end + 2
    store.truncate(end + 1)
    store.append_as_leader([b"y1", b"y2"], store.end_term)
    node.complete(Durable(stale), c.now)  # the hint arrives late: it must be clamped
    assert store.durable_index <= store.synced_index
    assert node.handler.durable_match() <= store.synced_index


def _full_disk_wins(seed: int) -> tuple[SimCluster, str, str, dict[str, bool]] | None:
    """Crash the leader while `a`'s disk refuses appends; the run if `a` then won a vote."""
    c, leader, a, b = _steady(seed)
    st, node = c.stores[a], c._node(a)
    full = {"on": True, "won": False}
    orig_append, orig_become = st.append_as_leader, node.become_leader

    def append_as_leader(*args: Any, **kw: Any) -> AppendedBatch:
        if full["on"]:
            raise StoreError(ResponseCode.DISK_FULL, "disk full")
        return orig_append(*args, **kw)

    def become_leader() -> bool:
        full["won"] = True
        return bool(orig_become())

    st.append_as_leader = append_as_leader  # type: ignore[method-assign]
    node.become_leader = become_leader  # type: ignore[method-assign]
    c.crash(leader, lose_unsynced=False)
    c.run_until(lambda: c.leader() is not None, 10_000)
    return (c, a, b, full) if full["won"] else None


def test_a_leader_whose_noop_cannot_be_stored_steps_down_and_the_group_recovers() -> None:
    """d_noop_fail: a member whose disk is full wins an election; storing the NOOP fails. It
    used to stay LEADER with no dispatchers (heartbeating, so nobody else campaigned) until
    an IndexError; now it steps down, stays out of elections while its store fails, and
    another member leads and commits."""
    run = next((r for r in map(_full_disk_wins, range(40)) if r is not None), None)
    assert run is not None, "no seed made the member with the full disk win"
    c, a, b, full = run
    assert c._node(a).member.role != Role.LEADER
    assert c.run_until(lambda: c.leader() == b, 10_000), "the writable member did not take over"
    full["on"] = False
    cid = c.append(b, [b"after"])
    assert c.run_until(lambda: cid in c.client_results, 10_000)
    assert c.client_results[cid].code == ResponseCode.SUCCESS
    assert not c.violations


def test_a_member_with_a_failed_store_does_not_campaign_and_says_why() -> None:
    c, leader, a, _ = _steady(3)
    c.disk_fault(leader, "full")
    assert c.run_until(lambda: c.leader() not in (None, leader), 10_000), "the full-disk leader kept leading"
    c.run(3_000)
    assert c._node(leader).member.role == Role.FOLLOWER
    assert "full" in c._node(leader).metadata().store_error
    cid = c.append(a, [b"x"])
    assert c.run_until(lambda: cid in c.client_results, 10_000)
    assert c.client_results[cid].code == ResponseCode.SUCCESS
    assert not c.violations


def test_retention_keeps_what_a_lagging_follower_needs() -> None:
    """Retention under disk pressure used to delete files a lagging follower still needed
    (set_retention_floor was never called): the follower then looped forever."""
    c, leader, _, b = _steady(4, flush="sync")
    for m in c.ids:
        c.disk_fault(m, "pressure")
    c.crash(b, lose_unsynced=True)
    ids = [c.append(leader, [f"e{k}".encode()]) for k in range(60)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 10_000)
    c.run(2_000)
    c.start(b)
    top = c.stores[leader].committed_index
    assert c.run_until(lambda: c.stores[b].committed_index >= top, 15_000), (
        f"{b} stranded: leader begins at {c.stores[leader].begin_index}, {b} ends at {c.stores[b].end_index}")
    c.run(2_000)  # once it caught up, retention deletes again
    assert c.stores[leader].begin_index > 0
    assert not c.violations


def test_an_answer_to_a_push_of_an_earlier_term_is_not_counted() -> None:
    """Found in review: F adopted term 3 from L's vote request, then answered L's held term-1
    push with min(durable, matched) of L's term-1 log; L, leading term 3 with that log
    truncated, counted it (a dispatcher's epochs restart at 0 every term). The match is now
    valid only in its term, and answers to pushes of another term are dropped."""
    c = SimCluster(5, seed=11, flush="sync")
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    lead = c.leader()
    assert lead is not None
    f, _, a, _ = [i for i in c.ids if i != lead]
    c._node(lead).cfg.max_push_timeout_ms = 30_000  # the late answer is still awaited
    c.crash(f, lose_unsynced=False)
    c.cfgs[f].max_heart_beat_leak = 24  # f campaigns late
    c.start(f)
    c.run(500)

    def cut(pairs: list[tuple[str, str]]) -> None:
        c.blocked = set(pairs) | {(y, x) for x, y in pairs}

    others = [i for i in c.ids if i not in (lead, f)]
    cut([(x, y) for x in (lead, f) for y in others])
    c.append(lead, [b"t1-%d" % k for k in range(10)])  # on lead and f only
    c.run(300)
    held: list[Any] = []
    send = c._send

    def hold_push(src: str, act: Any) -> None:
        if src == lead and act.peer == f and act.code == RequestCode.PUSH and not held and \
                c._node(lead).member.term == 1:
            send(src, act)
            evs = [e for e in c._events if e.kind == "request" and e.args[:2] == (lead, f)]
            held.extend(evs)
            c._events[:] = [e for e in c._events if e not in evs]
            heapq.heapify(c._events)
            return
        send(src, act)

    c._send = hold_push  # type: ignore[method-assign,assignment]
    c.append(lead, [b"t1-late"])
    c.run(100)
    c.run_until(lambda: c.leader() not in (None, lead), 10_000)
    c.run(1500)
    cut([(f, y) for y in others])  # lead rejoins the majority and is truncated
    c.run(2000)
    fn = c._node(f)
    handle = fn.handle

    def deliver_after_vote(code: int, msg: Any, data: Any, token: Any, now: int) -> None:
        handle(code, msg, data, token, now)
        if code == RequestCode.VOTE and not msg.pre_vote and held:
            for e in held:
                e.at, e.seq = c.now, -1
                heapq.heappush(c._events, e)
            held.clear()

    fn.handle = deliver_after_vote  # type: ignore[method-assign,assignment]
    late: list[tuple[Any, PushResponse]] = []
    reply = c._reply

    def hold_answer(member: str, act: Any) -> None:
        m = act.msg
        if member == f and isinstance(m, PushResponse) and act.token[1] == lead and m.term == 3 and \
                not late and m.code != ResponseCode.SUCCESS:
            late.append((act.token, m))
            return
        reply(member, act)

    c._reply = hold_answer  # type: ignore[method-assign,assignment]
    current = c.leader()
    assert current is not None
    c._node(current).elector.begin_transfer(lead, None)
    assert c.run_until(lambda: c._node(lead).member.role == Role.LEADER, 5_000)
    assert late, "the scenario did not produce the late answer"
    assert late[0][1].durable_index < 1, "an answer in term 3 reported a match of the term-1 log"
    cut([(lead, y) for y in c.ids if y not in (lead, a)])
    for tok, msg in late:
        c._schedule(c.now + 1, "response", (tok[1], tok[2], tok[3], encode(msg)))
    c.run(5)
    cid = c.append(lead, [b"acked-in-term-3"])
    c.run_until(lambda: cid in c.client_results, 800)
    node = c._node(lead)
    assert node.progress[f].counted(node.quorum.sync) < 1
    assert not c.violations


class _UsageDisk(SimDiskStore):
    """Disk usage as FileLedgerStore's retention sees it: `cap` entries fill the disk; above
    70 % retention deletes down to the commit index and the floor; above 85 % after that
    the disk is full (client appends refused)."""

    cap = 100

    def run_retention(self) -> None:
        if (self.end_index - self.begin_index + 1) / self.cap <= 0.70:
            self.soft_full = False
            return
        floor = self.committed_index + 1
        if self.retention_floor is not None:
            floor = min(floor, self.retention_floor)
        floor = min(floor, self.synced_index + 1, self.end_index)
        if floor > self.begin_index:
            self.drop_prefix(floor)
        self.soft_full = (self.end_index - self.begin_index + 1) / self.cap > 0.85


def test_disks_filling_while_a_member_lags_do_not_deadlock_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: a member down (within retention_hold_ms) held retention on every disk;
    usage stayed above the force ratio, every store reported itself unwritable, the leader
    stepped down and nobody campaigned: no leader for good. A full disk now refuses only
    client appends, so the leader catches the member up and retention frees space."""
    import dledger.sim.cluster as cluster

    monkeypatch.setattr(cluster, "SimDiskStore", _UsageDisk)
    c = SimCluster(3, seed=5, flush="async")
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    c.run(500)
    lagging = next(i for i in c.ids if i != c.leader())
    c.crash(lagging, lose_unsynced=False)
    for _ in range(12):
        c.append(c.leader() or c.ids[0], [b"x" * 10] * 8)
        c.run(200)
    assert any(c.stores[i].soft_full for i in c.ids), "the scenario did not fill the disks"
    c.start(lagging)
    top = max(c.stores[i].end_index for i in c.ids)
    assert c.run_until(lambda: c.stores[lagging].end_index >= top, 15_000), "the lagging member was never caught up"
    c.run(3_000)
    cid = c.append(c.leader() or c.ids[0], [b"after"])
    assert c.run_until(lambda: cid in c.client_results, 10_000)
    assert c.client_results[cid].code == ResponseCode.SUCCESS
    assert not c.violations


def test_a_follower_behind_the_plain_logs_retention_installs_an_empty_snapshot() -> None:
    """Found in review: a follower silent longer than retention_hold_ms needs deleted entries;
    the leader re-sent COMPARE on every answer (~170 pushes/s), and later asked only now and
    then, for ever. Now it gets the plain log's empty snapshot at the leader's log begin
    (InstallSnapshot) and catches up from there."""
    c, leader, _, b = _steady(4, flush="sync", retention_hold_ms=2_000)
    for m in c.ids:
        c.disk_fault(m, "pressure")
    c.crash(b, lose_unsynced=True)
    ids = [c.append(leader, [f"e{k}".encode()]) for k in range(60)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 10_000)
    c.run(5_000)  # b is no longer live: retention deletes what it needs
    assert c.stores[leader].begin_index > c.stores[b].end_index + 1
    c.start(b)
    lead = c.leader()
    assert lead is not None
    top = c.stores[lead].committed_index
    assert c.run_until(lambda: c.stores[b].committed_index >= top, 10_000)
    assert c.stores[b].begin_index > 0 and c.stores[b].get(top).body == c.stores[lead].get(top).body
    assert c.machines.installs >= 1
    c.check_log_matching()
    assert not c.violations


# --- issue 11, data faults ----------------------------------------------------------------------------


def test_a_leader_never_hands_on_a_magic_flip_to_a_follower_catching_up() -> None:
    """A magic flip (NORMAL -> CONFIG_CHANGE) in a leader's committed record: no CRC covers
    the magic, so the wiped follower catching up stored it as sent, and its copy then
    disagreed with the third member's for ever (found when the random schedules began to rot
    the magic). The leader now checks the magics of what it pushes below its commit index:
    it finds its own rot, hands over, and every member ends with the same, good record."""
    c, leader, a, b = _steady(12)
    indexes = _write(c, leader, 20)
    bad = indexes[5]
    c.corrupt(leader, bad, "magic")
    _wipe(c, a)
    _no_scrub(c)
    assert c.run_until(lambda: c.leader() == b, 10_000), f"leader {c.leader()}"
    assert c.run_until(lambda: not c.damaged() and c._node(leader).corrupt is None, 10_000), c.damaged()
    end = c.stores[b].end_index
    assert c.run_until(lambda: all(c.stores[m].committed_index == end for m in c.ids), 10_000)
    assert {c.stores[m].term_chain(bad) for m in c.ids} == {c.stores[b].term_chain(bad)}
    c.check_log_matching()
    assert not c.violations


def _write(c: SimCluster, leader: str, n: int) -> list[int]:
    """Append n entries one by one; their indexes once all are acknowledged."""
    ids = [c.append(leader, [f"body-{k}".encode()]) for k in range(n)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 10_000)
    assert all(c.client_results[i].code == ResponseCode.SUCCESS for i in ids)
    c.run(300)
    return [c.client_results[i].index for i in ids]


def _wipe(c: SimCluster, member: str) -> None:
    """The member's store is lost (a new, empty disk) and it starts again."""
    c.crash(member)
    c.stores[member] = SimDiskStore()
    c.start(member)


def _no_scrub(c: SimCluster) -> None:
    """Found only through the path under test, not by the background scrub."""
    for n in c.nodes.values():
        if n is not None:
            n.scrub_entries = 0


def _ask(c: SimCluster, member: str, code: int, msg: Any, wait_ms: int = 2_000) -> Any:
    """Send a client request to `member`; its answer (reads may wait for a heartbeat round:
    the cluster runs until the answer comes, up to `wait_ms`)."""
    token = ("test", next(_TOKENS))
    node = c._node(member)
    node.handle(code, msg, b"", token, c.now)
    c._flush(member)
    c.run_until(lambda: token in c.test_answers, wait_ms)
    return c.test_answers.pop(token, None)


def test_a_wiped_follower_catches_up_while_the_group_is_idle() -> None:
    """Issue 11: a follower whose store was wiped stayed empty until the next append, while
    the leader still counted it as matched. Its heartbeat answers now report its log end."""
    c, leader, a, _ = _steady(11)
    _write(c, leader, 20)
    end = c.stores[leader].end_index
    _wipe(c, a)
    assert c.run_until(lambda: c.stores[a].end_index == end and c.stores[a].committed_index == end, 5_000), \
        (c.stores[a].end_index, end)
    assert c.leader() == leader
    assert not c.violations


def test_a_corrupt_leader_hands_over_when_a_catching_up_follower_rejects_its_record() -> None:
    """Issue 11: the leader holds a flipped body byte in a committed entry; a wiped follower
    catching up from it rejected the pushed batch every 50 ms for ever, and the leader said
    nothing. Now the follower names the record; the leader finds its own copy damaged, hands
    leadership to the healthy follower, and is repaired from it."""
    c, leader, a, b = _steady(12)
    indexes = _write(c, leader, 20)
    bad = indexes[5]
    c.corrupt(leader, bad)
    _wipe(c, a)
    _no_scrub(c)
    assert c.run_until(lambda: c.leader() == b, 10_000), f"leader {c.leader()}"
    old = c._node(leader)
    assert c.run_until(lambda: not c.damaged() and old.corrupt is None, 10_000), c.damaged()
    assert old.records_repaired == 1
    end = c.stores[b].end_index
    assert c.run_until(lambda: all(c.stores[m].committed_index == end for m in c.ids), 10_000)
    assert c.stores[a].get(bad).body == c.stores[leader].get(bad).body == b"body-5"
    c.check_log_matching()
    assert not c.violations


def test_a_read_of_a_corrupt_record_moves_leadership_and_never_serves_it() -> None:
    """Issue 11: every read of the damaged entry failed with DISK_ERROR (414) at a corrupt
    leader although the followers held good copies. The read is now retried elsewhere (the
    answer says so) and the corrupt member leads no more until it is repaired."""
    c, leader, a, b = _steady(13)
    indexes = _write(c, leader, 10)
    bad = indexes[3]
    c.corrupt(leader, bad)
    _no_scrub(c)
    resp = _ask(c, leader, RequestCode.GET, GetRequest(index=bad))
    assert resp.code in (ResponseCode.LEADER_TRANSFERRING, ResponseCode.NOT_LEADER), resp
    assert not resp.entries
    node = c._node(leader)
    assert node.corrupt is not None and node.corrupt[0] == bad
    assert "corrupt record at index" in node.metadata().store_error
    assert c.run_until(lambda: c.leader() in (a, b), 5_000)
    new = c.leader()
    assert new is not None
    c.run(200)
    ok = _ask(c, new, RequestCode.GET, GetRequest(index=bad))
    assert ok.code == ResponseCode.SUCCESS and ok.entries[0].body == b"body-3"
    assert c.run_until(lambda: node.corrupt is None and not c.damaged(), 10_000)
    assert node.metadata().store_error == ""
    assert not c.violations


def test_a_corrupt_follower_does_not_take_leadership_and_is_repaired_by_the_scrub() -> None:
    """A follower's damaged record is found by the idle scrub; it refuses a transfer (and does
    not campaign) until the leader's REPAIR push restored it; its local read never serves it."""
    c, leader, a, _ = _steady(14)
    indexes = _write(c, leader, 10)
    bad = indexes[7]
    for n in c.nodes.values():
        assert n is not None
        n.scrub_entries = 0
    c.corrupt(a, bad)
    node = c._node(a)
    local = _ask(c, a, RequestCode.GET, GetRequest(index=bad, local=True))
    assert local.code == ResponseCode.DISK_ERROR and not local.entries
    assert node.corrupt is not None and node.corrupt[0] == bad
    # a refuses a hand-over (it would serve the damaged record), and does not campaign
    term = c._node(leader).member.term
    handover = LeadershipTransferRequest("default", leader, a, term, leader, a)
    resp = _ask(c, a, RequestCode.LEADERSHIP_TRANSFER, handover)
    assert resp.code == ResponseCode.TAKE_LEADERSHIP_FAILED and "corrupt" in resp.message, resp
    assert node.member.role == Role.FOLLOWER and node.member.term == term
    # the leader learns it from a's next heartbeat answer: it refuses a client's transfer to a
    # at once, and repairs a
    assert c.run_until(lambda: c._node(leader).progress[a].corrupt, 2_000)
    resp = _ask(c, leader, RequestCode.LEADERSHIP_TRANSFER, LeadershipTransferRequest(transferee_id=a))
    assert resp is not None and resp.code == ResponseCode.TAKE_LEADERSHIP_FAILED, resp
    assert c.run_until(lambda: node.corrupt is None and not c.damaged(), 10_000)
    assert c.leader() == leader
    assert node.records_repaired == 1 and c.stores[a].get(bad).body == b"body-7"
    # the scrub alone: rot on the same follower, found without any read (within a pass,
    # which starts at most SCRUB_PAUSE_MS after the last)
    for n in c.nodes.values():
        assert n is not None
        n.scrub_entries = 16
    c.corrupt(a, indexes[2])
    assert c.run_until(lambda: node.corrupt is not None, 15_000)
    assert c.run_until(lambda: node.corrupt is None and not c.damaged(), 10_000)
    assert node.records_repaired == 2
    assert not c.violations


def test_a_record_damaged_on_every_copy_is_never_served_nor_invented() -> None:
    """All copies bad: no member can repair it. The group must stay safe (no data invented,
    no member serving it) and say so; none of the damaged members leads."""
    c, leader, _, _ = _steady(15)
    indexes = _write(c, leader, 5)
    bad = indexes[1]
    for m in c.ids:
        c.corrupt(m, bad)
    c.run(15_000)  # the scrub finds it everywhere
    assert c.damaged() == sorted((m, bad) for m in c.ids)
    assert all(c._node(m).corrupt is not None for m in c.ids)
    assert c.leader() is None
    for m in c.ids:
        resp = _ask(c, m, RequestCode.GET, GetRequest(index=bad, local=True))
        assert resp.code == ResponseCode.DISK_ERROR and not resp.entries
        assert "corrupt record at index" in c._node(m).metadata().store_error
    assert not c.violations


def test_a_corrupt_leader_does_not_wait_for_a_follower_that_needs_its_bad_record() -> None:
    """Review: the corrupt leader handed over to the most caught-up follower even when that
    one still lacked the bad record (which the leader cannot send), and so stayed leader
    until the transfer timed out (3 s), or longer when a preferred-leader or disk-pressure
    transfer replaced it. Only a follower already holding our whole log takes over; with
    none, the leader steps down at once."""
    c, leader, a, b = _steady(13)
    indexes = _write(c, leader, 20)
    bad = indexes[5]
    c.partition([leader, a], [b])  # b, caught up, is out of reach (for longer than the lease)
    c.run(c._node(leader).elector.leader_lease_ms + 100)
    c.corrupt(leader, bad)
    _wipe(c, a)  # a catches up from the leader and rejects the bad record
    _no_scrub(c)
    old = c._node(leader)
    assert c.run_until(lambda: old.corrupt is not None, 5_000)
    c.run(3 * c.tick_ms)
    assert old.member.role != Role.LEADER, "a corrupt leader waited for a follower that needs its bad record"
    c.heal()
    assert c.run_until(lambda: not c.damaged() and old.corrupt is None, 15_000), c.damaged()
    c.check_log_matching()
    assert not c.violations


def test_magic_and_channel_rot_is_found_and_repaired() -> None:
    """Review: magic (NORMAL 1 -> CONFIG_CHANGE 3) and channel are not covered by the chain
    CRC, and verify() did not check them: the scrub never found them and a default READ
    skipped the entry. The sim's rot now flips them too, and the final checks compare magic."""
    c, leader, a, _ = _steady(14)
    indexes = _write(c, leader, 20)
    c.corrupt(leader, indexes[4], "magic")
    c.corrupt(a, indexes[7], "channel")
    assert c.run_until(lambda: c._node(leader).corrupt is not None and c._node(a).corrupt is not None, 25_000)
    assert c.run_until(lambda: not c.damaged() and all(c._node(m).corrupt is None for m in c.ids), 15_000), \
        c.damaged()
    assert all(c.stores[m].get(indexes[4]).magic == 1 for m in c.ids)
    c.check_log_matching()
    assert not c.violations


def test_a_corrupt_mark_ends_when_retention_deletes_the_record() -> None:
    """Review: a member whose corrupt record retention deleted kept its mark for ever (it never
    led again). The mark now clears once the record is below the log begin."""
    c, leader, a, _ = _steady(22)
    indexes = _write(c, leader, 20)
    bad = indexes[2]
    c.corrupt(leader, bad)
    old = c._node(leader)
    r = _ask(c, leader, RequestCode.GET, GetRequest(index=bad, local=True))
    assert r.code != ResponseCode.SUCCESS and old.corrupt is not None
    c.disk_fault(leader, "pressure")
    assert c.run_until(lambda: old.corrupt is None, 10_000), (old.corrupt, c.stores[leader].begin_index)
    c.disk_fault(leader, "pressure", on=False)
    assert c.run_until(lambda: not c.damaged(), 10_000)
    # and the clearing itself: a mark below the log begin (deleted) goes at the next tick
    node = c._node(a)
    node.integrity.corrupt = (c.stores[a].begin_index - 1, "deleted")
    c.run(3 * c.tick_ms)
    assert node.corrupt is None
    assert not c.violations


def test_a_repair_hold_expires_for_a_follower_silent_past_retention_hold_ms() -> None:
    """Review: the retention hold for a follower's repair never expired, unlike the durable
    hold: a dead follower with a corrupt record held the leader's log for ever."""
    c, leader, a, b = _steady(26, retention_hold_ms=2_000)
    indexes = _write(c, leader, 10)
    c.partition([leader, b], [a])
    c.corrupt(a, indexes[1])
    _ask(c, a, RequestCode.GET, GetRequest(index=indexes[1], local=True))
    c.heal()
    assert c.run_until(lambda: c._node(leader).progress[a].repair_index >= 0, 2_000)
    c.crash(a)
    _write(c, leader, 50)
    c.run(5_000)
    floor, holder = c._node(c.leader() or leader).retention_floor()
    assert a not in holder and floor > indexes[1], (floor, holder)


def test_the_scrub_finds_rot_on_a_member_that_is_never_idle() -> None:
    """The scrub ran only in idle ticks: under an append every 5 ms a rotten old record on a
    follower stayed unnoticed for 30 s. Now a busy member still verifies a record now and then."""
    c, leader, a, _b = _steady(27)
    idx = _write(c, leader, 10)
    c.run(11_000)  # the first scrub pass is over
    c.corrupt(a, idx[3])
    for k in range(3_000):
        c.append(c.leader() or leader, [b"load%d" % k])
        c.run(5)
    assert c._node(a).status().corruptions_found >= 1
    assert c.run_until(lambda: not c.damaged(), 20_000)


def test_a_follower_whose_rotten_record_the_leader_no_longer_holds_is_told_and_may_lead() -> None:
    """Seeds 100274, 100940, 103387, 103424 (4,000-seed run): the leader's retention had deleted
    the entry a follower found rotten, so no repair could come; the follower stayed marked
    (never led again) and, as it kept its own corrupt record from retention, held the group's
    retention too. The leader now tells it its log begin, which ends the mark."""
    c, leader, a, _b = _steady(31)
    indexes = _write(c, leader, 20)
    c.disk_fault(leader, "pressure")  # the leader's retention deletes its prefix
    assert c.run_until(lambda: c.stores[leader].begin_index > indexes[2], 20_000)
    c.disk_fault(leader, "pressure", on=False)
    if c.stores[a].begin_index > indexes[2]:
        pytest.skip("the follower's retention went as far (nothing left to rot)")
    c.corrupt(a, indexes[2])
    node = c._node(a)
    assert c.run_until(lambda: node.corrupt is not None, 30_000), "the scrub finds it"
    assert c.run_until(lambda: node.corrupt is None, 10_000), "the leader's notice ends the mark"
    assert not c.violations
