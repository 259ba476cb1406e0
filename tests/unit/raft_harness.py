"""A member driven by hand for the Raft rule tests (tests/unit/test_raft_rules_*.py): a Node on a
memory store with a virtual clock, no sockets; requests are handed in, actions read out."""

from __future__ import annotations

import random
from typing import Any, TypeVar

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import Answered, VoteCtx
from dledger.core.messages import PushResponse, Role, VoteRequest, VoteResponse, VoteResult
from dledger.core.node import Action, Node, Reply, Send
from dledger.entry import MAGIC_NORMAL
from dledger.store.memory import MemoryLedgerStore

T = TypeVar("T")

PEERS = "n0-127.0.0.1:20000;n1-127.0.0.1:20001;n2-127.0.0.1:20002"


class Member:
    def __init__(self, self_id: str = "n0", peers: str = PEERS, flush: str = "async",
                 terms: list[int] | None = None, **cfg: Any) -> None:
        """`terms`: the log it starts with, one entry per term given (as if stored by leaders of
        those terms)."""
        self.cfg = DLedgerConfig(self_id=self_id, peers=peers, store_type="memory", flush=flush, **cfg)
        self.store = MemoryLedgerStore(self.cfg.max_body_bytes)
        for t in terms or []:
            self.store.append_as_leader([f"t{t}".encode()], t, MAGIC_NORMAL)
        if terms:
            self.store.save_term(max(terms), None)
        self.now = 0
        self.node = Node(self.cfg, self.store, self.now, random.Random(7))
        self.out: list[Action] = []

    def handle(self, code: int, msg: Any, data: bytes = b"", token: Any = "t") -> Any:
        """Hand in a request; returns its reply's message (None if it is not answered yet)."""
        self.node.handle(code, msg, data, token, self.now)
        self.drain()
        return self.reply_to(token)

    def reply_to(self, token: Any) -> Any:
        """The last reply to `token` (None: not answered yet)."""
        for a in reversed(self.out):
            if isinstance(a, Reply) and a.token == token:
                return a.msg
        return None

    def drain(self) -> list[Action]:
        acts = self.node.drain()
        self.out.extend(acts)
        return acts

    def tick(self, ms: int = 10) -> list[Action]:
        self.now += ms
        self.node.tick(self.now)
        return self.drain()

    def sends(self, code: int | None = None) -> list[Send]:
        return [a for a in self.out if isinstance(a, Send) and (code is None or a.code == code)]

    def clear(self) -> None:
        self.out.clear()


def msg_of(s: Send, cls: type[T]) -> T:
    """The request a Send carries, as the type its code implies."""
    assert isinstance(s.msg, cls)
    return s.msg


def leading(flush: str = "async", **cfg: Any) -> Member:
    """n0 of three, just elected in term 2 over a log of one term-1 entry (its NOOP at 1)."""
    m = Member(terms=[1], flush=flush, **cfg)
    m.node.elector.start_round(pre_vote=False)
    m.drain()
    for s in m.sends(RequestCode.VOTE):
        m.node.complete(Answered(s.ctx, VoteResponse(msg_of(s, VoteRequest).term, int(VoteResult.ACCEPT))), m.now)
    m.drain()
    assert m.node.member.is_leader
    return m


def campaign_and_win(m: Member) -> None:
    """Tick until `m` campaigns, then answer its pre-vote and its vote round with every
    member's yes: a leader elected the way its timers elect it."""
    for _ in range(1000):
        m.tick()
        if any(isinstance(a.ctx, VoteCtx) for a in m.sends(RequestCode.VOTE)):
            break
    for _ in range(2):  # the pre-vote round, then the real one
        votes = [a for a in m.sends(RequestCode.VOTE) if isinstance(a.ctx, VoteCtx)]
        m.clear()
        for s in votes:
            req = msg_of(s, VoteRequest)
            m.node.complete(Answered(s.ctx, VoteResponse(req.term, int(VoteResult.ACCEPT), req.pre_vote)), m.now)
        m.drain()
    assert m.node.member.role == Role.LEADER


def answer_pushes(m: Member, peer: str, resp: PushResponse) -> None:
    """Answer every push sent to `peer` so far with `resp`."""
    for s in [s for s in m.sends(RequestCode.PUSH) if s.peer == peer]:
        m.out.remove(s)
        m.node.complete(Answered(s.ctx, resp), m.now)
    m.drain()


def catch_up(m: Member, peer: str) -> None:
    """`peer` holds the leader's whole log and says so (COMPARE, then APPEND answered)."""
    term = m.node.member.term
    for _ in range(3):
        answer_pushes(m, peer, PushResponse(int(ResponseCode.SUCCESS), term, m.store.end_index))
        m.tick()
