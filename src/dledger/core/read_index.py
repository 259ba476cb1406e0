"""ReadIndex: linearizable reads on the leader (Raft thesis §6.4) and leader leases.

A read that must not be stale takes the commit index when it arrives (its read index) and
is served once a majority acknowledged a heartbeat round the leader *started after* it
arrived: no other leader can have committed anything then, so serving the state up to the
read index (or later) is linearizable. Reads arriving together share the next round, which
is sent at once (not at the next heartbeat tick).

A lease read skips the round while the lease holds: a round confirmed by a majority
guarantees no other member votes for anyone until a lease after it received the heartbeat
(followers refuse votes while their leader is alive, and a member refuses votes for its own
lease after it starts), so the leader may serve alone until the round's *send* time plus
`read_lease_ms` (its lease, or a voter's own when shorter: what a restarted voter keeps to)
minus the clock-drift margin. Never during a leadership transfer, whose votes ignore live
leaders.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dledger.codes import ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.member_state import MemberState
from dledger.core.messages import CONSISTENCY

# consistency levels of reads (the wire's names)
LINEARIZABLE = "linearizable"
LEASE = "lease"
LEADER = "leader"
LOCAL = "local"
assert CONSISTENCY == (LINEARIZABLE, LEASE, LEADER, LOCAL)

_ROUNDS_KEPT = 64  # send times of recent rounds (a lease is taken from a confirmed round's)


@dataclass(slots=True)
class PendingRead:
    need_round: int  # served once a majority acknowledged this round
    read_index: int
    serve: Callable[[int], None]  # called with the read index once confirmed
    fail: Callable[[ResponseCode, str], None]


class LeaseSource(Protocol):
    """The elector's two facts a lease depends on (core.elector.LeaderElector is one)."""

    @property
    def transferring(self) -> bool: ...
    @property
    def read_lease_ms(self) -> int: ...


class ReadIndexContext(Protocol):
    """All ReadIndex needs of its member (the Node is one): the membership and term, the
    clock, the clock-drift margin, and the elector's lease facts."""

    @property
    def now(self) -> int: ...
    @property
    def member(self) -> MemberState: ...
    @property
    def cfg(self) -> DLedgerConfig: ...
    @property
    def elector(self) -> LeaseSource: ...


class ReadIndex:
    def __init__(self, env: ReadIndexContext) -> None:
        self.env = env
        self.round = 0  # heartbeat rounds this member sent as leader (reset per leadership)
        self.confirmed = 0  # the last round a majority acknowledged
        self.lease_until = -(1 << 62)
        self._no_lease_term = -1  # a hand-over was sent in this term: leases are off
        self._sent_at: dict[int, int] = {}
        self._acks: dict[str, int] = {}
        self._pending: deque[PendingRead] = deque()
        self.want_round = False  # a read waits for a round not sent yet
        self.reads_confirmed = 0  # metrics
        self.lease_reads = 0

    # --- reads ---------------------------------------------------------------------------------

    def read(self, consistency: str, read_index: int, serve: Callable[[int], None],
             fail: Callable[[ResponseCode, str], None]) -> None:
        """Serve now (lease), or once the next round is acknowledged by a majority."""
        if consistency == LEASE and self.lease_valid():
            self.lease_reads += 1
            serve(read_index)
            return
        self._pending.append(PendingRead(self.round + 1, read_index, serve, fail))
        self.want_round = True
        if self.env.member.alone:
            self.next_round()  # alone: our own acknowledgement is a majority
            self._confirm()

    def lease_valid(self) -> bool:
        env = self.env
        return (env.member.is_leader and not env.elector.transferring and env.now < self.lease_until
                and self._no_lease_term != env.member.term)

    def end_leases(self) -> None:
        """A hand-over (TimeoutNow) was sent in this term: its target may win votes from
        members that acknowledged our lease, whenever it arrives (even after our transfer timed
        out and we resumed), so no lease read for the rest of the term (review: stale lease
        reads after a timed-out transfer)."""
        self._no_lease_term = self.env.member.term
        self.lease_until = -(1 << 62)

    # --- rounds --------------------------------------------------------------------------------

    def next_round(self) -> int:
        """A heartbeat round is being sent now; its number travels in each heartbeat's context."""
        self.round += 1
        self.want_round = False
        self._sent_at[self.round] = self.env.now
        self._sent_at.pop(self.round - _ROUNDS_KEPT, None)
        return self.round

    def on_ack(self, peer: str, round_: int) -> None:
        if round_ > self._acks.get(peer, 0):
            self._acks[peer] = round_
            self._confirm()

    def _confirm(self) -> None:
        m = self.env.member
        # voters only; ours while we are one: we are the leader of every round we sent
        rounds = sorted((self._acks.get(p, 0) for p in m.other_voters), reverse=True)
        if m.is_voter:
            rounds.insert(0, self.round)
        confirmed = rounds[m.quorum - 1]
        if confirmed <= self.confirmed:
            return
        self.confirmed = confirmed
        sent = self._sent_at.get(confirmed)
        if sent is not None and self._no_lease_term != m.term:
            lease = self.env.elector.read_lease_ms - self.env.cfg.lease_clock_drift_ms
            self.lease_until = max(self.lease_until, sent + lease)
        while self._pending and self._pending[0].need_round <= confirmed:
            r = self._pending.popleft()
            self.reads_confirmed += 1
            r.serve(r.read_index)

    def reset(self, code: ResponseCode, message: str) -> None:
        """Leadership ended (or began): waiting reads fail, rounds and the lease start over."""
        pending, self._pending = self._pending, deque()
        self.round = self.confirmed = 0
        self.lease_until = -(1 << 62)
        self._sent_at.clear()
        self._acks.clear()
        self.want_round = False
        for r in pending:
            r.fail(code, message)

    @property
    def waiting(self) -> int:
        return len(self._pending)


def describe(consistency: str) -> str:
    return f"consistency {consistency!r}: one of {', '.join(CONSISTENCY)}"


__all__ = ["CONSISTENCY", "LEADER", "LEASE", "LINEARIZABLE", "LOCAL", "LeaseSource", "PendingRead", "ReadIndex",
           "ReadIndexContext", "describe"]
