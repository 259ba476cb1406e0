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
