"""One framed connection (either end): decoding from the socket, flow-controlled sending, teardown.

Protocols rather than streams because every member talks to every other member all the
time: the socket reads straight into the decoder's buffer (``BufferedProtocol``), frames are
cut out of it by offset, and frames go out as ``writelines([header, meta, data, ...])`` so a
large ``data`` buffer is never joined by us (uvloop sends the parts as they are; the stock 3.11
loop joins them once inside ``writelines``). Frames sent in the same loop iteration share one
``writelines`` call, which saves a syscall per frame under load; and every connection with
frames queued in a loop iteration is flushed by one callback of its loop's `Outbox` (a leader
answering a drain's appends from hundreds of client connections schedules one callback, not
one per connection). Above a high-water mark of unsent bytes, senders wait in FIFO order until
the transport drains.

The server side (runtime.transport_server) and the client side (runtime.transport_client)
subclass `FrameProtocol` with what a frame means to them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import weakref
from collections.abc import Callable
from typing import Final, cast

from dledger.address import socket_address
from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.frames import (
    Buffer,
    ByteBudget,
    FrameDecoder,
    FrameError,
    add_frame,
)

__all__ = ["WRITE_HIGH_WATER", "WRITE_LOW_WATER", "FrameProtocol", "Outbox", "install_uvloop"]

log = logging.getLogger(__name__)

# Under TLS, frames queued together up to this size are joined into one TLS record.
_JOIN_BYTES: Final = 64 * 1024
# Above this many unsent bytes a sender waits; heartbeats must not queue behind megabytes.
WRITE_HIGH_WATER: Final = 1024 * 1024
WRITE_LOW_WATER: Final = 256 * 1024


class Outbox:
    """The connections of one event loop with frames queued and not yet written: one callback
    per loop iteration writes them all (each connection's frames still in one `writelines`).

    A connection is listed when it queues its first frame since its last flush; one flushed
    directly meanwhile (a full buffer) may be listed again, and its second flush finds nothing
    to write. A frame queued after a run took the list schedules the next run."""

    __slots__ = ("_pending", "_scheduled")

    def __init__(self) -> None:
        # (no reference to the loop: the loop is the key this Outbox is kept under, weakly)
        self._pending: list[FrameProtocol] = []
        self._scheduled = False

    def add(self, conn: FrameProtocol) -> None:
        """List `conn` for this iteration's write (on its loop's thread, the loop running)."""
        self._pending.append(conn)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for conn in pending:
            try:
                conn._flush()
            except Exception:  # one broken transport must not keep the others' answers back
                log.exception("writing to %s failed", conn.peer)


_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = weakref.WeakKeyDictionary()


def outbox() -> Outbox:
    """The running loop's Outbox (made on first use)."""
    loop = asyncio.get_running_loop()
    box = _OUTBOXES.get(loop)
    if box is None:
        box = _OUTBOXES[loop] = Outbox()
    return box


def _peer_name(transport: asyncio.BaseTransport) -> str:
    return socket_address(transport.get_extra_info("peername"))


