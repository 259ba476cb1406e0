"""DLedgerServer: drives core.Node with real time, real disks and real sockets.

One process may serve several groups (one `GroupRuntime` each) behind one TCP
listener; requests are routed by their `group` field. Incoming requests are
handed to the node in arrival order, before any await, so a leader's pushes
are applied in the order it sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from prometheus_client import Counter

from dledger.address import parse_address
from dledger.clock import now_ms
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import (
    Answered,
    Applied,
    ApplyFailed,
    ChunkInstalled,
    ChunkRead,
    Durable,
    Restored,
    SnapshotTaken,
)
from dledger.core.messages import (
    DECODE_ERRORS,
    AppendRequest,
    AppendResponse,
    FaultRequest,
    LeadershipTransferRequest,
    Msg,
    QueryRequest,
    QueryResponse,
    ReadRequest,
    SimpleResponse,
    VoteResponse,
    VoteResult,
    decode_request,
    decode_response,
    encode,
    is_member_code,
    is_member_message,
)
from dledger.core.node import (
    Apply,
    DropInstall,
    InstallChunk,
    Node,
    ReadChunk,
    Reply,
    RestoreSnapshot,
    RunQuery,
    Send,
    TakeSnapshot,
)
from dledger.membership import Membership
from dledger.ratelog import RateLimitedLog
from dledger.runtime.access import RAFT_ACCESS, content_refusal
from dledger.runtime.loop_stall import LoopStallMonitor
from dledger.runtime.members import MemberAddresses, node_membership
from dledger.runtime.metrics import KIND_CLIENT, KIND_MEMBER, OTHER_GROUP, UNKNOWN_REQUEST, Metrics
from dledger.runtime.statemachines import StateMachineHost, load_state_machine
from dledger.runtime.transport import (
    LISTENER_BOTH,
    LISTENER_CLIENT,
    LISTENER_MEMBER,
    Caller,
    DirectHandler,
    FaultInjector,
    Limits,
    Message,
    Respond,
    TransportClient,
    TransportServer,
    connection_cap,
    encode_error,
)
from dledger.security.roles import Access, Tokens, expect_members
from dledger.security.tls import TlsConfig, check_member_cert, client_context, server_context
from dledger.statemachine.api import StateMachine
from dledger.statemachine.applier import Applier, ApplyBatch
from dledger.statemachine.snapshot import SnapshotError, SnapshotMeta
from dledger.store import open_store

log = logging.getLogger(__name__)

T = TypeVar("T")
TICK_S = 0.01
MEMBER_BACKOFF_MAX_S = 0.5
FAULT_DISABLED = "fault injection is disabled on this member; start it with --enable-fault-injection"
# A sealed group's client data plane: refused to every client (docs/security.md). Its raw log
# holds what the service's own requests guard (certificate names, addresses), and a QUERY
# would run a hand-made command past the service's role checks. Member traffic (PUSH, VOTE,
# READ_INDEX, ...), METADATA, LEADERSHIP_TRANSFER, SNAPSHOT and FAULT are served as for any group.
SEALED_CODES = frozenset((RequestCode.APPEND, RequestCode.GET, RequestCode.READ, RequestCode.QUERY))


class GroupRefused(Exception):
    """The group did not carry an in-process proposal or query through (`GroupRuntime.propose`,
    `query`): its answer's code and message, and the leader it named ("" none known)."""

    def __init__(self, code: int, message: str, leader_id: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else str(code))
        self.code, self.message, self.leader_id = code, message, leader_id


@dataclass(frozen=True)
class GroupStatus:
    """What a service on the member reads of its group (`GroupRuntime.status`): a copy, taken
    between two inputs to the node, so it never changes under its reader."""

    group: str
    self_id: str
    term: int
    is_leader: bool
    leader_id: str  # "" none known
    leader_address: str  # where the leader takes client requests ("" unknown)
    lease_valid: bool  # the leader's Raft lease holds: no other member can lead before it ends
    committed_index: int
    applied_index: int  # -1: no state machine, or nothing applied
    last_index: int  # the last index of this member's log (a leader's entries, if stored, are at or before it)
    members: tuple[tuple[str, str], ...]  # (member id, client address), in configuration order


@dataclass(frozen=True)
class ServiceMount:
    """A service a process serves beside a group, on the group's port (`DLedgerServer.mount`):
    its request codes with their handlers and the roles each needs (checked by the transport
    before the handler runs), what it wants to hear of closed connections, and whether the
    group's log is its alone (sealed: clients neither append to it nor read or query it,
    SEALED_CODES; the service proposes and queries in-process)."""

    handlers: Mapping[int, DirectHandler]
    access: Mapping[int, Access]
    connection_lost: tuple[Callable[[Caller], None], ...] = field(default=())
    sealed: bool = True


