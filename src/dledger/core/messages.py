"""Wire messages of the group protocol (docs/format.md), as msgspec structs.

A frame carries one of these as msgpack `meta`; log records travel beside it
as raw `data` (the exact bytes of the data file), never re-encoded.
Structs are array-like: compact on the wire and fast to encode.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated

import msgspec

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.config import MAX_LEASE_MS
from dledger.membership import Address, Membership
from dledger.statemachine.snapshot import MAX_FILES


class Role(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class VoteResult(IntEnum):
    """DLedger's VoteResponse.RESULT."""

    UNKNOWN = 0
    ACCEPT = 1
    REJECT_UNKNOWN_LEADER = 2
    REJECT_UNEXPECTED_LEADER = 3
    REJECT_EXPIRED_VOTE_TERM = 4
    REJECT_ALREADY_VOTED = 5
    REJECT_ALREADY_HAS_LEADER = 6
    REJECT_TERM_NOT_READY = 7
    REJECT_TERM_SMALL_THAN_LEDGER = 8
    REJECT_EXPIRED_LEDGER_TERM = 9
    REJECT_SMALL_LEDGER_END_INDEX = 10
    REJECT_TAKING_LEADERSHIP = 11


class ParseResult(IntEnum):
    """DLedger's VoteResponse.ParseResult: what a candidate does after a round."""

    WAIT_TO_REVOTE = 0
    REVOTE_IMMEDIATELY = 1
    PASSED = 2
    WAIT_TO_VOTE_NEXT = 3


# Bounds checked when a request is decoded (a 411 answer, never an exception later): terms
# and indexes stay far below what the record header's signed 64-bit fields hold (a forged
# term of 2**63 - 1 used to be persisted, and then no member could ever write a record).
LIMIT = 1 << 62
Term = Annotated[int, msgspec.Meta(ge=-1, lt=LIMIT)]
Index = Annotated[int, msgspec.Meta(ge=-1, lt=LIMIT)]
Position = Annotated[int, msgspec.Meta(ge=0, lt=LIMIT)]
Count = Annotated[int, msgspec.Meta(ge=0, lt=1 << 31)]
Name = Annotated[str, msgspec.Meta(max_length=128)]
# Bodies per APPEND: one request of a million empty bodies stalled a leader for 1.5 s.
MAX_APPEND_BODIES = 10_000
Bodies = Annotated[list[bytes], msgspec.Meta(max_length=MAX_APPEND_BODIES)]


class Msg(msgspec.Struct, array_like=True, omit_defaults=True):
    """Every request names its group, its sender and its intended receiver."""

    group: Name = "default"
    leader_id: Name = ""  # sender (DLedger's name: for most requests it is the leader)
    remote_id: Name = ""  # receiver


class VoteRequest(Msg):
    term: Term = 0
    ledger_end_index: Index = -1
    ledger_end_term: Term = -1
    pre_vote: bool = False
    transfer: bool = False  # leadership transfer: voters ignore a live leader


class VoteResponse(msgspec.Struct, array_like=True):
    term: int
    result: int  # VoteResult: the vote itself (a refusal is still an answered vote)
    pre_vote: bool = False
    # last, defaulted: a peer of the three-field layout decodes it and is decoded (docs/format.md)
    code: int = int(ResponseCode.SUCCESS)


class HeartBeatRequest(Msg):
    term: Term = 0
    committed_index: Index = -1
    retention_floor: Index = -1  # followers keep entries from here on: a member still needs them (-1: none)
    retention_holder: Name = ""  # which member
    # the leader's lease (ms): followers refuse votes at least this long after hearing it, whatever
    # their own heartbeat settings (a rolling restart with new ones made lease reads stale)
    lease_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_LEASE_MS)] = 0


