"""DLedgerServer embedded in one asyncio program: several groups per process, over TCP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from dledger import AsyncDLedgerClient, DLedgerConfig, DLedgerError, DLedgerServer, ResponseCode
from dledger.kv.commands import Put, encode
from dledger.kv.machine import KVStateMachine
from dledger.ports import free_ports
from dledger.store import FileLedgerStore


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


def test_a_leader_whose_disk_fills_steps_down_and_the_group_goes_on(tmp_path: Path) -> None:
    """A member whose store cannot write neither leads nor campaigns (issue 10, finding 3):
    the group elects a writable member and keeps committing; the member says why."""
    ports = free_ports(3)
    peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(ports))

    async def main() -> None:
        servers = {
            f"n{k}": DLedgerServer(DLedgerConfig(self_id=f"n{k}", peers=peers, store_dir=str(tmp_path / f"n{k}"),
                                                 data_file_size=1 << 20, retention_check_interval_ms=3_600_000))
            for k in range(3)
        }
        for s in servers.values():
            await s.start()
        client = AsyncDLedgerClient(peers, timeout=10.0)
        try:
            old = await _wait_leader(client)
            await client.append(b"before")
            store = servers[old].groups["default"].store
            assert isinstance(store, FileLedgerStore)
            store.disk_full = True  # what retention concludes when nothing more can be deleted
            deadline = time.monotonic() + 30
            while True:
                new = await _wait_leader(client)
                if new != old:
                    break
                assert time.monotonic() < deadline, f"{old} kept leading with a full disk"
                await asyncio.sleep(0.1)
            r = await client.append(b"after")
            assert (await client.get(r.index)).body == b"after"
            view = await client.metadata(old)  # what `dledger status` shows
            assert view.role != "leader" and "full" in view.store_error
            await asyncio.sleep(3)  # several election timeouts: it must not campaign
            assert servers[old].node().member.role.name == "FOLLOWER"
            store.disk_full = False
            r = await client.append(b"later")
            deadline = time.monotonic() + 30
            while store.committed_index < r.index:  # it takes entries again once it can write
                assert time.monotonic() < deadline, "the member did not catch up after its disk had room"
                await asyncio.sleep(0.1)
        finally:
            await client.close()
            for s in servers.values():
                await s.stop()

    asyncio.run(main())


def test_an_embedded_state_machine_is_applied_even_when_empty(tmp_path: Path) -> None:
    """`DLedgerServer(cfg, {group: machine})` with no `state_machine` in the config: an empty KV
    store (falsy: it has a length) was once taken for 'none given' and the group ran as a plain log."""
    port = free_ports(1)[0]
    peers = f"n0-127.0.0.1:{port}"
    machine = KVStateMachine()

    async def main() -> None:
        server = DLedgerServer(DLedgerConfig(self_id="n0", peers=peers, store_dir=str(tmp_path / "n0")),
                               {"default": machine})
        await server.start()
        client = AsyncDLedgerClient(peers, timeout=10.0)
        try:
            await _wait_leader(client)
            await client.propose(encode(Put(b"k", b"v")))
            assert machine.get(b"k") is not None
        finally:
            await client.close()
            await server.stop()

    asyncio.run(main())
