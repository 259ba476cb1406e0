"""A master's SyncStateSet and confirm offset (CONTROLLER.md §4.9-§4.10, AutoSwitchHAService),
sans-I/O: times and offsets are passed in, proposals come back for the caller to send to the
controller (alter-sync-state-set).

- `local` is the set the controller last confirmed; while a change is in flight (`proposed`),
  acks are counted over local | proposed (#5663: an expansion committed at the controller
  whose answer was lost must not let the master acknowledge on too few copies).
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
    proposed: frozenset[int] | None = None  # in flight (isSynchronizingSyncStateSet)
    caught_up_ms: dict[int, int] = field(default_factory=dict)  # slave -> when it was last caught up

    def __post_init__(self) -> None:
        self.local = frozenset(self.local) | {self.local_id}

    @property
    def effective(self) -> frozenset[int]:
        """The set acks are counted over (getSyncStateSet)."""
        return self.local | self.proposed if self.proposed is not None else self.local

    @property
    def in_sync_replicas(self) -> int:
        """inSyncReplicasNums: the larger of the two sets while a change is in flight."""
        if self.proposed is not None:
            return max(len(self.local), len(self.proposed))
        return len(self.local)

    def confirmed(self, members: frozenset[int] | set[int]) -> None:
        """The controller confirmed a set (alter SUCCESS, an election, a newer metadata epoch)."""
        self.local = frozenset(members) | {self.local_id}
        self.proposed = None

    def _propose(self, members: frozenset[int]) -> frozenset[int] | None:
        members = members | {self.local_id}
        if members == (self.proposed if self.proposed is not None else self.local):
            return None  # already asked for, or already confirmed
        self.proposed = members
        return members

    # --- slave progress ------------------------------------------------------------------

    def on_ack(self, slave: int, ack: int, master_max: int, last_transfer_max: int, last_transfer_ms: int,
               now_ms: int) -> None:
        """Caught-up tracking (maybeExpandInSyncStateSet on the connection): a slave whose ack
        reaches the master's max offset as of the last transfer was caught up then (now, if it
        has everything)."""
        if ack >= last_transfer_max:
            at = now_ms if ack == master_max else last_transfer_ms
            self.caught_up_ms[slave] = max(self.caught_up_ms.get(slave, 0), at)

    def maybe_expand(self, slave: int, ack: int, confirm_offset: int, epoch_start: int) -> frozenset[int] | None:
        """The slave caught up within the current master epoch joins: the set to propose, or None."""
        if slave in self.effective or ack < confirm_offset or ack < epoch_start:
            return None
        return self._propose(self.effective | {slave})

    def maybe_shrink(self, now_ms: int, max_not_catchup_ms: int) -> frozenset[int] | None:
        """Slaves behind for too long, or never heard of, leave: the set to propose, or None."""
        keep = frozenset(i for i in self.local if i == self.local_id or (
            i in self.caught_up_ms and now_ms - self.caught_up_ms[i] <= max_not_catchup_ms))
        return self._propose(keep) if keep != self.local else None

    def connection_closed(self, slave: int) -> frozenset[int] | None:
        """The slave leaves at once (removeConnection): the set to propose, or None."""
        self.caught_up_ms.pop(slave, None)
        base = self.proposed if self.proposed is not None else self.local
        return self._propose(base - {slave}) if slave in base else None

    # --- the confirm offset ------------------------------------------------------------------

    def confirm_offset(self, acks: Mapping[int, int], master_max: int, current: int) -> int:
        """computeConfirmOffset: `acks` are the connected slaves' acked offsets."""
        members = self.effective
        if any(i != self.local_id and acks.get(i, -1) < 0 for i in members):
            return current  # a member is not connected, or has not acked yet (#6662, #6728)
        return min([master_max, *(a for i, a in acks.items() if i in members)])
