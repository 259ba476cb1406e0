"""One PySyncObj member of the comparison, driven the way PySyncObj's own benchmarks are
(benchmarks/testobj.py in its repository): every member submits replicated commands with a
callback and counts the ones that completed (applied after commit), per second.

Run by benchmarks/compare.py as `python syncobj_node.py SELF PARTNER...  --journal FILE`.
It prints `ready` once a leader is known, then for each JSON line on stdin
({"mode": "closed"|"rate", ...}, see `run`) runs that load from `start_at` (wall clock, shared
by the three members) and prints one JSON result line; `quit` ends it.

Closed loop: at most `window` commands of this member in flight (a semaphore released by the
callback). Rate: commands submitted on a fixed schedule, latency measured from the scheduled
time. The journal is a file (PySyncObj's FileJournal: mmap, never fsynced), the durability
class of dledger's flush=async.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from functools import partial
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated  # type: ignore[import-untyped, import-not-found, unused-ignore]

_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}


class ReplicatedLog(SyncObj):  # type: ignore[misc]
    """A replicated counter of appended bodies (the bodies themselves are in the Raft log)."""

    def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, partners, conf)
        self.applied = 0

    @replicated  # type: ignore[untyped-decorator]
    def add(self, body: bytes) -> int:
        self.applied += 1
        return self.applied

    @replicated  # type: ignore[untyped-decorator]
    def add_batch(self, bodies: list[bytes]) -> int:
        self.applied += len(bodies)
        return self.applied


def run(obj: ReplicatedLog, cmd: dict[str, Any]) -> dict[str, Any]:
    size, batch = int(cmd["size"]), int(cmd["batch"])
    warmup, duration = float(cmd["warmup"]), float(cmd["duration"])
    body = os.urandom(size)
    payload: Any = body if batch == 1 else [body] * batch
    submit = obj.add if batch == 1 else obj.add_batch
    while time.time() < cmd["start_at"]:
        time.sleep(min(0.01, max(0.0, cmd["start_at"] - time.time())))
    start = time.perf_counter() + warmup
    end = start + duration
    out: dict[str, Any] = {"entries": 0, "requests": 0, "latencies_ms": [], "done_at": [], "errors": {}}
    lock = threading.Lock()
    window = threading.Semaphore(int(cmd.get("window", 1)))

    def done(res: Any, err: int, sent: float, closed: bool) -> None:
        now = time.perf_counter()
        with lock:
            if now >= start and sent < end:
                if err == FAIL_REASON.SUCCESS:
                    out["entries"] += batch
                    out["requests"] += 1
                    out["latencies_ms"].append((now - sent) * 1000)
                    out["done_at"].append(now - start)
                else:
                    name = _NAMES.get(err, str(err))
                    out["errors"][name] = out["errors"].get(name, 0) + 1
        if closed:
            window.release()

    sent_total = 0
    if cmd["mode"] == "closed":
        while time.perf_counter() < end:
            if not window.acquire(timeout=0.1):
                continue
            sent = time.perf_counter()
            submit(payload, callback=partial(done, sent=sent, closed=True))
            sent_total += 1
        drained, deadline = 0, time.monotonic() + 10  # the next load starts from an idle group
        while drained < int(cmd["window"]) and time.monotonic() < deadline:
            drained += window.acquire(timeout=0.1)
    else:
        interval = batch / float(cmd["rate"])
        next_at = time.perf_counter()
        while time.perf_counter() < end:
            now = time.perf_counter()
            while next_at <= now:
                submit(payload, callback=partial(done, sent=next_at, closed=False))
                sent_total += 1
                next_at += interval
            time.sleep(max(0.0, min(next_at - time.perf_counter(), 0.001)))
        time.sleep(2.0)
    with lock:
        out["elapsed"] = duration
        out["sent"] = sent_total
        return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("self_addr")
    ap.add_argument("partners", nargs="+")
    ap.add_argument("--journal", required=True)
    ap.add_argument("--conf", default="{}", help="SyncObjConf overrides as JSON (default: its defaults)")
    args = ap.parse_args()
    conf = SyncObjConf(journalFile=args.journal, **json.loads(args.conf))
    obj = ReplicatedLog(args.self_addr, args.partners, conf)
    while obj._getLeader() is None:
        time.sleep(0.1)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        print(json.dumps(run(obj, json.loads(line))), flush=True)
    obj.destroy()


if __name__ == "__main__":
    main()
