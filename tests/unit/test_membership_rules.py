"""Membership rules of the core, one test each (docs/architecture.md "Membership"): a member
driven by hand (tests/unit/raft_harness.py) or a small simulated group (sim.cluster), no sockets."""

from __future__ import annotations

import random
from typing import Any

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.contexts import Answered, SnapshotTaken, VoteCtx
from dledger.core.membership import ChangeMembersRequest, ChangeMembersResponse, MembersRequest, MembersResponse
from dledger.core.messages import (
    AppendRequest,
    AppendResponse,
    MetadataRequest,
    PushRequest,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.core.node import Node, TakeSnapshot
from dledger.entry import MAGIC_CONFIG_CHANGE, MAGIC_NORMAL
from dledger.kv.commands import Put, encode
from dledger.membership import Membership, encode_membership
from dledger.sim.cluster import SimCluster
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.memory import MemoryLedgerStore

from .raft_harness import PEERS, Member, catch_up, leading

THREE = Membership.from_peers(PEERS)
N3 = "127.0.0.1:20003"
WITH_N3 = Membership(THREE.voters, {"n3": N3})
FOUR = Membership({**THREE.voters, "n3": N3})
WITHOUT_N2 = Membership({"n0": THREE.voters["n0"], "n1": THREE.voters["n1"]})


def _change(m: Member, op: str, target: str, addr: str = "", token: Any = "chg") -> ChangeMembersResponse | None:
    r = m.handle(RequestCode.CHANGE_MEMBERS, ChangeMembersRequest("default", "", "", op, target, addr), token=token)
    assert r is None or isinstance(r, ChangeMembersResponse)
    return r


def _restart(m: Member, **kw: Any) -> None:
    """A new Node on the member's store (a restart)."""
    m.node = Node(m.cfg, m.store, m.now, random.Random(7), **kw)
    m.out.clear()


def _config_entry(store: MemoryLedgerStore, cfg: Membership, term: int = 1) -> int:
    return store.append_as_leader([encode_membership(cfg)], term, MAGIC_CONFIG_CHANGE).first_index


def _ready_leader(**cfg: Any) -> Member:
    """n0 leading term 2, its NOOP committed (n1 and n2 hold its log)."""
    m = leading(**cfg)
    catch_up(m, "n1")
    catch_up(m, "n2")
    assert m.store.committed_index == m.store.end_index
    return m


def test_a_configuration_takes_effect_on_append_and_reverts_on_truncate() -> None:
    leader_log = MemoryLedgerStore(1 << 20)
    leader_log.append_as_leader([b"a"], 1, MAGIC_NORMAL)
    _config_entry(leader_log, WITH_N3)
    f = Member("n1")
    push = PushRequest("default", "n0", "n1", 1, int(PushType.APPEND), -1, -1, 0, 2, -1)
    r = f.handle(RequestCode.PUSH, push, bytes(leader_log.read_raw(0, 1 << 20).data))
    assert r.code == ResponseCode.SUCCESS
    st = f.node.status()
    assert f.node.member.membership == WITH_N3 and st.config_index == 1 and not st.config_committed
    assert "n3" in f.node.progress  # replicated to if this member leads
    # a leader of term 2 whose log lacks entry 1: the truncate takes the configuration back
    trunc = PushRequest("default", "n2", "n1", 2, int(PushType.TRUNCATE), 0, 1)
    assert f.handle(RequestCode.PUSH, trunc, token="t2").code == ResponseCode.SUCCESS
    assert f.store.end_index == 0
    assert f.node.member.membership == THREE and f.node.status().config_index == -1
    assert "n3" not in f.node.progress


def test_one_change_at_a_time() -> None:
    m = _ready_leader()
    assert _change(m, "add-learner", "n3", N3, token="a") is None  # waits for its commit
    r = _change(m, "add-learner", "n4", "127.0.0.1:20004", token="b")
    assert r is not None and r.code == ResponseCode.MEMBERSHIP_CHANGE_PENDING
    catch_up(m, "n1")
    done = m.reply_to("a")
    assert isinstance(done, ChangeMembersResponse) and done.code == ResponseCode.SUCCESS
    assert m.node.member.membership == WITH_N3
    assert _change(m, "add-learner", "n4", "127.0.0.1:20004", token="c") is None


def test_a_new_leader_changes_nothing_before_its_noop_commits() -> None:
    m = leading()
    r = _change(m, "add-learner", "n3", N3)
    assert r is not None and r.code == ResponseCode.LEADER_NOT_READY and "first entry" in r.message  # clients retry
    catch_up(m, "n1")
    assert _change(m, "add-learner", "n3", N3, token="later") is None


def test_refusals_name_their_reason() -> None:
    m = _ready_leader()
    for op, target, addr, code in [("add-learner", "n1", N3, ResponseCode.MEMBER_EXISTS),
                                   ("add-learner", "n3", THREE.voters["n1"], ResponseCode.MEMBER_EXISTS),
                                   ("promote", "n1", "", ResponseCode.UNKNOWN_MEMBER),
                                   ("promote", "n9", "", ResponseCode.UNKNOWN_MEMBER),
                                   ("remove", "n9", "", ResponseCode.UNKNOWN_MEMBER),
                                   ("grow", "n3", "", ResponseCode.UNEXPECTED_ARGUMENT)]:
        r = _change(m, op, target, addr, token=(op, target, addr))
        assert r is not None and r.code == code, (op, target, r)
    f = Member("n1")
    r = _change(f, "remove", "n2")
    assert r is not None and r.code == ResponseCode.NOT_LEADER


def test_a_learner_counts_for_neither_commit_nor_election() -> None:
    m = _ready_leader()
    _change(m, "add-learner", "n3", N3)
    catch_up(m, "n1")
    assert m.node.member.membership == WITH_N3 and m.store.committed_index == m.store.end_index
    m.handle(RequestCode.APPEND, AppendRequest("default", "", "", [b"x"]), token="app")
    catch_up(m, "n3")  # the learner holds it: not committed
    assert m.store.committed_index < m.store.end_index and m.reply_to("app") is None
    catch_up(m, "n2")  # a voter holds it
    assert m.store.committed_index == m.store.end_index
    assert isinstance(m.reply_to("app"), AppendResponse)
    # a candidate: its votes go to voters only, and a learner's vote would not count
    c = Member("n0")
    _config_entry(c.store, WITH_N3)
    _restart(c)
    c.node.elector.start_round(pre_vote=False)
    c.drain()
    assert {s.peer for s in c.sends(RequestCode.VOTE)} == {"n1", "n2"}
    term = c.node.member.term
    c.node.complete(Answered(VoteCtx(c.node.elector.round, False, "n3"), VoteResponse(term, int(VoteResult.ACCEPT))),
                    c.now)
    c.drain()
    assert c.node.member.role == Role.CANDIDATE
    # a learner never campaigns
    learner = Member("n3", peers=PEERS + ";n3-" + N3)
    _restart(learner, membership=WITH_N3)
    for _ in range(500):
        learner.tick()
    assert not learner.sends(RequestCode.VOTE) and learner.node.member.role == Role.FOLLOWER


def test_a_learner_is_promoted_only_when_caught_up() -> None:
    m = _ready_leader(learner_max_lag=2)
    _change(m, "add-learner", "n3", N3)
    catch_up(m, "n1")
    r = _change(m, "promote", "n3", token="p1")
    assert r is not None and r.code == ResponseCode.LEARNER_BEHIND  # it never answered
    catch_up(m, "n3")
    for k in range(3):
        m.handle(RequestCode.APPEND, AppendRequest("default", "", "", [b"%d" % k]), token=("a", k))
        m.drain()
    catch_up(m, "n1")  # committed without the learner, which is 3 entries behind now
    r = _change(m, "promote", "n3", token="p2")
    assert r is not None and r.code == ResponseCode.LEARNER_BEHIND and "3 entries behind" in r.message
    catch_up(m, "n3")
    assert _change(m, "promote", "n3", token="p3") is None
    assert m.node.member.membership == FOUR and m.node.member.quorum == 3  # in force before it commits
    view = m.handle(RequestCode.MEMBERS, MembersRequest("default"), token="members")
    assert isinstance(view, MembersResponse) and not view.committed
    # (the promotion's own entry is the one the others lack)
    assert {(i.id, i.voter, i.lag) for i in view.members} == {("n0", True, 0), ("n1", True, 1), ("n2", True, 5),
                                                                ("n3", True, 1)}


def test_a_removed_members_votes_are_ignored_and_it_never_campaigns() -> None:
    """Refused once neither configuration the voter knows names the candidate: its removal is
    in force and committed (thesis §4.1 otherwise grants votes on the usual rules)."""
    voter = Member("n1")
    voter.store.set_committed(_config_entry(voter.store, WITHOUT_N2))
    _restart(voter)
    assert voter.node.member.membership == WITHOUT_N2  # from the log, not the command line
    voter.now += 60_000  # long past any lease a restart keeps
    for pre_vote in (True, False):
        req = VoteRequest("default", "n2", "n1", 9, 100, 9, pre_vote)
        r = voter.handle(RequestCode.VOTE, req, token=("v", pre_vote))
        # refused before the elector looks (an id no configuration in force or committed names)
        assert r.code == ResponseCode.UNKNOWN_MEMBER and r.result != VoteResult.ACCEPT
    assert voter.node.member.term == 0  # its higher term is not taken either
    removed = Member("n2")
    removed.store.set_committed(_config_entry(removed.store, WITHOUT_N2))
    _restart(removed)
    assert removed.node.status().not_a_member
    for _ in range(500):
        removed.tick()
    assert not removed.sends(RequestCode.VOTE) and removed.node.member.role == Role.FOLLOWER
    r = removed.handle(RequestCode.APPEND, AppendRequest("default", "", "", [b"x"]), token="client")
    assert r.code == ResponseCode.NOT_A_MEMBER


def test_a_candidate_our_committed_configuration_still_names_gets_a_vote() -> None:
    """A removal not yet committed here (or a learner promoted in a configuration we have not
    received): the vote follows the usual rules, or a promoted member holding the newest log
    could never be elected (thesis §4.1)."""
    voter = Member("n1")
    _config_entry(voter.store, WITHOUT_N2)  # appended, not committed
    _restart(voter)
    voter.now += 60_000
    r = voter.handle(RequestCode.VOTE, VoteRequest("default", "n2", "n1", 9, 100, 9, True), token="v")
    assert r.result == VoteResult.ACCEPT


def test_a_member_whose_removal_is_not_committed_campaigns_without_counting_itself() -> None:
    """It may hold the newest log (a leader that appended its own removal): the voters need it."""
    m = Member("n2")
    _config_entry(m.store, WITHOUT_N2)  # not committed
    _restart(m)
    for _ in range(1000):
        if m.sends(RequestCode.VOTE):
            break
        m.tick()
    assert {s.peer for s in m.sends(RequestCode.VOTE)} == {"n0", "n1"}
    m.node.elector.start_round(pre_vote=False)
    m.drain()
    term = m.node.member.term
    vote = VoteResponse(term, int(VoteResult.ACCEPT))
    m.node.complete(Answered(VoteCtx(m.node.elector.round, False, "n0"), vote), m.now)
    m.drain()
    assert m.node.member.role == Role.CANDIDATE  # its own vote does not count: one of two
    m.node.complete(Answered(VoteCtx(m.node.elector.round, False, "n1"), vote), m.now)
    m.drain()
    assert m.node.member.is_leader


def test_the_configuration_comes_from_the_snapshot_or_the_log_on_restart() -> None:
    m = Member("n0")
    _restart(m, snapshot=SnapshotMeta(7, 1, 0, FOUR, next_pos=0, config_index=5))
    st = m.node.status()
    assert (st.voters, st.learners, st.config_index) == (tuple(FOUR.voters.items()), (), 5)
    _config_entry(m.store, WITH_N3)  # (index 0: older than the snapshot's, which wins)
    _restart(m, snapshot=SnapshotMeta(7, 1, 0, "n0-127.0.0.1:20000;n1-127.0.0.1:20001"))
    assert m.node.member.membership == WITH_N3  # a peers-string snapshot: the log's entry is newer
    m2 = Member("n0")
    _restart(m2, snapshot=SnapshotMeta(7, 1, 0, "n0-127.0.0.1:20000;n1-127.0.0.1:20001"))
    assert list(m2.node.member.voters) == ["n0", "n1"]  # an older snapshot's peers string
    m3 = Member("n0")
    _restart(m3, membership=WITH_N3)  # a joining member's, with nothing in its log or snapshot
    assert m3.node.member.membership == WITH_N3


def test_an_installed_snapshot_brings_its_configuration() -> None:
    m = Member("n1")
    m.node.reset_log_to(SnapshotMeta(4, 1, 0, FOUR, next_pos=0, config_index=3))
    assert m.node.member.membership == FOUR and m.node.status().config_index == 3
    assert set(m.node.progress) == {"n0", "n2", "n3"}


def _sim_leader(c: SimCluster) -> str:
    return c.wait_leader()


def _sim_change(c: SimCluster, op: str, target: str, addr: str = "") -> ChangeMembersResponse:
    """(a leader that just took over refuses until its NOOP commits: asked again)"""
    return c.change(op, target, addr, tries=50)


def test_a_removed_leader_hands_over_once_its_removal_commits() -> None:
    c = SimCluster(3, seed=3, tick_ms=20)
    old = _sim_leader(c)
    term = c.nodes[old].role_view().term  # type: ignore[union-attr]
    c.run(500)
    r = _sim_change(c, "remove", old)
    assert r.code == ResponseCode.SUCCESS
    assert c.run_until(lambda: c.leader() not in (None, old), 5_000)
    new = c.leader()
    assert new is not None and c._node(new).role_view().term == term + 1  # handed over: one election
    gone = c._node(old)  # (it leads its old term until it hears of the new one)
    assert c.run_until(lambda: gone.role_view().role == Role.FOLLOWER, 2_000)
    assert gone.status().not_a_member
    c.run(10_000)  # left running: it never leads again, nor disturbs the group
    assert c.leader() == new and c._node(new).role_view().term == term + 1
    gone.handle(RequestCode.APPEND, AppendRequest("default", "", "", [b"x"]), b"", ("test", "removed"), c.now)
    c._flush(old)
    answer = c.test_answers[("test", "removed")]
    assert isinstance(answer, AppendResponse) and answer.code == ResponseCode.NOT_A_MEMBER
    assert not c.violations


def test_a_new_member_catches_up_by_installsnapshot_with_the_configuration() -> None:
    c = SimCluster(3, seed=5, tick_ms=20, state_machines=True, snapshot_threshold_entries=5,
                   snapshot_margin_entries=0)
    leader = _sim_leader(c)
    assert _sim_change(c, "add-learner", "n3", c.address("n3")).code == ResponseCode.SUCCESS
    c.add_member(c.config(leader))
    for k in range(40):
        c.append(_sim_leader(c), [encode(Put(b"k%d" % (k % 5), b"v"))])
        c.run(20)
    c.run(2_000)
    leader = _sim_leader(c)
    snap = c.machines.snapshots[leader][-1].meta
    assert isinstance(snap.members, Membership) and "n3" in snap.members.learners and snap.config_index >= 0
    assert c.stores[leader].begin_index > 0  # compacted: a new member gets the snapshot
    installs = c.machines.installs
    assert _sim_change(c, "add-learner", "n4", c.address("n4")).code == ResponseCode.SUCCESS
    c.add_member(c.config(leader))
    assert c.run_until(lambda: c.stores["n4"].committed_index >= c.stores[leader].committed_index, 10_000)
    assert c.machines.installs > installs
    assert c.config("n4") == c.config(leader) and "n3" in c.config("n4").learners
    r = _sim_change(c, "promote", "n4")
    assert r.code == ResponseCode.SUCCESS and c.config(_sim_leader(c)).is_voter("n4")
    assert not c.violations


def test_status_shows_voters_learners_and_lag() -> None:
    m = _ready_leader()
    _change(m, "add-learner", "n3", N3)
    catch_up(m, "n1")
    st = m.node.status()
    assert st.voters == tuple(THREE.voters.items()) and st.learners == (("n3", N3),)
    assert st.config_index == st.committed_config_index and st.config_committed
    n3 = next(f for f in st.followers if f.peer == "n3")
    assert not n3.voter and n3.lag == -1  # never answered
    meta = m.handle(RequestCode.METADATA, MetadataRequest("default"), token="meta")
    assert meta.peers == WITH_N3.peers_string()


def test_a_plain_log_keeps_its_configuration_entry_until_a_snapshot_holds_it() -> None:
    m = _ready_leader()
    floors: list[tuple[int | None, str]] = []

    def record(index: int | None, holder: str = "") -> None:
        floors.append((index, holder))

    m.store.set_retention_floor = record  # type: ignore[method-assign]
    _change(m, "add-learner", "n3", N3)
    catch_up(m, "n1")
    index = m.node.status().committed_config_index
    assert index >= 0
    m.tick()
    take = [a for a in m.out if isinstance(a, TakeSnapshot)]
    assert take and take[-1].members == WITH_N3 and take[-1].config_index == index
    floor = floors[-1][0]
    assert floor is not None and floor <= index and m.node._config_unsaved() == index  # retention keeps it
    # a driver that wrote the command line's peers: the node keeps the configuration it asked for
    meta = SnapshotMeta(take[-1].index, take[-1].term, take[-1].chain_crc, PEERS, next_pos=take[-1].next_pos)
    m.node.complete(SnapshotTaken(take[-1].index, "", meta), m.now)
    snap = m.node.snapshot_meta
    assert snap is not None and snap.members == WITH_N3 and snap.config_index == index
    m.out.clear()
    m.tick()
    assert not [a for a in m.out if isinstance(a, TakeSnapshot)]  # held now: no second one
    assert m.node._config_unsaved() == -1 and "configuration entry" not in floors[-1][1]


def test_a_promoted_member_elected_before_it_learns_the_commit_keeps_leading() -> None:
    """Thesis §4.2.2 steps a leader down once the configuration removing it is committed; one
    that names it a voter (its promotion, committed elsewhere but not yet known here) is no
    removal: it leads, instead of stepping down at every win (a group stuck with all up)."""
    for seed in range(12):
        c = SimCluster(3, seed=700 + seed, tick_ms=20)
        lead = _sim_leader(c)
        assert _sim_change(c, "add-learner", "n3", c.address("n3")).code == ResponseCode.SUCCESS
        c.add_member(c.config(lead))
        c.run(1500)
        r = _sim_change(c, "promote", "n3")
        assert r.code == ResponseCode.SUCCESS, r
        c.crash(_sim_leader(c))  # at once: the others may not have heard the new commit index

        def settled(c: SimCluster = c, want: int = r.config_index + 1) -> bool:
            lead = c.leader()
            return lead is not None and c._node(lead).status().committed_index >= want

        ok = c.run_until(settled, 30_000)
        assert ok and not c.violations, (seed, c.violations[:1])


def test_a_learner_that_stopped_answering_is_not_promoted() -> None:
    """Caught up is not enough (thesis §4.2.1): a learner silent for longer than the lease
    would cost the group a voter the moment it is promoted."""
    c = SimCluster(3, seed=5, tick_ms=20)
    _sim_leader(c)
    assert _sim_change(c, "add-learner", "n3", c.address("n3")).code == ResponseCode.SUCCESS
    c.add_member(c.config(_sim_leader(c)))
    c.run(2000)
    c.crash("n3")
    c.run(10_000)
    tok = c.change_members(_sim_leader(c), "promote", "n3")
    c.run_until(lambda: tok in c.test_answers, 5_000)
    r = c.test_answers[tok]
    assert r.code == ResponseCode.LEARNER_BEHIND and "has not answered for" in r.message, r


def _answer(c: SimCluster, tok: tuple[str, str, int]) -> Any:
    c.run_until(lambda: tok in c.test_answers, 5_000)
    return c.test_answers[tok]


def test_add_learner_takes_one_address_and_a_short_id() -> None:
    """An address is one host:port (a ";" would add members to every peers string built from
    the configuration); an id fits the heartbeat fields that name members; the same address
    written differently is the same member's."""
    c = SimCluster(3, seed=3, tick_ms=20)
    _sim_leader(c)
    c.run(1500)  # the leader's first entry committed: changes are taken
    for mid, addr in (("n3", "127.0.0.1:20003;evil-6.6.6.6:1"), ("n3", "127.0.0.1"), ("x" * 65, "127.0.0.1:20009")):
        r = _answer(c, c.change_members(_sim_leader(c), "add-learner", mid, addr))
        assert r.code == ResponseCode.UNEXPECTED_ARGUMENT, (mid[:8], addr)
    n1 = c.config(_sim_leader(c)).members["n1"]
    host, port = n1.rsplit(":", 1)
    tok = c.change_members(_sim_leader(c), "add-learner", "n3", f"{host.upper()}:{port}")
    c.run_until(lambda: tok in c.test_answers, 5_000)
    assert c.test_answers[tok].code in (ResponseCode.MEMBER_EXISTS, ResponseCode.UNEXPECTED_ARGUMENT)


def test_a_change_that_leaves_no_live_majority_is_refused() -> None:
    """Three voters, one down: removing a live follower would commit (two of three answer) and
    leave {leader, dead}, which elects no one; removing the dead one is the way (etcd's strict
    reconfiguration check)."""
    c = SimCluster(3, seed=4, tick_ms=20)
    lead = _sim_leader(c)
    c.run(1500)
    dead, live = [i for i in c.ids if i != lead]
    c.crash(dead)
    c.run(5_000)  # longer than the lease: the leader has not heard it
    r = _answer(c, c.change_members(_sim_leader(c), "remove", live))
    assert r.code == ResponseCode.MEMBERSHIP_UNSAFE and dead in r.message, r
    r = _answer(c, c.change_members(_sim_leader(c), "remove", dead))
    assert r.code == ResponseCode.SUCCESS, r
