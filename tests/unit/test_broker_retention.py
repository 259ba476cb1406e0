"""A broker's commit log retention (docs/brokers.md, "Retention"): whole data files, oldest
first, by age (`file_reserved_hours`) and by disk use (`disk_max_used_space_ratio`), never a
file holding a record some replica still needs; the epoch file follows the log's new min
offset; the confirm offset file's `.bak`. Then upstream's
AutoSwitchHATest.testTruncateEpochLogAndChangeMaster, translated onto ReplicaState.

Time is a fake clock passed to the store and the disk a fake usage: nothing sleeps, nothing
fills a disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.broker.config import BrokerConfig
from dledger.broker.confirm_file import CONFIRM_FILE, read_confirm, write_confirm
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig, HAProtocolError
from dledger.broker.ha_service import AckSettings
from dledger.broker.log import BrokerLog
from dledger.broker.replica import BrokerRole, ReplicaState
from dledger.codes import ResponseCode
from dledger.config import ConfigError
from dledger.entry import chain_before, chain_crc
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.retention import EXPIRE_AT_ANY_USAGE, Candidate, plan_deletions

FILE_SIZE = 1700  # upstream's test: 10 records of 157 bytes fill one file
BODY = b"m" * (157 - 48)  # a 157-byte record (48-byte header)
HOURS = 72.0
CFG = HAConfig(heartbeat_ms=100, housekeeping_ms=100_000, transfer_batch_bytes=1 << 20, max_not_catchup_ms=500)


class Clock:
    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def age(self, hours: float) -> None:
        self.now += hours * 3600


class Disk:
    """(used ratio, total): one data file is a tenth of the disk."""

    def __init__(self, ratio: float = 0.3) -> None:
        self.ratio = ratio

    def __call__(self) -> tuple[float, int]:
        return self.ratio, 10 * FILE_SIZE


def broker_store(path: Path, clock: Clock, disk: Disk, ratio: float = 0.75) -> FileLedgerStore:
    """A commit log store as the broker opens it (BrokerConfig.retention), with fakes."""
    config = BrokerConfig("c", "b", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", str(path),
                          file_reserved_hours=HOURS, disk_max_used_space_ratio=ratio,
                          retention_check_interval_ms=3_600_000)  # only explicit run_retention()
    return FileLedgerStore(path, data_file_size=FILE_SIZE, index_file_size=32 * 64, disk_usage=disk, clock=clock,
                           **config.retention)


@pytest.fixture
def stores() -> Iterator[list[FileLedgerStore]]:
    opened: list[FileLedgerStore] = []
    yield opened
    for s in opened:
        s.close()


def filled(path: Path, stores: list[FileLedgerStore], clock: Clock, disk: Disk, files: int = 5) -> BrokerLog:
    """A log of `files` full data files (10 records each) and a last one with one record."""
    store = broker_store(path, clock, disk)
    stores.append(store)
    log = BrokerLog(store)
    for _ in range(files):
        log.append([BODY] * 10, 1)
    log.append([BODY], 1)
    assert len(store.data.files) == files + 1
    return log


# --- the policy -------------------------------------------------------------------------------

def test_the_broker_policy_deletes_expired_files_at_any_usage_and_forces_down_to_the_ratio() -> None:
    now = 1_000_000.0
    old, new = now - (HOURS + 1) * 3600, now - 60
    files = [Candidate(10, old), Candidate(10, old), Candidate(10, new), Candidate(10, new), Candidate(10, new)]
    # by time: the two expired files, though the disk is nearly empty (DLedger's rule would keep them)
    assert plan_deletions(files, 0.05, 100, now, HOURS, EXPIRE_AT_ANY_USAGE, 0.75, 0.75, 0.9).delete == 2
    assert plan_deletions(files, 0.05, 100, now, HOURS, 0.70, 0.85).delete == 0
    # by disk use: above the ratio, unexpired files too, oldest first, until usage is under it
    plan = plan_deletions(files, 0.98, 100, now, HOURS, EXPIRE_AT_ANY_USAGE, 0.75, 0.75, 0.9)
    assert plan.delete == 3 and not plan.disk_full  # 0.98 -> 0.68
    plan = plan_deletions(files[:1], 0.98, 100, now, HOURS, EXPIRE_AT_ANY_USAGE, 0.75, 0.75, 0.9)
    assert plan.delete == 1 and not plan.disk_full  # still above the ratio (0.88), not above the full ratio
    assert plan_deletions([], 0.95, 100, now, HOURS, EXPIRE_AT_ANY_USAGE, 0.75, 0.75, 0.9).disk_full


def test_config_options_are_checked() -> None:
    base = ("c", "b", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "/tmp/x")
    assert BrokerConfig(*base).file_reserved_hours == 72.0
    assert BrokerConfig.from_dict({"cluster": "c", "name": "b", "controller": "127.0.0.1:1", "listen": "127.0.0.1:2",
                                   "ha-listen": "127.0.0.1:3", "store-dir": "/tmp/x", "file-reserved-hours": 0,
                                   "disk-max-used-space-ratio": 0.5}).disk_max_used_space_ratio == 0.5
    for bad in ({"file_reserved_hours": -1}, {"disk_max_used_space_ratio": 75}, {"disk_max_used_space_ratio": 0},
                {"file_reserved_hours": "72"}):
        with pytest.raises(ConfigError):
            BrokerConfig(*base, **bad)


# --- the store, bounded by the broker's floor ------------------------------------------------------

def test_nothing_is_deleted_before_the_broker_names_a_floor(tmp_path: Path, stores: list[FileLedgerStore]) -> None:
    clock, disk = Clock(), Disk(0.99)
    log = filled(tmp_path, stores, clock, disk)
    clock.age(HOURS * 10)
    store = log.store
    assert isinstance(store, FileLedgerStore)
    store.run_retention()
    assert log.min_offset == 0 and len(store.data.files) == 6


def test_retention_by_time_deletes_only_files_wholly_below_the_floor(tmp_path: Path,
                                                                      stores: list[FileLedgerStore]) -> None:
    clock, disk = Clock(), Disk(0.3)
    log = filled(tmp_path, stores, clock, disk)
    store = log.store
    assert isinstance(store, FileLedgerStore)
    floor = log.end_of(24)  # the middle of the third file (entries 20..29)
    log.retain_from(floor)
    store.run_retention()
    assert log.min_offset == 0  # nothing has aged
    clock.age(HOURS - 1)
    store.run_retention()
    assert log.min_offset == 0
    clock.age(2)
    store.run_retention()
    # files 1 and 2 end below the floor; the third holds records past it and stays
    assert log.min_offset == 2 * FILE_SIZE and store.begin_index == 20
    # a floor at a file's first record frees the files before it only
    log.retain_from(3 * FILE_SIZE)
    store.run_retention()
    assert log.min_offset == 3 * FILE_SIZE
    log.retain_from(log.max_offset)
    store.run_retention()
    assert log.min_offset == 5 * FILE_SIZE  # never the last file
    with pytest.raises(StoreError) as e:
        log.read_records(0, 1 << 20, log.max_offset)
    assert e.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
    pos, data = log.read_records(log.min_offset, 1 << 20, log.max_offset)
    assert pos == 5 * FILE_SIZE and len(data) == 157


def test_retention_by_disk_use_deletes_unexpired_files_down_to_the_ratio(tmp_path: Path,
                                                                          stores: list[FileLedgerStore]) -> None:
    clock, disk = Clock(), Disk(0.7)
    log = filled(tmp_path, stores, clock, disk)
    store = log.store
    assert isinstance(store, FileLedgerStore)
    log.retain_from(log.max_offset)
    store.run_retention()
    assert log.min_offset == 0  # under the ratio, nothing expired
    disk.ratio = 0.98  # each file is a tenth of the disk: three go (0.98 -> 0.68)
    store.run_retention()
    assert log.min_offset == 3 * FILE_SIZE
    assert not store.disk_full
    # held by the floor: usage stays above, under the full ratio (0.9) sends still go
    log.retain_from(3 * FILE_SIZE)
    disk.ratio = 0.88
    store.run_retention()
    assert log.min_offset == 3 * FILE_SIZE and store.pressure_error() is None
    disk.ratio = 0.95  # above it, and nothing more may go: client appends are refused
    store.run_retention()
    err = store.pressure_error()
    assert err is not None and err.code == ResponseCode.DISK_FULL


# --- what the replicas need ------------------------------------------------------------------------

class Broker:
    """One replica of a set: a ReplicaState over a file store (fake clock and disk)."""

    def __init__(self, broker_id: int, path: Path, stores: list[FileLedgerStore], clock: Clock, disk: Disk) -> None:
        self.id, self.path = broker_id, path
        self.store = broker_store(path / "commitlog", clock, disk)
        stores.append(self.store)
        self.log = BrokerLog(self.store)
        self.epochs = EpochFileCache(path / "epochFileCheckpoint")
        self.r = ReplicaState(f"b{broker_id}", self.log, self.epochs, CFG, AckSettings(), 1000)
        self.r.broker_id = broker_id

    def master(self, epoch: int, sss: set[int]) -> None:
        self.r.change_role(self.id, f"b{self.id}", epoch, 1, sss, f"b{self.id}")
        assert self.r.role == BrokerRole.MASTER

    def follow(self, master: Broker, epoch: int) -> object:
        """Become `master`'s slave at `epoch`, connect and copy until quiet."""
        self.r.change_role(master.id, f"b{master.id}", epoch, 1, {master.id}, f"b{self.id}")
        assert self.r.role == BrokerRole.SLAVE and self.r.slave is not None
        ha = master.r.master_ha
        assert ha is not None
        key = object()
        ha.opened(key, 0)
        ha.on_data(key, b"".join(self.r.slave.connected(0)), 0)
        self.sync(master, key)
        return key

    def sync(self, master: Broker, key: object) -> None:
        ha, slave = master.r.master_ha, self.r.slave
        assert ha is not None and slave is not None
        conn = ha.connections[key]
        for _ in range(100):
            down = b"".join(conn.output(0, ha.confirm_offset, 1 << 20))
            up = b"".join(slave.receive(down, 0)) if down else b""
            if up:
                ha.on_data(key, up, 0)
            if not down and not up:
                return

    def put(self, n: int) -> None:
        self.r.append([BODY] * n)

    def retention(self, now: int = 0, hold_ms: int = 600_000) -> None:
        """What the broker's timer does at `now`, then a retention pass of the store."""
        self.r.forget_deleted_epochs()
        self.log.retain_from(self.r.retention_floor(now, hold_ms))
        self.store.run_retention()
        self.r.forget_deleted_epochs()

    def indexes(self) -> tuple[int, int]:
        return self.store.begin_index, self.store.end_index


