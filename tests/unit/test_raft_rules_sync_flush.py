"""EntryHandler in `flush=sync` mode against the Raft thesis (§3.8: a member persists what it
acknowledges before answering), one test per rule; built without a Node from a small
HandlerContext (tests/unit/role_fakes.py) over the simulator's disk store (sim.disk.SimDiskStore:
a memory store whose appends are durable only once a flush, which the test completes, covers
them). Answers are the handler's effects (core.effects.PushReply)."""

from __future__ import annotations

from dledger.codes import PushType, ResponseCode
from dledger.core.effects import Effect, ForgetCorruptAbove
from dledger.core.handler import EntryHandler
from dledger.sim.disk import SimDiskStore
from dledger.store.memory import MemoryLedgerStore

from .role_fakes import HandlerEnv, copy_into, fill, handler, only_reply, others, push, records, replies

LEADER_TERMS = [1, 1, 3, 3]  # n0's log at term 3


def _follower(shared: int, synced: bool = True, own: list[int] | None = None
              ) -> tuple[MemoryLedgerStore, SimDiskStore, EntryHandler]:
    """Follower n1 holding the leader's first `shared` records (then `own` entries of an old
    leader), fsynced if `synced`; flush=sync."""
    leader = MemoryLedgerStore()
    fill(leader, LEADER_TERMS)
    store = SimDiskStore()
    if shared:
        copy_into(store, leader, 0, shared - 1)
    fill(store, own or [], b"stale")
    if synced:
        store.sync_all()
    return leader, store, handler(HandlerEnv(store, flush="sync"))


def _append(h: EntryHandler, leader: MemoryLedgerStore, first: int, last: int, token: str = "tok"
            ) -> list[Effect]:
    return list(push(h, PushType.APPEND, first - 1, leader.term_at(first - 1), data=records(leader, first, last),
                     count=last - first + 1, token=token))


def test_an_append_is_answered_only_once_its_entries_are_durable() -> None:
    """§3.8: a follower acknowledges entries only once they are on stable storage; the
    APPEND's answer waits for the flush it asks for."""
    leader, store, h = _follower(2)
    effects = _append(h, leader, 2, 3)
    assert store.end_index == 3 and replies(effects) == []  # held
    assert store.flushing  # it asked the disk for a flush
    h.on_durable(store.complete_flush())
    resp = only_reply(h.take_effects())
    assert resp.code == ResponseCode.SUCCESS and resp.end_index == 3 and resp.durable_index == 3


def test_each_held_answer_waits_for_the_flush_that_covers_its_entries() -> None:
    """§3.8: a flush that started before an append does not make it durable: the second
    APPEND is answered after the next flush, and each answer reports the fsynced prefix
    known equal to the leader's log, min(durable, matched)."""
    leader, store, h = _follower(2)
    assert replies(_append(h, leader, 2, 2, token="a")) == []  # a flush starts, covering entry 2
    assert replies(_append(h, leader, 3, 3, token="b")) == []  # written while it runs
    h.on_durable(store.complete_flush())  # covers 2; the next flush (for 3) starts
    resp = only_reply(h.take_effects(), "a")
    assert resp.code == ResponseCode.SUCCESS and resp.durable_index == 2 and resp.end_index == 3
    h.on_durable(store.complete_flush())
    resp = only_reply(h.take_effects(), "b")
    assert resp.code == ResponseCode.SUCCESS and resp.durable_index == 3


def test_the_durable_index_answered_is_the_fsynced_prefix_equal_to_the_leaders_log() -> None:
    """§3.5 with §3.8: what counts toward the commit in sync mode is what is both on our disk
    and known to match the leader; a fsynced entry of an old leader past the match is not."""
    _, store, h = _follower(2, own=[2])  # [1, 1, 2(stale)], all fsynced
    assert store.durable_index == 2
    resp = only_reply(push(h, PushType.COMMIT, -1, -1))
    assert resp.code == ResponseCode.SUCCESS and resp.durable_index == -1  # nothing matched yet
    resp = only_reply(push(h, PushType.COMPARE, 1, 1))
    assert resp.code == ResponseCode.SUCCESS and resp.durable_index == 1  # not 2: entry 2 differs


def test_a_truncate_fails_held_answers_for_the_entries_it_removes() -> None:
    """§3.5: entries a truncate removes were never stored for good; an answer held for them
    must not say SUCCESS later (the leader would count them). Answers for entries below the
    truncate point stay held until their flush."""
    old = MemoryLedgerStore()  # an old leader n2 of term 2: [1, 1, 2, 2, 2]
    fill(old, [1, 1, 2, 2, 2])
    new = MemoryLedgerStore()  # the leader n0 of term 3 shares 0..2 with it: [1, 1, 2, 3]
    copy_into(new, old, 0, 2)
    fill(new, [3])
    store = SimDiskStore()
    copy_into(store, old, 0, 1)
    store.sync_all()
    h = handler(HandlerEnv(store, flush="sync"))
    assert replies(push(h, PushType.APPEND, 1, 1, term=2, leader="n2", data=records(old, 2, 2), count=1,
                        token="a")) == []
    assert replies(push(h, PushType.APPEND, 2, 2, term=2, leader="n2", data=records(old, 3, 4), count=2,
                        token="b")) == []
    effects = push(h, PushType.TRUNCATE, 2, 2, next_term=3, token="t")  # n0: entries after 2 differ
    assert store.end_index == 2
    assert [(t, r.code) for t, r in replies(effects)] == [("b", ResponseCode.INCONSISTENT_STATE),
                                                          ("t", ResponseCode.SUCCESS)]
    assert others(effects) == [ForgetCorruptAbove(2)]
    h.on_durable(store.complete_flush())
    assert [(t, r.code) for t, r in replies(h.take_effects())] == [("a", ResponseCode.SUCCESS)]  # b: not again


def test_a_compare_that_matches_asks_for_a_flush() -> None:
    """§3.8: a match found by COMPARE counts only once durable, so it asks for the flush that
    makes it so; later answers report it."""
    _, store, h = _follower(4, synced=False)  # the leader's whole log, not fsynced yet
    resp = only_reply(push(h, PushType.COMPARE, 3, 3))
    assert resp.code == ResponseCode.SUCCESS and resp.durable_index == -1
    assert store.flushing
    h.on_durable(store.complete_flush())
    assert only_reply(push(h, PushType.COMMIT, -1, -1)).durable_index == 3


def test_a_retried_append_of_entries_held_asks_for_a_flush() -> None:
    """§3.8: a retried APPEND whose entries we hold already is answered at once (its durable
    index says what is on disk) and asks for the flush that makes them durable."""
    leader, store, h = _follower(4, synced=False)
    resp = only_reply(_append(h, leader, 2, 3))
    assert resp.code == ResponseCode.SUCCESS and resp.durable_index == -1
    assert store.flushing
    h.on_durable(store.complete_flush())
    assert only_reply(push(h, PushType.COMMIT, -1, -1)).durable_index == 3
