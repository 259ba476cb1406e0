"""AsyncDLedgerClient and DLedgerClient (docs/clients.md).

The client finds the leader, follows NOT_LEADER redirects, and retries only when the
request certainly did not take effect: the member said NOT_LEADER / LEADER_TRANSFERRING /
LEADER_PENDING_FULL / LEADER_NOT_READY, or the connection could not be made. A timeout
or a lost connection after sending leaves the outcome unknown and is raised
(TIMEOUT / NETWORK_ERROR / TERM_CHANGED / WAIT_QUORUM_ACK_TIMEOUT): an append retried
then could be stored twice. Reads (GET, READ, METADATA) change nothing, so after a
timeout or a lost connection they are asked again of another member.

A member that does not answer (a crash, or a hung process whose kernel still accepts
connections) becomes suspect for a few seconds, or until it answers again: the client
stops asking it first and its redirects to it are not followed. When no leader is known
(a fresh client, or the leader stopped answering) the client asks every member at once
who leads, with a short timeout, and takes a member's own word that it leads: followers
go on naming a hung leader until they elect another. A member that does not lead keeps
that question until it wins an election (core.leader_wait) or most of the search's timeout
has passed, so a client learns a new leader within a round trip of its election, not on a
back-off step; the next search follows at once. The per-call `timeout` bounds the
whole call, every attempt and search included.

An idempotent client (`idempotent=True`: a producer id and per-body sequence numbers,
runtime.producer and core.producers) retries appends with an unknown outcome too: the
leader recognises what it already holds, so nothing is stored twice. A producer the leader
evicted (UNKNOWN_PRODUCER) starts a new session by itself: the next epoch, sequences from
0, the call's bodies sent again; bodies whose outcome was unknown when it was evicted may
then be stored twice. PRODUCER_RATE_LIMITED (too many producers created by this principal;
nothing was written) is waited out and sent again within the call's timeout;
PRODUCER_NOT_OWNED, SEQUENCE_REUSED, PRODUCER_FENCED and DUPLICATE_UNVERIFIABLE are raised
at once, never sent again (another principal's id; an id reused for other bodies, say by a
second process: it fails at its first append; a later session took over; a duplicate too old
for the leader to compare with the stored entry); the error names the way on: a new client
with a higher `producer_epoch`, or another `producer_id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import sys
import time
from array import array
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import ConfigError, Peer, format_peers, parse_peers
from dledger.core.membership import (
    CHANGE_OPS,
    ChangeMembersRequest,
    ChangeMembersResponse,
    MembersRequest,
    MembersResponse,
)
from dledger.core.messages import (
    CONSISTENCY,
    DECODE_ERRORS,
    MAX_APPEND_BODIES,
    AppendRequest,
    AppendResponse,
    EntriesResponse,
    FaultRequest,
    GetRequest,
    LeadershipTransferRequest,
    MetadataRequest,
    MetadataResponse,
    QueryRequest,
    QueryResponse,
    ReadRequest,
    SnapshotRequest,
    SnapshotResponse,
    decode_response,
    encode,
)
from dledger.entry import MAGIC_NORMAL
from dledger.runtime.blocking import LoopThread
from dledger.runtime.coalesce import Coalescer
from dledger.runtime.producer import UNKNOWN_OUTCOME, IdempotentProducer
from dledger.runtime.transport import Message, TransportClient
from dledger.runtime.transport_client import REFUSED
from dledger.security.roles import expect_members
from dledger.security.tls import TlsConfig, client_context

T = TypeVar("T")

_RETRYABLE = {
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_PENDING_FULL,
    ResponseCode.LEADER_NOT_READY,
    ResponseCode.PRODUCER_RATE_LIMITED,  # nothing written: sent again after the back-off
}
_UNANSWERED = {ResponseCode.TIMEOUT, ResponseCode.NETWORK_ERROR}  # raised by the transport: no answer
# safe to ask again after an unknown outcome
_IDEMPOTENT = {RequestCode.METADATA, RequestCode.GET, RequestCode.READ, RequestCode.QUERY, RequestCode.SNAPSHOT}
# a subscriber gives up on these (anything else is retried: leader changes, timeouts, ...)
_FOLLOW_FATAL = {ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.UNKNOWN_GROUP, ResponseCode.UNAUTHENTICATED,
                 ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, ResponseCode.UNSUPPORTED}
_SUSPECT_S = 5.0  # how long a member that did not answer is passed over, unless it answers meanwhile
# how often a client asks the group for its configuration while all goes well (in the background;
# after a failed leader search it asks at once, at most once per _MEMBERS_RETRY_S)
_MEMBERS_REFRESH_S = 10.0
_MEMBERS_RETRY_S = 1.0
# the share of a leader search's window a member that does not lead may keep the probe waiting
# for an election (the rest: the answer's way back on a loaded machine)
_PARK_SHARE = 0.75


@dataclass(frozen=True, slots=True)
class AppendResult:
    index: int
    term: int
    pos: int


@dataclass(frozen=True, slots=True)
class AppendSpan:
    """Where one `append_span` request's bodies went, without an object per body: the first
    and the last body's index (contiguous, unless `duplicates` of the first bodies were in
    the log already: each at its own index, -1 if older than the leader remembers)."""

    first_index: int
    last_index: int
    count: int
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class ProposeResult:
    """An entry appended, committed and applied: its index and the state machine's result."""

    index: int
    term: int
    result: bytes


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    pos: int
    body: bytes
    magic: int = 1


@dataclass(frozen=True, slots=True)
class EntryColumns:
    """One READ answer's NORMAL entries as columns (AsyncDLedgerClient.read_columns): `count`
    entries, little-endian int64 `indexes`, `terms`, `positions`, int32 `body_ends` (count + 1
    offsets into `bodies`, from 0). Arrow takes these buffers as they are."""

    count: int
    indexes: bytes
    terms: bytes
    positions: bytes
    body_ends: bytes
    bodies: bytes
    next_index: int  # where the next read starts
    committed_index: int  # the answering member's

    def index_list(self) -> array[int]:
        out = array("q")
        out.frombytes(self.indexes)
        if sys.byteorder == "big":
            out.byteswap()
        return out


def _columns_of(resp: EntriesResponse) -> EntryColumns:
    """A member older than columnar reads answers with entries: the same columns, built here."""
    if resp.columnar:
        return EntryColumns(len(resp.indexes) // 8, resp.indexes, resp.terms, resp.positions, resp.body_ends,
                            resp.bodies, resp.next_index, resp.committed_index)
    es = [e for e in resp.entries if e.magic == MAGIC_NORMAL]
    cols = [array("q", [e.index for e in es]), array("q", [e.term for e in es]), array("q", [e.pos for e in es]),
            array("i", itertools.accumulate((len(e.body) for e in es), initial=0))]
    if sys.byteorder == "big":
        for a in cols:
            a.byteswap()
    index, term, pos, ends = (a.tobytes() for a in cols)
    return EntryColumns(len(es), index, term, pos, ends, b"".join(e.body for e in es), resp.next_index,
                        resp.committed_index)


