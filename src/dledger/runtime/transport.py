"""Framed request/response transport over TCP (docs/format.md), built on asyncio protocols.

Protocols rather than streams because every member talks to every other member all the
time: the socket reads straight into our buffer (``BufferedProtocol``), frames are cut out
of it by offset, and frames go out as ``writelines([header, meta, data, ...])`` so a large
``data`` buffer is never joined by us (uvloop sends the parts as they are; the stock 3.11
loop joins them once inside ``writelines``). Frames sent in the same loop iteration share
one ``writelines`` call, which saves a syscall per frame under load. Above a high-water
mark of unsent bytes, senders wait in FIFO order until the transport drains.

Frame format, all integers big-endian::

    offset  size       field
    0       4          L: length of everything after this field (unsigned)
    4       1          kind: 0 = request, 1 = response
    5       8          request id (unsigned); a response carries its request's id
    13      4          code (signed): RequestCode of a request, ResponseCode of a response
    17      4          M: meta length (unsigned)
    21      M          meta: opaque bytes (the upper layer puts msgspec-msgpack here)
    21+M    L-17-M     data: opaque bytes (e.g. log records pushed verbatim)

A frame is malformed when L > max_frame_bytes, L < 17, M > L - 17, or its kind is unknown
or arrives on the wrong side (a response sent to a server, a request sent to a client).
The receiver logs a warning and closes that connection only; its pending requests fail
with NETWORK_ERROR. Nothing received is unpickled or evaluated: meta and data are handed
up as bytes (data of a frame too big for the receive buffer arrives as a read-only
memoryview of its own buffer, to avoid copying it).

Requests are multiplexed on one connection per remote address by request id; the server
hands each request to its handler as it is parsed (a direct handler answers through a
callback, with no task per request), so responses may come back in any order. Errors the
server reports are ordinary responses (code != SUCCESS, meta ``{"error": text}``); only
transport failures (NETWORK_ERROR, TIMEOUT) raise on the client.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hmac
import itertools
import logging
import resource
import socket
import ssl as ssl_module
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias, cast

import msgspec

from dledger.codes import DLedgerError, ResponseCode
from dledger.ratelog import RateLimitedLog
from dledger.security.peer_uid import LOOPBACK_ONLY, OTHER_USER, not_local
from dledger.security.roles import (
    ANONYMOUS,
    Access,
    Principal,
    ServerCheck,
    Tokens,
    cert_principal,
    refusal_text,
)

__all__ = [
    "AUTH_CODE",
    "DEFAULT_MAX_FRAME_BYTES",
    "HEADER_SIZE",
    "KIND_REQUEST",
    "KIND_RESPONSE",
    "LISTENER_BOTH",
    "LISTENER_CLIENT",
    "LISTENER_MEMBER",
    "ByteBudget",
    "Caller",
    "DirectHandler",
    "FaultInjector",
    "FrameDecoder",
    "FrameError",
    "Limits",
    "Message",
    "Respond",
    "TransportClient",
    "TransportServer",
    "connection_cap",
    "encode_error",
    "encode_frame",
    "encode_refusal",
    "install_uvloop",
]

log = logging.getLogger(__name__)

Buffer: TypeAlias = bytes | bytearray | memoryview

KIND_REQUEST: Final = 0
KIND_RESPONSE: Final = 1
# A connection's first request when the server wants a shared token: meta is the token.
AUTH_CODE: Final = 52003
# A TLS connection's gate while its handshake runs (frames wait for it, see _handshake).
HANDSHAKING: Final = "TLS handshake under way"
# What a client without TLS is told when it sends a request to a TLS server.
PLAINTEXT_REFUSED: Final = ("this server requires mutual TLS: give the client a certificate (--tls-dir DIR, or "
                            "--tls-cert/--tls-key/--tls-ca; docs/security.md)")
# What a TLS connection may send before its TLS layer is in place (a ClientHello is a few KiB).
_TLS_STASH: Final = 32 * 1024
DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024

_LENGTH = struct.Struct(">I")
_FIXED = struct.Struct(">BQiI")  # kind, request id, code, meta length: what L always covers
_HEADER = struct.Struct(">IBQiI")
_FIXED_SIZE: Final = _FIXED.size  # 17
HEADER_SIZE: Final = _HEADER.size  # 21
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1

# Receive buffer for ordinary frames; a bigger frame gets a buffer of its own. A connection
# starts with a small one, so a thousand idle connections cost megabytes, not hundreds.
_RECV_CHUNK: Final = 256 * 1024
_RECV_INITIAL: Final = 16 * 1024
# A frame too big for the receive buffer gets a buffer of what arrived plus this much, and
# doubles as bytes arrive: memory follows the bytes sent (at most twice them), not the length
# announced. (Growing by half copied a 4 MiB snapshot chunk eight times.)
_BIG_STEP: Final = 64 * 1024
# Frames one connection hands up per event-loop turn: then timers and other peers run.
_FRAMES_PER_TURN: Final = 64
# Work all connections together may start per event-loop turn, in units of about 8 KiB moved
# (a frame's bytes, a READ's answer, 64 bodies of an APPEND): one READ of 16 MiB is a turn of
# its own, and a flood of big requests cannot hold the loop past a heartbeat.
_TURN_BUDGET: Final = 512
# A client drops a connection it has not used for this long and opens a new one, well before a
# server's idle timeout (5 min by default) could close it under a request just sent.
_CLIENT_IDLE_S: Final = 60.0
# Frames a connection may send before it presented the token.
_PRE_AUTH_MAX_FRAME: Final = 4096
# An answer this small is always queued; a bigger one only while the server's answers waiting
# to be sent stay within answer_memory_bytes (else the client is told to retry). While over it,
# a connection with more than this waiting is not read until its answers drain.
_SMALL_ANSWER: Final = 64 * 1024
# A server being stopped waits this long for its connections to report they are gone.
_STOP_WAIT_S: Final = 2.0
# A connection being closed gets this long to take what was queued for it, then it is cut.
_CLOSE_GRACE_S: Final = 5.0
# Under TLS, frames queued together up to this size are joined into one TLS record.
_JOIN_BYTES: Final = 64 * 1024
# Above this many unsent bytes a sender waits; heartbeats must not queue behind megabytes.
_WRITE_HIGH_WATER: Final = 1024 * 1024
_WRITE_LOW_WATER: Final = 256 * 1024

_error_encoder = msgspec.msgpack.Encoder()


class Message(NamedTuple):
    """A request or a response: the code plus two opaque payloads."""

    code: int
    meta: bytes = b""
    data: Buffer = b""


class FrameError(Exception):
    """The peer sent something that is not a valid frame; its connection must go."""


def encode_error(text: str) -> bytes:
    """Meta of an error response, so callers can show the server's reason."""
    return _error_encoder.encode({"error": text})


