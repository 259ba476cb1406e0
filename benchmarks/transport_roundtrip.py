"""The transport alone: CPU microseconds per request round trip (issue 27, the transport split).

`python benchmarks/transport_roundtrip.py [--requests 100000] [--inflight 64] [--conns 1] [--label main]`:
a TransportServer with a direct echo handler and TransportClients in one process on uvloop,
`--inflight` requesters sending small requests (100 bytes of meta) over `--conns` connections
(one client each; requester k uses connection k mod conns). CPU
time (process_time) per request is the figure to compare: on a shared machine it moves far
less than wall-clock throughput. Run it with PYTHONPATH pointing at each tree to compare two.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from dledger.runtime.transport import Caller, Message, Respond, TransportClient, TransportServer, install_uvloop


def echo(msg: Message, respond: Respond, caller: Caller) -> None:
    respond(Message(0, msg.meta, b""))


async def run(requests: int, inflight: int, conns: int = 1) -> tuple[float, float]:
    server = TransportServer(direct=echo)
    await server.start("127.0.0.1", 0)
    clients = [TransportClient() for _ in range(conns)]
    address, meta = server.address, b"x" * 100

    async def requester(n: int, client: TransportClient) -> None:
        for _ in range(n):
            await client.request(address, Message(1, meta), 10)

    try:
        await asyncio.gather(*(requester(1000 // conns + 1, c) for c in clients))  # connected and warm
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(requester(requests // inflight, clients[k % conns]) for k in range(inflight)))
        done = requests // inflight * inflight
        return (time.process_time() - cpu) / done * 1e6, done / (time.perf_counter() - wall)
    finally:
        for c in clients:
            await c.close()
        await server.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--conns", type=int, default=1)
    p.add_argument("--label", default="")
    a = p.parse_args()
    install_uvloop()
    cpu_us, per_s = asyncio.run(run(a.requests, a.inflight, a.conns))
    print(f"{a.label or 'transport'}: {cpu_us:.2f} CPU us per request, {per_s:,.0f} requests/s")


if __name__ == "__main__":
    main()
