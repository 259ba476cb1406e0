"""A master's SyncStateSet and confirm offset (upstream's AutoSwitchHAService),
sans-I/O: times and offsets are passed in, proposals come back for the caller to send to the
controller (alter-sync-state-set).

- `local` is the set the controller last confirmed. A change goes to the controller one at a
  time: `proposed` is the latest one wanted, `in_flight` the one sent and not yet resolved.
  Acks are counted over local | in_flight | proposed (#5663: an expansion committed at the
  controller whose answer was lost must not let the master acknowledge on too few copies;
  nor may a later proposal, or a refusal of it, hide one that may have been committed). An
  in-flight proposal is resolved only by its success or by the controller's set as read
  afterwards (`truth`).
- A slave caught up within the current master epoch is proposed in (expand); one that has
  not caught up for `max_not_catchup_ms`, never connected, or whose connection closed is
  proposed out (shrink). The master itself is always in.
- The confirm offset (the high watermark readers see) is the least ack of the connected
  members of the set; it does not move while a member of the set is not connected (#6662)
  or has not acked yet on its connection (#6728: upstream skipped such a member's -1, and
  so confirmed bytes that member might not have; we wait for its first ack instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class SyncStateTracker:
    local_id: int
    local: frozenset[int] = frozenset()  # confirmed by the controller
    proposed: frozenset[int] | None = None  # wanted, not sent yet (isSynchronizingSyncStateSet)
    in_flight: frozenset[int] | None = None  # sent, outcome unknown
    caught_up_ms: dict[int, int] = field(default_factory=dict)  # slave -> when it was last caught up

    def __post_init__(self) -> None:
        self.local = frozenset(self.local) | {self.local_id}

    @property
    def effective(self) -> frozenset[int]:
        """The set acks are counted over (getSyncStateSet)."""
        return self.local | (self.in_flight or frozenset()) | (self.proposed or frozenset())

    @property
    def in_sync_replicas(self) -> int:
        """inSyncReplicasNums: the largest of the sets while a change is pending."""
        return max(len(s) for s in (self.local, self.in_flight or (), self.proposed or ()))

    @property
    def wanted(self) -> frozenset[int]:
        """The latest set asked for (or the confirmed one)."""
        for s in (self.proposed, self.in_flight):
            if s is not None:
                return s
        return self.local

    def confirmed(self, members: frozenset[int] | set[int]) -> None:
        """The controller confirmed a set (an election, or a proposal's success): it is the
        local set, nothing is in flight; a later wish still to send stays unless it is met."""
        self.local = frozenset(members) | {self.local_id}
        self.in_flight = None
        if self.proposed == self.local:
            self.proposed = None

    def take_proposal(self) -> frozenset[int] | None:
        """The proposal to send now (one at a time), or None."""
        if self.in_flight is not None or self.proposed is None:
            return None
        self.in_flight, self.proposed = self.proposed, None
        return self.in_flight

    def truth(self, members: frozenset[int] | set[int], newer: bool) -> None:
        """The controller's set as read after a proposal failed or got no answer: a newer set
        is confirmed; the same epoch means the in-flight proposal was not applied."""
        if newer:
            self.confirmed(members)
        else:
            self.in_flight = None

    def _propose(self, members: frozenset[int]) -> frozenset[int] | None:
        members = members | {self.local_id}
        if members == self.wanted:
            return None  # already asked for, or already confirmed
        self.proposed = members
        return members

    # --- slave progress ------------------------------------------------------------------

    def on_ack(self, slave: int, caught_up_at: int | None) -> None:
        """Caught-up tracking: `caught_up_at` is when the slave last had everything the master
        had (None: this ack does not show it caught up)."""
        if caught_up_at is not None:
            self.caught_up_ms[slave] = max(self.caught_up_ms.get(slave, 0), caught_up_at)

    def maybe_expand(self, slave: int, ack: int, floor: int, epoch_start: int) -> frozenset[int] | None:
        """The slave joins once it has every byte that may have been acknowledged (`floor`:
        upstream used the confirm offset, which a restarted master underestimates, so a slave
        could join without records already acknowledged) and something of the current master
        epoch: the set to propose, or None."""
        if slave in self.wanted or ack < floor or ack < epoch_start:
            return None
        return self._propose(self.wanted | {slave})

    def maybe_shrink(self, now_ms: int, max_not_catchup_ms: int) -> frozenset[int] | None:
        """Slaves behind for too long, or never heard of, leave: the set to propose, or None."""
        wanted = self.wanted
        keep = frozenset(i for i in wanted if i == self.local_id or (
            i in self.caught_up_ms and now_ms - self.caught_up_ms[i] <= max_not_catchup_ms))
        return self._propose(keep) if keep != wanted else None

    def connection_closed(self, slave: int) -> frozenset[int] | None:
        """The slave leaves at once (removeConnection): the set to propose, or None."""
        self.caught_up_ms.pop(slave, None)
        base = self.wanted
        return self._propose(base - {slave}) if slave in base else None

    # --- the confirm offset ------------------------------------------------------------------

    def confirm_offset(self, acks: Mapping[int, int], master_max: int, current: int) -> int:
        """computeConfirmOffset: `acks` are the connected slaves' acked offsets."""
        members = self.effective
        if any(i != self.local_id and acks.get(i, -1) < 0 for i in members):
            return current  # a member is not connected, or has not acked yet (#6662, #6728)
        return min([master_max, *(a for i, a in acks.items() if i in members and i != self.local_id)])