class GroupRuntime:
    """One member of one group: its Node, store, ticker and outgoing requests."""

    def __init__(self, cfg: DLedgerConfig, client: TransportClient, faults: FaultInjector | None,
                 metrics: Metrics | None = None, state_machine: StateMachine | None = None,
                 membership: Membership | None = None) -> None:
        """`membership`: the group's configuration for a member joining it (`--join`), used by
        the node only while neither its log nor its snapshot holds one."""
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        self.client = client
        self.faults = faults  # None unless started with --enable-fault-injection (then FAULT obeyed)
        # where members reach each other: the configuration in force (address_of), fed from the
        # node after every step it takes (_follow_membership)
        self.addresses = MemberAddresses(cfg)
        self.on_members_removed: Callable[[GroupRuntime, dict[str, str]], None] | None = None
        self.store = open_store(cfg)
        try:
            self.host = StateMachineHost(cfg, state_machine)
            restored = self.host.restore()
        except BaseException:
            self.store.close()
            raise
        applier = None
        snap, producers = restored if restored is not None else (None, None)
        start = snap.last_index if snap is not None else -1
        if state_machine is not None:
            if start < self.store.begin_index - 1:
                log.error("%s/%s: the log begins at %d and no snapshot covers what came before: the state "
                          "machine cannot be rebuilt here (wipe this member's store to reinstall it)",
                          cfg.group, cfg.self_id, self.store.begin_index)
            applier = Applier(start, start)
        try:
            self.node = Node(cfg, self.store, now_ms(), applier=applier, snapshot=snap, producers=producers,
                             membership=membership)
            self.node.wall_offset_ms = int(time.time() * 1000) - now_ms()
        except BaseException:
            self.host.close()
            self.store.close()
            raise
        self._warn = RateLimitedLog(log).warning  # lines a peer's answers can trigger
        self._tokens = itertools.count()
        self._waiting: dict[int, Respond] = {}  # token -> how to answer that request
        self._local: dict[int, asyncio.Future[msgspec.Struct]] = {}  # token -> an in-process request's answer
        # token -> how to count an in-process request's answer (with metrics): kept when its caller
        # gives up, so a request that timed out is counted with the answer it gets in the end
        self._local_count: dict[int, Callable[[msgspec.Struct], None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._drain_scheduled = False
        self._ticker: asyncio.Task[None] | None = None
        self.store.add_flush_listener(self._on_flush_thread)
        self.metrics = metrics
        if metrics is not None:
            labels = (cfg.group, cfg.self_id)
            self._m_latency = metrics.append_latency.labels(*labels)
            self._m_batch = metrics.batch_size.labels(*labels)
            self._m_bytes = metrics.bytes_appended.labels(*labels)
            self._m_entries = metrics.entries_appended.labels(*labels)
            self._m_requests = _RequestCounts(metrics, cfg.group, cfg.self_id)
            self.store.fsync_observer = metrics.fsync_latency.labels(*labels).observe
            metrics.nodes.append(self.node)
        self._follow_membership()

    # --- the configuration in force --------------------------------------------------------

    def address_of(self, member_id: str) -> str | None:
        """Where members reach `member_id` under the configuration in force (None: not a member)."""
        return self.addresses.address_of(member_id)

    def member_ids(self) -> list[str]:
        """The members (voters and learners) of the configuration in force."""
        return self.addresses.ids()

    def _follow_membership(self) -> None:
        """Adopt the node's configuration if it changed (a CONFIG_CHANGE entry appended,
        truncated or installed with a snapshot): sends go to the new addresses, and the
        connections of members it removed are dropped (on_members_removed)."""
        m = node_membership(self.node)
        if m is self.addresses.membership or m == self.addresses.membership:  # (a copy the node made again)
            return
        before = {i: self.addresses.address_of(i) or "" for i in self.addresses.ids()}
        removed = self.addresses.update(m)
        log.info("%s/%s: configuration now %s", self.cfg.group, self.cfg.self_id, self.addresses.peers_string())
        if removed and self.on_members_removed is not None:
            self.on_members_removed(self, {i: before[i] for i in removed})

    async def start(self) -> None:
        self._ticker = self.loop.create_task(self._tick_forever())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for t in list(self._tasks):
            t.cancel()
        waiting, self._waiting = self._waiting, {}
        for respond in waiting.values():
            respond(Message(ResponseCode.NETWORK_ERROR, encode_error("member is stopping")))
        local, self._local = self._local, {}
        counts, self._local_count = self._local_count, {}
        stopping = SimpleResponse(int(ResponseCode.NETWORK_ERROR), message="member is stopping")
        for fut in local.values():
            if not fut.done():
                fut.set_result(stopping)
        for count in counts.values():
            count(stopping)
        await asyncio.to_thread(self.host.close)
        await asyncio.to_thread(self.store.close)

    # --- driving the node -----------------------------------------------------------------

    async def _tick_forever(self) -> None:
        while True:
            try:
                self.node.tick(now_ms())
                self._execute()
            except Exception:  # a bug must not silently kill the member's clock
                log.exception("%s/%s: tick failed", self.cfg.group, self.cfg.self_id)
            await asyncio.sleep(TICK_S)

    def _on_flush_thread(self, durable: int) -> None:
        self.loop.call_soon_threadsafe(self._on_durable, durable)

    def _on_durable(self, durable: int) -> None:
        self.node.complete(Durable(durable), now_ms())
        self._execute()

    def handle(self, code: int, req: msgspec.Struct, data: memoryview | bytes | bytearray, respond: Respond,
               member: bool | None = None, principal: str = "") -> None:
        """Give a request to the node at once (arrival order is processing order); its
        answer goes to `respond` when the node emits it (see _execute). `member`:
        is_member_message(code, req), when the caller knows it already (the server does);
        `principal`: who sent it (its certificate's or token's name; idempotent producers
        belong to it)."""
        if member is None:
            member = is_member_message(code, req)  # type: ignore[arg-type]
        if self.faults is not None and self.faults.drops_from(self.cfg.group, getattr(req, "leader_id", "")):
            if self.metrics is not None:  # the transport answers the raise: count it as answered
                self.count(code, member, ResponseCode.NETWORK_ERROR)
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "dropped by fault injection")
        token = next(self._tokens)
        if self.metrics is not None:
            respond = self._counted(code, member, respond)
            if code == RequestCode.APPEND:
                respond = self._observed(req, respond)
        self._waiting[token] = respond
        self.node.handle(code, req, data, token, now_ms(), principal=principal)  # type: ignore[arg-type]
        self._schedule_drain()

    def admits(self, code: int, req: Any) -> bool:
        """Whether the node takes member message `code` from its sender (Node.admits); one it
        refuses as an unknown leader makes it ask the members it knows about it."""
        ok = self.node.admits(code, req.leader_id, getattr(req, "term", -1), now_ms())
        if not ok:
            self._schedule_drain()
        return ok

    def _counted(self, code: int, member: bool, respond: Respond) -> Respond:
        """`respond`, also counting the request by its kind, its code and its answer's."""
        counts = self._m_requests

        def done(resp: Message) -> None:
            counts.inc(code, member, resp.code)
            respond(resp)

        return done

    def count(self, code: int, member: bool, answer: int) -> None:
        """Count a request of this group answered elsewhere (refused by the server before the
        node saw it, say); only with metrics. Keys are bounded: only decodable request codes
        reach a group."""
        self._m_requests.inc(code, member, answer)

    def _observed(self, req: msgspec.Struct, respond: Respond) -> Respond:
        """`respond`, also recording the latency, batch size and bytes of a successful append."""
        started = time.perf_counter()

        def done(resp: Message) -> None:
            if resp.code == ResponseCode.SUCCESS:
                self._observe_append(req.bodies, started)  # type: ignore[attr-defined]
            respond(resp)

        return done

    def _observe_append(self, bodies: list[bytes], started: float) -> None:
        self._m_latency.observe(time.perf_counter() - started)
        self._m_batch.observe(len(bodies))
        self._m_bytes.inc(sum(map(len, bodies)))
        self._m_entries.inc(len(bodies))

    # --- the in-process API: a service on this member uses its group without the wire ---------

    async def propose(self, body: bytes) -> bytes:
        """Append `body` as one entry and wait until this member applied it: the state
        machine's result for it. The node takes the request as a value (no encoding, no
        decoding; counted in the metrics as a client's APPEND). Raises GroupRefused (not the leader, say): the entry
        was not appended, or its fate is unknown (the member stops, leadership was lost)."""
        resp = await self._local_request(RequestCode.APPEND, AppendRequest(self.cfg.group, bodies=[body],
                                                                           want_results=True))
        if isinstance(resp, AppendResponse) and resp.code == ResponseCode.SUCCESS and len(resp.results) == 1:
            return resp.results[0]
        raise _refused(resp)

    async def query(self, request: bytes) -> bytes:
        """`StateMachine.query(request)`, linearizable (after a read index confirmed this
        member leads, as a client's QUERY). Raises GroupRefused."""
        resp = await self._local_request(RequestCode.QUERY, QueryRequest(self.cfg.group, request=request))
        if isinstance(resp, QueryResponse) and resp.code == ResponseCode.SUCCESS:
            return resp.result
        raise _refused(resp)

    def status(self) -> GroupStatus:
        """The group as this member sees it now (a frozen copy)."""
        node, cfg = self.node, self.cfg
        member, addresses = node.member, self.addresses
        leader = member.leader_id or ""
        applier = node.applier
        return GroupStatus(cfg.group, cfg.self_id, member.term, member.is_leader, leader,
                           (addresses.client_address(leader) or "") if leader else "",
                           member.is_leader and node.reads.lease_valid(), node.store.committed_index,
                           applier.applied_index if applier is not None else -1, node.store.end_index,
                           tuple((i, addresses.client_address(i) or "") for i in addresses.ids()))

    async def read_state(self, fn: Callable[[], T]) -> T:
        """fn() on the state machine's thread, between two applies (the state never changes
        under it): a local read of the applied state, not a linearizable one."""
        fut: asyncio.Future[T] = self.loop.create_future()

        def done(f: Future[T]) -> None:
            if fut.done():
                return
            if f.cancelled():
                fut.cancel()
            elif (err := f.exception()) is not None:
                fut.set_exception(err)
            else:
                fut.set_result(f.result())

        self.host.submit(fn, done=done)
        return await fut

    async def _local_request(self, code: int, req: Msg) -> msgspec.Struct:
        """Give the node a request from this process; its answer as the node made it."""
        token = next(self._tokens)
        fut: asyncio.Future[msgspec.Struct] = self.loop.create_future()
        self._local[token] = fut
        if self.metrics is not None:  # counted as a client's (docs/metrics.md: the service is the group's client)
            self._local_count[token] = functools.partial(self._count_local, code, req, time.perf_counter())
        try:
            self.node.handle(code, req, b"", token, now_ms())
            self._schedule_drain()
            return await fut
        finally:
            self._local.pop(token, None)  # answered, or the caller gave up waiting (still counted when answered)

    def _count_local(self, code: int, req: Msg, started: float, resp: msgspec.Struct) -> None:
        answer = int(getattr(resp, "code", ResponseCode.SUCCESS))
        self.count(code, False, answer)
        if answer == ResponseCode.SUCCESS and isinstance(req, AppendRequest):
            self._observe_append(req.bodies, started)

    def _schedule_drain(self) -> None:
        """Run the node's actions once per loop iteration: concurrent requests then
        share pushes to followers (batching)."""
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self.loop.call_soon(self._execute)

    def _execute(self) -> None:
        self._drain_scheduled = False
        actions = self.node.drain()
        self._follow_membership()  # before the sends: a new learner's address is known to them
        for action in actions:
            if isinstance(action, Reply):
                self._reply(action.token, action.msg, action.data)
            elif isinstance(action, Send):
                self._spawn(self._send(action))
            elif isinstance(action, Apply):
                self.host.submit(self._apply, action.batch, done=self._applied)
            elif isinstance(action, RunQuery):
                self.host.submit(self._query, action, done=functools.partial(self._answer_query, action))
            elif isinstance(action, TakeSnapshot):
                self._take_snapshot(action)
            elif isinstance(action, ReadChunk):
                self.host.submit_read(self.host.read_chunk, action.meta, action.offset, action.max_bytes,
                                      done=functools.partial(self._chunk_read, action))
            elif isinstance(action, DropInstall):
                self.host.submit(self.host.drop_install, done=lambda _: None)
            elif isinstance(action, InstallChunk):
                self.host.submit(self.host.install_chunk, action.meta, action.offset, action.data, action.crc,
                                 done=functools.partial(self._chunk_installed, action))
            else:
                self.host.submit(self.host.restore_installed, action.meta,
                                 done=functools.partial(self._restored, action))

    # --- the state machine (on the worker thread, one action at a time, in order) --------------

    def _apply(self, batch: ApplyBatch) -> list[bytes]:
        assert self.host.sm is not None
        return list(self.host.sm.apply(batch.entries))

    def _applied(self, fut: Future[list[bytes]]) -> None:
        try:
            results = fut.result()
        except CancelledError:
            return  # stopping
        except Exception as e:
            log.exception("%s/%s: the state machine raised", self.cfg.group, self.cfg.self_id)
            self.node.complete(ApplyFailed(f"{type(e).__name__}: {e}"), now_ms())
        else:
            try:
                self.node.complete(Applied(results), now_ms())
            except ValueError as e:  # not one result per entry: a broken state machine
                self.node.complete(ApplyFailed(str(e)), now_ms())
        self._execute()

    def _query(self, q: RunQuery) -> bytes:
        assert self.host.sm is not None
        return self.host.sm.query(q.request)

    def _reply(self, token: int, msg: msgspec.Struct, data: bytes = b"") -> None:
        """Answer request `token`: an in-process one with the value itself, else encoded."""
        count = self._local_count.pop(token, None)
        if count is not None:
            count(msg)
        fut = self._local.pop(token, None)
        if fut is not None or count is not None:
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        respond = self._waiting.pop(token, None)
        if respond is not None:
            code = getattr(msg, "code", ResponseCode.SUCCESS)
            respond(Message(int(code), encode(msg), data))

    def _answer_query(self, q: RunQuery, fut: Future[bytes]) -> None:
        if fut.cancelled():  # stopping: nobody is answered
            self._waiting.pop(q.token, None)
            self._local.pop(q.token, None)
            self._local_count.pop(q.token, None)
            return
        leader = self.node.member.leader_id or ""
        try:
            msg = QueryResponse(200, leader, fut.result(), q.applied_index)
        except (ValueError, msgspec.MsgspecError) as e:  # the request, not the member, is bad
            msg = QueryResponse(int(ResponseCode.UNEXPECTED_ARGUMENT), leader, message=f"bad query: {e}")
        except NotImplementedError as e:
            msg = QueryResponse(int(ResponseCode.UNSUPPORTED), leader, message=str(e))
        except Exception as e:
            log.exception("%s/%s: a query raised", self.cfg.group, self.cfg.self_id)
            msg = QueryResponse(int(ResponseCode.INTERNAL_ERROR), leader, message=f"{type(e).__name__}: {e}")
        self._reply(q.token, msg)

    def _take_snapshot(self, s: TakeSnapshot) -> None:
        def done(fut: Future[SnapshotMeta]) -> None:
            if fut.cancelled():
                return
            err = fut.exception()
            self.node.complete(SnapshotTaken(s.index, self._failure(err, "snapshot"),
                                             fut.result() if err is None else None), now_ms())
            self._execute()

        # the configuration as of the snapshot's index, as the node names it (a member restarting
        # from this snapshot, or a follower installing it, recovers it); the command line's peers
        # only if the node names none (a group that never changed)
        members: str | Membership = s.members if s.members is not None else self.cfg.peers
        self.host.submit(self.host.take_snapshot, s.index, s.term, s.chain_crc, s.next_pos, members, s.keep,
                         s.producers, s.config_index, done=done)

    def _failure(self, err: BaseException | None, what: str) -> str:
        """"" for no error; else what to tell the node (a traceback in the log unless the disk
        or the snapshot itself failed)."""
        if err is None:
            return ""
        if not isinstance(err, OSError | SnapshotError):
            log.error("%s/%s: %s failed", self.cfg.group, self.cfg.self_id, what, exc_info=err)
        return f"{type(err).__name__}: {err}"

    def _chunk_read(self, a: ReadChunk, fut: Future[tuple[bytes, int]]) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        data, crc = fut.result() if err is None else (b"", 0)
        failure = self._failure(err, "reading a snapshot chunk")
        self.node.complete(ChunkRead(a.peer, a.ctx, data, crc, failure), now_ms())
        self._execute()

    def _chunk_installed(self, a: InstallChunk, fut: Future[tuple[int, bool]]) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        nxt, done = fut.result() if err is None else (0, False)
        failure = self._failure(err, "installing a snapshot chunk")
        self.node.complete(ChunkInstalled(a.token, a.meta, nxt, done, failure), now_ms())
        self._execute()

    def _restored(self, a: RestoreSnapshot, fut: Future[bytes | None]) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        self.node.complete(Restored(a.meta, self._failure(err, "restoring a snapshot"),
                                    fut.result() if err is None else None), now_ms())
        self._execute()

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, a: Send) -> None:
        resp: msgspec.Struct | None = None
        faults = self.faults
        if faults is None or not faults.drops_to(
                self.cfg.group, a.peer, isinstance(a.msg, LeadershipTransferRequest) and bool(a.msg.transfer_id)):
            address = self.addresses.send_address(a.peer)
            try:
                if address is None:  # no longer (or not yet) in the configuration in force
                    raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{a.peer} is not a member")
                raw = await self.client.request(address, Message(a.code, encode(a.msg), a.data),
                                                a.timeout_ms / 1000)
                if raw.code != ResponseCode.NETWORK_ERROR:
                    resp = decode_response(a.code, raw.meta)
                    if isinstance(resp, VoteResponse) and resp.code != ResponseCode.SUCCESS:
                        # an error answer (docs/format.md): its term counts, its result is no vote
                        resp = msgspec.structs.replace(resp, result=int(VoteResult.UNKNOWN))
            except DLedgerError:
                resp = None
            except DECODE_ERRORS:
                self._warn("undecodable", "%s: undecodable answer from %s to %d", self.cfg.self_id, a.peer, a.code)
        self.node.complete(Answered(a.ctx, resp), now_ms())
        self._execute()

    def set_faults(self, blocked: list[str], spare_handover: bool = False) -> None:
        """Test hook: drop all traffic to and from these member ids (both directions
        need the hook on both sides, which the fault tools do). `spare_handover`: this
        member alone drops the traffic, at its own door, and still sends its hand-over of a
        leadership transfer: the transfer is cut off mid-way (the target takes over, this
        member never hears of it)."""
        if self.faults is None:
            raise DLedgerError(ResponseCode.UNSUPPORTED, FAULT_DISABLED)
        self.faults.set_member(self.cfg.group, blocked, spare_handover,
                               [a for b in blocked if (a := self.addresses.send_address(b)) is not None])
        log.warning("%s/%s: fault injection blocks %s%s", self.cfg.group, self.cfg.self_id, sorted(blocked),
                    " (but its hand-overs)" if spare_handover else "")


