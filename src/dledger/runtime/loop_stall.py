"""How long the event loop went without running a callback: its worst stall.

A member's heartbeats, votes and lease checks all run on one asyncio loop, so a callback
that holds it (a long decode, a big write, a blocking call) delays them all; a follower
that misses heartbeats long enough starts an election. `LoopStallMonitor` schedules a
cheap callback every `period` seconds and measures how late it ran: lateness is the time
the loop was busy with something else (or the process was not scheduled at all, as on a
CPU-starved machine). The worst lateness since start and a histogram of all of them go to
the metrics (`dledger_loop_stall_seconds`, `dledger_loop_stall_max_seconds`).

Which of the two a stall was, the log line of a long one says: the CPU time the loop's thread
used meanwhile, and (Linux: /proc/thread-self/schedstat) how long it waited for a CPU while
runnable. Most of the stall on the CPU: a callback held the loop (look for it with py-spy);
waiting for a CPU: the machine is starved; neither: the thread was blocked in the kernel
(page reclaim, a slow disk). Only the first is ours to shorten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PERIOD_S = 0.05  # 20 callbacks a second: a few microseconds of loop time each


class LoopStallMonitor:
    """Samples the loop's lateness every `period` s; `observe(lateness)` is told each sample.

    `clock` is the loop's own (`loop.time`) unless given, so lateness compares times of one
    clock; the unit tests give a fake loop and clock."""

    def __init__(self, observe: Callable[[float], None] | None = None, period: float = PERIOD_S,
                 loop: asyncio.AbstractEventLoop | None = None, clock: Callable[[], float] | None = None) -> None:
        self.period = period
        self.observe = observe
        self.loop = loop
        self.clock = clock
        self.worst = 0.0  # seconds: the latest any sample ran since start
        self.worst_cpu = 0.0  # seconds of CPU the loop's thread used from the worst one's scheduling to it
        self.samples = 0
        self._due = 0.0
        self._cpu = 0.0  # the thread's CPU time when the pending sample was scheduled
        self.worst_wait: float | None = None  # ... and the seconds it waited for a CPU (None: unknown)
        self._wait = 0.0  # the thread's run-queue wait when the pending sample was scheduled
        self._schedstat: int | None = None  # fd of the loop thread's /proc schedstat (Linux)
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        loop = self.loop = self.loop or asyncio.get_running_loop()
        if self.clock is None:
            self.clock = loop.time
        with contextlib.suppress(OSError):  # (opened on the loop's thread: it names that thread)
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None

    def _runq_wait(self) -> float | None:
        """Seconds the loop's thread spent runnable but not running, since it started."""
        if self._schedstat is None:
            return None
        try:
            return int(os.pread(self._schedstat, 64, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def _schedule(self) -> None:
        assert self.loop is not None and self.clock is not None
        self._due = self.clock() + self.period
        self._cpu = time.thread_time()
        self._wait = self._runq_wait() or 0.0
        self._handle = self.loop.call_later(self.period, self._sample)

    def _sample(self) -> None:
        assert self.clock is not None
        lateness, cpu = max(0.0, self.clock() - self._due), time.thread_time() - self._cpu
        if lateness > self.worst and (wait := self._runq_wait()) is not None:
            self.record(lateness, cpu, wait - self._wait)
        else:
            self.record(lateness, cpu)
        self._schedule()

    def record(self, lateness: float, cpu: float = 0.0, wait: float | None = None) -> None:
        """One sample: `lateness` seconds after it was due; `cpu`: seconds the loop's thread
        ran from its scheduling (a period earlier) to it; `wait`: seconds it waited for a CPU."""
        self.samples += 1
        if lateness > self.worst:
            self.worst, self.worst_cpu, self.worst_wait = lateness, cpu, wait
            if lateness >= 0.5:  # long enough to cost a follower its heartbeats: worth a line
                log.warning("event loop stalled %.3f s (the worst since start): its thread ran %.3f s and waited "
                            "%s for a CPU (the rest: blocked in the kernel)", lateness, cpu,
                            "?" if wait is None else f"{wait:.3f} s")
        if self.observe is not None:
            self.observe(lateness)

