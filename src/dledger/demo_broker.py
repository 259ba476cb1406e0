"""The controller mode stage of `make demo` (docs/brokers.md): a broker set of two replicas with
all-ack, elected and failed over by three controllers.

Writers send under load; the master's replication is paused for a moment (a network hiccup:
its last records reach only its own disk, so they are not acknowledged) and the master is
SIGKILLed. The demo shows the time from the kill to the first send the new master
acknowledges, that every acknowledged record is in the new master's log, and the old master
coming back as a slave and cutting its unacknowledged tail (the truncation offset).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console

from dledger.broker.client import AsyncBrokerClient, BrokerClient
from dledger.broker.local import local_broker_cluster
from dledger.codes import DLedgerError
from dledger.ports import free_port_run

console = Console()
WRITERS = 4


class Load:
    """Writers sending one record at a time; what was acknowledged, and when."""

    def __init__(self, controller: str) -> None:
        self.controller = controller
        self.acked: dict[int, bytes] = {}  # index -> body
        self.ack_times: list[tuple[float, int]] = []  # (monotonic time, epoch)
        self.failures = 0
        self.stop = False

    async def writer(self, k: int) -> None:
        async with AsyncBrokerClient(self.controller, "b0", timeout=5.0) as c:
            seq = 0
            while not self.stop:
                body = f"w{k}-{seq}".encode()
                seq += 1
                try:
                    r = await c.send(body)
                except DLedgerError:
                    self.failures += 1
                    await asyncio.sleep(0.02)
                    continue
                self.acked[r.index] = body
                self.ack_times.append((time.monotonic(), r.epoch))

    async def run(self, seconds: float, during: asyncio.Future[None] | None = None) -> None:
        tasks = [asyncio.create_task(self.writer(k)) for k in range(WRITERS)]
        await asyncio.sleep(seconds)
        if during is not None:
            await during
        self.stop = True
        await asyncio.gather(*tasks)


def broker_demo(base: Path) -> bool:
    console.rule("[bold]4. controller mode: a 2-replica broker set, all-ack, SIGKILL the master under load")
    port = free_port_run(3 + 4)
    d = local_broker_cluster(base / "brokers", controllers=3, broker_sets=1, replicas=2, base_port=port,
                             broker_args=["--all-ack-in-sync-state-set", "--enable-fault-injection"])
    with d:
        master = None
        while master is None:  # the lease comes with the master's next heartbeat
            time.sleep(0.1)
            master = d.master_of("b0")
        slave = next(k for k in d.brokers if k != master)
        console.print(f"controllers {d.controller}; master {master} (id {d.info(master).broker_id}), "
                      f"slave {slave}; every send waits for both copies")
        load = Load(d.controller)
        killed: dict[str, float] = {}

        async def failover() -> None:
            await asyncio.sleep(2.0)
            with BrokerClient(d.controller, "b0") as c:
                c.inject_faults(d.specs[master].address, ha_paused=True)
            while d.info(master).max_offset <= d.info(slave).max_offset:
                await asyncio.sleep(0.01)
            killed["at"] = time.monotonic()
            killed["old_max"] = d.info(master).max_offset
            d.kill_broker(master)
            await asyncio.sleep(4.0)

        async def main() -> None:
            await load.run(0.5, asyncio.ensure_future(failover()))

        asyncio.run(main())
        new_master = d.master_of("b0")
        after = [t for t, epoch in load.ack_times if t > killed["at"] and epoch >= 2]
        if new_master != slave or not after:
            console.print(f"[red]no acknowledged send after the failover (master now {new_master})[/red]")
            return False
        console.print(f"SIGKILL of the master -> first send acknowledged by the new master: "
                      f"[bold]{after[0] - killed['at']:.2f} s[/bold] (master epoch {d.info(slave).master_epoch}); "
                      f"{len(load.acked)} sends acknowledged, {load.failures} refused or timed out during the switch")
        with BrokerClient(d.controller, "b0") as c:
            log = {index: body for index, _, body in _read_all(c, d.specs[slave].address)}
            lost = [i for i, body in load.acked.items() if log.get(i) != body]
            console.print(f"acknowledged records missing from the new master: [bold]{len(lost)}[/bold]")
            d.start_broker(master)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    info = d.info(master)
                    if info.role == "SLAVE" and info.truncated_at is not None:
                        break
                except DLedgerError:
                    pass
                time.sleep(0.2)
            info = d.info(master)
            console.print(f"old master back as {info.role}: truncated its log from {killed['old_max']} to "
                          f"[bold]{info.truncated_at}[/bold] (the unacknowledged tail), then followed the new master")
            while time.monotonic() < deadline and d.info(master).max_offset != d.info(slave).max_offset:
                time.sleep(0.2)
            same = _read_all(c, d.specs[master].address) == _read_all(c, d.specs[slave].address)
            console.print(f"both replicas hold the same confirmed records: {same}")
        return not lost and info.truncated_at is not None and same


def _read_all(c: BrokerClient, address: str) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    while True:
        page = c.read(len(out), 10_000, replica=address)
        out.extend((r.index, r.epoch, r.body) for r in page)
        if len(page) < 10_000:
            return out
