"""Read consistency in the simulator (issue 12), deterministic.

A leadership transfer cut off mid-way: the old leader hands over, is partitioned away at
once, and the new leader commits an append the client saw acknowledged. Until its
check-quorum deposes it, the old leader still believes it leads: a `leader` read there is
stale (kept as the proof), while `linearizable` and `lease` reads are never answered with
that stale state.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core.messages import EntriesResponse, LeadershipTransferRequest, ReadRequest, Role
from dledger.sim.cluster import SimCluster

pytestmark = pytest.mark.sim

_TOKENS = itertools.count()


def _send(c: SimCluster, member: str, code: int, msg: Any) -> Any:
    token = ("test", next(_TOKENS))
    c._node(member).handle(code, msg, b"", token, c.now)
    c._flush(member)
    return token


def _answer(c: SimCluster, token: Any, wait_ms: int = 3_000) -> Any:
    c.run_until(lambda: token in c.test_answers, wait_ms)
    return c.test_answers.pop(token, None)


def _bodies(resp: Any) -> list[bytes]:
    assert isinstance(resp, EntriesResponse) and resp.code == ResponseCode.SUCCESS, resp
    return [e.body for e in resp.entries]


def _with_three_entries(seed: int) -> tuple[SimCluster, str, str, str]:
    """A group with a leader and three committed entries: (cluster, leader, one follower, the other)."""
    c = SimCluster(3, seed=seed)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    old = c.leader()
    assert old is not None
    target, other = [m for m in c.ids if m != old]
    c.run(500)
    ids = [c.append(old, [f"before-{k}".encode()]) for k in range(3)]
    assert c.run_until(lambda: all(i in c.client_results for i in ids), 10_000)
    c.run(300)
    return c, old, target, other


@pytest.mark.parametrize("seed", range(5))
def test_a_transfer_cut_off_midway_leaves_a_stale_leader_only_leader_mode_reads_from(seed: int) -> None:
    c, old, target, other = _with_three_entries(seed)
    before = _bodies(_answer(c, _send(c, old, RequestCode.READ, ReadRequest(consistency="leader"))))

    # the hand-over is on its way to the target (the simulated network delivers what was sent
    # before a partition); the old leader is cut off right after sending it
    _send(c, old, RequestCode.LEADERSHIP_TRANSFER, LeadershipTransferRequest(transferee_id=target))
    el = c._node(old).elector
    assert c.run_until(lambda: el.transfer is not None and el.transfer.sent, 5_000)
    c.partition([old], [target, other])
    assert c.run_until(lambda: c._node(target).member.role != Role.FOLLOWER, 5_000)
    assert c.run_until(lambda: c._node(target).member.is_leader, 5_000)
    after = c.append(target, [b"after"])
    assert c.run_until(lambda: after in c.client_results, 5_000)
    assert c.client_results[after].code == ResponseCode.SUCCESS
    assert c._node(old).member.is_leader  # it does not know yet

    stale = _bodies(_answer(c, _send(c, old, RequestCode.READ, ReadRequest(consistency="leader"))))
    assert stale == before and b"after" not in stale  # the acknowledged append is missing
    # the reads invariant the seeds check (SimCluster.read) flags it too
    c.read(old, "leader")
    assert c.run_until(lambda: bool(c.violations), 1_000) and "not committed" in c.violations[0], c.violations
    c.violations.clear()
    c.read(old, "linearizable")
    c.read(target, "lease")
    c.read(other, "linearizable", addressed=True)

    for mode in ("linearizable", "lease"):
        resp = _answer(c, _send(c, old, RequestCode.READ, ReadRequest(consistency=mode)))
        assert resp is not None and resp.code != ResponseCode.SUCCESS, (mode, resp)
    c.heal()
    assert c.run_until(lambda: c.leader() == target and not c._node(old).member.is_leader, 10_000)
    fresh = _bodies(_answer(c, _send(c, target, RequestCode.READ, ReadRequest(consistency="linearizable"))))
    assert fresh == [*before, b"after"]
    assert not c.violations


def test_linearizable_reads_share_one_heartbeat_round_and_lease_reads_need_none() -> None:
    c = SimCluster(3, seed=7)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    leader = c.leader()
    assert leader is not None
    c.run(500)
    node = c._node(leader)
    rounds = node.reads.round
    tokens = [("test", next(_TOKENS)) for _ in range(5)]
    for t in tokens:  # arriving together (one drain), as reads in one event-loop turn do
        node.handle(RequestCode.READ, ReadRequest(consistency="linearizable"), b"", t, c.now)
    c._flush(leader)
    answers = [_answer(c, t) for t in tokens]
    assert all(a is not None and a.code == ResponseCode.SUCCESS for a in answers)
    assert node.reads.reads_confirmed >= 5
    assert node.reads.round - rounds <= 2  # the five shared one round (a tick may have sent another)
    assert node.reads.lease_valid()  # that round started a lease
    lease_reads = node.reads.lease_reads
    resp = _answer(c, _send(c, leader, RequestCode.READ, ReadRequest(consistency="lease")))
    assert resp.code == ResponseCode.SUCCESS and node.reads.lease_reads == lease_reads + 1


@pytest.mark.parametrize("seed", range(4))
def test_no_lease_read_after_a_hand_over_was_sent_even_once_the_transfer_timed_out(seed: int) -> None:
    """Review: the hand-over to the target was slow (past the 3 s transfer timeout), the old
    leader resumed and renewed its lease from a follower that then voted for the target's
    transfer campaign (such votes ignore leases): lease reads at the old leader went stale."""
    c, old, target, _ = _with_three_entries(seed)
    arrives: list[int] = []
    schedule = c._schedule

    def slow_hand_over(at: int, kind: str, args: Any) -> None:
        if kind == "request" and args[0] == old and args[3] == RequestCode.LEADERSHIP_TRANSFER:
            at += 3_100
            arrives.append(at)
        schedule(at, kind, args)

    c._schedule = slow_hand_over  # type: ignore[method-assign]
    _send(c, old, RequestCode.LEADERSHIP_TRANSFER, LeadershipTransferRequest(transferee_id=target))
    el = c._node(old).elector
    assert c.run_until(lambda: el.transfer is not None and el.transfer.sent, 5_000)
    assert c.run_until(lambda: el.transfer is None, 5_000)  # timed out: the old leader resumes
    assert c._node(old).member.is_leader
    c.run(min(arrives) - 1 - c.now)
    c.blocked = {(target, old)}  # the target's messages to the old leader are lost
    assert c.run_until(lambda: c._node(target).member.is_leader, 4_000)
    after = c.append(target, [b"after"])
    assert c.run_until(lambda: after in c.client_results, 2_000)
    assert c.client_results[after].code == ResponseCode.SUCCESS
    if c._node(old).member.is_leader:  # still believes it leads: it must not serve from its lease
        resp = _answer(c, _send(c, old, RequestCode.READ, ReadRequest(consistency="lease")))
        assert resp is None or resp.code != ResponseCode.SUCCESS or b"after" in _bodies(resp), resp
    assert not c.violations


@pytest.mark.parametrize("seed", range(3))
def test_a_follower_read_waits_for_the_leaders_read_index_where_a_local_read_is_stale(seed: int) -> None:
    """Follower read (thesis §6.4): an append acknowledged by the leader and one follower; the
    other follower has not heard of it (its link from the leader is cut). Its local copy is
    stale; a linearizable read addressed to it waits for the leader's read index and times
    out rather than answer without the entry; once the link heals it answers with it."""
    c, leader, _, b = _with_three_entries(seed)
    c.blocked = {(leader, b)}  # b hears nothing from the leader; its requests still go through
    after = c.append(leader, [b"after"])
    assert c.run_until(lambda: after in c.client_results, 5_000)
    assert c.client_results[after].code == ResponseCode.SUCCESS
    local = _bodies(_answer(c, _send(c, b, RequestCode.READ, ReadRequest(local=True, consistency="local"))))
    assert b"after" not in local  # its own copy is behind
    for mode in ("linearizable", "lease"):
        req = ReadRequest(remote_id=b, consistency=mode, follower_read=True)
        resp = _answer(c, _send(c, b, RequestCode.READ, req), 5_000)
        # the leader's answer cannot reach b: no answer, or one that says why; never a stale one
        assert resp is None or resp.code != ResponseCode.SUCCESS or b"after" in _bodies(resp), (mode, resp)
    c.blocked = set()
    assert c.run_until(lambda: c._node(b).member.leader_id is not None and c.leader() is not None, 5_000)
    now_leader = c.leader()
    token = _send(c, b, RequestCode.READ, ReadRequest(remote_id=b, consistency="linearizable", follower_read=True))
    assert b"after" in _bodies(_answer(c, token, 5_000))
    assert c._node(b).follower_reads.served >= 1
    # one that is not a follower read (even naming b as its receiver) is redirected to the leader
    resp = _answer(c, _send(c, b, RequestCode.READ, ReadRequest(remote_id=b, consistency="linearizable")))
    assert resp.code == ResponseCode.NOT_LEADER and resp.leader_id == now_leader
    assert not c.violations


@pytest.mark.parametrize("seed", range(3))
def test_lease_reads_hold_with_members_on_different_heartbeat_settings(seed: int) -> None:
    """Review: each member measured leases with its own heartbeat settings; mid-way through a
    rolling change (the leader at a 1 s lease, followers at 200 ms) the followers elected a new
    leader while the old one's lease still held, and its lease read missed an acknowledged
    append. Heartbeats now carry the leader's lease, and followers wait it out."""
    import dataclasses

    c = SimCluster(3, seed=seed)
    for m in ("n1", "n2"):
        c.cfgs[m] = dataclasses.replace(c.cfgs[m], heart_beat_time_interval_ms=50, lease_clock_drift_ms=50)
        c.crash(m, lose_unsynced=False)
        c.start(m)
    assert c.run_until(lambda: c.leader() is not None, 10_000)
    if c.leader() != "n0":
        _send(c, c.leader() or "n1", RequestCode.LEADERSHIP_TRANSFER, LeadershipTransferRequest(transferee_id="n0"))
        assert c.run_until(lambda: c.leader() == "n0", 5_000)
    c.run(600)
    c.partition(["n0"], ["n1", "n2"])
    assert c.run_until(lambda: any(c._node(m).member.is_leader for m in ("n1", "n2")), 10_000)
    new = next(m for m in ("n1", "n2") if c._node(m).member.is_leader)
    cid = c.append(new, [b"after"])
    assert c.run_until(lambda: cid in c.client_results, 5_000)
    c.read("n0", "lease")
    c.run(50)
    assert not c.violations