def encode_refusal(code: int, text: str) -> bytes:
    """Meta of a refusal the transport answers before any handler: the text under "error"
    (DLedger clients) and the code and text as RocketMQ answers carry them ("code", "remark"),
    so a controller or broker client decoding its own answer type sees the refusal, not a
    default SUCCESS."""
    return _error_encoder.encode({"error": text, "code": int(code), "remark": text})


def _nbytes(b: Buffer) -> int:
    return b.nbytes if isinstance(b, memoryview) else len(b)


def _frame_problem(code: int, meta: Buffer, data: Buffer, max_frame_bytes: int) -> str | None:
    """Why a frame cannot be sent, checked before it is sent rather than refused by the peer."""
    if not _INT32_MIN <= code <= _INT32_MAX:
        return f"code {code} does not fit in 32 bits"
    length = _FIXED_SIZE + _nbytes(meta) + _nbytes(data)
    if length > max_frame_bytes:
        return f"frame of {length} bytes exceeds max_frame_bytes {max_frame_bytes}"
    return None


def encode_frame(kind: int, request_id: int, code: int, meta: Buffer, data: Buffer) -> list[Buffer]:
    """Header plus the payloads as separate parts, so big payloads are written without a join."""
    mlen = _nbytes(meta)
    header = _HEADER.pack(_FIXED_SIZE + mlen + _nbytes(data), kind, request_id, code, mlen)
    parts: list[Buffer] = [header]
    if mlen:
        parts.append(meta)
    if _nbytes(data):
        parts.append(data)
    return parts


FrameCallback: TypeAlias = Callable[[int, int, int, bytes, Buffer], None]


class ByteBudget:
    """Bytes that the big-frame buffers of all of a server's connections may hold together:
    each grows only as bytes arrive, but a thousand connections each sending most of a
    64 MiB frame would still hold gigabytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class FrameDecoder:
    """Incremental frame parser with the ``BufferedProtocol`` calling convention.

    Kept free of sockets so it can be fed arbitrary splits in tests. Ordinary frames are
    parsed in place in a receive buffer (consumed by offset, compacted only when the tail
    runs short, so each byte moves at most once). The buffer starts small (an idle
    connection costs little) and is swapped once for a ``chunk_size`` one when a frame needs
    it; a frame larger than that gets a buffer of its own, which grows as its bytes arrive
    (never to an announced length that was not sent) and whose data is handed up without a
    copy. At most ``budget`` frames are handed up per call: ``backlog`` then says more are
    waiting, so one connection's flood cannot hold the event loop (`parse_more` goes on).
    Big-frame buffers draw on ``memory`` (shared by a server's connections); a frame that
    would overdraw it is a FrameError.
    """

    def __init__(
        self,
        on_frame: FrameCallback,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        chunk_size: int = _RECV_CHUNK,
        *,
        initial_size: int = _RECV_INITIAL,
        budget: int = 0,
        may_continue: Callable[[], bool] | None = None,
        memory: ByteBudget | None = None,
    ) -> None:
        if chunk_size < HEADER_SIZE:
            raise ValueError(f"chunk_size must be at least {HEADER_SIZE}")
        if max_frame_bytes < _FIXED_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {_FIXED_SIZE}")
        self._on_frame = on_frame
        self.max_frame_bytes = max_frame_bytes  # may change between frames (see _ServerConnection)
        self._chunk = chunk_size
        self._budget = budget or (1 << 62)
        self._may_continue = may_continue  # asked before each frame: False leaves it for later
        self._memory = memory
        self._set_buffer(bytearray(max(HEADER_SIZE, min(initial_size, chunk_size))))
        self._start = 0
        self._end = 0
        self._big: bytearray | None = None
        self._big_len = 0
        self._big_filled = 0
        self.backlog = False  # whole frames wait in the buffer: call parse_more
        self.frames = 0  # frames handed up so far (the frame timeout watches it move)

    def _set_buffer(self, buf: bytearray) -> None:
        self._buf = buf  # never resized, only replaced: views of it may be alive
        self._view = memoryview(buf)
        self._min_read = max(HEADER_SIZE, len(buf) // 16)

    @property
    def pending(self) -> bool:
        """Part of a frame has arrived (or whole ones wait): the connection is mid-frame."""
        return self._end > self._start or self._big is not None

    def get_buffer(self) -> memoryview:
        """Where the next bytes from the socket go; never empty."""
        big = self._big
        if big is not None:  # never full here: buffer_updated grew it
            return memoryview(big)[self._big_filled :]
        if self._start == self._end:
            self._start = self._end = 0
        elif self._start and len(self._buf) - self._end < self._min_read:
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Account for bytes written into the last buffer; emits completed frames (up to the budget)."""
        big = self._big
        if big is not None:
            self._big_filled += nbytes
            if self._big_filled == self._big_len:
                self._big = None
                self._give(len(big))
                self._emit_big(big)
            elif self._big_filled == len(big):  # full but the frame is not: double what arrived
                self._big = None  # the old buffer is dropped once copied: the budget counts what stays
                self._give(len(big))
                grown = self._big_buffer(min(len(big) + max(len(big), _BIG_STEP), self._big_len))
                grown[: self._big_filled] = big
                self._big = grown
            return
        self._end += nbytes
        self._parse()

    def parse_more(self) -> None:
        """Hand up the next budget of frames waiting in the buffer."""
        self._parse()

    def feed(self, data: Buffer) -> None:
        """Push bytes through the buffered interface (for callers that already hold bytes);
        every frame they complete is handed up, whatever the budget."""
        src = memoryview(data).cast("B")
        pos = 0
        while pos < len(src):
            while self.backlog:
                self._parse()
            dst = self.get_buffer()
            n = min(len(dst), len(src) - pos)
            dst[:n] = src[pos : pos + n]
            pos += n
            self.buffer_updated(n)
        while self.backlog:
            self._parse()

    def _compact(self) -> None:
        n = self._end - self._start
        # Slicing the bytearray copies first, so overlapping ranges are safe; same size, no resize.
        self._buf[:n] = self._buf[self._start : self._end]
        self._start, self._end = 0, n

    def _parse(self) -> None:
        buf, view, end = self._buf, self._view, self._end
        start = self._start
        left = self._budget
        self.backlog = False
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buf, start)
            if length > self.max_frame_bytes:
                raise FrameError(f"frame length {length} exceeds max_frame_bytes {self.max_frame_bytes}")
            if length < _FIXED_SIZE:
                raise FrameError(f"frame length {length} is shorter than the {_FIXED_SIZE}-byte header")
            if end - start < HEADER_SIZE:
                break
            kind, request_id, code, mlen = _FIXED.unpack_from(buf, start + 4)
            if kind != KIND_REQUEST and kind != KIND_RESPONSE:
                raise FrameError(f"unknown frame kind {kind}")
            if mlen > length - _FIXED_SIZE:
                raise FrameError(f"meta length {mlen} exceeds frame length {length}")
            total = 4 + length
            if end - start < total:
                self._start = start
                if total > self._chunk:
                    self._start_big(start, length)
                elif total > len(buf):
                    self._grow()
                elif start + total > len(buf):
                    self._compact()
                return
            if not left or (self._may_continue is not None and not self._may_continue()):
                self.backlog = True
                break
            left -= 1
            meta_at = start + HEADER_SIZE
            data_at = meta_at + mlen
            meta = bytes(view[meta_at:data_at])
            data = bytes(view[data_at : start + total])
            start += total
            self._start = start  # consistent state before the callback runs
            self.frames += 1
            self._on_frame(kind, request_id, code, meta, data)
        self._start = start

    def _grow(self) -> None:
        """Swap the small first buffer for a full-size one, keeping the partial frame."""
        n = self._end - self._start
        buf = bytearray(self._chunk)
        buf[:n] = self._view[self._start : self._end]
        self._set_buffer(buf)
        self._start, self._end = 0, n

    def _big_buffer(self, size: int) -> bytearray:
        memory = self._memory
        if memory is not None and not memory.take(size):
            raise FrameError(f"unfinished frames hold {memory.used} bytes of the server's {memory.limit} "
                             f"(frame_memory_bytes): a {self._big_len}-byte frame must wait; retry later")
        return bytearray(size)

    def _give(self, size: int) -> None:
        if self._memory is not None:
            self._memory.give(size)

    def leave_budget(self) -> None:
        """A verified member's connection: its frames no longer draw on the shared budget, so
        client connections holding it can never hold up replication."""
        big = self._big
        if big is not None:
            self._give(len(big))
        self._memory = None

    def close(self) -> None:
        """The connection is gone: its unfinished frame gives its memory back, and the decoder
        lets go of its buffers and of its owner's methods (a reference cycle that only
        Python's cyclic collector would break: the answers queued for a closed connection
        stayed in memory until then)."""
        big, self._big = self._big, None
        if big is not None:
            self._give(len(big))
        self._on_frame = _drop_frame
        self._may_continue = None
        self._set_buffer(bytearray(HEADER_SIZE))
        self._start = self._end = 0

    def _start_big(self, start: int, length: int) -> None:
        have = self._end - start - 4
        self._big_len = length
        big = self._big_buffer(min(length, have + _BIG_STEP))
        big[:have] = self._view[start + 4 : self._end]
        self._big, self._big_len, self._big_filled = big, length, have
        self._start = self._end = 0

    def _emit_big(self, big: bytearray) -> None:
        kind, request_id, code, mlen = _FIXED.unpack_from(big, 0)
        view = memoryview(big).toreadonly()
        meta = bytes(view[_FIXED_SIZE : _FIXED_SIZE + mlen])
        self.frames += 1
        self._on_frame(kind, request_id, code, meta, view[_FIXED_SIZE + mlen :])


