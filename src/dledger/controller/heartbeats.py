"""Broker liveness on one controller (CONTROLLER.md §1.5, DefaultBrokerHeartbeatManager).

Every controller keeps its own table from the heartbeats brokers send to all of them (it is
not replicated). A broker is alive while its last heartbeat is younger than its timeout. The
connection a heartbeat came on is rebound on every heartbeat, and a closed connection evicts
a broker only if it is still the one its last heartbeat used (#11045: upstream never rebound,
so a stale channel's close evicted a healthy broker and triggered an election).

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

    def alive(self, now_ms: int) -> bool:
        return self.last_ms + self.timeout_ms >= now_ms


class HeartbeatTable:
    def __init__(self, default_timeout_ms: int) -> None:
        self.default_timeout_ms = default_timeout_ms
        self.brokers: dict[Key, BrokerLive] = {}

    def beat(self, cluster: str, name: str, broker_id: int, address: str, now_ms: int, *, timeout_ms: int = 0,
             epoch: int = -1, max_offset: int = -1, confirm_offset: int = -1, priority: int = PRIORITY_DEFAULT,
             conn: Hashable | None = None) -> None:
        """Record a heartbeat. (epoch, max offset) only move forward: a late heartbeat from
        before a truncation must not make a replica look more up to date than it is."""
        timeout = timeout_ms or self.default_timeout_ms
        old = self.brokers.get((name, broker_id))
        if old is None:
            self.brokers[(name, broker_id)] = BrokerLive(cluster, address, now_ms, timeout,
                                                         LiveInfo(epoch, max_offset, priority), confirm_offset, conn)
            return
        old.cluster, old.address, old.last_ms, old.timeout_ms, old.conn = cluster, address, now_ms, timeout, conn
        if epoch > old.info.epoch or (epoch == old.info.epoch and max_offset > old.info.max_offset):
            old.info = LiveInfo(epoch, max_offset, priority)
            old.confirm_offset = confirm_offset
        else:
            old.info = LiveInfo(old.info.epoch, old.info.max_offset, priority)

    def alive(self, name: str, broker_id: int, now_ms: int) -> bool:
        b = self.brokers.get((name, broker_id))
        return b is not None and b.alive(now_ms)

    def live_infos(self, name: str, now_ms: int) -> dict[int, LiveInfo]:
        """The live replicas of one broker set, as the leader writes them into a command."""
        return {i: b.info for (n, i), b in self.brokers.items() if n == name and b.alive(now_ms)}

    def expire(self, now_ms: int) -> list[Key]:
        """Drop the brokers whose heartbeats stopped; they are returned (onBrokerInactive)."""
        dead = [k for k, b in self.brokers.items() if not b.alive(now_ms)]
        for k in dead:
            del self.brokers[k]
        return dead

    def connection_closed(self, conn: Hashable) -> list[Key]:
        """A connection closed: the brokers whose *last* heartbeat came on it are gone."""
        gone = [k for k, b in self.brokers.items() if b.conn is not None and b.conn == conn]
        for k in gone:
            del self.brokers[k]
        return gone

    @property
    def max_timeout_ms(self) -> int:
        return max((b.timeout_ms for b in self.brokers.values()), default=self.default_timeout_ms)
