"""`dledger bench --failover N`: SIGKILL the leader of a local group N times under load.

Per kill it measures, from the moment the signal is sent:

- elect: until a surviving member names a new leader in a higher term (each survivor's
  METADATA polled every `POLL_S`, so this is at most that much late);
- append: until the first append acknowledged in a term above the killed leader's (an answer
  of the old leader arriving after the kill does not count) — what a writer sees.

The killed member is restarted, and load runs for `steady` seconds before the next kill.
Before each kill the leader's worst event-loop stall since its start is scraped from its
metrics (`dledger_loop_stall_max_seconds`): a stall of the loop is what delays heartbeats.
That worst includes a restarted member's start and catch-up; the worst while it led is bounded
from its stall histogram, scraped once when it was elected and again before its kill.
False elections: term increments the kills do not explain. A kill explains the terms from
the killed leader's to the one of the first append acknowledged after it (a split vote takes
more than one); every other increment (a follower that gave up on a loaded but live leader,
a restarted member that campaigned) counts as false.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dledger.bench.load import LoadSpec
from dledger.codes import DLedgerError, ResponseCode
from dledger.config import parse_peers
from dledger.local_cluster import client_tls, local_cluster
from dledger.runtime.client import AsyncDLedgerClient

log = logging.getLogger(__name__)

POLL_S = 0.01  # how often the survivors' METADATA is asked after a kill
STALL_METRIC = "dledger_loop_stall_max_seconds"
STALL_BUCKETS = "dledger_loop_stall_seconds_bucket"


@dataclass
class Kill:
    leader: str
    term: int  # the killed leader's
    elect_s: float | None = None  # kill -> a survivor names a new leader (None: not within the deadline)
    append_s: float | None = None  # kill -> first append acknowledged in a higher term
    new_leader: str | None = None
    new_term: int = 0  # term of that first acknowledged append
    leader_stall_s: float | None = None  # the killed leader's worst loop stall since it started
    # ... while it led (from its election to the kill): the upper bound of the highest histogram
    # bucket that gained a sample then (None: not scraped)
    tenure_stall_le_s: float | None = None


@dataclass
class FailoverResult:
    kills: list[Kill] = field(default_factory=list)
    term_start: int = 0
    term_end: int = 0
    entries: int = 0  # acknowledged during the run
    errors: dict[str, int] = field(default_factory=dict)
    member_stall_s: dict[str, float] = field(default_factory=dict)  # at the end, members alive then
    last_tenure_stall_le_s: float | None = None  # the last leader's, from its election to the end
    elapsed_s: float = 0.0

    @property
    def false_elections(self) -> int:
        explained = sum(max(0, k.new_term - k.term) for k in self.kills if k.append_s is not None)
        return max(0, self.term_end - self.term_start - explained)

    def report(self) -> dict[str, Any]:
        elect = sorted(k.elect_s for k in self.kills if k.elect_s is not None)
        append = sorted(k.append_s for k in self.kills if k.append_s is not None)
        stalls = [k.leader_stall_s for k in self.kills if k.leader_stall_s is not None]
        stalls += list(self.member_stall_s.values())
        tenure = [k.tenure_stall_le_s for k in self.kills if k.tenure_stall_le_s is not None]
        if self.last_tenure_stall_le_s is not None:
            tenure.append(self.last_tenure_stall_le_s)
        return {
            "kills": len(self.kills),
            "elect_s": _summary(elect),
            "append_s": _summary(append),
            "unrecovered": sum(1 for k in self.kills if k.append_s is None),
            "leader_stall_max_s": round(max(stalls), 4) if stalls else None,
            "leader_tenure_stall_le_s": max(tenure) if tenure else None,
            "terms": self.term_end - self.term_start,
            "false_elections": self.false_elections,
            "entries": self.entries,
            "entries_per_s": round(self.entries / self.elapsed_s, 1) if self.elapsed_s else 0.0,
            "errors": dict(self.errors),
            "per_kill": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(x).items()}
                         for x in self.kills],
            "member_stall_s": {k: round(v, 4) for k, v in self.member_stall_s.items()},
        }


def _summary(xs: list[float]) -> dict[str, float | None]:
    """Median, p99 (nearest rank), min and max of sorted `xs`; None each when empty."""
    def r(x: float) -> float | None:
        return None if math.isnan(x) else round(x, 4)

    if not xs:
        return {"median": None, "p99": None, "min": None, "max": None}
    mid = len(xs) // 2
    median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    p99 = xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]
    return {"median": r(median), "p99": r(p99), "min": r(xs[0]), "max": r(xs[-1])}


@dataclass
class StallScrape:
    worst: float  # dledger_loop_stall_max_seconds: since the process started
    buckets: dict[float, float]  # le -> cumulative count of dledger_loop_stall_seconds (one group's series)


def scrape_stall(port: int, timeout: float = 2.0) -> StallScrape | None:
    """The loop-stall series of a member's /metrics, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return None
    return parse_stall(text)


