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
WAKE_S = 0.25  # a blocked caller wakes this often to let a pending Ctrl-C through


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        # calls other threads wait on: close() ends those the stopped loop will never finish
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: set[concurrent.futures.Future[Any]] = set()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._result(self._submit(coro))

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        with self._lock:  # after close() began, nothing new reaches the loop
            if self._closed:
                coro.close()
                raise _closed()
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._waiting.add(fut)
        fut.add_done_callback(self._waiting.discard)
        return fut

    @staticmethod
    def _result(fut: concurrent.futures.Future[T]) -> T:
        """The future's result, waited for in slices: a SIGINT that lands just before a wait
        without a timeout begins (CPython runs signal handlers between bytecodes) would leave
        the main thread asleep until the result came, which for `read --follow` is never.
        Each slice's end lets the interpreter raise the KeyboardInterrupt."""
        try:
            while True:
                try:
                    return fut.result(timeout=WAKE_S)
                except concurrent.futures.TimeoutError:
                    if fut.done():  # the call itself raised TimeoutError
                        raise
        except concurrent.futures.CancelledError:  # close() from another thread ended it
            raise _closed() from None

    def iterate(self, agen: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator as a blocking iterator; leaving early (break, Ctrl-C) stops the
        call in flight and closes the generator."""
        pending: concurrent.futures.Future[T] | None = None
        try:
            while True:
                pending = self._submit(_next(agen))
                try:
                    item = self._result(pending)
                except StopAsyncIteration:
                    return
                pending = None
                yield item
        finally:
            if pending is not None:
                pending.cancel()
            if not self._closed:
                self.run(_close_agen(agen))

    def close(self, shutdown: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `shutdown()` on the loop, then stop it and its thread (idempotent). What other
        threads still wait on (a call between retries, a subscription's back-off) is cancelled
        and settles first, and a call the stopped loop would never run is cancelled after:
        their callers get "this client is closed", never a hang."""
        if self._closed:
            return
        self.run(shutdown())
        self.run(_cancel_all())
        with self._lock:
            self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        for fut in list(self._waiting):  # submitted between _cancel_all and the flag
            fut.cancel()
        self.loop.close()


def _closed() -> DLedgerError:
    return DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "this client is closed")


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
