"""Master failover of a broker set end to end (issue 14), and what two copies buy.

`python benchmarks/broker_failover.py [--kills 20] [--seconds 5] [--json]`

Failover: three controllers and a 2-replica broker set with all-ack, default timings (lease
1 s, heartbeats every 300 ms, heartbeat timeout 1.5 s, scan every 250 ms). A writer sends
one record at a time; the master is SIGKILLed and the clock runs until the first send
acknowledged by the new master (epoch higher). The old master is restarted and rejoins before
the next kill. Median and p99 over `--kills` kills.

Throughput, one run on this machine, side by side: the 2-replica all-ack broker set (with
flush=async, and again with flush=sync) vs a 3-member dledger group with flush=sync, for
single 1 KiB appends from 16 and from 64 concurrent callers on one client, and batches of
100 x 1 KiB from 4 callers, each for `--seconds`. Each broker set is measured twice in the
same run: first with the client's coalescing off (`coalesce=False`: every send its own
SEND_MESSAGE, the path before coalescing), then on. `--kills 0` skips the failovers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dledger.broker.client import AsyncBrokerClient, BrokerClient
from dledger.broker.local import local_broker_cluster
from dledger.codes import DLedgerError
from dledger.config import Peer, format_peers
from dledger.local_cluster import local_cluster
from dledger.ports import free_port_run
from dledger.runtime.client import AsyncDLedgerClient

BODY = b"x" * 1024


def wait_master(d: local_broker_cluster, not_key: str | None = None, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        key = d.master_of("b0")
        if key is not None and key != not_key:
            return key
        time.sleep(0.05)
    raise RuntimeError("no master")


def failovers(d: local_broker_cluster, kills: int) -> list[float]:
    out: list[float] = []
    with BrokerClient(d.controller, "b0", timeout=0.5) as c:
        for _ in range(kills):
            master = wait_master(d)
            while len(d.info(master).sync_state_set) < 2:  # a candidate in sync
                time.sleep(0.05)
            epoch = c.send(b"before").epoch
            t0 = time.perf_counter()
            d.kill_broker(master)
            while True:
                try:
                    if c.send(b"after").epoch > epoch:
                        break
                except DLedgerError:
                    pass
            out.append(time.perf_counter() - t0)
            d.start_broker(master)
    return out


async def _load(send: Any, clients: int, seconds: float, batch: int) -> float:
    """Records acknowledged per second by `clients` concurrent senders."""
    done = 0
    stop = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await send([BODY] * batch)
            done += batch

    await asyncio.gather(*(one() for _ in range(clients)))
    return done / seconds


SINGLES = (16, 64)  # concurrent single-record callers on one client


async def broker_rates(controller: str, seconds: float, coalesce: bool) -> dict[str, float]:
    """One client: single sends from 16 and 64 concurrent callers (coalesced into shared
    SEND_MESSAGE requests, or each its own request: the path before coalescing), and
    batches of 100 from 4 callers."""
    client = AsyncBrokerClient(controller, "b0", timeout=10, coalesce=coalesce)

    async def send(bodies: list[bytes]) -> None:
        if len(bodies) == 1:
            await client.send(bodies[0])
        else:
            await client.send_batch(bodies)

    try:
        out = {f"single{n}": await _load(send, n, seconds, 1) for n in SINGLES}
        out["batch100"] = await _load(send, 4, seconds, 100)
        return out
    finally:
        await client.close()


async def raft_rates(peers: str, seconds: float) -> dict[str, float]:
    client = AsyncDLedgerClient(peers, timeout=10)

    async def send(bodies: list[bytes]) -> None:
        if len(bodies) == 1:
            await client.append(bodies[0])
        else:
            await client.append_batch(bodies)

    try:
        out = {f"single{n}": await _load(send, n, seconds, 1) for n in SINGLES}
        out["batch100"] = await _load(send, 4, seconds, 100)
        return out
    finally:
        await client.close()


async def _both(controller: str, seconds: float) -> dict[str, dict[str, float]]:
    """The path before coalescing, then with it, on the same deployment."""
    return {"uncoalesced": await broker_rates(controller, seconds, coalesce=False),
            "coalesced": await broker_rates(controller, seconds, coalesce=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sync = local_broker_cluster(Path(tmp) / "s", 3, 1, 2, free_port_run(7),
                                    ["--all-ack-in-sync-state-set", "--flush", "sync"])
        with sync:
            wait_master(sync)
            report["broker_2_replicas_all_ack_sync"] = asyncio.run(_both(sync.controller, args.seconds))
        d = local_broker_cluster(Path(tmp) / "b", 3, 1, 2, free_port_run(7), ["--all-ack-in-sync-state-set"])
        with d:
            wait_master(d)
            report["broker_2_replicas_all_ack"] = asyncio.run(_both(d.controller, args.seconds))
            if args.kills:
                times = sorted(failovers(d, args.kills))
                report["failover_s"] = {"median": round(statistics.median(times), 3),
                                        "p99": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3),
                                        "min": round(times[0], 3), "kills": len(times)}
        base = free_port_run(3)
        peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", base + k) for k in range(3)})
        with local_cluster(peers, "default", Path(tmp) / "r", flush="sync"):
            report["raft_3_members_sync"] = asyncio.run(raft_rates(peers, args.seconds))
    r = report["raft_3_members_sync"]
    for side in ("broker_2_replicas_all_ack", "broker_2_replicas_all_ack_sync"):
        for mode, rates in report[side].items():
            report[f"ratio_{side}_{mode}_over_raft"] = {k: round(v / r[k], 2) for k, v in rates.items()}
            report[side][mode] = {k: round(v) for k, v in rates.items()}
    report["raft_3_members_sync"] = {k: round(v) for k, v in r.items()}
    if args.json:
        print(json.dumps(report))
        return
    for k, v in report.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
