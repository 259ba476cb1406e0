"""The master's HA service (upstream's AutoSwitchHAService), sans-I/O: its slaves'
connections, the SyncStateSet, the confirm offset and the producer-ack rule.

Connections are keyed by whatever the runtime uses for them. Proposals to change the
SyncStateSet come back from `on_data`, `closed` and `shrink` for the runtime to send to the
controller; `set_sync_state_set` is what the controller confirmed. The confirm offset here is
always the least ack of the set's members (upstream used the master's max offset unless
all-ack was on: readers saw records that a failover could still lose).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig, HAProtocolError, MasterConnection
from dledger.broker.log import BrokerLog
from dledger.broker.sync_state import SyncStateTracker

ALL_ACK = -1  # MixAll.ALL_ACK_IN_SYNC_STATE_SET


@dataclass(frozen=True)
class AckSettings:
    """how many copies a send waits for (the master counts)."""

    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    all_ack: bool = False  # allAckInSyncStateSet

    @property
    def need(self) -> int:
        return ALL_ACK if self.all_ack else self.in_sync_replicas


class MasterHA:
    def __init__(self, broker_id: int, log: BrokerLog, epochs: EpochFileCache, config: HAConfig,
                 sync_state_set: frozenset[int] | set[int] = frozenset(), confirm_offset: int = -1,
                 durable_only: bool = False, bindings: Mapping[int, str] | None = None) -> None:
        """`bindings`: broker id -> the certificate name the controller bound to it (kept up to
        date by the owner, in place); a TLS slave must handshake as its own id."""
        self.broker_id, self.log, self.epochs, self.config = broker_id, log, epochs, config
        self.bindings: Mapping[int, str] = bindings if bindings is not None else {}
        # flush=sync: the master's own copy counts for the confirm offset only once fsynced (a
        # power loss must not take back what readers saw)
        self.durable_only = durable_only
        self.tracker = SyncStateTracker(broker_id, frozenset(sync_state_set))
        self.connections: dict[Hashable, MasterConnection] = {}
        self.confirm_offset = min(confirm_offset, log.max_offset)  # what this broker confirmed before
        # the end of what may have been acknowledged to producers: all of the log at takeover
        # (a restarted master does not know what it acknowledged), then every ack's end
        self.acked_offset = log.max_offset
        # slave id -> (its last ack, when): retention keeps what a slave heard from recently
        # needs, connected or not (a restarting slave must find its next record still here)
        self.heard: dict[int, tuple[int, int]] = {}
        self.recompute_confirm()

    # --- connections -------------------------------------------------------------------------

    def opened(self, key: Hashable, now_ms: int, principal: str | None = None) -> MasterConnection:
        """A slave connected; `principal`: its certificate name (None: no TLS)."""
        conn = self.connections[key] = MasterConnection(self.log, self.epochs, now_ms, self.config, self.broker_id,
                                                        principal, self.bindings)
        return conn

    def on_data(self, key: Hashable, data: bytes, now_ms: int) -> frozenset[int] | None:
        """Bytes from a slave; a SyncStateSet to propose, or None. A connection that handshakes
        as a slave already connected replaces the older one (which is dropped: its runtime
        finds it gone); of a read's acks only the last counts (a flood costs one update)."""
        conn = self.connections.get(key)
        if conn is None:
            raise HAProtocolError("the connection was replaced by a newer one of the same slave")
        before = conn.slave_id
        acks = conn.receive(data, now_ms)
        if before == -1 and conn.slave_id != -1:
            for k, other in list(self.connections.items()):
                if k != key and other.slave_id == conn.slave_id:
                    del self.connections[k]
        if acks:
            self.heard[conn.slave_id] = (acks[-1], now_ms)
        if not acks or conn.async_learner:
            return None
        ack = acks[-1]
        self.tracker.on_ack(conn.slave_id, conn.caught_up_at(ack, now_ms))
        start = self.epochs.entries[-1].start if self.epochs.entries else 0
        floor = max(self.confirm_offset, self.acked_offset)
        proposal = self.tracker.maybe_expand(conn.slave_id, ack, floor, start)
        self.recompute_confirm()
        return proposal

    def closed(self, key: Hashable) -> frozenset[int] | None:
        """A connection is gone; its slave is proposed out of the set (removeConnection)."""
        conn = self.connections.pop(key, None)  # (a replaced one is gone already: no proposal)
        if conn is None or conn.slave_id == -1:
            return None
        return self.tracker.connection_closed(conn.slave_id)

    # --- the SyncStateSet ----------------------------------------------------------------------

    def shrink(self, now_ms: int) -> frozenset[int] | None:
        return self.tracker.maybe_shrink(now_ms, self.config.max_not_catchup_ms)

    def set_sync_state_set(self, members: frozenset[int] | set[int]) -> None:
        self.tracker.confirmed(members)
        self.recompute_confirm()

    def sync_state_set_read(self, members: frozenset[int] | set[int], newer: bool) -> None:
        """The controller's set, read after a proposal failed or went unanswered."""
        self.tracker.truth(members, newer)
        self.recompute_confirm()

    # --- confirm offset and acks ---------------------------------------------------------------

    def _acks(self) -> dict[int, int]:
        """Each connected slave's ack (one connection per slave: on_data keeps the newest)."""
        return {c.slave_id: c.ack_offset for c in self.connections.values()
                if c.slave_id != -1 and not c.async_learner}

    def slaves(self) -> list[tuple[int, int, bool]]:
        """(slave id, acked offset, async learner) of each slave that handshook: what an
        operator sees (GET_BROKER_RUNTIME_INFO); -1: no ack yet on its connection."""
        return sorted((c.slave_id, c.ack_offset, c.async_learner) for c in self.connections.values()
                      if c.slave_id != -1)

    def recompute_confirm(self) -> int:
        """The confirm offset only grows (a connection that re-handshakes acks less at first)."""
        mine = self.log.durable_offset if self.durable_only else self.log.max_offset
        c = self.tracker.confirm_offset(self._acks(), mine, self.confirm_offset)
        self.confirm_offset = max(self.confirm_offset, c)
        return self.confirm_offset

    def refuse_reason(self, acks: AckSettings) -> str | None:
        """Why a send is refused before it is written (IN_SYNC_REPLICAS_NOT_ENOUGH), or None."""
        n = self.tracker.in_sync_replicas
        if n < acks.min_in_sync_replicas:
            return f"in-sync replicas not enough: {n} in the SyncStateSet, min-in-sync-replicas is " \
                   f"{acks.min_in_sync_replicas}"
        return None

    def acked(self, next_offset: int, need: int) -> bool:
        """GroupTransferService: are the bytes up to `next_offset` on enough replicas? (True:
        the caller acknowledges them, so they count as acknowledged from now on.)"""
        ok = self._acked(next_offset, need)
        if ok:
            self.acked_offset = max(self.acked_offset, next_offset)
        return ok

    def _acked(self, next_offset: int, need: int) -> bool:
        if need in (0, 1):
            return True
        if need == ALL_ACK:
            members = self.tracker.effective
            if len(members) <= 1:
                return True
            acks = self._acks()
            return 1 + sum(1 for i in members if i != self.broker_id and acks.get(i, -1) >= next_offset) >= len(members)
        # upstream counted any connection here, a learner's or a non-member's too ([finding]): members only
        acks = self._acks()
        members = self.tracker.effective
        return 1 + sum(1 for i, a in acks.items() if i in members and a >= next_offset) >= need