@dataclass(frozen=True, slots=True)
class Metadata:
    leader_id: str | None
    term: int
    members: list[str]
    ledger_end_index: int
    committed_index: int
    role: str
    self_id: str
    ledger_begin_index: int = 0
    store_error: str = ""  # why this member's store cannot write: it neither leads nor campaigns
    retention_held_by: str = ""  # the member whose needs keep retention from freeing disk space
    applied_index: int = -1  # state machine: last index applied (-1: none, or a plain log)
    snapshot_index: int = -1  # last index of this member's newest snapshot (-1: none)
    state_machine_error: str = ""  # why this member's state machine stopped applying
    install_index: int = -1  # a snapshot being received from the leader: its last index (-1: none)
    install_bytes: int = 0  # ... bytes received so far
    install_total: int = 0  # ... of this many
    security: str = ""  # how it authenticates connections: tls, token, loopback, insecure ("": an older member)


@dataclass(frozen=True, slots=True)
class Member:
    """One member of the configuration in force (`members()`)."""

    id: str
    address: str  # where clients reach it
    voter: bool  # a voter (elects, counts for commit), else a learner
    match_index: int = -1  # the leader's view: its last entry known replicated there (-1: unknown)
    lag: int = -1  # the leader's end index minus match_index (-1: unknown, or not the leader's answer)
    leader: bool = False


@dataclass(frozen=True, slots=True)
class Members:
    """The group's configuration as a member answered it: the leader's when `leader_id` is the
    member that answered (then every member's lag is known)."""

    leader_id: str | None
    term: int
    config_index: int  # the CONFIG_CHANGE entry in force (-1: the command line's configuration)
    committed: bool  # that entry is committed (False: a change under way)
    members: list[Member]
    answered_by: str = ""

    @property
    def voters(self) -> list[Member]:
        return [m for m in self.members if m.voter]

    @property
    def learners(self) -> list[Member]:
        return [m for m in self.members if not m.voter]

    def peers_string(self) -> str:
        """The configuration as a `--peers` string (voters first)."""
        return ";".join(f"{m.id}-{m.address}" for m in self.voters + self.learners)


class _Answers:
    """What members said during one leader search.

    Only a member's own claim to lead counts, and not when another member reports a
    higher term (the claimant is a deposed leader that has not noticed yet)."""

    __slots__ = ("answered", "claims", "closed", "refusal", "top_term")

    def __init__(self) -> None:
        self.claims: dict[str, int] = {}  # member -> the term it says it leads in
        self.top_term = -1
        self.answered = 0
        self.refusal: DLedgerError | None = None  # a definite error (e.g. UNKNOWN_GROUP)
        self.closed: dict[str, str] = {}  # members that accept no connection: why

    def add(self, member: str, answer: MetadataResponse | DLedgerError) -> None:
        if isinstance(answer, DLedgerError):
            if answer.message.startswith("connect to "):  # a real attempt refused (not the back-off)
                self.closed[member] = answer.message
            if answer.code not in _UNANSWERED and answer.code not in _RETRYABLE:
                self.refusal = self.refusal or answer
            return
        self.answered += 1
        self.top_term = max(self.top_term, answer.term)
        if answer.role == "leader":
            self.claims[member] = answer.term

    def leader(self) -> str | None:
        best = max(self.claims, key=self.claims.__getitem__, default=None)
        return best if best is not None and self.claims[best] >= self.top_term else None

    def failure(self, members: int) -> DLedgerError | None:
        """A definite error worth raising: only when no member answered at all; every one of
        the `members` refusing connections is one (nothing listens: waiting helps nobody)."""
        if self.answered:
            return None
        if self.refusal is None and len(self.closed) == members:
            said = "; ".join(f"{m}: {why}" for m, why in self.closed.items())
            # (the prefix: `never_sent` knows it, so nothing is taken for an unknown outcome; and
            # `refused` when every member refused)
            how = f", {REFUSED}" if all(_refused_text(why) for why in self.closed.values()) else ""
            return DLedgerError(ResponseCode.NETWORK_ERROR, f"connect to every member failed{how}: no member "
                                                            f"accepts connections ({said})")
        return self.refusal


def _session_hint(e: DLedgerError, p: IdempotentProducer) -> str:
    """How to go on after a refusal that means another session owns this producer id (the
    server's words name no parameter of this client): nothing of the call was written."""
    if e.code == ResponseCode.SEQUENCE_REUSED:  # every attempt of the call sent these bodies: none was stored
        why = ("nothing of this call was stored: its sequences hold other bodies (another process, or an "
               "earlier run, appended under this id)")
    elif e.code == ResponseCode.PRODUCER_FENCED:
        why = "a later session of this producer id took over"
    elif e.code == ResponseCode.DUPLICATE_UNVERIFIABLE:
        why = "its sequences cannot be compared with what is stored"
    else:
        return ""
    return (f"This client cannot append any more: {why}. To append new data, start a new session: a new client "
            f"with producer_id={p.id!r} and a producer_epoch above every epoch used with it so far (this one is "
            f"{p.epoch}), or another producer_id (or none: a random one)")


