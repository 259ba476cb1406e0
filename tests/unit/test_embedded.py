"""DLedgerServer embedded in one asyncio program: several groups per process, over TCP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from dledger import AsyncDLedgerClient, DLedgerConfig, DLedgerError, DLedgerServer, ResponseCode
from dledger.ports import free_ports


async def _wait_leader(client: AsyncDLedgerClient, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = await client.metadata()
            if m.leader_id:
                return m.leader_id
        except DLedgerError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("no leader")


def test_two_groups_in_three_embedded_servers(tmp_path: Path) -> None:
    ports = free_ports(3)
    peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(ports))

    async def main() -> None:
        servers = [
            DLedgerServer([
                DLedgerConfig(group=g, self_id=f"n{k}", peers=peers, store_dir=str(tmp_path / g / f"n{k}"),
                              data_file_size=1 << 20)
                for g in ("orders", "payments")
            ])
            for k in range(3)
        ]
        for s in servers:
            await s.start()
        try:
            orders = AsyncDLedgerClient(peers, "orders")
            payments = AsyncDLedgerClient(peers, "payments")
            await _wait_leader(orders)
            await _wait_leader(payments)
            o = await orders.append_batch([b"o1", b"o2"])
            p = await payments.append(b"p1")
            assert [r.index for r in o] == [o[0].index, o[0].index + 1]
            assert [e.body for e in await orders.read(0)] == [b"o1", b"o2"]
            assert [e.body for e in await payments.read(0)] == [b"p1"]
            assert (await payments.get(p.index)).body == b"p1"
            unknown = AsyncDLedgerClient(peers, "nope", timeout=1.0)
            try:
                await unknown.append(b"x")
                raise AssertionError("append to an unknown group succeeded")
            except DLedgerError as e:
                assert e.code == ResponseCode.UNKNOWN_GROUP
            for c in (orders, payments, unknown):
                await c.close()
        finally:
            for s in servers:
                await s.stop()

    asyncio.run(main())
