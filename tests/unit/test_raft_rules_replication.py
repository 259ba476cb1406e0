"""Log replication against the Raft thesis, one test per rule, in the style of
etcd's raft_paper_test: the follower's EntryHandler, the leader's EntryDispatcher and
QuorumAckChecker, and the follower's Progress they share, all built without sockets."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.contexts import Answered, PushCtx
from dledger.core.dispatcher import COALESCE_RTT_MS
from dledger.core.member_state import MemberState
from dledger.core.messages import AppendRequest, PushRequest, PushResponse, Role
from dledger.core.progress import Progress
from dledger.core.quorum import QuorumAckChecker
from dledger.entry import MAGIC_NOOP, MAGIC_NORMAL
from dledger.store.base import AppendedBatch
from dledger.store.memory import MemoryLedgerStore

from .raft_harness import Member, answer_pushes, catch_up, leading, msg_of


def _leader_log(terms: list[int]) -> MemoryLedgerStore:
    s = MemoryLedgerStore()
    for t in terms:
        s.append_as_leader([f"t{t}".encode()], t, MAGIC_NORMAL)
    return s


def _push(f: Member, leader: MemoryLedgerStore, kind: PushType, prev: int, term: int, first: int = 0,
          count: int = 0, committed: int = -1) -> PushResponse:
    data = b""
    if kind == PushType.APPEND:
        raw = leader.read_raw(first, 1 << 20)
        data = bytes(raw.data)[: sum(leader.slot(i)[1] for i in range(first, first + count))] \
            if raw.count > count else bytes(raw.data)
    prev_term = leader.term_at(prev) if prev >= 0 else -1
    next_term = leader.term_at(prev + 1) if kind == PushType.TRUNCATE and prev + 1 <= leader.end_index else -1
    req = PushRequest("default", "n1", f.cfg.self_id, term, int(kind), prev, prev_term, first, count, committed,
                      next_term)
    resp = f.handle(RequestCode.PUSH, req, data, token=("push", f.now, kind, prev))
    assert isinstance(resp, PushResponse)
    return resp


# --- the follower (EntryHandler) -----------------------------------------------------------------


def test_append_is_refused_when_the_previous_entry_differs() -> None:
    """The consistency check: a push whose (prev_index, prev_term) the follower does not
    hold is refused, and the follower's log stays as it was."""
    f = Member(terms=[1, 1])
    leader = _leader_log([1, 2, 2])  # differs at index 1
    resp = _push(f, leader, PushType.APPEND, 1, 2, first=2, count=1)
    assert resp.code != ResponseCode.SUCCESS
    assert (f.store.end_index, f.store.end_term) == (1, 1)


def test_compare_names_the_conflicting_term_and_its_first_index() -> None:
    """The conflict-term optimisation (§3.5 end): the answer lets the leader skip a term at once."""
    f = Member(terms=[1, 3, 3, 3])
    leader = _leader_log([1, 2, 2, 2, 2])
    resp = _push(f, leader, PushType.COMPARE, 3, 4)
    assert resp.code == ResponseCode.INCONSISTENT_STATE
    assert (resp.x_term, resp.x_index) == (3, 1)


def test_conflicting_entries_are_truncated_and_the_leaders_appended() -> None:
    """A follower deletes an existing entry that conflicts with a new one, and all after it."""
    f = Member(terms=[1, 3, 3])
    leader = _leader_log([1, 2, 2, 4])
    assert _push(f, leader, PushType.COMPARE, 0, 4).code == ResponseCode.SUCCESS
    assert _push(f, leader, PushType.TRUNCATE, 0, 4).code == ResponseCode.SUCCESS
    assert f.store.end_index == 0
    assert _push(f, leader, PushType.APPEND, 0, 4, first=1, count=3).code == ResponseCode.SUCCESS
    assert [f.store.term_at(i) for i in range(4)] == [1, 2, 2, 4]


def test_a_late_truncate_never_removes_entries_of_the_leaders_term() -> None:
    """A duplicated TRUNCATE arriving after the APPEND it preceded must not undo it."""
    f = Member(terms=[1])
    leader = _leader_log([1, 4, 4])
    assert _push(f, leader, PushType.APPEND, 0, 4, first=1, count=2).code == ResponseCode.SUCCESS
    assert _push(f, leader, PushType.TRUNCATE, 0, 4).code == ResponseCode.SUCCESS
    assert f.store.end_index == 2


def test_follower_commits_no_further_than_it_matches_the_leader() -> None:
    """A follower applies the leader's commit index only to entries known equal to the leader's."""
    f = Member(terms=[1, 1, 1])
    leader = _leader_log([1, 2, 2, 2])
    assert _push(f, leader, PushType.COMPARE, 0, 2, committed=3).code == ResponseCode.SUCCESS
    assert f.store.committed_index == 0  # its entries 1..2 (term 1) are not the leader's


