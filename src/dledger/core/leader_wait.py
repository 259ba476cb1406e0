"""Leader searches parked until this member leads (METADATA with `wait_ms`).

A client whose leader stopped answering asks every member at once who leads. While the
survivors still wait out the dead leader's lease nobody claims to, so rather than polling
on a back-off the client asks with `wait_ms`: a member that does not lead keeps the
request here and answers it the moment it wins an election, or with its view as it is
when the wait runs out. The client thus learns the new leader within a round trip of its
election. Pure bookkeeping: the node answers what `take_all` and `expired` hand back.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Any

MAX_WAIT_MS = 10_000  # a longer wait is cut to this: the client asks again
MAX_PARKED = 10_000  # searches waiting at once; past it a METADATA is answered at once
# one principal (certificate or token name; "" for anonymous loopback callers) may hold at
# most this many, so one caller's flood cannot unpark everyone else's searches
MAX_PARKED_PER_PRINCIPAL = MAX_PARKED // 4


class LeaderWaits:
    def __init__(self) -> None:
        self._by_deadline: list[tuple[int, int, Any, str]] = []  # (deadline, seq, token, principal): a heap
        self._seq = itertools.count()
        self._per_principal: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._by_deadline)

    def park(self, token: Any, now: int, wait_ms: int, principal: str = "") -> bool:
        """False when full, or `principal` holds its share: answer the request at once."""
        if len(self._by_deadline) >= MAX_PARKED or self._per_principal[principal] >= MAX_PARKED_PER_PRINCIPAL:
            return False
        heapq.heappush(self._by_deadline, (now + min(wait_ms, MAX_WAIT_MS), next(self._seq), token, principal))
        self._per_principal[principal] += 1
        return True

    def take_all(self) -> list[Any]:
        """Every parked request (this member now leads): answer them all."""
        tokens = [t for _, _, t, _ in self._by_deadline]
        self._by_deadline = []
        self._per_principal.clear()
        return tokens

    def expired(self, now: int) -> list[Any]:
        """The requests whose wait ran out by `now`, earliest first."""
        out: list[Any] = []
        heap = self._by_deadline
        while heap and heap[0][0] <= now:
            _, _, token, principal = heapq.heappop(heap)
            out.append(token)
            self._per_principal[principal] -= 1
            if not self._per_principal[principal]:
                del self._per_principal[principal]
        return out
