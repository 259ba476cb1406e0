"""Request timeouts kept by one loop timer per client instead of one timer per request.

A `loop.call_later` and its `cancel` cost ~3 us per request under uvloop, a twentieth of
what a client spends on an append (docs/performance.md, "The client's own cost"). Requests
with the same timeout expire in the order they were sent, so each timeout value keeps a
FIFO queue, and one timer is armed for the earliest deadline at the heads. A request
answered in time is not touched on its way back: its entry leaves when it reaches the head
of its queue (on the next `add`, or when the timer fires), so a queue holds about the
requests in flight.

A process uses a handful of timeouts (a client's request timeout, a member's push and
heartbeat timeouts), but a call's last attempt gets what is left of its deadline, a new
value each time: past `MAX_QUEUES` values an entry gets a timer of its own, as before, so
the queues stay few and a timer's turn never walks many of them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")

# The loop's timers have millisecond resolution: a deadline this close is due when the timer
# fires (else it would be armed again for the same instant, and spin until the clock moves).
_SLACK_S = 0.001

MAX_QUEUES = 16

_Entry = tuple[float, "asyncio.Future[Any]", tuple[Any, ...]]  # (deadline, future, leave's arguments)


class Deadlines(Generic[T]):
    """Each future added leaves with `leave(fut, *args)`: at its deadline, or earlier once it
    is done and reached its queue's head. `leave` fails a future nobody answered with a
    timeout, and forgets the request; it may be called twice for an entry with a timer of
    its own (at the deadline, and when the future it failed is done), so it must do nothing
    for a future already left."""

    def __init__(self, loop: asyncio.AbstractEventLoop, leave: Callable[..., None]) -> None:
        self.loop = loop
        self._leave = leave
        self._queues: dict[float, deque[_Entry]] = {}  # timeout -> entries, deadlines ascending
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = float("inf")

    def add(self, timeout: float, fut: asyncio.Future[T], *args: Any) -> None:
        deadline = self.loop.time() + timeout
        queue = self._queues.get(timeout)
        if queue is None:
            if len(self._queues) >= MAX_QUEUES:
                self._add_alone(deadline, fut, args)
                return
            queue = self._queues[timeout] = deque()
        else:
            while queue and queue[0][1].done():  # answered (or cancelled): no timeout left to keep
                _, done, done_args = queue.popleft()
                self._leave(done, *done_args)
        queue.append((deadline, fut, args))
        if deadline < self._armed_for:
            self._arm(deadline)

    def _add_alone(self, deadline: float, fut: asyncio.Future[T], args: tuple[Any, ...]) -> None:
        """A timer of the entry's own, cancelled when its future is done (then it leaves)."""
        timer = self.loop.call_at(deadline, self._leave, fut, *args)

        def done(_: asyncio.Future[T]) -> None:
            timer.cancel()
            self._leave(fut, *args)

        fut.add_done_callback(done)

    def __len__(self) -> int:
        return sum(map(len, self._queues.values()))

    def close(self) -> None:
        """Stop the timer and forget every entry; their futures are the owner's to fail."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for = None, float("inf")
        self._queues.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deadline
        self._timer = self.loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_for = None, float("inf")
        due = self.loop.time() + _SLACK_S
        earliest = float("inf")
        for timeout, queue in list(self._queues.items()):
            while queue and (queue[0][0] <= due or queue[0][1].done()):
                _, fut, args = queue.popleft()
                self._leave(fut, *args)
            if queue:
                earliest = min(earliest, queue[0][0])
            else:
                del self._queues[timeout]
        if earliest != float("inf"):
            self._arm(earliest)
