"""Fast failover without timers alone: a parked leader search (METADATA wait_ms) is answered the
moment the member wins its election, a member that did not run for a while reads what
arrived before it gives up on its leader, and a rejected pre-vote is asked again soon
(core.leader_wait, core.elector)."""

from __future__ import annotations

import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core.contexts import Answered
from dledger.core.leader_wait import MAX_PARKED, MAX_PARKED_PER_PRINCIPAL, MAX_WAIT_MS, LeaderWaits
from dledger.core.messages import (
    HeartBeatRequest,
    MetadataRequest,
    MetadataResponse,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.core.starvation import WINDOW_MS, RecentGaps, extra_wait

from .raft_harness import Member, campaign_and_win, msg_of


def test_waits_heap_expires_in_deadline_order_and_is_bounded() -> None:
    w = LeaderWaits()
    assert w.park("b", 0, 200) and w.park("a", 0, 100) and w.park("long", 0, 10 * MAX_WAIT_MS)
    assert w.expired(99) == []
    assert w.expired(200) == ["a", "b"]
    assert w.expired(MAX_WAIT_MS) == ["long"]  # cut to the maximum wait
    for k in range(MAX_PARKED):
        assert w.park(k, 0, 1000, principal=f"p{k % 4}")
    assert not w.park("over", 0, 1000, principal="other")  # full: the caller answers at once
    assert len(w.take_all()) == MAX_PARKED and len(w) == 0


def test_one_principal_holds_at_most_its_share_of_parked_searches() -> None:
    w = LeaderWaits()
    for k in range(MAX_PARKED_PER_PRINCIPAL):
        assert w.park(k, 0, 100, principal="flood")
    assert not w.park("more", 0, 100, principal="flood")  # answered at once
    assert w.park("mine", 0, 100, principal="client")  # another caller still parks
    assert len(w.expired(100)) == MAX_PARKED_PER_PRINCIPAL + 1
    assert w.park("again", 0, 100, principal="flood")  # its share is free again


def test_a_follower_answers_a_parked_search_when_it_wins() -> None:
    m = Member(terms=[1])
    token = ("search", 1)
    assert m.handle(RequestCode.METADATA, MetadataRequest("default", "", "n0", wait_ms=5000), token=token) is None
    campaign_and_win(m)
    assert m.node.member.role == Role.LEADER
    resp = m.reply_to(token)
    assert isinstance(resp, MetadataResponse) and resp.role == "leader" and resp.leader_id == "n0"


def test_a_parked_search_is_answered_with_the_view_when_its_wait_runs_out() -> None:
    m = Member(terms=[1])
    # a leader heard: this follower will not campaign during the wait
    hb = HeartBeatRequest("default", "n1", "n0", 1, -1, -1, "", m.node.elector.leader_lease_ms)
    m.handle(RequestCode.HEART_BEAT, hb, token="hb")
    token = ("search", 2)
    assert m.handle(RequestCode.METADATA, MetadataRequest("default", "", "n0", wait_ms=50), token=token) is None
    m.tick(20)
    assert m.reply_to(token) is None
    m.tick(40)
    resp = m.reply_to(token)
    assert isinstance(resp, MetadataResponse) and resp.role == "follower" and resp.leader_id == "n1"


def test_a_leader_and_a_plain_metadata_answer_at_once() -> None:
    m = Member(terms=[1])
    assert isinstance(m.handle(RequestCode.METADATA, MetadataRequest("default", "", "n0"), token="plain"),
                      MetadataResponse)
    campaign_and_win(m)
    resp = m.handle(RequestCode.METADATA, MetadataRequest("default", "", "n0", wait_ms=5000), token="lead")
    assert isinstance(resp, MetadataResponse) and resp.role == "leader"


def _role(m: Member) -> Role:
    return m.node.member.role


def _following(m: Member) -> None:
    hb = HeartBeatRequest("default", "n1", "n0", 1, -1, -1, "", m.node.elector.leader_lease_ms)
    m.handle(RequestCode.HEART_BEAT, hb, token="hb")
    m.clear()


def test_a_follower_that_stalled_reads_before_it_campaigns_once() -> None:
    m = Member(terms=[1])
    m.tick()
    _following(m)
    el = m.node.elector
    # one tick long after the election deadline: the process did not run meanwhile
    m.tick(el.election_deadline - m.now + 500)
    assert not m.sends(RequestCode.VOTE) and el.stall_graces == 1
    # the leader's heartbeat that was waiting in the socket keeps it a follower
    _following(m)
    for _ in range(5):
        m.tick()
    assert not m.sends(RequestCode.VOTE)
    # another stall past the new deadline: a grace again; nothing arrives, and a second stall
    # past the same (graced) deadline buys no second grace: it campaigns
    m.tick(el.election_deadline - m.now + 500)
    assert not m.sends(RequestCode.VOTE) and el.stall_graces == 2
    m.tick(el.election_deadline - m.now + 500)
    assert m.sends(RequestCode.VOTE) and el.stall_graces == 2


def test_a_follower_that_ran_all_along_campaigns_at_its_deadline() -> None:
    m = Member(terms=[1])
    _following(m)
    el = m.node.elector
    while not m.sends(RequestCode.VOTE):
        m.tick()
    assert el.stall_graces == 0


def test_a_leader_that_stalled_hears_its_followers_before_checking_quorum() -> None:
    m = Member(terms=[1], adaptive_timeout_max_ms=0)  # the stall grace alone (core.starvation off)
    campaign_and_win(m)
    el = m.node.elector
    m.tick(el.hb_ms)
    assert m.sends(RequestCode.HEART_BEAT)
    m.clear()
    # a stall longer than the lease: the followers' answers are still unread
    m.tick(2 * el.leader_lease_ms)
    assert _role(m) == Role.LEADER
    # they stay unanswered: one heartbeat period later it steps down (check quorum)
    m.tick(el.hb_ms)
    assert _role(m) == Role.FOLLOWER


def test_a_leader_that_stalled_long_waits_twice_the_stall_for_its_followers() -> None:
    """On a starved machine check-quorum's window stretches to twice the longest recent gap
    (core.starvation), up to adaptive_timeout_max_ms; the followers never answering, the leader
    still steps down once it passed."""
    m = Member(terms=[1])
    campaign_and_win(m)
    el = m.node.elector
    m.tick(el.hb_ms)
    stall = 2 * el.leader_lease_ms
    m.tick(stall)
    assert el.quorum_window_ms() == 2 * stall  # 2.4 s: under the 2 s cap plus the 600 ms lease
    waited = 0
    while _role(m) == Role.LEADER:
        m.tick(el.hb_ms)
        waited += el.hb_ms
        assert waited <= 2 * stall + el.hb_ms, "no step-down: check-quorum never ran"
    assert waited >= stall - el.hb_ms  # not one period after the stall, as without adaptation


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_follower_whose_leader_comes_late_waits_longer_before_campaigning(adaptive: bool) -> None:
    """A leader starved, not dead: one heartbeat comes 550 ms late (within the 600-800 ms
    timeout: a near miss), the next ones 900 ms apart. The near miss stretches the timeout to
    twice it (core.starvation), so they elect no one; without adaptation the first of them
    does. Gaps beyond the unstretched timeout are not learnt (no ratchet): the stretch stays
    that of the near miss. When the leader really stops, the follower campaigns within it."""
    m = Member(terms=[1], adaptive_timeout_max_ms=2000 if adaptive else 0)
    m.tick()
    _following(m)
    el = m.node.elector

    def silence(ms: int) -> bool:
        """`ms` without the leader, ticking every 10 ms; did it campaign?"""
        for _ in range(ms // 10):
            m.tick(10)
            if m.sends(RequestCode.VOTE):
                return True
        return False

    assert not silence(550)
    _following(m)
    campaigned = False
    for _ in range(5):
        campaigned = campaigned or silence(900)
        _following(m)
    assert campaigned is not adaptive
    if adaptive:
        assert el.starved_extra_ms(el.leader_lease_ms) == 2 * 550 - el.leader_lease_ms
        silent = 0
        while not silence(10):
            silent += 10
            assert silent < 2 * 550 + m.cfg.max_vote_interval_ms + 2 * el.hb_ms, "never campaigned"
        assert silent >= 2 * 550 - 10  # not at the unstretched 600-800 ms


def test_adaptation_is_bounded_and_forgets() -> None:
    g = RecentGaps()
    g.note(5_000, 100)
    assert extra_wait(g.longest(100), 600, 2000) == 2000  # capped
    assert extra_wait(g.longest(100), 600, 0) == 0  # off
    assert extra_wait(150, 600, 2000) == 0  # a quiet machine: heartbeats on time, nothing added
    assert g.longest(100 + WINDOW_MS) == 5_000  # kept for one window more ...
    assert g.longest(100 + 2 * WINDOW_MS + 1) == 0  # ... then forgotten


def test_a_quiet_group_keeps_its_failover_timeout() -> None:
    m = Member(terms=[1])
    m.tick()
    _following(m)
    el = m.node.elector
    for _ in range(50):  # heartbeats on time
        m.tick(el.hb_ms)
        _following(m)
    assert el.starved_extra_ms(el.leader_lease_ms) == 0


def test_a_leader_whose_every_tick_comes_late_still_checks_its_quorum() -> None:
    """A stall postpones check-quorum once per check, not on every late tick: a cut-off leader
    on a starved machine (ticks always more than a heartbeat period apart) still steps down."""
    m = Member(terms=[1])
    campaign_and_win(m)
    el = m.node.elector
    for _ in range(100):  # 15 s of ticks 151 ms apart; no follower ever answers
        m.tick(el.hb_ms + 1)
        if _role(m) != Role.LEADER:
            break
    assert _role(m) == Role.FOLLOWER


def test_a_rejected_pre_vote_is_asked_again_within_a_heartbeat_period() -> None:
    m = Member(terms=[1])
    el = m.node.elector
    while not m.sends(RequestCode.VOTE):
        m.tick()
    term = m.node.member.term
    for s in m.sends(RequestCode.VOTE):  # both voters still hear a leader: no
        req = msg_of(s, VoteRequest)
        assert req.pre_vote
        resp = VoteResponse(term, int(VoteResult.REJECT_ALREADY_HAS_LEADER), True)
        m.node.complete(Answered(s.ctx, resp), m.now)
    m.drain()
    m.clear()
    waited = 0
    while not m.sends(RequestCode.VOTE):
        m.tick()
        waited += 10
    assert waited <= el.hb_ms + 10 < m.cfg.min_vote_interval_ms
    assert msg_of(m.sends(RequestCode.VOTE)[0], VoteRequest).pre_vote
    assert m.node.member.term == term  # pre-votes cost no term


def test_a_leader_that_stays_just_in_time_does_not_ratchet_the_timeout_up() -> None:
    """Each heartbeat a little before the (stretched) deadline: only near misses of the
    unstretched timeout are learnt, so the stretch stops at twice that timeout."""
    m = Member(terms=[1])
    m.tick()
    _following(m)
    el = m.node.elector
    for _ in range(10):
        while m.now < el.election_deadline - 20:  # the loop runs all along: only the leader is late
            m.tick(10)
        _following(m)
    assert not m.sends(RequestCode.VOTE)
    spread = m.cfg.max_vote_interval_ms - m.cfg.min_vote_interval_ms
    assert el.starved_extra_ms(el.leader_lease_ms) < 2 * (el.leader_lease_ms + spread) - el.leader_lease_ms
    assert el.starved_extra_ms(el.leader_lease_ms) < m.cfg.adaptive_timeout_max_ms


def test_followers_answering_late_stretch_check_quorum_but_an_outage_does_not() -> None:
    from dledger.core.contexts import HeartbeatCtx
    from dledger.core.messages import HeartBeatResponse

    m = Member(terms=[1])
    campaign_and_win(m)
    el = m.node.elector

    def answer(peer: str) -> None:
        resp = HeartBeatResponse(int(ResponseCode.SUCCESS), m.node.member.term, "n0", -1, False, m.store.end_index,
                                 -1, -1)
        m.node.complete(Answered(HeartbeatCtx(peer, m.node.member.term, -1, 0), resp), m.now)
        m.drain()

    def run(ms: int) -> None:
        """`ms` of a loop that runs all along, n2 answering every 100 ms (the quorum holds)."""
        for k in range(ms // 10):
            m.tick(10)
            if k % 10 == 9:
                answer("n2")

    answer("n1")
    answer("n2")
    run(1000)
    answer("n1")  # 1,000 ms after its last answer: beyond the 600 ms window, an outage
    assert m.node.member.role == Role.LEADER
    assert el.quorum_window_ms() == el.leader_lease_ms  # nothing learnt (n2's answers are on time)
    run(500)
    answer("n1")  # 500 ms: late, within the window: a slow machine
    assert el.quorum_window_ms() == el.leader_lease_ms + (2 * 500 - el.leader_lease_ms)


def test_a_follower_of_a_starved_leader_refuses_votes_as_long_as_its_stretched_timeout() -> None:
    """A member that restarted (its gaps forgotten) campaigns at the plain lease; voters whose
    timeouts stretched refuse it until theirs passes, not only for the lease."""
    m = Member(terms=[1])
    m.tick()
    _following(m)
    el = m.node.elector
    for _ in range(55):  # a near miss of 550 ms: stretched by 500 ms
        m.tick(10)
    _following(m)
    for _ in range(70):  # the lease passed, the stretched timeout not
        m.tick(10)
    assert el.leader_alive()
    for _ in range(50):
        m.tick(10)
    assert not el.leader_alive()
