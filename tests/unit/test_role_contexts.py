"""The core's role classes against the Raft thesis, one test per rule, each built WITHOUT a
Node from a small hand-written context implementing the class's own Protocol
(core.elector.ElectorContext, core.handler.HandlerContext, core.dispatcher.DispatcherContext):
a real MemberState, a real MemoryLedgerStore, a real DLedgerConfig and an outbox. mypy checks
each fake against its Protocol (the constructors take the Protocol type)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import msgspec

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import PushCtx
from dledger.core.dispatcher import DispatcherContext, EntryDispatcher, State
from dledger.core.effects import MarkCorrupt, PushReply
from dledger.core.elector import ElectorContext, LeaderElector
from dledger.core.handler import EntryHandler, HandlerContext
from dledger.core.member_state import MemberState
from dledger.core.messages import PushRequest, PushResponse, Role, VoteRequest, VoteResponse, VoteResult
from dledger.core.progress import Progress
from dledger.entry import MAGIC_NORMAL
from dledger.statemachine.applier import Applier
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.base import StoreError
from dledger.store.memory import MemoryLedgerStore

from .role_fakes import Advances, Follows, NoInstall, TermsSeen

PEERS = "n0-127.0.0.1:20000;n1-127.0.0.1:20001;n2-127.0.0.1:20002"


def _cfg(self_id: str) -> DLedgerConfig:
    return DLedgerConfig(self_id=self_id, peers=PEERS, store_type="memory")


def _store(cfg: DLedgerConfig, terms: list[int]) -> MemoryLedgerStore:
    """A log whose entry i has term terms[i] (written as a leader would)."""
    store = MemoryLedgerStore(cfg.max_body_bytes)
    for i, t in enumerate(terms):
        store.append_as_leader([b"e%d" % i], t, MAGIC_NORMAL)
    return store


@dataclass
class Reply:
    token: Any
    code: int
    msg: msgspec.Struct


# --- LeaderElector --------------------------------------------------------------------------


class NoNotes:
    """Dispatcher, handler and read-round notes the vote rules never reach."""

    def lost_match(self, end: int, matched: int) -> None: ...
    def note_durable(self, durable: int) -> None: ...
    def note_corrupt(self, index: int) -> None: ...
    def note_apply_needs(self, index: int) -> None: ...
    def update_commit(self, leader_commit: int) -> None: ...
    def durable_match(self) -> int:
        return -1
    def next_round(self) -> int:
        return 0
    def on_ack(self, peer: str, round_: int) -> None: ...
    def end_leases(self) -> None: ...


class ElectorEnv:
    """Voter n1 of three, at term 3, with a log of terms [1, 1, 2] (end index 2, end term 2)."""

    def __init__(self) -> None:
        self.cfg = _cfg("n1")
        self.now = 0
        self.rng = random.Random(7)
        self.store = _store(self.cfg, [1, 1, 2])
        self.member = MemberState(self.cfg.group, "n1", list(self.cfg.peer_map), self.store)
        self.member.set_term(3)
        self.progress = {p: Progress(p) for p in self.member.others}
        notes = NoNotes()
        self.dispatchers = {p: notes for p in self.member.others}
        self.handler = notes
        self.reads = notes
        self.corrupt: tuple[int, str] | None = None
        self.corrupt_index = -1
        self.outbox: list[tuple[str, int, msgspec.Struct]] = []
        self.replies: list[Reply] = []
        self.roles: list[str] = []  # role changes asked of the member, in order

    def unfit_to_lead(self) -> str:
        return ""
    def full(self) -> StoreError | None:
        return None
    def apply_needs(self) -> int:
        return -1
    def retention_floor(self) -> tuple[int, str]:
        return -1, ""
    def follow_retention_floor(self, floor: int, holder: str) -> None: ...
    def store_failed(self, e: StoreError) -> None: ...

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Any, data: bytes | memoryview = b"",
             timeout_ms: int | None = None) -> None:
        self.outbox.append((peer, code, msg))

    def reply(self, token: Any, code: int, msg: msgspec.Struct) -> None:
        self.replies.append(Reply(token, code, msg))

    # the role changes, as Node._change_role makes them (what the elector relies on)
    def become_candidate(self) -> None:
        self.roles.append("candidate")
        self.member.role = Role.CANDIDATE
    def become_leader(self) -> bool:
        self.roles.append("leader")
        self.member.role = Role.LEADER
        self.member.leader_id = self.member.self_id
        return True
    def follow(self, leader_id: str) -> None:
        self.roles.append("follow " + leader_id)
        self.member.role = Role.FOLLOWER
        self.member.leader_id = leader_id
    def step_down(self, reason: str) -> None:
        self.roles.append("step down")
        self.member.role = Role.FOLLOWER
        self.member.leader_id = None


def _elector(env: ElectorContext) -> LeaderElector:
    return LeaderElector(env)


def _voter() -> tuple[ElectorEnv, LeaderElector]:
    env = ElectorEnv()
    e = _elector(env)
    env.now = e.no_vote_until  # past the restart's lease: it votes
    return env, e


def _vote(env: ElectorEnv, e: LeaderElector, candidate: str, term: int, end_index: int = 2, end_term: int = 2,
          pre_vote: bool = False) -> VoteResponse:
    e.handle_vote(VoteRequest(leader_id=candidate, remote_id="n1", term=term, ledger_end_index=end_index,
                              ledger_end_term=end_term, pre_vote=pre_vote), candidate)
    resp = env.replies[-1].msg
    assert env.replies[-1].code == RequestCode.VOTE and isinstance(resp, VoteResponse)
    return resp


def test_a_member_grants_one_vote_per_term() -> None:
    """§3.4: each member votes for at most one candidate in a term (first come, first served);
    asking again, the same candidate gets the same answer."""
    env, e = _voter()
    assert _vote(env, e, "n0", 3).result == VoteResult.ACCEPT
    assert env.member.voted_for == "n0"
    assert env.store.load_term() == (3, "n0")  # persisted before it is granted
    assert _vote(env, e, "n2", 3).result == VoteResult.REJECT_ALREADY_VOTED
    assert _vote(env, e, "n0", 3).result == VoteResult.ACCEPT
    assert env.member.voted_for == "n0"


def test_a_vote_of_an_older_term_is_refused() -> None:
    """§3.3: a request with a stale term is rejected, and the answer carries our term."""
    env, e = _voter()
    resp = _vote(env, e, "n0", 2)
    assert resp.result == VoteResult.REJECT_EXPIRED_VOTE_TERM and resp.term == 3
    assert env.member.voted_for is None


def test_a_candidate_whose_last_term_is_older_is_refused() -> None:
    """§3.6.1: the log with the later last term is more up to date, whatever its length."""
    env, e = _voter()
    assert _vote(env, e, "n0", 4, end_index=9, end_term=1).result == VoteResult.REJECT_EXPIRED_LEDGER_TERM
    assert env.member.voted_for is None


def test_a_candidate_with_the_same_last_term_but_a_shorter_log_is_refused() -> None:
    """§3.6.1: with equal last terms, the longer log is more up to date."""
    env, e = _voter()
    assert _vote(env, e, "n0", 4, end_index=1, end_term=2).result == VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert env.member.voted_for is None


def test_a_candidate_at_least_as_up_to_date_gets_the_vote() -> None:
    """§3.6.1: the same last entry, or a later last term with a shorter log, is up to date."""
    env, e = _voter()
    assert _vote(env, e, "n0", 4, end_index=2, end_term=2).result == VoteResult.ACCEPT
    env2, e2 = _voter()
    assert _vote(env2, e2, "n2", 4, end_index=0, end_term=3).result == VoteResult.ACCEPT


def test_a_higher_term_in_a_vote_request_clears_the_vote_and_ends_a_candidacy() -> None:
    """§3.3: a member seeing a higher term adopts it and becomes a follower; the vote it cast
    in the older term does not carry over (§3.4), so it may vote again."""
    env, e = _voter()
    assert _vote(env, e, "n0", 3).result == VoteResult.ACCEPT
    env.member.role = Role.CANDIDATE
    resp = _vote(env, e, "n2", 4)
    assert resp.term == 4 and resp.result == VoteResult.ACCEPT
    assert env.roles == ["step down"] and env.member.role == Role.FOLLOWER
    assert (env.member.term, env.member.voted_for) == (4, "n2")


def test_a_refused_vote_of_a_higher_term_still_adopts_the_term_and_clears_the_vote() -> None:
    env, e = _voter()
    assert _vote(env, e, "n0", 3).result == VoteResult.ACCEPT
    assert _vote(env, e, "n2", 5, end_index=0, end_term=1).result == VoteResult.REJECT_EXPIRED_LEDGER_TERM
    assert (env.member.term, env.member.voted_for) == (5, None)
    assert env.store.load_term() == (5, None)


def test_a_pre_vote_changes_neither_term_nor_vote() -> None:
    """§9.6: a pre-vote only asks whether the candidate could win."""
    env, e = _voter()
    assert _vote(env, e, "n0", 7, pre_vote=True).result == VoteResult.ACCEPT
    assert (env.member.term, env.member.voted_for) == (3, None)


def test_a_member_hearing_a_live_leader_refuses_a_vote() -> None:
    """§4.2.3: a member that hears from its leader within the election timeout disregards
    vote requests (a removed or partitioned member cannot disrupt the group)."""
    env, e = _voter()
    assert e.accept_leader(3, "n0") is None
    assert env.member.leader_id == "n0"
    assert _vote(env, e, "n2", 4).result == VoteResult.REJECT_ALREADY_HAS_LEADER
    assert (env.member.term, env.member.voted_for) == (3, None)


def test_a_higher_term_from_a_leader_makes_the_member_follow_it() -> None:
    """§3.3: a candidate (or a stale leader) that hears a leader of a higher term becomes its
    follower, adopting the term with no vote cast."""
    env, e = _voter()
    env.member.role = Role.CANDIDATE
    assert e.accept_leader(5, "n2") is None
    assert env.member.role == Role.FOLLOWER and env.member.leader_id == "n2"
    assert (env.member.term, env.member.voted_for) == (5, None)


def test_a_leader_of_an_older_term_is_refused() -> None:
    """§3.3: a request of an older term is rejected; nothing changes."""
    env, e = _voter()
    assert e.accept_leader(2, "n0") == ResponseCode.EXPIRED_TERM
    assert env.member.leader_id is None and env.member.term == 3


def test_a_leader_that_sees_a_higher_term_in_an_answer_steps_down() -> None:
    """§3.3: a leader learning of a higher term from a response reverts to follower."""
    env, e = _voter()
    env.member.role = Role.LEADER
    assert not e.observe_term(3)
    assert env.roles == []
    assert e.observe_term(6)
    assert env.roles == ["step down"] and env.member.role == Role.FOLLOWER
    assert (env.member.term, env.member.voted_for) == (6, None)


# --- EntryHandler ---------------------------------------------------------------------------


class HandlerEnv:
    """Follower n1 of three whose log holds the terms given; its leader n0 is at term 3. Its
    answers come back as effects of the handler (core.effects.PushReply), not through here."""

    def __init__(self, leader: MemoryLedgerStore, shared: int, own_terms: list[int]) -> None:
        self.cfg = _cfg("n1")
        self.now = 0
        self.store = MemoryLedgerStore(self.cfg.max_body_bytes)
        if shared:  # the leader's first `shared` records, byte for byte
            self.store.append_as_follower(leader.read_raw(0, 1 << 20).data[: _bytes_upto(leader, shared)])
        for t in own_terms:  # then entries the leader does not have (an old leader's)
            self.store.append_as_leader([b"stale"], t, MAGIC_NORMAL)
        self.member = MemberState(self.cfg.group, "n1", list(self.cfg.peer_map), self.store)
        self.member.set_term(2)
        self.elector = Follows(self.member)
        self.receiver = NoInstall()

    def log_appended(self, first: int, last: int) -> None: ...
    def log_truncated(self, end: int) -> None: ...


def _bytes_upto(store: MemoryLedgerStore, count: int) -> int:
    """Byte length of the store's first `count` records."""
    return len(store.read_raw(0, 1 << 20).data) - len(store.read_raw(count, 1 << 20).data)


