"""Concurrent `append` calls on one AsyncDLedgerClient travel together, against a real
embedded group over TCP: indexes in call order, one answer per caller, shared fate only
where it is unavoidable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from dledger import AsyncDLedgerClient, DLedgerConfig, DLedgerError, DLedgerServer, ResponseCode
from dledger.ports import free_ports

from .test_embedded import _wait_leader

MAX_BODY = 1000


@asynccontextmanager
async def group(tmp_path: Path) -> AsyncIterator[tuple[str, list[DLedgerServer]]]:
    ports = free_ports(6)  # one call: two could hand out the same port (none is bound yet)
    peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(ports[:3]))
    servers = [DLedgerServer(DLedgerConfig(group="g", self_id=f"n{k}", peers=peers, metrics_port=m,
                                           store_dir=str(tmp_path / f"n{k}"), data_file_size=1 << 20,
                                           max_body_bytes=MAX_BODY))
               for k, m in enumerate(ports[3:])]
    for s in servers:
        await s.start()
    try:
        yield peers, servers
    finally:
        for s in servers:
            await s.stop()


def append_requests(servers: list[DLedgerServer]) -> float:
    """APPEND requests the group's members have committed (the leader's batch histogram)."""
    total = 0.0
    for s in servers:
        assert s.metrics is not None
        for m in ("n0", "n1", "n2"):
            v = s.metrics.registry.get_sample_value("dledger_append_batch_entries_count", {"group": "g", "member": m})
            total += v or 0.0
    return total


def run(tmp_path: Path, body: Callable[[str, list[DLedgerServer]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with group(tmp_path) as (peers, servers):
            await body(peers, servers)

    asyncio.run(main())


def test_concurrent_appends_share_requests_and_keep_call_order(tmp_path: Path) -> None:
    async def body(peers: str, servers: list[DLedgerServer]) -> None:
        async with AsyncDLedgerClient(peers, "g") as c:
            await _wait_leader(c)
            before = append_requests(servers)
            bodies = [f"c{k}".encode() for k in range(300)]
            results = await asyncio.gather(*(c.append(b) for b in bodies))
            indexes = [r.index for r in results]
            assert indexes == sorted(set(indexes)), "one index each, in call order"
            entries = {e.index: e.body for e in await c.read(indexes[0], 1000)}
            assert [entries[i] for i in indexes] == bodies
            requests = append_requests(servers) - before
            assert 1 <= requests < 300 / 10, f"{requests} requests for 300 concurrent appends"

    run(tmp_path, body)


def test_without_coalescing_each_append_is_a_request(tmp_path: Path) -> None:
    async def body(peers: str, servers: list[DLedgerServer]) -> None:
        async with AsyncDLedgerClient(peers, "g", coalesce=False) as c:
            await _wait_leader(c)
            before = append_requests(servers)
            await asyncio.gather(*(c.append(f"u{k}".encode()) for k in range(40)))
            assert append_requests(servers) - before == 40

    run(tmp_path, body)


def test_a_bad_body_fails_only_its_own_caller(tmp_path: Path) -> None:
    """The member refuses the whole coalesced request (nothing stored); the client sends
    each body alone, so the other callers still succeed."""
    async def body(peers: str, servers: list[DLedgerServer]) -> None:
        async with AsyncDLedgerClient(peers, "g") as c:
            await _wait_leader(c)
            bodies = [b"ok-1", b"x" * (MAX_BODY + 1), b"ok-2"]
            out = await asyncio.gather(*(c.append(b) for b in bodies), return_exceptions=True)
            assert isinstance(out[1], DLedgerError) and out[1].code == ResponseCode.UNEXPECTED_ARGUMENT
            good = [r for r in out if not isinstance(r, BaseException)]
            assert len(good) == 2
            stored = [e.body for e in await c.read(0, 1000)]
            assert stored.count(b"ok-1") == 1 and stored.count(b"ok-2") == 1
            assert bodies[1] not in stored

    run(tmp_path, body)


def test_a_cancelled_sender_does_not_take_the_others_down(tmp_path: Path) -> None:
    """The first append of an iteration sends the batch; cancelled before it sends, the
    appends that joined it are sent without it."""
    async def body(peers: str, servers: list[DLedgerServer]) -> None:
        async with AsyncDLedgerClient(peers, "g") as c:
            await _wait_leader(c)
            sender = asyncio.ensure_future(c.append(b"cancelled"))
            joiners = [asyncio.ensure_future(c.append(f"j{k}".encode())) for k in range(3)]
            await asyncio.sleep(0)  # all four have queued; the sender waits one iteration
            sender.cancel()
            results = await asyncio.gather(*joiners)
            assert sender.cancelled()
            got = {e.index: e.body for e in await c.read(0, 1000)}
            assert [got[r.index] for r in results] == [b"j0", b"j1", b"j2"]
            assert b"cancelled" not in got.values()

    run(tmp_path, body)

