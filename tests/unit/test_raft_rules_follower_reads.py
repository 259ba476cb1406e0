"""FollowerReads against the Raft thesis (§6.4: a follower serves a read by asking the leader for
a read index, then waiting until its own commit index reaches it), one test per rule. Built
from a narrow context (core.follower_read.FollowerReadsContext), without a Node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import ReadIndexCtx
from dledger.core.follower_read import MAX_WAITING, FollowerReads
from dledger.core.member_state import MemberState
from dledger.core.messages import ReadIndexRequest, ReadIndexResponse
from dledger.entry import MAGIC_NORMAL
from dledger.store.memory import MemoryLedgerStore

PEERS = "n0-127.0.0.1:20000;n1-127.0.0.1:20001;n2-127.0.0.1:20002"


@dataclass
class Sent:
    peer: str
    code: int
    msg: msgspec.Struct
    ctx: ReadIndexCtx


@dataclass
class Env:
    """A follower n1 of three whose leader is n0, with a log of five entries, none committed."""

    cfg: DLedgerConfig = field(default_factory=lambda: DLedgerConfig(self_id="n1", peers=PEERS,
                                                                    store_type="memory"))
    now: int = 0
    outbox: list[Sent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = MemoryLedgerStore(self.cfg.max_body_bytes)
        for i in range(5):
            self.store.append_as_leader([b"e%d" % i], 1, MAGIC_NORMAL)
        self.member = MemberState(self.cfg.group, "n1", list(self.cfg.peer_map), self.store)
        self.member.leader_id = "n0"

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: ReadIndexCtx) -> None:
        self.outbox.append(Sent(peer, code, msg, ctx))


class Read:
    """One read's outcome: served at a read index, or failed with a code."""

    def __init__(self) -> None:
        self.served: int | None = None
        self.failed: tuple[ResponseCode, str] | None = None

    def serve(self, index: int) -> None:
        self.served = index

    def fail(self, code: ResponseCode, message: str) -> None:
        self.failed = (code, message)


def _read(reads: FollowerReads, consistency: str = "linearizable") -> Read:
    r = Read()
    reads.read(consistency, r.serve, r.fail)
    return r


def _answer(reads: FollowerReads, sent: Sent, resp: ReadIndexResponse | None) -> None:
    reads.on_response(sent.ctx, resp)


def _ok(read_index: int) -> ReadIndexResponse:
    return ReadIndexResponse(int(ResponseCode.SUCCESS), "n0", read_index)


def _commit(env: Env, index: int, reads: FollowerReads) -> None:
    env.store.set_committed(index)
    reads.wake()


def test_a_follower_asks_its_leader_for_a_read_index() -> None:
    """the read index is the leader's to give: the request goes to the leader, with the consistency."""
    env = Env()
    reads = FollowerReads(env)
    r = _read(reads, "lease")
    assert len(env.outbox) == 1
    s = env.outbox[0]
    assert s.peer == "n0" and s.code == RequestCode.READ_INDEX
    assert isinstance(s.msg, ReadIndexRequest) and s.msg.consistency == "lease"
    assert s.msg.leader_id == "n1" and s.msg.remote_id == "n0"
    assert r.served is None and r.failed is None


def test_a_follower_that_knows_no_leader_refuses_at_once() -> None:
    env = Env()
    env.member.leader_id = None
    reads = FollowerReads(env)
    r = _read(reads)
    assert not env.outbox
    assert r.failed is not None and r.failed[0] == ResponseCode.NOT_LEADER


def test_it_waits_until_its_commit_index_reaches_the_read_index() -> None:
    """entries acknowledged before the read began are at or below the read index: a copy
    committed only below it may lack them."""
    env = Env()
    reads = FollowerReads(env)
    r = _read(reads)
    _answer(reads, env.outbox[0], _ok(3))
    assert r.served is None and r.failed is None  # our commit index is -1
    _commit(env, 2, reads)
    assert r.served is None
    _commit(env, 3, reads)
    assert r.served == 3 and r.failed is None
    assert reads.served == 1


def test_it_serves_at_once_when_already_committed_that_far() -> None:
    env = Env()
    env.store.set_committed(4)
    reads = FollowerReads(env)
    r = _read(reads)
    _answer(reads, env.outbox[0], _ok(2))
    assert r.served == 2


def test_a_leader_that_refuses_fails_the_read_with_its_code() -> None:
    """a leader that lost leadership (a leader change) answers NOT_LEADER: the read is refused,
    not served from a read index nobody confirmed."""
    env = Env()
    reads = FollowerReads(env)
    r = _read(reads)
    _answer(reads, env.outbox[0], ReadIndexResponse(int(ResponseCode.NOT_LEADER), "n2", -1, "not the leader"))
    assert r.served is None
    assert r.failed is not None and r.failed[0] == ResponseCode.NOT_LEADER
    _commit(env, 4, reads)
    assert r.served is None  # and it stays refused


def test_no_answer_from_the_leader_fails_the_read_with_timeout() -> None:
    env = Env()
    reads = FollowerReads(env)
    r = _read(reads)
    _answer(reads, env.outbox[0], None)
    assert r.failed is not None and r.failed[0] == ResponseCode.TIMEOUT


def test_a_read_index_not_committed_in_time_fails_with_timeout() -> None:
    env = Env()
    reads = FollowerReads(env)
    r = _read(reads)
    _answer(reads, env.outbox[0], _ok(4))
    env.now += env.cfg.max_wait_ack_ms - 1
    reads.wake()
    _commit(env, 1, reads)
    assert r.failed is None
    env.now += 1
    _commit(env, 2, reads)
    assert r.failed is not None and r.failed[0] == ResponseCode.TIMEOUT and r.served is None


def test_an_answer_to_no_waiting_read_is_inert() -> None:
    """a late or repeated answer (its read already answered) serves nothing twice."""
    env = Env()
    reads = FollowerReads(env)
    r = _read(reads)
    sent = env.outbox[0]
    _answer(reads, sent, None)
    _answer(reads, sent, _ok(0))
    _commit(env, 4, reads)
    assert r.served is None and r.failed is not None and r.failed[0] == ResponseCode.TIMEOUT


def test_reads_beyond_the_bound_are_refused() -> None:
    env = Env()
    reads = FollowerReads(env)
    reads_: list[Any] = [_read(reads) for _ in range(MAX_WAITING)]
    assert all(r.failed is None for r in reads_)
    r = _read(reads)
    assert r.failed is not None and r.failed[0] == ResponseCode.LEADER_PENDING_FULL
    assert len(env.outbox) == MAX_WAITING