def _drop_frame(kind: int, request_id: int, code: int, meta: bytes, data: Buffer) -> None:
    """What a closed connection's decoder does with a frame: nothing."""


def _host_port(name: Any) -> str:
    """`host:port` of a socket name (`[host]:port` for IPv6)."""
    if isinstance(name, tuple) and len(name) >= 2:
        host, port = name[0], name[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(name)


def _peer_name(transport: asyncio.BaseTransport) -> str:
    return _host_port(transport.get_extra_info("peername"))


def _not_local(transport: asyncio.BaseTransport) -> str | None:
    """Why a loopback-only server does not serve this connection (None: it does)."""
    return not_local(transport.get_extra_info("sockname"), transport.get_extra_info("peername"))


class _FrameProtocol(asyncio.BufferedProtocol):
    """What both ends share: decoding, flow-controlled sending, teardown."""

    def __init__(self, max_frame_bytes: int, budget: int = 0,
                 may_continue: Callable[[], bool] | None = None, memory: ByteBudget | None = None) -> None:
        self._decoder = FrameDecoder(self._on_frame, max_frame_bytes, budget=budget, may_continue=may_continue,
                                     memory=memory)
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
        self._encrypted = False

    # -- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._closed = asyncio.get_running_loop().create_future()
        self.peer = _peer_name(transport)
        self._encrypted = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):  # not a TCP socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER, low=_WRITE_LOW_WATER)

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

        Frames queued in one loop iteration go out in one write (one syscall under load);
        a sender that had to wait flushes at once so the pause state stays exact."""
        self._out.extend(encode_frame(kind, request_id, code, meta, data))
        self._out_bytes += HEADER_SIZE + _nbytes(meta) + _nbytes(data)
        if flush_now or self._out_bytes >= _WRITE_HIGH_WATER:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
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


# ---------------------------------------------------------------------------------------
# Server


Handler: TypeAlias = Callable[[Message], Awaitable[Message]]
Respond: TypeAlias = Callable[[Message], None]


class Caller:
    """Who sent a request, as far as the transport knows: for the server's access checks."""

    peer: str  # host:port of the remote end
    listener: str  # "client", "member" or "both": which listener accepted the connection
    principal: Principal  # who it is and its roles (security.roles)
    tls: bool
    trusted: bool  # a verified member's connection: never evicted to make room

    @property
    def names(self) -> frozenset[str]:
        """Names on the verified TLS certificate (empty without TLS)."""
        return self.principal.names

    def charge(self, cost: int) -> None:
        """Count work a request will cost beyond its bytes against this loop turn's budget."""

    def answer_room(self, wanted: int) -> int:
        """How big an answer may be now (the server's budget of answers waiting to be sent)."""
        return wanted


# Called on the event loop for each request; answers now or later by calling `respond`
# once. Raising DLedgerError (or anything) answers with an error response.
DirectHandler: TypeAlias = Callable[[Message, Respond, Caller], None]

LISTENER_CLIENT: Final = "client"
LISTENER_MEMBER: Final = "member"
LISTENER_BOTH: Final = "both"


@dataclass(frozen=True)
class Limits:
    """What one connection may cost a server (docs/security.md)."""

    max_connections: int = 1024
    idle_timeout_s: float = 300.0  # no frame and nothing in flight this long: closed
    frame_timeout_s: float = 30.0  # a frame must arrive whole within this of its first byte
    handshake_timeout_s: float = 10.0  # TLS handshake
    frame_memory_bytes: int = 256 << 20  # unfinished big frames of all connections together
    answer_memory_bytes: int = 32 << 20  # answers queued and not yet taken by their clients, all together


