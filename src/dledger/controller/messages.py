"""The controller's wire messages (upstream's controller RequestHeaders and ResponseHeaders):
RocketMQ's requests and answers, with
its request codes and field names (snake_case), as msgspec structs encoded as msgpack maps.

A request struct is also what the controller logs: a write request travels through the Raft
log inside a `Command`, with the liveness facts the leader took for it, and is validated when
it is applied (never against a state another request may change first; beyond upstream).
Bounds are checked when a request is decoded, so a forged one is an error answer, not an
exception later.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from dledger.codes import CONTROLLER_REQUESTS, RequestCode
from dledger.controller.elect_policy import PRIORITY_DEFAULT, LiveInfo

Name = Annotated[str, msgspec.Meta(max_length=256)]
Address = Annotated[str, msgspec.Meta(max_length=512)]
BrokerId = Annotated[int, msgspec.Meta(ge=-1, lt=1 << 62)]
Epoch = Annotated[int, msgspec.Meta(ge=-1, lt=1 << 31)]
Offset = Annotated[int, msgspec.Meta(ge=-1, lt=1 << 62)]
MAX_SET = 1024  # replicas in one broker set, names in one request
IdSet = Annotated[list[BrokerId], msgspec.Meta(max_length=MAX_SET)]
NO_ID = -1  # ElectMasterRequestHeader's brokerId of a controller-triggered election


HA_SEPARATOR = "|"  # a broker's address may carry its HA address: "host:port|host:haport"


def client_address(broker_address: str) -> str:
    """Where a broker takes requests (NOTIFY, clients), from its registered address."""
    return broker_address.partition(HA_SEPARATOR)[0]


class Request(msgspec.Struct, omit_defaults=True, tag_field="code"):
    """Every controller request (its tag is its request code)."""


class BrokerHeartbeat(Request, tag=int(RequestCode.BROKER_HEARTBEAT)):
    cluster_name: Name = ""
    broker_addr: Address = ""
    broker_name: Name = ""
    broker_id: BrokerId | None = None
    epoch: Epoch = -1  # the broker's last epoch
    max_offset: Offset = -1
    confirm_offset: Offset = -1
    # 0: the controller's default; at most a minute (a new leader waits the longest one before electing)
    heartbeat_timeout_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 0
    election_priority: Annotated[int, msgspec.Meta(ge=0, le=PRIORITY_DEFAULT)] = PRIORITY_DEFAULT
    # ours: a master's lease (0: none, upstream's behaviour). The leader's answer grants it
    # (`lease_granted`); the broker is then counted alive for at least lease + drift after
    # this heartbeat, even if its connection closes, so no replacement is elected while the
    # master may still acknowledge writes (#7017, #6662)
    lease_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 0
    # ours: the highest master epoch the controller has told the broker (-1: none yet). After
    # a master restarts, only facts reported at or past the epoch its registration made count
    # in the election (docs/brokers.md, "A master that restarts")
    master_epoch: Epoch = -1


class AlterSyncStateSet(Request, tag=int(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)):
    broker_name: Name = ""
    master_broker_id: BrokerId = NO_ID
    master_epoch: Epoch = -1
    sync_state_set: IdSet = []  # the new set
    sync_state_set_epoch: Epoch = -1  # the epoch the master believes is current


class ElectMaster(Request, tag=int(RequestCode.CONTROLLER_ELECT_MASTER)):
    """ofBrokerTrigger (a broker's id), ofControllerTrigger (NO_ID), ofAdminTrigger (designate_elect)."""

    cluster_name: Name = ""
    broker_name: Name = ""
    broker_id: BrokerId = NO_ID
    designate_elect: bool = False
    invoke_time: int = 0


class RegisterBroker(Request, tag=int(RequestCode.CONTROLLER_REGISTER_BROKER)):
    cluster_name: Name = ""
    broker_name: Name = ""
    broker_id: BrokerId = NO_ID
    broker_address: Address = ""


class GetReplicaInfo(Request, tag=int(RequestCode.CONTROLLER_GET_REPLICA_INFO)):
    broker_name: Name = ""


class GetMetadataInfo(Request, tag=int(RequestCode.CONTROLLER_GET_METADATA_INFO)):
    pass


class GetSyncStateData(Request, tag=int(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA)):
    broker_names: Annotated[list[Name], msgspec.Meta(max_length=MAX_SET)] = []
    # ours: every broker set the controllers hold (`dledger admin broker-sets`; upstream took
    # the names from NameServer's cluster info, which dledger does not have)
    all_sets: bool = False


class UpdateControllerConfig(Request, tag=int(RequestCode.UPDATE_CONTROLLER_CONFIG)):
    properties: Annotated[str, msgspec.Meta(max_length=1 << 16)] = ""  # key=value lines


class GetControllerConfig(Request, tag=int(RequestCode.GET_CONTROLLER_CONFIG)):
    pass


class CleanBrokerData(Request, tag=int(RequestCode.CLEAN_BROKER_DATA)):
    cluster_name: Name = ""
    broker_name: Name = ""
    broker_controller_ids_to_clean: Annotated[str, msgspec.Meta(max_length=1 << 14)] = ""  # "1;2;3"
    clean_living_broker: bool = False


class GetNextBrokerId(Request, tag=int(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID)):
    cluster_name: Name = ""
    broker_name: Name = ""


class ApplyBrokerId(Request, tag=int(RequestCode.CONTROLLER_APPLY_BROKER_ID)):
    cluster_name: Name = ""
    broker_name: Name = ""
    applied_broker_id: BrokerId = NO_ID
    register_check_code: Address = ""  # "address;millis": the address is what comes before ';'


class NotifyBrokerRoleChanged(Request, tag=int(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)):
    """Controller -> broker, when a master was elected (pushed; brokers also poll replica info)."""

    broker_name: Name = ""
    master_address: Address | None = None
    master_epoch: Epoch = 0
    sync_state_set_epoch: Epoch = 0
    master_broker_id: BrokerId | None = None
    sync_state_set: IdSet = []


# what a broker sends about its own set (a replica's certificate may speak for its set only)
BrokerRequest = (BrokerHeartbeat, AlterSyncStateSet, ElectMaster, RegisterBroker, GetNextBrokerId, ApplyBrokerId)
WriteRequest = ApplyBrokerId | RegisterBroker | ElectMaster | AlterSyncStateSet | CleanBrokerData
ReadRequest = GetNextBrokerId | GetReplicaInfo | GetSyncStateData
AnyRequest = (BrokerHeartbeat | AlterSyncStateSet | ElectMaster | RegisterBroker | GetReplicaInfo | GetMetadataInfo
              | GetSyncStateData | UpdateControllerConfig | GetControllerConfig | CleanBrokerData | GetNextBrokerId
              | ApplyBrokerId | NotifyBrokerRoleChanged)
CODES = frozenset(int(c) for c in CONTROLLER_REQUESTS if c != RequestCode.GET_BROKER_EPOCH_CACHE)  # 1007: a broker's


class Command(msgspec.Struct, omit_defaults=True):
    """A controller log entry (or a read's query): the request, and the facts the leader took
    for it when it received it, so every controller applies it the same way."""

    request: WriteRequest | ReadRequest
    alive: dict[str, dict[int, LiveInfo]] = {}  # broker name -> its live replicas (the leader's view)
    unclean: bool = False  # enableElectUncleanMaster, as the leader was configured
    # the sender's certificate name ("": no certificate: a token, loopback, or the controller
    # itself): an id is bound to the name that applied for it, and a replica's requests must
    # come from that name (docs/controller.md, "Replicas bound to their certificates")
    principal: Name = ""


# --- answers ---------------------------------------------------------------------------------


class Response(msgspec.Struct, omit_defaults=True):
    """Every answer: RocketMQ's response code and remark; the fields its request fills."""

    code: int = 0
    remark: str = ""
    leader_id: str = ""  # CONTROLLER_NOT_LEADER: who is (when known)
    leader_address: str = ""
    lease_granted: bool = False  # a heartbeat's: the leader renewed the master's lease
    # headers (upstream's controller RequestHeaders and ResponseHeaders)
    cluster_name: str = ""
    broker_name: str = ""
    next_broker_id: int | None = None
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None
    new_sync_state_set_epoch: int | None = None
    # bodies
    sync_state_set: list[int] | None = None
    broker_addrs: dict[int, str] | None = None  # ElectMasterResponseBody's brokerMemberGroup
    principals: dict[int, str] | None = None  # ours: broker id -> the certificate name bound to it
    replicas_info: dict[str, ReplicasInfo] | None = None  # GET_SYNC_STATE_DATA
    metadata: MetadataInfo | None = None  # GET_METADATA_INFO
    properties: str | None = None  # GET_CONTROLLER_CONFIG


class ReplicaIdentity(msgspec.Struct, omit_defaults=True):
    broker_name: str
    broker_id: int
    broker_address: str
    alive: bool


class ReplicasInfo(msgspec.Struct, omit_defaults=True):
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int = 0
    sync_state_set_epoch: int = 0
    in_sync_replicas: list[ReplicaIdentity] = []
    not_in_sync_replicas: list[ReplicaIdentity] = []


class MetadataInfo(msgspec.Struct, omit_defaults=True):
    group: str = ""
    controller_leader_id: str = ""
    controller_leader_address: str = ""
    is_leader: bool = False
    peers: str = ""  # "id:addr;" ...
    self_id: str = ""
    term: int = -1
    committed_index: int = -1
    applied_index: int = -1
    # the leader has led for one heartbeat timeout: it elects for dead masters (#5712's grace is over)
    electing: bool = False


_encoder = msgspec.msgpack.Encoder()
_request_decoder: msgspec.msgpack.Decoder[AnyRequest] = msgspec.msgpack.Decoder(AnyRequest)
_command_decoder = msgspec.msgpack.Decoder(Command)
_response_decoder = msgspec.msgpack.Decoder(Response)
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_request(code: int, meta: bytes | memoryview) -> AnyRequest:
    """The request a frame carries; its tag must be the frame's code (DECODE_ERRORS otherwise)."""
    req = _request_decoder.decode(meta)
    if req.__struct_config__.tag != code:
        raise msgspec.ValidationError(f"a request tagged {req.__struct_config__.tag} in a frame of code {code}")
    return req


def decode_command(body: bytes) -> Command:
    return _command_decoder.decode(body)


def decode_response(meta: bytes | memoryview) -> Response:
    return _response_decoder.decode(meta)
