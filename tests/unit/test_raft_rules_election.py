"""LeaderElector against the Raft thesis' election rules (§3.4, §3.6, §9.6 pre-vote), one test per
rule, in the style of etcd's raft_paper_test: a member built without sockets, messages by hand."""

from __future__ import annotations

from dledger.codes import RequestCode, ResponseCode
from dledger.core.contexts import Answered, HeartbeatCtx
from dledger.core.messages import HeartBeatRequest, HeartBeatResponse, Role, VoteRequest, VoteResponse, VoteResult
from dledger.entry import MAGIC_NOOP

from .raft_harness import Member, campaign_and_win, msg_of


def _vote(m: Member, candidate: str, term: int, end_index: int = -1, end_term: int = -1,
          pre_vote: bool = False, transfer: bool = False) -> VoteResult:
    m.now = max(m.now, m.node.elector.no_vote_until)  # past the lease a restarted member waits out
    req = VoteRequest("default", candidate, m.cfg.self_id, term, end_index, end_term, pre_vote, transfer)
    resp = m.handle(RequestCode.VOTE, req, token=("vote", candidate, term, m.now))
    assert isinstance(resp, VoteResponse)
    return VoteResult(resp.result)


def test_votes_for_at_most_one_candidate_per_term() -> None:
    m = Member()
    assert _vote(m, "n1", 1) == VoteResult.ACCEPT
    assert _vote(m, "n2", 1) == VoteResult.REJECT_ALREADY_VOTED
    assert _vote(m, "n1", 1) == VoteResult.ACCEPT  # the same candidate asking again (a lost answer)


def test_vote_is_persisted_before_it_is_granted() -> None:
    m = Member()
    assert _vote(m, "n1", 3) == VoteResult.ACCEPT
    saved = m.store.load_term()
    assert (saved.term, saved.voted_for) == (3, "n1")


def test_a_new_term_clears_the_vote() -> None:
    m = Member()
    assert _vote(m, "n1", 1) == VoteResult.ACCEPT
    assert _vote(m, "n2", 2) == VoteResult.ACCEPT
    assert m.node.member.voted_for == "n2"


def test_rejects_a_candidate_of_an_older_term() -> None:
    m = Member()
    assert _vote(m, "n1", 5) == VoteResult.ACCEPT
    assert _vote(m, "n2", 4) == VoteResult.REJECT_EXPIRED_VOTE_TERM


def test_rejects_a_candidate_whose_last_term_is_older() -> None:
    m = Member(terms=[1, 2])  # last entry: index 1, term 2
    assert _vote(m, "n1", 3, end_index=5, end_term=1) == VoteResult.REJECT_EXPIRED_LEDGER_TERM


def test_rejects_a_candidate_with_the_same_last_term_and_a_shorter_log() -> None:
    m = Member(terms=[1, 1, 1])
    assert _vote(m, "n1", 2, end_index=1, end_term=1) == VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert _vote(m, "n2", 2, end_index=2, end_term=1) == VoteResult.ACCEPT  # as long: up to date


def test_a_later_last_term_wins_over_a_longer_log() -> None:
    m = Member(terms=[1, 1, 1, 1])
    assert _vote(m, "n1", 3, end_index=0, end_term=2) == VoteResult.ACCEPT


def test_pre_vote_changes_neither_term_nor_vote() -> None:
    m = Member()
    assert _vote(m, "n1", 7, pre_vote=True) == VoteResult.ACCEPT
    assert (m.node.member.term, m.node.member.voted_for) == (0, None)
    assert _vote(m, "n2", 1) == VoteResult.ACCEPT  # free to vote for another in a real round


def test_a_follower_that_hears_its_leader_refuses_votes() -> None:
    m = Member()
    hb = HeartBeatRequest("default", "n1", "n0", 1, -1, lease_ms=10_000)
    assert m.handle(RequestCode.HEART_BEAT, hb).code == ResponseCode.SUCCESS
    assert _vote(m, "n2", 2) == VoteResult.REJECT_ALREADY_HAS_LEADER
    assert m.node.member.term == 1


def test_election_timeout_starts_a_pre_vote_round_without_raising_the_term() -> None:
    m = Member()
    for _ in range(1000):
        if m.sends(RequestCode.VOTE):
            break
        m.tick()
    votes = m.sends(RequestCode.VOTE)
    assert {s.peer for s in votes} == {"n1", "n2"}
    assert all(msg_of(s, VoteRequest).pre_vote and msg_of(s, VoteRequest).term == 1 for s in votes)
    assert m.node.member.term == 0 and m.node.member.role == Role.CANDIDATE


def test_a_majority_of_votes_makes_a_leader_that_appends_a_noop_of_its_term() -> None:
    m = Member(terms=[1])
    campaign_and_win(m)
    assert m.node.member.term == 2
    e = m.store.get(m.store.end_index)
    assert (e.term, e.magic) == (2, MAGIC_NOOP)
    assert {s.peer for s in m.sends(RequestCode.HEART_BEAT)} == {"n1", "n2"}


def test_a_leader_steps_down_on_a_higher_term_in_an_answer() -> None:
    m = Member()
    campaign_and_win(m)
    hb = next(s for s in m.sends(RequestCode.HEART_BEAT) if isinstance(s.ctx, HeartbeatCtx))
    m.node.complete(Answered(hb.ctx, HeartBeatResponse(int(ResponseCode.SUCCESS), m.node.member.term + 3)), m.now)
    assert m.node.member.role == Role.FOLLOWER
    assert m.node.member.term == 4
    assert not m.node.status().followers


def test_a_live_leader_ignores_an_ordinary_candidate_of_a_higher_term() -> None:
    """Thesis §4.2.3 (disruptive servers): a leader that hears from a majority keeps its term."""
    m = Member()
    campaign_and_win(m)
    assert _vote(m, "n1", 9, end_index=m.store.end_index, end_term=m.store.end_term) \
        == VoteResult.REJECT_ALREADY_HAS_LEADER
    assert m.node.member.role == Role.LEADER and m.node.member.term == 1


def test_a_leader_steps_down_on_a_hand_over_vote_of_a_higher_term() -> None:
    m = Member()
    campaign_and_win(m)
    assert _vote(m, "n1", 9, end_index=m.store.end_index, end_term=m.store.end_term,
                 transfer=True) == VoteResult.ACCEPT
    assert m.node.member.role == Role.FOLLOWER and m.node.member.term == 9


def test_a_leader_that_reaches_no_majority_steps_down() -> None:
    """Check quorum (thesis §6.2): no answers for a lease: it leaves."""
    m = Member()
    campaign_and_win(m)
    for _ in range(1000):
        m.tick(50)
        if m.node.member.role != Role.LEADER:
            break
    assert m.node.member.role == Role.FOLLOWER
