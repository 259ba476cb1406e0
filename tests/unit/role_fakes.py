"""Small hand-written contexts for the role classes' rule tests (tests/unit/test_raft_rules_*.py),
each implementing the Protocol its class declares (core.handler.HandlerContext,
core.dispatcher.DispatcherContext) around a real store: no Node. mypy checks each against
its Protocol (the helpers that build the roles take the Protocol type)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from dledger.codes import ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.dispatcher import DispatcherContext, EntryDispatcher
from dledger.core.effects import Effect, PushReply
from dledger.core.handler import EntryHandler, HandlerContext
from dledger.core.member_state import MemberState
from dledger.core.messages import PushRequest, PushResponse, Role
from dledger.core.progress import Progress
from dledger.entry import MAGIC_NORMAL
from dledger.statemachine.applier import Applier
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.base import LedgerStore
from dledger.store.memory import MemoryLedgerStore

PEERS = "n0-127.0.0.1:20000;n1-127.0.0.1:20001;n2-127.0.0.1:20002"


def cfg_of(self_id: str, **kw: Any) -> DLedgerConfig:
    return DLedgerConfig(self_id=self_id, peers=PEERS, store_type="memory", **kw)


def fill(store: LedgerStore, terms: list[int], tag: bytes = b"e") -> LedgerStore:
    """Append one entry per term given, as leaders of those terms would (bodies tag + index)."""
    for t in terms:
        store.append_as_leader([tag + b"%d" % (store.end_index + 1)], t, MAGIC_NORMAL)
    return store


def record(store: LedgerStore, index: int) -> bytes:
    """The raw bytes of the record of `index`."""
    raw = store.read_raw(index, 0)  # max_bytes 0: that record alone
    try:
        return bytes(raw.data)
    finally:
        raw.data.release()


def records(store: LedgerStore, first: int, last: int | None = None) -> bytes:
    """The raw bytes of records first..last (default: to the end)."""
    last = store.end_index if last is None else last
    return b"".join(record(store, i) for i in range(first, last + 1))


def copy_into(follower: LedgerStore, leader: LedgerStore, first: int, last: int) -> None:
    """The follower appends the leader's records first..last verbatim."""
    follower.append_as_follower(records(leader, first, last))


# --- EntryHandler ---------------------------------------------------------------------------


class Follows:
    """The elector's leader check, reduced to Raft's term rule (§3.3): an older term is
    refused, a newer one adopted, and the sender becomes our leader."""

    def __init__(self, member: MemberState) -> None:
        self.member = member

    def accept_leader(self, term: int, leader_id: str) -> ResponseCode | None:
        if term < self.member.term:
            return ResponseCode.EXPIRED_TERM
        self.member.set_term(term)
        self.member.leader_id = leader_id
        return None


class NoInstall:
    meta: SnapshotMeta | None = None

    def drop_partial(self) -> None: ...


class HandlerEnv:
    """Follower n1 of three at term 2 on `store`."""

    def __init__(self, store: LedgerStore, **cfg: Any) -> None:
        self.cfg = cfg_of("n1", **cfg)
        self.now = 0
        self.store = store
        self.member = MemberState(self.cfg.group, "n1", list(self.cfg.peer_map), self.store)
        self.member.set_term(2)
        self.elector = Follows(self.member)
        self.receiver = NoInstall()

    def log_appended(self, first: int, last: int) -> None: ...
    def log_truncated(self, end: int) -> None: ...


def handler(env: HandlerContext) -> EntryHandler:
    return EntryHandler(env)


def push(h: EntryHandler, kind: int, prev_index: int, prev_term: int, *, term: int = 3, leader: str = "n0",
         committed: int = -1, data: bytes | memoryview = b"", count: int = 0, next_term: int = -1,
         token: Any = "tok") -> list[Effect]:
    """Hand the handler a push; returns the effects it asked for (its answers among them)."""
    req = PushRequest(leader_id=leader, remote_id="n1", term=term, type=int(kind), prev_index=prev_index,
                      prev_term=prev_term, first_index=prev_index + 1, count=count, committed_index=committed,
                      next_term=next_term)
    h.handle_push(req, data, token)
    return h.take_effects()


def replies(effects: list[Effect]) -> list[tuple[Any, PushResponse]]:
    return [(e.token, e.resp) for e in effects if isinstance(e, PushReply)]


def others(effects: list[Effect]) -> list[Effect]:
    """The effects that are not answers."""
    return [e for e in effects if not isinstance(e, PushReply)]


def only_reply(effects: list[Effect], token: Any = "tok") -> PushResponse:
    rs = replies(effects)
    assert len(rs) == 1 and rs[0][0] == token, rs
    return rs[0][1]


# --- EntryDispatcher ------------------------------------------------------------------------


@dataclass
class Sent:
    peer: str
    code: int
    msg: msgspec.Struct
    ctx: Any
    data: bytes | memoryview


class TermsSeen:
    """The elector's term watch: records the terms answers carried, steps down on a higher one."""

    def __init__(self, member: MemberState) -> None:
        self.member = member
        self.seen: list[int] = []

    def observe_term(self, term: int) -> bool:
        self.seen.append(term)
        if term > self.member.term:
            self.member.role = Role.FOLLOWER
            self.member.set_term(term)
            return True
        return False


class Advances:
    def __init__(self) -> None:
        self.calls = 0

    def advance(self) -> bool:
        self.calls += 1
        return False


class DispatcherEnv:
    """Leader n0 of three at term 3 on `store`; `snapshot`: the snapshot it would send."""

    def __init__(self, store: LedgerStore, snapshot: SnapshotMeta | None = None, **cfg: Any) -> None:
        self.cfg = cfg_of("n0", **cfg)
        self.now = 0
        self.store = store
        self.member = MemberState(self.cfg.group, "n0", list(self.cfg.peer_map), self.store)
        self.member.set_term(3)
        self.member.role = Role.LEADER
        self.member.leader_id = "n0"
        self.progress = {p: Progress(p) for p in self.member.others}
        self.elector = TermsSeen(self.member)
        self.quorum = Advances()
        self.applier: Applier | None = None
        self.snapshot_meta = snapshot
        self.install_bytes_sent = 0
        self.installs_sent = 0
        self.outbox: list[Sent] = []
        self.chunk_reads: list[tuple[str, SnapshotMeta, int, int, Any]] = []
        self.beyond_repair = -1
        self.marked: list[tuple[int, str]] = []  # mark_corrupt calls (a repair's read of our copy)

    def snapshot_to_send(self) -> SnapshotMeta | None:
        return self.snapshot_meta
    def want_snapshot(self) -> None: ...
    def read_chunk(self, peer: str, meta: SnapshotMeta, offset: int, max_bytes: int, ctx: Any) -> None:
        self.chunk_reads.append((peer, meta, offset, max_bytes, ctx))
    def mark_corrupt(self, index: int, reason: str) -> None:
        self.marked.append((index, reason))
    def is_beyond_repair(self, index: int) -> bool:
        return index < self.beyond_repair

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Any, data: bytes | memoryview = b"",
             timeout_ms: int | None = None) -> None:
        self.outbox.append(Sent(peer, code, msg, ctx, data))

    def take(self) -> list[Sent]:
        out, self.outbox = self.outbox, []
        return out


def dispatcher(env: DispatcherContext, peer: str = "n1") -> EntryDispatcher:
    return EntryDispatcher(env, peer)


def leader_store(terms: list[int]) -> MemoryLedgerStore:
    s = MemoryLedgerStore()
    fill(s, terms)
    s.set_committed(s.end_index)
    return s