def test_the_master_keeps_what_a_connected_slave_has_not_acked(tmp_path: Path, stores: list[FileLedgerStore]) -> None:
    clock, disk = Clock(), Disk()
    m, s = Broker(1, tmp_path / "m", stores, clock, disk), Broker(2, tmp_path / "s", stores, clock, disk)
    m.master(1, {1})
    m.put(30)
    key = s.follow(m, 1)
    assert s.log.max_offset == m.log.max_offset
    ha = m.r.master_ha
    assert ha is not None
    ha.connections[key].ack_offset = FILE_SIZE + 10  # as if the slave had acked only into the second file
    clock.age(HOURS + 1)
    assert m.r.retention_floor(0, 600_000) == FILE_SIZE + 10
    m.retention()
    assert m.log.min_offset == FILE_SIZE  # the second file holds records the slave still needs
    ha.connections[key].ack_offset = -1  # a connection that has not acked: it may need anything
    assert m.r.retention_floor(0, 600_000) == m.log.min_offset
    ha.connections[key].ack_offset = m.log.max_offset
    m.retention()
    assert m.log.min_offset == 2 * FILE_SIZE  # (the last file stays)


def test_the_master_keeps_what_its_confirm_offset_has_not_reached(tmp_path: Path,
                                                                  stores: list[FileLedgerStore]) -> None:
    """A SyncStateSet member that is not connected holds the confirm offset back, and with it
    retention."""
    clock, disk = Clock(), Disk()
    m = Broker(1, tmp_path / "m", stores, clock, disk)
    m.master(1, {1, 2})  # broker 2 in the set, not connected: the confirm offset stays where it was
    m.put(30)
    clock.age(HOURS + 1)
    assert m.r.retention_floor(0, 600_000) == 0
    m.retention()
    assert m.log.min_offset == 0