class HeartBeatResponse(msgspec.Struct, array_like=True):
    code: int
    term: int
    leader_id: str = ""
    durable_index: int = -1  # receiver's fsynced end: what a sync-mode leader may count
    store_full: bool = False  # receiver refuses client appends (disk full): no leadership handed to it
    end_index: int | None = None  # receiver's ledger end (None: an older peer that does not say)
    corrupt_index: int = -1  # receiver's first record known corrupt (-1: none): the leader repairs it
    apply_needs: int = -1  # the entry receiver's state machine needs and its log cannot give (-1: none)
    # the receiver's own lease: all it refuses votes for after a restart, when it has forgotten
    # the leader's (0: an older peer that does not say). A leader counts no longer lease on it.
    lease_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_LEASE_MS)] = 0


class PushRequest(Msg):
    """One push of an EntryDispatcher. APPEND carries `count` records in `data`.

    COMPARE asks whether the receiver holds (prev_index, prev_term); TRUNCATE
    drops everything after prev_index; COMMIT only moves the commit index; REPAIR
    carries `count` records from `first_index` that the receiver already holds, to
    overwrite its copies that fail verification.
    """

    term: Term = 0
    type: Count = PushType.APPEND
    prev_index: Index = -1
    prev_term: Term = -1
    first_index: Index = 0
    count: Count = 0
    committed_index: Index = -1
    next_term: Term = -1  # TRUNCATE: the leader's term at prev_index + 1 (-1: it has no entry there)


class PushResponse(msgspec.Struct, array_like=True):
    code: int
    term: int
    end_index: int = -1  # receiver's ledger end
    x_index: int = -1  # COMPARE mismatch: first index of x_term at the receiver
    x_term: int = -1
    durable_index: int = -1  # min(receiver's fsynced end, its match): in sync mode what the leader counts
    corrupt_index: int = -1  # receiver's first record known corrupt (-1: none): the leader repairs it
    bad_index: int = -1  # a pushed record failed verification here: its index (-1: none)
    reason: str = ""  # why the push failed, when it is not a plain log mismatch


class AppendRequest(Msg):
    bodies: Bodies = []
    want_results: bool = False  # propose: answer once applied, with the state machine's results
    # an idempotent producer's (core.producers): the bodies carry sequences sequence, sequence + 1, …
    producer: Name = ""
    sequence: Position = 0
    epoch: Position = 0  # the producer's session: a higher one starts its sequences again


class AppendResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    term: int = -1
    index: int = -1  # first index of the batch
    positions: list[int] = []
    message: str = ""
    results: list[bytes] = []  # want_results: one per body, the state machine's
    # an idempotent append that found some of its bodies in the log already (`duplicates`,
    # the first ones): each body's index and term (-1: older than the leader remembers)
    indexes: list[int] = []
    terms: list[int] = []
    duplicates: int = 0
    # the index of the configuration entry in force on the member that answered (-1: the
    # command line's): a client that knows an older one asks MEMBERS at once, so members
    # replaced faster than its periodic refresh do not strand it
    config_index: int = -1


# how fresh a read must be (core.read_index): linearizable (a heartbeat round confirms the
# leader), lease (no round while the leader's lease holds), leader (today's: the leader's
# view, no round), local (the receiver's own copy); "" on METADATA: the receiver's own view
Consistency = Annotated[str, msgspec.Meta(max_length=16)]


class GetRequest(Msg):
    index: Position = 0
    local: bool = False  # answer from the receiver's own committed copy, leader or not
    consistency: Consistency = "linearizable"  # ignored when local
    follower_read: bool = False  # a follower serves it (asking the leader for a read index), no redirect


class ReadRequest(Msg):
    from_index: Position = 0
    max_entries: Count = 1000
    max_bytes: Count = 4 << 20
    only_normal: bool = True
    local: bool = False  # answer from the receiver's own committed copy, leader or not
    consistency: Consistency = "linearizable"  # ignored when local
    wait_ms: Count = 0  # long poll: if from_index is not committed yet, wait up to this long for it
    follower_read: bool = False  # a follower serves it (asking the leader for a read index), no redirect
    bodies: bool = True  # False: every entry comes with an empty body (a reader of indexes and terms only)
    markers: bool = False  # True: only the session markers (magic 4) from from_index (transaction-aware readers)
    # True (with only_normal): the answer's entries come as columns (EntriesResponse.columnar),
    # no object per entry on either side; a member older than this option sends `entries`
    columnar: bool = False