def _handler(env: HandlerContext) -> EntryHandler:
    return EntryHandler(env)


LEADER_TERMS = [1, 1, 3, 3]  # n0's log at term 3


def _follower(shared: int, own_terms: list[int]) -> tuple[MemoryLedgerStore, HandlerEnv, EntryHandler]:
    leader = _store(_cfg("n0"), LEADER_TERMS)
    env = HandlerEnv(leader, shared, own_terms)
    return leader, env, _handler(env)


def _push(env: HandlerEnv, h: EntryHandler, kind: PushType, prev_index: int, prev_term: int, committed: int = -1,
          data: bytes | memoryview = b"", count: int = 0, next_term: int = -1) -> PushResponse:
    req = PushRequest(leader_id="n0", remote_id="n1", term=3, type=int(kind), prev_index=prev_index,
                      prev_term=prev_term, first_index=prev_index + 1, count=count, committed_index=committed,
                      next_term=next_term)
    h.handle_push(req, data, "tok")
    effects = h.take_effects()
    assert not any(isinstance(e, MarkCorrupt) for e in effects), effects  # nothing here is corrupt
    r = effects[-1]
    assert isinstance(r, PushReply) and r.token == "tok"
    return r.resp


def _append(leader: MemoryLedgerStore, env: HandlerEnv, h: EntryHandler, first: int, committed: int = -1
            ) -> PushResponse:
    """An APPEND of the leader's entries from `first` to its end."""
    raw = leader.read_raw(first, 1 << 20)
    return _push(env, h, PushType.APPEND, first - 1, leader.term_at(first - 1) if first > 0 else -1, committed,
                 raw.data, raw.count)


