"""Framed request/response transport over TCP (docs/format.md): the names its users import.

The transport is split at its seams; this module only gathers their public names, so code
that speaks to peers imports one place:

    runtime.frames            the wire format and its bounds: encoder, incremental decoder (sans-I/O)
    runtime.connection        one connection, either end: decoding from the socket, flow-controlled
                              sending, teardown
    runtime.transport_server  listeners, admission (max_connections), authentication, the access
                              policy's refusals before any handler, the answer and per-turn budgets
    runtime.transport_client  one multiplexed connection per remote address, backoff, timeouts
    runtime.faults            FaultInjector: every fault hook for tests and chaos runs, built only
                              with --enable-fault-injection (clients without one consult nothing)
"""

from __future__ import annotations

from dledger.codes import RequestCode
from dledger.runtime.connection import install_uvloop
from dledger.runtime.faults import FaultInjector
from dledger.runtime.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    KIND_REQUEST,
    KIND_RESPONSE,
    ByteBudget,
    FrameDecoder,
    FrameError,
    Message,
    encode_error,
    encode_frame,
    encode_refusal,
)
from dledger.runtime.transport_client import TransportClient
from dledger.runtime.transport_server import (
    LISTENER_BOTH,
    LISTENER_CLIENT,
    LISTENER_MEMBER,
    Caller,
    DirectHandler,
    Limits,
    Respond,
    TransportServer,
    connection_cap,
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


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
AUTH_CODE = RequestCode.AUTH
