"""What a member whose log lags behind its group's changes learns from the members it knows
(core.config_probe): it follows a leader added after its log ends once a member it knows names
it; a stranger's leader messages are refused however long no leader was heard; a member removed
while away learns it and stops campaigning, without disturbing the group."""

from __future__ import annotations

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.messages import MembersResponse, PushRequest
from dledger.entry import MAGIC_NORMAL
from dledger.sim.cluster import SimCluster
from dledger.store.memory import MemoryLedgerStore


def _leader(c: SimCluster) -> str:
    return c.wait_leader()


def _change(c: SimCluster, op: str, target: str) -> None:
    r = c.change(op, target, c.address(target) if op == "add-learner" else "")
    assert r.code == ResponseCode.SUCCESS, r


def _grow(c: SimCluster) -> str:
    new = f"n{len(c.ids)}"
    _change(c, "add-learner", new)
    c.add_member(c.config(_leader(c)))
    _change(c, "promote", new)
    return new


def _forged_push(c: SimCluster, victim: str, sender: str, term: int) -> object:
    """A push of term `term` from `sender` extending `victim`'s log with forged entries."""
    vstore = c.stores[victim]
    end = vstore.end_index
    forged = MemoryLedgerStore(1 << 20)
    forged.append_as_follower(bytes(vstore.read_raw(0, 1 << 24).data))
    for k in range(4):
        forged.append_as_leader([f"FORGED-{k}".encode()], term, MAGIC_NORMAL)
    push = PushRequest("default", sender, victim, term, int(PushType.APPEND), end, vstore.term_at(end), end + 1, 4,
                       end + 4)
    token = ("test", "forge", sender)
    c._node(victim).handle(RequestCode.PUSH, push, bytes(forged.read_raw(end + 1, 1 << 24).data), token, c.now)
    c._flush(victim)
    c.run(50)
    return c.test_answers.get(token)


def test_a_stranger_cannot_lead_a_member_that_hears_no_leader() -> None:
    c = SimCluster(3, seed=11, strict_members=True)  # as with TLS: without it any id is claimed anyway
    leader = _leader(c)
    victim = next(i for i in c.ids if i != leader)
    for k in range(3):
        c.append(leader, [f"before-{k}".encode()])
    c.run(1_000)
    c.partition([victim], [i for i in c.ids if i != victim])
    for k in range(5):
        c.append(_leader(c), [f"acked-{k}".encode()])
    c.run(3_000)  # the victim hears no live leader: the old rule took any leader now
    answer = _forged_push(c, victim, "mallory", 99)
    assert getattr(answer, "code", None) == ResponseCode.UNKNOWN_MEMBER
    c.run(2_000)  # the victim asked the members it knows (none reachable, and none names mallory)
    assert _forged_push(c, victim, "mallory", 99) is not None
    assert c._node(victim).role_view().term < 99
    assert not any(bytes(c.stores[victim].get(i).body).startswith(b"FORGED")
                   for i in range(c.stores[victim].end_index + 1))
    c.heal()
    c.run(10_000)
    c.check_log_matching()
    assert not c.violations


def test_a_member_that_missed_every_change_follows_the_leader_they_made() -> None:
    """n2 is cut off while n3 and n4 join and n0, n1 leave: the leader is one n2's log never
    named. The removed n0 and n1, still running, name it when n2 asks; n2 follows it."""
    c = SimCluster(3, seed=5, tick_ms=20, strict_members=True)
    lag = "n2"
    for k in range(3):
        c.append(_leader(c), [b"x%d" % k])
    c.run(500)
    c.partition([lag], ["n0", "n1"])
    if _leader(c) == lag:
        c.run(3_000)
    added = [_grow(c), _grow(c)]
    c.partition([lag], ["n0", "n1", *added])
    for old in ("n0", "n1"):
        _change(c, "remove", old)
    assert c.run_until(lambda: c.leader() in added, 10_000)
    leader = _leader(c)
    cid = c.append(leader, [b"after"])
    assert c.run_until(lambda: cid in c.client_results, 5_000)
    assert not c._node(lag).configs.known(leader)
    c.heal()
    assert c.run_until(lambda: c._node(lag).role_view().leader_id == leader
                       and c.stores[lag].committed_index >= c.stores[leader].committed_index, 10_000)
    assert set(c.config(lag).voters) == {lag, *added}
    assert not c.violations


def test_a_learner_removed_while_away_learns_it() -> None:
    c = SimCluster(3, seed=3, tick_ms=20)
    new = f"n{len(c.ids)}"
    _change(c, "add-learner", new)
    c.add_member(c.config(_leader(c)))
    c.run(1_000)
    c.partition([new], ["n0", "n1", "n2"])
    _change(c, "remove", new)
    c.run(1_000)
    assert not c._node(new).not_a_member  # its log never got the removal
    c.heal()
    assert c.run_until(lambda: c._node(new).not_a_member, 15_000)
    view = c._node(new).status()
    assert view.not_a_member
    assert not c.violations


def test_a_voter_removed_while_away_stops_campaigning_and_disturbs_nobody() -> None:
    c = SimCluster(3, seed=7, tick_ms=20)
    leader = _leader(c)
    gone = next(i for i in c.ids if i != leader)
    c.append(leader, [b"x"])
    c.run(500)
    c.partition([gone], [i for i in c.ids if i != gone])
    _change(c, "remove", gone)
    c.run(3_000)  # cut off, it keeps asking for votes (pre-votes: its term stays)
    leader = _leader(c)
    term = c._node(leader).role_view().term
    c.heal()
    assert c.run_until(lambda: c._node(gone).not_a_member, 15_000)
    assert not c._node(gone).member.may_campaign
    c.run(20_000)
    assert c.leader() == leader and c._node(leader).role_view().term == term
    # its MEMBERS answer says where the group went
    token = ("test", "members-of-removed")
    from dledger.core.messages import MembersRequest

    c._node(gone).handle(RequestCode.MEMBERS, MembersRequest("default"), b"", token, c.now)
    c._flush(gone)
    r = c.test_answers.get(token)
    assert isinstance(r, MembersResponse) and r.code == ResponseCode.NOT_A_MEMBER
    assert gone not in {m.id for m in r.members} and leader in {m.id for m in r.members}
    assert not c.violations