def test_a_slave_keeps_what_it_has_not_confirmed(tmp_path: Path, stores: list[FileLedgerStore]) -> None:
    clock, disk = Clock(), Disk()
    m, s = Broker(1, tmp_path / "m", stores, clock, disk), Broker(2, tmp_path / "s", stores, clock, disk)
    m.master(1, {1, 2})  # the confirm offset moves once the slave acks: the frames it got said less
    m.put(25)
    key = s.follow(m, 1)
    ha = m.r.master_ha
    assert ha is not None and ha.confirm_offset == m.log.max_offset
    assert s.r.confirm_offset < s.log.max_offset == m.log.max_offset
    clock.age(HOURS + 1)
    s.retention()
    assert s.log.min_offset == 0
    assert s.r.slave is not None  # a heartbeat brings the master's confirm offset
    s.r.slave.receive(b"".join(ha.connections[key].output(10_000, ha.confirm_offset, 1 << 20)), 10_000)
    assert s.r.confirm_offset == s.log.max_offset
    s.retention()
    assert s.log.min_offset == 2 * FILE_SIZE


def test_a_slave_that_needs_deleted_records_gets_a_clear_failure(tmp_path: Path,
                                                                 stores: list[FileLedgerStore]) -> None:
    clock, disk = Clock(), Disk()
    m, s = Broker(1, tmp_path / "m", stores, clock, disk), Broker(2, tmp_path / "s", stores, clock, disk)
    m.master(1, {1})
    m.put(5)
    key = s.follow(m, 1)
    s.r.change_role(3, "b3", 2, 1, {3}, "b2")  # the slave leaves (its master moves on without it)
    ha = m.r.master_ha
    assert ha is not None
    ha.closed(key)
    m.put(30)
    clock.age(HOURS + 1)
    m.retention(now=600_000)  # heard from 10 minutes ago: what it needs is kept
    assert m.log.min_offset == 0
    m.retention(now=600_001)  # silent for longer: it holds nothing back
    assert m.log.min_offset == 3 * FILE_SIZE
    s.r.change_role(1, "b1", 3, 1, {1}, "b2")  # ... and comes back, needing offset 785
    assert s.r.slave is not None
    key = object()
    ha = m.r.master_ha
    assert ha is not None
    ha.opened(key, 0)
    ha.on_data(key, b"".join(s.r.slave.connected(0)), 0)
    with pytest.raises(HAProtocolError, match="below the master's min offset"):
        s.sync(m, key)
    assert s.log.max_offset == 5 * 157  # no gap was filled in


