"""`dledger bench`: a load generator against a running group or one it starts.

Closed loop by default: `clients` tasks each send one append request (of
`batch` bodies) after the other. With `rate` it is open loop: each client
sends on a fixed schedule, and latency is measured from the *scheduled* send
time, so a stall shows up in the percentiles instead of silently slowing the
load (no coordinated omission; give enough clients that rate x latency stays
below their number).

One asyncio process can itself be the bottleneck on a small machine (the report's
`client_cpu_cores` near `load_procs` says so): `run_load_procs` runs K load processes, each
with its share of the clients (and of the rate or count), started together behind a barrier so
they measure the same window, and merges their results; latencies are concatenated, so the
percentiles of the merged result are exact.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dledger.codes import DLedgerError, ResponseCode
from dledger.local_cluster import client_tls
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
    conns: int = 0  # connections the clients share (as etcd's benchmark --conns); 0: one per client
    tls_dir: str = ""  # certificates from `dledger certs`: the clients connect with client.pem (mutual TLS)
    idempotent: bool = False  # each connection's client is an idempotent producer (core.producers)


@dataclass
class LoadResult:
    entries: int = 0
    requests: int = 0
    elapsed: float = 0.0
    latencies_ms: array[float] = field(default_factory=lambda: array("d"))
    done_at: array[float] = field(default_factory=lambda: array("d"))  # s after the window opened, per request
    errors: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (t, entries in second, p99 ms)
    size: int = 0
    batch: int = 1
    cpu_s: float = 0.0  # CPU time of the load process(es) while the window was open
    procs: int = 1

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        return _percentile(sorted(self.latencies_ms), q)

    def report(self) -> dict[str, Any]:
        xs = sorted(self.latencies_ms)
        return {
            "entries": self.entries,
            "requests": self.requests,
            "elapsed_s": round(self.elapsed, 3),
            "entries_per_s": round(self.entries_per_s, 1),
            "mb_per_s": round(self.entries_per_s * self.size / MB, 2),
            "requests_per_s": round(self.requests / self.elapsed if self.elapsed else 0.0, 1),
            "latency_ms": {  # null when nothing succeeded (JSON has no NaN)
                "p50": _ms(_percentile(xs, 0.50)),
                "p90": _ms(_percentile(xs, 0.90)),
                "p99": _ms(_percentile(xs, 0.99)),
                "p999": _ms(_percentile(xs, 0.999)),
                "max": _ms(xs[-1] if xs else math.nan),
            },
            "errors": dict(self.errors),
            "load_procs": self.procs,
            # CPU the load generator itself used, in cores: near `load_procs` means it was the bottleneck
            "client_cpu_cores": round(self.cpu_s / self.elapsed if self.elapsed else 0.0, 3),
        }

    def compute_timeline(self) -> None:
        """Entries and p99 latency per second of the window, from the per-request records."""
        buckets: dict[int, list[float]] = {}
        for t, lat in zip(self.done_at, self.latencies_ms, strict=True):
            buckets.setdefault(int(t), []).append(lat)
        self.timeline = []
        for sec in sorted(buckets):
            in_sec = sorted(buckets[sec])
            self.timeline.append((float(sec), len(in_sec) * self.batch, _percentile(in_sec, 0.99)))


def _ms(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)


def _percentile(xs: list[float], q: float) -> float:
    """`xs` sorted; the nearest-rank percentile."""
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def merge(results: list[LoadResult]) -> LoadResult:
    """One result from several load processes that measured the same window: counts add up,
    latencies are concatenated (percentiles are then exact, not averaged)."""
    out = LoadResult(size=results[0].size, batch=results[0].batch, procs=len(results))
    for r in results:
        out.entries += r.entries
        out.requests += r.requests
        out.elapsed = max(out.elapsed, r.elapsed)
        out.latencies_ms.extend(r.latencies_ms)
        out.done_at.extend(r.done_at)
        out.cpu_s += r.cpu_s
        for k, v in r.errors.items():
            out.errors[k] = out.errors.get(k, 0) + v
    out.compute_timeline()
    return out


class _Recorder:
    """Counts only after warm-up."""

    def __init__(self, spec: LoadSpec, result: LoadResult) -> None:
        self.spec = spec
        self.result = result
        self.start = time.perf_counter() + spec.warmup

    def ok(self, sent_at: float, entries: int) -> None:
        now = time.perf_counter()
        if now < self.start:
            return
        r = self.result
        r.entries += entries
        r.requests += 1
        r.latencies_ms.append((now - sent_at) * 1000)
        r.done_at.append(now - self.start)

    def error(self, e: DLedgerError) -> None:
        if time.perf_counter() >= self.start:
            name = e.code.name
            self.result.errors[name] = self.result.errors.get(name, 0) + 1

    def done(self) -> bool:
        spec, r = self.spec, self.result
        if spec.count:
            return r.entries >= spec.count
        return time.perf_counter() >= self.start + spec.duration


async def run_load(
    spec: LoadSpec,
    progress: Callable[[LoadResult, float], None] | None = None,
    ready: Callable[[], Awaitable[object]] | None = None,
) -> LoadResult:
    """Run the load in this process. `ready` is awaited once the group answered and before
    the load starts (several load processes use it to start together)."""
    result = LoadResult(size=spec.size, batch=spec.batch)
    body = os.urandom(spec.size)
    bodies = [body] * spec.batch
    # one AsyncDLedgerClient per connection; clients beyond that share them (requests are
    # multiplexed by request id, and those sent in one loop iteration share one write)
    n_conns = min(spec.conns or spec.clients, spec.clients)
    tls = client_tls(Path(spec.tls_dir)) if spec.tls_dir else None
    clients = [AsyncDLedgerClient(spec.peers, spec.group, timeout=10.0, tls=tls, idempotent=spec.idempotent)
               for _ in range(n_conns)]
    try:
        await clients[0].metadata()  # fail fast on an unreachable group
        if ready is not None:
            await ready()
        rec = _Recorder(spec, result)
        cpu: list[float] = []

        async def cpu_window() -> None:
            await asyncio.sleep(max(0.0, rec.start - time.perf_counter()))
            cpu.append(time.process_time())

        watcher = asyncio.ensure_future(cpu_window())
        task: asyncio.Future[Any]
        if spec.rate > 0:
            task = asyncio.ensure_future(_open_loop(spec, rec, clients, bodies))
        else:
            task = asyncio.gather(*(_closed_loop(rec, clients[k % n_conns], bodies) for k in range(spec.clients)))
        while not task.done():
            await asyncio.wait([task], timeout=0.25)
            if progress is not None:
                progress(result, time.perf_counter() - rec.start)
        task.result()
        result.elapsed = max(time.perf_counter() - rec.start, 1e-9)
        result.cpu_s = time.process_time() - cpu[0] if cpu else 0.0
        watcher.cancel()
    finally:
        for c in clients:
            await c.close()
    result.compute_timeline()
    return result


async def _append(client: AsyncDLedgerClient, bodies: list[bytes]) -> None:
    """What a user calls: `append` for one entry (concurrent ones sharing a client coalesce),
    `append_batch` for a batch."""
    if len(bodies) == 1:
        await client.append(bodies[0])
    else:
        await client.append_batch(bodies)


async def _closed_loop(rec: _Recorder, client: AsyncDLedgerClient, bodies: list[bytes]) -> None:
    while not rec.done():
        sent = time.perf_counter()
        try:
            await _append(client, bodies)
            rec.ok(sent, len(bodies))
        except DLedgerError as e:
            rec.error(e)
            await asyncio.sleep(0.01)


async def _open_loop(spec: LoadSpec, rec: _Recorder, clients: list[AsyncDLedgerClient], bodies: list[bytes]) -> None:
    """Each of `spec.clients` tasks sends on its own fixed schedule (rate / clients, phases
    staggered), as wrk2 does: latency counts from the scheduled time, so a request sent late
    because the one before it was slow still shows the whole delay (no coordinated omission),
    without a task per request."""
    per_client = spec.clients * spec.batch / spec.rate  # seconds between one client's requests
    start = time.perf_counter()

    async def paced(k: int) -> None:
        client = clients[k % len(clients)]
        next_at = start + per_client * k / spec.clients
        while not rec.done():
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await _append(client, bodies)
                rec.ok(next_at, len(bodies))
            except DLedgerError as e:
                rec.error(e)
            next_at += per_client

    await asyncio.gather(*(paced(k) for k in range(spec.clients)))


# --- several load processes ----------------------------------------------------------------------


def split_spec(spec: LoadSpec, procs: int) -> list[LoadSpec]:
    """The load of one process out of `procs`: clients, rate and count divided among them."""
    out = []
    for k in range(procs):
        clients = spec.clients // procs + (1 if k < spec.clients % procs else 0)
        count = spec.count // procs + (1 if k < spec.count % procs else 0) if spec.count else 0
        conns = max(1, spec.conns // procs + (1 if k < spec.conns % procs else 0)) if spec.conns else 0
        out.append(replace(spec, clients=clients, count=count, rate=spec.rate / procs, conns=conns))
    return out


def _proc_main(k: int, spec: LoadSpec, barrier: Any, counters: Any, results: Any) -> None:
    """Entry point of one load process (spawned): run the load, send the result back."""
    from dledger.runtime.transport import install_uvloop

    install_uvloop()

    async def ready() -> object:
        # every process has reached its group: start all together
        return await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 60.0)

    def progress(r: LoadResult, elapsed: float) -> None:
        counters[k] = r.entries

    try:
        result = asyncio.run(run_load(spec, progress, ready))
    except BaseException as e:  # reported to the parent, which raises it
        barrier.abort()
        results.put((k, None, f"{type(e).__name__}: {e}"))
        return
    results.put((k, result, ""))


def run_load_procs(
    spec: LoadSpec, procs: int, progress: Callable[[int, float], None] | None = None
) -> LoadResult:
    """Run the load in `procs` processes, each with its share of clients (and rate/count),
    measuring the same window; returns their merged result."""
    import multiprocessing as mp
    import queue
    import threading

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs + 1)
    counters = ctx.Array("q", procs, lock=False)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_proc_main, args=(k, s, barrier, counters, results), daemon=True)
        for k, s in enumerate(split_spec(spec, procs))
    ]
    for w in workers:
        w.start()
    started = threading.Event()
    try:

        def wait_start() -> None:
            try:
                barrier.wait(60.0)
                started.set()
            except threading.BrokenBarrierError:
                pass

        threading.Thread(target=wait_start, daemon=True).start()
        got: dict[int, LoadResult] = {}
        t0: float | None = None
        while len(got) < procs:
            try:
                k, r, err = results.get(timeout=0.25)
            except queue.Empty:
                if started.is_set() and t0 is None:
                    t0 = time.perf_counter()
                if progress is not None and t0 is not None:
                    progress(sum(counters), time.perf_counter() - t0 - spec.warmup)
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise DLedgerError(
                        ResponseCode.UNKNOWN, f"load process exited with code {dead[0].exitcode}"
                    ) from None
                continue
            if r is None:
                raise DLedgerError(ResponseCode.UNKNOWN, f"load process {k}: {err}")
            got[k] = r
        return merge([got[k] for k in sorted(got)])
    finally:
        if not started.is_set():
            barrier.abort()  # a process that failed early must not leave the others waiting
        for w in workers:
            w.join(timeout=20)
            if w.is_alive():
                w.terminate()
                w.join()


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