class _ServerConnection(_FrameProtocol, Caller):
    def __init__(self, server: TransportServer, listener: str) -> None:
        super().__init__(server.max_frame_bytes, _FRAMES_PER_TURN, self._may_continue, server.frame_memory)
        self._server = server
        self.listener = listener
        self._allowed: set[int] = set()  # request codes the policy let this principal send
        self.principal = ANONYMOUS
        self.tls = server.ssl is not None
        self._trusted = False
        # Why requests are refused for now (None: they are handled): a TLS handshake under way,
        # a token not yet presented, or a host a loopback-only server does not serve.
        self.gate: str | None = None
        self.inflight = 0  # requests handed to the handler and not yet answered
        self.opened_at = self.last_active = time.monotonic()
        self.partial_since: float | None = None  # when the frame now arriving began to arrive
        self.stalled_since: float | None = None  # our answers stopped draining (the peer does not read)
        self._partial_frames = 0
        self._gone = False  # connection_lost ran (a failed TLS handshake may not call it)
        self.queued = 0  # answer bytes queued here and not yet sent, as last counted (server.answers_queued)

    def _close_gate(self, why: str) -> None:
        """Refuse requests until the gate opens: a stranger may send small frames only."""
        self.gate = why
        self._decoder.max_frame_bytes = min(self._server.max_frame_bytes, _PRE_AUTH_MAX_FRAME)

    def _open_gate(self, principal: Principal) -> None:
        """Requests flow, as `principal` (the policy's answers for another are forgotten)."""
        self.principal, self.gate, self._allowed = principal, None, set()
        self._decoder.max_frame_bytes = self._server.max_frame_bytes

    @property
    def authenticated(self) -> bool:
        return self.gate is None

    @property
    def trusted(self) -> bool:
        return self._trusted

    @trusted.setter
    def trusted(self, value: bool) -> None:
        self._trusted = value
        if value:
            self._decoder.leave_budget()

    def _may_continue(self) -> bool:
        """Hand up another frame now? Not before the TLS handshake is done (who sent it is not
        known yet), not while our answers do not drain, nor once this loop turn's work is spent
        (the server's turn budget, shared by every connection)."""
        server = self._server
        if self.queued > _SMALL_ANSWER and server.answers_queued > server.answer_limit:
            server.hold(self)  # read again once the server's queued answers shrank (sweep)
            return False
        return self.gate is not HANDSHAKING and not self._paused and server.turn_cost < _TURN_BUDGET

    def _after_parse(self) -> None:
        if self.gate is HANDSHAKING:
            return  # frames that came with the handshake's last flight wait for it (_handshake)
        held = self._server.held
        if held and self in held:  # frames wait for the server's queued answers to shrink (sweep)
            self._hold_reading("budget")
            return
        if self._read_holds and "budget" in self._read_holds:
            self._release_reading("budget")
        super()._after_parse()

    _raw: asyncio.Transport | None = None  # under TLS: the socket's transport, below the TLS layer

    def recount(self) -> None:
        """Count what is really still queued here (the transport drained some since). Under TLS
        the socket's own transport holds what the TLS layer encrypted already: counted too."""
        now = self._out_bytes + (self._unsent_bytes() if not self._gone else 0)
        self._server.answers_queued += now - self.queued
        self.queued = now

    def answer_room(self, wanted: int) -> int:
        """How many bytes an answer of up to `wanted` may have now (a READ's max_bytes): what the
        server's answer budget has left, never below a small answer."""
        self.recount()
        left = self._server.limits.answer_memory_bytes - self._server.answers_queued
        return max(min(wanted, left), min(wanted, _SMALL_ANSWER))

    def charge(self, cost: int) -> None:
        """The handler's estimate of a request's work beyond its bytes (answer size, bodies)."""
        self._server.charge(cost)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        server = self._server
        if server.closing:
            self.abort("server closing")
            return
        # counted from the TCP accept, before any TLS handshake: a flood of handshakes that never
        # finish holds slots (and is evicted first), not memory beyond the cap
        if len(server._connections) >= server.limits.max_connections and not server.make_room():
            server.warn("cap", "refusing a connection from %s: %d connections is the limit (max_connections)",
                        self.peer, server.limits.max_connections)
            self.abort("too many connections")
            return
        server._connections.add(self)
        if server.ssl is not None:
            self.gate = HANDSHAKING  # frames come only through TLS, after it: their size limit stays
            self._stash = bytearray(_TLS_STASH)  # TLS starts on the client's first bytes (_stash_updated)
        elif server.tokens:
            self._close_gate("authenticate first: this server requires an auth token")
        elif server.loopback_only and (why := _not_local(transport)) is not None:
            server.warn("loopback", "refusing requests from %s: %s", self.peer, why)
            self._close_gate(why)
        else:
            self.principal = ANONYMOUS

    # -- TLS, started on an accepted (and counted) connection ------------------------------
    #
    # loop.start_tls puts its TLS layer between the socket and this protocol. uvloop starts
    # reading as soon as connection_made returns, so the client's first handshake bytes may
    # reach this protocol before the TLS layer is in place: they are kept (_stash, bounded)
    # and fed to the TLS layer once it is connected. Ordering (callbacks run in the order
    # they were scheduled): start_tls's first step pauses reading, installs the layer and
    # schedules its connection_made and resume_reading; _feed_stash is scheduled two hops
    # later, so it runs right after those and before the socket is read again.

    _stash: bytearray | None = None
    _stashed = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._stash is not None:
            return memoryview(self._stash)[self._stashed :] if self._stashed < len(self._stash) \
                else memoryview(bytearray(1))
        return super().get_buffer(sizehint)

    _tls_started = False

    def _stash_updated(self, nbytes: int) -> None:
        """The client speaks first in TLS: its first byte says whether it speaks TLS (a
        handshake record, 0x16: start TLS) or sent a frame of ours without it (told so)."""
        self._stashed += nbytes
        assert self._stash is not None
        raw = cast(asyncio.Transport, self._transport)
        if not self._tls_started and self._stash[0] == 0x16:
            self._tls_started = True
            self._server._spawn(self._handshake(raw))
        elif not self._tls_started and self._refused_plaintext(raw):
            return
        if self._stashed >= len(self._stash):
            self._server.warn("stash", "closing connection with %s: %d bytes and no TLS handshake", self.peer,
                              self._stashed)
            self.abort("not a TLS client")

    async def _handshake(self, raw: asyncio.Transport) -> None:
        """TLS on the accepted connection: the handshake runs with its connection already
        counted (max_connections) and is bounded by the handshake timeout."""
        server = self._server
        loop = asyncio.get_running_loop()
        starting = loop.create_task(loop.start_tls(raw, self, cast(ssl_module.SSLContext, server.ssl),
                                                   server_side=True,
                                                   ssl_handshake_timeout=server.limits.handshake_timeout_s))
        loop.call_soon(loop.call_soon, self._feed_stash, raw)
        try:
            tls = await starting
        except asyncio.CancelledError:
            starting.cancel()
            raw.abort()
            self._gone_now("server closing")
            raise
        except (OSError, TimeoutError, ConnectionError, ValueError, RuntimeError, AttributeError) as e:
            log.debug("TLS handshake with %s failed: %r", self.peer, e)  # ssl.SSLError is an OSError
            raw.abort()
            self._gone_now(f"TLS handshake with {self.peer} failed: {e!r}")
            return
        if tls is None:  # the connection was lost during the handshake (the TLS layer says so no other way)
            raw.abort()
            self._gone_now(f"connection with {self.peer} lost during the TLS handshake")
            return
        if self._gone:
            return
        # uvloop's start_tls returns its transport even when the connection was lost during the
        # handshake (cut by our handshake timeout, or by the peer): then there is no certificate,
        # and the TLS layer will never report that loss to us
        if self._close_reason is not None or tls.is_closing() or not tls.get_extra_info("peercert"):
            tls.abort()
            raw.abort()
            self._gone_now(self._close_reason or f"connection with {self.peer} lost during the TLS handshake")
            return
        self._transport, self._raw = tls, raw
        self._encrypted = True
        tls.set_write_buffer_limits(high=_WRITE_HIGH_WATER, low=_WRITE_LOW_WATER)
        self._open_gate(cert_principal(tls.get_extra_info("peercert")))
        self.last_active = time.monotonic()
        if self._decoder.pending:  # frames that came with the handshake's last flight
            self._parse_backlog()

    def _refused_plaintext(self, raw: asyncio.Transport) -> bool:
        """A client without TLS sent a frame of ours, not a TLS record (which starts 0x16): it
        gets a plain answer saying what it lacks (a timeout told it nothing), and is closed."""
        stash, n = self._stash, self._stashed
        if stash is None or n < HEADER_SIZE or stash[0] == 0x16:
            return False
        kind, request_id, _, _ = _FIXED.unpack_from(stash, 4)
        self._stash = None
        self._close_reason = f"{self.peer} sent a request without TLS"  # nothing more is read
        if kind == KIND_REQUEST:
            self._server.warn("plaintext", "closing connection with %s: a request without TLS", self.peer)
            raw.write(b"".join(encode_frame(KIND_RESPONSE, request_id, ResponseCode.UNAUTHENTICATED,
                                            encode_refusal(ResponseCode.UNAUTHENTICATED, PLAINTEXT_REFUSED), b"")))
        raw.close()
        return True

    def _feed_stash(self, raw: asyncio.Transport) -> None:
        """Hand the TLS layer what this protocol read before the layer was in place."""
        stash, n, self._stash = self._stash, self._stashed, None
        layer = raw.get_protocol()
        # uvloop's TLS layer is buffered without being an asyncio.BufferedProtocol
        if stash is None or layer is self or raw.is_closing() or not hasattr(layer, "buffer_updated"):
            return
        done = 0
        while done < n and not raw.is_closing():
            buf = memoryview(layer.get_buffer(n - done)).cast("B")  # type: ignore[attr-defined]
            k = min(len(buf), n - done)
            buf[:k] = stash[done : done + k]
            layer.buffer_updated(k)
            done += k

    def _gone_now(self, reason: str) -> None:
        """The connection died before it was ours to lose (a failed handshake): clean up as
        connection_lost would."""
        if not self._gone:
            self.connection_lost(None if reason is None else ConnectionError(reason))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._gone:
            return
        self._gone = True
        self._server.answers_queued -= self.queued
        self.queued = 0
        self._server.held.discard(self)
        self._raw, self._stash = None, None
        super().connection_lost(exc)

    def buffer_updated(self, nbytes: int) -> None:
        if self._stash is not None:
            self._stash_updated(nbytes)
            return
        super().buffer_updated(nbytes)
        now = time.monotonic()
        if self.gate is None:  # a stranger's frames are no activity (they cannot hold a slot)
            self.last_active = now
        decoder = self._decoder
        if not decoder.pending:
            self.partial_since = None
        elif self.partial_since is None or decoder.frames != self._partial_frames:
            self.partial_since, self._partial_frames = now, decoder.frames  # a new frame began

    def _on_frame(self, kind: int, request_id: int, code: int, meta: bytes, data: Buffer) -> None:
        if kind != KIND_REQUEST:
            raise FrameError(f"frame of kind {kind} sent to a server")
        if self.closing:
            return  # a close was decided (a wrong token, say): what follows it is not read
        if code == AUTH_CODE or self.gate is not None:
            self._authenticate(request_id, code, meta)
            return
        if code not in self._allowed:  # the policy's word on a code, once per connection and principal
            refusal = self._server.refusal(code, self.principal, self.peer)
            if refusal is not None:
                self._refuse(request_id, code, *refusal)
                return
            self._allowed.add(code)
        self._server.charge(1 + ((len(meta) + len(data)) >> 13))
        self.inflight += 1
        respond = functools.partial(self._respond, request_id, code)
        try:
            self._server.direct_handler(Message(code, meta, data), respond, self)
        except DLedgerError as e:
            respond(Message(int(e.code), encode_error(e.message)))
        except Exception as e:
            log.exception("handler failed on request code %d from %s", code, self.peer)
            respond(Message(ResponseCode.INTERNAL_ERROR, encode_error(f"{type(e).__name__}: {e}")))

    def _refuse(self, request_id: int, code: int, answer: ResponseCode, text: str) -> None:
        """Answer a request the transport refuses itself (no handler sees it); counted."""
        if self._server.on_refused is not None:
            self._server.on_refused(code, answer)
        self.queue_frame(KIND_RESPONSE, request_id, answer, encode_refusal(answer, text), b"")

    def _authenticate(self, request_id: int, code: int, meta: bytes) -> None:
        """The gate: a token server's connection must present a token first (AUTH); until then
        every request is answered UNAUTHENTICATED and reaches nobody. A wrong token, or any
        request from a host a loopback-only server does not serve, closes the connection."""
        server = self._server
        if code == AUTH_CODE and server.tokens:
            principal = server.token_principal(meta)
            if principal is not None:
                self._open_gate(principal)
                self.queue_frame(KIND_RESPONSE, request_id, ResponseCode.SUCCESS, b"", b"")
                return
            server.warn("token", "wrong auth token from %s", self.peer)
            self._refuse(request_id, code, ResponseCode.UNAUTHENTICATED, "wrong auth token")
            self.close_gracefully("wrong auth token")
            return
        if code == AUTH_CODE and self.gate is None:  # no token wanted: a client that has one passes
            self.queue_frame(KIND_RESPONSE, request_id, ResponseCode.SUCCESS, b"", b"")
            return
        text = self.gate or "refused"
        self._refuse(request_id, code, ResponseCode.UNAUTHENTICATED, text)
        if code == AUTH_CODE or self.gate in (LOOPBACK_ONLY, OTHER_USER):
            self.close_gracefully(text)

    def _malformed(self, e: FrameError) -> None:
        self._server.warn("malformed", "closing connection with %s: malformed frame: %s", self.peer, e)
        self.close_gracefully(f"malformed frame from {self.peer}: {e}")

    def close_gracefully(self, reason: str) -> None:
        """Read nothing more, answer what was already accepted, then close: a valid request
        followed by garbage still gets its answer."""
        if self.closing:
            return
        self._hold_reading("closing")
        if self.inflight <= 0:
            self._close_now(reason)
        else:
            self._closing_reason = reason

    _closing_reason: str | None = None

    def _close_now(self, reason: str) -> None:
        """Close after what is queued is sent; a peer that does not read it is cut after a grace."""
        if self._close_reason is None:
            self._close_reason = reason
        self._flush()
        if self._transport is not None:
            self._transport.close()
            asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, self._transport.abort)

    def _lost(self, reason: str) -> None:
        self._server._connections.discard(self)
        if self._server.on_connection_lost is not None:
            self._server.on_connection_lost(self)

    def _respond(self, request_id: int, request_code: int, response: Message) -> None:
        """Queue the response at once: no task, no await per request. Responses may leave in
        any order, so they never wait for a turn; a client that does not read them is held
        back by pausing reads from it instead (see pause_writing). A big answer that would take
        the server's queued answers past answer_memory_bytes is replaced by a small retryable
        refusal: a thousand clients that ask and never read cannot hold gigabytes."""
        self.inflight -= 1
        server = self._server
        size = HEADER_SIZE + _nbytes(response.meta) + _nbytes(response.data)
        if size > server.small_answer:  # (the hot path is small answers: nothing more to check)
            response, size = self._big_answer(request_id, request_code, response, size)
        if self.usable:  # else the client is gone and has already failed this request
            self.queue_frame(KIND_RESPONSE, request_id, int(response.code), response.meta, response.data)
            self.queued += size
            server.answers_queued += size
            if self._closing_reason is not None and self.inflight <= 0:
                self._close_now(self._closing_reason)

    def _big_answer(self, request_id: int, request_code: int, response: Message, size: int) -> tuple[Message, int]:
        """A big answer as it may be sent: one the frame cannot hold becomes INTERNAL_ERROR, one
        that would take the queued answers past answer_memory_bytes LEADER_PENDING_FULL."""
        server = self._server
        problem = _frame_problem(response.code, response.meta, response.data, server.max_frame_bytes)
        if problem is not None:
            log.error("response to request %d (code %d) not sendable: %s", request_id, request_code, problem)
            response = Message(ResponseCode.INTERNAL_ERROR, encode_error(problem))
        elif server.answers_over(size):
            self.recount()
            if server.answers_over(size):
                server.warn("answers", "answering %s with LEADER_PENDING_FULL: %d bytes of answers wait to be sent "
                            "(answer_memory_bytes %d)", self.peer, server.answers_queued,
                            server.limits.answer_memory_bytes)
                response = Message(ResponseCode.LEADER_PENDING_FULL, encode_refusal(
                    ResponseCode.LEADER_PENDING_FULL, "answers waiting to be sent exceed this server's budget "
                    "(answer_memory_bytes): retry"))
        return response, HEADER_SIZE + _nbytes(response.meta) + _nbytes(response.data)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._hold_reading("writes")
        self.stalled_since = time.monotonic()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._release_reading("writes")
        self.stalled_since = None
        self.recount()

    _unsent = 0

    def _unsent_bytes(self) -> int:
        """What the transports hold unsent (under TLS, the socket's transport too: the TLS
        layer moves what it encrypted there, so ours alone never looks stalled)."""
        return sum(t.get_write_buffer_size() for t in (self._transport, self._raw) if t is not None)

    def _stalled_for(self, now: float) -> float:
        """How long our answers have not drained at all (a slow reader that takes some is fine)."""
        unsent = self._unsent_bytes()
        if unsent < self._unsent:
            self.stalled_since = now
        self._unsent = unsent
        return now - (self.stalled_since or now)

    def sweep(self, now: float) -> None:
        """Close a connection stuck mid-frame (a slow or silent sender), idle, or that never
        presented the token. Time we spend not reading (our own holds) is not the peer's."""
        limits = self._server.limits
        if self.closing:
            return
        if self.inflight > 0:  # waiting on us is activity
            self.last_active = now
        if self._raw is not None and not self._paused:  # TLS: a stall the TLS layer hides from pause_writing
            if self._unsent_bytes() < _WRITE_HIGH_WATER:
                self.stalled_since = None
            elif self.stalled_since is None:
                self.stalled_since, self._unsent = now, self._unsent_bytes()
        if self.gate is not None and now - self.opened_at > limits.handshake_timeout_s:
            self.abort(f"{self.gate}: not done within {limits.handshake_timeout_s:.0f} s")
        elif self.stalled_since is not None and self._stalled_for(now) > limits.frame_timeout_s:
            # up to a READ answer (max_read_bytes) waits per such connection: not for ever
            self._server.warn("stalled", "closing connection with %s: it has not read its answers for %.0f s",
                              self.peer, limits.frame_timeout_s)
            self.abort(f"{self.peer} does not read its answers")
        elif self._read_holds:
            if self.partial_since is not None:
                self.partial_since = now
        elif self.partial_since is not None and now - self.partial_since > limits.frame_timeout_s:
            self._server.warn("slow", "closing connection with %s: a frame took over %.0f s (frame_timeout)",
                              self.peer, limits.frame_timeout_s)
            self.abort(f"no whole frame from {self.peer} within {limits.frame_timeout_s}s")
        elif self.partial_since is None and self.inflight <= 0 and now - self.last_active > limits.idle_timeout_s:
            log.debug("closing connection with %s: idle", self.peer)
            self.close_gracefully("idle")


