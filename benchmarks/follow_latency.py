"""How long after an append is acknowledged a subscriber has it (issue 12, docs/performance.md).

`python benchmarks/follow_latency.py [--appends 2000] [--rate 200] [--subscribers 2]`: a
local 3-member group; one appender at a steady rate notes when each append is acknowledged;
subscribers (`AsyncDLedgerClient.subscribe`, a long-poll READ) note when each entry arrives.
Latency = arrival - acknowledgement (same clock: one process); a negative value (the entry
arrived before the append's answer) counts as 0.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from dledger.config import Peer, format_peers
from dledger.local_cluster import local_cluster
from dledger.ports import free_ports
from dledger.runtime.client import AsyncDLedgerClient


async def run(peers: str, appends: int, rate: float, subscribers: int) -> dict[str, float]:
    acked: dict[int, float] = {}
    arrived: list[dict[int, float]] = [{} for _ in range(subscribers)]
    async with AsyncDLedgerClient(peers, timeout=30) as writer:
        start = (await writer.metadata()).committed_index + 1

        async def follow(k: int) -> None:
            async with AsyncDLedgerClient(peers, timeout=30) as c:
                async for e in c.subscribe(start):
                    arrived[k][e.index] = time.perf_counter()
                    if len(arrived[k]) >= appends:
                        return

        tasks = [asyncio.create_task(follow(k)) for k in range(subscribers)]
        await asyncio.sleep(0.5)  # subscribers are waiting at the server
        gap = 1.0 / rate
        t0 = time.perf_counter()
        for n in range(appends):
            r = await writer.append(f"follow-{n}".encode())
            acked[r.index] = time.perf_counter()
            await asyncio.sleep(max(0.0, t0 + (n + 1) * gap - time.perf_counter()))
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    lat = sorted(max(0.0, got[i] - acked[i]) * 1000 for got in arrived for i in acked)
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    return {"samples": len(lat), "p50_ms": pick(0.50), "p90_ms": pick(0.90), "p99_ms": pick(0.99),
            "max_ms": lat[-1]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--subscribers", type=int, default=2)
    args = ap.parse_args()
    ports = free_ports(3)
    peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", p) for k, p in enumerate(ports)})
    with tempfile.TemporaryDirectory() as d, local_cluster(peers, "default", Path(d)):
        print(asyncio.run(run(peers, args.appends, args.rate, args.subscribers)))


if __name__ == "__main__":
    main()
