"""How long the controller takes to replace a dead master (issue 13's default timings).

Goal: the controller's part of a 2 s master failover end to end (issue 14 adds the broker's).

`python benchmarks/controller_failover.py [--trials 10] [--json]`: three `dledger controller`
processes with the default settings (heartbeat timeout 1.5 s, scan every 250 ms); for each
trial a new broker set of two replicas (ControllerClient heartbeats every 300 ms, each
replica listening for NOTIFY_BROKER_ROLE_CHANGED), replica 1 elected, SyncStateSet {1, 2}.
Then replica 1 dies and the clock runs until replica 2 holds the push naming it master:

- crash: its process is gone (its connections close: the controllers see it at once);
- silent: its heartbeats stop, its connections stay open (a hung process, a partition):
  the controllers wait out the heartbeat timeout.

Member processes inherit this process's environment (PYTHONPATH included).
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

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller.client import ControllerClient
from dledger.local_cluster import local_cluster
from dledger.ports import free_ports
from dledger.runtime.transport import Message, TransportServer

BEAT_S = 0.3


class Replica:
    def __init__(self, ctl: str, name: str, broker_id: int, port: int) -> None:
        self.name, self.broker_id, self.address = name, broker_id, f"127.0.0.1:{port}"
        self.client = ControllerClient(ctl, timeout=15.0)
        self.pushed = asyncio.Event()
        self.server = TransportServer(self._on_push)
        self.beating: asyncio.Task[None] | None = None
        self.stopped = False

    async def _on_push(self, msg: Message) -> Message:
        note = m.decode_request(msg.code, msg.meta)
        if isinstance(note, m.NotifyBrokerRoleChanged) and note.master_broker_id == self.broker_id:
            self.pushed.set()
        return Message(0, m.encode(m.Response()))

    async def start(self, port: int) -> None:
        await self.server.start("127.0.0.1", port)
        c = self.client
        assert (await c.apply_broker_id("c", self.name, self.broker_id, f"{self.address};0")).code == RC.SUCCESS
        assert (await c.register_broker("c", self.name, self.broker_id, self.address)).code == RC.SUCCESS
        self.beating = c.beat_forever(self._heartbeat, BEAT_S)

    def _heartbeat(self) -> m.BrokerHeartbeat:
        return m.BrokerHeartbeat("c", self.address, self.name, self.broker_id, 1, 0)

    def hang(self) -> None:
        """Say nothing more; the connections stay open."""
        if self.beating is not None:
            self.beating.cancel()

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.hang()
        await self.client.close()
        await self.server.close()


async def trial(ctl: str, name: str, mode: str) -> float:
    ports = free_ports(2)
    a, b = Replica(ctl, name, 1, ports[0]), Replica(ctl, name, 2, ports[1])
    await a.start(ports[0])
    await b.start(ports[1])
    try:
        await asyncio.sleep(2 * BEAT_S)  # both heard by every controller
        assert (await a.client.elect_master(name, 1)).code == RC.SUCCESS
        assert (await a.client.alter_sync_state_set(name, 1, 1, [1, 2], 1)).code == RC.SUCCESS
        await asyncio.sleep(2 * BEAT_S)
        t0 = time.perf_counter()
        if mode == "crash":
            await a.stop()
        else:
            a.hang()
        await asyncio.wait_for(b.pushed.wait(), 30)
        return time.perf_counter() - t0
    finally:
        await a.stop()
        await b.stop()


async def run(ctl: str, trials: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"crash": [], "silent": []}
    for k in range(trials):
        for mode in out:
            out[mode].append(await trial(ctl, f"set-{mode}-{k}", mode))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ports = free_ports(3)
    peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(ports))
    ctl = ";".join(f"127.0.0.1:{p}" for p in ports)
    with tempfile.TemporaryDirectory() as d, local_cluster(peers, "controller", Path(d), command="controller"):
        times = asyncio.run(run(ctl, args.trials))
    report: dict[str, Any] = {
        mode: {"median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3), "min_s": round(min(v), 3),
               "trials": len(v)} for mode, v in times.items()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for mode, r in report.items():
        print(f"{mode:<7} master replaced and pushed in median {r['median_s']:.3f} s "
              f"(min {r['min_s']:.3f}, max {r['max_s']:.3f}, {r['trials']} trials)")


if __name__ == "__main__":
    main()
