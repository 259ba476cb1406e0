"""What clients send a broker and what it answers: msgspec structs as msgpack in the frame's meta
(docs/format.md framing). Request codes are RocketMQ's where it has one (SEND_MESSAGE 10,
PULL_MESSAGE 11, GET_BROKER_RUNTIME_INFO 28); the controller's NOTIFY_BROKER_ROLE_CHANGED
(1008) arrives on the same listener, and GET_BROKER_EPOCH_CACHE (1007) is a broker's. Bounds are checked on decode.

Every answer carries `code` (docs/format.md, "Response codes"): SUCCESS, the default, which
omit_defaults leaves off the wire, so the bytes are those of the layout without it and either
side decodes the other's. Errors are answered as error frames, as before.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from dledger.codes import RequestCode, ResponseCode

MAX_BATCH = 10_000


class SendRequest(msgspec.Struct, omit_defaults=True):
    broker_name: str = ""  # checked: a client that found the wrong broker learns it
    bodies: Annotated[list[bytes], msgspec.Meta(min_length=1, max_length=MAX_BATCH)] = []


SUCCESS = int(ResponseCode.SUCCESS)  # the default answer code


class SendResponse(msgspec.Struct, omit_defaults=True):
    epoch: int
    first_index: int
    offsets: list[int]  # each body's offset (record position)
    code: int = SUCCESS


class PullRequest(msgspec.Struct, omit_defaults=True):
    broker_name: str = ""
    from_index: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_entries: Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH)] = 1000
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 0  # long poll: wait for something new


class PulledEntry(msgspec.Struct, array_like=True):
    index: int
    offset: int
    epoch: int
    body: bytes


class PullResponse(msgspec.Struct, omit_defaults=True):
    entries: list[PulledEntry] = []
    next_index: int = 0
    begin_index: int = 0
    confirm_offset: int = -1
    code: int = SUCCESS


class FaultRequest(msgspec.Struct, omit_defaults=True):
    """Cut this broker's requests to `blocked` addresses (the controllers: a master isolated
    from them); with `ha_paused`, stop sending to its slaves (records written on the master
    only); with `ha_cut`, a slave cut off from its master. An empty request heals."""

    blocked: Annotated[list[str], msgspec.Meta(max_length=64)] = []
    ha_paused: bool = False
    ha_cut: bool = False  # a slave: drop its connection to the master and make none


class FaultResponse(msgspec.Struct, omit_defaults=True):
    code: int = SUCCESS


class RuntimeInfoRequest(msgspec.Struct, omit_defaults=True):
    pass


class SlaveProgress(msgspec.Struct, omit_defaults=True):
    """A slave as its master sees it: the offset its last ack reached, and how far that is
    behind the master's max offset (-1 ack: connected, no ack yet)."""

    broker_id: int
    ack_offset: int
    lag: int
    in_sync: bool = False  # a member of the SyncStateSet the master counts acks over
    async_learner: bool = False


class RuntimeInfo(msgspec.Struct, omit_defaults=True):
    cluster: str
    broker_name: str
    broker_id: int
    role: str  # FENCED | MASTER | SLAVE
    master_epoch: int
    master_id: int | None
    master_address: str | None
    sync_state_set: list[int]
    sync_state_set_epoch: int
    max_offset: int
    confirm_offset: int
    end_index: int
    lease_ms_left: int
    truncated_at: int | None = None  # the last truncation of an unconfirmed tail (slave handshake)
    registered: bool = False
    begin_index: int = 0
    confirmed_index: int = -1  # the last record readers may see (it ends within the confirm offset)
    replica_info_queries: int = 0  # replica info asked of the controller by the poll and by hints (NOTIFY)
    security: str = ""  # tls, loopback (no TLS: loopback connections only) or insecure (--insecure)
    code: int = SUCCESS  # (GET_BROKER_RUNTIME_INFO's answer)
    slaves: list[SlaveProgress] = []  # a master's connected slaves (others: none)


class EpochCacheRequest(msgspec.Struct, omit_defaults=True):
    pass


class EpochRange(msgspec.Struct, omit_defaults=True):
    """One entry of a replica's epoch file: the bytes [start_offset, end_offset) that master
    epoch wrote (the last entry ends at the replica's max offset, as mqadmin prints it)."""

    epoch: int
    start_offset: int
    end_offset: int


class EpochCache(msgspec.Struct, omit_defaults=True):
    """GET_BROKER_EPOCH_CACHE's answer (upstream's EpochEntryCache): a replica's epoch entries
    and max offset."""

    cluster_name: str
    broker_name: str
    broker_id: int
    epochs: list[EpochRange]
    max_offset: int
    code: int = SUCCESS


_enc = msgspec.msgpack.Encoder()
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)


def encode(msg: msgspec.Struct) -> bytes:
    return _enc.encode(msg)

send_request = msgspec.msgpack.Decoder(SendRequest)
send_response = msgspec.msgpack.Decoder(SendResponse)
pull_request = msgspec.msgpack.Decoder(PullRequest)
pull_response = msgspec.msgpack.Decoder(PullResponse)
runtime_info = msgspec.msgpack.Decoder(RuntimeInfo)
fault_request = msgspec.msgpack.Decoder(FaultRequest)
fault_response = msgspec.msgpack.Decoder(FaultResponse)
epoch_cache = msgspec.msgpack.Decoder(EpochCache)


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
BrokerRequestCode = RequestCode  # its FAULT is RequestCode.BROKER_FAULT
