"""The client side of the transport: one lazily opened, multiplexed connection per remote address.

Requests are multiplexed on a connection by request id and may be answered in any order.
Heartbeats and votes (PRIORITY_CODES) travel on a second connection to the same address of
their own, so a follower's liveness never waits behind megabytes of pushes queued on the
bulk one (in our write buffer, the socket's, or the receiver's turn budget).
A connect that fails puts the address in backoff, during which requests fail fast; only
transport failures (NETWORK_ERROR, TIMEOUT) raise, an error the server answers is an
ordinary response. With a FaultInjector (runtime.faults: tests and chaos runs) requests to
blocked addresses fail as a partition would; without one nothing of it is consulted.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import re
import ssl as ssl_module
import time
from collections.abc import Callable
from typing import Final

from dledger.address import AddressError, parse_address
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.runtime.connection import FrameProtocol
from dledger.runtime.faults import BLOCKED, FaultInjector
from dledger.runtime.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FIXED_SIZE,
    KIND_REQUEST,
    KIND_RESPONSE,
    PRIORITY_CODES,
    Buffer,
    FrameError,
    Message,
    frame_problem,
)
from dledger.security.roles import Principal, ServerCheck, cert_principal

__all__ = ["TransportClient"]

log = logging.getLogger(__name__)

# A client drops a connection it has not used for this long and opens a new one, well before a
# server's idle timeout (5 min by default) could close it under a request just sent.
_CLIENT_IDLE_S: Final = 60.0


def _split_address(address: str) -> tuple[str, int]:
    """(host, port) to connect to: the host without an IPv6 literal's brackets."""
    try:
        return parse_address(address)
    except AddressError as e:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, str(e)) from None


class _ClientConnection(FrameProtocol):
    def __init__(self, address: str, max_frame_bytes: int, on_lost: Callable[[_ClientConnection], None],
                 priority: bool = False, big_answers: bool = False) -> None:
        super().__init__(max_frame_bytes, big_answers=big_answers)
        self.address = address
        self.priority = priority  # the lane of heartbeats and votes (PRIORITY_CODES)
        self.pending: dict[int, asyncio.Future[Message]] = {}
        self._on_lost = on_lost
        self.last_used = time.monotonic()

    def server_principal(self) -> Principal:
        """Who the server's certificate says it is (no roles without TLS)."""
        return cert_principal(self._transport.get_extra_info("peercert") if self._transport is not None else None)

    def _on_frame(self, kind: int, request_id: int, code: int, meta: bytes, data: Buffer) -> None:
        if kind != KIND_RESPONSE:
            raise FrameError(f"frame of kind {kind} sent to a client")
        fut = self.pending.pop(request_id, None)
        if fut is None or fut.done():
            log.debug("dropping response %d from %s: request already gave up", request_id, self.address)
            return
        fut.set_result(Message(code, meta, data))

    def _lost(self, reason: str) -> None:
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(DLedgerError(ResponseCode.NETWORK_ERROR, reason))
        self._on_lost(self)


# in a connect failure's message (before its first ": "): the peer refused the connection
# (ECONNREFUSED: nothing listens at the address), not a timeout, a TLS or token failure (a
# member that is there but stalled); runtime.client.refused reads it
REFUSED: Final = "nothing listens (connection refused)"
_ERRNO = re.compile(r"\[Errno (\d+)\]")


def _is_refusal(e: BaseException) -> bool:
    """ECONNREFUSED from every address tried (asyncio joins several into one OSError)."""
    if isinstance(e, ConnectionRefusedError):
        return True
    if not isinstance(e, OSError) or isinstance(e, ssl_module.SSLError):
        return False
    codes = _ERRNO.findall(str(e))
    return bool(codes) and all(int(c) == errno.ECONNREFUSED for c in codes)


class _Peer:
    """One lane to one address: its connection, and the backoff after a failed connect."""

    __slots__ = ("address", "backoff", "conn", "connecting", "failure", "host", "port", "priority", "refused",
                 "retry_at")

    def __init__(self, address: str, backoff: float, priority: bool = False) -> None:
        self.address = address
        self.priority = priority
        self.host, self.port = _split_address(address)
        self.conn: _ClientConnection | None = None
        self.connecting: asyncio.Task[_ClientConnection] | None = None
        self.backoff = backoff
        self.retry_at = 0.0
        self.failure = ResponseCode.NETWORK_ERROR  # what the last connect attempt ended with
        self.refused = False  # ... and whether it was refused (REFUSED)