class TransportServer:
    """Accepts connections and answers every request with the handler.

    `handler` is a coroutine function returning the response (run as a task per request);
    `direct` (instead) is a DirectHandler, called synchronously for each request: the hot
    path of a member, which saves a task, a future and several coroutine frames per request.
    With `ssl` (a server context that requires client certificates) every connection is
    mutual TLS, its handshake run once the connection is counted; with `tokens` each
    connection must present one first (AUTH_CODE), which gives it its roles.
    """

    def __init__(self, handler: Handler | None = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 *, direct: DirectHandler | None = None, ssl: ssl_module.SSLContext | None = None,
                 tokens: Tokens | None = None, limits: Limits | None = None,
                 policy: Mapping[int, Access] | None = None, loopback_only: bool = False) -> None:
        """`policy`: every request code served and the roles that may send it (security.roles):
        a code without an entry is answered UNSUPPORTED, a principal without the role
        UNAUTHENTICATED, before any handler sees it (None: no checks, for tests of the framing).
        `loopback_only`: without TLS or tokens, serve connections from loopback addresses only."""
        if max_frame_bytes < _FIXED_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {_FIXED_SIZE}")
        if (handler is None) == (direct is None):
            raise ValueError("give exactly one of handler and direct")
        self.direct_handler: DirectHandler = direct if direct is not None else self._adapt(handler)  # type: ignore[arg-type]
        self.max_frame_bytes = max_frame_bytes
        self.ssl = ssl
        self.tokens = tokens if tokens is not None and ssl is None else Tokens()
        self._token_principals = self.tokens.principals()
        self.policy = policy
        self.loopback_only = loopback_only
        self.limits = limits or Limits()
        self.frame_memory = ByteBudget(max(self.limits.frame_memory_bytes, 2 * max_frame_bytes))
        self.closing = False
        self.warn = RateLimitedLog(log).warning
        self._servers: list[asyncio.Server] = []
        self._connections: set[_ServerConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.turn_cost = 0  # work started in this loop turn (see _TURN_BUDGET)
        self._turn_reset_scheduled = False
        self.answers_queued = 0  # answer bytes queued on every connection, as last counted (Limits.answer_memory_bytes)
        self.answer_limit = self.limits.answer_memory_bytes
        self.small_answer = min(_SMALL_ANSWER, max_frame_bytes - HEADER_SIZE)  # always sent as it is
        self.held: set[_ServerConnection] = set()  # not read until the queued answers shrink (see answers_over)
        # told when a connection is gone (the controller's liveness: a broker's connection closed)
        self.on_connection_lost: Callable[[Caller], None] | None = None
        # told of each request this transport refuses itself, (request code, answer code): the
        # UNAUTHENTICATED answers before the token handshake, and the policy's refusals
        self.on_refused: Callable[[int, int], None] | None = None

    def answers_over(self, more: int = 0) -> bool:
        """The answers waiting to be sent (with `more`) exceed the server's budget."""
        return self.answers_queued + more > self.answer_limit

    def hold(self, conn: _ServerConnection) -> None:
        self.held.add(conn)

    def _recount_answers(self) -> None:
        """Count every connection's queued answers again and read the held ones once the
        budget has room (a held connection has no event of its own that would wake it)."""
        for conn in self._connections:
            conn.recount()
        if self.held and not self.answers_over():
            held, self.held = list(self.held), set()
            for conn in held:
                if not conn.closing:
                    conn._after_parse()

    def token_principal(self, token: bytes) -> Principal | None:
        """The principal a presented token makes (compared in constant time with each), or None."""
        found = None
        for known, principal in self._token_principals:
            if hmac.compare_digest(token, known):
                found = principal
        return found

    def refusal(self, code: int, principal: Principal, peer: str = "?") -> tuple[ResponseCode, str] | None:
        """Why the policy refuses `code` from `principal` at `peer` (answer code and text), or None."""
        if self.policy is None:
            return None
        access = self.policy.get(code)
        if access is None:
            return ResponseCode.UNSUPPORTED, f"unknown request code {code}"
        if principal.has_any(access.roles):
            return None
        text = refusal_text(access.request, access.roles, principal)
        self.warn("role", "refused a request from %s: %s", peer, text)
        return ResponseCode.UNAUTHENTICATED, text

    def charge(self, cost: int) -> None:
        self.turn_cost += cost
        if not self._turn_reset_scheduled:
            self._turn_reset_scheduled = True
            asyncio.get_running_loop().call_soon(self._reset_turn)

    def _reset_turn(self) -> None:
        self._turn_reset_scheduled = False
        self.turn_cost = 0

    def _adapt(self, handler: Handler) -> DirectHandler:
        """A coroutine handler as a DirectHandler: one task per request."""

        async def run(msg: Message, respond: Respond) -> None:
            try:
                response = await handler(msg)
            except DLedgerError as e:
                response = Message(int(e.code), encode_error(e.message))
            except Exception as e:
                log.exception("handler failed on request code %d", msg.code)
                response = Message(ResponseCode.INTERNAL_ERROR, encode_error(f"{type(e).__name__}: {e}"))
            respond(response)

        def direct(msg: Message, respond: Respond, caller: Caller) -> None:
            self._spawn(run(msg, respond))

        return direct

    async def start(self, host: str, port: int, listener: str = LISTENER_BOTH) -> None:
        """Listen on host:port; call again for a second listener (members only, say)."""
        self.closing = False
        loop = asyncio.get_running_loop()
        # plain TCP: a connection's TLS handshake starts once it is counted (_handshake)
        server = await loop.create_server(
            lambda: _ServerConnection(self, listener), host, port, reuse_address=True, backlog=1024)
        self._servers.append(server)
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep_forever())

    @property
    def address(self) -> str:
        """``host:port`` of the first listener actually bound (so port 0 can be used)."""
        return self.addresses[0]

    @property
    def addresses(self) -> list[str]:
        out = [_host_port(sock.getsockname()) for server in self._servers for sock in server.sockets]
        if not out:
            raise RuntimeError("server not started")
        return out

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def make_room(self) -> bool:
        """At the cap: cut a connection that never presented the token, else the one quiet the
        longest (at least a second, nothing in flight, not a verified member's), so a pile of
        idle connections cannot lock members and clients out. False if there is none."""
        now = time.monotonic()
        strangers = [c for c in self._connections if not c.authenticated and not c.closing]
        idle = strangers or [c for c in self._connections
                             if not c.trusted and c.inflight <= 0 and not c.closing and c.last_active < now - 1.0]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.last_active)
        self._connections.discard(victim)  # it is gone at once: abort, nothing in flight to answer
        victim.abort("closed to make room (max_connections)")
        return True

    async def _sweep_forever(self) -> None:
        limits = self.limits
        every = max(0.05, min(0.25, limits.frame_timeout_s / 4, limits.idle_timeout_s / 4,
                              limits.handshake_timeout_s / 4))
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for conn in list(self._connections):
                conn.sweep(now)
            self._recount_answers()

    async def close(self) -> None:
        """Stop listening, drop every connection and cancel in-flight handlers."""
        self.closing = True
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        connections = list(self._connections)
        for conn in connections:
            conn.abort("server closing")
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # a TLS layer does not always report a connection it lost (one aborted in some of its
        # states): wait a little, then take every connection for gone, so stopping never hangs
        waits = [asyncio.ensure_future(conn.wait_closed()) for conn in connections]
        if waits:
            _, late = await asyncio.wait(waits, timeout=_STOP_WAIT_S)
            for w in late:
                w.cancel()
        for conn in connections:
            conn._gone_now("server closing")
        for server in servers:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STOP_WAIT_S):
                    await server.wait_closed()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


