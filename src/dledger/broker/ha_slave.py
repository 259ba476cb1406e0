"""A slave's HA client (upstream's AutoSwitchHAClient), sans-I/O.

READY -> (connected) HANDSHAKE -> (answer: truncate at the consistent point) TRANSFER.
The slave computes where its log stops agreeing with the master's (`find_consistent_point`
over both epoch lists), cuts its log there (the store zeroes and fsyncs what it cuts, before
anything is acked: #10666) and then appends the master's records verbatim, one epoch per
frame. Acks go out after every append and, when idle, every heartbeat interval; an empty
slave acks at once (upstream waited a heartbeat interval).
"""

from __future__ import annotations

import logging
from collections import deque

from dledger.broker.epoch_file import EpochFileCache, find_consistent_point
from dledger.broker.ha_master import HAConfig, HAProtocolError
from dledger.broker.ha_packets import (
    Ack,
    Handshake,
    HandshakeAnswer,
    HAState,
    MasterPacket,
    MasterPacketReader,
    Transfer,
)
from dledger.broker.log import BrokerLog
from dledger.entry import HEADER, chain_before
from dledger.store.base import StoreError

log = logging.getLogger(__name__)


class SlaveClient:
    def __init__(self, broker_id: int, log_: BrokerLog, epochs: EpochFileCache, config: HAConfig,
                 ack_durable: bool = False, master_epoch: int = 1 << 31) -> None:
        self.broker_id, self.log, self.epochs, self.config = broker_id, log_, epochs, config
        # acks name only fsynced bytes (a broker with flush=sync: a master counting this copy
        # must not lose it to the slave's power loss); the runtime acks again once they are
        self.ack_durable = ack_durable
        self.master_epoch = master_epoch  # the controller's: no frame of a later epoch is believed
        self.cuts = 0  # truncations of bytes we held
        self.state = HAState.READY
        self.confirm_offset = -1
        self.reported = -1  # currentReportedOffset
        self.truncated_at: int | None = None  # the last handshake's cut, when it removed bytes
        self.last_read_ms = 0
        self.last_write_ms = 0
        self._handshake_ms = 0
        self._started = False  # the first ack (where transfer starts) went out
        self._reader = MasterPacketReader()
        self._pending: deque[MasterPacket] = deque()  # read, not acted on: the epoch file is being written
        # the runtime cuts the log off its event loop: `cut_wanted` (where, and the log's end
        # before) until `cut_made`; no role change happens meanwhile (ReplicaState.change_role)
        self.defer_cuts = False
        self.cut_wanted: tuple[int, int] | None = None

    @property
    def waiting(self) -> bool:
        """Packets wait for the epoch file to be written or the log to be cut (deferred)."""
        return bool(self._pending)

    def connected(self, now_ms: int) -> list[bytes]:
        self.state, self._started = HAState.HANDSHAKE, False
        self._reader = MasterPacketReader()
        self._pending.clear()
        self.cut_wanted = None
        self.last_read_ms = now_ms
        return [self._handshake(now_ms)]

    def disconnected(self) -> None:
        self.state = HAState.READY

    def _handshake(self, now_ms: int) -> bytes:
        self._handshake_ms = self.last_write_ms = now_ms
        return Handshake(self.broker_id).encode()

    def expired(self, now_ms: int) -> bool:
        return self.state != HAState.READY and now_ms - self.last_read_ms > self.config.housekeeping_ms

    def tick(self, now_ms: int) -> list[bytes]:
        """Packets due by time: a repeated handshake, an idle heartbeat ack."""
        if self.state == HAState.HANDSHAKE and now_ms - self._handshake_ms >= self.config.handshake_retry_ms:
            return [self._handshake(now_ms)]
        if self.state == HAState.TRANSFER and now_ms - self.last_write_ms >= self.config.heartbeat_ms:
            return self._ack(now_ms)
        return []

    def _ack(self, now_ms: int) -> list[bytes]:
        """An ack of what we hold (with ack_durable: of what is fsynced). The first ack of a
        connection says where the transfer starts, so it waits until all we hold is fsynced
        (else the master would send again bytes we have)."""
        ackable = self.log.durable_offset if self.ack_durable else self.log.max_offset
        if not self._started and ackable < self.log.max_offset:
            return []
        self._started = True
        self.reported = ackable
        self.last_write_ms = now_ms
        return [Ack(ackable).encode()]

    def ack_if_grew(self, now_ms: int) -> list[bytes]:
        """An ack when more bytes became ackable (durable) since the last one."""
        ackable = self.log.durable_offset if self.ack_durable else self.log.max_offset
        if self.state != HAState.TRANSFER or (self._started and ackable <= self.reported):
            return []
        return self._ack(now_ms)

    def receive(self, data: bytes, now_ms: int) -> list[bytes]:
        """What the master sent; the acks to write (HAProtocolError, PacketError or
        StoreError: close the connection and start over).

        With deferred epoch writes (the runtime's) the packets after a change of the epoch
        file wait in `pending` until the runtime has written it (`epochs.unwritten` is
        False) and calls again (with b"" or more data): a truncation's epochs are on disk
        before the records that follow it are appended, and a new epoch's entry before the
        records it names are appended, so before any ack counts them."""
        self.last_read_ms = now_ms
        self._pending.extend(self._reader.feed(data))
        grew = False
        while self._pending and not self.epochs.unwritten:
            p = self._pending.popleft()
            if isinstance(p, HandshakeAnswer):
                if self.state != HAState.HANDSHAKE:
                    continue  # an answer to a repeated handshake: the first one was acted on
                if not self._truncate(p):
                    self._pending.appendleft(p)  # once the runtime has cut the log (`cut_wanted`)
                    break
                self.state = HAState.TRANSFER
                grew = True  # ack at once, even an empty log: the master starts from it
            else:
                assert isinstance(p, Transfer)
                grew |= self._on_transfer(p)
        return self._ack(now_ms) if grew else []

    def _truncate(self, answer: HandshakeAnswer) -> bool:
        """doTruncate: cut the log where it stops agreeing with the master's. With `defer_cuts`
        (the runtime's) a cut is left to the runtime (off its event loop): False, and
        `cut_wanted` says where; once it has cut, `cut_made`, and the answer is acted on again
        (the consistent point is then the log's end: nothing more to cut)."""
        local_max = self.log.max_offset
        if not self.epochs.entries:
            cut = self.log.min_offset  # a new replica (or records of no known epoch: fetch them again)
        else:
            master = EpochFileCache()
            for e in answer.entries:
                master.append_entry(e.epoch, e.start)
            cut = find_consistent_point(self.epochs.with_last_end(local_max), master.with_last_end(answer.max_offset))
            if cut < 0:
                first = answer.entries[0] if answer.entries else None
                gone = (f"; the master's epochs begin with epoch {first.epoch} at {first.start}: if retention "
                        "deleted the records this replica would need, move its store directory away so it copies "
                        "the master's log from its min offset") if first is not None and first.start > 0 else ""
                raise HAProtocolError(f"no consistent point with the master (local epochs {self.epochs.entries}, "
                                      f"the master's {list(answer.entries)}): an operator must act{gone}")
        if cut < local_max:
            if self.defer_cuts:
                self.cut_wanted = (cut, local_max)
                return False
            self.log.truncate_to(cut)
            self._cut(cut, local_max)
        # epochs that wrote nothing we keep (an old master's empty last epoch) go too
        self.epochs.truncate_suffix_by_offset(self.log.max_offset)
        self.confirm_offset = min(self.confirm_offset, self.log.max_offset)
        return True

    def cut_made(self) -> None:
        """The runtime cut the log at `cut_wanted` (StoreError: it did not, and closes the
        connection; `connected` starts over)."""
        assert self.cut_wanted is not None
        cut, was = self.cut_wanted
        self.cut_wanted = None
        self._cut(cut, was)

    def _cut(self, cut: int, was: int) -> None:
        self.truncated_at = cut
        self.cuts += 1
        log.warning("slave %d: truncated its log from %d to %d (not on the master)", self.broker_id, was,
                    self.log.max_offset)

    def _on_transfer(self, t: Transfer) -> bool:
        if self.state != HAState.TRANSFER:
            raise HAProtocolError("a transfer frame before the handshake answer")
        if t.body:
            if t.offset < self.log.max_offset:
                raise HAProtocolError(f"a frame at {t.offset} overlaps the log ending at {self.log.max_offset}")
            if t.epoch < 0 or t.epoch < self.epochs.last_epoch or t.epoch > self.master_epoch:
                raise HAProtocolError(f"a frame of epoch {t.epoch} (our last {self.epochs.last_epoch}, the "
                                      f"master's {self.master_epoch})")
            last_start = self.epochs.entries[-1].start if self.epochs.entries else 0
            if not last_start <= t.epoch_start <= t.offset:
                raise HAProtocolError(f"a frame at {t.offset} says its epoch {t.epoch} began at {t.epoch_start}")
            _check_terms(t.body, t.epoch)
            store = self.log.store
            if t.offset > self.log.max_offset and store.end_index < store.begin_index and store.begins_file(t.offset):
                self._begin_at(t)
            # (upstream's currentReceivedEpoch: the epoch file's last epoch says the same)
            added = t.epoch != self.epochs.last_epoch and self.epochs.append_entry(t.epoch, t.epoch_start)
            if self.epochs.last_epoch != t.epoch:
                raise HAProtocolError(f"a frame of epoch {t.epoch} our epoch file cannot take")
            if added and self.epochs.unwritten:
                # the entry is durable before its records are appended (`receive`): this frame
                # again once it is (if they then fail to append, the next handshake's
                # truncate_suffix_by_offset forgets the empty epoch)
                self._pending.appendleft(t)
                return False
            try:
                self.log.append_records(t.body)
            except StoreError as e:
                if added:  # the epoch wrote nothing here: forget it again
                    self.epochs.truncate_suffix_by_epoch(t.epoch)
                raise HAProtocolError(f"records at {t.offset} do not follow our log: {e.message}") from e
        self.confirm_offset = max(self.confirm_offset, min(t.confirm_offset, self.log.max_offset))
        return bool(t.body)


    def _begin_at(self, t: Transfer) -> None:
        """Our log is empty and the master sends from past its end: the master's log begins
        there (retention deleted the files before), and ours starts at the frame's first record
        too (upstream's slave creates its first file there). (A log holding records is never
        sent a gap: the master refuses a slave that needs records below its min offset, and
        the store refuses records that do not follow its own; nor is a frame that does not
        begin a data file, where alone retention leaves a log's min offset.)"""
        store = self.log.store
        _, _, index, term, pos, _, chain, body_crc, _ = HEADER.unpack_from(t.body, 0)
        if pos != t.offset:
            raise HAProtocolError(f"a frame at {t.offset} begins with a record at {pos}")
        store.reset(index, term, chain_before(index, term, body_crc, chain), pos)
        log.warning("slave %d: the master's log begins at offset %d (entry %d): our empty log begins there too",
                    self.broker_id, pos, index)


def _check_terms(body: bytes, epoch: int) -> None:
    """Every record of a frame was written in the frame's epoch (a record's term is its epoch)."""
    off, n = 0, len(body)
    while off + HEADER.size <= n:
        _, size, _, term, *_ = HEADER.unpack_from(body, off)
        if term != epoch:
            raise HAProtocolError(f"a record of epoch {term} in a frame of epoch {epoch}")
        if size < HEADER.size:
            raise HAProtocolError(f"a record of {size} bytes")
        off += size
