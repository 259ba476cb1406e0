"""Long-poll READs (`subscribe`, `dledger read --follow`): a READ for an index not committed
yet waits here, up to its `wait_ms`, instead of failing INDEX_OUT_OF_RANGE, so a follower of
the log gets each entry as soon as it commits without polling. Pure bookkeeping: the node
answers what `pop_due` and `expired` hand back, a budget of answer bytes per drain (one big
append releasing many polls is answered over several drains, in index order)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_WAIT_MS = 60_000  # a longer wait is cut to this: the client asks again
MAX_PARKED = 10_000  # reads waiting at once; past it a READ is answered at once (empty)


@dataclass(order=True, slots=True)
class ParkedRead:
    start: int  # answered once the commit index reaches it
    seq: int
    deadline: int = field(compare=False)  # then answered with no entries
    local: bool = field(compare=False)
    answer: Callable[[], int] = field(compare=False)  # builds and sends the READ's answer; its bytes
    token: Any = field(compare=False)


class LongPolls:
    def __init__(self) -> None:
        self._by_start: list[ParkedRead] = []
        self._seq = itertools.count()
        self._next_deadline = 1 << 62  # the earliest deadline (a lower bound after `due` popped some)

    def __len__(self) -> int:
        return len(self._by_start)

    def park(self, start: int, deadline: int, local: bool, answer: Callable[[], int], token: Any) -> bool:
        """False when full: answer the READ at once."""
        if len(self._by_start) >= MAX_PARKED:
            return False
        heapq.heappush(self._by_start, ParkedRead(start, next(self._seq), deadline, local, answer, token))
        self._next_deadline = min(self._next_deadline, deadline)
        return True

    def pop_due(self, committed: int) -> ParkedRead | None:
        """The parked read with the lowest index, if that index has committed (one at a time:
        the node stops when its drain's budget is spent, the rest stay for the next)."""
        if self._by_start and self._by_start[0].start <= committed:
            return heapq.heappop(self._by_start)
        return None

    def expired(self, now: int) -> list[ParkedRead]:
        """Reads whose wait is over (checked every tick: O(1) until the earliest deadline)."""
        if now < self._next_deadline:
            return []
        out = [r for r in self._by_start if r.deadline <= now]
        self._by_start = [r for r in self._by_start if r.deadline > now]
        heapq.heapify(self._by_start)
        self._next_deadline = min((r.deadline for r in self._by_start), default=1 << 62)
        return out

    def take_leader_reads(self) -> list[ParkedRead]:
        """The reads that needed us to lead (not `local`): we no longer do."""
        out = [r for r in self._by_start if not r.local]
        if out:
            self._by_start = [r for r in self._by_start if r.local]
            heapq.heapify(self._by_start)
        return out