class FrameProtocol(asyncio.BufferedProtocol):
    """What both ends share: decoding, flow-controlled sending, teardown."""

    def __init__(self, max_frame_bytes: int, budget: int = 0,
                 may_continue: Callable[[], bool] | None = None, memory: ByteBudget | None = None,
                 big_answers: bool = False) -> None:
        self._decoder = FrameDecoder(self._on_frame, max_frame_bytes, budget=budget, may_continue=may_continue,
                                     memory=memory, big_answers=big_answers)
        self._backlog_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._read_holds: set[str] = set()  # why reading is paused ("backlog", "writes", "closing")
        self._paused = False
        # Senders queued while the peer is slow; woken one at a time so frames keep their order.
        self._writers: collections.deque[asyncio.Future[None]] = collections.deque()
        self._close_reason: str | None = None
        self._closed: asyncio.Future[None] | None = None
        self.peer = "?"
        self._out: list[Buffer] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._outbox: Outbox | None = None
        self._encrypted = False

    # -- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._closed = asyncio.get_running_loop().create_future()
        self._outbox = outbox()
        self.peer = _peer_name(transport)
        self._encrypted = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):  # not a TCP socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    @property
    def closing(self) -> bool:
        """Closed, or closing: nothing more is read from it."""
        return self._close_reason is not None or "closing" in self._read_holds

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing:
            return
        try:
            self._decoder.buffer_updated(nbytes)
        except FrameError as e:
            self._malformed(e)
            return
        self._after_parse()

    def _after_parse(self) -> None:
        """Whole frames still wait (a budget ran out, or the peer is not reading its answers):
        stop reading and hand them up in later loop turns, so timers and other connections
        run in between; while our answers do not drain, they wait (resume_writing goes on)."""
        if self._decoder.backlog:
            self._hold_reading("backlog")
            if not self._paused and not self._backlog_scheduled:
                self._backlog_scheduled = True
                asyncio.get_running_loop().call_soon(self._parse_backlog)
        elif "backlog" in self._read_holds:
            self._release_reading("backlog")

    def _parse_backlog(self) -> None:
        self._backlog_scheduled = False
        if self.closing or self._paused:
            return
        try:
            self._decoder.parse_more()
        except FrameError as e:
            self._malformed(e)
            return
        self._after_parse()

    def _malformed(self, e: FrameError) -> None:
        log.warning("closing connection with %s: malformed frame: %s", self.peer, e)
        self.abort(f"malformed frame from {self.peer}: {e}")

    def _hold_reading(self, why: str) -> None:
        if not self._read_holds and self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        self._read_holds.add(why)

    def _release_reading(self, why: str) -> None:
        self._read_holds.discard(why)
        if not self._read_holds and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost cleans up

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_next_writer()
        if self._decoder.backlog:
            self._after_parse()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._close_reason is None:
            self._close_reason = f"connection with {self.peer} lost: {exc or 'closed by peer'}"
        self._out, self._out_bytes = [], 0
        self._decoder.close()
        waiters, self._writers = list(self._writers), collections.deque()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(DLedgerError(ResponseCode.NETWORK_ERROR, self._close_reason))
        self._lost(self._close_reason)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)
        self._transport = None  # (it holds the TLS layer, which held us: no cycle is left)

    # -- for subclasses ------------------------------------------------------------------

    def _on_frame(self, kind: int, request_id: int, code: int, meta: bytes, data: Buffer) -> None:
        raise NotImplementedError

    def _lost(self, reason: str) -> None:
        """Hook: the connection is gone for good."""

    # -- sending -------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return self._close_reason is None and self._transport is not None and not self._transport.is_closing()

    def abort(self, reason: str) -> None:
        """Drop the connection now; unsent data is discarded, as in a real partition."""
        if self._close_reason is None:
            self._close_reason = reason
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await asyncio.shield(self._closed)

    async def send_frame(self, kind: int, request_id: int, code: int, meta: Buffer, data: Buffer) -> None:
        """Write one frame, first waiting while the peer is not keeping up."""
        contended = False
        if self._paused or self._writers:
            await self._wait_turn()
            contended = True
        if not self.usable:
            self._wake_next_writer()
            raise DLedgerError(ResponseCode.NETWORK_ERROR, self._close_reason or f"connection with {self.peer} closed")
        self.queue_frame(kind, request_id, code, meta, data, flush_now=contended)
        self._wake_next_writer()

    @property
    def can_queue(self) -> bool:
        """A frame may be queued now without waiting for a turn (order is kept)."""
        return not self._paused and not self._writers and self.usable

    def queue_frame(self, kind: int, request_id: int, code: int, meta: Buffer, data: Buffer,
                    flush_now: bool = False) -> None:
        """Queue one frame without waiting: the synchronous core of `send_frame`.

        Frames queued in one loop iteration go out in one write (one syscall under load), and
        the loop's connections with frames queued are written by one callback (Outbox); a
        sender that had to wait flushes at once so the pause state stays exact."""
        self._out_bytes += add_frame(self._out, kind, request_id, code, meta, data)
        if flush_now or self._out_bytes >= WRITE_HIGH_WATER:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            box = self._outbox
            if box is None:  # (queued before connection_made: not on a loop's connection list yet)
                box = self._outbox = outbox()
            box.add(self)

    def _flush(self) -> None:
        """Write what is queued now. May run before the Outbox's callback (a frame that
        filled the buffer, a close): that callback then finds nothing left to write."""
        self._flush_scheduled = False
        if not self._out:
            return
        out, self._out = self._out, []
        size, self._out_bytes = self._out_bytes, 0
        if self._transport is not None and not self._transport.is_closing():
            if self._encrypted and size <= _JOIN_BYTES:  # one TLS record for the lot, not one per part
                self._transport.write(b"".join(out))
            else:  # (a big answer is not copied once more: the TLS layer takes the parts as they are)
                self._transport.writelines(out)

    async def _wait_turn(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._writers.append(fut)
        try:
            await fut
        except BaseException:
            with contextlib.suppress(ValueError):
                self._writers.remove(fut)
            self._wake_next_writer()  # pass on a turn we may have been handed
            raise
        self._writers.remove(fut)  # it is at the head: only the head is ever woken

    def _wake_next_writer(self) -> None:
        if not self._paused and self._writers:
            head = self._writers[0]
            if not head.done():
                head.set_result(None)


def install_uvloop() -> bool:
    """Use uvloop when available: it roughly doubles small-message throughput."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
