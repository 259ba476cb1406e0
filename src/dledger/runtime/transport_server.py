"""The server side of the transport: listeners, admission and what a connection may cost.

Before any handler sees a request, a connection is admitted (max_connections, evicting a
stranger or the longest idle one), authenticated (mutual TLS started on the counted
connection, a token presented first, or a loopback-only check of the peer), and each request
code is checked against the access policy (refusals are answered here). Then the request goes
to a direct handler that answers through a callback, with no task per request, so responses
may leave in any order. What all connections may hold together is bounded: unfinished big
frames (frame_memory_bytes), answers not yet taken by their clients (answer_memory_bytes),
and the work started per event-loop turn. Errors the server reports are ordinary responses
(code != SUCCESS, meta ``{"error": text}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import resource
import ssl as ssl_module
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, cast

from dledger.address import socket_address
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.ratelog import RateLimitedLog
from dledger.runtime.connection import WRITE_HIGH_WATER, WRITE_LOW_WATER, FrameProtocol
from dledger.runtime.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FIXED,
    FIXED_SIZE,
    HEADER_SIZE,
    KIND_REQUEST,
    KIND_RESPONSE,
    PRIORITY_CODES,
    Buffer,
    ByteBudget,
    FrameError,
    Message,
    encode_error,
    encode_frame,
    encode_refusal,
    frame_problem,
    nbytes,
)
from dledger.security.peer_uid import LOOPBACK_ONLY, OTHER_USER, not_local
from dledger.security.roles import (
    ANONYMOUS,
    Access,
    Principal,
    Tokens,
    cert_principal,
    refusal_text,
)

__all__ = [
    "HANDSHAKING",
    "LISTENER_BOTH",
    "LISTENER_CLIENT",
    "LISTENER_MEMBER",
    "PLAINTEXT_REFUSED",
    "Caller",
    "DirectHandler",
    "Handler",
    "Limits",
    "Respond",
    "TransportServer",
    "connection_cap",
]

log = logging.getLogger(__name__)

# A TLS connection's gate while its handshake runs (frames wait for it, see _handshake).
HANDSHAKING: Final = "TLS handshake under way"
# What a client without TLS is told when it sends a request to a TLS server.
PLAINTEXT_REFUSED: Final = ("this server requires mutual TLS: give the client a certificate (--tls-dir DIR, or "
                            "--tls-cert/--tls-key/--tls-ca; docs/security.md)")
# What a TLS connection may send before its TLS layer is in place (a ClientHello is a few KiB).
_TLS_STASH: Final = 32 * 1024
# Frames one connection hands up per event-loop turn: then timers and other peers run.
_FRAMES_PER_TURN: Final = 64
# Work all connections together may start per event-loop turn, in units of about 8 KiB moved
# (a frame's bytes, a READ's answer, 64 bodies of an APPEND): one READ of 16 MiB is a turn of
# its own, and a flood of big requests cannot hold the loop past a heartbeat.
_TURN_BUDGET: Final = 512
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


def _not_local(transport: asyncio.BaseTransport) -> str | None:
    """Why a loopback-only server does not serve this connection (None: it does)."""
    return not_local(transport.get_extra_info("sockname"), transport.get_extra_info("peername"))


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


class _ServerConnection(FrameProtocol, Caller):
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
        # Whether the turn budget applies: None until the first request (it does), True once a
        # request other than a heartbeat or a vote came. A member's priority lane
        # (frames.PRIORITY_CODES) stays False: bulk work on other connections cannot hold its
        # frames past the turn they arrived in
        self.bulk: bool | None = None

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
        return self.gate is not HANDSHAKING and not self._paused and \
            (server.turn_cost < _TURN_BUDGET or self.bulk is False)

    def _after_parse(self) -> None:
        self._note_partial()  # after every parse: bytes that arrived, or a backlog's frames
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
        tls.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
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
        kind, request_id, _, _ = FIXED.unpack_from(stash, 4)
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

    def _note_partial(self) -> None:
        """Start, restart or stop the frame timeout's clock after a parse. Every parse ends in
        `_after_parse`, also one of frames from a backlog (no bytes arrived): a request that
        came with the TLS handshake's last flight is read so, and when only `buffer_updated`
        kept the clock its connection, answered and then idle, was closed as slow 30 s later."""
        decoder = self._decoder
        if not decoder.pending:
            self.partial_since = None
        elif self.partial_since is None or decoder.frames != self._partial_frames:
            self.partial_since, self._partial_frames = time.monotonic(), decoder.frames  # a new frame began

    def _on_frame(self, kind: int, request_id: int, code: int, meta: bytes, data: Buffer) -> None:
        if kind != KIND_REQUEST:
            raise FrameError(f"frame of kind {kind} sent to a server")
        if self.closing:
            return  # a close was decided (a wrong token, say): what follows it is not read
        if code == RequestCode.AUTH or self.gate is not None:
            self._authenticate(request_id, code, meta)
            return
        if code not in self._allowed:  # the policy's word on a code, once per connection and principal
            refusal = self._server.refusal(code, self.principal, self.peer)
            if refusal is not None:
                self._refuse(request_id, code, *refusal)
                return
            self._allowed.add(code)
        if code not in PRIORITY_CODES:
            self.bulk = True
            self._server.charge(1 + ((len(meta) + len(data)) >> 13))
        elif self.bulk is None:  # heartbeats and votes: tiny, not charged, never held back
            self.bulk = False
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
        if code == RequestCode.AUTH and server.tokens:
            principal = server.token_principal(meta)
            if principal is not None:
                self._open_gate(principal)
                self.queue_frame(KIND_RESPONSE, request_id, ResponseCode.SUCCESS, b"", b"")
                return
            server.warn("token", "wrong auth token from %s", self.peer)
            self._refuse(request_id, code, ResponseCode.UNAUTHENTICATED, "wrong auth token")
            self.close_gracefully("wrong auth token")
            return
        if code == RequestCode.AUTH and self.gate is None:  # no token wanted: a client that has one passes
            self.queue_frame(KIND_RESPONSE, request_id, ResponseCode.SUCCESS, b"", b"")
            return
        text = self.gate or "refused"
        self._refuse(request_id, code, ResponseCode.UNAUTHENTICATED, text)
        if code == RequestCode.AUTH or self.gate in (LOOPBACK_ONLY, OTHER_USER):
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
        size = HEADER_SIZE + nbytes(response.meta) + nbytes(response.data)
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
        problem = frame_problem(response.code, response.meta, response.data, server.max_frame_bytes)
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
        return response, HEADER_SIZE + nbytes(response.meta) + nbytes(response.data)

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
            if self._unsent_bytes() < WRITE_HIGH_WATER:
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
    connection must present one first (RequestCode.AUTH), which gives it its roles.
    """

    def __init__(self, handler: Handler | None = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 *, direct: DirectHandler | None = None, ssl: ssl_module.SSLContext | None = None,
                 tokens: Tokens | None = None, limits: Limits | None = None,
                 policy: Mapping[int, Access] | None = None, loopback_only: bool = False) -> None:
        """`policy`: every request code served and the roles that may send it (security.roles):
        a code without an entry is answered UNSUPPORTED, a principal without the role
        UNAUTHENTICATED, before any handler sees it (None: no checks, for tests of the framing).
        `loopback_only`: without TLS or tokens, serve connections from loopback addresses only."""
        if max_frame_bytes < FIXED_SIZE:
            raise ValueError(f"max_frame_bytes must be at least {FIXED_SIZE}")
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

    def close_where(self, which: Callable[[Caller], bool], reason: str) -> int:
        """Close gracefully every connection `which` picks (a removed member's): what it sent
        before is still answered. How many were closed."""
        picked = [c for c in self._connections if not c.closing and which(c)]
        for c in picked:
            log.info("closing the connection from %s: %s", c.peer, reason)
            c.close_gracefully(reason)
        return len(picked)

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
        out = [socket_address(sock.getsockname()) for server in self._servers for sock in server.sockets]
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

