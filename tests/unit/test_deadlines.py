"""runtime.deadlines: request timeouts kept by one loop timer per client (docs/performance.md,
"The client's own cost"), on both loops the transport runs on."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
import uvloop

from dledger.runtime.deadlines import TICK_S, Deadlines

LOOPS = ["asyncio", "uvloop"]


def _run(loop_kind: str, coro: Any) -> Any:
    factory = uvloop.new_event_loop if loop_kind == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(asyncio.wait_for(coro, 15))


@pytest.mark.parametrize("loop", LOOPS)
def test_each_entry_expires_once_at_or_after_its_deadline_and_within_a_tick_or_so(loop: str) -> None:
    """Mixed timeouts (a call's last attempt gets what is left of its deadline: a new value
    each time), added in any order: each expires once, never early."""

    async def main() -> list[tuple[float, float]]:
        lp = asyncio.get_running_loop()
        fired: list[tuple[float, float]] = []  # (deadline, when expired)
        deadlines = Deadlines(lp, lambda due: fired.append((due, lp.time())))
        for k in range(300):
            timeout = 0.02 + (k * 7919 % 300) * 0.0007  # 20..230 ms, shuffled
            deadlines.add(timeout, lp.time() + timeout)
        while len(fired) < 300:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        return fired

    fired = _run(loop, main())
    assert len(fired) == 300
    assert min(when - due for due, when in fired) >= 0, "a timeout must not fire early"
    # late by a tick plus the loop's own lateness, which a loaded machine stretches: the
    # bound only says the entries do not wait for some later timer
    assert max(when - due for due, when in fired) < TICK_S + 0.5


@pytest.mark.parametrize("loop", LOOPS)
def test_a_shorter_timeout_added_later_fires_first(loop: str) -> None:
    async def main() -> list[str]:
        lp = asyncio.get_running_loop()
        fired: list[str] = []
        deadlines = Deadlines(lp, fired.append)
        deadlines.add(5.0, "long")
        deadlines.add(0.05, "short")
        while not fired:
            await asyncio.sleep(0.01)
        deadlines.close()
        return fired

    assert _run(loop, main()) == ["short"]


@pytest.mark.parametrize("loop", LOOPS)
def test_entries_of_one_tick_share_it_and_the_ticks_leave_when_due(loop: str) -> None:
    async def main() -> tuple[int, int, int, int]:
        lp = asyncio.get_running_loop()
        fired: list[int] = []
        deadlines = Deadlines(lp, fired.append)
        started = time.monotonic()
        for k in range(1000):
            deadlines.add(0.1, k)
        spread = math.ceil((time.monotonic() - started) / TICK_S) + 2  # (a descheduled process)
        ticks = len(deadlines._ticks)
        while len(fired) < 1000:
            await asyncio.sleep(0.01)
        assert sorted(fired) == list(range(1000))
        return ticks, spread, len(deadlines), len(deadlines._heap)

    ticks, spread, left, heap = _run(loop, main())
    assert ticks <= spread, "entries added within one tick share it"
    assert left == 0 and heap == 0


def test_close_stops_the_timer() -> None:
    async def main() -> list[str]:
        lp = asyncio.get_running_loop()
        fired: list[str] = []
        deadlines = Deadlines(lp, fired.append)
        deadlines.add(0.05, "x")
        deadlines.close()
        await asyncio.sleep(0.15)
        return fired

    assert _run("asyncio", main()) == []