class EntryMsg(msgspec.Struct, array_like=True):
    index: int
    term: int
    pos: int
    magic: int
    body: bytes
    chain_crc: int = 0


class EntriesResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    entries: list[EntryMsg] = []
    next_index: int = -1  # where a following read should start
    committed_index: int = -1
    message: str = ""
    # a columnar READ's entries (`entries` stays empty): little-endian int64 indexes, terms and
    # positions, int32 body end offsets into `bodies` (the bodies one after another)
    columnar: bool = False
    indexes: bytes = b""
    terms: bytes = b""
    positions: bytes = b""
    body_ends: bytes = b""
    bodies: bytes = b""


class MetadataRequest(Msg):
    consistency: Consistency = ""  # "": whoever answers, its own view; "linearizable": a confirmed leader's
    # a leader search (core.leader_wait): a member that does not lead answers when it wins an
    # election, or after this long with its view then (0: at once; ignored with a consistency)
    wait_ms: Count = 0


class MetadataResponse(msgspec.Struct, array_like=True):
    code: int
    group: str = ""
    self_id: str = ""
    role: str = ""
    leader_id: str = ""
    term: int = -1
    peers: str = ""
    ledger_begin_index: int = 0
    ledger_end_index: int = -1
    ledger_end_term: int = -1
    committed_index: int = -1
    message: str = ""
    store_error: str = ""  # why this member's store cannot write ("" when it can)
    retention_held_by: str = ""  # the follower whose needs keep retention from freeing space
    applied_index: int = -1  # state machine: the last index applied (-1: none, or no state machine)
    snapshot_index: int = -1  # the last index of this member's newest snapshot (-1: none)
    state_machine_error: str = ""  # why this member's state machine stopped applying
    install_index: int = -1  # a snapshot being received from the leader: its last index (-1: none)
    install_bytes: int = 0  # ... bytes of it received so far
    install_total: int = 0  # ... its size
    # how the member authenticates connections (DLedgerConfig.security_mode): tls, token, loopback, insecure
    security: str = ""


class LeadershipTransferRequest(Msg):
    """From a client to the leader (transferee_id set), or from the leader to the
    target, which then campaigns at once (DLedger's takeLeadership)."""

    term: Term = -1
    transfer_id: Name = ""  # current leader
    transferee_id: Name = ""  # target


class SimpleResponse(msgspec.Struct, array_like=True):
    code: int
    term: int = -1
    leader_id: str = ""
    message: str = ""


class FaultRequest(Msg):
    """Test hook (code FAULT): make this member drop traffic to and from `blocked` ids."""

    blocked: Annotated[list[Name], msgspec.Meta(max_length=64)] = []
    # a leadership transfer cut off mid-way: the member still sends its hand-over (TimeoutNow)
    # to the target, and nothing else reaches or leaves it (chaos, tests)
    spare_handover: bool = False


CONSISTENCY = ("linearizable", "lease", "leader", "local")


class QueryRequest(Msg):
    """A read-only request to the group's state machine (`StateMachine.query`)."""

    request: bytes = b""
    consistency: Consistency = "linearizable"
    follower_read: bool = False  # a follower serves it (asking the leader for a read index), no redirect


class QueryResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    result: bytes = b""
    applied_index: int = -1  # the state answered from includes every entry up to here
    message: str = ""


class ReadIndexRequest(Msg):
    """A follower asks the leader for a read index (follower read, Raft thesis §6.4): the
    leader confirms it leads (as `consistency` says) and answers its commit index."""

    consistency: Consistency = "linearizable"


class ReadIndexResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    read_index: int = -1
    message: str = ""


