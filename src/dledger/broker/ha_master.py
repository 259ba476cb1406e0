"""One slave's HA connection on the master (upstream's AutoSwitchHAConnection), sans-I/O.

The runtime feeds what the socket read (`receive`) and writes what `output` returns; time is
passed in. Handshakes are answered from the current epoch file and max offset (each one: a
slave repeats its handshake until answered). Transfer starts where the slave's first ack
says, and every frame's body lies inside one epoch: the epoch of the next byte to send is
looked up for each frame (never cached, so an epoch appended while the connection lives
cannot mislabel bytes, #9689; the master also resets its connections on an epoch change).

With TLS the runtime gives each connection the certificate name (CN) of its peer, and a
handshake is accepted only when that name is the one the controller bound to the broker id
the handshake names (`bindings`, from the controller's replica info); an id the master does
not know bound yet is refused with `UnknownSlave` (the runtime asks the controller again and
the slave retries). Without TLS nothing binds a slave (docs/brokers.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from dledger.broker.epoch_file import INFINITY, EpochFileCache
from dledger.broker.ha_packets import Ack, Handshake, HandshakeAnswer, HAState, SlavePacketReader, Transfer
from dledger.broker.log import BrokerLog


@dataclass(frozen=True)
class HAConfig:
    """The HA timings and sizes (ours are shorter for a 2 s failover)."""

    heartbeat_ms: int = 1000  # haSendHeartbeatInterval (upstream 5000)
    housekeeping_ms: int = 5000  # haHousekeepingInterval: silence that closes a connection (20000)
    transfer_batch_bytes: int = 256 << 10  # haTransferBatchSize (32 KiB)
    max_not_catchup_ms: int = 5000  # haMaxTimeSlaveNotCatchup (15000)
    handshake_retry_ms: int = 1000  # a slave repeats an unanswered handshake


class HAProtocolError(Exception):
    """The peer broke the protocol or the logs cannot be reconciled: close the connection."""


class UnknownSlave(HAProtocolError):
    """A TLS handshake for a broker id with no binding known here yet: close it, refresh the
    bindings from the controller; the slave retries."""


def handshake_refusal(broker_id: int, principal: str | None, bindings: Mapping[int, str]) -> HAProtocolError | None:
    """Why a slave whose certificate is `principal` (None: no TLS, nothing to check) may not
    handshake as `broker_id`, or None."""
    if principal is None:
        return None
    bound = bindings.get(broker_id)
    if bound is None:
        return UnknownSlave(f"a handshake as broker {broker_id} from CN={principal}: no certificate is known bound "
                            "to that id yet")
    if bound != principal:
        return HAProtocolError(f"a handshake as broker {broker_id} from CN={principal}: that id is bound to "
                               f"CN={bound}")
    return None


class MasterConnection:
    def __init__(self, log: BrokerLog, epochs: EpochFileCache, now_ms: int, config: HAConfig,
                 master_id: int = -1, principal: str | None = None, bindings: Mapping[int, str] | None = None) -> None:
        """`principal`: the peer's certificate name (None: no TLS); `bindings`: broker id ->
        the name bound to it (read at each handshake: the runtime refreshes it in place)."""
        self.log, self.epochs, self.config, self.master_id = log, epochs, config, master_id
        self.principal = principal
        self.bindings: Mapping[int, str] = bindings if bindings is not None else {}
        self.state = HAState.HANDSHAKE
        self.slave_id = -1
        self.async_learner = False
        self.request_offset = -1  # the slave's first ack: where transfer starts
        self.ack_offset = -1
        self.next_offset = -1  # nextTransferFromWhere
        # (frame end, the master's max offset, time) of recent transfers: an ack reaching a
        # frame that ended at the master's max shows the slave caught up as of that frame
        self._tails: deque[tuple[int, int, int]] = deque(maxlen=256)
        self.last_write_ms = now_ms
        self.last_read_ms = now_ms
        self._answer_due = False
        self._reader = SlavePacketReader()

    def receive(self, data: bytes, now_ms: int) -> list[int]:
        """What the slave sent; the offsets it acked, in order (PacketError on garbage)."""
        self.last_read_ms = now_ms
        acks: list[int] = []
        for p in self._reader.feed(data):
            if isinstance(p, Handshake):
                if p.broker_id < 1 or p.broker_id == self.master_id:
                    raise HAProtocolError(f"a handshake as broker {p.broker_id}: not a slave of this master")
                if self.slave_id not in (-1, p.broker_id):
                    raise HAProtocolError(f"slave {self.slave_id} handshook again as {p.broker_id}")
                refusal = handshake_refusal(p.broker_id, self.principal, self.bindings)
                if refusal is not None:
                    raise refusal
                self.slave_id, self.async_learner = p.broker_id, p.async_learner
                self.state, self._answer_due = HAState.HANDSHAKE, True
            else:
                assert isinstance(p, Ack)
                self._on_ack(p, acks)
        return acks

    def _on_ack(self, p: Ack, acks: list[int]) -> None:
        if self.slave_id == -1:
            raise HAProtocolError("an ack before any handshake")
        if p.max_offset < 0 or p.max_offset > self.log.max_offset:
            raise HAProtocolError(f"slave {self.slave_id} acked {p.max_offset}, beyond the master's "
                                  f"{self.log.max_offset}: not our log")
        if self.next_offset != -1 and p.max_offset > self.next_offset:
            raise HAProtocolError(f"slave {self.slave_id} acked {p.max_offset}, beyond the {self.next_offset} "
                                  "bytes sent to it")
        if self.request_offset == -1 and 0 < p.max_offset < self.log.min_offset:
            raise self._below_min(p.max_offset)  # (here, not at the transfer: the read loop says why)
        self.state = HAState.TRANSFER
        if self.request_offset == -1:
            self.request_offset = p.max_offset
        self.ack_offset = p.max_offset
        acks.append(p.max_offset)

    def _below_min(self, offset: int) -> HAProtocolError:
        return HAProtocolError(f"slave {self.slave_id} needs offset {offset}, below the master's min offset "
                               f"{self.log.min_offset} (deleted by retention): move its store directory away so it "
                               "copies the master's log from its min offset")

    def caught_up_at(self, ack: int, now_ms: int) -> int | None:
        """When the slave, acking `ack`, last had everything the master had (None: unknown)."""
        if ack >= self.log.max_offset:
            return now_ms
        last = None
        while self._tails and self._tails[0][0] <= ack:
            last = self._tails.popleft()
        if last is not None and last[1] <= ack:
            return last[2]
        return None

    def expired(self, now_ms: int) -> bool:
        """Silent for the housekeeping interval: close it."""
        return now_ms - self.last_read_ms > self.config.housekeeping_ms

    def output(self, now_ms: int, confirm_offset: int, max_bytes: int) -> list[bytes]:
        """Frames to write now: a handshake answer, transfer frames up to `max_bytes` of
        body, or a heartbeat when nothing was written for the heartbeat interval."""
        out: list[bytes] = []
        if self._answer_due:
            self._answer_due = False
            entries = tuple(self.epochs.entries)
            out.append(HandshakeAnswer(self.log.max_offset, self.epochs.last_epoch, entries).encode())
        elif self.state == HAState.TRANSFER and self.request_offset != -1:
            out.extend(self._transfer(now_ms, confirm_offset, max_bytes))
        if out:
            self.last_write_ms = now_ms
        elif now_ms - self.last_write_ms >= self.config.heartbeat_ms and self.state == HAState.TRANSFER:
            out.append(self._heartbeat(confirm_offset))
            self.last_write_ms = now_ms
        return out

    def _transfer(self, now_ms: int, confirm_offset: int, max_bytes: int) -> list[bytes]:
        if self.next_offset == -1:
            self.next_offset = self.request_offset if self.request_offset > 0 else self.log.min_offset
            if self.next_offset < self.log.min_offset:
                raise self._below_min(self.next_offset)
        frames: list[bytes] = []
        sent = 0
        while sent < max_bytes:
            entry = self.epochs.find_by_offset(self.next_offset)
            if entry is None:
                break  # nothing written at or after it yet (or the epochs do not cover it)
            limit = self.log.max_offset if entry.end == INFINITY else min(entry.end, self.log.max_offset)
            budget = min(self.config.transfer_batch_bytes, max_bytes - sent)
            pos, body = self.log.read_records(self.next_offset, budget, limit)
            if not body:
                if entry.end != INFINITY and pos >= entry.end:
                    self.next_offset = entry.end  # the epoch's bytes are all sent: on to the next one
                    continue
                break
            frames.append(Transfer(pos, entry.epoch, entry.start, confirm_offset, body).encode())
            self.next_offset = pos + len(body)
            self._tails.append((self.next_offset, self.log.max_offset, now_ms))
            sent += len(body)
        return frames

    def _heartbeat(self, confirm_offset: int) -> bytes:
        offset = self.next_offset if self.next_offset != -1 else self.log.max_offset
        entry = self.epochs.find_by_offset(offset) or (self.epochs.entries[0] if self.epochs.entries else None)
        epoch, start = (entry.epoch, entry.start) if entry is not None else (-1, -1)
        return Transfer(offset, epoch, start, confirm_offset).encode()

    @property
    def pending(self) -> bool:
        """Bytes are waiting to be sent (the runtime keeps calling `output` while so)."""
        return self._answer_due or (self.state == HAState.TRANSFER and self.request_offset != -1
                                    and (self.next_offset == -1 or self.next_offset < self.log.max_offset))
