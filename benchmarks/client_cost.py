"""What a client spends per append, this code against another's (docs/performance.md, "The
client's own cost").

`python benchmarks/client_cost.py [--clients 64] [--appends 600] [--repeat 3] [--before SRC]`

Starts one 3-member `flush=sync` group on 127.0.0.1 and measures, in a fresh process each
time, the CPU a load process spends per acknowledged 1 KiB append (its `process_time`, so
the members' CPU is not in it) with `--clients` clients, each on its own connection with
one append in flight:

- `client`: `AsyncDLedgerClient.append`, what applications and `dledger bench` use;
- `transport`: the bare `TransportClient.request` of a ready-made APPEND frame to the
  leader, the floor under it (the frame's round trip, nothing of leader search, retries,
  coalescing or result objects).

With `--before SRC`, each measurement is preceded by the same one with SRC first on
PYTHONPATH, so a pair shares the machine's conditions.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BODY = b"x" * 1024


async def _measure(kind: str, peers: str, clients: int, appends: int) -> dict[str, float]:
    """CPU per append of `clients` closed-loop clients, after one warm-up append each."""
    from dledger.codes import RequestCode
    from dledger.core.messages import AppendRequest, encode
    from dledger.runtime.client import AsyncDLedgerClient
    from dledger.runtime.frames import Message
    from dledger.runtime.transport_client import TransportClient

    probe = AsyncDLedgerClient(peers)
    await probe.append(BODY)
    leader = probe.peers[probe.leader_id or ""].address
    if kind == "client":
        users = [AsyncDLedgerClient(peers) for _ in range(clients)]

        async def one(c: AsyncDLedgerClient) -> None:
            await c.append(BODY)
    else:
        users = [TransportClient() for _ in range(clients)]  # type: ignore[misc]
        msg = Message(RequestCode.APPEND, encode(AppendRequest("default", "", "", [BODY])))

        async def one(c: TransportClient) -> None:  # type: ignore[misc]
            await c.request(leader, msg, 3.0)

    await asyncio.gather(*(one(c) for c in users))  # connected, warm

    async def loop(c: object) -> None:
        for _ in range(appends):
            await one(c)  # type: ignore[arg-type]

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop(c) for c in users))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = clients * appends
    for c in [*users, probe]:
        await c.close()
    return {"appends_per_s": n / wall, "cpu_us_per_append": cpu / n * 1e6}


def _run_measure(kind: str, peers: str, clients: int, appends: int, src: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--measure", kind, "--peers", peers, "--clients", str(clients),
                          "--appends", str(appends)], capture_output=True, check=True, env=env, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--appends", type=int, default=600, help="per client")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", metavar="SRC", help="also measure another version's src directory before each")
    ap.add_argument("--measure", choices=["client", "transport"], help=argparse.SUPPRESS)
    ap.add_argument("--peers", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        import uvloop

        print(json.dumps(uvloop.run(_measure(a.measure, a.peers, a.clients, a.appends))))
        return 0
    from dledger.config import Peer, format_peers
    from dledger.local_cluster import local_cluster
    from dledger.ports import free_port_run

    versions = [("before", a.before), ("this", None)] if a.before else [("this", None)]
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port_run(3)
        peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
        with local_cluster(peers, "default", Path(tmp), flush="sync"):
            for _ in range(a.repeat):
                for kind in ("client", "transport"):
                    for name, src in versions:
                        r = _run_measure(kind, peers, a.clients, a.appends, src)
                        print(f"{name:6s} {kind:9s} {r['appends_per_s']:8,.0f} appends/s  "
                              f"{r['cpu_us_per_append']:5.1f} us of the load process's CPU per append  "
                              f"load {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
