"""The controller's request pipeline on a member of its Raft group (docs/controller.md).

Controller requests arrive on the group's own port (mounted: DLedgerServer.mount). Every member
answers heartbeats, metadata and its config; only the leader ("active controller") serves
the rest — a follower answers CONTROLLER_NOT_LEADER naming the leader. A write is logged as
a `Command` carrying the leader's liveness facts and validated when it is applied (so two
requests are never validated against the same state); the requester gets the answer apply
made once the entry is applied here. A read is a linearizable query of the applied state.

The leader's decisions are `ControllerLeader`'s (controller.leader, sans-I/O; the broker
simulator drives the same object): every `scan_interval_ms` it names the broker sets whose
master died while a replica lives (#5009/#6382), not before it has led for one heartbeat
timeout (#5712), so a controller failover never causes a broker failover; it says when an
election may be logged and whom to push a new master to (NOTIFY_BROKER_ROLE_CHANGED, which a
broker takes as a hint to ask for replica info; brokers also poll replica info). This
module carries those decisions out: it mounts its request codes on the group's port, and
proposes and queries through the group's in-process API (`GroupRuntime.propose`, `query`,
`status`), never through the wire format.

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
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from dledger.clock import now_ms
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import RequestCode, ResponseCode
from dledger.config import ConfigError
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.heartbeats import HeartbeatTable
from dledger.controller.leader import ControllerLeader, Notify, Propose, Refuse
from dledger.controller.machine import ControllerStateMachine
from dledger.runtime.server import DLedgerServer, GroupRefused, GroupRuntime, GroupStatus, ServiceMount
from dledger.runtime.transport import LISTENER_MEMBER, Caller, Message, Respond
from dledger.security.roles import ALL_ROLES, Access, AccessRole, Principal, needs, refusal_text
from dledger.security.tls import TlsConfig, check_member_cert

log = logging.getLogger(__name__)

T = TypeVar("T")
NOTIFY_TIMEOUT_S = 3.0
MAX_SERVING = 4096  # leader-only requests in flight (upstream's event queue holds 1024)
NOTIFY_CODE = int(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)
_C = RequestCode
# The roles each controller request needs (docs/security.md, "Roles"); checked by the transport
# before handle() runs. ELECT_MASTER is a broker's for its own set, else an admin's (handle
# narrows it once decoded).
CONTROLLER_ACCESS: dict[int, Access] = {
    _C.BROKER_HEARTBEAT: needs("BROKER_HEARTBEAT", AccessRole.BROKER),
    _C.CONTROLLER_ALTER_SYNC_STATE_SET: needs("CONTROLLER_ALTER_SYNC_STATE_SET", AccessRole.BROKER),
    _C.CONTROLLER_ELECT_MASTER: needs("CONTROLLER_ELECT_MASTER", AccessRole.BROKER, AccessRole.ADMIN),
    _C.CONTROLLER_REGISTER_BROKER: needs("CONTROLLER_REGISTER_BROKER", AccessRole.BROKER),
    _C.CONTROLLER_GET_REPLICA_INFO: needs("CONTROLLER_GET_REPLICA_INFO", AccessRole.BROKER, AccessRole.CLIENT),
    _C.CONTROLLER_GET_METADATA_INFO: Access("CONTROLLER_GET_METADATA_INFO", ALL_ROLES),
    _C.CONTROLLER_GET_SYNC_STATE_DATA: needs("CONTROLLER_GET_SYNC_STATE_DATA", AccessRole.BROKER, AccessRole.CLIENT),
    _C.NOTIFY_BROKER_ROLE_CHANGED: needs("NOTIFY_BROKER_ROLE_CHANGED", AccessRole.CONTROLLER),
    _C.UPDATE_CONTROLLER_CONFIG: needs("UPDATE_CONTROLLER_CONFIG", AccessRole.ADMIN),
    _C.GET_CONTROLLER_CONFIG: needs("GET_CONTROLLER_CONFIG", AccessRole.ADMIN),
    _C.CLEAN_BROKER_DATA: needs("CLEAN_BROKER_DATA", AccessRole.ADMIN),
    _C.CONTROLLER_GET_NEXT_BROKER_ID: needs("CONTROLLER_GET_NEXT_BROKER_ID", AccessRole.BROKER),
    _C.CONTROLLER_APPLY_BROKER_ID: needs("CONTROLLER_APPLY_BROKER_ID", AccessRole.BROKER),
}


# The group's refusals of an in-process proposal made before its entry was stored (node:
# checked when the append is taken or stored): the entry surely never takes effect. Any other
# failure (a timeout, TERM_CHANGED, the member stopping) leaves its fate unknown.
NOT_STORED = frozenset((ResponseCode.NOT_LEADER, ResponseCode.LEADER_TRANSFERRING, ResponseCode.LEADER_PENDING_FULL))


class _Failed(Exception):
    """A request the controller could not carry through (answered with `response`);
    `unknown`: a write that may still take effect."""

    def __init__(self, response: m.Response, unknown: bool = False) -> None:
        super().__init__(response.remark)
        self.response = response
        self.unknown = unknown


def role_refusal(req: m.AnyRequest, principal: Principal) -> str | None:
    """What the code's roles (CONTROLLER_ACCESS) did not settle: an election a broker did not
    ask for itself is an admin's; a replica's certificate speaks for its own broker set only."""
    if isinstance(req, m.ElectMaster) and (req.designate_elect or req.broker_id == m.NO_ID):
        if not principal.has(AccessRole.ADMIN):
            return refusal_text("CONTROLLER_ELECT_MASTER (an admin's or the controller's election)",
                                (AccessRole.ADMIN,), principal)
        return None
    name = getattr(req, "broker_name", None)
    if (principal.bound and principal.has(AccessRole.BROKER) and not principal.has(AccessRole.ADMIN)
            and isinstance(req, m.BrokerRequest) and name != principal.broker_set):
        return f"{principal.describe()} may not speak for broker set {name!r}"
    return None


def _reply(resp: m.Response) -> Message:
    return Message(resp.code, m.encode(resp))


class ControllerService:
    """Attach before `server.start()` (it mounts its request codes), start after."""

    def __init__(self, server: DLedgerServer, group: str, config: ControllerConfig,
                 machine: ControllerStateMachine) -> None:
        self.server = server
        self.group = group
        self.config = config
        self.machine = machine
        for cfg in server.configs:  # brokers take NOTIFYs from a controller's certificate only
            tls = TlsConfig.from_config(cfg)
            if tls is not None and cfg.group == group:
                check_member_cert(tls, cfg.self_id, AccessRole.CONTROLLER)
        self.leader = ControllerLeader(config)
        server.mount(group, ServiceMount({code: self.handle for code in m.CODES}, CONTROLLER_ACCESS,
                                         connection_lost=(self._connection_lost,), sealed=True))
        self._pushes: dict[str, asyncio.Task[None]] = {}  # address -> the NOTIFY push in flight there
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._scanner: asyncio.Task[None] | None = None
        self._serving = 0  # leader-only requests in flight

    @property
    def runtime(self) -> GroupRuntime:
        return self.server.groups[self.group]

    @property
    def table(self) -> HeartbeatTable:
        return self.leader.table

    @property
    def elections(self) -> int:
        """Controller-triggered elections won (tests, status)."""
        return self.leader.elections

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
        elif not self.runtime.status().is_leader:
            respond(_reply(self._not_leader()))
        elif self._serving >= MAX_SERVING:
            respond(_reply(m.Response(int(RC.SYSTEM_ERROR), f"the controller is busy ({MAX_SERVING} requests "
                                      "in flight): retry")))
        elif isinstance(req, m.AlterSyncStateSet) and (problem := self.leader.alter_refusal(req, caller)) is not None:
            respond(_reply(m.Response(int(ResponseCode.UNAUTHENTICATED), problem)))
        else:
            assert isinstance(req, m.WriteRequest | m.ReadRequest)
            self._serving += 1
            self._spawn(self._serve(req, respond, principal))

    def _heartbeat(self, req: m.BrokerHeartbeat, caller: Caller) -> m.Response:
        p = caller.principal
        bound = self.machine.principal_of(req.broker_name, req.broker_id) if req.broker_id is not None else ""
        if p.bound and bound and p.name != bound:  # a replica beats for its own id only
            return m.Response(int(ResponseCode.UNAUTHENTICATED), f"certificate CN={p.name} may not beat for broker "
                              f"{req.broker_id} of {req.broker_name}: it is bound to CN={bound}")
        return self.leader.heartbeat(req, now_ms(), caller, self.runtime.status().lease_valid)

    def _update_config(self, properties: str) -> m.Response:
        try:
            self.config = self.config.updated(properties)
        except PermissionError as e:
            return m.Response(int(RC.NO_PERMISSION), str(e))
        except ConfigError as e:  # an unknown key or a bad value: nothing changed
            return m.Response(int(RC.CONTROLLER_INVALID_REQUEST), e.message)
        self.leader.set_config(self.config)
        log.warning("controller config updated: %s", properties.strip().replace("\n", "; "))
        return m.Response()

    def metadata(self) -> m.MetadataInfo:
        st = self.runtime.status()
        return m.MetadataInfo(st.group, st.leader_id, st.leader_address, st.is_leader,
                              "".join(f"{i}:{address};" for i, address in st.members), st.self_id, st.term,
                              st.committed_index, st.applied_index,
                              st.is_leader and self.leader.may_elect(st.term, now_ms()))

    def _not_leader(self, st: GroupStatus | None = None) -> m.Response:
        st = st or self.runtime.status()
        return m.Response(int(RC.CONTROLLER_NOT_LEADER), "the controller is not leader", st.leader_id,
                          st.leader_address)

    async def _serve(self, req: m.WriteRequest | m.ReadRequest, respond: Respond, principal: str) -> None:
        admin = req.broker_name if isinstance(req, m.ElectMaster) and req.designate_elect else None
        try:
            if admin is not None:  # no more leases in the set: the election then waits out the last one
                self.leader.revoke(admin, now_ms())
            resp = await self.submit(req, principal)
        except _Failed as e:
            resp = e.response
        except Exception as e:  # a bug: the caller still gets an answer, not a timeout
            log.exception("controller request %s failed", type(req).__name__)
            resp = m.Response(int(RC.SYSTEM_ERROR), f"{type(e).__name__}: {e}")
        finally:
            self._serving -= 1
            if admin is not None:
                self.leader.end_revoke(admin)
        respond(_reply(resp))

    async def submit(self, req: m.WriteRequest | m.ReadRequest, principal: str = "") -> m.Response:
        """Carry a leader-only request through: a write is logged and answered once applied,
        a read is a linearizable query. `principal`: the sender's certificate name ("" none).
        Raises _Failed when that could not be done."""
        if isinstance(req, m.ElectMaster):
            return await self._elect(req, principal)
        body = m.encode(self.leader.command(req, now_ms(), principal))
        if isinstance(req, m.ReadRequest):
            return m.decode_response(await self._carry(self.runtime.query(body)))
        return m.decode_response(await self._carry(self.runtime.propose(body)))

    async def _elect(self, req: m.ElectMaster, principal: str) -> m.Response:
        """An election of any kind, logged when the leader says it may be (no lease granted in
        the set can still hold a master it could replace); its pushes sent once it succeeded."""
        deadline = now_ms() + self.config.request_timeout_ms
        step = self.leader.election_step(req, now_ms(), deadline, principal)
        while not isinstance(step, Propose):
            if isinstance(step, Refuse):
                raise _Failed(step.response)
            log.info("broker set %s: waiting %d ms for the master's lease before electing", req.broker_name, step.ms)
            await asyncio.sleep(step.ms / 1000)
            step = self.leader.election_step(req, now_ms(), deadline, principal)
        # from the step on, until election_ended (and, if its fate is unknown then, until a
        # scan's state shows it applied): no lease is granted in the set
        resp: m.Response | None = None
        unknown = True  # a cancel (the service stops) leaves the fate unknown too
        try:
            resp = m.decode_response(await self._carry(self.runtime.propose(m.encode(step.command))))
        except _Failed as e:
            unknown = e.unknown
            raise
        finally:
            doubt = None
            if resp is None and unknown:  # its entry, if stored, is at or before the leader's last index
                st = self.runtime.status()
                doubt = (st.term, st.last_index)
            for push in self.leader.election_ended(req.broker_name, resp, now_ms(), doubt):
                self._push(push)
        return resp

    async def _carry(self, call: Awaitable[bytes]) -> bytes:
        """The group's answer to an in-process proposal or query, within the request timeout."""
        try:
            async with asyncio.timeout(self.config.request_timeout_ms / 1000):
                return await call
        except TimeoutError:
            raise _Failed(m.Response(int(RC.SYSTEM_ERROR), f"not applied within {self.config.request_timeout_ms} "
                                     "ms (no quorum of controllers?): it may still take effect"), True) from None
        except GroupRefused as e:
            st = self.runtime.status()
            unknown = e.code not in NOT_STORED
            if e.code == ResponseCode.NOT_LEADER or not st.is_leader:
                raise _Failed(self._not_leader(st), unknown) from None
            raise _Failed(m.Response(int(RC.SYSTEM_ERROR),
                                     f"the controller log refused the request ({e.code}): {e.message}"),
                          unknown) from None

    # --- liveness and elections --------------------------------------------------------------

    def _connection_lost(self, caller: Caller) -> None:
        gone = self.leader.connection_closed(caller, now_ms())
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
        st = self.runtime.status()
        if not st.is_leader:
            self.leader.tick(now_ms(), None)
            return
        # the state read is applied at least up to st.applied_index (the worker applies in order)
        briefs = await self.runtime.read_state(self.machine.brief)
        after = self.runtime.status()
        if not after.is_leader or after.term != st.term:
            return  # leadership changed during the read: the next scan sees the new term
        for req in self.leader.tick(now_ms(), st.term, briefs, st.applied_index, st.last_index):
            self._spawn(self._controller_elect(req))

    async def _controller_elect(self, req: m.ElectMaster) -> None:
        resp: m.Response | None = None
        try:
            for _ in range(self.config.elect_master_max_retry_count):
                try:
                    resp = await self.submit(req)
                except _Failed as e:
                    log.warning("controller-triggered election of %s failed: %s", req.broker_name, e.response.remark)
                    continue
                return  # a refusal (no candidate, master alive) is final until the next scan
        finally:
            self.leader.scan_election_done(req.broker_name, resp)

    def _push(self, push: Notify) -> None:
        """Send a NOTIFY the leader called for; it supersedes any older push to that address."""
        old = self._pushes.pop(push.address, None)
        if old is not None:
            old.cancel()
        self._pushes[push.address] = self._spawn(self._send_notify(push))

    async def _send_notify(self, push: Notify) -> None:
        client = self.server.client
        try:
            if client is not None:
                await client.request(push.address, Message(NOTIFY_CODE, m.encode(push.note)), NOTIFY_TIMEOUT_S)
        except Exception as e:  # brokers also poll: a lost push is only slower
            log.info("NOTIFY_BROKER_ROLE_CHANGED to %s failed: %s", push.address, e)
        finally:
            self.leader.notify_done(push.address, push.note.master_epoch)
            if self._pushes.get(push.address) is asyncio.current_task():
                del self._pushes[push.address]

    # --- plumbing ----------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
