"""AutoSwitch HA packets (upstream's HAConnection handshake and transfer headers; docs/format.md),
byte for byte as upstream's: big-endian,
fixed headers, the connection state's ordinal first.

slave -> master: HANDSHAKE (16 bytes: state, isSyncFromLastFile, isAsyncLearner, broker id) and
TRANSFER acks (12 bytes: state, max offset). master -> slave: HANDSHAKE answers (20-byte header
+ 12 bytes per epoch entry) and TRANSFER frames (36-byte header + log bytes; an empty body is
a heartbeat). Parsers are sans-I/O: they take what arrived and return whole packets, waiting
for a packet's full length (upstream parsed a 16-byte handshake once 12 bytes were there).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from dledger.broker.epoch_file import EpochEntry


class HAState(IntEnum):
    """HAConnectionState: on the wire as its ordinal."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


class PacketError(Exception):
    """Bytes that are no packet of the protocol (the connection is closed and re-handshaken)."""


_HANDSHAKE = struct.Struct(">ihhq")  # state, isSyncFromLastFile, isAsyncLearner, slaveBrokerId
_ACK = struct.Struct(">iq")  # state, slaveMaxPhyOffset
_HANDSHAKE_ANSWER = struct.Struct(">iiqi")  # state, bodySize, masterMaxPhyOffset, lastEpoch
_EPOCH = struct.Struct(">iq")  # epoch, startOffset
_TRANSFER = struct.Struct(">iiqiqq")  # state, bodySize, offset, epoch, epochStartOffset, confirmOffset
MAX_EPOCH_ENTRIES = 1 << 16  # a handshake answer's entries (upstream's buffer held 1000: [finding])
MAX_TRANSFER_BODY = 64 << 20


@dataclass(frozen=True, slots=True)
class Handshake:
    broker_id: int
    sync_from_last_file: bool = False
    async_learner: bool = False

    def encode(self) -> bytes:
        return _HANDSHAKE.pack(HAState.HANDSHAKE, int(self.sync_from_last_file), int(self.async_learner),
                               self.broker_id)


@dataclass(frozen=True, slots=True)
class Ack:
    max_offset: int

    def encode(self) -> bytes:
        return _ACK.pack(HAState.TRANSFER, self.max_offset)


@dataclass(frozen=True, slots=True)
class HandshakeAnswer:
    max_offset: int
    last_epoch: int  # -1: the master has no epoch
    entries: tuple[EpochEntry, ...]  # ascending; ends implicit (the last ends at max_offset)

    def encode(self) -> bytes:
        body = b"".join(_EPOCH.pack(e.epoch, e.start) for e in self.entries)
        return _HANDSHAKE_ANSWER.pack(HAState.HANDSHAKE, len(body), self.max_offset, self.last_epoch) + body


@dataclass(frozen=True, slots=True)
class Transfer:
    offset: int  # of the body's first byte
    epoch: int  # the whole body belongs to it
    epoch_start: int
    confirm_offset: int
    body: bytes = b""  # empty: a heartbeat

    def encode(self) -> bytes:
        return _TRANSFER.pack(HAState.TRANSFER, len(self.body), self.offset, self.epoch, self.epoch_start,
                              self.confirm_offset) + self.body


SlavePacket = Handshake | Ack
MasterPacket = HandshakeAnswer | Transfer


class SlavePacketReader:
    """The master's side: what a slave sends, whole packets only."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[SlavePacket]:
        self._buf += data
        out: list[SlavePacket] = []
        while len(self._buf) >= 4:
            (state,) = struct.unpack_from(">i", self._buf)
            if state == HAState.HANDSHAKE:
                if len(self._buf) < _HANDSHAKE.size:
                    break
                _, last_file, learner, broker_id = _HANDSHAKE.unpack_from(self._buf)
                out.append(Handshake(broker_id, bool(last_file), bool(learner)))
                del self._buf[: _HANDSHAKE.size]
            elif state == HAState.TRANSFER:
                if len(self._buf) < _ACK.size:
                    break
                out.append(Ack(_ACK.unpack_from(self._buf)[1]))
                del self._buf[: _ACK.size]
            else:
                raise PacketError(f"a slave sent state {state}")
        return out


class MasterPacketReader:
    """The slave's side: what a master sends, whole packets only."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[MasterPacket]:
        self._buf += data
        out: list[MasterPacket] = []
        while len(self._buf) >= 4:
            packet = self._next()
            if packet is None:
                break
            out.append(packet)
        return out

    def _next(self) -> MasterPacket | None:
        buf = self._buf
        (state,) = struct.unpack_from(">i", buf)
        if state == HAState.HANDSHAKE:
            if len(buf) < _HANDSHAKE_ANSWER.size:
                return None
            _, size, max_offset, last_epoch = _HANDSHAKE_ANSWER.unpack_from(buf)
            if size < 0 or size % _EPOCH.size or size // _EPOCH.size > MAX_EPOCH_ENTRIES:
                raise PacketError(f"a handshake answer of {size} body bytes")
            end = _HANDSHAKE_ANSWER.size + size
            if len(buf) < end:
                return None
            pairs = [_EPOCH.unpack_from(buf, off) for off in range(_HANDSHAKE_ANSWER.size, end, _EPOCH.size)]
            del buf[:end]
            return HandshakeAnswer(max_offset, last_epoch, tuple(EpochEntry(e, s) for e, s in pairs))
        if state == HAState.TRANSFER:
            if len(buf) < _TRANSFER.size:
                return None
            _, size, offset, epoch, epoch_start, confirm = _TRANSFER.unpack_from(buf)
            if not 0 <= size <= MAX_TRANSFER_BODY:
                raise PacketError(f"a transfer of {size} body bytes")
            end = _TRANSFER.size + size
            if len(buf) < end:
                return None
            body = bytes(buf[_TRANSFER.size : end])
            del buf[:end]
            return Transfer(offset, epoch, epoch_start, confirm, body)
        raise PacketError(f"a master sent state {state}")
