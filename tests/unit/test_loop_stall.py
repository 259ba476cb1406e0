"""The loop-stall monitor measures how late its periodic callback ran."""

from __future__ import annotations

import asyncio
import time

from dledger.runtime.loop_stall import LoopStallMonitor


def test_a_blocked_loop_shows_as_the_worst_stall() -> None:
    seen: list[float] = []

    async def main() -> LoopStallMonitor:
        mon = LoopStallMonitor(seen.append, period=0.01)
        mon.start()
        await asyncio.sleep(0.1)  # a few samples of an idle loop
        time.sleep(0.3)  # the loop is held: the callback due meanwhile runs at least ~0.29 s late
        await asyncio.sleep(0.05)
        mon.stop()
        return mon

    mon = asyncio.run(main())
    assert mon.samples == len(seen) >= 3
    assert mon.worst == max(seen)
    assert mon.worst >= 0.25  # at least the blocked time minus one period
    assert all(x >= 0.0 for x in seen)


def test_lateness_is_measured_against_the_due_time_on_the_given_clock() -> None:
    """With a fake clock: the sample due at 10.05 that runs at 10.45 was 0.4 s late."""
    now = [10.0]

    class FakeLoop:
        def __init__(self) -> None:
            self.callbacks: list[object] = []

        def call_later(self, delay: float, fn: object) -> None:
            self.callbacks.append(fn)

    loop = FakeLoop()
    seen: list[float] = []
    mon = LoopStallMonitor(seen.append, period=0.05, loop=loop, clock=lambda: now[0])  # type: ignore[arg-type]
    mon.start()
    now[0] = 10.45
    mon._sample()
    now[0] = 10.5  # due at 10.5 exactly: on time
    mon._sample()
    assert [round(x, 6) for x in seen] == [0.4, 0.0]
    assert round(mon.worst, 6) == 0.4 and mon.samples == 2
    assert len(loop.callbacks) == 3  # each sample schedules the next


def test_the_worst_stall_says_whether_its_thread_ran() -> None:
    """A callback spinning on the CPU and a thread that does not run (here: blocked in a
    sleep, as a starved or reclaiming process is) stall the loop alike; the CPU time tells them apart."""

    def stall(hold: object) -> LoopStallMonitor:
        async def main() -> LoopStallMonitor:
            mon = LoopStallMonitor(period=0.01)
            mon.start()
            await asyncio.sleep(0.05)
            hold()  # type: ignore[operator]
            await asyncio.sleep(0.05)
            mon.stop()
            return mon
        return asyncio.run(main())

    def spin() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    busy = stall(spin)
    idle = stall(lambda: time.sleep(0.3))
    assert busy.worst >= 0.25 and busy.worst_cpu >= 0.3
    assert idle.worst >= 0.25 and idle.worst_cpu < idle.worst / 2
    if idle.worst_wait is not None:  # Linux: the run-queue wait is measured, and never negative
        assert idle.worst_wait >= 0.0 and busy.worst_wait is not None and busy.worst_wait >= 0.0
