"""Clients of a broker set: `AsyncBrokerClient` and the blocking `BrokerClient`.

The master comes from the controllers (replica info); a send refused before it was written
(SERVICE_NOT_AVAILABLE: not the master, fenced, lease expired) or that never left this
process is retried at the master the controllers name next, until the timeout. A send that
may have been written (FLUSH_SLAVE_TIMEOUT, a connection lost mid-request, no answer) is not
retried: the caller decides (at-least-once if it resends), and the error says the outcome
is unknown. Reads return confirmed records only, from the master or, when it does not
answer, any replica. Offsets of reads are queue offsets: the record's index in the broker
set's log (a send's `offset` is its byte position).

A master that does not answer (a hung process whose kernel still accepts connections) is
left as DLedgerClient leaves a hung leader: while a request waits at the master the client
asks the controllers about once a second who is master, and stops waiting once they name
another master or a higher master epoch; a master that did not answer (a timeout, a
connection lost mid-request) is forgotten, so the next call asks the controllers first,
and is suspect for a few seconds: while the controllers still name it, it gets a cheap
probe (runtime info) before any send, so a hung master costs a send at most once. A read
at the master is watched the same way (a long poll only once its wait has passed), then
asked of the other replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dledger.broker import messages as bm
from dledger.broker.config import split_address
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.controller.client import ControllerClient
from dledger.runtime.blocking import LoopThread
from dledger.runtime.client import error_text, never_sent
from dledger.runtime.coalesce import Coalescer
from dledger.runtime.transport import Message, TransportClient
from dledger.security.roles import AccessRole, expect_role
from dledger.security.tls import TlsConfig, client_context

T = TypeVar("T")
RETRY_S = 0.05
WATCH_S = 1.0  # how often a request waiting at the master asks the controllers whether it still is
SUSPECT_S = 5.0  # a master that did not answer gets a probe before a send, until it answers or this ends
PROBE_S = 1.0  # a suspect master's probe (runtime info: changes nothing)
_RETRY = frozenset((ResponseCode.SERVICE_NOT_AVAILABLE,))
_UNANSWERED = frozenset((ResponseCode.TIMEOUT, ResponseCode.NETWORK_ERROR))  # the transport's: no answer


@dataclass(frozen=True)
class SendResult:
    offset: int  # byte position of the record in the set's log
    index: int  # its queue offset
    epoch: int  # the master epoch it was written in


@dataclass(frozen=True)
class BrokerRecord:
    index: int
    offset: int
    epoch: int
    body: bytes


class AsyncBrokerClient:
    """`tls`: the certificate a deployment run with TLS wants (brokers and controllers).

    `send` calls made while others are being prepared (in the same loop iteration) travel
    together as one SEND_MESSAGE (`coalesce`, runtime.coalesce, as AsyncDLedgerClient's
    appends), each caller still getting its own offset and index; they share the request's
    fate: all are written or none, and a send whose outcome is unknown (a timeout, a
    connection lost mid-request) is unknown for every caller in it. `send_batch` is always
    exactly one request."""

    def __init__(self, controller: str, broker: str, timeout: float = 10.0, tls: TlsConfig | None = None,
                 coalesce: bool = True, max_coalesced_bytes: int = 1 << 20) -> None:
        self.broker, self.timeout = broker, timeout
        self.coalesce = coalesce
        # one SEND_MESSAGE carries at most MAX_BATCH bodies (the broker refuses more)
        self._coalescer: Coalescer[SendResult] = Coalescer(self._send_coalesced, max_coalesced_bytes,
                                                           bm.MAX_BATCH, "send")
        self.controllers = ControllerClient(controller, timeout=min(timeout, 3.0), tls=tls)
        self._transport = TransportClient(backoff_max_s=0.5, ssl=client_context(tls) if tls else None,
                                          server_check=expect_role(AccessRole.BROKER, broker))
        self._master: str | None = None  # client address
        self._epoch = 0  # the master epoch the controllers named with it
        self._replicas: list[str] = []
        self._suspects: dict[str, float] = {}  # address -> monotonic time its suspicion ends

    async def close(self) -> None:
        await self._transport.close()
        await self.controllers.close()

    async def __aenter__(self) -> AsyncBrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- where the replicas are ----------------------------------------------------------------

    async def master(self, refresh: bool = False) -> str | None:
        """The master's client address as the controllers know it (None: no master now)."""
        if self._master is None or refresh:
            resp = await self.controllers.get_replica_info(self.broker)
            if resp.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"no broker set named {self.broker!r}")
            self._master = split_address(resp.master_address)[0] if resp.master_address else None
            self._epoch = resp.master_epoch or 0
        return self._master

    def _forget(self, address: str) -> None:
        """`address` did not answer: the next call asks the controllers first, and probes it
        before sending while they still name it."""
        if self._master == address:
            self._master = None
        self._suspects[address] = time.monotonic() + SUSPECT_S

    def _is_suspect(self, address: str) -> bool:
        until = self._suspects.get(address)
        if until is not None and until <= time.monotonic():
            del self._suspects[address]  # expired: a resumed master is used again
            return False
        return until is not None

    async def _answers(self, address: str, timeout: float) -> bool:
        """Whether a suspect replica answers a request that changes nothing (it clears the suspicion)."""
        msg = Message(int(RequestCode.GET_BROKER_RUNTIME_INFO), bm.encode(bm.RuntimeInfoRequest()))
        try:
            await self._transport.request(address, msg, timeout)
        except DLedgerError:
            return False
        self._suspects.pop(address, None)
        return True

    async def _deposed(self, address: str, epoch: int) -> bool:
        """Whether the controllers now name another master than `address` (at `epoch`), or a
        higher master epoch. No answer, or no master named (an election under way): not yet."""
        try:
            resp = await self.controllers.get_replica_info(self.broker)
        except DLedgerError:
            return False
        named = split_address(resp.master_address)[0] if resp.master_address else None
        if named is None:
            return False
        new_epoch = resp.master_epoch or 0
        if named == address and new_epoch <= epoch:
            return False
        self._master, self._epoch = named, new_epoch
        return True

    async def _watched(self, address: str, epoch: int, msg: Message, timeout: float, grace: float = 0.0) -> Message:
        """`msg` at the master `address`, abandoned (TIMEOUT) once the controllers name
        another master: asked every WATCH_S while the request waits, as a hung master keeps
        its connections open but never answers. `grace`: how long the master may rightly
        hold the request (a long poll's wait), before which nobody is asked."""
        request: asyncio.Future[Message] = asyncio.ensure_future(self._transport.request(address, msg, timeout))
        check: asyncio.Future[bool] | None = None
        quiet = grace + WATCH_S
        try:
            while not request.done():
                if check is None:
                    await asyncio.wait([request], timeout=quiet)
                    quiet = WATCH_S
                    if not request.done():
                        check = asyncio.ensure_future(self._deposed(address, epoch))
                    continue
                either: list[asyncio.Future[Any]] = [request, check]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if request.done():
                    break
                if check.result():
                    raise DLedgerError(ResponseCode.TIMEOUT, f"{address} did not answer and the controllers "
                                       f"now name master {self._master} (epoch {self._epoch})")
                check = None
            return request.result()
        finally:
            for f in (request, check):
                if f is not None and not f.done():
                    f.cancel()

    async def replicas(self) -> list[str]:
        """Every replica's client address (the master first)."""
        resp = await self.controllers.get_sync_state_data([self.broker])
        info = (resp.replicas_info or {}).get(self.broker)
        if info is None:
            return self._replicas
        ids = sorted([*info.in_sync_replicas, *info.not_in_sync_replicas],
                     key=lambda r: r.broker_id != info.master_broker_id)
        self._replicas = [split_address(r.broker_address)[0] for r in ids]
        return self._replicas

    # --- sends ---------------------------------------------------------------------------------

    async def send(self, body: bytes) -> SendResult:
        if not self.coalesce:
            return (await self.send_batch([body]))[0]
        return await self._coalescer.submit(bytes(body))

    @property
    def send_requests(self) -> int:
        """SEND_MESSAGE requests the coalesced `send` calls went out in (tests, benchmarks)."""
        return self._coalescer.batches

    async def _send_coalesced(self, bodies: list[bytes]) -> list[SendResult | DLedgerError]:
        """One request for the bodies of several callers. Refused as a whole for a bad
        argument (nothing was written), each body is sent alone, so only the caller at fault
        gets the error."""
        try:
            return list(await self.send_batch(bodies))
        except DLedgerError as e:
            if e.code != ResponseCode.UNEXPECTED_ARGUMENT or len(bodies) == 1:
                raise
        return list(await asyncio.gather(*(self._send_one(b) for b in bodies)))

    async def _send_one(self, body: bytes) -> SendResult | DLedgerError:
        try:
            return (await self.send_batch([body]))[0]
        except DLedgerError as e:
            return e

    async def send_batch(self, bodies: Sequence[bytes]) -> list[SendResult]:
        """Append `bodies` as one batch at the master; acknowledged per its ack settings."""
        if not bodies:
            return []
        meta = bm.encode(bm.SendRequest(self.broker, list(bodies)))
        resp = await self._call_master(Message(int(RequestCode.SEND_MESSAGE), meta))
        r = _checked(bm.send_response.decode(resp.meta))
        return [SendResult(off, r.first_index + i, r.epoch) for i, off in enumerate(r.offsets)]

    async def _call_master(self, msg: Message) -> Message:
        """`msg` at the master, within `timeout`: sent again only while it certainly was not
        written (refused, never sent); a request that got no answer raises, its outcome unknown."""
        deadline = time.monotonic() + self.timeout
        refresh = False
        last: DLedgerError | None = None
        while time.monotonic() < deadline:
            try:
                address = await self.master(refresh)
            except DLedgerError as e:
                if e.code == ResponseCode.UNEXPECTED_ARGUMENT:
                    raise
                address, last = None, e
            if address is not None and self._is_suspect(address) and not await self._answers(
                    address, min(PROBE_S, max(0.1, deadline - time.monotonic()))):
                last = DLedgerError(ResponseCode.TIMEOUT, f"the master the controllers name, {address}, "
                                    "does not answer: not sent")
                address = None  # (the probe waited: ask the controllers again at once)
            if address is None:
                refresh = True
                await asyncio.sleep(RETRY_S)
                continue
            try:
                reply = await self._watched(address, self._epoch, msg, max(0.1, deadline - time.monotonic()))
            except DLedgerError as e:
                if e.code not in _UNANSWERED:
                    raise
                if not never_sent(e):
                    self._forget(address)
                    raise DLedgerError(e.code, f"{e.message}: outcome unknown (it may have been written)") from None
                last, refresh = e, True
                await asyncio.sleep(RETRY_S)
                continue
            if reply.code == ResponseCode.SUCCESS:
                return reply
            err = _as_error(reply)
            if err.code not in _RETRY:
                raise err
            last, refresh = err, True
            await asyncio.sleep(RETRY_S)
        raise last or DLedgerError(ResponseCode.TIMEOUT, f"no master of {self.broker} within {self.timeout} s")

    # --- reads ---------------------------------------------------------------------------------

    async def read(self, from_offset: int = 0, max_entries: int = 1000, *, wait: float = 0.0,
                   replica: str | None = None) -> list[BrokerRecord]:
        """Confirmed records from queue offset `from_offset` (at most `max_entries`), from the
        master or, when it does not answer, another replica (or only from `replica`, an
        address: what that replica has confirmed)."""
        req = bm.PullRequest(self.broker, from_offset, max_entries, int(wait * 1000))
        msg = Message(int(RequestCode.PULL_MESSAGE), bm.encode(req))
        last: DLedgerError | None = None
        first = await self._quiet_master() if replica is None else replica
        master, epoch = (first, self._epoch) if replica is None else (None, 0)
        # a suspect master is asked last (after the replicas the controllers list)
        candidates = [first] if first and not (replica is None and self._is_suspect(first)) else []
        asked = replica is not None  # for the other replicas: only once the master did not answer
        k = 0
        while True:
            if k == len(candidates) and not asked:
                asked = True
                others = [a for a in await self._quiet_replicas() if a not in candidates]
                candidates += sorted(others, key=self._is_suspect)
            if k == len(candidates):
                break
            address = candidates[k]
            k += 1
            try:
                if address == master:  # (a hung master: left once the controllers name another)
                    reply = await self._watched(address, epoch, msg, wait + self.timeout, grace=wait)
                else:
                    reply = await self._transport.request(address, msg, wait + self.timeout)
            except DLedgerError as e:
                if e.code in _UNANSWERED and not never_sent(e):
                    self._forget(address)
                last = e
                continue
            if reply.code != ResponseCode.SUCCESS:
                raise _as_error(reply)
            r = _checked(bm.pull_response.decode(reply.meta))
            return [BrokerRecord(e.index, e.offset, e.epoch, e.body) for e in r.entries]
        raise last or DLedgerError(ResponseCode.NETWORK_ERROR, f"no replica of {self.broker} is known")

    async def _quiet_master(self) -> str | None:
        try:
            return await self.master(refresh=self._master is None)
        except DLedgerError as e:
            if e.code == ResponseCode.UNEXPECTED_ARGUMENT:
                raise
            return self._master

    async def _quiet_replicas(self) -> list[str]:
        try:
            return await self.replicas()
        except DLedgerError:
            return self._replicas

    async def subscribe(self, from_offset: int = 0, *, max_entries: int = 1000,
                        wait: float = 10.0) -> AsyncGenerator[BrokerRecord, None]:
        """Confirmed records from `from_offset` on, for ever, each once (long polls; master
        changes and errors are retried with a back-off from the next offset)."""
        offset, delay = from_offset, RETRY_S
        while True:
            try:
                records = await self.read(offset, max_entries, wait=wait)
            except DLedgerError as e:
                if e.code in (ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN):
                    raise
                self._master = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = RETRY_S
            for r in records:
                if r.index >= offset:
                    yield r
                    offset = r.index + 1

    async def inject_faults(self, address: str, blocked: Sequence[str] = (), ha_paused: bool = False,
                            ha_cut: bool = False) -> None:
        """Tests: make the broker at `address` (started with --enable-fault-injection) cut its
        requests to `blocked`, stop sending to its slaves (`ha_paused`) or, a slave, drop its
        master (`ha_cut`); no arguments heal it."""
        req = bm.FaultRequest(list(blocked), ha_paused, ha_cut)
        reply = await self._transport.request(address, Message(int(RequestCode.BROKER_FAULT), bm.encode(req)),
                                              self.timeout)
        if reply.code != ResponseCode.SUCCESS:
            raise _as_error(reply)
        if reply.meta:  # (a broker of the older layout answered nothing)
            _checked(bm.fault_response.decode(reply.meta))

    async def info(self, address: str | None = None) -> bm.RuntimeInfo:
        """A broker's runtime info (the master's by default)."""
        target = address or await self.master(refresh=True)
        if target is None:
            raise DLedgerError(ResponseCode.SERVICE_NOT_AVAILABLE, f"broker set {self.broker} has no master")
        msg = Message(int(RequestCode.GET_BROKER_RUNTIME_INFO), bm.encode(bm.RuntimeInfoRequest()))
        reply = await self._transport.request(target, msg, self.timeout)
        if reply.code != ResponseCode.SUCCESS:
            raise _as_error(reply)
        return _checked(bm.runtime_info.decode(reply.meta))

    async def epoch_cache(self, address: str | None = None) -> bm.EpochCache:
        """A replica's epoch entries and max offset (GET_BROKER_EPOCH_CACHE; the master's by default)."""
        target = address or await self.master(refresh=True)
        if target is None:
            raise DLedgerError(ResponseCode.SERVICE_NOT_AVAILABLE, f"broker set {self.broker} has no master")
        msg = Message(int(RequestCode.GET_BROKER_EPOCH_CACHE), bm.encode(bm.EpochCacheRequest()))
        reply = await self._transport.request(target, msg, self.timeout)
        if reply.code != ResponseCode.SUCCESS:
            raise _as_error(reply)
        return _checked(bm.epoch_cache.decode(reply.meta))