def test_a_compare_whose_prev_entry_differs_is_refused_with_the_conflicting_term() -> None:
    """§3.5 consistency check: the follower refuses unless it holds an entry at prev_index
    with prev_term; the answer names the conflicting term and its first index, so the
    leader skips the whole term in one step (§3.5's optimisation)."""
    _, env, h = _follower(2, [2, 2])  # [1, 1, 2, 2]
    resp = _push(env, h, PushType.COMPARE, 3, 3)
    assert resp.code == ResponseCode.INCONSISTENT_STATE
    assert (resp.x_index, resp.x_term) == (2, 2)
    resp = _push(env, h, PushType.COMPARE, 7, 3)  # beyond our log
    assert resp.code == ResponseCode.INCONSISTENT_STATE and resp.end_index == 3
    assert _push(env, h, PushType.COMPARE, 1, 1).code == ResponseCode.SUCCESS


def test_an_append_whose_prev_entry_differs_is_refused_and_stores_nothing() -> None:
    """§3.5: entries are accepted only on top of a matching prev entry."""
    leader, env, h = _follower(2, [2])  # [1, 1, 2]: index 2 differs from the leader's
    resp = _append(leader, env, h, 3)
    assert resp.code == ResponseCode.INCONSISTENT_STATE
    assert env.store.end_index == 2 and env.store.term_at(2) == 2


