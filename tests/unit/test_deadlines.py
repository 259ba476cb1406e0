"""runtime.deadlines: request timeouts kept by one loop timer per client (docs/performance.md,
"The client's own cost"), on both loops the transport runs on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop

from dledger.runtime.deadlines import MAX_QUEUES, Deadlines

LOOPS = ["asyncio", "uvloop"]


def _run(loop_kind: str, coro: Any) -> Any:
    factory = uvloop.new_event_loop if loop_kind == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def _timeout(fut: asyncio.Future[str], left: list[str], name: str) -> None:
    left.append(name)
    if not fut.done():
        fut.set_exception(TimeoutError(name))


@pytest.mark.parametrize("loop", LOOPS)
def test_an_unanswered_future_fails_at_its_deadline_and_not_before(loop: str) -> None:
    async def main() -> tuple[float, list[str], int]:
        lp = asyncio.get_running_loop()
        left: list[str] = []
        deadlines: Deadlines[str] = Deadlines(lp, _timeout)
        fut: asyncio.Future[str] = lp.create_future()
        start = lp.time()
        deadlines.add(0.2, fut, left, "slow")
        with pytest.raises(TimeoutError, match="slow"):
            await fut
        return lp.time() - start, left, len(deadlines)

    waited, left, kept = _run(loop, main())
    assert waited >= 0.2 - 0.002  # (the loop's timers have millisecond resolution)
    assert left == ["slow"]
    assert kept == 0


@pytest.mark.parametrize("loop", LOOPS)
def test_answered_futures_leave_without_waiting_for_their_deadline(loop: str) -> None:
    """A queue holds about what is in flight, not every request of the last timeout."""

    async def main() -> tuple[int, list[str], bool]:
        lp = asyncio.get_running_loop()
        left: list[str] = []
        deadlines: Deadlines[str] = Deadlines(lp, _timeout)
        for k in range(10_000):
            fut: asyncio.Future[str] = lp.create_future()
            deadlines.add(30.0, fut, left, str(k))
            fut.set_result("answer")
        last: asyncio.Future[str] = lp.create_future()
        deadlines.add(30.0, last, left, "last")
        return len(deadlines), left, last.done()

    kept, left, last_done = _run(loop, main())
    assert kept == 1, "only the request still in flight is kept"
    assert left == [str(k) for k in range(10_000)], "each answered one left once, in order"
    assert not last_done, "an answer elsewhere fails nobody"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_shorter_timeout_added_later_fires_first(loop: str) -> None:
    async def main() -> tuple[list[str], bool]:
        lp = asyncio.get_running_loop()
        left: list[str] = []
        deadlines: Deadlines[str] = Deadlines(lp, _timeout)
        long: asyncio.Future[str] = lp.create_future()
        short: asyncio.Future[str] = lp.create_future()
        deadlines.add(5.0, long, left, "long")
        deadlines.add(0.05, short, left, "short")
        with pytest.raises(TimeoutError):
            await short
        still_waiting = not long.done()
        deadlines.close()
        return left, still_waiting

    left, still_waiting = _run(loop, main())
    assert left == ["short"]
    assert still_waiting


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_future_leaves_without_an_error_set(loop: str) -> None:
    async def main() -> tuple[list[str], bool, int]:
        lp = asyncio.get_running_loop()
        left: list[str] = []
        deadlines: Deadlines[str] = Deadlines(lp, _timeout)
        gone: asyncio.Future[str] = lp.create_future()
        deadlines.add(0.05, gone, left, "gone")
        gone.cancel()
        await asyncio.sleep(0.15)
        return left, gone.cancelled(), len(deadlines)

    left, cancelled, kept = _run(loop, main())
    assert left == ["gone"] and cancelled and kept == 0


def test_close_stops_the_timer() -> None:
    async def main() -> bool:
        lp = asyncio.get_running_loop()
        deadlines: Deadlines[str] = Deadlines(lp, _timeout)
        fut: asyncio.Future[str] = lp.create_future()
        deadlines.add(0.05, fut, [], "x")
        deadlines.close()
        await asyncio.sleep(0.15)
        return fut.done()

    assert _run("asyncio", main()) is False


@pytest.mark.parametrize("loop", LOOPS)
def test_many_distinct_timeouts_keep_few_queues_and_each_still_expires(loop: str) -> None:
    """A call's last attempt gets what is left of its deadline: a new timeout value each
    time. Past MAX_QUEUES values an entry has a timer of its own; all expire, answered ones
    leave at once."""

    async def main() -> tuple[int, list[str], int, list[str]]:
        lp = asyncio.get_running_loop()
        left: list[str] = []
        deadlines: Deadlines[str] = Deadlines(lp, _timeout)
        slow: list[asyncio.Future[str]] = []
        for k in range(200):
            fut: asyncio.Future[str] = lp.create_future()
            deadlines.add(0.05 + k * 0.0001, fut, left, f"slow{k}")
            slow.append(fut)
        queues = len(deadlines._queues)
        answered: list[str] = []
        for k in range(100):
            fut = lp.create_future()
            deadlines.add(0.07 + k * 0.0001, fut, answered, f"fast{k}")
            fut.set_result("answer")
        await asyncio.sleep(0)  # the done callbacks of the entries with a timer of their own
        n_answered_early = len(answered)
        results = await asyncio.gather(*slow, return_exceptions=True)
        assert all(isinstance(r, TimeoutError) for r in results)
        await asyncio.sleep(0.1)
        return queues, sorted(set(left)), n_answered_early, answered

    queues, left, n_answered_early, answered = _run(loop, main())
    assert queues == MAX_QUEUES
    assert left == sorted(f"slow{k}" for k in range(200))
    assert n_answered_early == 100, "an answered entry with a timer of its own leaves at once"
    assert sorted(set(answered)) == sorted(f"fast{k}" for k in range(100))