class AsyncDLedgerClient:
    """One client may serve many tasks: their requests share one connection per member.

    `append` calls made while others are being prepared (in the same loop iteration) travel
    together as one APPEND request (`coalesce`, as a Kafka producer batches), each still
    getting its own index; they then also share their fate: all commit, or all fail with
    the same code. `append_batch` is always exactly one request.
    """

    def __init__(self, peers: str, group: str = "default", timeout: float = 5.0,
                 request_timeout: float = 3.0, coalesce: bool = True,
                 max_coalesced_bytes: int = 1 << 20, discover_timeout: float = 1.0,
                 tls: TlsConfig | ssl.SSLContext | None = None, auth_token: str | None = None,
                 idempotent: bool = False, producer_id: str | None = None, producer_epoch: int = 0) -> None:
        """`tls`: the CA plus a client certificate (TlsConfig) or a ready client SSLContext, for a
        group started with TLS; `auth_token`: the group's shared token (docs/security.md).
        `idempotent`: appends go as a producer (`producer_id`, else a random one; in
        `producer_epoch`, which a later session of the same id raises) whose bodies are
        numbered, and are retried after an unknown outcome: each body is stored once. A
        producer the group forgot (UNKNOWN_PRODUCER) goes on in the next epoch by itself:
        bodies whose outcome was unknown when it was evicted may then be stored twice."""
        self.peers = parse_peers(peers)
        self._ssl = client_context(tls) if isinstance(tls, TlsConfig) else tls
        self._auth_token = auth_token.encode() if auth_token else None
        self.group = group
        self.timeout = timeout
        self.request_timeout = min(request_timeout, timeout)  # no request outlives the call's timeout
        self.discover_timeout = discover_timeout  # how long a leader search waits for a claim
        self.coalesce = coalesce
        self.max_coalesced_bytes = max_coalesced_bytes
        self.leader_id: str | None = None
        self._client: TransportClient | None = None
        # concurrent appends of one loop iteration travel as one APPEND (runtime.coalesce)
        self._coalescer: Coalescer[AppendResult] = Coalescer(self._append_coalesced, max_coalesced_bytes,
                                                             MAX_APPEND_BODIES, "request")
        self._suspects: dict[str, float] = {}  # member -> monotonic time its suspicion ends
        self._search: asyncio.Task[str | DLedgerError | None] | None = None  # shared by concurrent callers
        self._ever_answered = False  # a member answered once: no failing at once when all refuse later
        self._closed = False  # close() is final: no request reopens connections afterwards
        self._members_at = 0.0  # monotonic time of the last MEMBERS asked (following the configuration)
        self._config_index = -1  # the newest configuration entry a MEMBERS answer named
        self._members_task: asyncio.Task[None] | None = None
        # the member whose answer the last successful request got (set with no await between it
        # and the return of `_call`: the caller reads its own request's)
        self._answered_by = ""
        if producer_id is not None and not idempotent:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "producer_id needs idempotent=True")
        self.producer = IdempotentProducer(producer_id, producer_epoch) if idempotent else None

    def _check_open(self) -> None:
        """Refuse a request of a closed client, as the blocking client does (docs/clients.md):
        else it would open new connections, and against a member that accepts and never
        answers wait out the whole timeout instead of saying what is wrong."""
        if self._closed:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "this client is closed")

    def _transport(self) -> TransportClient:
        self._check_open()  # every request passes here (or _call's check), whichever method sent it
        if self._client is None:
            # the members known at each connect: one learned later is checked as well
            self._client = TransportClient(ssl=self._ssl, auth_token=self._auth_token, big_answers=True,
                                           server_check=lambda address, p: expect_members(
                                               {q.address: q.id for q in self.peers.values()})(address, p))
        return self._client

    async def close(self) -> None:
        """Close the connections; every request after this raises DLedgerError "this client is
        closed" (UNEXPECTED_ARGUMENT), a subscription too. Closing again does nothing."""
        self._closed = True
        if self._search is not None:
            self._search.cancel()
        if self._members_task is not None:
            self._members_task.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> AsyncDLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- API -------------------------------------------------------------------------------

    async def append(self, body: bytes) -> AppendResult:
        # an idempotent producer's unit of resending is one caller's bodies: no coalescing
        if not self.coalesce or self.producer is not None:
            return (await self.append_batch([body]))[0]
        return await self._coalescer.submit(bytes(body))

    async def _append_coalesced(self, bodies: list[bytes]) -> list[AppendResult | DLedgerError]:
        """One request for the bodies of several callers. Refused as a whole for a bad
        argument (a body over the member's limit: nothing was stored), each body is sent
        alone, so only the caller at fault gets the error."""
        try:  # (the coalescer's bodies are this request's own bytes already: no copy)
            return list(_append_results(await self._append_owned(bodies)))
        except DLedgerError as e:
            if e.code != ResponseCode.UNEXPECTED_ARGUMENT or len(bodies) == 1:
                raise
        return list(await asyncio.gather(*(self._append_one(b) for b in bodies)))

    async def _append_one(self, body: bytes) -> AppendResult | DLedgerError:
        try:
            return (await self.append_batch([body]))[0]
        except DLedgerError as e:
            return e

    async def append_batch(self, bodies: Sequence[bytes]) -> list[AppendResult]:
        """One request, one result per body in order; all or none are appended."""
        return _append_results(await self._append_request(bodies))

    async def append_span(self, bodies: Sequence[bytes]) -> AppendSpan:
        """`append_batch` answered with the first and last index only: a writer of large
        batches (the Spark sink) makes no result object per body."""
        return _append_span(await self._append_request(bodies))

    async def _append_request(self, bodies: Sequence[bytes]) -> AppendResponse:
        return await self._append_owned(_own_bytes(bodies))

    async def _append_owned(self, bodies: list[bytes]) -> AppendResponse:
        """`bodies`: the request's own list of `bytes` (_own_bytes; the coalescer's are)."""
        if not bodies:
            raise DLedgerError(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "append_batch needs at least one body")
        if len(bodies) > MAX_APPEND_BODIES:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"append_batch of {len(bodies)} bodies: at most {MAX_APPEND_BODIES} per request")
        if self.producer is not None:
            return await self._append_idempotent(bodies)
        req = AppendRequest(self.group, "", "", bodies)
        resp = await self._call(RequestCode.APPEND, req)
        assert isinstance(resp, AppendResponse)
        return resp

    async def _append_idempotent(self, bodies: list[bytes]) -> AppendResponse:
        """One request at a time per producer; an unknown outcome is sent again, same sequence."""
        p = self.producer
        assert p is not None
        async with p.lock():
            for _ in range(2):
                seq = p.begin(bodies)  # first: it may move a random id to a fresh one
                req = AppendRequest(self.group, "", "", bodies, producer=p.id, sequence=seq, epoch=p.epoch)
                try:
                    resp = await self._call(RequestCode.APPEND, req, safe=True)
                except DLedgerError as e:
                    if e.code == ResponseCode.UNKNOWN_PRODUCER and p.new_sessions:
                        p.new_session()  # evicted or expired: the next epoch, these bodies from sequence 0
                        continue
                    p.failed(bodies)
                    hint = _session_hint(e, p)
                    if hint:
                        raise DLedgerError(e.code, f"{e.message}. {hint}") from e
                    raise
                except BaseException:  # cancelled with the request out: its outcome is unknown
                    p.failed(bodies)
                    raise
                assert isinstance(resp, AppendResponse)
                p.settled(len(bodies), resp.duplicates)
                return resp
        raise DLedgerError(ResponseCode.UNKNOWN_PRODUCER, f"producer {p.id!r} was refused twice as unknown")

    async def propose(self, body: bytes) -> ProposeResult:
        """Append `body` and wait until the group's state machine applied it: one round trip,
        the leader answers with `StateMachine.apply`'s result for this entry."""
        return (await self.propose_batch([body]))[0]

    async def propose_batch(self, bodies: Sequence[bytes]) -> list[ProposeResult]:
        """One request: all appended (or none), one result per body in order."""
        bodies = _own_bytes(bodies)
        if not bodies or len(bodies) > MAX_APPEND_BODIES:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"propose_batch of {len(bodies)} bodies: 1 to {MAX_APPEND_BODIES} per request")
        req = AppendRequest(self.group, "", "", bodies, want_results=True)
        resp = await self._call(RequestCode.APPEND, req)
        assert isinstance(resp, AppendResponse)
        if len(resp.results) != len(bodies):
            raise DLedgerError(ResponseCode.INTERNAL_ERROR,
                               f"{len(resp.results)} results for {len(bodies)} bodies (an older member?)")
        return [ProposeResult(resp.index + k, resp.term, r) for k, r in enumerate(resp.results)]

    async def query(self, request: bytes, consistency: str | None = None, member: str | None = None) -> bytes:
        """`StateMachine.query(request)` on the leader, from a state that includes every entry
        committed before the call began.

        `consistency`: "linearizable" (the default; the leader confirms it still leads with a
        heartbeat round shared by the reads waiting for it), "lease" (no round while the
        leader's lease holds), "leader" (no confirmation: a leader cut off without knowing it
        may answer from a stale committed state), "local" (`member`'s own applied state,
        which may trail; the default when `member` is named). `member` with "linearizable" or
        "lease": a follower read — that member asks the leader for a read index and answers
        from its own state once it applied that far."""
        consistency, _, follower = _resolve(consistency, member)
        req = QueryRequest(self.group, "", "", bytes(request), consistency, follower)
        resp = await self._ask(member, RequestCode.QUERY, req)
        assert isinstance(resp, QueryResponse)
        return resp.result

    async def snapshot(self, member: str) -> int:
        """Make `member` snapshot its state now; the last index the snapshot covers."""
        if member not in self.peers:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{member} is not in peers")
        resp = await self._call_member(member, RequestCode.SNAPSHOT, SnapshotRequest(self.group, "", member),
                                       request_timeout=max(self.request_timeout, 60.0))
        assert isinstance(resp, SnapshotResponse)
        return resp.snapshot_index

    async def compact(self, member: str, through: int = -1) -> SnapshotResponse:
        """Make `member` (of a plain log) compact its log through `through` (-1: its commit
        index): `snapshot_index` is the point, `begin_index` the log begin it deletes up to
        once no member's needs hold it back (whole data files; `dledger compact`)."""
        if member not in self.peers:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{member} is not in peers")
        req = SnapshotRequest(self.group, "", member, compact=True, through=through)
        resp = await self._call_member(member, RequestCode.SNAPSHOT, req,
                                       request_timeout=max(self.request_timeout, 60.0))
        assert isinstance(resp, SnapshotResponse)
        return resp

    async def get(self, index: int, member: str | None = None, consistency: str | None = None) -> Entry:
        """The committed entry at `index`, from the leader (or `member`'s own copy).
        `consistency`: see `query`."""
        consistency, local, follower = _resolve(consistency, member)
        req = GetRequest(self.group, "", "", index, local, consistency, follower)
        resp = await self._ask(member, RequestCode.GET, req)
        assert isinstance(resp, EntriesResponse)
        if not resp.entries:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"no committed entry at {index}")
        e = resp.entries[0]
        return Entry(e.index, e.term, e.pos, e.body, e.magic)

    async def read(self, from_index: int = 0, max_entries: int = 1000, only_normal: bool = True,
                   member: str | None = None, consistency: str | None = None, *, bodies: bool = True) -> list[Entry]:
        """Committed entries from `from_index` (NOOP and config entries skipped by default).

        By default the leader answers; `member` reads that member's own committed copy.
        `consistency`: see `query` (each request of a long read is confirmed by itself).
        `bodies=False`: every entry comes with an empty body, and no body crosses the network
        (a member older than this option sends them anyway).
        """
        consistency, local, follower = _resolve(consistency, member)
        out: list[Entry] = []
        index = from_index
        while len(out) < max_entries:
            req = ReadRequest(self.group, "", "", index, min(max_entries - len(out), 1 << 20), 4 << 20, only_normal,
                              local, consistency, follower_read=follower, bodies=bodies)
            try:
                resp = await self._ask(member, RequestCode.READ, req)
            except DLedgerError as e:
                if e.code == ResponseCode.INDEX_OUT_OF_RANGE and (out or index > from_index):
                    break
                if e.code == ResponseCode.INDEX_OUT_OF_RANGE:
                    return out
                raise
            assert isinstance(resp, EntriesResponse)
            out.extend(Entry(e.index, e.term, e.pos, e.body, e.magic) for e in resp.entries)
            if resp.next_index <= index or resp.next_index > resp.committed_index:
                break
            index = resp.next_index
        return out

    async def read_markers(self, from_index: int, max_entries: int = 1000,
                           member: str | None = None) -> tuple[list[Entry], int, int]:
        """The committed session markers (magic 4: who appended the entries after each) from
        `from_index`: (markers, where the next call starts, the committed index). One request;
        a transaction-aware reader's (dledger.spark.isolation). A member older than this
        request answers entries instead: refused here (UNSUPPORTED)."""
        consistency, local, follower = _resolve(None, member)
        req = ReadRequest(self.group, "", "", from_index, max_entries, 4 << 20, False, local, consistency,
                          follower_read=follower, markers=True)
        resp = await self._ask(member, RequestCode.READ, req)
        assert isinstance(resp, EntriesResponse)
        if any(e.magic != 4 for e in resp.entries):
            raise DLedgerError(ResponseCode.UNSUPPORTED, "the member does not serve markers-only reads (older version)")
        return [Entry(e.index, e.term, e.pos, e.body, e.magic) for e in resp.entries], resp.next_index, \
            resp.committed_index

    async def read_columns(self, from_index: int, max_entries: int = 1000, member: str | None = None,
                           consistency: str | None = None, *, bodies: bool = True) -> EntryColumns:
        """One READ of committed NORMAL entries from `from_index` as columns (no object per
        entry): up to `max_entries`, fewer where the answer's byte limit or the member's
        committed index stops it (`next_index` says where to go on). `member`, `consistency`,
        `bodies`: as for `read`. INDEX_OUT_OF_RANGE past the committed index."""
        consistency, local, follower = _resolve(consistency, member)
        req = ReadRequest(self.group, "", "", from_index, min(max_entries, 1 << 20), 4 << 20, True, local,
                          consistency, follower_read=follower, bodies=bodies, columnar=True)
        resp = await self._ask(member, RequestCode.READ, req)
        assert isinstance(resp, EntriesResponse)
        return _columns_of(resp)

    async def subscribe(self, from_index: int = 0, *, only_normal: bool = True, max_entries: int = 1000,
                        wait: float = 10.0, consistency: str = "leader") -> AsyncGenerator[Entry, None]:
        """Committed entries from `from_index` on, for ever: each as soon as it commits (a
        long-poll READ waits at the leader up to `wait` seconds for the next one; no busy
        polling). Leader changes and errors are retried with a back-off, resuming at the next
        index: no gap, no duplicate. Raises only what retrying cannot mend (a bad argument,
        a group unknown, a start below the log's begin after retention)."""
        _check_consistency(consistency)
        index, delay = from_index, 0.05
        wait_ms = int(max(0.0, wait) * 1000)
        while True:
            req = ReadRequest(self.group, "", "", index, max_entries, 4 << 20, only_normal, consistency == "local",
                              consistency, wait_ms)
            try:
                resp = await self._call(RequestCode.READ, req, timeout=wait + self.timeout,
                                        request_timeout=wait + self.request_timeout)
            except DLedgerError as err:
                if err.code in _FOLLOW_FATAL:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.05
            assert isinstance(resp, EntriesResponse)
            for e in resp.entries:
                if e.index >= index:
                    yield Entry(e.index, e.term, e.pos, e.body, e.magic)
            index = max(index, resp.next_index)

    async def metadata(self, member: str | None = None, consistency: str = "") -> Metadata:
        """The leader's view, or `member`'s own when named. `consistency="linearizable"`: the
        view of a leader that a heartbeat round confirmed after the call began."""
        if consistency:
            _check_consistency(consistency)
        req = MetadataRequest(self.group, "", member or "", consistency if member is None else "")
        if member is not None:
            resp = await self._call_member(member, RequestCode.METADATA, req)
        else:
            resp = await self._call(RequestCode.METADATA, req)
            assert isinstance(resp, MetadataResponse)
            if resp.role != "leader" and resp.leader_id in self.peers and resp.leader_id != resp.self_id:
                # a follower answered: its commit index lags; the leader's view is the one asked for
                self.leader_id = resp.leader_id
                resp = await self._call(RequestCode.METADATA, req)
        assert isinstance(resp, MetadataResponse)
        return Metadata(resp.leader_id or None, resp.term, list(parse_peers(resp.peers)), resp.ledger_end_index,
                        resp.committed_index, resp.role, resp.self_id, resp.ledger_begin_index,
                        resp.store_error, resp.retention_held_by, resp.applied_index, resp.snapshot_index,
                        resp.state_machine_error, resp.install_index, resp.install_bytes, resp.install_total,
                        resp.security)

    async def metadata_all(self, members: Sequence[str] | None = None) -> dict[str, Metadata | DLedgerError]:
        """Each member's own view, asked at once (a dead member costs one request timeout in
        all), or the error asking it: what `dledger status` and `health` judge."""
        self._check_open()  # here itself: each member's "closed" would be collected, not raised
        names = list(members) if members is not None else list(self.peers)

        async def one(m: str) -> Metadata | DLedgerError:
            try:
                return await self.metadata(m)
            except DLedgerError as e:
                return e

        return dict(zip(names, await asyncio.gather(*(one(m) for m in names)), strict=True))

    async def transfer_leadership(self, target: str) -> None:
        if target not in self.peers:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{target} is not in peers")
        req = LeadershipTransferRequest(self.group, "", "", -1, "", target)
        # the leader answers once the target leads or its transfer timeout (3 s by default)
        # expires: wait longer than that, or a definite TAKE_LEADERSHIP_FAILED becomes TIMEOUT
        await self._call(RequestCode.LEADERSHIP_TRANSFER, req, timeout=self.timeout + 5,
                         request_timeout=self.timeout + 5)

    # --- membership (docs/operations.md) ----------------------------------------------------

    async def members(self, member: str | None = None) -> Members:
        """The group's configuration: voters and learners with their addresses, from the
        leader (with each member's match index and lag), or `member`'s own view when named.
        The client also adds members it did not know to its peers."""
        req = MembersRequest(self.group, "", member or "")
        if member is not None:
            return self._learn_members(member, await self._call_member(member, RequestCode.MEMBERS, req))
        answer = await self._call_members(req)
        if answer.leader_id and answer.leader_id != answer.answered_by and answer.leader_id in self.peers:
            # a follower answered (it knows no lag): the leader's view is the one asked for
            self.leader_id = answer.leader_id
            with contextlib.suppress(DLedgerError):
                answer = self._learn_members(answer.leader_id, await self._call_member(
                    answer.leader_id, RequestCode.MEMBERS, MembersRequest(self.group, "", answer.leader_id)))
        return answer

    async def _call_members(self, req: MembersRequest) -> Members:
        """MEMBERS of the leader (or of whichever member answers first when none leads)."""
        resp = await self._call(RequestCode.MEMBERS, req)
        assert isinstance(resp, MembersResponse)
        return self._learn_members(self._answered_by, resp)

    async def add_learner(self, member_id: str, address: str) -> int:
        """Add `member_id` at `address` (host:port, where clients reach it) as a learner: it
        receives the log but neither votes nor counts for commit. Start it then with `dledger
        server --join`. The index of the configuration entry, once committed."""
        return await self._change("add-learner", member_id, address)

    async def promote(self, member_id: str) -> int:
        """Make learner `member_id` a voter; refused with LEARNER_BEHIND (440) while it trails
        the leader by more than the group's learner_max_lag."""
        return await self._change("promote", member_id)

    async def remove_member(self, member_id: str) -> int:
        """Remove `member_id` (a voter or a learner; the leader itself steps down once the
        change commits). The index of the configuration entry, once committed."""
        return await self._change("remove", member_id)

    async def _change(self, op: str, member_id: str, address: str = "") -> int:
        if op not in CHANGE_OPS:  # (the methods above name only valid ones)
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"unknown membership change {op!r}")
        if not member_id:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "a membership change names a member id")
        if op == "add-learner":
            try:
                parse_peers(f"{member_id}-{address}")
            except ConfigError as e:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"add-learner {member_id} {address}: "
                                                                     f"{e.message}") from None
        req = ChangeMembersRequest(self.group, "", "", op, member_id, address)
        # answered once the entry commits: give it as long as a leadership transfer
        resp = await self._call(RequestCode.CHANGE_MEMBERS, req, timeout=self.timeout + 5,
                                request_timeout=self.timeout + 5)
        assert isinstance(resp, ChangeMembersResponse)
        if op == "add-learner" and member_id not in self.peers:
            self._add_peer(member_id, address)
        self._members_at = 0.0  # the configuration changed: follow it at the next chance
        return resp.config_index

    def peers_string(self) -> str:
        """Every member this client knows now (its peers and those it learned), `--peers` form.
        (A copy first: the blocking client's loop thread may be adding members meanwhile.)"""
        return format_peers(dict(self.peers))

    def _learn_members(self, member: str, resp: msgspec.Struct) -> Members:
        """Follow the configuration a member answered: members not known yet join the peers;
        members a leader's committed configuration no longer has leave them."""
        assert isinstance(resp, MembersResponse)
        infos = [Member(i.id, i.addr, i.voter, i.match_index, i.lag, i.id == resp.leader_id)
                 for i in resp.members]
        self._members_at = time.monotonic()
        self._config_index = max(self._config_index, resp.config_index)
        for i in infos:
            if i.id not in self.peers or self.peers[i.id].address != i.address:
                self._add_peer(i.id, i.address)
        if resp.committed and resp.leader_id and resp.leader_id == member and infos:
            current = {i.id for i in infos}
            for gone in [p for p in self.peers if p not in current]:
                del self.peers[gone]
                self._suspects.pop(gone, None)
                if self.leader_id == gone:
                    self.leader_id = None
        return Members(resp.leader_id or None, resp.term, resp.config_index, resp.committed, infos, member)

    def _add_peer(self, member_id: str, address: str) -> None:
        try:
            peer = parse_peers(f"{member_id}-{address}")[member_id]
        except (ConfigError, KeyError):
            return  # not a usable address: keep what is known
        self.peers[member_id] = peer

    def _follow_members_soon(self, now: bool = False) -> None:
        """Ask the group for its configuration in the background (at most once per interval;
        `now`: after a failure, sooner): a client started with an old peers string keeps up
        with members replaced one by one. A member that does not know MEMBERS is ignored."""
        if self._closed or (self._members_task is not None and not self._members_task.done()):
            return
        if time.monotonic() - self._members_at < (_MEMBERS_RETRY_S if now else _MEMBERS_REFRESH_S):
            return
        self._members_at = time.monotonic()
        self._members_task = asyncio.get_running_loop().create_task(self._refresh_members())

    async def _refresh_members(self) -> None:
        """MEMBERS from the leader if one is trusted, else from the members not suspect, one
        after another: the first answer counts."""
        leader = self._trusted_leader()
        targets = [leader] if leader is not None else [m for m in self.peers if not self._is_suspect(m)]
        targets = targets or list(self.peers)
        asked: set[str] = set()
        while targets:
            m = targets.pop(0)
            asked.add(m)
            try:
                self._learn_members(m, await self._call_member(m, RequestCode.MEMBERS,
                                                               MembersRequest(self.group, "", m),
                                                               min(self.discover_timeout, self.request_timeout)))
                return
            except DLedgerError as e:
                resp = getattr(e, "response", None)
                if e.code == ResponseCode.NOT_A_MEMBER and isinstance(resp, MembersResponse):
                    # a removed member names the configuration that removed it: ask those next
                    self._learn_members(m, resp)
                    targets += [i.id for i in resp.members if i.id not in asked and i.id not in targets]

    async def inject_faults(self, member: str, blocked: list[str], spare_handover: bool = False) -> None:
        """Test hook: make `member` drop all traffic to and from `blocked` member ids
        (an empty list heals). A partition needs this on both sides. `spare_handover`: only
        `member` drops, and it still sends the hand-over of a leadership transfer (a transfer
        cut off mid-way)."""
        req = FaultRequest(self.group, "", member, list(blocked), spare_handover)
        await self._call_member(member, RequestCode.FAULT, req)

    # --- plumbing --------------------------------------------------------------------------

    async def _ask(self, member: str | None, code: int, req: msgspec.Struct) -> msgspec.Struct:
        """`member` itself when named, else the leader (found and followed by `_call`)."""
        if member is None:
            return await self._call(code, req)
        return await self._call_member(member, code, req)

    async def _call(self, code: int, req: msgspec.Struct, timeout: float | None = None,
                    request_timeout: float | None = None, safe: bool = False) -> msgspec.Struct:
        """Ask the leader, within `timeout` in all: follow redirects, pass over members that
        do not answer, and send again only what certainly did not take effect (or a read, or
        what is `safe` to repeat: an idempotent producer's append)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        per_request = request_timeout or self.request_timeout
        last: DLedgerError | None = None
        delay = 0.05
        while (left := deadline - (now := time.monotonic())) > 0:
            if self._closed:
                if last is not None:
                    raise last  # closed mid-call: what the last attempt met (an unknown outcome stays one)
                self._check_open()  # also between attempts: a client closed meanwhile ends the call at once
            searched = 0.0
            target = self._trusted_leader()
            if target is None:
                target = await self._find_leader(left)
                searched = time.monotonic() - now
                left = deadline - time.monotonic()
            self._follow_members_soon(now=target is None)
            if target is not None and left > 0:
                try:
                    return await self._call_member(target, code, req, min(per_request, left))
                except DLedgerError as e:
                    last = e
                    if not self._may_retry(target, code, e, safe):
                        raise
                    if e.code == ResponseCode.NOT_LEADER and self.leader_id:
                        continue  # redirected: go at once
            if self._closed:
                continue  # no back-off for a closed client: the loop's top ends the call
            if target is None and searched >= delay:
                continue  # the members kept the search waiting for an election: ask again at once
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
        raise last or DLedgerError(ResponseCode.TIMEOUT, "no member said it leads in time")

    def _may_retry(self, target: str, code: int, e: DLedgerError, safe: bool = False) -> bool:
        """Whether the request may be sent again after `e` from `target`; updates who leads."""
        if e.code == ResponseCode.NOT_LEADER:
            self.leader_id = self._hint(e, target)
            return True
        if e.code in _RETRYABLE:
            self.leader_id = self._hint(e, target) or self.leader_id
            return True
        if e.code == ResponseCode.NOT_A_MEMBER:
            # removed from the group: it did nothing and serves nothing; ask the others (the
            # configuration the client learns next drops it from the peers); with no other
            # member known there is nobody to ask
            self._suspect(target)
            if self.leader_id == target:
                self.leader_id = None
            self._follow_members_soon(now=True)
            return any(p != target for p in self.peers)
        if e.code in _UNANSWERED:
            self._follow_members_soon(now=True)  # the member may have left: what is the group now?
            if self.leader_id == target:
                self.leader_id = None  # this call (if it may retry) and the next ones search again
            return never_sent(e) or code in _IDEMPOTENT or safe
        if safe and e.code in UNKNOWN_OUTCOME:  # TERM_CHANGED, WAIT_QUORUM_ACK_TIMEOUT: ask the leader again
            self.leader_id = None
            return True
        return False

    def _hint(self, e: DLedgerError, target: str) -> str | None:
        """The leader a refusing member named, if worth following (known, not itself, not suspect)."""
        hint = getattr(e, "leader_hint", None)
        if hint and hint not in self.peers:
            self._follow_members_soon(now=True)  # a leader this client never heard of: a new member
        if hint in self.peers and hint != target and not self._is_suspect(hint):
            return str(hint)
        return None

    def _trusted_leader(self) -> str | None:
        leader = self.leader_id
        return leader if leader is not None and not self._is_suspect(leader) else None

    # --- suspicion and leader search ------------------------------------------------------------

    def _suspect(self, member: str) -> None:
        self._suspects[member] = time.monotonic() + _SUSPECT_S

    def _is_suspect(self, member: str) -> bool:
        until = self._suspects.get(member)
        if until is not None and until <= time.monotonic():
            del self._suspects[member]  # expired: a resumed member is used again
            return False
        return until is not None

    async def _find_leader(self, wait: float) -> str | None:
        """The leader, from one search that concurrent callers share; None if none was found
        within `wait` (an election under way, or no member answering)."""
        if len(self.peers) == 1:
            return next(iter(self.peers))  # nobody else to ask: send to it and see
        task = self._search
        if task is None:
            task = self._search = asyncio.get_running_loop().create_task(self._search_leader())
            task.add_done_callback(self._search_done)
        done, _ = await asyncio.wait([task], timeout=wait)
        if not done or task.cancelled():
            return None
        found = task.result()
        if isinstance(found, DLedgerError):
            raise DLedgerError(found.code, found.message)  # a copy per caller
        return found

    def _search_done(self, task: asyncio.Task[str | DLedgerError | None]) -> None:
        if self._search is task:
            self._search = None
        if not task.cancelled():
            task.exception()  # retrieved even if every caller stopped waiting

    async def _search_leader(self) -> str | DLedgerError | None:
        """Ask every member at once who leads (suspects too: that is how one that resumed is
        noticed); the first claim wins. Members silent for `discover_timeout` become suspect."""
        window = min(self.discover_timeout, self.request_timeout)
        probes = {asyncio.ensure_future(self._probe(m, window)): m for m in self.peers}
        answers = _Answers()
        pending = set(probes)
        end = time.monotonic() + window
        try:
            while pending and answers.leader() is None and (left := end - time.monotonic()) > 0:
                done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                for probe in done:
                    answers.add(probes[probe], probe.result())
        finally:
            for probe in pending:
                probe.cancel()
        leader = answers.leader()
        if leader is not None:
            self.leader_id = leader
            return leader
        for probe in pending:
            self._suspect(probes[probe])
        failure = answers.failure(len(self.peers))
        if failure is not None and self._ever_answered and failure.code == ResponseCode.NETWORK_ERROR:
            return None  # a group that answered before (a restart of all of it?): wait within the timeout
        return failure

    async def _probe(self, member: str, timeout: float) -> MetadataResponse | DLedgerError:
        # a member that does not lead answers when it wins an election (core.leader_wait), or
        # with its view before the probe times out: a parked member is not taken for a silent one
        wait_ms = int(timeout * 1000 * _PARK_SHARE)
        try:
            resp = await self._call_member(member, RequestCode.METADATA,
                                           MetadataRequest(self.group, "", member, wait_ms=wait_ms), timeout)
        except DLedgerError as e:
            return e
        assert isinstance(resp, MetadataResponse)
        self._learn_peers(resp.peers)
        return resp

    def _learn_peers(self, peers: str) -> None:
        """Members a member's METADATA names that this client does not know: added (a member
        reports the configuration in force; removals are learned from MEMBERS only)."""
        try:
            named = parse_peers(peers)
        except ConfigError:
            return
        for member_id, peer in named.items():
            if member_id not in self.peers:
                self.peers[member_id] = peer

    async def _call_member(self, member: str, code: int, req: msgspec.Struct,
                           request_timeout: float | None = None) -> msgspec.Struct:
        peer = self.peers.get(member)
        if peer is None:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{member} is not a member this client knows "
                                                            f"({', '.join(self.peers)})")
        if hasattr(req, "remote_id"):
            req = msgspec.structs.replace(req, remote_id=member)
        try:
            raw = await self._transport().request(peer.address, Message(code, encode(req)),
                                                  request_timeout or self.request_timeout)
        except DLedgerError as e:
            if e.code in _UNANSWERED:
                self._suspect(member)
            raise
        self._suspects.pop(member, None)  # it answered: whatever it says, it is alive
        self._ever_answered = True
        self._answered_by = member
        try:
            resp = decode_response(code, raw.meta)
        except DECODE_ERRORS:
            resp = None
        if raw.code != ResponseCode.SUCCESS or resp is None or getattr(resp, "code", 200) != 200:
            err_code = raw.code if raw.code != ResponseCode.SUCCESS else getattr(resp, "code", ResponseCode.UNKNOWN)
            text = getattr(resp, "message", "") or error_text(raw.meta)
            err = DLedgerError(ResponseCode(err_code) if err_code in ResponseCode._value2member_map_
                               else ResponseCode.UNKNOWN, f"{member}: {text or ResponseCode(err_code).name}")
            err.leader_hint = getattr(resp, "leader_id", "") or None  # type: ignore[attr-defined]
            err.response = resp  # type: ignore[attr-defined]  # (a removed member's MEMBERS names the group)
            raise err
        if isinstance(resp, (AppendResponse, EntriesResponse, QueryResponse)) and resp.leader_id in self.peers:
            self.leader_id = resp.leader_id
        if isinstance(resp, AppendResponse) and resp.config_index > self._config_index:
            # the group's configuration changed since we last asked: follow it now, not at the
            # next periodic refresh (members may all be replaced in between)
            self._config_index = resp.config_index
            self._members_at = 0.0
            self._follow_members_soon()
        return resp


def _own_bytes(bodies: Sequence[bytes]) -> list[bytes]:
    """The bodies in a list of the request's own (a caller changing its list later changes
    nothing sent), each `bytes`: immutable, so a resend after an unknown outcome sends what
    the first attempt did. Bodies that are bytes already are not converted (no call per body)."""
    own = list(bodies)
    if not all(type(b) is bytes for b in own):
        own = [bytes(b) for b in own]
    return own


def _append_span(resp: AppendResponse) -> AppendSpan:
    if resp.indexes:
        return AppendSpan(resp.indexes[0], resp.indexes[-1], len(resp.indexes), resp.duplicates)
    return AppendSpan(resp.index, resp.index + len(resp.positions) - 1, len(resp.positions), resp.duplicates)


def _append_results(resp: AppendResponse) -> list[AppendResult]:
    """One result per body: contiguous from `index`, or each its own (`indexes`: an idempotent
    append that found some bodies in the log already)."""
    if resp.indexes:
        return [AppendResult(i, t, p) for i, t, p in zip(resp.indexes, resp.terms, resp.positions, strict=True)]
    return [AppendResult(resp.index + k, resp.term, p) for k, p in enumerate(resp.positions)]


def _resolve(consistency: str | None, member: str | None) -> tuple[str, bool, bool]:
    """(consistency, local, follower_read) of a read: `member` alone reads its own copy;
    `member` with linearizable or lease is a follower read there (when it does not lead)."""
    if consistency is None:
        consistency = "local" if member is not None else "linearizable"
    _check_consistency(consistency)
    local = consistency == "local"
    return consistency, local, member is not None and consistency in ("linearizable", "lease")


def _check_consistency(consistency: str) -> None:
    if consistency not in CONSISTENCY:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"consistency {consistency!r}: one of {', '.join(CONSISTENCY)}")


def error_text(meta: bytes) -> str:
    try:
        obj = msgspec.msgpack.decode(meta)
    except msgspec.DecodeError:
        return ""
    if isinstance(obj, dict):
        return str(obj.get("error", ""))
    if isinstance(obj, list) and obj and isinstance(obj[-1], str):
        return obj[-1]
    return ""


def never_sent(e: DLedgerError) -> bool:
    """The transport could not connect (or is backing off): the request never left.

    Only the transport's own connect-failure messages count: "connection with X lost"
    (the member died after the request was sent) also contains "connect", and
    retrying then could store an append twice."""
    text = e.message
    return text.startswith("connect to ") or "in backoff after a failed connect" in text


def refused(e: DLedgerError) -> bool:
    """Every connection the request tried was refused (ECONNREFUSED): nothing listens at the
    address. Narrower than `never_sent`: a connect timeout (a partition, a member whose loop is
    stalled), a TLS handshake or a token exchange that failed mean a member may be there."""
    return never_sent(e) and _refused_text(e.message)


def _refused_text(text: str) -> bool:
    return REFUSED in text.split(": ", 1)[0]  # the head only: the members' own reasons follow


class DLedgerClient:
    """Blocking client: runs an AsyncDLedgerClient on a private event-loop thread,
    so it also works where a loop is already running (notebooks, Spark tasks)."""

    def __init__(self, peers: str, group: str = "default", timeout: float = 5.0, coalesce: bool = True,
                 tls: TlsConfig | ssl.SSLContext | None = None, auth_token: str | None = None,
                 idempotent: bool = False, producer_id: str | None = None, producer_epoch: int = 0) -> None:
        self._async = AsyncDLedgerClient(peers, group, timeout, coalesce=coalesce, tls=tls, auth_token=auth_token,
                                         idempotent=idempotent, producer_id=producer_id,
                                         producer_epoch=producer_epoch)
        self._loop = LoopThread("dledger-client")
        self._run = self._loop.run

    def append(self, body: bytes) -> AppendResult:
        return self._run(self._async.append(body))

    def append_batch(self, bodies: Sequence[bytes]) -> list[AppendResult]:
        return self._run(self._async.append_batch(bodies))

    def append_span(self, bodies: Sequence[bytes]) -> AppendSpan:
        return self._run(self._async.append_span(bodies))

    def get(self, index: int, member: str | None = None, consistency: str | None = None) -> Entry:
        return self._run(self._async.get(index, member, consistency))

    def read(self, from_index: int = 0, max_entries: int = 1000, member: str | None = None,
             consistency: str | None = None, *, bodies: bool = True) -> list[Entry]:
        return self._run(self._async.read(from_index, max_entries, member=member, consistency=consistency,
                                          bodies=bodies))

    def read_markers(self, from_index: int, max_entries: int = 1000,
                     member: str | None = None) -> tuple[list[Entry], int, int]:
        return self._run(self._async.read_markers(from_index, max_entries, member))

    def read_columns(self, from_index: int, max_entries: int = 1000, member: str | None = None,
                     consistency: str | None = None, *, bodies: bool = True) -> EntryColumns:
        return self._run(self._async.read_columns(from_index, max_entries, member=member, consistency=consistency,
                                                  bodies=bodies))

    def metadata(self, member: str | None = None, consistency: str = "") -> Metadata:
        return self._run(self._async.metadata(member, consistency))

    def metadata_all(self, members: Sequence[str] | None = None) -> dict[str, Metadata | DLedgerError]:
        return self._run(self._async.metadata_all(members))

    def subscribe(self, from_index: int = 0, *, only_normal: bool = True, max_entries: int = 1000,
                  wait: float = 10.0, consistency: str = "leader") -> Iterator[Entry]:
        """AsyncDLedgerClient.subscribe as a blocking iterator (close it, or leave the loop)."""
        agen = self._async.subscribe(from_index, only_normal=only_normal, max_entries=max_entries, wait=wait,
                                     consistency=consistency)
        return self._loop.iterate(agen)

    def propose(self, body: bytes) -> ProposeResult:
        return self._run(self._async.propose(body))

    def propose_batch(self, bodies: Sequence[bytes]) -> list[ProposeResult]:
        return self._run(self._async.propose_batch(bodies))

    def query(self, request: bytes, consistency: str | None = None, member: str | None = None) -> bytes:
        return self._run(self._async.query(request, consistency, member))

    def snapshot(self, member: str) -> int:
        return self._run(self._async.snapshot(member))

    def compact(self, member: str, through: int = -1) -> SnapshotResponse:
        return self._run(self._async.compact(member, through))

    def transfer_leadership(self, target: str) -> None:
        self._run(self._async.transfer_leadership(target))

    def inject_faults(self, member: str, blocked: list[str], spare_handover: bool = False) -> None:
        self._run(self._async.inject_faults(member, blocked, spare_handover))

    def members(self, member: str | None = None) -> Members:
        return self._run(self._async.members(member))

    def add_learner(self, member_id: str, address: str) -> int:
        return self._run(self._async.add_learner(member_id, address))

    def promote(self, member_id: str) -> int:
        return self._run(self._async.promote(member_id))

    def remove_member(self, member_id: str) -> int:
        return self._run(self._async.remove_member(member_id))

    def peers_string(self) -> str:
        return self._async.peers_string()

    @property
    def leader_id(self) -> str | None:
        return self._async.leader_id

    @property
    def producer(self) -> IdempotentProducer | None:
        """An idempotent client's producer (its id, next sequence, duplicates seen)."""
        return self._async.producer

    @property
    def peers(self) -> dict[str, Peer]:
        return self._async.peers

    def close(self) -> None:
        self._loop.close(self._async.close)

    def __enter__(self) -> DLedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