def parse_stall(text: str) -> StallScrape | None:
    worst: list[float] = []
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(STALL_METRIC + "{"):
            worst.append(float(line.rsplit(" ", 1)[1]))
        elif line.startswith(STALL_BUCKETS + "{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            # every hosted group carries the same samples: one series is enough
            buckets.setdefault(math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1]))
    return StallScrape(max(worst), buckets) if worst else None


def worst_between(before: StallScrape, after: StallScrape) -> float | None:
    """An upper bound of the worst stall sampled between two scrapes: the smallest bucket bound
    whose cumulative count grew by as much as +Inf's did, i.e. that holds every new sample
    (None: no sample between them)."""
    total = after.buckets.get(math.inf, 0.0) - before.buckets.get(math.inf, 0.0)
    if total <= 0:
        return None
    return min(le for le, n in after.buckets.items() if n - before.buckets.get(le, 0.0) >= total)


class _Writers:
    """Closed-loop appenders; remember when each term's first append was acknowledged."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.first_ack: dict[int, float] = {}
        self.entries = 0
        self.errors: dict[str, int] = {}
        self.stopping = False
        tls = client_tls(Path(spec.tls_dir)) if spec.tls_dir else None
        n = min(spec.conns or spec.clients, spec.clients)
        self.clients = [AsyncDLedgerClient(spec.peers, spec.group, timeout=10.0, tls=tls, idempotent=spec.idempotent)
                        for _ in range(n)]
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        body = os.urandom(self.spec.size)
        bodies = [body] * self.spec.batch
        self.tasks = [asyncio.ensure_future(self._loop(self.clients[k % len(self.clients)], bodies))
                      for k in range(self.spec.clients)]

    async def _loop(self, client: AsyncDLedgerClient, bodies: list[bytes]) -> None:
        while not self.stopping:
            try:
                if len(bodies) == 1:
                    term = (await client.append(bodies[0])).term
                else:
                    term = (await client.append_batch(bodies))[0].term
            except DLedgerError as e:
                self.errors[e.code.name] = self.errors.get(e.code.name, 0) + 1
                await asyncio.sleep(0.01)
                continue
            self.entries += len(bodies)
            self.first_ack.setdefault(term, time.perf_counter())

    def acked_after(self, term: int, since: float) -> tuple[float, int] | None:
        """(seconds from `since`, term) of the first append acknowledged in a term above `term`."""
        later = [(t, k) for k, t in self.first_ack.items() if k > term and t >= since]
        if not later:
            return None
        t, k = min(later)
        return t - since, k

    async def stop(self) -> None:
        self.stopping = True
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.clients:
            await c.close()


async def _leader(probe: AsyncDLedgerClient, members: list[str], deadline: float) -> tuple[str, int]:
    """The leader and its term, as the members agree on it (waits for one)."""
    while time.monotonic() < deadline:
        views = await probe.metadata_all(members)
        named = {(v.leader_id, v.term) for v in views.values() if not isinstance(v, DLedgerError) and v.leader_id}
        if len(named) == 1:
            leader, term = named.pop()
            assert leader is not None
            return leader, term
        await asyncio.sleep(0.05)
    raise DLedgerError(ResponseCode.TIMEOUT, "the group agreed on no leader in time")


async def _max_term(probe: AsyncDLedgerClient, members: list[str]) -> int:
    views = await probe.metadata_all(members)
    return max((v.term for v in views.values() if not isinstance(v, DLedgerError)), default=0)


async def run_failover(lc: local_cluster, spec: LoadSpec, kills: int, steady: float, metrics_ports: dict[str, int],
                       say: Callable[[str], None] = lambda s: None, deadline_s: float = 30.0) -> FailoverResult:
    """Kill the leader of the running `lc` `kills` times under `spec`'s load (see the module doc)."""
    members = list(parse_peers(spec.peers))
    tls = client_tls(Path(spec.tls_dir)) if spec.tls_dir else None
    result = FailoverResult()
    probe = AsyncDLedgerClient(spec.peers, spec.group, timeout=0.5, tls=tls)
    writers = _Writers(spec)
    try:
        await _leader(probe, members, time.monotonic() + deadline_s)
        result.term_start = await _max_term(probe, members)
        started = time.perf_counter()
        elected: dict[str, StallScrape] = {}  # the leader's stall histogram when it had just been elected
        writers.start()
        await asyncio.sleep(spec.warmup + steady)
        for n in range(kills):
            leader, term = await _leader(probe, members, time.monotonic() + deadline_s)
            kill = Kill(leader, term)
            scraped = await asyncio.to_thread(scrape_stall, metrics_ports[leader])
            if scraped is not None:
                kill.leader_stall_s = scraped.worst
                if leader in elected:
                    kill.tenure_stall_le_s = worst_between(elected[leader], scraped)
            os.kill(lc.procs[leader].pid, signal.SIGKILL)
            t0 = time.perf_counter()
            await _measure(kill, probe, writers, [m for m in members if m != leader], t0, deadline_s)
            lc.procs[leader].wait()
            elected.clear()
            if kill.new_leader is not None:  # its histogram now: what it gains until its kill is its tenure's
                first = await asyncio.to_thread(scrape_stall, metrics_ports[kill.new_leader])
                if first is not None:
                    elected[kill.new_leader] = first
            result.kills.append(kill)
            say(f"kill {n + 1}/{kills}: {leader} (term {term}) -> "
                f"{kill.new_leader or '?'}: elected in {_s(kill.elect_s)}, append acknowledged in "
                f"{_s(kill.append_s)}; its worst loop stall {_s(kill.leader_stall_s)} since start, "
                f"<= {_s(kill.tenure_stall_le_s)} while it led")
            lc.start_member(leader)
            await _rejoined(probe, leader, time.monotonic() + deadline_s)
            await asyncio.sleep(steady)
        await writers.stop()
        result.elapsed_s = time.perf_counter() - started
        result.term_end = await _max_term(probe, members)
        for m in members:
            stall = await asyncio.to_thread(scrape_stall, metrics_ports[m])
            if stall is not None:
                result.member_stall_s[m] = stall.worst
                if m in elected:
                    result.last_tenure_stall_le_s = worst_between(elected[m], stall)
    finally:
        if not writers.stopping:
            await writers.stop()
        await probe.close()
    result.entries, result.errors = writers.entries, dict(writers.errors)
    return result


