"""Integrity: this member's own records that fail verification, and the scrub that finds them.

DLedger has no such thing; here a member that finds one of its records corrupt (a read, the
scrub of idle ticks, a push, a fold) keeps its log as it is (its end and last term decide votes:
shrinking it could let a candidate lacking committed entries win ours), leaves leadership and
stays out of elections until the leader's copy restored it (REPAIR pushes). Built from the store,
the member's names and the time alone; what follows from a mark (hand-over, step-down) is the
node's: `mark` says whether there is anything to follow, `scrub` returns what it found.
"""

from __future__ import annotations

import logging

from dledger.store.base import CorruptEntryError, LedgerStore, StoreError

log = logging.getLogger(__name__)

# The scrub: in ticks with no append and no push, verify up to this many committed records
# (or bytes), cycling over the log; a pass that reached the commit index waits SCRUB_PAUSE_MS.
SCRUB_ENTRIES = 16
SCRUB_BYTES = 256 << 10
SCRUB_PAUSE_MS = 10_000
SCRUB_BUSY_EVERY = 10  # ticks: a member never idle still verifies one record this often


class Integrity:
    def __init__(self, store: LedgerStore, group: str, self_id: str, now_ms: int) -> None:
        self.store = store
        self._name = f"{group}/{self_id}"
        # (index, reason) of our first record known to fail verification: no leading, no campaign
        self.corrupt: tuple[int, str] | None = None
        self.corruptions_found = 0  # records found corrupt here (metrics)
        self.records_repaired = 0  # records rewritten from the leader's copy (metrics)
        self.scrub_entries = SCRUB_ENTRIES  # per idle tick (0: no scrub)
        self.scrub_next = store.begin_index
        self._scrub_at = now_ms  # a (re)started member checks its log soon
        self.active = False  # an append or a push came since the last tick: no scrub then
        self._busy_ticks = 0  # ticks in a row that were not idle
        self._beyond_repair = -1  # the leader's log begin when it told us it cannot repair us

    @property
    def corrupt_index(self) -> int:
        return self.corrupt[0] if self.corrupt is not None else -1

    def mark(self, index: int, reason: str) -> bool:
        """One of our records fails verification: True if this is news (the first corrupt
        record known, or one before it), and the node must leave leadership or candidacy."""
        known = self.corrupt
        if (known is not None and known[0] <= index) or index < self._beyond_repair:
            return False  # known already, or below what the leader still holds (see beyond_repair)
        self.corrupt = (index, reason)
        self.corruptions_found += 1
        log.error("%s: corrupt record at index %d (committed %d): %s; not leading or campaigning "
                  "until it is repaired from the leader's copy", self._name, index,
                  self.store.committed_index, reason)
        return True

    def repaired(self, first: int, last: int, indexes: list[int], now: int) -> None:
        """The leader's REPAIR push covered [first, last]; `indexes` were rewritten. Once the
        first known corrupt record verifies again the mark clears; the scrub goes on right
        after the range, where more damage may be."""
        self.records_repaired += len(indexes)
        if indexes:
            log.warning("%s: repaired records %s from the leader's copy", self._name, _ranges(indexes))
        c = self.corrupt
        if c is not None and first <= c[0] <= last and self.store.verify(c[0]) is None:
            self.clear(f"record {c[0]} verifies again; no known corrupt record left")
            self.scrub_next, self._scrub_at = last + 1, now

    def beyond_repair(self, leader_begin: int) -> None:
        """The leader's retention deleted everything below `leader_begin`: no member needs our
        copies there and none can restore them. A corrupt one is dropped by our retention in
        time and no longer keeps us from leading (a read of it still fails: never served)."""
        self._beyond_repair = max(self._beyond_repair, leader_begin)
        c = self.corrupt
        if c is not None and c[0] < leader_begin:
            self.clear(f"corrupt record {c[0]} is below the leader's log begin {leader_begin}: "
                       "beyond repair, and needed by no member")

    def is_beyond_repair(self, index: int) -> bool:
        """A leader told us our record `index` is below what any member still holds."""
        return index < self._beyond_repair

    @property
    def readable_from(self) -> int:
        """The first index whose record a state machine can get from this log."""
        return max(self.store.begin_index, self._beyond_repair)

    def forget_beyond_repair(self) -> None:
        """A new leader may still hold what the last one had deleted: a rotten record of ours
        below the old leader's log begin is reported (and repaired) again."""
        self._beyond_repair = -1

    def forget_above(self, end: int) -> None:
        """A truncate removed our records after `end`: a corrupt one among them is gone."""
        if self.corrupt is not None and self.corrupt[0] > end:
            self.clear(f"corrupt record {self.corrupt[0]} removed by a truncate")

    def forget_deleted(self) -> None:
        """Retention deleted our corrupt record: nothing is left to repair."""
        if self.corrupt is not None and self.corrupt[0] < self.store.begin_index:
            self.clear(f"corrupt record {self.corrupt[0]} deleted by retention")

    def clear(self, why: str) -> None:
        log.warning("%s: %s", self._name, why)
        self.corrupt = None

    def scrub(self, now: int) -> list[tuple[int, str]]:
        """Idle ticks verify a few committed records each (body CRC, header, chain link),
        cycling over the log, so damage is found before a read or a lagging follower needs it.
        Returns the corrupt records found, (index, reason), for the node to mark."""
        limit = self.scrub_entries
        if self.active:
            self.active = False
            self._busy_ticks += 1
            if self._busy_ticks < SCRUB_BUSY_EVERY:
                return []
            limit = min(limit, 1)  # under steady load still a record now and then, or rot hides
        self._busy_ticks = 0
        store = self.store
        if limit <= 0 or now < self._scrub_at:
            return []
        found: list[tuple[int, str]] = []
        i = first = max(self.scrub_next, store.begin_index)
        top = store.committed_index
        n = size = 0
        while i <= top and n < limit and size < SCRUB_BYTES:
            try:
                size += store.verify_entry(i).size
            except CorruptEntryError as e:
                found.append((e.index, e.message))
            except StoreError:
                break  # retention moved the log begin meanwhile: next tick
            i += 1
            n += 1
        if i > first:
            store.release_pages(first, i - 1)  # one pass over a large log would leave all of it resident
        if i > top:
            self.scrub_next, self._scrub_at = store.begin_index, now + SCRUB_PAUSE_MS
        else:
            self.scrub_next = i
        return found


def _ranges(indexes: list[int]) -> str:
    """[3, 4, 5, 9] -> "3..5, 9"."""
    out: list[str] = []
    start = prev = indexes[0]
    for i in indexes[1:]:
        if i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}..{prev}")
        start = prev = i
    out.append(str(start) if start == prev else f"{start}..{prev}")
    return ", ".join(out)
