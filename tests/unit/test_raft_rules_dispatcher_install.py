"""EntryDispatcher's snapshot path against the Raft thesis (§5.4.1, Raft paper §7: a follower
whose next entry the leader's log no longer holds gets the leader's snapshot instead, and is
matched past it afterwards), one test per rule; built without a Node from a small
DispatcherContext (tests/unit/role_fakes.py) around a real memory store."""

from __future__ import annotations

import zlib

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.contexts import InstallCtx
from dledger.core.dispatcher import EntryDispatcher, State
from dledger.core.effects import Pump
from dledger.core.messages import InstallSnapshotRequest, InstallSnapshotResponse, PushRequest, PushResponse
from dledger.statemachine.snapshot import FileInfo, SnapshotMeta

from .role_fakes import PEERS, DispatcherEnv, Sent, dispatcher, leader_store, records

BEGIN = 4  # the leader's log [1, 1, 2, 2, 3, 3] begins at 4: 0..3 are in its snapshot
DATA = b"snapshot-bytes"


def _leading() -> tuple[DispatcherEnv, EntryDispatcher]:
    store = leader_store([1, 1, 2, 2, 3, 3])
    meta = SnapshotMeta(BEGIN - 1, store.term_at(BEGIN - 1), store.chain_at(BEGIN - 1), PEERS,
                        {"state": FileInfo(len(DATA), zlib.crc32(DATA))}, next_pos=store.get(BEGIN).pos)
    store.drop_prefix(BEGIN)
    assert store.begin_index == BEGIN
    env = DispatcherEnv(store, meta)
    return env, dispatcher(env)


def _state(d: EntryDispatcher) -> State:
    """(a call, so mypy does not narrow the state across the answers that change it)"""
    return d.state


def _push(env: DispatcherEnv) -> tuple[Sent, PushRequest]:
    sent = env.take()
    assert len(sent) == 1 and sent[0].code == RequestCode.PUSH, sent
    assert isinstance(sent[0].msg, PushRequest)
    return sent[0], sent[0].msg


def _to_install(env: DispatcherEnv, d: EntryDispatcher) -> None:
    """The follower holds [1, 1]: the COMPARE below our end is refused, and what it needs
    next (2) is below our log begin."""
    d.pump()
    p, req = _push(env)
    assert req.type == PushType.COMPARE
    d.on_response(p.ctx, PushResponse(int(ResponseCode.INCONSISTENT_STATE), 3, end_index=1))


def _install_sent(env: DispatcherEnv, d: EntryDispatcher) -> Sent:
    _to_install(env, d)
    d.pump()
    (*_, ctx), = env.chunk_reads
    d.on_chunk_read(ctx, DATA, zlib.crc32(DATA), "")
    sent = env.take()
    assert len(sent) == 1 and sent[0].code == RequestCode.INSTALL_SNAPSHOT
    return sent[0]


def test_a_follower_needing_entries_below_the_log_begin_gets_the_snapshot() -> None:
    """§5.4.1: the leader sends InstallSnapshot when the entries a follower needs next were
    discarded; no COMPARE or APPEND probes below the log begin."""
    env, d = _leading()
    _to_install(env, d)
    assert d.state == State.INSTALL and Pump() in d.take_effects()
    d.pump()
    assert not env.outbox  # no push
    (peer, meta, offset, _, ctx), = env.chunk_reads  # its first chunk is read
    assert (peer, meta.last_index, offset) == ("n1", BEGIN - 1, 0)
    d.on_chunk_read(ctx, DATA, zlib.crc32(DATA), "")
    s = env.take()
    assert len(s) == 1 and s[0].code == RequestCode.INSTALL_SNAPSHOT
    req = s[0].msg
    assert isinstance(req, InstallSnapshotRequest)
    assert (req.term, req.last_index, req.last_term, req.offset) == (3, BEGIN - 1, 2, 0)
    assert bytes(s[0].data) == DATA


def test_after_the_install_the_follower_is_matched_past_the_snapshot_and_appended() -> None:
    """§5.4.1: once the follower holds the snapshot, its log matches ours through the
    snapshot's last entry; replication resumes from there (COMPARE, then APPEND)."""
    env, d = _leading()
    s = _install_sent(env, d)
    assert isinstance(s.ctx, InstallCtx)
    d.on_install_response(s.ctx, InstallSnapshotResponse(int(ResponseCode.SUCCESS), 3, len(DATA), True,
                                                         end_index=BEGIN - 1))
    assert env.progress["n1"].match_index == BEGIN - 1 and _state(d) == State.COMPARE
    d.pump()
    p, req = _push(env)
    assert req.type == PushType.COMPARE and (req.prev_index, req.prev_term) == (BEGIN - 1, 2)
    d.on_response(p.ctx, PushResponse(int(ResponseCode.SUCCESS), 3, end_index=BEGIN - 1))
    assert _state(d) == State.APPEND
    d.pump()
    p, req = _push(env)
    assert req.type == PushType.APPEND and (req.first_index, req.count) == (BEGIN, 2)
    assert bytes(p.data) == records(env.store, BEGIN)


def test_an_install_answer_of_an_earlier_window_is_inert() -> None:
    """An answer to a chunk sent before the dispatcher reset (a new epoch) says nothing of
    the install now running: it moves neither the match nor the state."""
    env, d = _leading()
    s = _install_sent(env, d)
    d.reset(BEGIN - 1, "test")  # a new window
    d.take_effects()
    d.on_install_response(s.ctx, InstallSnapshotResponse(int(ResponseCode.SUCCESS), 3, len(DATA), True,
                                                         end_index=BEGIN - 1))
    assert env.progress["n1"].match_index == -1 and env.progress["n1"].installed_through == -1
    assert _state(d) == State.COMPARE and d.take_effects() == []


def test_an_install_answer_of_an_earlier_term_is_inert() -> None:
    """§3.3: an answer to a request of an earlier term of ours (dispatchers count epochs from
    0 each term) is not used."""
    env, d = _leading()
    s = _install_sent(env, d)
    assert isinstance(s.ctx, InstallCtx)
    old = InstallCtx(s.ctx.peer, s.ctx.epoch, s.ctx.term - 1, s.ctx.last_index, s.ctx.offset)
    d.take_effects()
    d.on_install_response(old, InstallSnapshotResponse(int(ResponseCode.SUCCESS), 2, len(DATA), True,
                                                       end_index=BEGIN - 1))
    assert env.progress["n1"].match_index == -1 and _state(d) == State.INSTALL
    assert d.take_effects() == []