def test_the_chain_crc_before_a_record_is_found_from_the_record() -> None:
    """What an empty slave's log takes as the chain CRC before the master's first record."""
    import random

    rng = random.Random(7)
    for _ in range(500):
        index, term, body_crc, prev = (rng.randrange(1 << 40), rng.randrange(1 << 31), rng.randrange(1 << 32),
                                       rng.randrange(1 << 32))
        assert chain_before(index, term, body_crc, chain_crc(index, term, body_crc, prev)) == prev


# --- the confirm offset file's .bak --------------------------------------------------------------

def test_the_confirm_file_falls_back_to_its_bak(tmp_path: Path) -> None:
    assert read_confirm(tmp_path) == (-1, -1)
    write_confirm(tmp_path, 3270, 19)
    main, bak = tmp_path / CONFIRM_FILE, tmp_path / (CONFIRM_FILE + ".bak")
    assert main.read_bytes() == bak.read_bytes()
    main.unlink()  # upstream's CheckpointFileTest.testAbNormalWriteAndRead
    assert read_confirm(tmp_path) == (3270, 19)
    write_confirm(tmp_path, 4000, 25)
    main.write_bytes(main.read_bytes()[:9])  # torn
    assert read_confirm(tmp_path) == (4000, 25)
    main.write_bytes(b"\xff\xfe")
    assert read_confirm(tmp_path) == (4000, 25)
    bak.unlink()
    assert read_confirm(tmp_path) == (-1, -1)


