"""Repairs of rotten records (docs/architecture.md, "Corrupt records"; no rule of the Raft thesis:
its logs never rot, so each rule here keeps one of its invariants, Log Matching, under bit
rot): the follower's EntryHandler overwrites a record of its own that fails verification with
the leader's copy of the same entry, and the leader's EntryDispatcher sends those copies,
never a rotten one of its own. One test per rule, built without a Node from small contexts
(tests/unit/role_fakes.py) over the simulator's disk store (sim.disk.SimDiskStore, which can
flip a byte of a stored record as a damaged sector would); the last test goes through a Node
(tests/unit/raft_harness.py) for the one thing only it does, the corrupt index answers carry."""

from __future__ import annotations

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.dispatcher import EntryDispatcher, State
from dledger.core.effects import BeyondRepair, MarkCorrupt, Pump, Repaired
from dledger.core.handler import EntryHandler
from dledger.core.messages import PushRequest, PushResponse
from dledger.sim.disk import SimDiskStore
from dledger.store.memory import MemoryLedgerStore

from .raft_harness import Member
from .role_fakes import (
    DispatcherEnv,
    HandlerEnv,
    Sent,
    copy_into,
    dispatcher,
    fill,
    handler,
    only_reply,
    others,
    push,
    record,
    records,
)

TERMS = [1, 1, 3, 3, 3]

# --- the follower's side: EntryHandler ------------------------------------------------------------


def _follower(rotten: int) -> tuple[MemoryLedgerStore, SimDiskStore, EntryHandler]:
    """Follower n1 holding the leader's whole log, its record `rotten` damaged."""
    leader = MemoryLedgerStore()
    fill(leader, TERMS)
    store = SimDiskStore()
    copy_into(store, leader, 0, leader.end_index)
    store.corrupt(rotten)
    assert store.verify(rotten) is not None
    return leader, store, handler(HandlerEnv(store))


def _other_history() -> MemoryLedgerStore:
    """Same indexes and terms as the leader's log, other bodies: not the same entries."""
    other = MemoryLedgerStore()
    fill(other, TERMS, b"other")
    return other


def test_a_repair_overwrites_our_rotten_record_with_the_leaders_copy() -> None:
    """A record of ours that fails verification is replaced by the leader's copy of the same
    entry, in place; the answer succeeds and the member learns which records were rewritten."""
    leader, store, h = _follower(2)
    effects = push(h, PushType.REPAIR, 0, 1, data=records(leader, 1, 3), count=3)
    assert only_reply(effects).code == ResponseCode.SUCCESS
    assert others(effects) == [Repaired(1, 3, (2,))]
    assert store.verify(2) is None and record(store, 2) == record(leader, 2)


def test_a_repair_leaves_our_intact_records_alone() -> None:
    """Only records that fail verification are rewritten: an intact one is kept whatever the
    push holds for it (here another history's entry, which the store would refuse)."""
    _, store, h = _follower(2)
    mine = record(store, 1)
    effects = push(h, PushType.REPAIR, 0, 1, data=record(_other_history(), 1), count=1)
    assert only_reply(effects).code == ResponseCode.SUCCESS
    assert others(effects) == [Repaired(1, 1, ())]
    assert record(store, 1) == mine


def test_a_repair_with_another_entry_is_refused_and_writes_nothing() -> None:
    """A rotten record is overwritten only by the same entry (index, term, position, size,
    chain link): a copy of another history is refused, and ours stays as it was."""
    _, store, h = _follower(2)
    rotten = record(store, 2)
    effects = push(h, PushType.REPAIR, 1, 1, data=record(_other_history(), 2), count=1)
    assert only_reply(effects).code != ResponseCode.SUCCESS
    assert others(effects) == [Repaired(2, 1, ())]  # nothing rewritten
    assert record(store, 2) == rotten and store.verify(2) is not None


def test_a_repair_with_no_record_says_the_leaders_log_begins_there() -> None:
    """A leader whose retention deleted what we need sends no record: our rotten record
    below its log begin is beyond repair (and needed by no member)."""
    _, _, h = _follower(1)
    effects = push(h, PushType.REPAIR, 2, 3, count=0)
    assert only_reply(effects).code == ResponseCode.SUCCESS
    assert others(effects) == [BeyondRepair(3)]


# --- the leader's side: EntryDispatcher ----------------------------------------------------------


def _leading(rotten: int = -1) -> tuple[DispatcherEnv, EntryDispatcher]:
    """Leader n0 of term 3 with the log TERMS, all committed; its record `rotten` damaged."""
    store = SimDiskStore()
    fill(store, TERMS)
    store.sync_all()
    store.set_committed(store.end_index)
    if rotten >= 0:
        store.corrupt(rotten)
    env = DispatcherEnv(store)
    return env, dispatcher(env)


def _answer(d: EntryDispatcher, s: Sent, code: ResponseCode, end_index: int, corrupt_index: int = -1,
            bad_index: int = -1, reason: str = "") -> None:
    d.on_response(s.ctx, PushResponse(int(code), 3, end_index, corrupt_index=corrupt_index, bad_index=bad_index,
                                      reason=reason))