class SnapshotRequest(Msg):
    """Take a snapshot now (`dledger snapshot`); with `compact`, a plain log's member also
    compacts its log through `through` (-1: its commit index) as far as every member's needs
    allow (`dledger compact`)."""

    compact: bool = False
    through: int = -1


class SnapshotResponse(msgspec.Struct, array_like=True):
    code: int
    snapshot_index: int = -1  # compact: the last index compaction may delete through
    message: str = ""
    # compact: the log begin once compaction is done (whole data files go: the first index of
    # the file holding snapshot_index + 1), unless a member's needs hold it back
    begin_index: int = -1


Crc = Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)]
FileName = Annotated[str, msgspec.Meta(max_length=128)]
MAX_SNAPSHOT_FILES = MAX_FILES


class SnapshotFile(msgspec.Struct, array_like=True, frozen=True):
    size: Position
    crc32: Crc


class InstallSnapshotRequest(Msg):
    """One chunk of the leader's snapshot (core.install_snapshot). The snapshot's files travel
    as one stream in name order; every chunk names the whole snapshot, so a follower that lost
    its partial copy (a restart) learns to start again from 0."""

    term: Term = 0
    last_index: Index = -1  # the snapshot covers the log through here
    last_term: Term = -1
    chain_crc: Crc = 0  # of entry last_index: the log after it continues the chain from here
    next_pos: Position = 0  # where entry last_index + 1 starts
    # the configuration at last_index (a peers string from a member that predates Membership)
    members: Annotated[str, msgspec.Meta(max_length=1 << 16)] | Membership = ""
    files: Annotated[dict[FileName, SnapshotFile], msgspec.Meta(max_length=MAX_SNAPSHOT_FILES)] = {}
    offset: Position = 0  # of this chunk (`data`) in the stream
    crc: Crc = 0  # CRC32 of this chunk
    committed_index: Index = -1
    config_index: Index = -1  # the CONFIG_CHANGE entry `members` came from (-1: the first peers)


class InstallSnapshotResponse(msgspec.Struct, array_like=True):
    code: int
    term: int
    next_offset: int = 0  # where the next chunk must start (a refused chunk leaves it unchanged)
    done: bool = False  # the snapshot is installed (or the receiver already held its last entry)
    end_index: int = -1  # receiver's ledger end
    durable_index: int = -1
    reason: str = ""

# --- the wire: MEMBERS (anyone who may read metadata) and CHANGE_MEMBERS (admin) -------------


class MembersRequest(Msg):
    pass


class MemberInfo(msgspec.Struct, array_like=True):
    id: str
    addr: str
    voter: bool
    match_index: int = -1  # as the leader knows it (-1: unknown, or not answered by the leader)
    lag: int = -1  # leader's end index - match_index (-1: unknown)


class MembersResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    term: int = -1
    config_index: int = -1  # index of the CONFIG_CHANGE entry in force (-1: the command line's)
    committed: bool = True  # that entry is committed
    members: list[MemberInfo] = []
    message: str = ""


CHANGE_OPS = ("add-learner", "promote", "remove")


class ChangeMembersRequest(Msg):
    op: Annotated[str, msgspec.Meta(max_length=16)] = ""  # one of CHANGE_OPS
    member_id: Name = ""
    addr: Address = ""  # add-learner only


class ChangeMembersResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    term: int = -1
    config_index: Index = -1  # the CONFIG_CHANGE entry appended (its commit is awaited before answering)
    message: str = ""


CHANGE_REFUSALS = (
    ResponseCode.MEMBERSHIP_CHANGE_PENDING,
    ResponseCode.LEARNER_BEHIND,
    ResponseCode.UNKNOWN_MEMBER,
    ResponseCode.MEMBER_EXISTS,
)

# their codes' types, registered in REQUEST_TYPES / RESPONSE_TYPES from here (the one source);
# the runtime's access table (runtime.access.RAFT_ACCESS) names their roles
MEMBERSHIP_TYPES: dict[int, tuple[type[Msg], type[msgspec.Struct]]] = {
    RequestCode.MEMBERS: (MembersRequest, MembersResponse),
    RequestCode.CHANGE_MEMBERS: (ChangeMembersRequest, ChangeMembersResponse),
}


