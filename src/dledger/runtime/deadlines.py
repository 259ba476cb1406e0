"""Request timeouts kept by one loop timer per client instead of one timer per request.

A `loop.call_later` and its `cancel` cost ~3 us per request under uvloop, a twentieth of
what a client spends on an append (docs/performance.md, "The client's own cost"). Here a
request's deadline is rounded up to the next tick of `TICK_S` and its entry joins that
tick's list; one timer is armed for the earliest tick, and when it fires every entry of
the ticks due is handed to `expire`, which looks the request up by its key and fails it
only if it is still unanswered. An answered request is not touched on its way back.

An entry holds only what `expire` needs to find and describe the request (its owner's
table of requests in flight, its id, what to say): never its future, its frame or its
answer, so a request answered long before its deadline costs a small tuple until then,
not its bytes (a slow request does not hold back the memory of the fast ones behind it).
A timeout fires never early, and late by at most a tick and a millisecond (plus whatever
keeps the loop from running its timers). Timeouts must be finite and positive.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Any

__all__ = ["TICK_S", "Deadlines"]

# Deadlines are kept to this resolution: a timeout fires up to this much late. The shortest
# timeouts in use are a member's (a vote's 0.5 s), for which 5 ms is noise.
TICK_S = 0.005
# A loop's timer may fire this much before its time (uvloop keeps time in milliseconds and
# rounds a delay to them): a tick ends this much after the deadlines it holds, and is due
# this much before its end, so nothing expires early and the timer never has to be armed
# again for an instant the loop's clock has not reached (a busy spin of up to a millisecond).
_EARLY_S = 0.001


class Deadlines:
    """Calls `expire(*args)` once for each entry added, at or after its deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[..., None]) -> None:
        self.loop = loop
        self._expire = expire
        self._ticks: dict[int, list[tuple[Any, ...]]] = {}  # tick -> entries due at its end
        self._heap: list[int] = []  # the ticks of _ticks, earliest first
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf  # the tick the timer fires for

    def add(self, timeout: float, *args: Any) -> None:
        tick = math.ceil((self.loop.time() + timeout + _EARLY_S) / TICK_S)
        entries = self._ticks.get(tick)
        if entries is None:
            entries = self._ticks[tick] = []
            heapq.heappush(self._heap, tick)
            if tick < self._armed_for:
                self._arm(tick)
        entries.append(args)

    def __len__(self) -> int:
        return sum(map(len, self._ticks.values()))

    def close(self) -> None:
        """Stop the timer and forget every entry; the requests are the owner's to fail."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for = None, math.inf
        self._ticks.clear()
        self._heap.clear()

    def _arm(self, tick: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = tick
        self._timer = self.loop.call_at(tick * TICK_S, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_for = None, math.inf
        due = self.loop.time() + _EARLY_S
        heap = self._heap
        while heap and heap[0] * TICK_S <= due:
            for args in self._ticks.pop(heapq.heappop(heap)):
                self._expire(*args)
        if heap:
            self._arm(heap[0])