class DLedgerServer:
    """Serves one or more groups on the address this member has in `peers`."""

    def __init__(self, configs: DLedgerConfig | list[DLedgerConfig],
                 state_machines: dict[str, StateMachine] | None = None,
                 joined: Mapping[str, Membership] | None = None) -> None:
        """`state_machines`: group -> the state machine it applies (else the config's
        `state_machine`; none: a plain log); `joined`: group -> the configuration a member
        joining that group read from it (`dledger server --join`)."""
        self.configs = [configs] if isinstance(configs, DLedgerConfig) else list(configs)
        self.state_machines = dict(state_machines or {})
        self.joined = dict(joined or {})
        if not self.configs:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "no group to serve")
        addresses = {(c.peer_map[c.self_id].address, c.member_map[c.self_id].address) for c in self.configs}
        if len(addresses) != 1:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"groups listen on different addresses: {addresses}")
        self.address, self.member_address = addresses.pop()
        security = {(c.tls_cert, c.tls_key, c.tls_ca, c.auth_token, c.client_token, c.admin_token, c.insecure)
                    for c in self.configs}
        if len(security) != 1:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "groups served together need the same TLS, tokens "
                               "and insecure setting")
        self.groups: dict[str, GroupRuntime] = {}
        # built only for a process started with --enable-fault-injection: otherwise nothing on
        # the request path consults one (FAULT requests are refused)
        self.faults = FaultInjector() if any(c.enable_fault_injection for c in self.configs) else None
        self.client: TransportClient | None = None
        self.server: TransportServer | None = None
        self._warn = RateLimitedLog(log).warning
        port = next((c.metrics_port for c in self.configs if c.metrics_port), 0)
        self.metrics = Metrics() if port else None
        self.metrics_port = port
        # requests no hosted group takes: under group "?" and, as member label, this process's
        # member id, or its ids (one per group) joined with "," when they differ
        ids = ",".join(sorted({c.self_id for c in self.configs}))
        self._m_other = _RequestCounts(self.metrics, OTHER_GROUP, ids) if self.metrics is not None else None
        # request codes another service answers on this port (the controller's, say)
        self.services: dict[int, DirectHandler] = {}
        # every request code served here and the roles that may send it (runtime.access): the
        # transport checks it before any handler; services add theirs with register_service
        self.access: dict[int, Access] = dict(RAFT_ACCESS)
        self.sealed_groups: set[str] = set()  # groups whose log only this process writes: no client appends
        self.connection_lost: list[Callable[[Caller], None]] = []  # each told of every closed connection
        self.loop_stall: LoopStallMonitor | None = None  # with metrics: the loop's lateness, sampled

    def register_service(self, handlers: Mapping[int, DirectHandler], access: Mapping[int, Access]) -> None:
        """Serve more request codes on this port (before start): each with the roles it needs."""
        if set(handlers) != set(access):
            raise ValueError(f"codes without an access entry: {sorted(set(handlers) ^ set(access))}")
        if self.server is not None:
            raise RuntimeError("services are registered before the server starts")
        self.services.update(handlers)
        self.access.update(access)

    def mount(self, group: str, service: ServiceMount) -> None:
        """Serve `service` beside `group` (before start): its request codes on this port, its
        connection-lost listeners, and, if sealed, no client data plane for the group
        (SEALED_CODES: the service writes and queries it in-process)."""
        if group not in {c.group for c in self.configs}:
            raise ValueError(f"no group {group!r} here to mount a service on")
        taken = set(service.handlers) & (set(self.services) | set(RAFT_ACCESS))
        if taken:
            raise ValueError(f"request codes {sorted(taken)} already served here")
        self.register_service(service.handlers, service.access)
        self.connection_lost.extend(service.connection_lost)
        if service.sealed:
            self.sealed_groups.add(group)

    def _connection_closed(self, caller: Caller) -> None:
        """The transport's one slot, told to every listener (one failing does not stop the others)."""
        for listener in self.connection_lost:
            try:
                listener(caller)
            except Exception:
                log.exception("a connection-lost listener failed")

    async def start(self) -> None:
        """Open every group and listen. If a step fails (a store directory another process
        holds, a port in use), what was opened is closed again: no store stays locked."""
        try:
            await self._start()
        except BaseException:
            try:
                await self.stop()
            except Exception as e:  # the first failure is the one to report
                log.warning("cleanup after a failed start failed: %s", e)
            self.groups.clear()
            raise

    async def _start(self) -> None:
        cfg0 = self.configs[0]
        max_frame = max(c.max_frame_bytes for c in self.configs)
        tls = TlsConfig.from_config(cfg0)
        if tls is not None:
            for c in self.configs:
                check_member_cert(tls, c.self_id)
        token = cfg0.auth_token.encode() if tls is None and cfg0.auth_token else None
        # address -> member id of every hosted group's configuration in force, read at each
        # connect: a learner added later is checked as the member its address belongs to
        names = _LiveMemberAddresses(self.groups)
        # a member that comes back is reached within half a second (a 2 s backoff delayed every
        # restarted follower's catch-up and snapshot install by up to that much)
        self.client = TransportClient(max_frame_bytes=max_frame, faults=self.faults,
                                      ssl=client_context(tls) if tls else None, server_check=expect_members(names),
                                      auth_token=token, backoff_max_s=MEMBER_BACKOFF_MAX_S)
        for cfg in self.configs:
            if cfg.group in self.groups:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"group {cfg.group} configured twice")
            sm = self.state_machines[cfg.group] if cfg.group in self.state_machines \
                else load_state_machine(cfg.state_machine)
            g = self.groups[cfg.group] = GroupRuntime(cfg, self.client,
                                                      self.faults if cfg.enable_fault_injection else None,
                                                      self.metrics, sm, self.joined.get(cfg.group))
            g.on_members_removed = self._members_removed
        for g in self.groups.values():
            await g.start()
        limits = Limits(max_connections=connection_cap(cfg0.max_connections),
                        idle_timeout_s=cfg0.idle_timeout_ms / 1000, frame_timeout_s=cfg0.frame_timeout_ms / 1000,
                        frame_memory_bytes=cfg0.frame_memory_bytes, answer_memory_bytes=cfg0.answer_memory_bytes)
        tokens = Tokens.of(cfg0.auth_token, cfg0.client_token, cfg0.admin_token) if tls is None else Tokens()
        self.server = TransportServer(direct=self._handle, max_frame_bytes=max_frame,
                                      ssl=server_context(tls) if tls else None, tokens=tokens, limits=limits,
                                      policy=self.access, loopback_only=cfg0.security_mode == "loopback")
        if self.connection_lost:
            self.server.on_connection_lost = self._connection_closed
        if self.metrics is not None:
            self.server.on_refused = self._count_other
        split = self.member_address != self.address
        await self._listen(self.address, LISTENER_CLIENT if split else LISTENER_BOTH)
        if split:
            await self._listen(self.member_address, LISTENER_MEMBER)
        if self.metrics is not None:
            self._watch_loop(self.metrics)
            self.metrics.serve(self.metrics_port, cfg0.metrics_host)
        log.info("serving groups %s on %s%s", sorted(self.groups), self.address,
                 f" (members on {self.member_address})" if split else "")
        _log_security(cfg0)

    def _watch_loop(self, metrics: Metrics) -> None:
        """Sample the loop's lateness into every hosted group's series (they share the loop)."""
        labels = [(c.group, c.self_id) for c in self.configs]
        hists = [metrics.loop_stall.labels(*v) for v in labels]
        maxes = [metrics.loop_stall_max.labels(*v) for v in labels]
        for g in maxes:
            g.set(0.0)

        def observe(lateness: float) -> None:
            for h in hists:
                h.observe(lateness)
            if self.loop_stall is not None and lateness >= self.loop_stall.worst:
                for g in maxes:
                    g.set(lateness)

        self.loop_stall = LoopStallMonitor(observe)
        self.loop_stall.start()

    async def _listen(self, address: str, listener: str) -> None:
        assert self.server is not None
        host, port = parse_address(address)
        await self.server.start(host, port, listener)

    async def stop(self) -> None:
        if self.loop_stall is not None:
            self.loop_stall.stop()
        if self.server is not None:
            await self.server.close()
        for g in self.groups.values():
            await g.stop()
        if self.client is not None:
            await self.client.close()

    def _members_removed(self, g: GroupRuntime, removed: dict[str, str]) -> None:
        """Members left `g`'s configuration: drop this process's connections to them, and
        theirs to it (with TLS: connections under a certificate naming only removed members
        of every hosted group). Nothing they send is taken any more (_refusal)."""
        log.warning("%s/%s: members %s left the configuration: dropping their connections", g.cfg.group,
                    g.cfg.self_id, sorted(removed))
        still = {i for h in self.groups.values() for i in h.member_ids()}
        if self.client is not None:
            for member_id, address in removed.items():
                if address and member_id not in still:
                    self.client.drop(address, f"{member_id} was removed from group {g.cfg.group}")
        gone = set(removed) - still
        if self.server is not None and gone:
            self.server.close_where(lambda c: c.principal.bound and bool(c.principal.names & gone)
                                    and not (c.principal.names & still),
                                    f"member {sorted(gone)} was removed from group {g.cfg.group}")

    def node(self, group: str = "default") -> Node:
        return self.groups[group].node

    def _handle(self, msg: Message, respond: Respond, caller: Caller) -> None:
        service = self.services.get(msg.code)
        if service is not None:
            service(msg, respond, caller)
            return
        code = msg.code
        try:
            req = decode_request(code, msg.meta)
        except KeyError:
            self._answer(respond, _error(ResponseCode.UNSUPPORTED, f"unknown request code {code}"), code, False)
            return
        except DECODE_ERRORS as e:
            self._answer(respond, _error(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed request {code}: {e}"),
                         code, is_member_code(code), self.groups.get(_group_of(msg.meta)))
            return
        member = is_member_message(code, req)
        g = self.groups.get(req.group)
        if g is None:
            self._answer(respond, _error(ResponseCode.UNKNOWN_GROUP, f"no group {req.group!r} here"), code, member)
            return
        refusal = _refusal(g, code, req, caller, member)
        if refusal is None and (problem := content_refusal(code, req, caller.principal)) is not None:
            refusal = _error(ResponseCode.UNAUTHENTICATED, problem)
        if refusal is not None:
            self._answer(respond, refusal, code, member, g)
        elif code in SEALED_CODES and req.group in self.sealed_groups:
            self._answer(respond, _error(ResponseCode.UNSUPPORTED, f"group {req.group!r} is a service's own log "
                                         f"(the controller's, say): it is written and read by its members only; "
                                         f"{_REQUEST_NAMES[code]} is not served (use the service's requests; "
                                         "METADATA still says who leads)"), code, member, g)
        elif code == RequestCode.FAULT:
            # any client can send FAULT: obeying it lets anyone partition the group, so
            # only a member started for tests or chaos runs does
            assert isinstance(req, FaultRequest)
            if g.faults is None:
                self._warn("fault", "%s/%s: refused a FAULT request (fault injection is disabled)",
                           g.cfg.group, g.cfg.self_id)
                self._answer(respond, _error(ResponseCode.UNSUPPORTED, FAULT_DISABLED), code, member, g)
                return
            g.set_faults(req.blocked, req.spare_handover)
            self._answer(respond, Message(200, encode(SimpleResponse(200))), code, member, g)
        else:
            g.handle(code, req, msg.data, respond, member, caller.principal.name)

    def _answer(self, respond: Respond, answer: Message, code: int, member: bool,
                g: GroupRuntime | None = None) -> None:
        """Answer a request the server itself answers (a refusal before any group, or FAULT),
        counted like the groups' answers: under its group `g`, else under group "?"."""
        if self.metrics is not None:
            if g is not None:
                g.count(code, member, answer.code)
            else:
                self._count_other(code, answer.code, member)
        respond(answer)

    def _count_other(self, code: int, answer: int, member: bool | None = None) -> None:
        """Count a request no hosted group takes (also the transport's own refusals: its
        on_refused). Unknown request codes share one series and the group is always "?", so
        junk cannot make series without bound. `member` None: known from the code alone."""
        assert self._m_other is not None
        if member is None:
            member = is_member_code(code)
        self._m_other.inc(code if code in _REQUEST_NAMES else -1, member, answer)


# how `dledger server` says at start how it authenticates (DLedgerConfig.security_mode)
SECURITY_SHOWN = {"tls": "TLS", "token": "token", "loopback": "no TLS: loopback connections only",
                  "insecure": "INSECURE: no TLS, every host served"}


def _log_security(cfg: DLedgerConfig) -> None:
    """Say at start how this member authenticates, and what that leaves open."""
    mode = cfg.security_mode
    if mode == "insecure":
        log.warning("%s: INSECURE (--insecure): no TLS and no token, and every host may connect: anyone who can "
                    "reach this port may append, read, steer the group and forge member messages "
                    "(docs/security.md)", cfg.self_id)
    elif mode == "loopback":
        log.warning("%s: no TLS and no token: accepting connections from loopback addresses only "
                    "(TLS, a token or --insecure to serve other hosts; docs/security.md)", cfg.self_id)
    elif mode == "token":
        log.warning("%s: no TLS: tokens authenticate, but traffic is clear text and a cluster-token holder "
                    "may forge member messages; see docs/security.md to deploy with --tls-cert/--tls-key/--tls-ca",
                    cfg.self_id)


_MEMBER_LISTENER_READS = frozenset((RequestCode.METADATA, RequestCode.MEMBERS))


def _refusal(g: GroupRuntime, code: int, req: Any, caller: Caller, member_msg: bool) -> Message | None:
    """Who may send what (docs/security.md): member messages only on the member listener
    (when there is one) and, with TLS, only under a certificate naming the sender, a member
    the node takes messages from (GroupRuntime.admits: a member whose removal committed is
    refused, a new learner taken); the member listener takes nothing from clients but
    METADATA and MEMBERS. `member_msg`: is_member_message(code, req)."""
    cfg = g.cfg
    if member_msg and caller.listener == LISTENER_CLIENT:
        return _error(ResponseCode.UNEXPECTED_MEMBER, "member messages go to the member listener (peer_listen)")
    if not member_msg and caller.listener == LISTENER_MEMBER and code not in _MEMBER_LISTENER_READS:
        return _error(ResponseCode.UNSUPPORTED, "this is the member listener: send client requests elsewhere")
    principal = caller.principal
    # the certificate names the sender, and the sender is a member the node takes messages from
    # (GroupRuntime.admits: a configuration it holds, or a leader a member it knows vouched for)
    sender = req.leader_id
    if member_msg and principal.bound and not (sender in principal.names and g.admits(code, req)):
        return _error(ResponseCode.UNAUTHENTICATED,
                      f"a certificate naming {sorted(principal.names)} cannot speak for member {req.leader_id!r}")
    if member_msg and principal.bound:
        caller.trusted = True  # a verified member's connection: the connection cap never evicts it
    if isinstance(req, ReadRequest):  # its answer, not its request, is the work; and it must fit the answer budget
        req.max_bytes = caller.answer_room(min(req.max_bytes, cfg.max_read_bytes))
        caller.charge(req.max_bytes >> 13)
    elif isinstance(req, AppendRequest):
        caller.charge(len(req.bodies) >> 6)
    return None


def _refused(resp: msgspec.Struct) -> GroupRefused:
    """An in-process request's failed answer as the exception its caller gets."""
    code = int(getattr(resp, "code", ResponseCode.INTERNAL_ERROR))
    if code == ResponseCode.SUCCESS:  # a proposal answered without its one result: not applied here
        return GroupRefused(int(ResponseCode.INTERNAL_ERROR), "the entry's result is missing")
    return GroupRefused(code, getattr(resp, "message", ""), getattr(resp, "leader_id", ""))


def _error(code: ResponseCode, text: str) -> Message:
    return Message(int(code), encode(SimpleResponse(int(code), message=text)))


async def serve_forever(configs: DLedgerConfig | list[DLedgerConfig], stop: asyncio.Event,
                        joined: Mapping[str, Membership] | None = None) -> None:
    """Run a server until `stop` is set (the CLI sets it on SIGINT/SIGTERM); `joined`: see
    DLedgerServer."""
    server = DLedgerServer(configs, joined=joined)
    await server.start()
    for cfg in configs if isinstance(configs, list) else [configs]:
        me = cfg.peer_map[cfg.self_id]
        where = me.address + (" (clients; members on the peer listener)" if cfg.peer_listen else "")
        extras = [f"metrics on :{cfg.metrics_port}" if cfg.metrics_port else "", SECURITY_SHOWN[cfg.security_mode],
                  f"flush={cfg.flush}"]
        # a memory store writes nothing under store_dir: naming that directory would mislead
        store = "store in memory" if cfg.store_type == "memory" else f"store {cfg.store_dir}"
        print(f"dledger {cfg.group}/{cfg.self_id}: listening on {where}, {store}, "
              + ", ".join(e for e in extras if e), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


class _LiveMemberAddresses(Mapping[str, str]):
    """address -> member id over the hosted groups' configurations in force, computed at each
    look-up (a TLS handshake's check of the member an address belongs to)."""

    def __init__(self, groups: Mapping[str, GroupRuntime]) -> None:
        self._groups = groups

    def _now(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for g in self._groups.values():
            out.update(g.addresses.member_addresses())
        return out

    def __getitem__(self, address: str) -> str:
        return self._now()[address]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


class _Named(msgspec.Struct, array_like=True):
    """What every request begins with (core.messages.Msg): its group."""

    group: str = ""


_named = msgspec.msgpack.Decoder(_Named)


def _group_of(meta: bytes) -> str:
    """The group a malformed request names, if that much of it decodes ("" if not)."""
    try:
        return _named.decode(meta).group
    except DECODE_ERRORS:
        return ""


# The request label of dledger_requests_total: the code's name in RequestCode (DLedger's,
# dledger's own, the controller's); any other code is UNKNOWN_REQUEST.
_REQUEST_NAMES: dict[int, str] = {int(c): c.name for c in RequestCode}


class _RequestCounts:
    """dledger_requests_total under one group and member label: a child per (request code,
    member message?, answer code), made once (labels() is slow; this runs for every request).
    Answer codes are this process's own, so naming unknown ones stays bounded."""

    def __init__(self, metrics: Metrics, group: str, member_id: str) -> None:
        self._metrics = metrics
        self._labels = (group, member_id)
        self._children: dict[tuple[int, bool, int], Counter] = {}

    def inc(self, code: int, member: bool, answer: int) -> None:
        child = self._children.get((code, member, answer))
        if child is None:
            child = self._children[(code, member, answer)] = self._child(code, member, answer)
        child.inc()

    def _child(self, code: int, member: bool, answer: int) -> Counter:
        try:
            answer_name = ResponseCode(answer).name
        except ValueError:
            answer_name = str(answer)
        return self._metrics.requests.labels(*self._labels, KIND_MEMBER if member else KIND_CLIENT,
                                             _REQUEST_NAMES.get(code, UNKNOWN_REQUEST), answer_name)


__all__ = ["DLedgerServer", "GroupRuntime", "RequestCode", "serve_forever"]
