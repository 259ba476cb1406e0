"""A broker of a broker set (`dledger broker`): registration, roles, HA, sends and reads.

Startup (CONTROLLER.md §1.4): fenced (no writes) until registered with a persistent id;
then the role comes from the controller leader's own answers only (register, an election it
asks for, replica info). A NOTIFY_BROKER_ROLE_CHANGED is a hint: it makes the broker ask the
leader for replica info now (at most one query in flight however many arrive) and nothing it
says is used, so a forged one changes nothing and no epoch the controller does not hold is
ever written. Role changes (§6) run one at a time and only for a higher master epoch. A
master appends its epoch to the epoch file before writing in it and closes every HA
connection on any epoch change (#9689).

Master lease (beyond upstream, #7017/#6662): every heartbeat asks for `lease_ms`; the
controller leader grants it only to the master at its epoch, and counts the master alive for
lease + drift after its last heartbeat (even when its connection closes). A master answers a
send only while its lease (from the heartbeat's send time) holds, so it has stopped
acknowledging before any replacement can be elected.

Acks (§4.11): a send is refused before it is written when fewer than min-in-sync-replicas
are in the SyncStateSet (IN_SYNC_REPLICAS_NOT_ENOUGH); after the write it waits until
in-sync-replicas copies (or every SyncStateSet member with all-ack) have it, at most
slave_timeout_ms (then FLUSH_SLAVE_TIMEOUT: written, not acknowledged). Reads return only
records up to the confirm offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dledger.address import parse_address
from dledger.broker import messages as bm
from dledger.broker.config import BrokerConfig, split_address
from dledger.broker.confirm_file import read_confirm, write_confirm
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_runtime import HAListener, SlaveRunner, now_ms
from dledger.broker.identity import Registration
from dledger.broker.log import BrokerLog
from dledger.broker.replica import Change, ReplicaState, Role
from dledger.codes import ControllerRequestCode, DLedgerError, ResponseCode
from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as cm
from dledger.controller.client import ControllerClient
from dledger.ratelog import RateLimitedLog
from dledger.runtime.transport import (
    Caller,
    FaultInjector,
    Limits,
    Message,
    Respond,
    TransportServer,
    connection_cap,
    encode_error,
)
from dledger.security.roles import Access, needs
from dledger.security.roles import Role as Needs
from dledger.security.tls import check_broker_cert, client_context, server_context
from dledger.store.durability import DurabilityWaiter
from dledger.store.file import FileLedgerStore

log = logging.getLogger(__name__)

NOTIFY = int(ControllerRequestCode.NOTIFY_BROKER_ROLE_CHANGED)
# The roles each request a broker serves needs (docs/security.md, "Roles"); the transport
# refuses any other code, and anyone without the role, before a handler runs.
BROKER_ACCESS: dict[int, Access] = {
    bm.BrokerRequestCode.SEND_MESSAGE: needs("SEND_MESSAGE", Needs.CLIENT),
    bm.BrokerRequestCode.PULL_MESSAGE: needs("PULL_MESSAGE", Needs.CLIENT),
    bm.BrokerRequestCode.GET_BROKER_RUNTIME_INFO: needs("GET_BROKER_RUNTIME_INFO", Needs.CLIENT, Needs.BROKER,
                                                        Needs.CONTROLLER),
    NOTIFY: needs("NOTIFY_BROKER_ROLE_CHANGED", Needs.CONTROLLER),
    bm.BrokerRequestCode.FAULT: needs("FAULT", Needs.ADMIN),
}
EPOCH_FILE = "epochFileCheckpoint"
# Long-poll PULLs waiting for records: per connection, and in all (a client that asks for more
# gets its answer at once, empty or not, and asks again).
PARKED_PER_CONNECTION = 16
MAX_PARKED = 1024
PULL_COST = 16  # a PULL's share of the transport's work per loop turn (about 128 KiB of it)
HOUSEKEEPING_S = 0.1
STARTUP_RETRY_S = 0.5  # upstream: 5 s


@dataclass
class _Waiter:
    next_offset: int
    deadline_ms: int
    future: asyncio.Future[None]


def _error(code: ResponseCode, text: str) -> Message:
    return Message(int(code), encode_error(text))


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        root = config.store_path
        root.mkdir(parents=True, exist_ok=True)
        self.store = FileLedgerStore(root / "commitlog", data_file_size=config.data_file_size, flush=config.flush)
        self.log = BrokerLog(self.store)
        self.epochs = EpochFileCache(root / EPOCH_FILE)
        self.registration = Registration(root, config.cluster, config.name, config.address)
        self.faults = FaultInjector()
        tls = config.tls
        if tls is not None:
            check_broker_cert(tls, config.name)
        self._client_ssl = client_context(tls) if tls is not None else None
        server_ssl = server_context(tls) if tls is not None else None
        self.controller = ControllerClient(config.controller, timeout=3.0, tls=tls, faults=self.faults)
        self.replica = ReplicaState(config.name, self.log, self.epochs, config.ha, config.acks, config.lease_ms,
                                    ack_durable=config.flush == "sync", confirm_offset=read_confirm(root)[0])
        self._saved_confirm = self.replica.confirm_offset
        self._slave_task: asyncio.Task[None] | None = None
        self._waiters: deque[_Waiter] = deque()
        self._progress = asyncio.Event()  # the confirm offset moved (long-polling readers)
        self._role_lock = asyncio.Lock()
        self._altering = False
        self._hinted = asyncio.Event()  # ask the controller for replica info now (NOTIFY, an unknown HA slave)
        self._parked: dict[Caller, int] = {}  # PULLs in progress per connection (long polls among them)
        self._parked_total = 0
        self.replica_info_queries = 0  # GET_REPLICA_INFO asked by the poll and hints (runtime info)
        self._warn = RateLimitedLog(log).warning
        self.ha_cut = False  # fault injection: this slave is cut off from its master
        self._tasks: set[asyncio.Task[Any]] = set()
        self._durable: DurabilityWaiter | None = None
        self._dispatch = self._handlers()
        loopback_only = tls is None and not config.insecure
        # as a member's: kept below the open-file limit, so a connection flood leaves the store
        # its files (1,002 idle connections made the store fail for good)
        self.transport = TransportServer(direct=self._handle, ssl=server_ssl, policy=BROKER_ACCESS,
                                         loopback_only=loopback_only,
                                         limits=Limits(max_connections=connection_cap(Limits().max_connections)))
        self.ha = HAListener(lambda: self.replica.master_ha, self._propose, self._on_slave_ack, server_ssl,
                             broker_set=config.name, loopback_only=loopback_only, on_unknown_slave=self._hinted.set)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        host, port = parse_address(self.config.listen, "--listen")
        await self.transport.start(host, port)
        await self.ha.start(self.config.ha_listen)
        self._log_security()
        self._durable = DurabilityWaiter(self.store)
        for coro in (self._startup(), self._beat_forever(), self._housekeep_forever()):
            self._spawn(coro)

    @property
    def security(self) -> str:
        """How the client and HA ports authenticate: tls, loopback (the default without TLS) or insecure."""
        return "tls" if self.config.tls is not None else "insecure" if self.config.insecure else "loopback"

    def _log_security(self) -> None:
        name = self.config.name
        if self.security == "insecure":
            log.warning("broker %s: INSECURE (--insecure): no TLS, every host served: anyone who can reach its "
                        "ports may send, read, replicate from it and tell it its role (docs/security.md)", name)
        elif self.security == "loopback":
            log.warning("broker %s: no TLS: accepting connections from loopback addresses only (TLS or --insecure "
                        "to serve other hosts; docs/security.md)", name)

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._slave_task] if self._slave_task else [])]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.ha.close()
        await self.transport.close()
        await self.controller.close()
        self._save_confirm()
        self.store.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the confirm offset ------------------------------------------------------------------

    def _save_confirm(self) -> None:
        value = self.replica.confirm_offset
        if value != self._saved_confirm:
            write_confirm(self.config.store_path, value, self.log.last_index_within(value))
            self._saved_confirm = value

    @property
    def role(self) -> Role:
        return self.replica.role

    # --- registration and roles (§1.3, §1.4, §6) ---------------------------------------------

    async def _startup(self) -> None:
        """Register, learn (or ask for) the master, then follow the controller forever."""
        while self.role == Role.FENCED:
            try:
                if await self._register_and_take_role():
                    break
            except DLedgerError as e:
                log.info("broker %s: controller not reachable yet: %s", self.config.name, e.message)
            except OSError as e:  # the epoch file or the store could not be written: stay fenced, retry
                log.error("broker %s: taking a role failed: %s", self.config.name, e)
            await asyncio.sleep(STARTUP_RETRY_S)
        await self._follow_controller()

    async def _follow_controller(self) -> None:
        """Replica info every sync_metadata_ms, and at once after a hint; one query at a time,
        so a burst of hints (NOTIFYs) costs at most one query in flight and one after it."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.sync_metadata_ms / 1000):
                    await self._hinted.wait()
            self._hinted.clear()
            try:
                await self._sync_metadata()
            except DLedgerError:
                pass
            except OSError as e:
                log.error("broker %s: a role change failed: %s", self.config.name, e)

    async def _register_and_take_role(self) -> bool:
        if not await self.registration.register(self.controller):
            return False
        log.info("broker %s registered as id %d", self.config.name, self.registration.broker_id)
        await self._heartbeat()
        resp = self.registration.response
        if resp is None or resp.master_broker_id is None or resp.master_address is None:
            resp = await self.controller.elect_master(self.config.name, self.registration.broker_id,
                                                      cluster=self.config.cluster)
            if resp.code not in (RC.SUCCESS, RC.CONTROLLER_MASTER_STILL_EXIST):
                log.info("broker %s: no master yet (%s)", self.config.name, resp.remark or resp.code)
                return False
        return await self._apply_replica_info(resp)

    async def _sync_metadata(self) -> None:
        """schedulingSyncBrokerMetadata: the controller's view of our set."""
        self.replica_info_queries += 1
        resp = await self.controller.get_replica_info(self.config.name)
        if resp.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            await self.registration.register(self.controller)
            return
        if resp.code != RC.SUCCESS or resp.master_epoch is None:
            return
        self.replica.principals_read(resp.principals)
        if resp.master_epoch > self.replica.master_epoch:
            if resp.master_broker_id is None:
                await self.controller.elect_master(self.config.name, self.registration.broker_id,
                                                   cluster=self.config.cluster)
                return
            await self._apply_replica_info(resp)
        elif resp.master_epoch == self.replica.master_epoch and self.role == Role.MASTER:
            self.replica.sync_state_set_read(resp.master_epoch, set(resp.sync_state_set or ()),
                                             resp.sync_state_set_epoch or 0)
            self._after_confirm_change()
            self._propose()

    async def _apply_replica_info(self, resp: cm.Response) -> bool:
        """Take the role a controller answer names (register, election or replica info: never
        a NOTIFY's fields)."""
        self.replica.principals_read(resp.principals)
        if resp.master_broker_id is None or resp.master_address is None or resp.master_epoch is None:
            return False
        await self.change_role(resp.master_broker_id, resp.master_address, resp.master_epoch,
                               resp.sync_state_set_epoch or 0, set(resp.sync_state_set or ()))
        return self.role != Role.FENCED

    async def change_role(self, master_id: int, master_address: str, master_epoch: int, sss_epoch: int,
                          sss: set[int]) -> None:
        """changeBrokerRole, then the I/O the change needs."""
        async with self._role_lock:
            self.replica.broker_id = self.registration.broker_id
            change = self.replica.change_role(master_id, master_address, master_epoch, sss_epoch, sss,
                                              self.config.address)
            if change == Change.NONE:
                self._after_confirm_change()
                return
            self.ha.reset()  # every epoch change re-handshakes every slave (#9689)
            self._fail_waiters(ResponseCode.FLUSH_SLAVE_TIMEOUT, "the role changed before the send was "
                               "acknowledged (it may be kept or truncated)")
            if self._slave_task is not None:
                self._slave_task.cancel()
                self._slave_task = None
            if change == Change.MASTER:
                self._spawn(self._heartbeat())  # the lease, now
                return
            _, ha_address = split_address(master_address)
            slave = self.replica.slave
            if ha_address and slave is not None:
                durable = self._durable.wait if slave.ack_durable and self._durable is not None else None
                runner = SlaveRunner(slave, ha_address, self._on_slave_progress, self._client_ssl, durable=durable,
                                     cut=lambda: self.ha_cut, broker_set=self.config.name)
                self._slave_task = asyncio.get_running_loop().create_task(runner.run())

    def _on_slave_progress(self) -> None:
        self.replica.sync_slave_truncation()
        self._progress.set()

    # --- SyncStateSet proposals (§4.9, §6.4) --------------------------------------------------

    def _propose(self, proposal: frozenset[int] | None = None) -> None:
        """A SyncStateSet change is wanted: run the alter loop unless it runs."""
        if not self._altering:
            self._altering = True
            self._spawn(self._alter_loop())

    async def _alter_loop(self) -> None:
        """Send the wanted changes one at a time; resolve a refused one by reading the
        controller's set; send an unanswered one again after a pause."""
        r = self.replica
        try:
            while (req := r.next_alter()) is not None:
                try:
                    resp: cm.Response | None = await self.controller.call(req)
                except DLedgerError as e:
                    log.warning("broker %s: SyncStateSet %s: no answer (%s); sending it again", self.config.name,
                                req.sync_state_set, e.message)
                    resp = None
                if resp is not None and resp.code == ResponseCode.UNAUTHENTICATED:
                    # not over our heartbeats' connection yet (a new one: the next heartbeat
                    # rebinds it), or not our certificate's id: sent again after a pause
                    self._warn("alter refused", "broker %s: SyncStateSet %s refused: %s; sending it again",
                               self.config.name, req.sync_state_set, resp.remark)
                    resp = None
                r.alter_answered(req, resp)
                if r.unresolved:
                    with contextlib.suppress(DLedgerError):
                        info = await self.controller.get_replica_info(self.config.name)
                        if info.code == RC.SUCCESS and info.master_epoch is not None:
                            r.sync_state_set_read(info.master_epoch, set(info.sync_state_set or ()),
                                                  info.sync_state_set_epoch or 0)
                    if r.unresolved:
                        await asyncio.sleep(0.5)
                elif resp is None:
                    await asyncio.sleep(0.5)
                else:
                    log.info("broker %s: SyncStateSet %s (epoch %d)", self.config.name, sorted(r.sync_state_set),
                             r.sync_state_set_epoch)
                self._after_confirm_change()
                self._on_slave_ack()
        finally:
            self._altering = False

    # --- heartbeats and the lease (§1.5) -----------------------------------------------------

    async def _beat_forever(self) -> None:
        while True:
            if self.registration.broker_id != -1:
                await self._heartbeat()
            await asyncio.sleep(self.config.heartbeat_interval_ms / 1000)

    async def _heartbeat(self) -> None:
        r = self.replica
        lease = r.heartbeat_lease_ms
        hb = cm.BrokerHeartbeat(self.config.cluster, self.config.address, self.config.name,
                                self.registration.broker_id, self.epochs.last_epoch, self.log.max_offset,
                                r.confirm_offset, election_priority=self.config.election_priority, lease_ms=lease)
        sent, epoch = now_ms(), r.master_epoch
        answers = await self.controller.heartbeat(hb, timeout=self.config.heartbeat_interval_ms * 3 / 1000)
        if any(x.lease_granted for x in answers):
            r.lease_granted(sent, epoch)
        elif lease:
            remark = next((x.remark for x in answers if x.remark), "")
            if remark:
                log.warning("broker %s: %s", self.config.name, remark)

    # --- housekeeping --------------------------------------------------------------------------

    async def _housekeep_forever(self) -> None:
        last_check = last_save = now_ms()
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            now = now_ms()
            self._expire_waiters(now)
            ha = self.replica.master_ha
            if ha is not None and now - last_check >= self.config.check_sync_state_set_ms:
                last_check = now
                proposal = ha.shrink(now)
                if proposal is not None:
                    self._propose(proposal)
            if now - last_save >= 1000:
                last_save = now
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(self._save_confirm)

    # --- client requests ---------------------------------------------------------------------

    def _handlers(self) -> dict[int, Callable[[Message, Respond, Caller], None]]:
        """Every request code a broker serves (each has its roles in BROKER_ACCESS)."""
        return {
            bm.BrokerRequestCode.SEND_MESSAGE: lambda msg, respond, _: self._spawn(self._answer(self._send(msg),
                                                                                                  respond)),
            bm.BrokerRequestCode.PULL_MESSAGE: lambda msg, respond, caller: self._spawn(
                self._answer(self._pull(msg, caller), respond)),
            bm.BrokerRequestCode.GET_BROKER_RUNTIME_INFO: lambda _, respond, __: respond(
                Message(int(ResponseCode.SUCCESS), bm.encode(self.runtime_info()))),
            NOTIFY: lambda msg, respond, caller: respond(self._notify(msg, caller)),
            bm.BrokerRequestCode.FAULT: lambda msg, respond, _: respond(self._fault(msg)),
        }

    def _handle(self, msg: Message, respond: Respond, caller: Caller) -> None:
        handler = self._dispatch.get(msg.code)
        if handler is None:  # the transport's policy refuses unknown codes first
            respond(_error(ResponseCode.UNSUPPORTED, f"a broker does not serve request code {msg.code}"))
        else:
            handler(msg, respond, caller)

    async def _answer(self, work: Coroutine[Any, Any, Message], respond: Respond) -> None:
        try:
            reply = await work
        except DLedgerError as e:
            reply = _error(e.code, e.message)
        except Exception as e:  # a bug: the client gets an answer, not a timeout
            log.exception("broker request failed")
            reply = _error(ResponseCode.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
        respond(reply)

    def _notify(self, msg: Message, caller: Caller) -> Message:
        """A hint that our set's master changed: ask the controller leader (never act on the
        NOTIFY's own fields: a forged one could name any master and epoch)."""
        try:
            req = cm.decode_request(msg.code, msg.meta)
        except cm.DECODE_ERRORS as e:
            return _error(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed NOTIFY_BROKER_ROLE_CHANGED: {e}")
        assert isinstance(req, cm.NotifyBrokerRoleChanged)
        if req.broker_name not in ("", self.config.name):
            return _error(ResponseCode.UNEXPECTED_ARGUMENT, f"this is broker {self.config.name}, not {req.broker_name}")
        self._hinted.set()  # (before registration: the registration's own answer gives the role)
        return Message(int(ResponseCode.SUCCESS), cm.encode(cm.Response()))

    def _fault(self, msg: Message) -> Message:
        if not self.config.enable_fault_injection:
            return _error(ResponseCode.UNSUPPORTED, "fault injection is off (--enable-fault-injection)")
        try:
            req = bm.fault_request.decode(msg.meta)
        except bm.DECODE_ERRORS as e:
            return _error(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed FAULT: {e}")
        self.faults.unblock_all()
        if req.blocked:
            self.faults.block(req.blocked)
        self.ha.paused, self.ha_cut = req.ha_paused, req.ha_cut
        log.warning("broker %s: faults: blocked %s, HA paused %s, HA cut %s", self.config.name, req.blocked,
                    req.ha_paused, req.ha_cut)
        return Message(int(ResponseCode.SUCCESS), b"")

    async def _send(self, msg: Message) -> Message:
        try:
            req = bm.send_request.decode(msg.meta)
        except bm.DECODE_ERRORS as e:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed send: {e}") from None
        if req.broker_name and req.broker_name != self.config.name:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"this is broker {self.config.name}, "
                               f"not {req.broker_name}")
        r = self.replica
        refusal = r.send_refusal(now_ms())
        if refusal is not None:
            raise refusal
        ha, epoch = r.master_ha, r.master_epoch
        result = r.append(req.bodies)
        next_offset = self.log.max_offset
        self.ha.wake()
        self._after_confirm_change()
        if self.config.flush == "sync" and self._durable is not None:
            await self._durable.wait(result.first_index + len(req.bodies) - 1)
        await self._wait_acks(next_offset)
        if r.master_ha is not ha or r.master_epoch != epoch or not r.lease_valid(now_ms()):
            raise DLedgerError(ResponseCode.FLUSH_SLAVE_TIMEOUT, "written, but mastership or lease was lost before "
                               "the send was acknowledged: it may or may not be kept")
        return Message(int(ResponseCode.SUCCESS), bm.encode(bm.SendResponse(epoch, result.first_index,
                                                                            list(result.positions))))

    async def _wait_acks(self, next_offset: int) -> None:
        if self.replica.acked(next_offset):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(next_offset, now_ms() + self.config.slave_timeout_ms, fut))
        await fut

    def _on_slave_ack(self) -> None:
        self._after_confirm_change()
        while self._waiters and self.replica.acked(self._waiters[0].next_offset):
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_result(None)

    def _expire_waiters(self, now: int) -> None:
        self._on_slave_ack()  # a SyncStateSet change may have released some
        while self._waiters and self._waiters[0].deadline_ms <= now:
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_exception(DLedgerError(
                    ResponseCode.FLUSH_SLAVE_TIMEOUT, f"written on master {self.config.name} but not acknowledged by "
                    f"enough replicas within {self.config.slave_timeout_ms} ms"))

    def _fail_waiters(self, code: ResponseCode, text: str) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_exception(DLedgerError(code, text))

    def _after_confirm_change(self) -> None:
        ha = self.replica.master_ha
        if ha is not None:
            before = ha.confirm_offset
            if ha.recompute_confirm() != before:
                self.ha.wake()
                self._progress.set()

    async def _pull(self, msg: Message, caller: Caller) -> Message:
        try:
            req = bm.pull_request.decode(msg.meta)
        except bm.DECODE_ERRORS as e:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed pull: {e}") from None
        if req.from_index < self.store.begin_index:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                               f"index {req.from_index} is below the log begin {self.store.begin_index}")
        caller.charge(PULL_COST)  # its answer, not its request, is the work (up to 4 MiB)
        wait_ms = req.wait_ms if self._may_park(caller) else 0
        self._parked[caller] = self._parked.get(caller, 0) + 1
        self._parked_total += 1
        try:
            return await self._pull_until(req, now_ms() + wait_ms)
        finally:
            self._parked_total -= 1
            left = self._parked.pop(caller) - 1
            if left:
                self._parked[caller] = left

    def _may_park(self, caller: Caller) -> bool:
        """A long poll may wait: at most PARKED_PER_CONNECTION per connection and MAX_PARKED
        in all (200,000 pipelined polls of one client flapped a set's mastership); beyond,
        it is answered at once with what there is, and its client asks again."""
        return self._parked.get(caller, 0) < PARKED_PER_CONNECTION and self._parked_total < MAX_PARKED

    async def _pull_until(self, req: bm.PullRequest, deadline: int) -> Message:
        while True:
            self._progress.clear()
            confirm = self.replica.confirm_offset
            entries = self.log.entries(req.from_index, req.max_entries, confirm)
            left = deadline - now_ms()
            if entries or left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 500) / 1000):
                    await self._progress.wait()
        out = [bm.PulledEntry(e.index, e.pos, e.term, e.body) for e in entries]
        nxt = out[-1].index + 1 if out else req.from_index
        return Message(int(ResponseCode.SUCCESS), bm.encode(bm.PullResponse(out, nxt, self.store.begin_index, confirm)))

    def runtime_info(self) -> bm.RuntimeInfo:
        r = self.replica
        left = max(0, r.lease_until_ms - now_ms()) if self.role == Role.MASTER else 0
        sss = r.master_ha.tracker.effective if r.master_ha is not None else r.sync_state_set
        confirm = r.confirm_offset
        return bm.RuntimeInfo(self.config.cluster, self.config.name, self.registration.broker_id, self.role.value,
                              r.master_epoch, r.master_id, r.master_address, sorted(sss),
                              r.sync_state_set_epoch, self.log.max_offset, confirm,
                              self.store.end_index, left, r.truncated_at,
                              self.registration.broker_id != -1 and self.role != Role.FENCED,
                              self.store.begin_index, self.log.last_index_within(confirm),
                              self.replica_info_queries, self.security)