# ---------------------------------------------------------------------------------------
# Client


class FaultInjector:
    """Simulated partitions and slow links for tests that run members as separate processes.

    Call it from the event loop thread of the clients that use it.
    """

    def __init__(self, blocked: Iterable[str] = (), delay_s: float = 0.0) -> None:
        self.blocked: set[str] = set(_as_addresses(blocked))
        self.delay_s = delay_s
        self._listeners: list[Callable[[frozenset[str]], None]] = []

    def block(self, addresses: Iterable[str] | str) -> None:
        """Cut these addresses off; live connections to them are dropped at once."""
        new = frozenset(_as_addresses(addresses))
        self.blocked |= new
        for listener in list(self._listeners):
            listener(new)

    def unblock_all(self) -> None:
        self.blocked.clear()

    def is_blocked(self, address: str) -> bool:
        return address in self.blocked

    def _subscribe(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._listeners.append(listener)

    def _unsubscribe(self, listener: Callable[[frozenset[str]], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)


def _as_addresses(addresses: Iterable[str] | str) -> list[str]:
    return [addresses] if isinstance(addresses, str) else list(addresses)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not sep or not host or not 0 < port < 65536:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"bad address {address!r}, expected host:port")
    return host, port


class _ClientConnection(_FrameProtocol):
    def __init__(self, address: str, max_frame_bytes: int, on_lost: Callable[[_ClientConnection], None]) -> None:
        super().__init__(max_frame_bytes)
        self.address = address
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


class _Peer:
    __slots__ = ("address", "backoff", "conn", "connecting", "failure", "host", "port", "retry_at")

    def __init__(self, address: str, backoff: float) -> None:
        self.address = address
        self.host, self.port = _split_address(address)
        self.conn: _ClientConnection | None = None
        self.connecting: asyncio.Task[_ClientConnection] | None = None
        self.backoff = backoff
        self.retry_at = 0.0
        self.failure = ResponseCode.NETWORK_ERROR  # what the last connect attempt ended with


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
    ) -> None:
        """`ssl`: a client context (mutual TLS); `server_check` judges the server's certificate
        after the handshake (security.roles.expect_members: the member the address belongs to,
        so a client certificate signed by the same CA cannot pose as a member);
        `auth_token` is presented first on every connection."""
        if max_frame_bytes < _FIXED_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {_FIXED_SIZE}")
        self._ssl = ssl
        self._server_check = server_check
        self._auth_token = auth_token or None
        self._max_frame_bytes = max_frame_bytes
        self._faults = faults
        self._connect_timeout = connect_timeout_s
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._clock = clock
        self._peers: dict[str, _Peer] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        if faults is not None:
            faults._subscribe(self._on_block)

    async def request(self, address: str, msg: Message, timeout: float) -> Message:
        """Send ``msg`` and wait for its response; raises only NETWORK_ERROR or TIMEOUT.

        (UNEXPECTED_ARGUMENT for a bad address or a frame the local limit refuses.)
        """
        if self._closed:
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "transport client is closed")
        self._loop = asyncio.get_running_loop()
        self._check_blocked(address)
        problem = _frame_problem(msg.code, msg.meta, msg.data, self._max_frame_bytes)
        if problem is not None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, problem)
        peer = self._peers.get(address)
        conn = peer.conn if peer is not None else None
        now = time.monotonic()
        if conn is not None and now - conn.last_used > _CLIENT_IDLE_S:
            # the server may be closing it as idle right now: a request sent into that race
            # would fail although it was never read; a fresh connection is cheap
            self._drop(address, "idle")
            conn = None
        if conn is not None and conn.can_queue and (self._faults is None or self._faults.delay_s <= 0):
            conn.last_used = now
            return await self._request_now(conn, address, msg, timeout)
        try:
            async with asyncio.timeout(timeout):
                return await self._request(address, msg)
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
            self._faults._unsubscribe(self._on_block)
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

    # -- internals -----------------------------------------------------------------------

    def _check_blocked(self, address: str) -> None:
        if self._faults is not None and self._faults.is_blocked(address):
            self._drop(address, f"{address} blocked by fault injection")
            raise DLedgerError(ResponseCode.NETWORK_ERROR, f"{address} blocked by fault injection")

    def _drop(self, address: str, reason: str) -> None:
        peer = self._peers.get(address)
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
                self._drop(address, f"{address} blocked by fault injection")
            else:
                loop.call_soon_threadsafe(self._drop, address, f"{address} blocked by fault injection")

    async def _request(self, address: str, msg: Message) -> Message:
        conn = await self._connection(address)
        conn.last_used = time.monotonic()
        if self._faults is not None and self._faults.delay_s > 0:
            await asyncio.sleep(self._faults.delay_s)
            self._check_blocked(address)
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

    async def _connection(self, address: str) -> _ClientConnection:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer(address, self._backoff_initial)
        conn = peer.conn
        if conn is not None:
            if conn.usable:
                return conn
            peer.conn = None
        task = peer.connecting
        if task is None:
            if self._clock() < peer.retry_at:
                raise DLedgerError(peer.failure, f"{address} unreachable, in backoff after a failed connect")
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
                    lambda: _ClientConnection(peer.address, self._max_frame_bytes, self._connection_lost),
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
            if isinstance(e, DLedgerError):
                raise
            raise DLedgerError(ResponseCode.NETWORK_ERROR, f"connect to {peer.address} failed: {e!r}") from None
        peer.backoff = self._backoff_initial
        peer.retry_at = 0.0
        if self._closed:
            conn.abort("transport client closed")
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "transport client closed")
        if self._faults is not None and self._faults.is_blocked(peer.address):
            conn.abort(f"{peer.address} blocked by fault injection")
            raise DLedgerError(ResponseCode.NETWORK_ERROR, f"{peer.address} blocked by fault injection")
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
        conn.queue_frame(KIND_REQUEST, request_id, AUTH_CODE, self._auth_token or b"", b"")
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
        peer = self._peers.get(conn.address)
        if peer is not None and peer.conn is conn:
            peer.conn = None


def _timeout_text(msg: Message, address: str, timeout: float) -> str:
    return f"request {msg.code} to {address} got no response within {timeout}s"


def _expire(fut: asyncio.Future[Message], msg: Message, address: str, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(DLedgerError(ResponseCode.TIMEOUT, _timeout_text(msg, address, timeout)))


# File descriptors kept for the store (data and index files, checkpoints), peers and metrics.
_FD_RESERVE = 256


def connection_cap(wanted: int) -> int:
    """Connections this process can hold without the store running out of file descriptors:
    the soft limit is raised to the hard one, and the cap kept below it with a reserve (a
    connection flood must never make a checkpoint write fail)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    allowed = max(16, soft - _FD_RESERVE) if soft != resource.RLIM_INFINITY else wanted
    if wanted > allowed:
        log.warning("max_connections %d lowered to %d: the open-file limit is %d (ulimit -n)", wanted, allowed, soft)
        return allowed
    return wanted


def install_uvloop() -> bool:
    """Use uvloop when available: it roughly doubles small-message throughput."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