_Answer = TypeVar("_Answer", bm.SendResponse, bm.PullResponse, bm.RuntimeInfo, bm.FaultResponse, bm.EpochCache)


def _checked(answer: _Answer) -> _Answer:
    """The answer itself, if its code says SUCCESS (errors come as error frames: a message
    that decoded with another code is one we cannot read as a result)."""
    if answer.code != ResponseCode.SUCCESS:
        try:
            code = ResponseCode(answer.code)
        except ValueError:
            code = ResponseCode.UNKNOWN
        raise DLedgerError(code, f"{type(answer).__name__} with code {answer.code}")
    return answer


def _as_error(reply: Message) -> DLedgerError:
    try:
        code = ResponseCode(reply.code)
    except ValueError:
        code = ResponseCode.UNKNOWN
    return DLedgerError(code, error_text(bytes(reply.meta)))  # "" when the meta says nothing


class BrokerClient:
    """Blocking twin of AsyncBrokerClient (its own event-loop thread: works inside notebooks
    and Spark tasks)."""

    def __init__(self, controller: str, broker: str, timeout: float = 10.0, tls: TlsConfig | None = None,
                 coalesce: bool = True) -> None:
        self._async = AsyncBrokerClient(controller, broker, timeout, tls, coalesce=coalesce)
        self._loop = LoopThread("dledger-broker-client")
        self._run = self._loop.run

    def send(self, body: bytes) -> SendResult:
        return self._run(self._async.send(body))

    def send_batch(self, bodies: Sequence[bytes]) -> list[SendResult]:
        return self._run(self._async.send_batch(bodies))

    def read(self, from_offset: int = 0, max_entries: int = 1000, *, wait: float = 0.0,
             replica: str | None = None) -> list[BrokerRecord]:
        return self._run(self._async.read(from_offset, max_entries, wait=wait, replica=replica))

    def info(self, address: str | None = None) -> bm.RuntimeInfo:
        return self._run(self._async.info(address))

    def epoch_cache(self, address: str | None = None) -> bm.EpochCache:
        return self._run(self._async.epoch_cache(address))

    def inject_faults(self, address: str, blocked: Sequence[str] = (), ha_paused: bool = False,
                      ha_cut: bool = False) -> None:
        self._run(self._async.inject_faults(address, blocked, ha_paused, ha_cut))

    def master(self, refresh: bool = True) -> str | None:
        return self._run(self._async.master(refresh))

    def subscribe(self, from_offset: int = 0, *, max_entries: int = 1000, wait: float = 10.0) -> Iterator[BrokerRecord]:
        return self._loop.iterate(self._async.subscribe(from_offset, max_entries=max_entries, wait=wait))

    def close(self) -> None:
        self._loop.close(self._async.close)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
