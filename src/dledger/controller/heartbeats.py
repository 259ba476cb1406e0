"""Broker liveness on one controller (CONTROLLER.md §1.5, DefaultBrokerHeartbeatManager).

Every controller keeps its own table from the heartbeats brokers send to all of them (it is
not replicated). A broker is alive while its last heartbeat is younger than its timeout. The
connection a heartbeat came on is rebound on every heartbeat, and a closed connection evicts
a broker only if it is still the one its last heartbeat used (#11045: upstream never rebound,
so a stale channel's close evicted a healthy broker and triggered an election).

A broker that holds a master lease (its heartbeat says `lease_ms`) stays alive for at least
lease + drift after its last heartbeat, even when its connection closes: until then it may
still acknowledge writes, and electing another master would make two.

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
    conn: Hashable | None = None
    lease_ms: int = 0

    def alive(self, now_ms: int) -> bool:
        return self.last_ms + self.timeout_ms >= now_ms


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
             conn: Hashable | None = None, lease_ms: int = 0) -> bool:
        """Record a heartbeat (False: refused, the table is full). (epoch, max offset) only
        move forward: a late heartbeat from before a truncation must not make a replica look
        more up to date than it is."""
        timeout = timeout_ms or self.default_timeout_ms
        if lease_ms:
            timeout = max(timeout, lease_ms + self.lease_drift_ms)
        old = self.brokers.get((name, broker_id))
        if old is None:
            if self._full(name):  # the leader's scan expires dead entries every scan interval
                return False
            b = BrokerLive(cluster, address, now_ms, timeout, LiveInfo(epoch, max_offset, priority), confirm_offset,
                           conn, lease_ms)
            self.brokers[(name, broker_id)] = self._sets.setdefault(name, {})[broker_id] = b
            return True
        old.cluster, old.address, old.last_ms, old.timeout_ms, old.conn = cluster, address, now_ms, timeout, conn
        old.lease_ms = lease_ms
        if epoch > old.info.epoch or (epoch == old.info.epoch and max_offset > old.info.max_offset):
            old.info = LiveInfo(epoch, max_offset, priority)
            old.confirm_offset = confirm_offset
        else:
            old.info = LiveInfo(old.info.epoch, old.info.max_offset, priority)
        return True

    def alive(self, name: str, broker_id: int, now_ms: int) -> bool:
        b = self.brokers.get((name, broker_id))
        return b is not None and b.alive(now_ms)

    def live_infos(self, name: str, now_ms: int) -> dict[int, LiveInfo]:
        """The live replicas of one broker set, as the leader writes them into a command."""
        return {i: b.info for i, b in self._sets.get(name, {}).items() if b.alive(now_ms)}

    def expire(self, now_ms: int) -> list[Key]:
        """Drop the brokers whose heartbeats stopped; they are returned (onBrokerInactive)."""
        dead = [k for k, b in self.brokers.items() if not b.alive(now_ms)]
        self._drop(dead)
        return dead

    def connection_closed(self, conn: Hashable) -> list[Key]:
        """A connection closed: the brokers whose *last* heartbeat came on it are gone (one
        holding a lease: once the lease and the drift margin have passed)."""
        gone = [k for k, b in self.brokers.items() if b.conn is not None and b.conn == conn]
        for k in [k for k in gone if self.brokers[k].lease_ms]:
            b = self.brokers[k]
            b.conn, b.timeout_ms = None, b.lease_ms + self.lease_drift_ms
            gone.remove(k)
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
        return max((b.timeout_ms for b in self.brokers.values()), default=self.default_timeout_ms)
