"""Epoch-file writes deferred to the runtime (written off its event loop): what must not
outrun the file waits for it. A new master refuses sends until its epoch entry is on disk; a
slave appends (and acks) the records after an epoch-file change only once it is written."""

from __future__ import annotations

from pathlib import Path

from dledger.broker.epoch_file import EpochFileCache, decode
from dledger.broker.ha_master import HAConfig
from dledger.broker.ha_packets import Ack, SlavePacketReader
from dledger.broker.ha_service import AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.broker.replica import Change, ReplicaState
from dledger.codes import ResponseCode
from dledger.store.memory import MemoryLedgerStore

CFG = HAConfig(heartbeat_ms=100, housekeeping_ms=1000, transfer_batch_bytes=1 << 16, max_not_catchup_ms=500)


def deferred(path: Path) -> EpochFileCache:
    epochs = EpochFileCache(path)
    epochs.deferred = True
    return epochs


def write(epochs: EpochFileCache) -> None:
    """What the runtime's writer does, from its worker thread."""
    version, data = epochs.snapshot()
    epochs.write(data)
    epochs.written_up_to(version)


def test_a_new_master_refuses_sends_until_its_epoch_entry_is_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    epochs = deferred(path)
    r = ReplicaState("b0", BrokerLog(MemoryLedgerStore()), epochs, CFG, AckSettings(), 1000)
    r.broker_id = 1
    assert r.change_role(1, "h:1", 1, 1, {1}, "h:1") == Change.MASTER
    r.lease_granted(0, 1)
    assert epochs.unwritten and not path.exists()  # in memory only, so far
    refusal = r.send_refusal(1)
    assert refusal is not None and refusal.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "durable" in refusal.message
    write(epochs)
    assert [(e.epoch, e.start) for e in decode(path.read_bytes())] == [(1, 0)]
    assert r.send_refusal(1) is None


def test_memory_only_epochs_are_never_unwritten() -> None:
    epochs = EpochFileCache()
    epochs.deferred = True  # (no file: nothing to wait for, as in the simulator)
    epochs.append_entry(1, 0)
    assert not epochs.unwritten


def acked(out: list[bytes]) -> list[int]:
    """The offsets a slave's packets ack."""
    return [p.max_offset for p in SlavePacketReader().feed(b"".join(out)) if isinstance(p, Ack)]


def test_a_slave_appends_and_acks_a_new_epochs_records_only_after_its_entry_is_written(tmp_path: Path) -> None:
    mlog, mepochs = BrokerLog(MemoryLedgerStore()), EpochFileCache()
    mepochs.append_entry(1, 0)
    master = MasterHA(1, mlog, mepochs, CFG, {1})
    mlog.append([b"a" * 10, b"b" * 20], 1)
    path = tmp_path / "epochs"
    slog, sepochs = BrokerLog(MemoryLedgerStore()), deferred(path)
    slave = SlaveClient(2, slog, sepochs, CFG)
    key = object()
    master.opened(key, 0)
    master.on_data(key, b"".join(slave.connected(0)), 0)
    conn = master.connections[key]
    down = b"".join(conn.output(1, master.confirm_offset, 1 << 20))  # the handshake answer
    up = slave.receive(down, 1)
    assert up  # the handshake's ack: where the transfer starts (nothing held)
    master.on_data(key, b"".join(up), 1)
    if sepochs.unwritten:  # (the handshake's truncate_suffix_by_offset changed the file)
        write(sepochs)
    down = b"".join(conn.output(2, master.confirm_offset, 1 << 20))  # the records of epoch 1
    assert down
    up = slave.receive(down, 2)
    assert slave.waiting and sepochs.unwritten  # the new epoch's entry is in memory only
    assert slog.max_offset == 0 and all(o == 0 for o in acked(up))  # nothing appended, nothing acked
    assert all(o == 0 for o in acked(slave.tick(500)))  # (a heartbeat ack meanwhile neither)
    write(sepochs)
    assert [(e.epoch, e.start) for e in decode(path.read_bytes())] == [(1, 0)]
    up = slave.receive(b"", 3)
    assert not slave.waiting and slog.max_offset == mlog.max_offset
    assert acked(up) == [mlog.max_offset]


def test_a_slave_leaves_its_cut_to_the_runtime_and_takes_no_role_meanwhile(tmp_path: Path) -> None:
    """A divergent tail: the handshake answer waits until the runtime has cut the log (in a
    worker thread); meanwhile no role change is taken (the log's end is not known yet)."""
    mlog, mepochs = BrokerLog(MemoryLedgerStore()), EpochFileCache()
    mepochs.append_entry(1, 0)
    mlog.append([b"a" * 10], 1)
    mepochs.append_entry(2, mlog.max_offset)
    master = MasterHA(1, mlog, mepochs, CFG, {1})
    path = tmp_path / "epochs"
    slog, sepochs = BrokerLog(MemoryLedgerStore()), EpochFileCache(path)
    sepochs.append_entry(1, 0)
    slog.append([b"a" * 10, b"b" * 10, b"c" * 10], 1)  # the tail past the master's epoch 1 is not on it
    held = slog.max_offset
    r = ReplicaState("b0", slog, sepochs, CFG, AckSettings(), 1000)
    sepochs.deferred = True  # (as the runtime: once the replica is built)
    r.broker_id = 2
    assert r.change_role(1, "h:1", 2, 1, {1}, "h:2") == Change.SLAVE
    slave = r.slave
    assert slave is not None
    slave.defer_cuts = True
    key = object()
    master.opened(key, 0)
    master.on_data(key, b"".join(slave.connected(0)), 0)
    conn = master.connections[key]
    up = slave.receive(b"".join(conn.output(1, master.confirm_offset, 1 << 20)), 1)
    assert slave.cut_wanted == (mlog.max_offset, held) and slave.waiting
    assert up == [] and slog.max_offset == held  # not cut, nothing acked
    assert r.change_role(2, "h:2", 3, 1, {2}, "h:2") == Change.NONE  # no role while the cut is pending
    slog.truncate_to(slave.cut_wanted[0])  # what the runtime does in its worker thread
    slave.cut_made()
    up = slave.receive(b"", 2)
    if slave.waiting:  # the truncation's epoch-file change, written first
        write(sepochs)
        up += slave.receive(b"", 3)
    assert not slave.waiting and slave.truncated_at == mlog.max_offset and slog.max_offset == mlog.max_offset
    assert acked(up) == [mlog.max_offset]
    assert r.change_role(2, "h:2", 3, 1, {2}, "h:2") == Change.MASTER
