"""A broker of a broker set (`dledger broker`): the asyncio driver of its BrokerAgent.

Every decision (registration, roles, the SyncStateSet alter loop, the lease heartbeat, when a
send is acknowledged) is the agent's (broker.agent, docs/brokers.md); this module moves bytes
and time: it serves the client and HA ports, calls the controllers, and carries out the
agent's effects. The data path of a send: SEND_MESSAGE -> `_send` -> `BrokerAgent.send`
(refused, or written) -> the HA listener streams the new records to the slaves -> their acks
(`slave_acked`) and the fsync (`durable`) -> `SendDone` -> the reply.

Reads return only records up to the confirm offset (long polls wait for it to move).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from dledger.address import parse_address
from dledger.broker import messages as bm
from dledger.broker.agent import (
    AgentSettings,
    AwaitDurable,
    BrokerAgent,
    CallController,
    ConfirmMoved,
    Effect,
    FollowMaster,
    Register,
    ResetHA,
    SaveConfirm,
    SendDone,
    SendHeartbeat,
    WakeHA,
)
from dledger.broker.config import BrokerConfig
from dledger.broker.confirm_file import read_confirm, write_confirm
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_runtime import HAListener, SlaveRunner
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.identity import Registration
from dledger.broker.log import BrokerLog
from dledger.broker.replica import BrokerRole
from dledger.clock import now_ms
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.controller import messages as cm
from dledger.controller.client import ControllerClient
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
from dledger.security.roles import Access, AccessRole, needs
from dledger.security.tls import check_broker_cert, client_context, server_context
from dledger.store.durability import DurabilityWaiter
from dledger.store.file import FileLedgerStore

log = logging.getLogger(__name__)

NOTIFY = int(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)
# The roles each request a broker serves needs (docs/security.md, "Roles"); the transport
# refuses any other code, and anyone without the role, before a handler runs.
BROKER_ACCESS: dict[int, Access] = {
    RequestCode.SEND_MESSAGE: needs("SEND_MESSAGE", AccessRole.CLIENT),
    RequestCode.PULL_MESSAGE: needs("PULL_MESSAGE", AccessRole.CLIENT),
    RequestCode.GET_BROKER_RUNTIME_INFO: needs("GET_BROKER_RUNTIME_INFO", AccessRole.CLIENT, AccessRole.BROKER,
                                                        AccessRole.CONTROLLER),
    RequestCode.GET_BROKER_EPOCH_CACHE: needs("GET_BROKER_EPOCH_CACHE", AccessRole.CLIENT, AccessRole.BROKER,
                                              AccessRole.CONTROLLER),
    NOTIFY: needs("NOTIFY_BROKER_ROLE_CHANGED", AccessRole.CONTROLLER),
    RequestCode.BROKER_FAULT: needs("FAULT", AccessRole.ADMIN),
}
EPOCH_FILE = "epochFileCheckpoint"
# Long-poll PULLs waiting for records: per connection, and in all (a client that asks for more
# gets its answer at once, empty or not, and asks again).
PARKED_PER_CONNECTION = 16
MAX_PARKED = 1024
PULL_COST = 16  # a PULL's share of the transport's work per loop turn (about 128 KiB of it)
HOUSEKEEPING_S = 0.1  # the agent's timers are ticked at least this often
EPOCH_RETRY_S = 0.5  # a failed epoch-file write is tried again after this


def _error(code: ResponseCode, text: str) -> Message:
    return Message(int(code), encode_error(text))


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        root = config.store_path
        root.mkdir(parents=True, exist_ok=True)
        self.store = FileLedgerStore(root / "commitlog", data_file_size=config.data_file_size, flush=config.flush,
                                     **config.retention)
        self.log = BrokerLog(self.store)
        self.epochs = EpochFileCache(root / EPOCH_FILE)
        self.registration = Registration(root, config.cluster, config.name, config.address)
        # only with --enable-fault-injection: otherwise nothing consults one (FAULT is refused)
        self.faults = FaultInjector() if config.enable_fault_injection else None
        tls = config.tls
        if tls is not None:
            check_broker_cert(tls, config.name)
        self._client_ssl = client_context(tls) if tls is not None else None
        server_ssl = server_context(tls) if tls is not None else None
        self.controller = ControllerClient(config.controller, timeout=3.0, tls=tls, faults=self.faults)
        self.agent = BrokerAgent(AgentSettings.from_config(config), self.log, self.epochs, config.ha, config.acks,
                                 config.lease_ms, now_ms=now_ms(), broker_id=self.registration.broker_id,
                                 confirm_offset=read_confirm(root)[0])
        self.replica = self.agent.replica
        # from here on the epoch file is written off the event loop (`_write_epochs`)
        self.epochs.deferred = True
        self._epoch_writer: asyncio.Task[None] | None = None  # the one epoch-file write in flight
        self._epochs_event = asyncio.Event()  # set (and replaced) after each write
        self._saved_confirm = self.replica.confirm_offset
        self._confirm_to_save = self._saved_confirm  # the newest SaveConfirm's offset
        self._saver: asyncio.Task[None] | None = None  # the one confirm-offset save in flight
        self._stopping = False
        self._slave_task: asyncio.Task[None] | None = None
        self._sends: dict[int, asyncio.Future[bm.SendResponse | DLedgerError]] = {}  # send id -> its answer
        self._send_ids = itertools.count(1)
        self._progress = asyncio.Event()  # the confirm offset moved (long-polling readers)
        self._parked: dict[Caller, int] = {}  # PULLs in progress per connection (long polls among them)
        self._parked_total = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._durable: DurabilityWaiter | None = None
        self._dispatch = self._handlers()
        loopback_only = tls is None and not config.insecure
        # as a member's: kept below the open-file limit, so a connection flood leaves the store
        # its files (1,002 idle connections made the store fail for good)
        self.transport = TransportServer(direct=self._handle, ssl=server_ssl, policy=BROKER_ACCESS,
                                         loopback_only=loopback_only,
                                         limits=Limits(max_connections=connection_cap(Limits().max_connections)))
        self.ha = HAListener(lambda: self.replica.master_ha, self._on_proposal, self._on_slave_ack, server_ssl,
                             broker_set=config.name, loopback_only=loopback_only,
                             on_unknown_slave=self._on_unknown_slave, faults=self.faults)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        host, port = parse_address(self.config.listen, "--listen")
        await self.transport.start(host, port)
        await self.ha.start(self.config.ha_listen)
        self._log_security()
        self._durable = DurabilityWaiter(self.store)
        self._spawn(self._drive()).add_done_callback(self._drive_ended)

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
        self._stopping = True  # (closing the HA listener may still report a proposal: not acted on)
        # the savers finish their writes (a cancelled thread would not stop, and race the last save)
        savers = [t for t in (self._saver, self._epoch_writer) if t is not None]
        tasks = [t for t in (*self._tasks, *([self._slave_task] if self._slave_task else [])) if t not in savers]
        for t in tasks:
            t.cancel()
        for t in [*tasks, *savers]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.ha.close()
        await self.transport.close()
        await self.controller.close()
        self._save_confirm()
        if self.epochs.unwritten:  # (the writer gave up on an error: once more, on the loop)
            try:
                self.store.flush()
                version, data = self.epochs.snapshot()
                self.epochs.write(data)
                self.epochs.written_up_to(version)
            except Exception as e:
                log.error("broker %s: writing the epoch file at stop failed: %s", self.config.name, e)
        self.store.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the confirm offset ------------------------------------------------------------------

    def _save_confirm(self) -> None:
        """The last save, at stop (on the loop, after any save in flight ended)."""
        value = self.replica.confirm_offset
        if value != self._saved_confirm:
            write_confirm(self.config.store_path, value, self.log.last_index_within(value))
            self._saved_confirm = value

    def _save_confirm_later(self, value: int) -> None:
        """SaveConfirm: one save at a time (write_confirm's temp file has one name, so two at
        once could leave a torn file); one asked for meanwhile saves the newest value after."""
        self._confirm_to_save = value
        if self._saver is None and not self._stopping and value != self._saved_confirm:
            self._saver = self._spawn(self._save_confirms())

    async def _save_confirms(self) -> None:
        try:
            while (value := self._confirm_to_save) != self._saved_confirm:
                within = self.log.last_index_within(value)  # (the store is read on the loop only)
                try:
                    await asyncio.to_thread(write_confirm, self.config.store_path, value, within)
                except OSError as e:  # tried again at the next SaveConfirm
                    log.warning("broker %s: saving the confirm offset failed: %s", self.config.name, e)
                    return
                self._saved_confirm = value
        finally:
            self._saver = None

    # --- the epoch file ----------------------------------------------------------------------

    def _write_epochs_later(self) -> None:
        """Start the epoch-file writer if a change waits for it (one write at a time: the
        file's temp and `.bak` have one name each; each write is of the newest entries)."""
        if self.epochs.unwritten and self._epoch_writer is None and not self._stopping:
            self._epoch_writer = asyncio.get_running_loop().create_task(self._write_epochs())

    async def _write_epochs(self) -> None:
        """Write the epoch file off the event loop, in order of the changes (each write takes
        the newest snapshot: a later one holds every earlier change). Before each write the
        log is fsynced up to its end at the snapshot (the store's flush thread): a new
        master's epoch begins at its log's end, and its records are durable before the entry
        that starts after them (ReplicaState.change_role). What must not outrun the file
        waits for `written`: a new master's sends are refused until its entry is written
        (ReplicaState.send_refusal), a slave's packets after a change wait (`_epochs_written`).
        A failed write is tried again (meanwhile those stay held), at stop once more."""
        try:
            while self.epochs.unwritten:
                version, data = self.epochs.snapshot()
                end = self.store.end_index
                try:
                    if self._durable is not None:
                        await self._durable.wait(end)
                    await asyncio.to_thread(self.epochs.write, data)
                except Exception as e:
                    log.error("broker %s: writing the epoch file failed (tried again; sends and replication "
                              "wait): %s", self.config.name, e)
                    if self._stopping:
                        return
                    await asyncio.sleep(EPOCH_RETRY_S)
                    continue
                self.epochs.written_up_to(version)
                event, self._epochs_event = self._epochs_event, asyncio.Event()
                event.set()
        finally:
            self._epoch_writer = None

    async def _epochs_written(self) -> None:
        """Until the epoch file's changes made so far are on disk."""
        target = self.epochs.version
        while self.epochs.written < target:
            self._write_epochs_later()
            if self._stopping and self._epoch_writer is None:
                raise asyncio.CancelledError()  # (no writer at stop: the session ends)
            await self._epochs_event.wait()

    @property
    def role(self) -> BrokerRole:
        return self.replica.role

    @property
    def replica_info_queries(self) -> int:
        return self.agent.replica_info_queries

    # --- carrying out the agent's decisions ----------------------------------------------------

    def _feed(self, what: str, step: Callable[[], list[Effect]]) -> None:
        """Give the agent an input and carry out its effects. An exception (a bug: the agent
        handles the disk and store errors it expects) is logged here, not lost in a task or
        raised into the HA or transport callback that fed it; the agent's own bookkeeping
        keeps its chain, alter loop and heartbeats going after it."""
        if self._stopping:
            return
        try:
            effects = step()
        except Exception:
            log.exception("broker %s: the agent failed on %s", self.config.name, what)
            return
        self._run(effects)

    def _run(self, effects: list[Effect]) -> None:
        """Do what the agent decided, in order (one that fails does not stop the others);
        then write the epoch file if the input changed it (off the loop: `_write_epochs`)."""
        for e in effects:
            try:
                self._do(e)
            except Exception:
                log.exception("broker %s: carrying out %s failed", self.config.name, type(e).__name__)
        self._write_epochs_later()

    def _do(self, e: Effect) -> None:
        if self._stopping and isinstance(e, CallController | SendHeartbeat | Register | AwaitDurable):
            return  # (stop() cancelled the tasks: none starts after)
        match e:
            case SendDone(send_id, result):
                fut = self._sends.pop(send_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(result)
            case CallController(token, req):
                self._spawn(self._call(token, req))
            case SendHeartbeat(token, hb):
                self._spawn(self._beat(token, hb))
            case Register(token):
                self._spawn(self._register(token))
            case WakeHA():
                self.ha.wake()
            case ConfirmMoved():
                self.ha.wake()
                self._progress.set()
            case AwaitDurable(index):
                self._spawn(self._await_durable(index))
            case ResetHA():
                self.ha.reset()
                if self._slave_task is not None:
                    self._slave_task.cancel()
                    self._slave_task = None
            case FollowMaster(_, ha_address, client):
                if ha_address:
                    self._follow_master(ha_address, client)
            case SaveConfirm(offset):
                self._save_confirm_later(offset)

    async def _drive(self) -> None:
        """The agent's timers: ticked when it asks, at least every HOUSEKEEPING_S. Every timer
        of the broker hangs on this loop, so nothing ends it but stop()."""
        while True:
            wait_ms = int(HOUSEKEEPING_S * 1000)
            try:
                now = now_ms()
                self._feed("tick", functools.partial(self.agent.tick, now))
                wait_ms = min(max(self.agent.next_tick_at() - now, 1), wait_ms)
            except Exception:
                log.exception("broker %s: the agent's timers failed", self.config.name)
            await asyncio.sleep(wait_ms / 1000)

    def _drive_ended(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            log.error("broker %s: the agent's timer loop ended (%s): no more retries, polls or heartbeats",
                      self.config.name, task.exception())

    async def _call(self, token: int, req: cm.Request) -> None:
        if isinstance(req, cm.ElectMaster):  # (when asked, for the controller's log)
            req = msgspec.structs.replace(req, invoke_time=int(time.time() * 1000))
        resp: cm.Response | None = None
        try:
            resp = await self.controller.call(req)
        except DLedgerError as e:
            log.debug("broker %s: %s: no answer (%s)", self.config.name, type(req).__name__, e.message)
        except Exception:  # a bug: the agent still gets its answer (none), or it would wait forever
            log.exception("broker %s: %s failed", self.config.name, type(req).__name__)
        self._feed(type(req).__name__, lambda: self.agent.answered(token, now_ms(), resp))

    async def _beat(self, token: int, hb: cm.BrokerHeartbeat) -> None:
        answers: list[cm.Response] = []
        try:
            answers = await self.controller.heartbeat(hb, timeout=self.config.heartbeat_interval_ms * 3 / 1000)
        except Exception:  # (a bug: as in _call)
            log.exception("broker %s: heartbeat failed", self.config.name)
        self._feed("a heartbeat's answers", lambda: self.agent.heartbeat_answered(token, now_ms(), answers))

    async def _register(self, token: int) -> None:
        """One registration pass (identity files, id application, REGISTER_BROKER)."""
        ok = False
        try:
            ok = await self.registration.register(self.controller)
        except DLedgerError as e:
            log.info("broker %s: controller not reachable yet: %s", self.config.name, e.message)
        except OSError as e:  # an identity file could not be written: registered again later
            log.error("broker %s: registering failed: %s", self.config.name, e)
        except Exception:  # (a bug: as in _call)
            log.exception("broker %s: registering failed", self.config.name)
        resp = self.registration.response if ok else None
        self._feed("a registration", lambda: self.agent.register_answered(token, now_ms(),
                                                                           self.registration.broker_id, resp))

    async def _await_durable(self, index: int) -> None:
        try:
            if self._durable is not None:
                await self._durable.wait(index)
        except Exception as e:  # the sends waiting for it get an answer (as a send's own error did)
            log.exception("broker %s: waiting for the fsync of entry %d failed", self.config.name, index)
            error = e if isinstance(e, DLedgerError) else DLedgerError(ResponseCode.INTERNAL_ERROR,
                                                                        f"{type(e).__name__}: {e}")
            self._feed("a failed fsync", lambda: self.agent.durable_failed(now_ms(), index, error))
            return
        self._feed("an fsync", lambda: self.agent.durable(now_ms(), index))

    def _follow_master(self, ha_address: str, client: SlaveClient) -> None:
        client.defer_cuts = True  # the runner cuts the log in a worker thread (SlaveRunner)
        durable = self._durable.wait if client.ack_durable and self._durable is not None else None
        runner = SlaveRunner(client, ha_address, self._on_slave_progress, self._client_ssl, durable=durable,
                             faults=self.faults, broker_set=self.config.name, epochs_written=self._epochs_written)
        self._slave_task = asyncio.get_running_loop().create_task(runner.run())

    def _on_slave_progress(self) -> None:
        self._feed("the master's progress", lambda: self.agent.slave_progress(now_ms()))

    def _on_proposal(self, proposal: frozenset[int]) -> None:
        self._feed("a SyncStateSet proposal", lambda: self.agent.proposal(now_ms()))

    def _on_slave_ack(self) -> None:
        self._feed("a slave's ack", lambda: self.agent.slave_acked(now_ms()))

    def _on_unknown_slave(self) -> None:
        self._feed("an unknown slave", lambda: self.agent.hint(now_ms()))

    # --- client requests ---------------------------------------------------------------------

    def _handlers(self) -> dict[int, Callable[[Message, Respond, Caller], None]]:
        """Every request code a broker serves (each has its roles in BROKER_ACCESS)."""
        return {
            RequestCode.SEND_MESSAGE: lambda msg, respond, _: self._spawn(self._answer(self._send(msg),
                                                                                                  respond)),
            RequestCode.PULL_MESSAGE: lambda msg, respond, caller: self._spawn(
                self._answer(self._pull(msg, caller), respond)),
            RequestCode.GET_BROKER_RUNTIME_INFO: lambda _, respond, __: respond(
                Message(int(ResponseCode.SUCCESS), bm.encode(self.runtime_info()))),
            RequestCode.GET_BROKER_EPOCH_CACHE: lambda _, respond, __: respond(
                Message(int(ResponseCode.SUCCESS), bm.encode(self.epoch_cache()))),
            NOTIFY: lambda msg, respond, caller: respond(self._notify(msg, caller)),
            RequestCode.BROKER_FAULT: lambda msg, respond, _: respond(self._fault(msg)),
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
        self._feed("a NOTIFY", lambda: self.agent.hint(now_ms()))  # (before a role is taken: asked once following)
        return Message(int(ResponseCode.SUCCESS), cm.encode(cm.Response()))

    def _fault(self, msg: Message) -> Message:
        if self.faults is None:
            return _error(ResponseCode.UNSUPPORTED, "fault injection is off (--enable-fault-injection)")
        try:
            req = bm.fault_request.decode(msg.meta)
        except bm.DECODE_ERRORS as e:
            return _error(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed FAULT: {e}")
        self.faults.unblock_all()
        if req.blocked:
            self.faults.block(req.blocked)
        self.faults.ha_paused, self.faults.ha_cut = req.ha_paused, req.ha_cut
        log.warning("broker %s: faults: blocked %s, HA paused %s, HA cut %s", self.config.name, req.blocked,
                    req.ha_paused, req.ha_cut)
        return Message(int(ResponseCode.SUCCESS), bm.encode(bm.FaultResponse()))

    async def _send(self, msg: Message) -> Message:
        try:
            req = bm.send_request.decode(msg.meta)
        except bm.DECODE_ERRORS as e:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed send: {e}") from None
        if req.broker_name and req.broker_name != self.config.name:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"this is broker {self.config.name}, "
                               f"not {req.broker_name}")
        send_id = next(self._send_ids)
        fut: asyncio.Future[bm.SendResponse | DLedgerError] = asyncio.get_running_loop().create_future()
        self._sends[send_id] = fut
        try:
            self._run(self.agent.send(send_id, req.bodies, now_ms()))
            result = await fut
        finally:
            self._sends.pop(send_id, None)
        if isinstance(result, DLedgerError):
            raise result
        return Message(int(ResponseCode.SUCCESS), bm.encode(result))

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
        left = max(0, r.lease_until_ms - now_ms()) if self.role == BrokerRole.MASTER else 0
        sss = r.master_ha.tracker.effective if r.master_ha is not None else r.sync_state_set
        confirm = r.confirm_offset
        broker_id = self.registration.broker_id  # (live: the agent learns it when a registration pass ends)
        return bm.RuntimeInfo(self.config.cluster, self.config.name, broker_id, self.role.value,
                              r.master_epoch, r.master_id, r.master_address, sorted(sss),
                              r.sync_state_set_epoch, self.log.max_offset, confirm,
                              self.store.end_index, left, r.truncated_at,
                              broker_id != -1 and self.role != BrokerRole.FENCED,
                              self.store.begin_index, self.log.last_index_within(confirm),
                              self.replica_info_queries, self.security, slaves=self._slaves(sss))

    def _slaves(self, sss: frozenset[int] | set[int] | list[int]) -> list[bm.SlaveProgress]:
        """A master's slaves with their acks and lag as it sees them (none on a slave)."""
        ha = self.replica.master_ha
        if ha is None:
            return []
        top = self.log.max_offset
        return [bm.SlaveProgress(i, ack, max(0, top - ack) if ack >= 0 else top, i in sss, learner)
                for i, ack, learner in ha.slaves()]

    def epoch_cache(self) -> bm.EpochCache:
        """GET_BROKER_EPOCH_CACHE (upstream's EpochEntryCache): this replica's epoch entries
        and max offset; the last entry's end is the max offset (as mqadmin's getBrokerEpoch
        prints it: in the file it has none)."""
        top = self.log.max_offset
        ranges = [bm.EpochRange(e.epoch, e.start, e.end) for e in self.epochs.with_last_end(top)]
        return bm.EpochCache(self.config.cluster, self.config.name, self.registration.broker_id, ranges, top)
