"""An asyncio client behind a blocking API: a private event loop on its own thread, so the
blocking clients (DLedgerClient, BrokerClient) also work where a loop already runs
(notebooks, Spark tasks)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from dledger.codes import DLedgerError, ResponseCode

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop.is_closed():
            coro.close()
        self._check_open()
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        except concurrent.futures.CancelledError:  # close() from another thread cancelled it
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "this client is closed") from None

    def _check_open(self) -> None:
        if self.loop.is_closed():
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "this client is closed")

    def iterate(self, agen: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator as a blocking iterator; leaving early (break, Ctrl-C) stops the
        call in flight and closes the generator."""
        self._check_open()
        pending: concurrent.futures.Future[T] | None = None
        try:
            while True:
                pending = asyncio.run_coroutine_threadsafe(_next(agen), self.loop)
                try:
                    item = pending.result()
                except StopAsyncIteration:
                    return
                except concurrent.futures.CancelledError:  # closed from another thread
                    pending = None
                    raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "this client is closed") from None
                pending = None
                yield item
        finally:
            if pending is not None:
                pending.cancel()
            if not self.loop.is_closed():
                self.run(_close_agen(agen))

    def close(self, shutdown: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `shutdown()` on the loop, then stop it and its thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.run(shutdown())
        # what other threads still wait on (a call between retries, a subscription's back-off)
        # is cancelled and settles before the loop stops: their callers get "closed", not a hang
        asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


async def _cancel_all() -> None:
    """Cancel every other task of this loop and wait until they have ended (as asyncio.run)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _next(agen: AsyncGenerator[T, None]) -> T:
    return await agen.__anext__()


async def _close_agen(agen: AsyncGenerator[Any, None]) -> None:
    """Close a generator whose step was just cancelled (the cancellation lands a turn later)."""
    for _ in range(500):
        if not getattr(agen, "ag_running", False):
            break
        await asyncio.sleep(0.01)
    with contextlib.suppress(RuntimeError, asyncio.CancelledError):
        await agen.aclose()
