"""DLedgerServer: drives core.Node with real time, real disks and real sockets.

One process may serve several groups (one `GroupRuntime` each) behind one TCP
listener; requests are routed by their `group` field. Incoming requests are
handed to the node in arrival order, before any await, so a leader's pushes
are applied in the order it sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

import msgspec

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig, Peer
from dledger.core.messages import (
    DECODE_ERRORS,
    FAULT,
    FaultRequest,
    SimpleResponse,
    decode_request,
    decode_response,
    encode,
)
from dledger.core.node import Node, Reply, Send
from dledger.runtime.metrics import Metrics
from dledger.runtime.transport import (
    FaultInjector,
    Message,
    Respond,
    TransportClient,
    TransportServer,
    encode_error,
)
from dledger.store import open_store

log = logging.getLogger(__name__)

TICK_S = 0.01
FAULT_DISABLED = "fault injection is disabled on this member; start it with --enable-fault-injection"


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class GroupRuntime:
    """One member of one group: its Node, store, ticker and outgoing requests."""

    def __init__(self, cfg: DLedgerConfig, client: TransportClient, faults: FaultInjector,
                 metrics: Metrics | None = None) -> None:
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        self.client = client
        self.faults = faults
        self.peers: dict[str, Peer] = cfg.peer_map
        self.store = open_store(cfg)
        self.node = Node(cfg, self.store, now_ms())
        self.blocked_ids: set[str] = set()
        self._tokens = itertools.count()
        self._waiting: dict[int, Respond] = {}  # token -> how to answer that request
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
            self.store.fsync_observer = metrics.fsync_latency.labels(*labels).observe
            metrics.nodes.append(self.node)

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
        self.node.on_durable(durable, now_ms())
        self._execute()

    def handle(self, code: int, req: msgspec.Struct, data: memoryview | bytes | bytearray, respond: Respond) -> None:
        """Give a request to the node at once (arrival order is processing order); its
        answer goes to `respond` when the node emits it (see _execute)."""
        sender = getattr(req, "leader_id", "")
        if sender and sender in self.blocked_ids:
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "dropped by fault injection")
        token = next(self._tokens)
        if self.metrics is not None and code == RequestCode.APPEND:
            respond = self._observed(req, respond)
        self._waiting[token] = respond
        self.node.handle(code, req, data, token, now_ms())  # type: ignore[arg-type]
        self._schedule_drain()

    def _observed(self, req: msgspec.Struct, respond: Respond) -> Respond:
        """`respond`, also recording the latency, batch size and bytes of a successful append."""
        started = time.perf_counter()

        def done(resp: Message) -> None:
            if resp.code == ResponseCode.SUCCESS:
                bodies = req.bodies  # type: ignore[attr-defined]
                self._m_latency.observe(time.perf_counter() - started)
                self._m_batch.observe(len(bodies))
                self._m_bytes.inc(sum(map(len, bodies)))
            respond(resp)

        return done

    def _schedule_drain(self) -> None:
        """Run the node's actions once per loop iteration: concurrent requests then
        share pushes to followers (batching)."""
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self.loop.call_soon(self._execute)

    def _execute(self) -> None:
        self._drain_scheduled = False
        for action in self.node.drain():
            if isinstance(action, Reply):
                respond = self._waiting.pop(action.token, None)
                if respond is not None:
                    code = getattr(action.msg, "code", ResponseCode.SUCCESS)
                    respond(Message(int(code), encode(action.msg), action.data))
            else:
                self._spawn(self._send(action))

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, a: Send) -> None:
        resp: msgspec.Struct | None = None
        if a.peer not in self.blocked_ids:
            peer = self.peers[a.peer]
            try:
                raw = await self.client.request(peer.address, Message(a.code, encode(a.msg), a.data),
                                                a.timeout_ms / 1000)
                if raw.code != ResponseCode.NETWORK_ERROR:
                    resp = decode_response(a.code, raw.meta)
            except DLedgerError:
                resp = None
            except DECODE_ERRORS:
                log.warning("%s: undecodable answer from %s to %d", self.cfg.self_id, a.peer, a.code)
        self.node.on_response(a.ctx, resp, now_ms())
        self._execute()

    def set_faults(self, blocked: list[str]) -> None:
        """Test hook: drop all traffic to and from these member ids (both directions
        need the hook on both sides, which the fault tools do)."""
        self.blocked_ids = set(blocked)
        self.faults.unblock_all()
        addresses = [self.peers[b].address for b in blocked if b in self.peers]
        if addresses:
            self.faults.block(addresses)
        log.warning("%s/%s: fault injection blocks %s", self.cfg.group, self.cfg.self_id, sorted(blocked))


class DLedgerServer:
    """Serves one or more groups on the address this member has in `peers`."""

    def __init__(self, configs: DLedgerConfig | list[DLedgerConfig]) -> None:
        self.configs = [configs] if isinstance(configs, DLedgerConfig) else list(configs)
        if not self.configs:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "no group to serve")
        addresses = {c.peer_map[c.self_id].address for c in self.configs}
        if len(addresses) != 1:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"groups listen on different addresses: {addresses}")
        self.address = addresses.pop()
        self.groups: dict[str, GroupRuntime] = {}
        self.faults = FaultInjector()
        self.client: TransportClient | None = None
        self.server: TransportServer | None = None
        self._decoders: dict[int, Any] = {}
        port = next((c.metrics_port for c in self.configs if c.metrics_port), 0)
        self.metrics = Metrics() if port else None
        self.metrics_port = port

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
        max_frame = max(c.max_frame_bytes for c in self.configs)
        self.client = TransportClient(max_frame_bytes=max_frame, faults=self.faults)
        for cfg in self.configs:
            if cfg.group in self.groups:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"group {cfg.group} configured twice")
            self.groups[cfg.group] = GroupRuntime(cfg, self.client, self.faults, self.metrics)
        for g in self.groups.values():
            await g.start()
        self.server = TransportServer(direct=self._handle, max_frame_bytes=max_frame)
        host, _, port = self.address.rpartition(":")
        await self.server.start(host, int(port))
        if self.metrics is not None:
            self.metrics.serve(self.metrics_port)
        log.info("serving groups %s on %s", sorted(self.groups), self.address)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close()
        for g in self.groups.values():
            await g.stop()
        if self.client is not None:
            await self.client.close()

    def node(self, group: str = "default") -> Node:
        return self.groups[group].node

    def _handle(self, msg: Message, respond: Respond) -> None:
        try:
            req = decode_request(msg.code, msg.meta)
        except KeyError:
            respond(_error(ResponseCode.UNSUPPORTED, f"unknown request code {msg.code}"))
            return
        except DECODE_ERRORS as e:
            respond(_error(ResponseCode.UNEXPECTED_ARGUMENT, f"malformed request {msg.code}: {e}"))
            return
        g = self.groups.get(req.group)
        if g is None:
            respond(_error(ResponseCode.UNKNOWN_GROUP, f"no group {req.group!r} here"))
        elif msg.code == FAULT:
            # any client can send FAULT: obeying it lets anyone partition the group, so
            # only a member started for tests or chaos runs does
            assert isinstance(req, FaultRequest)
            if not g.cfg.enable_fault_injection:
                log.warning("%s/%s: refused a FAULT request (fault injection is disabled)",
                            g.cfg.group, g.cfg.self_id)
                respond(_error(ResponseCode.UNSUPPORTED, FAULT_DISABLED))
                return
            g.set_faults(req.blocked)
            respond(Message(200, encode(SimpleResponse(200))))
        else:
            g.handle(msg.code, req, msg.data, respond)


def _error(code: ResponseCode, text: str) -> Message:
    return Message(int(code), encode(SimpleResponse(int(code), message=text)))


async def serve_forever(configs: DLedgerConfig | list[DLedgerConfig], stop: asyncio.Event) -> None:
    """Run a server until `stop` is set (the CLI sets it on SIGINT/SIGTERM)."""
    server = DLedgerServer(configs)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()


__all__ = ["DLedgerServer", "GroupRuntime", "RequestCode", "serve_forever"]
