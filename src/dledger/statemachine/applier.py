"""Applier: what goes to the state machine next, and who waits for which result (pure).

The node owns one when its group has a state machine. Committed entries are handed out in
index order, one batch at a time (`next_batch`); the runtime applies the batch off the event
loop and reports it back (`applied`). Only NORMAL entries reach the state machine; NOOP and
configuration entries advance the applied index alone. A proposer (an APPEND that asked for
results) waits here from the moment its entries commit until they are applied; a query waits
until the applied index reaches its read index. Nothing here touches a thread or a file.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dledger.entry import MAGIC_NORMAL
from dledger.statemachine.api import AppliedEntry
from dledger.store.base import LedgerStore

APPLY_MAX_ENTRIES = 4096
APPLY_MAX_BYTES = 4 << 20
MAX_WAITING_QUERIES = 10_000


@dataclass(slots=True)
class ApplyBatch:
    first: int  # first log index covered (NORMAL or not)
    last: int  # last log index covered
    entries: list[AppliedEntry]  # the NORMAL ones, for the state machine
    size: int  # bytes of their bodies


@dataclass(slots=True)
class Proposal:
    token: Any
    first: int
    last: int
    term: int
    positions: list[int]
    results: list[bytes] = field(default_factory=list)


@dataclass(order=True, slots=True)
class WaitingQuery:
    read_index: int
    seq: int
    token: Any = field(compare=False)
    request: bytes = field(compare=False)
    deadline: int = field(compare=False, default=1 << 62)


class Applier:
    def __init__(self, applied_index: int, snapshot_index: int = -1) -> None:
        self.applied_index = applied_index  # last index whose effect is in the state machine
        self.handed_index = applied_index  # last index handed out (applied or being applied)
        self.in_flight: ApplyBatch | None = None
        self.snapshot_index = snapshot_index  # last index of the newest snapshot taken or restored
        self.snapshotting = False
        self.installing = False  # a snapshot from the leader replaces the state: nothing is applied meanwhile
        self.bytes_since_snapshot = 0
        self.stopped: str | None = None  # the state machine failed: nothing more is applied
        self._proposals: dict[int, Proposal] = {}  # by last index
        self._queries: list[WaitingQuery] = []
        self._seq = itertools.count()

    @property
    def entries_since_snapshot(self) -> int:
        return self.applied_index - self.snapshot_index

    # --- batches -----------------------------------------------------------------------------

    def next_batch(self, store: LedgerStore) -> ApplyBatch | None:
        """The next committed entries to apply, or None (one batch at a time; none pending)."""
        if self.in_flight is not None or self.stopped is not None or self.installing:
            return None
        top = store.committed_index
        first = self.handed_index + 1
        if first > top:
            return None
        if first < store.begin_index:  # the log before it is gone: only a snapshot can help
            return None
        got = store.read(first, min(APPLY_MAX_ENTRIES, top - first + 1), APPLY_MAX_BYTES)
        entries = [AppliedEntry(e.index, e.term, e.body) for e in got if e.magic == MAGIC_NORMAL]
        last = got[-1].index if got else first - 1
        if last < first:
            return None
        batch = ApplyBatch(first, last, entries, sum(len(e.body) for e in entries))
        self.in_flight, self.handed_index = batch, last
        return batch

    def applied(self, results: list[bytes]) -> Iterator[Proposal]:
        """The batch in flight was applied with these results (one per NORMAL entry); yields
        the proposals now complete."""
        batch = self.in_flight
        assert batch is not None, "applied() without a batch in flight"
        if len(results) != len(batch.entries):
            raise ValueError(f"the state machine returned {len(results)} results for {len(batch.entries)} entries")
        self.in_flight = None
        self.applied_index = batch.last
        self.bytes_since_snapshot += batch.size
        if not self._proposals:
            return
        # a proposal may span batches (more than a batch's entries or bytes, or a commit index
        # that moved half-way): each batch fills its part of the results
        by_index = {e.index: r for e, r in zip(batch.entries, results, strict=True)}
        for p in self._proposals.values():
            for i in range(max(p.first, batch.first), min(p.last, batch.last) + 1):
                if i in by_index:
                    p.results[i - p.first] = by_index[i]
        for last in sorted(k for k in self._proposals if k <= batch.last):
            yield self._proposals.pop(last)

    def fail(self, reason: str) -> None:
        """The state machine raised: the state may be half-changed; apply no more."""
        self.stopped = reason
        self.in_flight = None

    # --- waiters -----------------------------------------------------------------------------

    def wait_proposal(self, p: Proposal) -> None:
        """Entries first..last committed; their results come when they are applied. (They are
        never applied before they commit, so this always comes first.) Entries that are not
        NORMAL have no result (b"")."""
        p.results = [b""] * (p.last - p.first + 1)
        self._proposals[p.last] = p

    def drop_proposals(self) -> list[Proposal]:
        out, self._proposals = list(self._proposals.values()), {}
        return out

    def wait_query(self, read_index: int, token: Any, request: bytes, deadline: int = 1 << 62) -> bool:
        """Run the query once the state includes `read_index`; False when too many wait."""
        if len(self._queries) >= MAX_WAITING_QUERIES:
            return False
        heapq.heappush(self._queries, WaitingQuery(read_index, next(self._seq), token, request, deadline))
        return True

    def expired_queries(self, now: int) -> list[WaitingQuery]:
        """Queries past their deadline (a slow or stuck state machine): answered TIMEOUT."""
        if not self._queries or all(q.deadline > now for q in self._queries):
            return []
        out = [q for q in self._queries if q.deadline <= now]
        self._queries = [q for q in self._queries if q.deadline > now]
        heapq.heapify(self._queries)
        return out

    def due_queries(self) -> list[WaitingQuery]:
        """Queries whose read index is applied: run them now, before the next batch."""
        out = []
        while self._queries and self._queries[0].read_index <= self.applied_index:
            out.append(heapq.heappop(self._queries))
        return out

    def drop_queries(self) -> list[WaitingQuery]:
        out, self._queries = self._queries, []
        return out

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot_due(self, threshold_entries: int, threshold_bytes: int) -> bool:
        if self.snapshotting or self.stopped is not None or self.applied_index <= self.snapshot_index:
            return False
        return (0 < threshold_entries <= self.entries_since_snapshot) or (
            0 < threshold_bytes <= self.bytes_since_snapshot
        )

    def snapshot_taken(self, last_index: int) -> None:
        self.snapshotting = False
        if last_index > self.snapshot_index:
            self.snapshot_index = last_index
            self.bytes_since_snapshot = 0

    def installed(self, last_index: int) -> Iterator[Proposal]:
        """The state was replaced by a snapshot through `last_index` (InstallSnapshot): apply
        from there on. Yields the proposals whose results are lost with the old state (their
        entries committed; the snapshot holds their effect but not their results)."""
        self.installing = False
        self.in_flight = None
        self.applied_index = self.handed_index = self.snapshot_index = last_index
        self.bytes_since_snapshot = 0
        for last in sorted(k for k in self._proposals if k <= last_index):
            yield self._proposals.pop(last)
