"""Who becomes master of a broker set (upstream's DefaultElectPolicy).

Candidates are the SyncStateSet's live replicas (with unclean election, then any live
replica). The old master stays while it is alive (unless an admin names another); an admin's
preferred id wins only if it is a live candidate — no fallback to another. Otherwise the
most up-to-date candidate: higher heartbeat epoch, then higher max offset, then the lower
election priority value, then the lower id (deterministic, where upstream takes HashSet
order). Offsets are compared as integers: upstream's `(int)(a - b)` overflowed past 2 GiB and
could pick the less up-to-date replica (#10578).

After the master restarted (it may have lost an unflushed tail that a slave holds), facts
count only if reported after the restart (`unreported`): a broker's `view` is the highest
master epoch the controller had told it when it reported, and the restart moved that epoch
on, so a report at or past it was sent after the old master process was gone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import msgspec

PRIORITY_DEFAULT = 2**31 - 1  # Integer.MAX_VALUE: no priority set


class LiveInfo(msgspec.Struct, frozen=True, array_like=True):
    """What a broker's last heartbeat said about it (written into the controller's log entries:
    the leader's liveness facts, so apply stays deterministic)."""

    epoch: int = 0
    max_offset: int = 0
    election_priority: int = PRIORITY_DEFAULT
    view: int = -1  # ours: the highest master epoch the controller had told the broker when it reported


def unreported(candidates: Collection[int], live: Mapping[int, LiveInfo], since: int) -> list[int]:
    """The live candidates whose facts were reported before master epoch `since` (stale: an
    election ranking them could prefer a restarted master that lost the tail they hold)."""
    return sorted(i for i in candidates if i in live and live[i].view < since)


def elect(sync_state_set: Collection[int] | None, all_replicas: Collection[int] | None, old_master: int | None,
          prefer: int | None, alive: Callable[[int], bool],
          live_info: Callable[[int], LiveInfo | None] | None = None) -> int | None:
    """The new master, or None when no candidate qualifies. `all_replicas` is given only
    with unclean election enabled."""
    m = _try(sync_state_set, old_master, prefer, alive, live_info) if sync_state_set is not None else None
    if m is None and all_replicas is not None:
        m = _try(all_replicas, old_master, prefer, alive, live_info)
    return m


def _try(brokers: Collection[int], old_master: int | None, prefer: int | None, alive: Callable[[int], bool],
         live_info: Callable[[int], LiveInfo | None] | None) -> int | None:
    candidates = sorted(b for b in brokers if alive(b))
    if not candidates:
        return None
    if old_master in candidates and (prefer is None or prefer == old_master):
        return old_master
    if prefer is not None:
        return prefer if prefer in candidates else None
    if live_info is None:
        return candidates[0]

    def rank(b: int) -> tuple[int, int, int, int]:
        info = live_info(b) or LiveInfo()
        return (-info.epoch, -info.max_offset, info.election_priority, b)

    return min(candidates, key=rank)
