"""QuorumAckChecker: the leader's commit index and the client appends waiting on it.

The commit index is the highest index stored on a majority (in `sync` flush
mode: durable on a majority), counted only for entries of the leader's own
term (Raft's rule; the NOOP a new leader appends makes earlier entries follow).
It never moves backwards. The followers' marks are their `Progress` (core.progress):
the match index, or in `sync` mode the durable prefix they reported. Only the voters of the
configuration in force count (core.configs); learners receive the log and count for nothing.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from dledger.codes import ResponseCode
from dledger.core.member_state import MemberState
from dledger.core.progress import Progress
from dledger.store.base import AppendedBatch, LedgerStore

Complete = Callable[[Any, ResponseCode, AppendedBatch | None, str], None]


class QuorumAckChecker:
    def __init__(self, member: MemberState, store: LedgerStore, complete: Complete,
                 progress: dict[str, Progress], sync: bool) -> None:
        self.member = member
        self.store = store
        self.complete = complete
        self.progress = progress  # per follower; its replication facts hold for the current term only
        self.sync = sync
        self.leader_index = -1  # what the leader itself counts (end, or durable in sync mode)
        self.term_start = 1 << 62  # index of the leader's NOOP: entries from here on are of its term
        # a waiting append is in _items; _by_index orders release, _by_deadline expiry
        self._items: dict[int, tuple[Any, AppendedBatch]] = {}
        self._by_index: list[tuple[int, int]] = []
        self._by_deadline: deque[tuple[int, int]] = deque()  # deadlines grow: a FIFO suffices
        self._seq = itertools.count()

    @property
    def pending(self) -> int:
        return len(self._items)

    def reset(self, term_start: int) -> None:
        """A new term, whose first entry is at `term_start`: watermarks of the old term
        mean nothing for this one (the followers' are cleared by `Progress.begin_term`)."""
        self.leader_index = -1
        self.term_start = term_start

    def add(self, token: Any, result: AppendedBatch, deadline_ms: int, wait_index: int | None = None) -> None:
        """Answer `token` once `wait_index` (default: the result's last index) is committed."""
        seq = next(self._seq)
        self._items[seq] = (token, result)
        heapq.heappush(self._by_index, (result.last_index if wait_index is None else wait_index, seq))
        self._by_deadline.append((deadline_ms, seq))

    def ack_self(self, index: int) -> bool:
        if index > self.leader_index:
            self.leader_index = index
            return self.advance()
        return False

    def advance(self) -> bool:
        """Move the commit index to the quorum watermark; complete covered appends."""
        sync, m, progress = self.sync, self.member, self.progress
        # voters only (learners never count); the leader itself only while it is one (a leader
        # whose removal is pending manages the group without counting itself, thesis §4.2.2)
        marks = [self.leader_index] if m.is_voter else []
        for v in m.other_voters:
            p = progress.get(v)
            marks.append(p.counted(sync) if p is not None else -1)
        marks.sort(reverse=True)
        candidate = marks[m.quorum - 1]
        store = self.store
        if candidate <= store.committed_index or candidate > store.end_index:
            return False
        if candidate < self.term_start:  # an entry of an earlier term (the leader's log has no gaps)
            return False
        store.set_committed(candidate)
        self._release(candidate)
        return True

    def _release(self, committed: int) -> None:
        while self._by_index and self._by_index[0][0] <= committed:
            _, seq = heapq.heappop(self._by_index)
            item = self._items.pop(seq, None)
            if item is not None:
                self.complete(item[0], ResponseCode.SUCCESS, item[1], "")

    def expire(self, now_ms: int) -> None:
        """Fail appends that waited longer than max_wait_ack_ms (their entries may still commit)."""
        while self._by_deadline and self._by_deadline[0][0] <= now_ms:
            _, seq = self._by_deadline.popleft()
            item = self._items.pop(seq, None)
            if item is not None:
                self.complete(item[0], ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, item[1], "no quorum ack in time")

    def fail_all(self, code: ResponseCode, message: str) -> None:
        items, self._items = self._items, {}
        self._by_index.clear()
        self._by_deadline.clear()
        for token, res in items.values():
            self.complete(token, code, res, message)
