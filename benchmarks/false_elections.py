"""False elections of a healthy group: how often its term moves when no member fails.

`python benchmarks/false_elections.py --duration 600 [--hogs 4] [--clients 0] [--delay 0.2]`
starts a local group of three members (default timers unless `--config FILE`), optionally
`--hogs` CPU-bound processes beside it (a noisy neighbour), `--clients` closed-loop writers
(1 KiB single appends from this process; 0: idle), and with `--delay S` puts every link
between members behind a proxy that holds each chunk S seconds in each direction
(dledger.chaos.proxy: what `tc netem` would do where it is not available). Every member's
METADATA is asked once a second; every term increment is a false election, since nothing
failed. Prints one JSON line: term moves, their times, the members' worst event-loop stalls,
entries appended, load averages at start and end.

Member processes inherit this process's environment (PYTHONPATH included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from dledger.chaos.harness import Harness
from dledger.codes import DLedgerError
from dledger.config import Peer, format_peers
from dledger.local_cluster import check_ports_free, local_cluster, stop_processes, wait_ready
from dledger.ports import free_port_run
from dledger.runtime.client import AsyncDLedgerClient

STALL = "dledger_loop_stall_max_seconds"


def _hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stall(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(STALL):
                    return float(line.split()[-1])
    except OSError:
        return None
    return None


async def _watch(peers: str, group: str, duration: float, clients: int) -> dict[str, Any]:
    probe = AsyncDLedgerClient(peers, group, timeout=2.0)
    writer = AsyncDLedgerClient(peers, group, timeout=10.0)
    appended = errors = 0
    stop = False

    async def write() -> None:
        nonlocal appended, errors
        body = os.urandom(1024)
        while not stop:
            try:
                await writer.append(body)
                appended += 1
            except DLedgerError:
                errors += 1

    tasks = [asyncio.ensure_future(write()) for _ in range(clients)]
    moves: list[dict[str, Any]] = []
    start = time.monotonic()
    term = -1
    try:
        while time.monotonic() - start < duration:
            views = await probe.metadata_all()
            terms = [v.term for v in views.values() if not isinstance(v, DLedgerError)]
            top = max(terms, default=-1)
            if term >= 0 and top > term:
                leaders = sorted({v.leader_id for v in views.values() if not isinstance(v, DLedgerError)})
                moves.append({"at_s": round(time.monotonic() - start, 1), "from": term, "to": top, "leaders": leaders})
            term = max(term, top)
            await asyncio.sleep(1.0)
    finally:
        stop = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await writer.close()
        await probe.close()
    return {"term_moves": sum(m["to"] - m["from"] for m in moves), "moves": moves, "appended": appended,
            "errors": errors, "final_term": term}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds watched [600]")
    ap.add_argument("--hogs", type=int, default=0, help="CPU-bound processes beside the group [0]")
    ap.add_argument("--clients", type=int, default=0, help="closed-loop writers (0: an idle group) [0]")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds each chunk between members is held [0]")
    ap.add_argument("--config", default=None, help="a TOML every member is started with (other timers)")
    args = ap.parse_args()
    extra = ["--config", str(Path(args.config).resolve())] if args.config else []
    report: dict[str, Any] = {"duration_s": args.duration, "hogs": args.hogs, "clients": args.clients,
                              "delay_s": args.delay, "config": args.config or "", "loadavg_start": os.getloadavg()}
    hogs: list[subprocess.Popen[bytes]] = []  # started once the group serves: its start is not measured
    try:
        with tempfile.TemporaryDirectory(prefix="dledger-quiet-") as d:
            if args.delay > 0:
                h = Harness(3, Path(d), verbose=False, group="default", extra_args=extra)
                try:
                    h.start_all()
                    h.proxies.set_many({link: ("pass", args.delay) for link in h.proxies.links})
                    if h.wait_leader(60.0) is None:
                        raise SystemExit("no leader within 60 s")
                    hogs = _hogs(args.hogs)
                    report.update(asyncio.run(_watch(h.client_peers, "default", args.duration, args.clients)))
                finally:
                    h.close()
            else:
                port = free_port_run(6)  # the members', then their metrics ports
                metrics = port + 3
                peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
                lc = local_cluster(peers, "default", Path(d), metrics_base_port=metrics, extra=extra)
                check_ports_free(peers, metrics)
                try:
                    for m in ("n0", "n1", "n2"):
                        lc.start_member(m)
                    wait_ready(peers, "default", 180.0, lc.procs)  # a starved machine starts slowly
                    hogs = _hogs(args.hogs)
                    report.update(asyncio.run(_watch(peers, "default", args.duration, args.clients)))
                    report["worst_stall_s"] = {f"n{k}": _stall(metrics + k) for k in range(3)}
                finally:
                    stop_processes(lc.procs.values())
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    report["loadavg_end"] = os.getloadavg()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