def test_a_push_of_an_older_term_is_refused() -> None:
    f = Member(terms=[1])
    f.node.member.set_term(5)
    resp = _push(f, _leader_log([1, 2]), PushType.APPEND, 0, 2, first=1, count=1)
    assert resp.code == ResponseCode.EXPIRED_TERM and resp.term == 5
    assert f.store.end_index == 0


def test_a_push_of_a_newer_term_makes_a_candidate_follow() -> None:
    f = Member(terms=[1])
    f.node.member.role = Role.CANDIDATE
    assert _push(f, _leader_log([1, 2]), PushType.COMPARE, 0, 2).code == ResponseCode.SUCCESS
    assert f.node.member.role == Role.FOLLOWER and f.node.member.leader_id == "n1"


# --- the leader (QuorumAckChecker, Progress) ------------------------------------------------------


def _quorum(terms: list[int], term_start: int, sync: bool = False) -> tuple[QuorumAckChecker, dict[str, Progress],
                                                                           list[Any]]:
    store = _leader_log(terms)
    member = MemberState("default", "n0", ["n0", "n1", "n2", "n3", "n4"], store)
    progress = {p: Progress(p) for p in member.others}
    done: list[Any] = []
    q = QuorumAckChecker(member, store, lambda tok, code, res, msg: done.append((tok, code)), progress, sync)
    q.reset(term_start)
    return q, progress, done


def test_commits_an_entry_once_a_majority_stores_it() -> None:
    q, pr, _ = _quorum([2, 2, 2], term_start=0)
    q.ack_self(2)
    pr["n1"].match_index = 2
    assert not q.advance()  # 2 of 5
    pr["n2"].match_index = 1
    assert q.advance() and q.store.committed_index == 1  # 3 of 5 hold index 1


def test_entries_of_earlier_terms_are_not_committed_by_counting() -> None:
    """only an entry of the leader's own term commits by counting replicas; earlier ones
    commit with it."""
    q, pr, _ = _quorum([1, 1, 3], term_start=2)  # the leader's NOOP of term 3 at index 2
    q.ack_self(2)
    for p in ("n1", "n2", "n3"):
        pr[p].match_index = 1
    assert not q.advance() and q.store.committed_index == -1
    pr["n1"].match_index = pr["n2"].match_index = 2
    assert q.advance() and q.store.committed_index == 2


def test_the_commit_index_never_moves_back() -> None:
    q, pr, _ = _quorum([1, 1, 1], term_start=0)
    q.ack_self(2)
    pr["n1"].match_index = pr["n2"].match_index = 2
    assert q.advance() and q.store.committed_index == 2
    pr["n1"].lost()  # a follower that lost its tail no longer counts...
    pr["n2"].lost()
    assert not q.advance() and q.store.committed_index == 2  # ...but nothing committed is undone


def test_sync_mode_counts_only_what_followers_report_durable() -> None:
    q, pr, _ = _quorum([1, 1], term_start=0, sync=True)
    q.ack_self(1)
    pr["n1"].match_index = pr["n2"].match_index = 1
    assert not q.advance()
    pr["n1"].durable = pr["n2"].durable = 1
    assert q.advance() and q.store.committed_index == 1


def test_waiting_appends_complete_when_their_entry_commits() -> None:
    q, pr, done = _quorum([2, 2], term_start=0)
    q.add("a", AppendedBatch(1, 2, array("q", [0])), deadline_ms=1000)
    q.ack_self(1)
    pr["n1"].match_index = pr["n2"].match_index = 1
    q.advance()
    assert done == [("a", ResponseCode.SUCCESS)]


def test_match_index_only_grows() -> None:
    """A late answer for an earlier push never lowers what the leader knows the follower holds."""
    m = leading()
    term, end = m.node.member.term, m.store.end_index
    answer_pushes(m, "n1", PushResponse(int(ResponseCode.SUCCESS), term, end))  # COMPARE at end - 1
    m.tick()
    answer_pushes(m, "n1", PushResponse(int(ResponseCode.SUCCESS), term, end))  # APPEND through end
    assert m.node.progress["n1"].match_index == end
    stale = PushCtx("n1", m.node.dispatchers["n1"].epoch, 0, int(PushType.COMPARE), end - 1, term)
    m.node.complete(Answered(stale, PushResponse(int(ResponseCode.SUCCESS), term, end - 1)), m.now)
    assert m.node.progress["n1"].match_index == end


