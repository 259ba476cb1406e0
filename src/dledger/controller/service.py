"""The controller's request pipeline on a member of its Raft group (CONTROLLER.md §1.2, §1.5).

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
replicas (NOTIFY_BROKER_ROLE_CHANGED); brokers also poll replica info.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from dledger.codes import ControllerRequestCode, RequestCode, ResponseCode
from dledger.codes import ControllerResponseCode as RC
from dledger.config import ConfigError
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.heartbeats import HeartbeatTable
from dledger.controller.machine import BrokerSetBrief, ControllerStateMachine
from dledger.core.messages import QUERY, AppendRequest, QueryRequest, decode_response
from dledger.runtime.server import DLedgerServer, GroupRuntime
from dledger.runtime.transport import LISTENER_MEMBER, Caller, Message, Respond

log = logging.getLogger(__name__)

T = TypeVar("T")
NOTIFY_TIMEOUT_S = 3.0
MAX_SERVING = 4096  # leader-only requests in flight (upstream's event queue holds 1024)
NOTIFY_CODE = int(ControllerRequestCode.NOTIFY_BROKER_ROLE_CHANGED)


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _Failed(Exception):
    """A request the controller could not carry through (answered with `response`)."""

    def __init__(self, response: m.Response) -> None:
        super().__init__(response.remark)
        self.response = response


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
        self.table = HeartbeatTable(config.broker_heartbeat_timeout_ms, config.broker_lease_drift_ms)
        server.services.update({code: self.handle for code in m.CODES})
        server.sealed_groups.add(group)
        server.on_connection_lost = self._connection_lost
        self._leader_term = -1
        self._leader_since = 0
        self._electing: set[str] = set()
        self._notifying: dict[str, tuple[int, asyncio.Task[None]]] = {}  # address -> (master epoch, task)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._scanner: asyncio.Task[None] | None = None
        self.elections = 0  # controller-triggered elections won (tests, status)
        self._serving = 0  # leader-only requests in flight
        # master leases: broker name -> when the last one granted in it ends (plus the drift),
        # and the names whose leases are being revoked for an admin's election
        self._lease_ends: dict[str, int] = {}
        self._revoking: set[str] = set()
        # the leader's view of each set's master (the scan's copy of the state, and elections'
        # answers at once), and the sets with an election in flight: no lease is granted in them
        self._masters: dict[str, tuple[int | None, int]] = {}
        self._elections_in_flight: dict[str, int] = {}

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
        else:
            self._serving += 1
            self._spawn(self._serve(req, respond))

    def _heartbeat(self, req: m.BrokerHeartbeat, caller: Caller) -> m.Response:
        if req.broker_id is None:
            return m.Response(int(RC.CONTROLLER_INVALID_REQUEST), "a heartbeat must name its broker id")
        now = now_ms()
        if not self.table.beat(req.cluster_name, req.broker_name, req.broker_id, req.broker_addr, now,
                               timeout_ms=req.heartbeat_timeout_ms, epoch=req.epoch, max_offset=req.max_offset,
                               confirm_offset=req.confirm_offset, priority=req.election_priority, conn=caller,
                               lease_ms=req.lease_ms):
            return m.Response(int(RC.CONTROLLER_INVALID_REQUEST), "too many live brokers (or replicas of this set)")
        return self._grant(req, now) if req.lease_ms else m.Response()

    def _grant(self, req: m.BrokerHeartbeat, now: int) -> m.Response:
        """Renew a master lease: only a leader sure of its leadership (its own Raft lease: no
        other controller can lead before that ends) grants, and only leases that end within
        the heartbeat timeout a new leader waits before electing."""
        drift = self.config.broker_lease_drift_ms
        if req.lease_ms + drift > self.config.broker_heartbeat_timeout_ms:
            return m.Response(remark=f"lease of {req.lease_ms} ms not granted: lease + drift ({drift} ms) must "
                                     f"be within controller.broker_heartbeat_timeout_ms "
                                     f"({self.config.broker_heartbeat_timeout_ms})")
        node = self.runtime.node
        name = req.broker_name
        if (not node.member.is_leader or not node.reads.lease_valid() or name in self._revoking
                or name in self._elections_in_flight or self._masters.get(name) != (req.broker_id, req.epoch)):
            return m.Response()  # not (or no longer) the master at that epoch: an old master gets no lease
        end = now + req.lease_ms + drift
        self._lease_ends[req.broker_name] = max(self._lease_ends.get(req.broker_name, 0), end)
        return m.Response(lease_granted=True)

    async def _revoke_leases(self, name: str) -> None:
        """Before an admin's election: grant no lease in the set and wait out the last one (the
        old master may acknowledge writes until then; a failover needs no wait, the master's
        heartbeats have stopped for longer than its lease)."""
        self._revoking.add(name)
        wait = self._lease_ends.get(name, 0) - now_ms()
        if wait > 0:
            log.info("broker set %s: waiting %d ms for the master's lease before electing", name, wait)
            await asyncio.sleep(wait / 1000)

    def _update_config(self, properties: str) -> m.Response:
        try:
            self.config = self.config.updated(properties)
        except PermissionError as e:
            return m.Response(int(RC.NO_PERMISSION), str(e))
        except ConfigError as e:
            return m.Response(int(RC.SYSTEM_ERROR), str(e))
        self.table.default_timeout_ms = self.config.broker_heartbeat_timeout_ms
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
                              applier.applied_index if applier is not None else -1)

    def _not_leader(self) -> m.Response:
        meta = self.metadata()
        return m.Response(int(RC.CONTROLLER_NOT_LEADER), "the controller is not leader",
                          meta.controller_leader_id, meta.controller_leader_address)

    async def _serve(self, req: m.AnyRequest, respond: Respond) -> None:
        admin = isinstance(req, m.ElectMaster) and req.designate_elect
        try:
            if admin:
                await self._revoke_leases(req.broker_name)  # type: ignore[union-attr]
            resp = await self.submit(req)
        except _Failed as e:
            resp = e.response
        except Exception as e:  # a bug: the caller still gets an answer, not a timeout
            log.exception("controller request %s failed", type(req).__name__)
            resp = m.Response(int(RC.SYSTEM_ERROR), f"{type(e).__name__}: {e}")
        finally:
            self._serving -= 1
            if admin:
                self._revoking.discard(req.broker_name)  # type: ignore[union-attr]
        respond(_reply(resp))

    async def submit(self, req: m.AnyRequest) -> m.Response:
        """Carry a leader-only request through: a write is logged and answered once applied,
        a read is a linearizable query. Raises _Failed when that could not be done."""
        names = req.broker_names if isinstance(req, m.GetSyncStateData) else [getattr(req, "broker_name", "")]
        now = now_ms()
        assert isinstance(req, m.WriteRequest | m.ReadRequest)
        cmd = m.Command(req, {n: self.table.live_infos(n, now) for n in names},
                        self.config.enable_elect_unclean_master)
        body = m.encode(cmd)
        if isinstance(req, m.ReadRequest):
            return m.decode_response(await self._query(body))
        if not isinstance(req, m.ElectMaster):
            return m.decode_response(await self._propose(body))
        name = req.broker_name
        self._elections_in_flight[name] = self._elections_in_flight.get(name, 0) + 1
        try:
            resp = m.decode_response(await self._propose(body))
            if resp.master_epoch is not None:
                self._note_master(name, resp.master_broker_id, resp.master_epoch)
        finally:
            left = self._elections_in_flight.pop(name) - 1
            if left:
                self._elections_in_flight[name] = left
        if resp.code == RC.SUCCESS:
            self._notify(name, resp)
        return resp

    def _note_master(self, name: str, master_id: int | None, epoch: int) -> None:
        """The leader's view of a set's master only moves to newer epochs (a scan's copy may be
        older than an election's answer)."""
        old = self._masters.get(name)
        if old is None or epoch >= old[1]:
            self._masters[name] = (master_id, epoch)

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
        gone = self.table.connection_closed(caller)
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
            self._leader_term = -1
            self._masters.clear()
            return
        if member.term != self._leader_term:
            self._leader_term, self._leader_since = member.term, now
            log.info("controller leader at term %d: elections wait one heartbeat timeout", member.term)
        briefs = await self._on_worker(self.machine.brief)
        for s in briefs:
            self._note_master(s.name, s.master_id, s.master_epoch)
        if now < self._leader_since + max(self.table.max_timeout_ms, self.config.broker_heartbeat_timeout_ms):
            return  # #5712: brokers not heard from yet are not dead yet
        for s in briefs:
            if s.name not in self._electing and self._needs_election(s, now):
                self._electing.add(s.name)
                self._spawn(self._controller_elect(s.name))

    def _needs_election(self, s: BrokerSetBrief, now: int) -> bool:
        live = self.table.live_infos(s.name, now)
        if s.master_id is not None:  # a dead master while a replica lives (scanInactiveMasterAndTriggerReelect)
            return s.master_id not in live and bool(live)
        # no master after a failed election: retry once a candidate lives (upstream waited for a broker)
        candidates = s.replicas if self.config.enable_elect_unclean_master else s.sync_state_set
        return s.master_epoch > 0 and any(i in live for i in candidates)

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
