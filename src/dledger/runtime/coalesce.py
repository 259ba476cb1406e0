"""Concurrent single-body calls travelling as one request (as a Kafka producer batches).

Shared by `AsyncDLedgerClient.append` (APPEND) and `AsyncBrokerClient.send` (SEND_MESSAGE):
the first call of a loop iteration opens a batch and yields once; the calls made meanwhile
join it (within the byte and body limits of one request); the first call then sends the
batch from its own task and every caller gets its own result, or the batch's error. The
callers of one batch share its fate: all are written or none, and an error whose outcome is
unknown is unknown for each of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from dledger.codes import DLedgerError, ResponseCode

R = TypeVar("R")


class Coalesced(Generic[R]):
    """Bodies of concurrent calls sent as one request; a None future is the sender's."""

    __slots__ = ("bodies", "futures", "size")

    def __init__(self, bodies: list[bytes], futures: list[asyncio.Future[R] | None]) -> None:
        self.bodies = bodies
        self.futures = futures
        self.size = sum(map(len, bodies))

    def add(self, body: bytes, fut: asyncio.Future[R]) -> None:
        self.bodies.append(body)
        self.futures.append(fut)
        self.size += len(body)

    def settle(self, results: list[R | DLedgerError]) -> None:
        for fut, r in zip(self.futures, results, strict=True):
            if fut is None or fut.done():
                continue
            if isinstance(r, DLedgerError):
                fut.set_exception(DLedgerError(r.code, r.message))
            else:
                fut.set_result(r)

    def fail(self, code: ResponseCode, message: str) -> None:
        for fut in self.futures:
            if fut is not None and not fut.done():
                fut.set_exception(DLedgerError(code, message))


class Coalescer(Generic[R]):
    """Joins the `submit` calls of one loop iteration into one `send_many` call.

    `send_many(bodies)` sends one request and returns one result (or error) per body, or
    raises for the request as a whole (every caller gets that error). `batches` counts the
    requests sent (a test or a benchmark sees the batching)."""

    def __init__(self, send_many: Callable[[list[bytes]], Awaitable[list[R | DLedgerError]]],
                 max_bytes: int, max_bodies: int, what: str = "request") -> None:
        self._send_many = send_many
        self.max_bytes, self.max_bodies, self.what = max_bytes, max_bodies, what
        self._open: Coalesced[R] | None = None  # the batch calls of this loop iteration join
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0

    async def submit(self, body: bytes) -> R:
        batch = self._open
        if batch is not None and batch.size + len(body) <= self.max_bytes and len(batch.bodies) < self.max_bodies:
            fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            batch.add(body, fut)
            return await fut
        # the first call of a batch sends it, from its own task (no task per request)
        batch = self._open = Coalesced([body], [None])
        try:
            await asyncio.sleep(0)  # the tasks ready in this loop iteration join the batch
        except BaseException:
            self._abandon(batch)
            raise
        if self._open is batch:
            self._open = None
        own = (await self._send(batch))[0]
        if isinstance(own, DLedgerError):
            raise own
        return own

    async def _send(self, batch: Coalesced[R]) -> list[R | DLedgerError]:
        """Send a batch and answer every caller that joined it."""
        self.batches += 1
        try:
            results = await self._send_many(batch.bodies)
        except DLedgerError as e:
            batch.fail(e.code, e.message)
            raise
        except BaseException as e:  # cancelled while the request was out: its outcome is unknown
            batch.fail(ResponseCode.UNKNOWN, f"the {self.what} carrying this body was abandoned "
                                             f"({type(e).__name__}): outcome unknown")
            raise
        batch.settle(results)
        return results

    def _abandon(self, batch: Coalesced[R]) -> None:
        """The sender was cancelled before sending: the others' bodies go in a task of their own."""
        if self._open is batch:
            self._open = None
        if len(batch.bodies) > 1:
            rest = Coalesced(batch.bodies[1:], batch.futures[1:])
            task = asyncio.get_running_loop().create_task(self._send_detached(rest))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send_detached(self, batch: Coalesced[R]) -> None:
        with contextlib.suppress(DLedgerError):  # every caller has its answer
            await self._send(batch)
