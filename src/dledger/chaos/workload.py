"""Concurrent clients appending unique bodies and reading committed entries, every
operation recorded in a history the checker judges afterwards.

History: JSON lines, one per completed operation (and one per nemesis or process
event), times in seconds since the run started (monotonic clock of this process):

    {"id": 12, "client": "c1", "kind": "append", "invoke": 3.1, "complete": 3.2,
     "request": {"bodies": ["s7-c1-40", "s7-c1-41"]},
     "outcome": "ok", "result": [[118, 4], [119, 4]], "error": null}

`outcome` is "ok", "fail" (certainly not applied) or "maybe" (the outcome is
unknown: TIMEOUT, NETWORK_ERROR, TERM_CHANGED, WAIT_QUORUM_ACK_TIMEOUT, anything
unexpected). A read's result is {"entries": [[index, term, body], ...]} and its
request names the member asked (null: the leader); a metadata read's result is the
member's view, including its committed_index.

Bodies are unique in the whole run ("s<seed>-<client>-<n>"), so the checker can find
every body in the final log and tell a lost write from a duplicate or a phantom.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import random
import threading
import time
from pathlib import Path
from typing import IO, Any

from dledger.chaos.harness import LoopThread
from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import AsyncDLedgerClient

log = logging.getLogger(__name__)

# The client retries these itself and raises them only when no attempt took effect.
DEFINITE_FAILURES = frozenset({
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_PENDING_FULL,
    ResponseCode.LEADER_NOT_READY,
})


# consistency modes of fresh reads: "follower" is a linearizable read served by a named member
FRESH_MODES = ("linearizable", "lease", "leader", "follower")


def outcome_of(code: ResponseCode) -> str:
    """'fail' only for errors that prove the append was not applied; else 'maybe'."""
    return "fail" if code in DEFINITE_FAILURES else "maybe"


class History:
    """Thread-safe recorder: keeps the records in memory and appends them to a file."""

    def __init__(self, path: Path | None, t0: float | None = None) -> None:
        self.t0 = time.monotonic() if t0 is None else t0
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path is not None else None  # noqa: SIM115

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def add(self, rec: dict[str, Any]) -> None:
        with self._lock:
            if "id" not in rec:
                rec = {"id": next(self._ids), **rec}
            self.records.append(rec)
            if self._file is not None:
                self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
                self._file.flush()

    def event(self, member: str, event: str, details: dict[str, Any]) -> None:
        """A process event from the harness (started, killed, paused, resumed, crashed, stopped)."""
        self.add({"kind": "process", "client": "harness", "member": member, "event": event, "time": self.now(),
                  "detail": details})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def load_history(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Workload:
    """`clients` concurrent clients on one event loop thread, each with its own
    connections, doing a seeded mix of single appends, batch appends, reads (from the
    leader or from a named member), fresh reads (of the newest acknowledged append, in a
    consistency mode, for the checker's reads check) and metadata reads, until stopped."""

    def __init__(self, peers: str, group: str, members: list[str], history: History, seed: int,
                 clients: int = 4, pace_s: float = 0.02) -> None:
        self.peers = peers
        self.group = group
        self.members = members
        self.history = history
        self.seed = seed
        self.n_clients = clients
        self.pace_s = pace_s
        self.stop_event: asyncio.Event | None = None
        self.last_ok_append = -1.0  # completion time of the latest acknowledged append
        self.counts: dict[str, int] = {}
        self._high = -1  # highest index known committed, to aim reads near the tail
        self._acked_high = -1  # highest index of an acknowledged append (fresh reads start there)
        self._loop = LoopThread("chaos-workload")
        self._main: concurrent.futures.Future[None] | None = None

    # --- control (from another thread) ------------------------------------------------------------

    def start(self) -> None:
        async def main() -> None:
            self.stop_event = asyncio.Event()
            tasks = [asyncio.create_task(self._client(f"c{k}", random.Random(self.seed * 1000 + k)))
                     for k in range(self.n_clients)]
            await asyncio.gather(*tasks)

        self._main = asyncio.run_coroutine_threadsafe(main(), self._loop.loop)

    def stop(self, timeout: float = 30.0) -> None:
        """Ask every client to finish its current operation, and wait."""
        loop = self._loop.loop

        def set_stop() -> None:
            if self.stop_event is not None:
                self.stop_event.set()

        loop.call_soon_threadsafe(set_stop)
        if self._main is not None:
            try:
                self._main.result(timeout)
            except Exception:
                log.exception("workload did not stop cleanly")
        self._loop.close()

    # --- one client -----------------------------------------------------------------------------------------

    async def _client(self, name: str, rng: random.Random) -> None:
        seq = itertools.count()
        assert self.stop_event is not None
        async with AsyncDLedgerClient(self.peers, self.group, timeout=5.0, request_timeout=3.0) as c:
            while not self.stop_event.is_set():
                r = rng.random()
                if r < 0.55:
                    ok = await self._append(c, name, [f"s{self.seed}-{name}-{next(seq)}"])
                elif r < 0.75:
                    bodies = [f"s{self.seed}-{name}-{next(seq)}" for _ in range(rng.randint(2, 6))]
                    ok = await self._append(c, name, bodies)
                elif r < 0.83:
                    member = rng.choice([None, *self.members])
                    back = rng.randint(0, 40) if rng.random() < 0.8 else rng.randint(0, max(0, self._high))
                    ok = await self._read(c, name, max(0, self._high - back), rng.randint(1, 60), member)
                elif r < 0.92:
                    mode = rng.choice(FRESH_MODES)
                    member = rng.choice(self.members) if mode == "follower" else None
                    ok = await self._read(c, name, max(0, self._acked_high), 20, member, mode)
                else:
                    ok = await self._meta(c, name, rng.choice(self.members))
                pause = rng.uniform(0.0, self.pace_s) if ok else rng.uniform(0.05, 0.2)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), pause)

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _op(self, name: str, kind: str, invoke: float, request: dict[str, Any], outcome: str, result: Any,
            error: str | None, message: str = "") -> None:
        rec = {"client": name, "kind": kind, "invoke": invoke, "complete": self.history.now(), "request": request,
               "outcome": outcome, "result": result, "error": error}
        if message:
            rec["message"] = message[:300]
        self.history.add(rec)
        self._count(f"{kind}:{outcome}")

    async def _append(self, c: AsyncDLedgerClient, name: str, bodies: list[str]) -> bool:
        invoke = self.history.now()
        try:
            res = await c.append_batch([b.encode() for b in bodies])
        except DLedgerError as e:
            self._op(name, "append", invoke, {"bodies": bodies}, outcome_of(e.code), None, e.code.name, e.message)
            return False
        except Exception as e:  # an unexpected failure: the append may or may not have happened
            log.error("%s: append failed unexpectedly: %r", name, e)  # no traceback off the main thread
            self._op(name, "append", invoke, {"bodies": bodies}, "maybe", None, type(e).__name__, str(e))
            return False
        self._op(name, "append", invoke, {"bodies": bodies}, "ok", [[r.index, r.term] for r in res], None)
        self.last_ok_append = self.history.now()
        self._high = max(self._high, res[-1].index)
        self._acked_high = max(self._acked_high, res[-1].index)
        return True

    async def _read(self, c: AsyncDLedgerClient, name: str, start: int, max_entries: int,
                    member: str | None, mode: str = "") -> bool:
        """`mode` "": the default (the leader's linearizable read, or `member`'s own copy);
        else a fresh read in that mode ("follower": linearizable at `member`)."""
        invoke = self.history.now()
        req: dict[str, Any] = {"from": start, "max": max_entries, "member": member}
        consistency = None
        if mode:
            req["mode"] = mode
            consistency = "linearizable" if mode == "follower" else mode
        try:
            entries = await c.read(start, max_entries, member=member, consistency=consistency)
        except DLedgerError as e:
            self._op(name, "read", invoke, req, "fail", None, e.code.name, e.message)
            return False
        except Exception as e:
            log.error("%s: read failed unexpectedly: %r", name, e)
            self._op(name, "read", invoke, req, "fail", None, type(e).__name__, str(e))
            return False
        rows = [[e.index, e.term, e.body.decode("utf-8", "backslashreplace")] for e in entries]
        self._op(name, "read", invoke, req, "ok", {"entries": rows}, None)
        if entries:
            self._high = max(self._high, entries[-1].index)
        return True

    async def _meta(self, c: AsyncDLedgerClient, name: str, member: str) -> bool:
        invoke = self.history.now()
        try:
            m = await c.metadata(member)
        except DLedgerError as e:
            self._op(name, "meta", invoke, {"member": member}, "fail", None, e.code.name, e.message)
            return False
        result = {"self_id": m.self_id, "role": m.role, "term": m.term, "leader": m.leader_id,
                  "ledger_end_index": m.ledger_end_index, "committed_index": m.committed_index}
        self._op(name, "meta", invoke, {"member": member}, "ok", result, None)
        self._high = max(self._high, m.committed_index)
        return True
