"""Follower reads (Raft thesis §6.4): a follower serves a linearizable (or lease) read itself
by asking the leader for a read index, then waiting until its own commit index reaches it.

The leader answers a READ_INDEX request as it serves its own reads (core.read_index): the
commit index it holds when the request arrives, once a heartbeat round started after that
confirmed it still leads (or within its lease). Any entry acknowledged before the read
began is at or below that index, so once the follower committed up to it (its commit index
only covers entries known equal to the leader's log) its copy includes them. A query also
waits until the follower's state machine applied that far (the applier's waiting queries).

Only requests marked `follower_read` (the client's `member=` with a consistency) are served
so; one sent to whoever leads is still answered NOT_LEADER, so clients learn the leader. A read index that the
follower does not commit in time (cut off after the answer) fails with TIMEOUT.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import ReadIndexCtx
from dledger.core.env import MemberEnv
from dledger.core.messages import ReadIndexRequest, ReadIndexResponse

log = logging.getLogger(__name__)

MAX_WAITING = 10_000  # follower reads waiting here at once (each holds a request's answer)


@dataclass(slots=True)
class _Waiting:
    read_index: int
    deadline: int
    serve: Callable[[int], None]
    fail: Callable[[ResponseCode, str], None]


class FollowerReadsContext(MemberEnv, Protocol):
    """All follower reads need of their member (the Node is one): who leads, the commit index,
    the wait bound, the clock, and an outbox for the READ_INDEX request."""

    @property
    def cfg(self) -> DLedgerConfig: ...

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: ReadIndexCtx) -> None: ...


class FollowerReads:
    def __init__(self, env: FollowerReadsContext) -> None:
        self.env = env
        self._ids = itertools.count()
        self._asked: dict[int, _Waiting] = {}  # READ_INDEX requests in flight (read_index unknown yet)
        self._waiting: list[_Waiting] = []  # read index known, our commit index not there yet
        self.served = 0  # metrics

    def read(self, consistency: str, serve: Callable[[int], None], fail: Callable[[ResponseCode, str], None]) -> None:
        env, m = self.env, self.env.member
        if len(self._asked) + len(self._waiting) >= MAX_WAITING:
            fail(ResponseCode.LEADER_PENDING_FULL, f"{MAX_WAITING} follower reads wait on {m.self_id}")
            return
        if m.leader_id is None or m.leader_id == m.self_id:
            fail(ResponseCode.NOT_LEADER, f"{m.self_id} knows no leader to confirm a read with")
            return
        rid = next(self._ids)
        self._asked[rid] = _Waiting(-1, env.now + env.cfg.max_wait_ack_ms, serve, fail)
        env.send(m.leader_id, RequestCode.READ_INDEX, ReadIndexRequest(m.group, m.self_id, m.leader_id, consistency),
                  ReadIndexCtx(rid))

    def on_response(self, ctx: ReadIndexCtx, resp: ReadIndexResponse | None) -> None:
        w = self._asked.pop(ctx.rid, None)
        if w is None:
            return
        if resp is None:
            w.fail(ResponseCode.TIMEOUT, "the leader did not answer for a read index")
        elif resp.code != ResponseCode.SUCCESS:
            w.fail(ResponseCode(resp.code) if resp.code in ResponseCode._value2member_map_ else
                   ResponseCode.UNKNOWN, f"the leader refused a read index: {resp.message}")
        else:
            w.read_index = resp.read_index
            self._waiting.append(w)
            self.wake()

    def wake(self) -> None:
        """Serve the reads whose read index we committed; fail those past their deadline."""
        if not self._waiting:
            return
        env = self.env
        committed, now = env.store.committed_index, env.now
        keep = []
        for w in self._waiting:
            if w.read_index <= committed:
                self.served += 1
                w.serve(w.read_index)
            elif now >= w.deadline:
                w.fail(ResponseCode.TIMEOUT, f"{env.member.self_id} did not commit up to the read index "
                                             f"{w.read_index} in time (committed {committed})")
            else:
                keep.append(w)
        self._waiting = keep