class TransportClient:
    """One per process: a lazily opened, multiplexed connection per remote address.

    After a failed connect, requests to that address fail fast with NETWORK_ERROR until
    the backoff (doubling up to ``backoff_max_s``, reset by a successful connect) expires,
    so a dead peer costs nothing but a dictionary lookup. ``clock`` drives only the
    backoff, so tests can step it instead of sleeping.
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        faults: FaultInjector | None = None,
        connect_timeout_s: float = 2.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        ssl: ssl_module.SSLContext | None = None,
        server_check: ServerCheck | None = None,
        auth_token: bytes | None = None,
        big_answers: bool = False,
    ) -> None:
        """`ssl`: a client context (mutual TLS); `server_check` judges the server's certificate
        after the handshake (security.roles.expect_members: the member the address belongs to,
        so a client certificate signed by the same CA cannot pose as a member);
        `auth_token` is presented first on every connection; `big_answers`: a client of bulk
        reads (frames.FrameDecoder), never a member's links to its peers."""
        if max_frame_bytes < FIXED_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {FIXED_SIZE}")
        self._ssl = ssl
        self._server_check = server_check
        self._auth_token = auth_token or None
        self._big_answers = big_answers
        self._max_frame_bytes = max_frame_bytes
        self._faults = faults
        self._connect_timeout = connect_timeout_s
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._clock = clock
        self._peers: dict[tuple[str, bool], _Peer] = {}  # (address, priority lane) -> its lane
        self._ids = itertools.count(1)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        if faults is not None:
            faults.subscribe(self._on_block)

    async def request(self, address: str, msg: Message, timeout: float) -> Message:
        """Send ``msg`` and wait for its response; raises only NETWORK_ERROR or TIMEOUT.

        (UNEXPECTED_ARGUMENT for a bad address or a frame the local limit refuses.)
        """
        if self._closed:
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "transport client is closed")
        self._loop = asyncio.get_running_loop()
        faults = self._faults
        if faults is not None:  # (tests and chaos runs only)
            self._check_blocked(address, faults)
        problem = frame_problem(msg.code, msg.meta, msg.data, self._max_frame_bytes)
        if problem is not None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, problem)
        lane = (address, msg.code in PRIORITY_CODES)
        peer = self._peers.get(lane)
        conn = peer.conn if peer is not None else None
        now = time.monotonic()
        if conn is not None and now - conn.last_used > _CLIENT_IDLE_S:
            # the server may be closing it as idle right now: a request sent into that race
            # would fail although it was never read; a fresh connection is cheap
            self._drop_lane(lane, "idle")
            conn = None
        if conn is not None and conn.can_queue and (faults is None or faults.delay_s <= 0):
            conn.last_used = now
            return await self._request_now(conn, address, msg, timeout)
        try:
            async with asyncio.timeout(timeout):
                return await self._request(lane, msg)
        except TimeoutError:
            raise DLedgerError(ResponseCode.TIMEOUT, _timeout_text(msg, address, timeout)) from None

    async def _request_now(self, conn: _ClientConnection, address: str, msg: Message, timeout: float) -> Message:
        """The common case: connected, nothing queued ahead. The frame is queued at once and
        a plain timer replaces asyncio.timeout (the client's per-request cost matters: load
        generators and Spark tasks share the machine with the members)."""
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        fut: asyncio.Future[Message] = loop.create_future()
        conn.pending[request_id] = fut
        conn.queue_frame(KIND_REQUEST, request_id, msg.code, msg.meta, msg.data)
        timer = loop.call_later(timeout, _expire, fut, msg, address, timeout)
        try:
            return await fut
        finally:
            timer.cancel()
            conn.pending.pop(request_id, None)

    async def close(self) -> None:
        """Fail everything in flight with NETWORK_ERROR and drop all connections."""
        self._closed = True
        if self._faults is not None:
            self._faults.unsubscribe(self._on_block)
        conns: list[_ClientConnection] = []
        for peer in self._peers.values():
            if peer.connecting is not None:
                peer.connecting.cancel()
            if peer.conn is not None:
                conns.append(peer.conn)
                peer.conn.abort("transport client closed")
        for conn in conns:
            await conn.wait_closed()
        self._peers.clear()

    def drop(self, address: str, reason: str) -> None:
        """Close the connection to `address` (a member that left the group), failing what is in
        flight on it with NETWORK_ERROR; a later request opens a new one."""
        self._drop(address, reason)
        for priority in (False, True):
            peer = self._peers.pop((address, priority), None)
            if peer is not None and peer.connecting is not None:
                peer.connecting.cancel()

    # -- internals -----------------------------------------------------------------------

    def _check_blocked(self, address: str, faults: FaultInjector) -> None:
        if faults.is_blocked(address):
            self._drop(address, BLOCKED.format(address))
            raise DLedgerError(ResponseCode.NETWORK_ERROR, BLOCKED.format(address))

    def _drop(self, address: str, reason: str) -> None:
        """Both lanes to `address`."""
        self._drop_lane((address, False), reason)
        self._drop_lane((address, True), reason)

    def _drop_lane(self, lane: tuple[str, bool], reason: str) -> None:
        peer = self._peers.get(lane)
        if peer is not None and peer.conn is not None:
            conn, peer.conn = peer.conn, None
            conn.abort(reason)

    def _on_block(self, addresses: frozenset[str]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        for address in addresses:
            if on_loop:
                self._drop(address, BLOCKED.format(address))
            else:
                loop.call_soon_threadsafe(self._drop, address, BLOCKED.format(address))

    async def _request(self, lane: tuple[str, bool], msg: Message) -> Message:
        address = lane[0]
        conn = await self._connection(lane)
        conn.last_used = time.monotonic()
        faults = self._faults
        if faults is not None and faults.delay_s > 0:
            await asyncio.sleep(faults.delay_s)
            self._check_blocked(address, faults)
        request_id = next(self._ids)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        conn.pending[request_id] = fut
        try:
            await conn.send_frame(KIND_REQUEST, request_id, msg.code, msg.meta, msg.data)
            return await fut
        finally:
            conn.pending.pop(request_id, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # failed while we were still sending: retrieved, not leaked

    async def _connection(self, lane: tuple[str, bool]) -> _ClientConnection:
        address = lane[0]
        peer = self._peers.get(lane)
        if peer is None:
            peer = self._peers[lane] = _Peer(address, self._backoff_initial, lane[1])
        conn = peer.conn
        if conn is not None:
            if conn.usable:
                return conn
            peer.conn = None
        task = peer.connecting
        if task is None:
            if self._clock() < peer.retry_at:
                raise DLedgerError(peer.failure, f"{address} unreachable, in backoff after a failed connect"
                                                 f"{', ' + REFUSED if peer.refused else ''}")
            task = peer.connecting = asyncio.get_running_loop().create_task(self._connect(peer))
            task.add_done_callback(functools.partial(self._connect_done, peer))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                raise DLedgerError(ResponseCode.NETWORK_ERROR, "transport client closed") from None
            raise

    async def _connect(self, peer: _Peer) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _ClientConnection(peer.address, self._max_frame_bytes, self._connection_lost,
                                              peer.priority, self._big_answers),
                    peer.host,
                    peer.port,
                    ssl=self._ssl,
                )
                self._check_server(conn)
                if self._auth_token is not None:
                    await self._present_token(conn)
        except (OSError, TimeoutError, DLedgerError) as e:  # ssl.SSLError is an OSError
            first = peer.backoff <= self._backoff_initial
            peer.retry_at = self._clock() + peer.backoff
            peer.backoff = min(peer.backoff * 2, self._backoff_max)
            (log.warning if isinstance(e, DLedgerError) and first else log.info if first else log.debug)(
                "connect to %s failed: %r", peer.address, e)
            peer.failure = e.code if isinstance(e, DLedgerError) else ResponseCode.NETWORK_ERROR
            peer.refused = _is_refusal(e)
            if isinstance(e, DLedgerError):
                raise
            said = f", {REFUSED}" if peer.refused else ""
            raise DLedgerError(ResponseCode.NETWORK_ERROR, f"connect to {peer.address} failed{said}: {e!r}") from None
        peer.backoff = self._backoff_initial
        peer.retry_at = 0.0
        if self._closed:
            conn.abort("transport client closed")
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "transport client closed")
        if self._faults is not None and self._faults.is_blocked(peer.address):
            conn.abort(BLOCKED.format(peer.address))
            raise DLedgerError(ResponseCode.NETWORK_ERROR, BLOCKED.format(peer.address))
        peer.conn = conn
        return conn

    def _check_server(self, conn: _ClientConnection) -> None:
        """With TLS, the server's certificate must be what this client meant to reach."""
        if self._ssl is None or self._server_check is None:
            return
        problem = self._server_check(conn.address, conn.server_principal())
        if problem is not None:
            conn.abort("wrong server certificate")
            raise DLedgerError(ResponseCode.UNAUTHENTICATED, problem)

    async def _present_token(self, conn: _ClientConnection) -> None:
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        request_id = next(self._ids)
        conn.pending[request_id] = fut
        conn.queue_frame(KIND_REQUEST, request_id, RequestCode.AUTH, self._auth_token or b"", b"")
        resp = await fut
        if resp.code != ResponseCode.SUCCESS:
            conn.abort("auth token refused")
            raise DLedgerError(ResponseCode.UNAUTHENTICATED, f"{conn.address} refused our auth token")

    @staticmethod
    def _connect_done(peer: _Peer, task: asyncio.Task[_ClientConnection]) -> None:
        if peer.connecting is task:
            peer.connecting = None
        if not task.cancelled():
            task.exception()  # retrieved even when every requester already timed out

    def _connection_lost(self, conn: _ClientConnection) -> None:
        peer = self._peers.get((conn.address, conn.priority))
        if peer is not None and peer.conn is conn:
            peer.conn = None


def _timeout_text(msg: Message, address: str, timeout: float) -> str:
    return f"request {msg.code} to {address} got no response within {timeout}s"


def _expire(fut: asyncio.Future[Message], msg: Message, address: str, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(DLedgerError(ResponseCode.TIMEOUT, _timeout_text(msg, address, timeout)))

