"""AutoSwitch HA on asyncio streams: the master's listener and the slave's connection loop.

All protocol decisions are in the sans-I/O classes (ha_master, ha_slave, ha_service); this
module only moves bytes and time. The master writes to a slave from one task per
connection, woken when the log grows or the confirm offset moves, and waits for the socket
to drain before reading more of the log (flow control: a slow slave holds one buffer, not
the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable

from dledger.address import parse_address
from dledger.broker.ha_master import HAProtocolError, UnknownSlave
from dledger.broker.ha_packets import PacketError
from dledger.broker.ha_service import MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.clock import now_ms
from dledger.codes import DLedgerError
from dledger.ratelog import RateLimitedLog
from dledger.runtime.faults import FaultInjector
from dledger.security.peer_uid import not_local
from dledger.security.roles import AccessRole, cert_principal, expect_role

log = logging.getLogger(__name__)

READ_BYTES = 4 << 20
MAX_CONNECTIONS = 64  # slaves of one master; more is a flood
HANDSHAKE_S = 5.0  # a connection that has not handshaken by then is closed
WRITE_BYTES = 1 << 20  # transfer body per wake-up before draining
RETRY_S = 0.2
HA_ERRORS = (HAProtocolError, PacketError, DLedgerError, OSError, ConnectionError)
# the ways a connection dies (ssl.SSLError is an OSError; IncompleteReadError: a stream cut mid-frame)
CONNECTION_DIED = (*HA_ERRORS, asyncio.IncompleteReadError)


class HAListener:
    """The master's HA port. `master()` is the current MasterHA (None: not master, refuse);
    `on_proposal` takes a SyncStateSet to propose, `on_ack` runs after every slave ack."""

    def __init__(self, master: Callable[[], MasterHA | None], on_proposal: Callable[[frozenset[int]], None],
                 on_ack: Callable[[], None], ssl_context: ssl.SSLContext | None = None, *, broker_set: str = "",
                 loopback_only: bool = False, on_unknown_slave: Callable[[], None] = lambda: None,
                 faults: FaultInjector | None = None) -> None:
        """With TLS only replicas of `broker_set` may connect (their certificates say so), each
        handshaking as the id bound to its certificate (MasterConnection); without it,
        `loopback_only` serves loopback addresses only (docs/security.md). `on_unknown_slave`:
        a handshake named an id with no known binding (refresh them from the controller).
        `faults` (--enable-fault-injection only): its `ha_paused` sends nothing to the slaves."""
        self._master, self._on_proposal, self._on_ack = master, on_proposal, on_ack
        self._on_unknown_slave = on_unknown_slave
        self._ssl = ssl_context
        self.broker_set = broker_set
        self.loopback_only = loopback_only
        self._warn = RateLimitedLog(log).warning
        self._note = RateLimitedLog(log).info
        self._server: asyncio.Server | None = None
        self._wakers: set[asyncio.Event] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._faults = faults

    async def start(self, address: str) -> None:
        host, port = parse_address(address, "HA address")
        self._server = await asyncio.start_server(self._serve, host, port, ssl=self._ssl,
                                                  ssl_handshake_timeout=HANDSHAKE_S if self._ssl else None)

    async def close(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def wake(self) -> None:
        """The log grew or the confirm offset moved: writers look again."""
        for w in self._wakers:
            w.set()

    def reset(self) -> None:
        """Close every slave connection (an epoch or role change: they handshake again, #9689)."""
        for w in list(self._writers):
            w.close()

    def refusal(self, writer: asyncio.StreamWriter) -> str | None:
        """Why this connection may not be a slave here (None: it may)."""
        peer = writer.get_extra_info("peername")
        if self._ssl is not None:
            principal = cert_principal(writer.get_extra_info("peercert"))
            return expect_role(AccessRole.BROKER, self.broker_set)(str(peer), principal)
        if self.loopback_only:
            why = not_local(writer.get_extra_info("sockname"), peer)
            return None if why is None else f"{peer}: {why}"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        problem = self.refusal(writer)
        if problem is not None:  # (who it is, before whether we are master: a refusal is a refusal)
            self._warn("refused", "HA connection refused: %s", problem)
            writer.close()
            return
        ha = self._master()
        if ha is None or len(self._writers) >= MAX_CONNECTIONS:
            writer.close()
            return
        key, wake = object(), asyncio.Event()
        principal = cert_principal(writer.get_extra_info("peercert")).name if self._ssl is not None else None
        peer = writer.get_extra_info("peername")
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        self._wakers.add(wake)
        self._writers.add(writer)
        try:
            ha.opened(key, now_ms(), principal)
            tasks = [loop.create_task(self._read_loop(ha, key, reader, wake)),
                     loop.create_task(self._write_loop(ha, key, writer, wake))]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)  # either ends the session
        finally:
            # every exit path (an error in either loop, of any type; this task cancelled) runs
            # the clean-up, the proposal first: a dead slave must leave the SyncStateSet even if
            # what follows fails, or an all-ack master acknowledges nothing until housekeeping
            for t in tasks:
                t.cancel()
            lost = writer.transport.is_closing()  # (before we close it: closed under the session)
            self._wakers.discard(wake)
            self._writers.discard(writer)
            writer.close()
            proposal = ha.closed(key)
            if proposal is not None and ha is self._master():
                self._on_proposal(proposal)
            if tasks:
                await asyncio.wait(tasks)  # (cancelled: they end at their next await)
                self._report(peer, lost, tasks)

    def _report(self, peer: object, lost: bool, tasks: list[asyncio.Task[None]]) -> None:
        """Log why a slave's session ended, once: the first error of its loops (the other one
        usually fails the same way, or was cancelled by the clean-up). `lost`: the transport
        had closed before the clean-up closed it."""
        errors = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
        if not errors:
            return  # the slave closed it, or this master stopped being one
        e = errors[0]
        if isinstance(e, UnknownSlave):
            self._note("unknown slave", "HA connection from %s refused: %s (asking the controller)", peer, e)
            self._on_unknown_slave()
        elif isinstance(e, CONNECTION_DIED) or (isinstance(e, RuntimeError) and lost):
            # (uvloop raises RuntimeError for a write to a transport that closed under the loop)
            log.warning("HA connection from %s closed: %s", peer, e)
        else:
            log.error("HA connection from %s failed", peer, exc_info=e)

    async def _read_loop(self, ha: MasterHA, key: object, reader: asyncio.StreamReader, wake: asyncio.Event) -> None:
        deadline = asyncio.get_running_loop().time() + HANDSHAKE_S
        while True:
            try:
                async with asyncio.timeout(ha.config.housekeeping_ms / 1000):
                    data = await reader.read(READ_BYTES)
            except TimeoutError:
                raise HAProtocolError("the slave was silent for the housekeeping interval") from None
            conn = ha.connections.get(key)
            if conn is not None and conn.slave_id == -1 and asyncio.get_running_loop().time() > deadline:
                raise HAProtocolError(f"no handshake within {HANDSHAKE_S:.0f} s")
            if not data or ha is not self._master():
                return
            proposal = ha.on_data(key, data, now_ms())
            if proposal is not None:
                self._on_proposal(proposal)
            self._on_ack()
            wake.set()

    async def _write_loop(self, ha: MasterHA, key: object, writer: asyncio.StreamWriter, wake: asyncio.Event) -> None:
        while True:
            conn = ha.connections.get(key)
            if conn is None:
                return
            paused = self._faults is not None and self._faults.ha_paused
            frames = [] if paused else conn.output(now_ms(), ha.confirm_offset, WRITE_BYTES)
            if frames:
                writer.writelines(frames)
                await writer.drain()
            if not conn.pending or not frames:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(ha.config.heartbeat_ms / 2000):
                        await wake.wait()


