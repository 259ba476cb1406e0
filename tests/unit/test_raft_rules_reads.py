"""ReadIndex and the leader's read path against the Raft thesis (§6.4 linearizable reads, §6.4.1
leases, §8 a new leader's commit index), one test per rule, built without sockets."""

from __future__ import annotations

import pytest

from dledger.codes import RequestCode, ResponseCode
from dledger.core.contexts import Answered, HeartbeatCtx
from dledger.core.messages import EntriesResponse, GetRequest, HeartBeatRequest, HeartBeatResponse

from .raft_harness import Member, catch_up, leading


def _get(m: Member, index: int, consistency: str = "linearizable", token: str = "r") -> EntriesResponse | None:
    resp = m.handle(RequestCode.GET, GetRequest("default", "", "n0", index, consistency=consistency), token=token)
    assert resp is None or isinstance(resp, EntriesResponse)
    return resp


def _ack_heartbeats(m: Member, *peers: str, lease_ms: int = 0) -> None:
    for s in [s for s in m.sends(RequestCode.HEART_BEAT) if s.peer in peers]:
        m.out.remove(s)
        assert isinstance(s.ctx, HeartbeatCtx)
        m.node.complete(Answered(s.ctx, HeartBeatResponse(int(ResponseCode.SUCCESS), m.node.member.term, "n0",
                                                          end_index=m.store.end_index, lease_ms=lease_ms)), m.now)
    m.drain()


def test_a_new_leader_serves_no_read_before_an_entry_of_its_term_commits() -> None:
    """until its NOOP commits, its commit index may trail what the last leader acknowledged."""
    m = leading()
    assert m.store.committed_index < m.store.end_index
    resp = _get(m, 0, "leader")
    assert resp is not None and resp.code == ResponseCode.LEADER_NOT_READY


def test_a_linearizable_read_waits_for_a_majority_to_confirm_a_round_sent_after_it() -> None:
    m = leading()
    catch_up(m, "n1")
    m.clear()
    assert _get(m, 0) is None  # waits
    assert m.sends(RequestCode.HEART_BEAT)  # a round goes at once, not at the next tick
    _ack_heartbeats(m, "n1")  # with ours, 2 of 3
    m.drain()
    resp = m.reply_to("r")
    assert isinstance(resp, EntriesResponse) and resp.code == ResponseCode.SUCCESS
    assert resp.entries[0].index == 0


def test_a_round_sent_before_the_read_does_not_confirm_it() -> None:
    m = leading()
    catch_up(m, "n1")
    m.node.elector.heartbeat_now()
    m.drain()
    early = [s for s in m.sends(RequestCode.HEART_BEAT) if s.peer == "n1"]
    m.clear()
    assert _get(m, 0) is None
    for s in early:  # the answer to the earlier round
        assert isinstance(s.ctx, HeartbeatCtx)
        m.node.complete(Answered(s.ctx, HeartBeatResponse(int(ResponseCode.SUCCESS), m.node.member.term, "n0",
                                                          end_index=m.store.end_index)), m.now)
    m.drain()
    assert m.reply_to("r") is None


def test_a_lease_read_inside_a_confirmed_lease_needs_no_round() -> None:
    m = leading()
    catch_up(m, "n1")
    assert _get(m, 0, token="first") is None
    _ack_heartbeats(m, "n1")  # confirms a round: a lease from its send time
    m.clear()
    resp = _get(m, 0, "lease", token="second")
    assert resp is not None and resp.code == ResponseCode.SUCCESS
    assert not m.sends(RequestCode.HEART_BEAT)


@pytest.mark.parametrize("voters_lease", ["not said", "shorter"])
def test_a_lease_counts_no_longer_than_a_voters_own_lease(voters_lease: str) -> None:
    """A voter on a shorter heartbeat setting keeps to our lease while it runs, but one that
    restarts refuses votes only for its own lease: reads count the shorter one (§6.4.1)."""
    m = leading()
    catch_up(m, "n1")
    own, drift = m.node.elector.leader_lease_ms, m.cfg.lease_clock_drift_ms
    short = own // 2
    assert _get(m, 0, token="first") is None
    _ack_heartbeats(m, "n1", lease_ms=short if voters_lease == "shorter" else 0)  # confirms the round sent at 0
    m.clear()
    m.now += short - drift + 10  # past the voter's lease, inside ours
    resp = _get(m, 0, "lease", token="second")
    if voters_lease == "shorter":
        assert resp is None and m.sends(RequestCode.HEART_BEAT)  # asks a round first
    else:
        assert resp is not None and resp.code == ResponseCode.SUCCESS and not m.sends(RequestCode.HEART_BEAT)


def test_a_follower_says_its_own_lease_in_its_heartbeat_answers() -> None:
    m = Member("n1", heart_beat_time_interval_ms=100, max_heart_beat_leak=4)
    resp = m.handle(RequestCode.HEART_BEAT, HeartBeatRequest("default", "n0", "n1", 1, -1, -1, "", 900))
    assert isinstance(resp, HeartBeatResponse) and resp.lease_ms == 400


def test_waiting_reads_fail_not_leader_when_the_leader_steps_down() -> None:
    m = leading()
    catch_up(m, "n1")
    assert _get(m, 0) is None
    m.node.step_down("test")
    m.drain()
    resp = m.reply_to("r")
    assert isinstance(resp, EntriesResponse) and resp.code == ResponseCode.NOT_LEADER


def test_a_follower_redirects_an_unaddressed_read_to_the_leader() -> None:
    m = Member()
    resp = _get(m, 0)
    assert resp is not None and resp.code == ResponseCode.NOT_LEADER
