"""The controller's request pipeline on a member of its Raft group (upstream's ControllerManager
and ControllerRequestProcessor).

Controller requests arrive on the group's own port (DLedgerServer.services). Every member
answers heartbeats, metadata and its config; only the leader ("active controller") serves
the rest — a follower answers CONTROLLER_NOT_LEADER naming the leader. A write is logged as
a `Command` carrying the leader's liveness facts and validated when it is applied (so two
requests are never validated against the same state); the requester gets the answer apply
made once the entry is applied here. A read is a linearizable query of the applied state.

The leader scans every `scan_interval_ms` for broker sets whose master died while a replica
lives (#5009/#6382) and elects for them, but not before it has led for one heartbeat
timeout (#5712: a new leader that has not heard every broker yet would see them all dead),
so a controller failover never causes a broker failover. Elections are pushed to the
replicas (NOTIFY_BROKER_ROLE_CHANGED, which a broker takes as a hint to ask for replica
info); brokers also poll replica info.

Beyond the roles the transport checks (CONTROLLER_ACCESS), docs/brokers.md "Confirmed,
bound, waited for": a heartbeat for an id bound to another certificate is refused here (and
register, alter and a broker's election in apply, where the sender's certificate name
travels in the Command); an alter is taken only over the connection the master's heartbeats
arrive on; no election is logged while a lease the leader granted may still hold a master
it could replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from dledger.clock import now_ms
from dledger.codes import ControllerRequestCode, RequestCode, ResponseCode
from dledger.codes import ControllerResponseCode as RC
from dledger.config import ConfigError
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.elect_policy import LiveInfo
from dledger.controller.heartbeats import HeartbeatTable
from dledger.controller.liveness import Liveness
from dledger.controller.machine import ControllerStateMachine
from dledger.core.messages import QUERY, AppendRequest, QueryRequest, decode_response
from dledger.runtime.server import DLedgerServer, GroupRuntime
from dledger.runtime.transport import LISTENER_MEMBER, Caller, Message, Respond
from dledger.security.roles import ALL_ROLES, Access, Principal, Role, needs, refusal_text
from dledger.security.tls import TlsConfig, check_member_cert

log = logging.getLogger(__name__)

T = TypeVar("T")
NOTIFY_TIMEOUT_S = 3.0
MAX_SERVING = 4096  # leader-only requests in flight (upstream's event queue holds 1024)
NOTIFY_CODE = int(ControllerRequestCode.NOTIFY_BROKER_ROLE_CHANGED)
_C = ControllerRequestCode
# The roles each controller request needs (docs/security.md, "Roles"); checked by the transport
# before handle() runs. ELECT_MASTER is a broker's for its own set, else an admin's (handle
# narrows it once decoded).
CONTROLLER_ACCESS: dict[int, Access] = {
    _C.BROKER_HEARTBEAT: needs("BROKER_HEARTBEAT", Role.BROKER),
    _C.CONTROLLER_ALTER_SYNC_STATE_SET: needs("CONTROLLER_ALTER_SYNC_STATE_SET", Role.BROKER),
    _C.CONTROLLER_ELECT_MASTER: needs("CONTROLLER_ELECT_MASTER", Role.BROKER, Role.ADMIN),
    _C.CONTROLLER_REGISTER_BROKER: needs("CONTROLLER_REGISTER_BROKER", Role.BROKER),
    _C.CONTROLLER_GET_REPLICA_INFO: needs("CONTROLLER_GET_REPLICA_INFO", Role.BROKER, Role.CLIENT),
    _C.CONTROLLER_GET_METADATA_INFO: Access("CONTROLLER_GET_METADATA_INFO", ALL_ROLES),
    _C.CONTROLLER_GET_SYNC_STATE_DATA: needs("CONTROLLER_GET_SYNC_STATE_DATA", Role.BROKER, Role.CLIENT),
    _C.NOTIFY_BROKER_ROLE_CHANGED: needs("NOTIFY_BROKER_ROLE_CHANGED", Role.CONTROLLER),
    _C.UPDATE_CONTROLLER_CONFIG: needs("UPDATE_CONTROLLER_CONFIG", Role.ADMIN),
    _C.GET_CONTROLLER_CONFIG: needs("GET_CONTROLLER_CONFIG", Role.ADMIN),
    _C.CLEAN_BROKER_DATA: needs("CLEAN_BROKER_DATA", Role.ADMIN),
    _C.CONTROLLER_GET_NEXT_BROKER_ID: needs("CONTROLLER_GET_NEXT_BROKER_ID", Role.BROKER),
    _C.CONTROLLER_APPLY_BROKER_ID: needs("CONTROLLER_APPLY_BROKER_ID", Role.BROKER),
}


class _Failed(Exception):
    """A request the controller could not carry through (answered with `response`)."""

    def __init__(self, response: m.Response) -> None:
        super().__init__(response.remark)
        self.response = response


def role_refusal(req: m.AnyRequest, principal: Principal) -> str | None:
    """What the code's roles (CONTROLLER_ACCESS) did not settle: an election a broker did not
    ask for itself is an admin's; a replica's certificate speaks for its own broker set only."""
    if isinstance(req, m.ElectMaster) and (req.designate_elect or req.broker_id == m.NO_ID):
        if not principal.has(Role.ADMIN):
            return refusal_text("CONTROLLER_ELECT_MASTER (an admin's or the controller's election)", (Role.ADMIN,),
                                principal)
        return None
    name = getattr(req, "broker_name", None)
    if (principal.bound and principal.has(Role.BROKER) and not principal.has(Role.ADMIN)
            and isinstance(req, m.BrokerRequest) and name != principal.broker_set):
        return f"{principal.describe()} may not speak for broker set {name!r}"
    return None


def _reply(resp: m.Response) -> Message:
    return Message(resp.code, m.encode(resp))


class ControllerService:
    """Attach before `server.start()` (it registers its request codes), start after."""

    def __init__(self, server: DLedgerServer, group: str, config: ControllerConfig,
                 machine: ControllerStateMachine) -> None:
        self.server = server
        self.group = group
        self.config = config
        self.machine = machine
        for cfg in server.configs:  # brokers take NOTIFYs from a controller's certificate only
            tls = TlsConfig.from_config(cfg)
            if tls is not None and cfg.group == group:
                check_member_cert(tls, cfg.self_id, Role.CONTROLLER)
        self.liveness = Liveness(config)
        server.register_service({code: self.handle for code in m.CODES}, dict(CONTROLLER_ACCESS))
        server.sealed_groups.add(group)
        server.on_connection_lost = self._connection_lost
        self._leader_term = -1
        self._electing: set[str] = set()
        self._notifying: dict[str, tuple[int, asyncio.Task[None]]] = {}  # address -> (master epoch, task)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._scanner: asyncio.Task[None] | None = None
        self.elections = 0  # controller-triggered elections won (tests, status)
        self._serving = 0  # leader-only requests in flight

    @property
    def runtime(self) -> GroupRuntime:
        return self.server.groups[self.group]

    async def start(self) -> None:
        self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())

    async def stop(self) -> None:
        tasks = [t for t in (self._scanner, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # --- requests --------------------------------------------------------------------------

    def handle(self, msg: Message, respond: Respond, caller: Caller) -> None:
        try:
            req = m.decode_request(msg.code, msg.meta)
        except m.DECODE_ERRORS as e:
            respond(_reply(m.Response(int(RC.CONTROLLER_INVALID_REQUEST), f"malformed request {msg.code}: {e}")))
            return
        if caller.listener == LISTENER_MEMBER:
            respond(_reply(m.Response(int(RC.REQUEST_CODE_NOT_SUPPORTED),
                                      "this is the member listener: send controller requests to the client one")))
            return
        refusal = role_refusal(req, caller.principal)
        if refusal is not None:
            respond(_reply(m.Response(int(ResponseCode.UNAUTHENTICATED), refusal)))
            return
        principal = caller.principal.name if caller.principal.bound else ""
        if isinstance(req, m.BrokerHeartbeat):
            respond(_reply(self._heartbeat(req, caller)))
        elif isinstance(req, m.GetMetadataInfo):
            respond(_reply(m.Response(metadata=self.metadata())))
        elif isinstance(req, m.GetControllerConfig):
            respond(_reply(m.Response(properties=self.config.properties())))
        elif isinstance(req, m.UpdateControllerConfig):
            respond(_reply(self._update_config(req.properties)))
        elif isinstance(req, m.NotifyBrokerRoleChanged):
            respond(_reply(m.Response(int(RC.REQUEST_CODE_NOT_SUPPORTED), "brokers, not controllers, take this")))
        elif not self.runtime.node.member.is_leader:
            respond(_reply(self._not_leader()))
        elif self._serving >= MAX_SERVING:
            respond(_reply(m.Response(int(RC.SYSTEM_ERROR), f"the controller is busy ({MAX_SERVING} requests "
                                      "in flight): retry")))
        elif isinstance(req, m.AlterSyncStateSet) and (problem := self._alter_refusal(req, caller)) is not None:
            respond(_reply(m.Response(int(ResponseCode.UNAUTHENTICATED), problem)))
        else:
            self._serving += 1
            self._spawn(self._serve(req, respond, principal))

    @property
    def table(self) -> HeartbeatTable:
        return self.liveness.table

    def _heartbeat(self, req: m.BrokerHeartbeat, caller: Caller) -> m.Response:
        p = caller.principal
        bound = self.machine.principal_of(req.broker_name, req.broker_id) if req.broker_id is not None else ""
        if p.bound and bound and p.name != bound:  # a replica beats for its own id only
            return m.Response(int(ResponseCode.UNAUTHENTICATED), f"certificate CN={p.name} may not beat for broker "
                              f"{req.broker_id} of {req.broker_name}: it is bound to CN={bound}")
        node = self.runtime.node
        return self.liveness.heartbeat(req, now_ms(), caller, node.member.is_leader and node.reads.lease_valid())

    def _alter_refusal(self, req: m.AlterSyncStateSet, caller: Caller) -> str | None:
        """Only the master alters its SyncStateSet, over the connection its own heartbeats come
        on (the processor checks that the id is the current master's, and its certificate)."""
        if self.table.beats_on(req.broker_name, req.master_broker_id, caller):
            return None
        return (f"CONTROLLER_ALTER_SYNC_STATE_SET for {req.broker_name} must come over the connection broker "
                f"{req.master_broker_id}'s heartbeats arrive on (the master's own); this one carries none of them")

    def _update_config(self, properties: str) -> m.Response:
        try:
            self.config = self.config.updated(properties)
        except PermissionError as e:
            return m.Response(int(RC.NO_PERMISSION), str(e))
        except ConfigError as e:
            return m.Response(int(RC.SYSTEM_ERROR), str(e))
        self.liveness.set_config(self.config)
        log.warning("controller config updated: %s", properties.strip().replace("\n", "; "))
        return m.Response()

    def metadata(self) -> m.MetadataInfo:
        node, cfg = self.runtime.node, self.runtime.cfg
        peers = cfg.peer_map
        leader = node.member.leader_id or ""
        applier = node.applier
        return m.MetadataInfo(cfg.group, leader, peers[leader].address if leader in peers else "",
                              node.member.is_leader, "".join(f"{p.id}:{p.address};" for p in peers.values()),
                              cfg.self_id, node.member.term, node.store.committed_index,
                              applier.applied_index if applier is not None else -1,
                              node.member.is_leader and self.liveness.may_elect(node.member.term, now_ms()))

    def _not_leader(self) -> m.Response:
        meta = self.metadata()
        return m.Response(int(RC.CONTROLLER_NOT_LEADER), "the controller is not leader",
                          meta.controller_leader_id, meta.controller_leader_address)

    async def _serve(self, req: m.AnyRequest, respond: Respond, principal: str) -> None:
        admin = isinstance(req, m.ElectMaster) and req.designate_elect
        try:
            if admin:  # no more leases in the set: submit then waits out the last one
                self.liveness.revoke(req.broker_name, now_ms())  # type: ignore[union-attr]
            resp = await self.submit(req, principal)
        except _Failed as e:
            resp = e.response
        except Exception as e:  # a bug: the caller still gets an answer, not a timeout
            log.exception("controller request %s failed", type(req).__name__)
            resp = m.Response(int(RC.SYSTEM_ERROR), f"{type(e).__name__}: {e}")
        finally:
            self._serving -= 1
            if admin:
                self.liveness.end_revoke(req.broker_name)  # type: ignore[union-attr]
        respond(_reply(resp))

    async def submit(self, req: m.AnyRequest, principal: str = "") -> m.Response:
        """Carry a leader-only request through: a write is logged and answered once applied,
        a read is a linearizable query. `principal`: the sender's certificate name ("" none).
        Raises _Failed when that could not be done."""
        assert isinstance(req, m.WriteRequest | m.ReadRequest)
        if isinstance(req, m.ElectMaster):
            return await self._elect(req, principal)
        names = req.broker_names if isinstance(req, m.GetSyncStateData) else [getattr(req, "broker_name", "")]
        now = now_ms()
        body = m.encode(m.Command(req, {n: self.table.live_infos(n, now) for n in names},
                                  self.config.enable_elect_unclean_master, principal))
        if isinstance(req, m.ReadRequest):
            return m.decode_response(await self._query(body))
        return m.decode_response(await self._propose(body))

    async def _elect(self, req: m.ElectMaster, principal: str) -> m.Response:
        """An election of any kind, logged only once no lease granted in the set can still
        hold a master that the election could replace (docs/brokers.md, "The master lease")."""
        name = req.broker_name
        live = await self._outwait_leases(req)
        # from the check on, synchronously: no lease is granted while the election is in flight
        self.liveness.election_started(name)
        body = m.encode(m.Command(req, {name: live}, self.config.enable_elect_unclean_master, principal))
        resp: m.Response | None = None
        try:
            resp = m.decode_response(await self._propose(body))
        finally:
            self.liveness.election_ended(name, resp)
        if resp.code == RC.SUCCESS:
            self._notify(name, resp)
        return resp

    async def _outwait_leases(self, req: m.ElectMaster) -> dict[int, LiveInfo]:
        """Wait until the election may be logged; the liveness facts it is to carry."""
        name, deadline = req.broker_name, now_ms() + self.config.request_timeout_ms
        while True:
            now = now_ms()
            live = self.table.live_infos(name, now)
            wait = self.liveness.election_wait(name, live, req.designate_elect, now)
            if not wait:
                return live
            if now + wait > deadline:
                raise _Failed(m.Response(int(RC.CONTROLLER_ELECT_MASTER_FAILED), f"broker set {name}: the master's "
                                         f"lease still holds for {wait} ms: no election before it ends"))
            log.info("broker set %s: waiting %d ms for the master's lease before electing", name, wait)
            await asyncio.sleep(wait / 1000)

    async def _propose(self, body: bytes) -> bytes:
        g = self.runtime
        msg = await self._call(RequestCode.APPEND, AppendRequest(self.group, bodies=[body], want_results=True))
        resp = decode_response(RequestCode.APPEND, msg.meta)
        if resp.code == ResponseCode.SUCCESS and len(resp.results) == 1:  # type: ignore[attr-defined]
            return resp.results[0]  # type: ignore[attr-defined,no-any-return]
        raise _Failed(self._failure(resp.code, getattr(resp, "message", ""), g))  # type: ignore[attr-defined]

    async def _query(self, body: bytes) -> bytes:
        msg = await self._call(QUERY, QueryRequest(self.group, request=body))
        resp = decode_response(QUERY, msg.meta)
        if resp.code == ResponseCode.SUCCESS:  # type: ignore[attr-defined]
            return resp.result  # type: ignore[attr-defined,no-any-return]
        raise _Failed(self._failure(resp.code, resp.message, self.runtime))  # type: ignore[attr-defined]

    def _failure(self, code: int, message: str, g: GroupRuntime) -> m.Response:
        if code == ResponseCode.NOT_LEADER or not g.node.member.is_leader:
            return self._not_leader()
        return m.Response(int(RC.SYSTEM_ERROR), f"the controller log refused the request ({code}): {message}")

    async def _call(self, code: int, req: Any) -> Message:
        """Hand a request to the group's node, as if it came from the network."""
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

        def respond(msg: Message) -> None:
            if not fut.done():
                fut.set_result(msg)

        self.runtime.handle(code, req, b"", respond)
        try:
            async with asyncio.timeout(self.config.request_timeout_ms / 1000):
                return await fut
        except TimeoutError:
            raise _Failed(m.Response(int(RC.SYSTEM_ERROR), f"not applied within {self.config.request_timeout_ms} "
                                     "ms (no quorum of controllers?): it may still take effect")) from None

    # --- liveness and elections --------------------------------------------------------------

    def _connection_lost(self, caller: Caller) -> None:
        gone = self.table.connection_closed(caller, now_ms())
        if gone:
            log.info("brokers %s: their connection closed", gone)
            self._wake.set()

    async def _scan_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # a timer, not wait_for: on 3.11 a cancel that meets wait_for's own timeout is lost
            # (the TimeoutError is raised instead) and the scan would never stop
            timer = loop.call_later(self.config.scan_interval_ms / 1000, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
            self._wake.clear()
            try:
                await self._scan()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop failovers for good
                log.exception("controller scan failed")

    async def _scan(self) -> None:
        now = now_ms()
        self.table.expire(now)
        member = self.runtime.node.member
        if not member.is_leader:
            self.liveness.leading(None, now)
            return
        if member.term != self._leader_term:
            self._leader_term = member.term
            log.info("controller leader at term %d: elections wait one heartbeat timeout", member.term)
        may_elect = self.liveness.leading(member.term, now)  # #5712: not before one heartbeat timeout
        briefs = await self._on_worker(self.machine.brief)
        self.liveness.keep_only({s.name for s in briefs})
        for s in briefs:
            self.liveness.note_master(s.name, s.master_id, s.master_epoch)
        if not may_elect:
            return
        for s in briefs:
            if s.name not in self._electing and self.liveness.needs_election(s, now):
                self._electing.add(s.name)
                self._spawn(self._controller_elect(s.name))

    async def _controller_elect(self, name: str) -> None:
        try:
            for _ in range(self.config.elect_master_max_retry_count):
                try:
                    resp = await self.submit(m.ElectMaster(broker_name=name))
                except _Failed as e:
                    log.warning("controller-triggered election of %s failed: %s", name, e.response.remark)
                    continue
                if resp.code == RC.SUCCESS:
                    self.elections += 1
                    log.warning("broker set %s: elected master %s (epoch %s)", name, resp.master_broker_id,
                                resp.master_epoch)
                return  # a refusal (no candidate, master alive) is final until the next scan
        finally:
            self._electing.discard(name)

    def _notify(self, name: str, resp: m.Response) -> None:
        """Push the new master to the set's live replicas; a newer epoch cancels an older push."""
        if not self.config.notify_broker_role_changed or resp.master_epoch is None:
            return
        note = m.NotifyBrokerRoleChanged(name, resp.master_address, resp.master_epoch, resp.sync_state_set_epoch or 0,
                                         resp.master_broker_id, resp.sync_state_set or [])
        now = now_ms()
        for broker_id, address in (resp.broker_addrs or {}).items():
            if not self.table.alive(name, broker_id, now):
                continue
            old = self._notifying.get(address)
            if old is not None and not old[1].done():
                if old[0] >= resp.master_epoch:
                    continue
                old[1].cancel()
            self._notifying[address] = (resp.master_epoch,
                                        self._spawn(self._send_notify(m.client_address(address), note)))

    async def _send_notify(self, address: str, note: m.NotifyBrokerRoleChanged) -> None:
        client = self.server.client
        if client is None:
            return
        try:
            await client.request(address, Message(NOTIFY_CODE, m.encode(note)), NOTIFY_TIMEOUT_S)
        except Exception as e:  # brokers also poll: a lost push is only slower
            log.info("NOTIFY_BROKER_ROLE_CHANGED to %s failed: %s", address, e)

    # --- plumbing ----------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _on_worker(self, fn: Callable[[], T]) -> T:
        """fn() on the state machine's thread, between applies (the state never changes under it)."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def done(f: Future[T]) -> None:
            if fut.done():
                return
            if f.cancelled():
                fut.cancel()
            elif f.exception() is not None:
                fut.set_exception(f.exception())  # type: ignore[arg-type]
            else:
                fut.set_result(f.result())

        self.runtime.host.submit(fn, done=done)
        return await fut