def _one(env: DispatcherEnv, kind: PushType) -> tuple[Sent, PushRequest]:
    sent = [s for s in env.take() if isinstance(s.msg, PushRequest) and s.msg.type == kind]
    assert len(sent) == 1, sent
    assert isinstance(sent[0].msg, PushRequest)
    return sent[0], sent[0].msg


def test_a_follower_reporting_a_corrupt_record_gets_our_copies_in_a_repair() -> None:
    """A follower's answer naming its first corrupt record makes the leader send its own
    copies from there (REPAIR), beside replication."""
    env, d = _leading()
    d.pump()
    s, _ = _one(env, PushType.COMPARE)
    _answer(d, s, ResponseCode.SUCCESS, end_index=4, corrupt_index=2)
    assert Pump() in d.take_effects()
    d.pump()
    s, req = _one(env, PushType.REPAIR)
    assert (req.first_index, req.count) == (2, 3)
    assert bytes(s.data) == records(env.store, 2, 4)


def test_a_repair_never_sends_a_rotten_copy_of_ours_and_marks_it_corrupt() -> None:
    """Our copies are verified before they are sent: the repair stops before a rotten one of
    ours, which makes us corrupt (a leader with a rotten record hands leadership over)."""
    env, d = _leading(rotten=3)
    d.pump()
    s, _ = _one(env, PushType.COMPARE)
    _answer(d, s, ResponseCode.SUCCESS, end_index=4, corrupt_index=2)
    d.pump()
    s, req = _one(env, PushType.REPAIR)
    assert (req.first_index, req.count) == (2, 1)  # record 2 only
    assert bytes(s.data) == record(env.store, 2)
    assert [i for i, _ in env.marked] == [3]


def _appending(env: DispatcherEnv, d: EntryDispatcher) -> Sent:
    """Matched at 3 (the first COMPARE, below our end): the APPEND of 4 in flight."""
    d.pump()
    s, _ = _one(env, PushType.COMPARE)
    _answer(d, s, ResponseCode.SUCCESS, end_index=3)
    d.pump()
    s, req = _one(env, PushType.APPEND)
    assert (req.first_index, req.count) == (4, 1)
    d.take_effects()
    return s


def test_a_pushed_record_the_follower_rejects_and_ours_fails_verification_makes_us_corrupt() -> None:
    """A follower that finds a pushed record damaged names it; if our own copy fails
    verification too, we are corrupt (never a retry loop of a rotten record)."""
    env, d = _leading(rotten=4)
    s = _appending(env, d)
    _answer(d, s, ResponseCode.INCONSISTENT_STATE, end_index=3, bad_index=4, reason="body crc mismatch")
    effects = d.take_effects()
    assert [type(e) for e in effects] == [MarkCorrupt, Pump]
    assert isinstance(effects[0], MarkCorrupt) and effects[0].index == 4
    assert d.state == State.COMPARE


def test_a_rejected_record_that_verifies_here_is_retried_later_and_not_marked() -> None:
    """A record the follower rejects but that verifies here (a fault on its side, or in
    transit) leaves us healthy; it is pushed again after a heartbeat interval, not at once."""
    env, d = _leading()
    s = _appending(env, d)
    _answer(d, s, ResponseCode.INCONSISTENT_STATE, end_index=3, bad_index=4, reason="body crc mismatch")
    assert d.take_effects() == [Pump()]
    d.pump()
    assert env.take() == []  # paused
    env.now += env.cfg.heart_beat_time_interval_ms
    d.pump()
    _one(env, PushType.COMPARE)


# --- the member: what only the Node does with the handler's answers --------------------------------


def _push_to(m: Member, kind: PushType, prev_index: int, prev_term: int, next_term: int = -1) -> PushResponse:
    req = PushRequest(leader_id="n0", remote_id="n1", term=3, type=int(kind), prev_index=prev_index,
                      prev_term=prev_term, first_index=prev_index + 1, next_term=next_term)
    resp = m.handle(RequestCode.PUSH, req, token=("push", kind))
    assert isinstance(resp, PushResponse)
    return resp


def test_every_answer_names_our_first_corrupt_record_as_it_stands_after_the_push() -> None:
    """A member with a rotten record says so in every answer, so the leader repairs it; a
    truncate that removed that record clears it before the answer is built (the node fills
    the answer's corrupt_index when it applies the handler's effects, in their order)."""
    m = Member(self_id="n1", terms=[1, 1, 2, 2])
    m.node.mark_corrupt(3, "rot")
    assert _push_to(m, PushType.COMMIT, -1, -1).corrupt_index == 3
    resp = _push_to(m, PushType.TRUNCATE, 1, 1, next_term=3)  # the leader of term 3 differs after 1
    assert resp.code == ResponseCode.SUCCESS and m.store.end_index == 1
    assert resp.corrupt_index == -1 and m.node.corrupt is None