async def _measure(kill: Kill, probe: AsyncDLedgerClient, writers: _Writers, survivors: list[str], t0: float,
                   deadline_s: float) -> None:
    """Fill `kill`'s elect and append times: poll the survivors and the writers' acknowledgements."""
    end = t0 + deadline_s
    while time.perf_counter() < end and (kill.elect_s is None or kill.append_s is None):
        if kill.elect_s is None:
            views = await probe.metadata_all(survivors)
            for v in views.values():
                if not isinstance(v, DLedgerError) and v.leader_id and v.leader_id != kill.leader \
                        and v.term > kill.term:
                    kill.elect_s, kill.new_leader = time.perf_counter() - t0, v.leader_id
                    break
        if kill.append_s is None:
            got = writers.acked_after(kill.term, t0)
            if got is not None:
                kill.append_s, kill.new_term = got
        await asyncio.sleep(POLL_S)


async def _rejoined(probe: AsyncDLedgerClient, member: str, deadline: float) -> None:
    """Until the restarted `member` answers and names a leader."""
    while time.monotonic() < deadline:
        try:
            if (await probe.metadata(member)).leader_id:
                return
        except DLedgerError:
            pass
        await asyncio.sleep(0.1)
    raise DLedgerError(ResponseCode.TIMEOUT, f"restarted member {member} named no leader in time")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"