def test_an_append_on_a_matching_prev_entry_is_stored() -> None:
    leader, env, h = _follower(2, [])
    resp = _append(leader, env, h, 2)
    assert resp.code == ResponseCode.SUCCESS and resp.end_index == 3
    assert [env.store.term_at(i) for i in range(4)] == LEADER_TERMS


def test_a_truncate_drops_the_conflicting_suffix_and_keeps_the_matching_prefix() -> None:
    """§3.5: a conflicting entry and all that follow it are deleted; the leader's entries
    then take their place."""
    leader, env, h = _follower(2, [2, 2, 2])  # [1, 1, 2, 2, 2]
    resp = _push(env, h, PushType.TRUNCATE, 1, 1, next_term=3)
    assert resp.code == ResponseCode.SUCCESS and resp.end_index == 1
    assert [env.store.term_at(i) for i in range(2)] == [1, 1]
    assert _append(leader, env, h, 2).code == ResponseCode.SUCCESS
    assert [env.store.term_at(i) for i in range(4)] == LEADER_TERMS


def test_a_truncate_whose_prev_entry_differs_is_refused() -> None:
    _, env, h = _follower(2, [2, 2])  # [1, 1, 2, 2]
    assert _push(env, h, PushType.TRUNCATE, 2, 3).code == ResponseCode.INCONSISTENT_STATE
    assert env.store.end_index == 3


def test_an_older_leader_is_refused_and_our_term_is_answered() -> None:
    """§3.3: a push of an older term is rejected; the answer lets the old leader step down."""
    leader, env, h = _follower(2, [])
    env.member.set_term(4)
    raw = leader.read_raw(2, 1 << 20)
    resp = _push(env, h, PushType.APPEND, 1, 1, data=raw.data, count=raw.count)
    assert resp.code == ResponseCode.EXPIRED_TERM and resp.term == 4
    assert env.store.end_index == 1