REQUEST_TYPES: dict[int, type[Msg]] = {
    RequestCode.VOTE: VoteRequest,
    RequestCode.HEART_BEAT: HeartBeatRequest,
    RequestCode.PUSH: PushRequest,
    RequestCode.APPEND: AppendRequest,
    RequestCode.GET: GetRequest,
    RequestCode.READ: ReadRequest,
    RequestCode.METADATA: MetadataRequest,
    RequestCode.LEADERSHIP_TRANSFER: LeadershipTransferRequest,
    RequestCode.FAULT: FaultRequest,
    RequestCode.QUERY: QueryRequest,
    RequestCode.SNAPSHOT: SnapshotRequest,
    RequestCode.INSTALL_SNAPSHOT: InstallSnapshotRequest,
    RequestCode.READ_INDEX: ReadIndexRequest,
    **{c: req for c, (req, _) in MEMBERSHIP_TYPES.items()},
}

RESPONSE_TYPES: dict[int, type[msgspec.Struct]] = {
    RequestCode.VOTE: VoteResponse,
    RequestCode.HEART_BEAT: HeartBeatResponse,
    RequestCode.PUSH: PushResponse,
    RequestCode.APPEND: AppendResponse,
    RequestCode.GET: EntriesResponse,
    RequestCode.READ: EntriesResponse,
    RequestCode.METADATA: MetadataResponse,
    RequestCode.LEADERSHIP_TRANSFER: SimpleResponse,
    RequestCode.FAULT: SimpleResponse,
    RequestCode.QUERY: QueryResponse,
    RequestCode.SNAPSHOT: SnapshotResponse,
    RequestCode.INSTALL_SNAPSHOT: InstallSnapshotResponse,
    RequestCode.READ_INDEX: ReadIndexResponse,
    **{c: resp for c, (_, resp) in MEMBERSHIP_TYPES.items()},
}

_encoder = msgspec.msgpack.Encoder()
_request_decoders = {c: msgspec.msgpack.Decoder(t) for c, t in REQUEST_TYPES.items()}
_response_decoders = {c: msgspec.msgpack.Decoder(t) for c, t in RESPONSE_TYPES.items()}


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)  # invalid UTF-8 is not a DecodeError


_MEMBER_CODES = frozenset((RequestCode.VOTE, RequestCode.HEART_BEAT, RequestCode.PUSH, RequestCode.INSTALL_SNAPSHOT,
                           RequestCode.READ_INDEX))


def is_member_message(code: int, msg: Msg) -> bool:
    """Only a member may send it (votes, heartbeats, pushes, snapshot installs, read indexes, a
    leader's hand-over to its successor): its sender is `leader_id`, which must be checked
    against who sent it."""
    return code in _MEMBER_CODES or (isinstance(msg, LeadershipTransferRequest) and bool(msg.transfer_id))


def is_member_code(code: int) -> bool:
    """`is_member_message` when the request itself is unknown (undecodable, or refused before
    decoding): only its code tells (a leader's hand-over then counts as a client's transfer)."""
    return code in _MEMBER_CODES


def decode_request(code: int, meta: bytes) -> Msg:
    """Decode a request; unknown codes and bad payloads raise (answered UNSUPPORTED / 411):
    KeyError, or one of DECODE_ERRORS (a field out of its bounds is a ValidationError)."""
    dec = _request_decoders.get(code)
    if dec is None:
        raise KeyError(code)
    return dec.decode(meta)


def decode_response(code: int, meta: bytes) -> msgspec.Struct:
    return _response_decoders[code].decode(meta)


# The module constants these codes were before issue 27 (RequestCode is now the one enum),
# kept so scripts written against them still run.
FAULT = RequestCode.FAULT
READ = RequestCode.READ
QUERY = RequestCode.QUERY
SNAPSHOT = RequestCode.SNAPSHOT
READ_INDEX = RequestCode.READ_INDEX
