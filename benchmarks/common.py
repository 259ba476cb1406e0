"""Shared helpers of the side-by-side benchmark: ports, CPU accounting, load processes.

The load generators of etcd and PySyncObj produce the same `LoadResult` as `dledger bench`
(dledger.bench.load), so every system is summarised by the same code: same percentiles,
same per-second timeline, same `client_cpu_cores`.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dledger.bench.load import LoadResult, merge

CLK_TCK = os.sysconf("SC_CLK_TCK")


def wait_converged(peers: str, group: str = "default", timeout: float = 600.0,
                   say: Callable[[str], None] = print) -> None:
    """Every member holds the leader's whole log: a follower left behind by the previous
    measurement (flow control lets a slow one lag; `flush=async` acknowledges at a majority)
    must not load, or be counted into, the next one."""
    from dledger.codes import DLedgerError
    from dledger.config import parse_peers
    from dledger.runtime.client import DLedgerClient

    deadline = time.monotonic() + timeout
    shown = False
    with DLedgerClient(peers, group, timeout=5.0) as c:
        while time.monotonic() < deadline:
            try:
                ends = {m: c.metadata(m).ledger_end_index for m in parse_peers(peers)}
            except DLedgerError:
                ends = {}
            if ends and len(set(ends.values())) == 1:
                return
            if not shown and ends:
                say(f"waiting for the members to converge (log ends {ends})")
                shown = True
            time.sleep(0.5)
    say(f"members did not converge within {timeout:.0f} s; measuring anyway")


def loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg") as f:
        a, b, c = f.read().split()[:3]
    return float(a), float(b), float(c)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state first), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of one process (all its threads), in seconds; None once it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime + the CPU of its reaped children) of one process."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[1]), sum(int(x) for x in fields[11:15]) / CLK_TCK)


def tree_cpu_s(root: int, kind: Callable[[str], str]) -> dict[str, float]:
    """CPU seconds of every process under `root` (itself included), summed per `kind` of its
    command line: what a multi-process job (members, a JVM, its Python workers) spent, by part.
    A process's reaped children count with it, so short-lived workers are not lost."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            stats[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pid in stats:
            k = kind(cmd)
            out[k] = out.get(k, 0.0) + stats[pid][1]
    return out


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    total = sum(parts[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


@dataclass
class CpuSampler:
    """Samples the CPU of named processes and of the machine once per `period` seconds, in a thread.

    `summary()` gives the median rate over the sampled intervals (cores): robust to the start-up
    and drain phases at both ends of a run."""

    pids: dict[str, int]
    period: float = 1.0
    samples: list[tuple[float, dict[str, float | None], tuple[float, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def _sample(self) -> None:
        self.samples.append((time.monotonic(), {k: proc_cpu_s(p) for k, p in self.pids.items()}, machine_busy_s()))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def summary(self) -> dict[str, float]:
        rates: dict[str, list[float]] = {k: [] for k in self.pids}
        rates["machine_busy"] = []
        for (t0, c0, m0), (t1, c1, m1) in zip(self.samples, self.samples[1:], strict=False):
            dt = t1 - t0
            if dt < 0.2:
                continue
            for k in self.pids:
                a, b = c0.get(k), c1.get(k)
                if a is not None and b is not None:
                    rates[k].append((b - a) / dt)
            if m1[1] > m0[1]:
                rates["machine_busy"].append((m1[0] - m0[0]) / (m1[1] - m0[1]) * (os.cpu_count() or 1))
        out = {}
        for k, xs in rates.items():
            if xs:
                xs = sorted(xs)
                # the busy middle of the run: median of the upper half (start-up and drain are idle)
                upper = xs[len(xs) // 2 :]
                out[k] = round(upper[len(upper) // 2], 2)
        return out


@contextmanager
def load_samples() -> Iterator[list[tuple[float, float, float]]]:
    """Collects the load average every 5 s while the block runs (the caller reports them)."""
    out: list[tuple[float, float, float]] = [loadavg()]
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(5.0):
            out.append(loadavg())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out.append(loadavg())


# --- K load processes, started together -----------------------------------------------------------

LoadFn = Callable[[Any, Callable[[], Awaitable[object]]], Coroutine[Any, Any, LoadResult]]


def _worker(k: int, fn: LoadFn, arg: Any, barrier: Any, results: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def ready() -> object:
        return await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 60.0)

    try:
        r: LoadResult = asyncio.run(fn(arg, ready))
    except BaseException as e:  # reported to the parent, which raises it
        barrier.abort()
        results.put((k, None, f"{type(e).__name__}: {e}"))
        return
    results.put((k, r, ""))


def run_procs(fn: LoadFn, args: list[Any], timeout: float) -> LoadResult:
    """Runs `fn(args[k], ready)` in one spawned process per element of `args`; each awaits
    `ready()` once connected, which returns when all are, so they measure the same window.
    Returns the merged result (exact percentiles)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(k, fn, a, barrier, results), daemon=True) for k, a in enumerate(args)]
    for w in workers:
        w.start()
    got: dict[int, LoadResult] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(args):
            if time.monotonic() > deadline:
                raise RuntimeError("load processes did not finish in time")
            try:
                k, r, err = results.get(timeout=0.5)
            except queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a load process exited with code {dead[0].exitcode}") from None
                continue
            if r is None:
                raise RuntimeError(f"load process {k}: {err}")
            got[k] = r
        return merge([got[k] for k in sorted(got)])
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.terminate()
                w.join()