def test_the_commit_index_never_passes_what_matched_the_leader() -> None:
    """§3.5: a follower commits min(leaderCommit, index of its last entry known to match the
    leader); a stale entry past the match is never committed, whatever the leader says."""
    _, env, h = _follower(2, [2])  # [1, 1, 2]: index 2 is not the leader's
    assert _push(env, h, PushType.COMMIT, -1, -1, committed=3).code == ResponseCode.SUCCESS
    assert env.store.committed_index == -1  # nothing matched yet
    assert _push(env, h, PushType.COMPARE, 1, 1, committed=3).code == ResponseCode.SUCCESS
    assert env.store.committed_index == 1  # not 2: that entry differs from the leader's
    assert _push(env, h, PushType.COMMIT, -1, -1, committed=3).code == ResponseCode.SUCCESS
    assert env.store.committed_index == 1


def test_the_commit_index_follows_the_leader_up_to_the_appended_entries() -> None:
    leader, env, h = _follower(2, [])
    assert _append(leader, env, h, 2, committed=2).code == ResponseCode.SUCCESS
    assert env.store.committed_index == 2  # the leader's, below our matched end 3
    assert _push(env, h, PushType.COMMIT, -1, -1, committed=9).code == ResponseCode.SUCCESS
    assert env.store.committed_index == 3  # our matched end, not the leader's 9


# --- EntryDispatcher ------------------------------------------------------------------------


@dataclass
class Push:
    peer: str
    code: int
    req: PushRequest
    ctx: PushCtx
    data: bytes | memoryview


class DispatcherEnv:
    """Leader n0 of three at term 3, log of terms [1, 1, 3, 3]; no snapshot to send."""

    def __init__(self) -> None:
        self.cfg = _cfg("n0")
        self.now = 0
        self.store = _store(self.cfg, LEADER_TERMS)
        self.member = MemberState(self.cfg.group, "n0", list(self.cfg.peer_map), self.store)
        self.member.set_term(3)
        self.member.role = Role.LEADER
        self.member.leader_id = "n0"
        self.progress = {p: Progress(p) for p in self.member.others}
        self.elector = TermsSeen(self.member)
        self.quorum = Advances()
        self.applier: Applier | None = None
        self.snapshot_meta: SnapshotMeta | None = None
        self.install_bytes_sent = 0
        self.installs_sent = 0
        self.outbox: list[Push] = []

    def snapshot_to_send(self) -> SnapshotMeta | None:
        return None
    def want_snapshot(self) -> None: ...
    def read_chunk(self, peer: str, meta: SnapshotMeta, offset: int, max_bytes: int, ctx: Any) -> None:
        raise AssertionError("no snapshot here")
    def mark_corrupt(self, index: int, reason: str) -> None:
        raise AssertionError(f"no record here is corrupt ({index}: {reason})")
    def is_beyond_repair(self, index: int) -> bool:
        return False

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Any, data: bytes | memoryview = b"",
             timeout_ms: int | None = None) -> None:
        assert isinstance(msg, PushRequest) and isinstance(ctx, PushCtx)
        self.outbox.append(Push(peer, code, msg, ctx, data))


def _dispatcher(env: DispatcherContext, peer: str = "n1") -> EntryDispatcher:
    return EntryDispatcher(env, peer)


def _leading() -> tuple[DispatcherEnv, EntryDispatcher]:
    env = DispatcherEnv()
    return env, _dispatcher(env)


def _sent(env: DispatcherEnv) -> Push:
    """The one push the last pump sent."""
    assert len(env.outbox) == 1, env.outbox
    return env.outbox.pop()


def _state(d: EntryDispatcher) -> State:
    """(a call, so mypy does not narrow the state across the answers that change it)"""
    return d.state


def _answer(d: EntryDispatcher, push: Push, code: ResponseCode, end_index: int, term: int = 3, x_index: int = -1,
            x_term: int = -1) -> None:
    d.on_response(push.ctx, PushResponse(int(code), term, end_index, x_index, x_term))


def test_a_new_follower_is_first_probed_with_compare_below_the_leaders_end() -> None:
    """§3.5: a new leader does not know the follower's log; it first finds the latest entry
    where the two agree (nextIndex starts just past its own log, the COMPARE probes there)."""
    env, d = _leading()
    assert d.state == State.COMPARE
    d.pump()
    p = _sent(env)
    assert (p.peer, p.code) == ("n1", RequestCode.PUSH)
    assert p.req.type == PushType.COMPARE and (p.req.prev_index, p.req.prev_term) == (2, 3)
    assert (p.req.term, p.req.leader_id, p.req.remote_id) == (3, "n0", "n1")
    d.pump()
    assert not env.outbox  # one COMPARE in flight at a time


