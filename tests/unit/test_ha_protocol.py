"""The sans-I/O AutoSwitch HA pieces driven against each other in memory: a master's
MasterHA and slaves' SlaveClients over BrokerLogs on memory stores and file stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig, HAProtocolError, UnknownSlave
from dledger.broker.ha_packets import Ack, Handshake, HAState, Transfer
from dledger.broker.ha_service import ALL_ACK, AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.store.file import FileLedgerStore
from dledger.store.memory import MemoryLedgerStore

CFG = HAConfig(heartbeat_ms=100, housekeeping_ms=1000, transfer_batch_bytes=200, max_not_catchup_ms=500)


class Replica:
    def __init__(self, broker_id: int, store: object | None = None) -> None:
        self.id = broker_id
        self.log = BrokerLog(store or MemoryLedgerStore())  # type: ignore[arg-type]
        self.epochs = EpochFileCache()

    def become_master(self, epoch: int, sss: set[int]) -> MasterHA:
        self.epochs.append_entry(epoch, self.log.max_offset)
        return MasterHA(self.id, self.log, self.epochs, CFG, sss)

    def write(self, epoch: int, *bodies: bytes) -> int:
        self.log.append(list(bodies), epoch)
        return self.log.max_offset


def pump(master: MasterHA, key: object, slave: SlaveClient, now: int, rounds: int = 50) -> list[frozenset[int]]:
    """Move bytes both ways until quiet; the SyncStateSet proposals the master made."""
    proposals = []
    conn = master.connections[key]
    for _ in range(rounds):
        down = b"".join(conn.output(now, master.confirm_offset, 1 << 20))
        up = b"".join(slave.receive(down, now)) if down else b""
        if up:
            p = master.on_data(key, up, now)
            if p is not None:
                proposals.append(p)
        if not down and not up:
            break
    return proposals


def connect(master: MasterHA, slave: SlaveClient, now: int = 0) -> object:
    key = object()
    master.opened(key, now)
    hello = b"".join(slave.connected(now))
    assert master.on_data(key, hello, now) is None
    return key


def test_replicates_byte_for_byte_and_expands_the_sync_state_set() -> None:
    m, s = Replica(1), Replica(2)
    ha = m.become_master(1, {1})
    for i in range(20):
        m.write(1, b"x" * i)
    slave = SlaveClient(2, s.log, s.epochs, CFG)
    key = connect(ha, slave)
    proposals = pump(ha, key, slave, now=10)
    assert s.log.max_offset == m.log.max_offset
    assert bytes(s.log.store.read_raw(0, 1 << 20).data) == bytes(m.log.store.read_raw(0, 1 << 20).data)
    assert [e.epoch for e in s.epochs.entries] == [1]
    assert proposals == [frozenset({1, 2})]  # caught up within the master epoch: proposed in
    assert ha.tracker.effective == {1, 2}  # counted while in flight (#5663)
    ha.set_sync_state_set({1, 2})
    assert ha.confirm_offset == m.log.max_offset
    assert slave.confirm_offset <= s.log.max_offset


def test_no_frame_spans_two_epochs() -> None:
    m = Replica(1)
    m.become_master(1, {1})
    m.write(1, b"a" * 10, b"b" * 10)
    ha = m.become_master(2, {1})
    m.write(2, b"c" * 10)
    ha = m.become_master(3, {1})
    m.write(3, b"d" * 10, b"e" * 10)
    s = Replica(2)
    slave = SlaveClient(2, s.log, s.epochs, CFG)
    key = connect(ha, slave)
    conn = ha.connections[key]
    frames = []
    while True:  # the handshake answer, then transfers
        down = conn.output(0, ha.confirm_offset, 1 << 20)
        if not down:
            break
        frames += down
        ups = slave.receive(b"".join(down), 0)
        ha.on_data(key, b"".join(ups), 0)
    transfers = [f for f in frames if int.from_bytes(f[:4], "big") == HAState.TRANSFER and len(f) > 36]
    epochs = [int.from_bytes(f[16:20], "big") for f in transfers]
    assert epochs == [1, 2, 3]
    assert [(e.epoch, e.start) for e in s.epochs.entries] == [(e.epoch, e.start) for e in m.epochs.entries]


def test_old_master_truncates_its_unconfirmed_tail(tmp_path: Path) -> None:
    """The truncation point on real stores: the old master wrote in epoch 1 past what the new master has; it
    rejoins as a slave, cuts at the consistent point, and the cut is on disk (#10666)."""
    old = Replica(1, FileLedgerStore(tmp_path / "old", data_file_size=1 << 20))
    new = Replica(2, FileLedgerStore(tmp_path / "new", data_file_size=1 << 20))
    ha1 = old.become_master(1, {1, 2})
    old.write(1, b"acked-1", b"acked-2")
    slave = SlaveClient(2, new.log, new.epochs, CFG)
    key = connect(ha1, slave)
    pump(ha1, key, slave, 0)
    agreed = new.log.max_offset
    old.write(1, b"never-acked-3", b"never-acked-4")  # the master dies before sending these
    ha2 = new.become_master(2, {2})
    new.write(2, b"new-epoch-5")
    rejoined = SlaveClient(1, old.log, old.epochs, CFG)
    key2 = connect(ha2, rejoined)
    pump(ha2, key2, rejoined, 0)
    assert rejoined.truncated_at == agreed
    assert [e.body for e in old.log.store.read(0, 10)] == [b"acked-1", b"acked-2", b"new-epoch-5"]
    assert [(e.epoch, e.start) for e in old.epochs.entries] == [(1, 0), (2, agreed)]
    old.log.store.close()
    reopened = BrokerLog(FileLedgerStore(tmp_path / "old", data_file_size=1 << 20))
    assert [e.body for e in reopened.store.read(0, 10)] == [b"acked-1", b"acked-2", b"new-epoch-5"]
    reopened.store.close()
    new.log.store.close()


def test_records_cross_data_files(tmp_path: Path) -> None:
    """Positions jump over a data file's closing blank; offsets still line up."""
    m = Replica(1, FileLedgerStore(tmp_path / "m", data_file_size=1 << 20))
    s = Replica(2, FileLedgerStore(tmp_path / "s", data_file_size=1 << 20))
    ha = m.become_master(1, {1})
    for _ in range(30):
        m.write(1, b"z" * 100_000)
    slave = SlaveClient(2, s.log, s.epochs, CFG)
    key = connect(ha, slave)
    pump(ha, key, slave, 0, rounds=500)
    assert s.log.max_offset == m.log.max_offset
    assert m.log.max_offset > 30 * (100_000 + 48)  # gaps before the 2nd and 3rd files
    assert s.log.store.end_index == 29
    m.log.store.close()
    s.log.store.close()


def test_ack_rules() -> None:
    m = Replica(1)
    ha = m.become_master(1, {1, 2, 3})
    end = m.write(1, b"r")
    assert ha.acked(end, 1) and ha.acked(end, 0)
    assert not ha.acked(end, ALL_ACK)
    s2, s3 = Replica(2), Replica(3)
    c2, c3 = SlaveClient(2, s2.log, s2.epochs, CFG), SlaveClient(3, s3.log, s3.epochs, CFG)
    k2, k3 = connect(ha, c2), connect(ha, c3)
    pump(ha, k2, c2, 0)
    assert ha.acked(end, 2) and not ha.acked(end, ALL_ACK) and not ha.acked(end, 3)
    assert ha.confirm_offset < end  # member 3 has not acked yet
    pump(ha, k3, c3, 0)
    assert ha.acked(end, ALL_ACK) and ha.confirm_offset == end
    assert ha.refuse_reason(AckSettings(3, 3)) is None
    ha.closed(k3)  # proposes {1, 2}; counted over the union until confirmed
    assert ha.refuse_reason(AckSettings(3, 3)) is None
    ha.set_sync_state_set({1, 2})
    assert "in-sync replicas not enough" in (ha.refuse_reason(AckSettings(3, 3)) or "")


def test_confirm_offset_waits_for_a_disconnected_member() -> None:
    """#6662: a member of the set that is not connected freezes the confirm offset."""
    m = Replica(1)
    ha = m.become_master(1, {1, 2})
    m.write(1, b"a")
    assert ha.confirm_offset == -1
    s = Replica(2)
    c = SlaveClient(2, s.log, s.epochs, CFG)
    key = connect(ha, c)
    pump(ha, key, c, 0)
    assert ha.confirm_offset == m.log.max_offset


def test_shrink_after_not_catching_up() -> None:
    m = Replica(1)
    ha = m.become_master(1, {1, 2})
    s = Replica(2)
    c = SlaveClient(2, s.log, s.epochs, CFG)
    key = connect(ha, c)
    pump(ha, key, c, now=0)
    assert ha.shrink(100) is None
    assert ha.shrink(100 + CFG.max_not_catchup_ms + 1) == frozenset({1})


def test_slave_refuses_garbage_and_gaps() -> None:
    m = Replica(1)
    ha = m.become_master(1, {1})
    m.write(1, b"a", b"b")
    s = Replica(2)
    c = SlaveClient(2, s.log, s.epochs, CFG)
    connect(ha, c)
    c.receive(b"".join([ha.connections[next(iter(ha.connections))].output(0, 0, 1 << 20)[0]]), 0)
    assert c.state == HAState.TRANSFER
    raw = bytes(m.log.store.read_raw(1, 1 << 20).data)  # entry 1 without entry 0: a gap
    with pytest.raises(HAProtocolError):
        c.receive(Transfer(m.log.end_of(0), 1, 0, 0, raw).encode(), 0)
    with pytest.raises(HAProtocolError, match="epoch"):
        c.receive(Transfer(0, 7, 0, 0, bytes(m.log.store.read_raw(0, 1 << 20).data)).encode(), 0)
    assert s.log.max_offset == 0


def test_master_refuses_an_ack_beyond_its_log() -> None:
    m = Replica(1)
    ha = m.become_master(1, {1})
    key = object()
    ha.opened(key, 0)
    ha.on_data(key, Handshake(2).encode(), 0)
    with pytest.raises(HAProtocolError, match="not our log"):
        ha.on_data(key, Ack(10_000).encode(), 0)


def test_no_consistent_point_is_an_error() -> None:
    m, s = Replica(1), Replica(2)
    ha = m.become_master(5, {1})
    m.write(5, b"m")
    s.epochs.append_entry(3, 0)
    s.log.append([b"other"], 3)
    c = SlaveClient(2, s.log, s.epochs, CFG)
    key = connect(ha, c)
    with pytest.raises(HAProtocolError, match="no consistent point"):
        pump(ha, key, c, 0)


def test_forged_connections_are_refused() -> None:
    """The master's own id, acks beyond what was sent, and a second connection of one slave
    (the older one is dropped: one slave, one ack count)."""
    m = Replica(1)
    ha = m.become_master(1, {1, 2})
    m.write(1, b"a" * 100)
    key = object()
    ha.opened(key, 0)
    with pytest.raises(HAProtocolError, match="not a slave"):
        ha.on_data(key, Handshake(1).encode(), 0)
    s = Replica(2)
    c = SlaveClient(2, s.log, s.epochs, CFG)
    real = connect(ha, c)
    pump(ha, real, c, 0)
    forged = object()
    ha.opened(forged, 0)
    ha.on_data(forged, Handshake(2).encode() + Ack(0).encode(), 0)
    assert real not in ha.connections  # replaced
    m.write(1, b"b")
    ha.connections[forged].output(0, ha.confirm_offset, 1 << 20)  # sends from 0: everything
    with pytest.raises(HAProtocolError, match="beyond"):
        ha.on_data(forged, Ack(m.log.max_offset + 1).encode(), 0)


def test_a_tls_slave_handshakes_only_as_the_id_bound_to_its_certificate() -> None:
    """Issue 26: any certificate of the CA could ack as a slave. With TLS a handshake names an
    id whose binding (from the controller) is the connection's certificate name; an id not
    known bound yet is UnknownSlave (the runtime refreshes the bindings, the slave retries);
    without TLS (principal None) nothing is checked."""
    bindings: dict[int, str] = {2: "b0/r1"}
    m = Replica(1)
    m.epochs.append_entry(1, 0)
    ha = MasterHA(1, m.log, m.epochs, CFG, {1}, bindings=bindings)
    m.write(1, b"a" * 50)
    for cn, broker_id, error in (("b0/r2", 2, "bound to CN=b0/r1"), ("b0/r1", 3, "no certificate")):
        key = object()
        ha.opened(key, 0, cn)
        with pytest.raises(UnknownSlave if broker_id == 3 else HAProtocolError, match=error):
            ha.on_data(key, Handshake(broker_id).encode(), 0)
        ha.closed(key)
    bindings[3] = "b0/r2"  # the refreshed bindings, in place
    s = Replica(3)
    c = SlaveClient(3, s.log, s.epochs, CFG)
    key = object()
    ha.opened(key, 0, "b0/r2")
    ha.on_data(key, b"".join(c.connected(0)), 0)
    pump(ha, key, c, 0)
    assert s.log.max_offset == m.log.max_offset
    plain = object()
    ha.opened(plain, 0)  # no TLS: not bound
    ha.on_data(plain, Handshake(7).encode(), 0)
    assert ha.connections[plain].slave_id == 7


def test_slave_refuses_frames_of_a_future_epoch() -> None:
    m = Replica(1)
    ha = m.become_master(3, {1})
    m.write(3, b"x")
    s = Replica(2)
    c = SlaveClient(2, s.log, s.epochs, CFG, master_epoch=2)  # the controller said epoch 2
    key = connect(ha, c)
    with pytest.raises(HAProtocolError, match="epoch 3"):
        pump(ha, key, c, 0)
    assert s.epochs.entries == [] and s.log.max_offset == 0


def test_an_unreadable_epoch_file_is_an_error(tmp_path: Path) -> None:
    from dledger.broker.epoch_file import EpochFileError

    path = tmp_path / "epochFileCheckpoint"
    EpochFileCache(path).append_entry(1, 0)
    path.write_bytes(b"2\n123\n1-0\n")  # count and CRC do not match
    EpochFileCache(path)  # (the .bak is read)
    (tmp_path / "epochFileCheckpoint.bak").write_bytes(b"1\n1\n1-0\n")  # a CRC that fails
    with pytest.raises(EpochFileError, match="cannot be read"):
        EpochFileCache(path)
