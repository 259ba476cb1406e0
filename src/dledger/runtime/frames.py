"""Frames (docs/format.md): the wire format, its bounds, the encoder and the incremental decoder.

Sans-I/O: nothing here touches a socket or the event loop, so the decoder can be fed any split
of bytes in tests. The connections (runtime.connection) feed it from ``BufferedProtocol``
callbacks and send what ``encode_frame`` returns with one ``writelines``.

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
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, NamedTuple, TypeAlias

import msgspec

from dledger.codes import RequestCode

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FIXED",
    "FIXED_SIZE",
    "HEADER_SIZE",
    "KIND_REQUEST",
    "KIND_RESPONSE",
    "PRIORITY_CODES",
    "Buffer",
    "ByteBudget",
    "FrameCallback",
    "FrameDecoder",
    "FrameError",
    "Message",
    "add_frame",
    "encode_error",
    "encode_frame",
    "encode_refusal",
    "frame_problem",
    "nbytes",
]

Buffer: TypeAlias = bytes | bytearray | memoryview

KIND_REQUEST: Final = 0
KIND_RESPONSE: Final = 1
DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
# What a follower judges its leader's liveness by, and what elects the next one: a member sends
# them on a connection of their own (transport_client), and a server never holds back a
# connection that carries nothing else (transport_server's turn budget).
PRIORITY_CODES: Final = frozenset((RequestCode.HEART_BEAT, RequestCode.VOTE))

_LENGTH = struct.Struct(">I")
FIXED = struct.Struct(">BQiI")  # kind, request id, code, meta length: what L always covers
_HEADER = struct.Struct(">IBQiI")
FIXED_SIZE: Final = FIXED.size  # 17
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
BIG_ANSWER_STEP: Final = 8 << 20  # a bulk reader's first buffer for a big answer (READs: 4 MiB)

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


def nbytes(b: Buffer) -> int:
    """Size in bytes (a memoryview's len counts its items)."""
    return b.nbytes if isinstance(b, memoryview) else len(b)


def frame_problem(code: int, meta: Buffer, data: Buffer, max_frame_bytes: int) -> str | None:
    """Why a frame cannot be sent, checked before it is sent rather than refused by the peer."""
    if not _INT32_MIN <= code <= _INT32_MAX:
        return f"code {code} does not fit in 32 bits"
    length = FIXED_SIZE + nbytes(meta) + nbytes(data)
    if length > max_frame_bytes:
        return f"frame of {length} bytes exceeds max_frame_bytes {max_frame_bytes}"
    return None


def encode_frame(kind: int, request_id: int, code: int, meta: Buffer, data: Buffer) -> list[Buffer]:
    """Header plus the payloads as separate parts, so big payloads are written without a join."""
    parts: list[Buffer] = []
    add_frame(parts, kind, request_id, code, meta, data)
    return parts


def add_frame(parts: list[Buffer], kind: int, request_id: int, code: int, meta: Buffer, data: Buffer) -> int:
    """`encode_frame` into a list of parts already being written; returns the frame's size in
    bytes (each payload's size taken once: this runs once per request and per answer)."""
    mlen, dlen = nbytes(meta), nbytes(data)
    parts.append(_HEADER.pack(FIXED_SIZE + mlen + dlen, kind, request_id, code, mlen))
    if mlen:
        parts.append(meta)
    if dlen:
        parts.append(data)
    return HEADER_SIZE + mlen + dlen


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
    would overdraw it is a FrameError. ``big_answers`` (a bulk reader's client) starts a big
    frame's buffer at up to BIG_ANSWER_STEP at once.
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
        big_answers: bool = False,
    ) -> None:
        if chunk_size < HEADER_SIZE:
            raise ValueError(f"chunk_size must be at least {HEADER_SIZE}")
        if max_frame_bytes < FIXED_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {FIXED_SIZE}")
        self._on_frame = on_frame
        self.max_frame_bytes = max_frame_bytes  # may change between frames (lower before authentication)
        self._chunk = chunk_size
        self._budget = budget or (1 << 62)
        self._may_continue = may_continue  # asked before each frame: False leaves it for later
        self._memory = memory
        # a bulk reader's client: a big answer's buffer starts at its announced length up to
        # BIG_ANSWER_STEP (a 4 MiB READ answer is not doubled and copied six times as it
        # arrives); past that it grows with the bytes sent, so a lying length costs at most that
        self._first_step = BIG_ANSWER_STEP if big_answers else _BIG_STEP
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
            if length < FIXED_SIZE:
                raise FrameError(f"frame length {length} is shorter than the {FIXED_SIZE}-byte header")
            if end - start < HEADER_SIZE:
                break
            kind, request_id, code, mlen = FIXED.unpack_from(buf, start + 4)
            if kind != KIND_REQUEST and kind != KIND_RESPONSE:
                raise FrameError(f"unknown frame kind {kind}")
            if mlen > length - FIXED_SIZE:
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
        big = self._big_buffer(min(length, have + self._first_step))
        big[:have] = self._view[start + 4 : self._end]
        self._big, self._big_len, self._big_filled = big, length, have
        self._start = self._end = 0

    def _emit_big(self, big: bytearray) -> None:
        kind, request_id, code, mlen = FIXED.unpack_from(big, 0)
        view = memoryview(big).toreadonly()
        meta = bytes(view[FIXED_SIZE : FIXED_SIZE + mlen])
        self.frames += 1
        self._on_frame(kind, request_id, code, meta, view[FIXED_SIZE + mlen :])


def _drop_frame(kind: int, request_id: int, code: int, meta: bytes, data: Buffer) -> None:
    """What a closed connection's decoder does with a frame: nothing."""