def test_a_match_moves_to_append_from_the_entry_after_it() -> None:
    """§3.5: once the logs agree at an index, the leader sends its entries from the next one,
    and what matched counts toward the commit (matchIndex)."""
    env, d = _leading()
    d.pump()
    _answer(d, _sent(env), ResponseCode.SUCCESS, end_index=2)
    assert d.state == State.APPEND and d.next_index == 3
    assert env.progress["n1"].match_index == 2 and env.quorum.calls == 1
    d.pump()
    p = _sent(env)
    assert p.req.type == PushType.APPEND and (p.req.prev_index, p.req.prev_term) == (2, 3)
    assert (p.req.first_index, p.req.count) == (3, 1)
    assert bytes(p.data) == bytes(env.store.read_raw(3, 1 << 20).data)


def test_an_acknowledged_append_raises_the_match_index() -> None:
    env, d = _leading()
    d.pump()
    _answer(d, _sent(env), ResponseCode.SUCCESS, end_index=2)
    d.pump()
    _answer(d, _sent(env), ResponseCode.SUCCESS, end_index=3)
    assert env.progress["n1"].match_index == 3 and d.next_index == 4
    assert env.quorum.calls == 2


def test_a_mismatch_skips_the_followers_conflicting_term() -> None:
    """§3.5: on a refusal the leader backs up; with the follower's conflicting term and its
    first index it skips that whole term at once instead of one entry per round trip."""
    env, d = _leading()
    d.pump()
    # the follower holds [1, 1, 2, 2]: index 2 has term 2, which starts there
    _answer(d, _sent(env), ResponseCode.INCONSISTENT_STATE, end_index=3, x_index=2, x_term=2)
    assert d.state == State.COMPARE and env.progress["n1"].match_index == -1
    d.pump()
    p = _sent(env)
    assert p.req.type == PushType.COMPARE and (p.req.prev_index, p.req.prev_term) == (1, 1)


def test_a_follower_with_a_conflicting_suffix_is_truncated_then_appended() -> None:
    """§3.5: entries of the follower after the last agreeing index are removed (TRUNCATE),
    then the leader's are sent from there."""
    env, d = _leading()
    d.pump()
    _answer(d, _sent(env), ResponseCode.INCONSISTENT_STATE, end_index=3, x_index=2, x_term=2)
    d.pump()
    _answer(d, _sent(env), ResponseCode.SUCCESS, end_index=3)  # it agrees at 1; maybe more above
    d.pump()
    _answer(d, _sent(env), ResponseCode.INCONSISTENT_STATE, end_index=3, x_index=2, x_term=2)
    assert d.state == State.TRUNCATE
    d.pump()
    p = _sent(env)
    assert p.req.type == PushType.TRUNCATE and (p.req.prev_index, p.req.prev_term) == (1, 1)
    _answer(d, p, ResponseCode.SUCCESS, end_index=1)
    assert _state(d) == State.APPEND and d.next_index == 2
    d.pump()
    p = _sent(env)
    assert p.req.type == PushType.APPEND and (p.req.first_index, p.req.count) == (2, 2)


def test_a_refused_append_goes_back_to_compare() -> None:
    """§3.5: a failed consistency check on an append makes the leader search again."""
    env, d = _leading()
    d.pump()
    _answer(d, _sent(env), ResponseCode.SUCCESS, end_index=2)
    d.pump()
    _answer(d, _sent(env), ResponseCode.INCONSISTENT_STATE, end_index=1)
    assert d.state == State.COMPARE
    assert env.progress["n1"].match_index == 2  # what matched in this term stays matched


def test_an_answer_of_a_higher_term_ends_the_leadership_and_changes_nothing_else() -> None:
    """§3.3: a leader learning of a higher term steps down; the answer is not used."""
    env, d = _leading()
    d.pump()
    _answer(d, _sent(env), ResponseCode.SUCCESS, end_index=2, term=4)
    assert env.elector.seen == [4] and not env.member.is_leader
    assert d.state == State.COMPARE and env.progress["n1"].match_index == -1
    d.pump()
    assert not env.outbox  # a follower sends no pushes


def test_an_answer_to_a_push_before_a_reset_is_ignored() -> None:
    """An answer to a push of an older window (epoch) must not move the follower's state."""
    env, d = _leading()
    d.pump()
    old = _sent(env)
    d.reset(2, "test")
    _answer(d, old, ResponseCode.SUCCESS, end_index=2)
    assert d.state == State.COMPARE and env.progress["n1"].match_index == -1