def test_a_new_leader_appends_a_noop_and_commits_earlier_entries_with_it() -> None:
    m = leading()
    noop = m.store.end_index
    assert m.store.get(noop).magic == MAGIC_NOOP
    term = m.node.member.term
    answer_pushes(m, "n1", PushResponse(int(ResponseCode.SUCCESS), term, 0))  # COMPARE at 0
    m.tick()
    answer_pushes(m, "n1", PushResponse(int(ResponseCode.SUCCESS), term, noop))
    assert m.store.committed_index == noop  # the term-1 entry commits with the NOOP


def test_answers_of_an_earlier_leadership_are_ignored() -> None:
    """Every term's dispatchers count epochs from 0: the term in the context tells them apart."""
    m = leading()
    end = m.store.end_index
    old = PushCtx("n1", m.node.dispatchers["n1"].epoch, 0, int(PushType.COMPARE), end, m.node.member.term - 1)
    m.node.complete(Answered(old, PushResponse(int(ResponseCode.SUCCESS), m.node.member.term, end)), m.now)
    assert m.node.progress["n1"].match_index == -1


def _appends_to(m: Member, peer: str) -> list[Any]:
    return [s for s in m.sends(RequestCode.PUSH) if s.peer == peer and msg_of(s, PushRequest).type == PushType.APPEND]


def _append(m: Member, body: bytes, token: str) -> None:
    m.handle(RequestCode.APPEND, AppendRequest(group="default", bodies=[body]), token=token)


def _answer(m: Member, push: Any, after_ms: int) -> None:
    """Answer an APPEND push `after_ms` after it was sent: the follower holds it."""
    if after_ms:
        m.tick(after_ms)
    m.out.remove(push)
    req = msg_of(push, PushRequest)
    resp = PushResponse(int(ResponseCode.SUCCESS), m.node.member.term, req.first_index + req.count - 1)
    m.node.complete(Answered(push.ctx, resp), m.now)
    m.drain()


def _linked(rtt_ms: int) -> Member:
    """A leader whose follower n1 holds its log, its one APPEND push so far answered in rtt_ms."""
    m = leading()
    catch_up(m, "n1")
    m.clear()
    _append(m, b"first", "first")
    (push,) = _appends_to(m, "n1")
    _answer(m, push, rtt_ms)
    m.clear()
    return m


def test_on_a_short_link_a_small_push_waits_for_the_one_in_flight() -> None:
    """Ack-clocked pushes (EntryDispatcher): with one APPEND push in flight to a follower whose
    pushes are answered quickly, a new entry does not go out in a second, nearly empty push;
    the answer sends it, with everything that arrived meanwhile, in one push."""
    m = _linked(0)
    _append(m, b"a", "a")
    assert len(_appends_to(m, "n1")) == 1  # nothing in flight: it leaves at once
    _append(m, b"b", "b")
    _append(m, b"c", "c")
    (first,) = _appends_to(m, "n1")  # b and c wait for its answer
    _answer(m, first, 0)
    (second,) = _appends_to(m, "n1")
    req, was = msg_of(second, PushRequest), msg_of(first, PushRequest)
    assert (req.first_index, req.count) == (was.first_index + 1, 2)


def test_on_a_long_link_pushes_pipeline_as_before() -> None:
    """Pushes answered slower than COALESCE_RTT_MS (a WAN): every new entry leaves at once, up
    to max_inflight_pushes in flight, as without ack clocking."""
    m = _linked(50)
    assert m.node.dispatchers["n1"].srtt_ms > COALESCE_RTT_MS
    for k in range(3):
        _append(m, b"x", f"x{k}")
    assert len(_appends_to(m, "n1")) == 3


def test_a_lost_answer_holds_small_pushes_back_only_briefly() -> None:
    """The answer to the push in flight never comes (a lost message, a request timeout that is
    a second away): the next tick after the oldest push is 2 x COALESCE_RTT_MS old sends the
    held entries anyway. In sync mode the later pushes' answers commit them (their durable
    index), so they must not wait for the lost push's timeout."""
    m = _linked(0)
    _append(m, b"a", "a")
    _append(m, b"b", "b")
    assert len(_appends_to(m, "n1")) == 1  # b held behind a
    m.tick(int(2 * COALESCE_RTT_MS) + 1)
    a, b = (msg_of(s, PushRequest) for s in _appends_to(m, "n1"))
    assert b.first_index == a.first_index + 1


def test_only_a_push_holding_the_end_of_the_log_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A push cut short before the end of the log (a data file's end stops a read) is no small
    push: it leaves at once, pipelined; only the log's tail is clocked by the answers."""
    m = _linked(0)
    _append(m, b"a", "a")
    _append(m, b"b", "b")
    d = m.node.dispatchers["n1"]
    assert d.inflight and d.next_index == m.store.end_index  # b held
    assert d._hold()  # the push of b would carry the log's tail, and leave small
    monkeypatch.setattr(m.store, "tail_bytes", lambda index: None)  # a data file ends first (file store)
    assert not d._hold()  # a push cut short of the end: it leaves