# --- upstream's AutoSwitchHATest.testTruncateEpochLogAndChangeMaster -------------------------

def test_upstream_truncate_epoch_log_and_change_master(tmp_path: Path, stores: list[FileLedgerStore]) -> None:
    """Upstream deletes broker1's first file by hand and truncates its epoch file's prefix;
    here retention does both (the file has aged, broker2 has acked everything)."""
    clock, disk = Clock(), Disk()
    b1, b2, b3 = (Broker(i, tmp_path / f"b{i}", stores, clock, disk) for i in (1, 2, 3))
    # Step 1: broker1 master, broker2 slave, two epochs of 10 records, one file each:
    # <epoch 1, 0, 1570> <epoch 2, 1570, 3270>
    b1.master(1, {1})
    b1.put(10)
    k2 = b2.follow(b1, 1)
    assert b2.indexes() == (0, 9)
    b1.master(2, {1})
    b1.put(10)
    k2 = b2.follow(b1, 2)
    assert b2.indexes() == (0, 19) and b2.log.max_offset == b1.log.max_offset == 3270
    assert [(e.epoch, e.start) for e in b1.epochs.entries] == [(1, 0), (2, 1570)]
    # Step 2: each epoch in a file of its own
    assert [f.start for f in b1.store.data.files] == [0, FILE_SIZE]
    # Step 3: retention deletes the first file; the epoch file forgets epoch 1 (truncatePrefixByOffset)
    clock.age(HOURS + 1)
    b1.retention()
    assert b1.log.min_offset == FILE_SIZE
    assert [(e.epoch, e.start) for e in b1.epochs.entries] == [(2, 1570)]
    assert [(e.epoch, e.start) for e in EpochFileCache(b1.path / "epochFileCheckpoint").entries] == [(2, 1570)]
    with pytest.raises(StoreError) as e:
        b1.log.read_records(0, 1 << 20, b1.log.max_offset)
    assert e.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
    assert b1.indexes() == (10, 19)
    # Step 4: broker3, empty, joins as a slave: it copies the 10 records from the min offset on
    b3.follow(b1, 2)
    assert b3.indexes() == (10, 19) and b3.log.min_offset == FILE_SIZE
    assert b3.store.read_raw(10, 1 << 20).data.tobytes() == b1.store.read_raw(10, 1 << 20).data.tobytes()
    # Step 5: broker2 master (epoch 3), broker3 its slave: 10 more
    del k2
    b2.master(3, {2})
    b2.put(10)
    b3.follow(b2, 3)
    assert b3.indexes() == (10, 29)
    assert [(e.epoch, e.start) for e in b3.epochs.entries] == [(2, 1570), (3, 3270)]
    # Step 6: broker1 follows broker2 from epoch 3 on: no cut, its log ends as broker2's
    b1.follow(b2, 3)
    assert b1.r.truncated_at is None and b1.indexes() == (10, 29)
    assert b1.log.max_offset == b2.log.max_offset
    assert b1.store.read_raw(10, 1 << 20).data.tobytes() == b2.store.read_raw(10, 1 << 20).data.tobytes()
    assert [(e.epoch, e.start) for e in b1.epochs.entries] == [(2, 1570), (3, 3270)]
    assert b1.epochs.find_by_offset(b1.log.min_offset) is not None  # its epochs cover its min offset
    # and a master change after retention cuts correctly: broker1 becomes master (epoch 4),
    # broker3, holding an epoch-4-less tail of its own, follows it
    b1.master(4, {1})
    b1.put(3)
    b3.follow(b1, 4)
    assert b3.indexes() == b1.indexes() and b3.log.max_offset == b1.log.max_offset
    assert b1.epochs.entries[0].start <= b1.log.min_offset < b1.epochs.entries[0].end
