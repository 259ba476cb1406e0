"""Awaiting durability from asyncio without blocking the loop on fsync."""

from __future__ import annotations

import asyncio
import heapq
import itertools

from dledger.store.base import LedgerStore


class DurabilityWaiter:
    """`await waiter.wait(i)` returns once entry i is durable (group commit)."""

    def __init__(self, store: LedgerStore, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._store = store
        self._loop = loop or asyncio.get_running_loop()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        store.add_flush_listener(self._on_flush)

    async def wait(self, index: int) -> None:
        if self._store.durable_index >= index:
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._waiters, (index, next(self._seq), fut))
        self._store.request_flush()
        await fut

    def _on_flush(self, durable: int) -> None:
        # called from the flush thread
        self._loop.call_soon_threadsafe(self._release, durable)

    def _release(self, durable: int) -> None:
        durable = min(durable, self._store.durable_index)  # a truncate may have lowered it since
        while self._waiters and self._waiters[0][0] <= durable:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)
