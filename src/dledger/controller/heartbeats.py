"""Broker liveness on one controller (upstream's DefaultBrokerHeartbeatManager).

Every controller keeps its own table from the heartbeats brokers send to all of them (it is
not replicated). A broker is alive while its last heartbeat is younger than its timeout.
Each entry knows two connections: `conn`, where its last heartbeat came, and `home`, the open
one its heartbeats have come on the longest (it moves only when it closes). A closed
connection evicts a broker only when no open connection of it is left (#11045: upstream
never rebound, so a stale channel's close evicted a healthy broker and triggered an
election); a heartbeat forged on another connection, then closed, leaves `home` as it was.
A master's alter-sync-state-set must come over its `home` (`beats_on`).

A broker that asked for a master lease (its heartbeat says `lease_ms`) stays alive until
that lease + drift has surely ended (`held_until`), whatever comes after: a closed connection,
a heartbeat with lease_ms=0, or a heartbeat forged on another connection that is then closed.
Until then it may still acknowledge writes, and electing another master would make two.
`held_until` only grows; nothing but time ends it.

Sans-I/O: time is passed in (ms), so the simulator and the tests drive it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from dledger.controller.elect_policy import PRIORITY_DEFAULT, LiveInfo

Key = tuple[str, int]  # (broker name, broker id): the state keys broker sets by name only


@dataclass
class BrokerLive:
    cluster: str
    address: str
    last_ms: int
    timeout_ms: int
    info: LiveInfo
    confirm_offset: int = -1
    conn: Hashable | None = None  # where its last heartbeat came
    lease_ms: int = 0
    held_until: int = 0  # the end of the latest lease it asked for, + drift: never moves back
    closed: bool = False  # every connection its heartbeats came on closed (the process is gone)
    home: Hashable | None = None  # the open connection its heartbeats have come on the longest

    def alive(self, now_ms: int) -> bool:
        beating = not self.closed and self.last_ms + self.timeout_ms >= now_ms
        return beating or self.held_until >= now_ms


MAX_BROKERS = 65_536  # live brokers one controller tracks (a heartbeat flood cannot grow it further)
MAX_PER_SET = 1024  # ... per broker name (a log entry carries one set's live replicas)


class HeartbeatTable:
    def __init__(self, default_timeout_ms: int, lease_drift_ms: int = 0) -> None:
        self.default_timeout_ms = default_timeout_ms
        self.lease_drift_ms = lease_drift_ms
        self.brokers: dict[Key, BrokerLive] = {}
        self._sets: dict[str, dict[int, BrokerLive]] = {}  # the same entries, by broker name

    def beat(self, cluster: str, name: str, broker_id: int, address: str, now_ms: int, *, timeout_ms: int = 0,
             epoch: int = -1, max_offset: int = -1, confirm_offset: int = -1, priority: int = PRIORITY_DEFAULT,
             conn: Hashable | None = None, lease_ms: int = 0, view: int = -1) -> bool:
        """Record a heartbeat (False: refused, the table is full). Facts reported at a higher
        `view` (the master epoch the broker had heard of) replace the older ones whatever
        they say: a master restarted after a power loss reports less than before, and its
        old report must not rank it. Within one view (epoch, max offset) only move forward,
        as upstream's: heartbeats may arrive out of order."""
        timeout = timeout_ms or self.default_timeout_ms
        held = now_ms + lease_ms + self.lease_drift_ms if lease_ms else 0
        old = self.brokers.get((name, broker_id))
        if old is None:
            if self._full(name):  # the leader's scan expires dead entries every scan interval
                return False
            b = BrokerLive(cluster, address, now_ms, timeout, LiveInfo(epoch, max_offset, priority, view),
                           confirm_offset, conn, lease_ms, held, home=conn)
            self.brokers[(name, broker_id)] = self._sets.setdefault(name, {})[broker_id] = b
            return True
        old.cluster, old.address, old.last_ms, old.timeout_ms, old.conn = cluster, address, now_ms, timeout, conn
        old.lease_ms, old.held_until, old.closed = lease_ms, max(old.held_until, held), False
        if old.home is None:
            old.home = conn
        info = old.info
        if view > info.view or (view == info.view and (epoch, max_offset) > (info.epoch, info.max_offset)):
            old.info = LiveInfo(epoch, max_offset, priority, view)
            old.confirm_offset = confirm_offset
        else:
            old.info = LiveInfo(info.epoch, info.max_offset, priority, info.view)
        return True

    def alive(self, name: str, broker_id: int, now_ms: int) -> bool:
        b = self.brokers.get((name, broker_id))
        return b is not None and b.alive(now_ms)

    def live_infos(self, name: str, now_ms: int) -> dict[int, LiveInfo]:
        """The live replicas of one broker set, as the leader writes them into a command."""
        return {i: b.info for i, b in self._sets.get(name, {}).items() if b.alive(now_ms)}

    def names(self) -> list[str]:
        """Every broker set a replica beat for (a set none beat for has no live replica)."""
        return sorted(self._sets)

    def beats_on(self, name: str, broker_id: int, conn: Hashable) -> bool:
        """`conn` is the replica's home connection: the open one its heartbeats have come on
        the longest (where a master's alter-sync-state-set must come from)."""
        b = self.brokers.get((name, broker_id))
        return b is not None and b.home is not None and b.home == conn

    def expire(self, now_ms: int) -> list[Key]:
        """Drop the brokers whose heartbeats stopped; they are returned (onBrokerInactive)."""
        dead = [k for k, b in self.brokers.items() if not b.alive(now_ms)]
        self._drop(dead)
        return dead

    def connection_closed(self, conn: Hashable, now_ms: int) -> list[Key]:
        """A connection closed: the brokers left with no open connection are gone (one that
        asked for a lease: once that lease and the drift margin have passed)."""
        hit = [k for k, b in self.brokers.items() if conn in (b.conn, b.home)]
        for k in hit:
            b = self.brokers[k]
            if b.home == conn:
                b.home = b.conn if b.conn != conn else None
            if b.conn == conn:
                b.conn = b.home
            b.closed = b.home is None
        gone = [k for k in hit if not self.brokers[k].alive(now_ms)]
        self._drop(gone)
        return gone

    def _drop(self, keys: list[Key]) -> None:
        for k in keys:
            del self.brokers[k]
            members = self._sets[k[0]]
            del members[k[1]]
            if not members:
                del self._sets[k[0]]

    def _full(self, name: str) -> bool:
        return len(self.brokers) >= MAX_BROKERS or len(self._sets.get(name, ())) >= MAX_PER_SET

    @property
    def max_timeout_ms(self) -> int:
        """The longest any live broker may stay silent and still count alive (a new leader's grace)."""
        return max((max(b.timeout_ms, b.lease_ms + self.lease_drift_ms if b.lease_ms else 0)
                    for b in self.brokers.values()), default=self.default_timeout_ms)