async def _finish(work: Awaitable[None]) -> None:
    """Await `work` (a worker thread's), to its end even if cancelled: a thread cannot be
    stopped, and a cancelled caller (stop(), a role change) must not race it."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


class SlaveRunner:
    """A slave's connection to its master's HA port, reconnecting until cancelled;
    `on_progress` runs after every frame that changed the log or the confirm offset."""

    def __init__(self, client: SlaveClient, master_ha_address: str, on_progress: Callable[[], None],
                 ssl_context: ssl.SSLContext | None = None,
                 durable: Callable[[int], Awaitable[None]] | None = None,
                 faults: FaultInjector | None = None, broker_set: str = "",
                 epochs_written: Callable[[], Awaitable[None]] | None = None) -> None:
        """With TLS, the master's certificate must be a replica of `broker_set`. `faults`
        (--enable-fault-injection only): while its `ha_cut` holds, no connection to the master.
        `epochs_written`: waits until the epoch file's changes so far are on disk (written off
        the event loop; the client holds back the packets that must follow them)."""
        self._epochs_written = epochs_written
        self.client, self.address, self._on_progress, self._ssl = client, master_ha_address, on_progress, ssl_context
        self.broker_set = broker_set
        self._warn = RateLimitedLog(log).warning
        self._durable = durable  # waits until an entry is fsynced (acks of durable bytes only)
        self._faults = faults

    async def run(self) -> None:
        host, port = parse_address(self.address, "the master's HA address")
        while True:
            if self._cut():
                await asyncio.sleep(RETRY_S)
                continue
            try:
                async with asyncio.timeout(2.0):
                    reader, writer = await asyncio.open_connection(host, port, ssl=self._ssl)
            except (OSError, TimeoutError) as e:
                log.debug("HA connect to %s failed: %s", self.address, e)
                await asyncio.sleep(RETRY_S)
                continue
            try:
                self._check_master(writer)
                await self._session(reader, writer)
            except CONNECTION_DIED as e:  # (again every RETRY_S while it lasts: an operator's case among them)
                self._warn("closed", "HA connection to master %s closed: %s", self.address, e)
            except RuntimeError as e:  # uvloop: a write to a transport that closed under the session
                if not writer.transport.is_closing():
                    raise
                self._warn("closed", "HA connection to master %s closed: %s", self.address, e)
            finally:
                self.client.disconnected()
                writer.close()
            await asyncio.sleep(RETRY_S)

    def _cut(self) -> bool:
        return self._faults is not None and self._faults.ha_cut

    def _check_master(self, writer: asyncio.StreamWriter) -> None:
        if self._ssl is None:
            return
        problem = expect_role(AccessRole.BROKER, self.broker_set)(self.address,
                                                          cert_principal(writer.get_extra_info("peercert")))
        if problem is not None:
            raise HAProtocolError(f"not the master's HA port: {problem}")

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        c = self.client
        writer.writelines(c.connected(now_ms()))
        await writer.drain()
        tick_s = min(c.config.heartbeat_ms, c.config.handshake_retry_ms) / 2000
        while True:
            data = b""
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick_s):
                    data = await reader.read(READ_BYTES)
                    if not data:
                        return  # the master closed it
            if self._cut():
                raise HAProtocolError("cut off from the master (fault injection)")
            now = now_ms()
            before = (c.log.max_offset, c.confirm_offset)
            out = (c.receive(data, now) if data else []) + c.tick(now)
            while c.waiting and self._epochs_written is not None:
                if c.cut_wanted is not None:
                    # the log is cut (zeroed, fsynced: the store's locks keep the loop's readers
                    # out meanwhile) before the handshake answer is acted on and anything
                    # after it appended; no role change happens meanwhile (ReplicaState)
                    cut = c.cut_wanted[0]
                    try:
                        await _finish(asyncio.to_thread(c.log.truncate_to, cut))
                    finally:  # (cancelled once the thread ended, or failed: whatever the log says)
                        if c.log.max_offset <= cut:
                            c.cut_made()
                        else:
                            c.cut_wanted = None
                else:
                    # the epoch file's change (a truncation's, a new epoch's entry) is on disk
                    # before the records after it are appended and acked (SlaveClient.receive)
                    await self._epochs_written()
                out += c.receive(b"", now_ms())
            if self._durable is not None and c.log.durable_offset < c.log.max_offset:
                await self._durable(c.log.end_index)
                out += c.ack_if_grew(now_ms())
            if c.expired(now):
                raise HAProtocolError("the master was silent for the housekeeping interval")
            if out:
                writer.writelines(out)
                await writer.drain()
            if (c.log.max_offset, c.confirm_offset) != before:
                self._on_progress()
