"""AutoSwitch HA packets (upstream's AutoSwitchHAConnection): the exact byte layouts, big-endian, and
readers that wait for whole packets whatever the bytes' arrival."""

from __future__ import annotations

import struct

import pytest

from dledger.broker.epoch_file import EpochEntry
from dledger.broker.ha_packets import (
    Ack,
    Handshake,
    HandshakeAnswer,
    MasterPacketReader,
    PacketError,
    SlavePacketReader,
    Transfer,
)


def test_layouts_byte_for_byte() -> None:
    assert Handshake(7, sync_from_last_file=True).encode() == (
        b"\x00\x00\x00\x01" + b"\x00\x01" + b"\x00\x00" + (7).to_bytes(8, "big"))
    assert len(Handshake(1).encode()) == 16
    assert Ack(2**40).encode() == b"\x00\x00\x00\x02" + (2**40).to_bytes(8, "big")
    answer = HandshakeAnswer(900, 3, (EpochEntry(1, 100), EpochEntry(3, 500)))
    raw = answer.encode()
    assert raw[:20] == struct.pack(">iiqi", 1, 24, 900, 3) and len(raw) == 20 + 24
    assert raw[20:32] == struct.pack(">iq", 1, 100)
    t = Transfer(500, 3, 500, 450, b"log bytes")
    assert t.encode()[:36] == struct.pack(">iiqiqq", 2, 9, 500, 3, 500, 450)
    assert Transfer(500, 3, 500, 450).encode() == struct.pack(">iiqiqq", 2, 0, 500, 3, 500, 450)  # a heartbeat


def test_readers_take_bytes_in_any_pieces() -> None:
    """A handshake is parsed only once all 16 bytes are there (upstream: after 12)."""
    slave_bytes = Handshake(5, async_learner=True).encode() + Ack(123).encode() + Ack(456).encode()
    r = SlavePacketReader()
    got = [p for k in range(len(slave_bytes)) for p in r.feed(slave_bytes[k:k + 1])]
    assert got == [Handshake(5, False, True), Ack(123), Ack(456)]
    assert SlavePacketReader().feed(Handshake(5).encode()[:12]) == []
    answer = HandshakeAnswer(900, 3, (EpochEntry(1, 100), EpochEntry(3, 500)))
    master_bytes = answer.encode() + Transfer(500, 3, 500, 450, b"abc").encode() + Transfer(503, 3, 500, 450).encode()
    m = MasterPacketReader()
    got2 = [p for k in range(0, len(master_bytes), 5) for p in m.feed(master_bytes[k:k + 5])]
    assert got2 == [answer, Transfer(500, 3, 500, 450, b"abc"), Transfer(503, 3, 500, 450)]


@pytest.mark.parametrize("raw", [struct.pack(">i", 4), struct.pack(">iiqi", 1, 13, 0, 0),
                                 struct.pack(">iiqiqq", 2, -1, 0, 0, 0, 0)])
def test_garbage_from_a_master_is_refused(raw: bytes) -> None:
    with pytest.raises(PacketError):
        MasterPacketReader().feed(raw)


def test_garbage_from_a_slave_is_refused() -> None:
    with pytest.raises(PacketError):
        SlavePacketReader().feed(struct.pack(">iq", 0, 0))
