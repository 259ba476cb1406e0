"""`dledger bench`: a load generator against a running group or one it starts.

Closed loop by default: `clients` tasks each send one append request (of
`batch` bodies) after the other. With `rate` it is open loop: requests are
sent on a fixed schedule whatever the answers, and latency is measured from
the *scheduled* send time, so a stall shows up in the percentiles instead of
silently slowing the load (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dledger.codes import DLedgerError
from dledger.runtime.client import AsyncDLedgerClient

log = logging.getLogger(__name__)

MB = 1_000_000


@dataclass
class LoadSpec:
    peers: str
    group: str = "default"
    clients: int = 16
    size: int = 1024
    batch: int = 1
    duration: float = 10.0
    count: int = 0  # entries; 0: run for `duration`
    rate: float = 0.0  # entries/s, open loop; 0: closed loop
    warmup: float = 1.0


@dataclass
class LoadResult:
    entries: int = 0
    requests: int = 0
    elapsed: float = 0.0
    latencies_ms: array[float] = field(default_factory=lambda: array("d"))
    errors: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (t, entries in second, p99 ms)
    size: int = 0

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return math.nan
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def report(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "requests": self.requests,
            "elapsed_s": round(self.elapsed, 3),
            "entries_per_s": round(self.entries_per_s, 1),
            "mb_per_s": round(self.entries_per_s * self.size / MB, 2),
            "requests_per_s": round(self.requests / self.elapsed if self.elapsed else 0.0, 1),
            "latency_ms": {
                "p50": round(self.percentile(0.50), 3),
                "p90": round(self.percentile(0.90), 3),
                "p99": round(self.percentile(0.99), 3),
                "p999": round(self.percentile(0.999), 3),
                "max": round(max(self.latencies_ms), 3) if self.latencies_ms else math.nan,
            },
            "errors": dict(self.errors),
        }


class _Recorder:
    """Counts only after warm-up; keeps a per-second timeline for plots."""

    def __init__(self, spec: LoadSpec, result: LoadResult) -> None:
        self.spec = spec
        self.result = result
        self.start = time.perf_counter() + spec.warmup
        self.sec_entries = 0
        self.sec_lat: list[float] = []
        self.sec_start = self.start

    def ok(self, sent_at: float, entries: int) -> None:
        now = time.perf_counter()
        if now < self.start:
            return
        lat = (now - sent_at) * 1000
        r = self.result
        r.entries += entries
        r.requests += 1
        r.latencies_ms.append(lat)
        self.sec_entries += entries
        self.sec_lat.append(lat)
        if now - self.sec_start >= 1.0:
            self.flush_second(now)

    def flush_second(self, now: float) -> None:
        lat = sorted(self.sec_lat)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else math.nan
        self.result.timeline.append((round(self.sec_start - self.start, 1), self.sec_entries, p99))
        self.sec_entries, self.sec_lat, self.sec_start = 0, [], now

    def error(self, e: DLedgerError) -> None:
        if time.perf_counter() >= self.start:
            name = e.code.name
            self.result.errors[name] = self.result.errors.get(name, 0) + 1

    def done(self) -> bool:
        spec, r = self.spec, self.result
        if spec.count:
            return r.entries >= spec.count
        return time.perf_counter() >= self.start + spec.duration


async def run_load(spec: LoadSpec, progress: Callable[[LoadResult, float], None] | None = None) -> LoadResult:
    result = LoadResult(size=spec.size)
    rec = _Recorder(spec, result)
    body = os.urandom(spec.size)
    bodies = [body] * spec.batch
    clients = [AsyncDLedgerClient(spec.peers, spec.group, timeout=10.0) for _ in range(spec.clients)]
    try:
        await clients[0].metadata()  # fail fast on an unreachable group
        task: asyncio.Future[Any]
        if spec.rate > 0:
            task = asyncio.ensure_future(_open_loop(spec, rec, clients, bodies))
        else:
            task = asyncio.gather(*(_closed_loop(rec, c, bodies) for c in clients))
        while not task.done():
            await asyncio.wait([task], timeout=0.25)
            if progress is not None:
                progress(result, time.perf_counter() - rec.start)
        task.result()
    finally:
        for c in clients:
            await c.close()
    result.elapsed = max(time.perf_counter() - rec.start, 1e-9)
    if rec.sec_lat:
        rec.flush_second(time.perf_counter())
    return result


async def _closed_loop(rec: _Recorder, client: AsyncDLedgerClient, bodies: list[bytes]) -> None:
    while not rec.done():
        sent = time.perf_counter()
        try:
            await client.append_batch(bodies)
            rec.ok(sent, len(bodies))
        except DLedgerError as e:
            rec.error(e)
            await asyncio.sleep(0.01)


async def _open_loop(spec: LoadSpec, rec: _Recorder, clients: list[AsyncDLedgerClient], bodies: list[bytes]) -> None:
    interval = spec.batch / spec.rate
    inflight: set[asyncio.Task[None]] = set()
    next_at = time.perf_counter()
    k = 0

    async def one(client: AsyncDLedgerClient, scheduled: float) -> None:
        try:
            await client.append_batch(bodies)
            rec.ok(scheduled, len(bodies))
        except DLedgerError as e:
            rec.error(e)

    while not rec.done():
        now = time.perf_counter()
        while next_at <= now:
            t = asyncio.ensure_future(one(clients[k % len(clients)], next_at))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
            k += 1
            next_at += interval
        await asyncio.sleep(max(0.0, min(next_at - time.perf_counter(), 0.005)))
    if inflight:
        await asyncio.wait(inflight, timeout=15)


def plot(result: LoadResult, path: str, title: str) -> None:
    """Throughput and p99 latency per second, two panels, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = [t for t, _, _ in result.timeline]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(ts, [n for _, n, _ in result.timeline], color="tab:blue")
    a.set_ylabel("entries / s")
    a.set_title(title)
    b.plot(ts, [p for _, _, p in result.timeline], color="tab:red")
    b.set_ylabel("p99 latency (ms)")
    b.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
