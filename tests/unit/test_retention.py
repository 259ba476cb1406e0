"""Retention of FileLedgerStore: old data files are deleted when the disk fills up.

The disk is simulated with `disk_usage=` (a callable returning (used ratio, total
bytes)); `run_retention()` runs a check at once. File ages are set with os.utime.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dledger.codes import ResponseCode
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.retention import Candidate, Plan, aged_out, plan_deletions

DATA_FILE_SIZE = 4096
INDEX_FILE_SIZE = 32 * 16
HOURS = 72.0
CHECK = 0.70
FORCE = 0.85


class FakeDisk:
    """(used ratio, total bytes); by default one data file is 1% of the disk."""

    def __init__(self, ratio: float = 0.5, total: int = 100 * DATA_FILE_SIZE) -> None:
        self.ratio = ratio
        self.total = total

    def __call__(self) -> tuple[float, int]:
        return self.ratio, self.total


def open_store(path: Path, disk: FakeDisk, **kw: Any) -> FileLedgerStore:
    return FileLedgerStore(
        path,
        data_file_size=DATA_FILE_SIZE,
        index_file_size=INDEX_FILE_SIZE,
        file_reserved_hours=HOURS,
        disk_space_ratio_to_check_expired=CHECK,
        disk_space_ratio_to_force_clean=FORCE,
        retention_check_interval_ms=3_600_000,  # only explicit run_retention() calls
        disk_usage=disk,
        **kw,
    )


def body_for(i: int) -> bytes:
    return (b"%d:" % i) * 60  # ~250-300 bytes: about 12 records per 4 KiB file


class Log:
    """A store filled across several data files, and what it holds."""

    def __init__(self, path: Path, disk: FakeDisk, n: int = 160) -> None:
        self.path = path
        self.disk = disk
        self.store = open_store(path, disk)
        self.n = n
        for i in range(0, n, 5):
            self.store.append_as_leader([body_for(j) for j in range(i, min(i + 5, n))], 1 + i // 30)
        self.store.flush()
        self.chains = [self.store.get(i).chain_crc for i in range(n)]
        self.terms = [self.store.get(i).term for i in range(n)]
        # first index of every data file
        self.firsts: list[int] = []
        for i in range(n):
            k = self.store.get(i).pos // DATA_FILE_SIZE
            if k == len(self.firsts):
                self.firsts.append(i)
        assert len(self.firsts) >= 8

    def files(self) -> list[int]:
        """Numbers of the data files on disk (not the next one, created ahead while it is open)."""
        self.store.data.settle()
        ahead = self.store.data.ahead
        return sorted(int(p.name) // DATA_FILE_SIZE for p in (self.path / "data").iterdir()
                      if ahead is None or p != ahead.path)

    def age(self, files: range | list[int], hours: float) -> None:
        t = time.time() - hours * 3600
        for k in files:
            os.utime(self.path / "data" / f"{k * DATA_FILE_SIZE:020d}", (t, t))

    def check_begin(self, store: FileLedgerStore, begin: int) -> None:
        assert store.begin_index == begin
        assert store.end_index == self.n - 1
        if begin > 0:
            assert store.begin_term == self.terms[begin - 1]
            assert store.begin_chain_crc == self.chains[begin - 1]
            assert store.term_at(begin - 1) == self.terms[begin - 1]
            for index in (0, begin - 1):
                with pytest.raises(StoreError) as ei:
                    store.get(index)
                assert ei.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
                with pytest.raises(StoreError) as ei:
                    store.read_raw(index, 100)
                assert ei.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
        for i in range(begin, self.n):
            e = store.get(i)
            assert (e.body, e.chain_crc) == (body_for(i), self.chains[i])
        assert [e.index for e in store.read(begin)] == list(range(begin, self.n))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    lg = Log(tmp_path / "s", FakeDisk())
    yield lg
    lg.store.close()


def test_below_check_ratio_nothing_is_deleted(log: Log) -> None:
    log.store.set_committed(log.n - 1)
    log.age(log.files(), 1000)
    for ratio in (0.0, 0.5, CHECK):
        log.disk.ratio = ratio
        log.store.run_retention()
        assert log.files() == list(range(len(log.firsts)))
        assert log.store.begin_index == 0
        assert not log.store.disk_full


def test_expired_files_below_the_commit_index_are_deleted(log: Log) -> None:
    s = log.store
    s.set_committed(log.n - 1)
    log.age(range(3), 100)  # files 0..2 are older than 72 h, the others are new
    log.age(range(3, 5), 10)
    log.disk.ratio = 0.75
    s.run_retention()
    assert log.files() == list(range(3, len(log.firsts)))
    log.check_begin(s, log.firsts[3])
    assert s.begin_pos == 3 * DATA_FILE_SIZE
    assert not s.disk_full
    # index files wholly below the new begin are gone too
    for p in (log.path / "index").iterdir():
        assert int(p.name) + INDEX_FILE_SIZE > log.firsts[3] * 32
    # a second run finds nothing more to delete (files 3.. are not expired)
    s.run_retention()
    assert log.files()[0] == 3


def test_only_files_wholly_below_the_commit_index_are_deleted(log: Log) -> None:
    s = log.store
    log.age(log.files(), 100)
    log.disk.ratio = 0.75
    s.run_retention()  # nothing committed: nothing may go
    assert log.files()[0] == 0
    # committed up to the entry before file 2's first: files 0 and 1 hold only committed entries
    s.set_committed(log.firsts[2] - 2)
    s.run_retention()
    assert log.files()[0] == 1  # file 1's last entry is not committed yet
    s.set_committed(log.firsts[2] - 1)
    s.run_retention()
    assert log.files()[0] == 2
    log.check_begin(s, log.firsts[2])
    s.set_committed(log.firsts[4] + 3)
    s.run_retention()
    assert log.files()[0] == 4
    log.check_begin(s, log.firsts[4])


def test_retention_floor_is_respected(log: Log) -> None:
    s = log.store
    s.set_committed(log.n - 1)
    log.age(log.files(), 100)
    s.set_retention_floor(log.firsts[1] + 1)  # a follower still needs entry firsts[1] + 1
    log.disk.ratio = 0.95  # even when forcing
    s.run_retention()
    assert log.files()[0] == 1
    log.check_begin(s, log.firsts[1])
    s.set_retention_floor(log.firsts[3])
    s.run_retention()
    assert log.files()[0] == 3


def test_force_clean_deletes_unexpired_files_oldest_first(log: Log) -> None:
    s = log.store
    s.set_committed(log.n - 1)
    log.disk.total = 10 * DATA_FILE_SIZE  # a data file is 10% of the disk
    log.disk.ratio = 0.80  # above check, below force: new files stay
    s.run_retention()
    assert log.files()[0] == 0
    log.disk.ratio = 0.88  # above force: delete until back under the check ratio (2 files)
    s.run_retention()
    assert log.files()[0] == 2
    log.check_begin(s, log.firsts[2])
    assert not s.disk_full


def test_force_clean_never_deletes_the_last_file_or_the_floor(log: Log) -> None:
    s = log.store
    s.set_committed(log.n - 1)
    last = len(log.firsts) - 1
    log.disk.total = 10**12  # deletions free almost nothing: everything allowed goes
    log.disk.ratio = 0.99
    s.run_retention()
    assert log.files() == [last]
    log.check_begin(s, log.firsts[last])
    assert s.disk_full  # still above the force ratio
    with pytest.raises(StoreError) as ei:
        s.append_as_leader([b"no room"], 9)
    assert ei.value.code == ResponseCode.DISK_FULL


def test_disk_full_when_nothing_can_be_freed_and_recovery_when_usage_drops(
    log: Log, tmp_path: Path
) -> None:
    s = log.store
    s.set_committed(log.firsts[1] - 2)  # file 0 still holds an uncommitted entry
    log.age(log.files(), 100)
    log.disk.ratio = 0.95
    s.run_retention()
    assert log.files()[0] == 0
    assert s.disk_full
    with pytest.raises(StoreError) as ei:
        s.append_as_leader([b"x"], 9)
    assert ei.value.code == ResponseCode.DISK_FULL
    assert s.write_error() is None  # a client append is refused, but the member may still lead
    noop = s.append_as_leader([b""], 9, magic=2)  # a new leader's NOOP still goes
    assert s.get(noop.first_index).magic == 2
    # a follower append still goes: a lagging member catching up is what frees the floor
    # (refusing it deadlocked a group whose disks all filled while one member lagged)
    other = open_store(tmp_path / "other", FakeDisk())
    try:
        other.append_as_leader([body_for(i) for i in range(log.n)], 1)
        raw = other.read_raw(0, 1 << 20)
        try:
            f = open_store(tmp_path / "follower", FakeDisk(0.95))
            try:
                f.run_retention()
                assert f.disk_full
                assert f.append_as_follower(raw.data) == raw.count - 1
            finally:
                f.close()
        finally:
            raw.data.release()
    finally:
        other.close()
    # reads still work while the disk is full
    assert s.get(0).body == body_for(0)
    end = s.end_index
    # usage drops (an operator freed space): the flag clears at the next check
    log.disk.ratio = 0.5
    s.run_retention()
    assert not s.disk_full
    r = s.append_as_leader([b"room again"], 9)
    assert r.first_index == end + 1
    assert s.get(end + 1).body == b"room again"


def test_reopen_keeps_the_new_begin(log: Log) -> None:
    s = log.store
    s.set_committed(log.firsts[4] - 1)  # files 0..3 hold only committed entries
    log.age(log.files(), 100)
    log.disk.ratio = 0.75
    s.run_retention()
    begin = log.firsts[4]
    log.check_begin(s, begin)
    old_terms = set(log.terms[:begin]) - set(log.terms[begin:])
    s.close()
    log.store = s = open_store(log.path, log.disk)
    log.check_begin(s, begin)
    assert s.begin_pos == 4 * DATA_FILE_SIZE
    assert s.committed_index == begin - 1
    for t in old_terms:
        assert s.first_index_of_term(t) == -1
    assert s.first_index_of_term(log.terms[begin]) == begin
    # the log goes on, and survives another reopen
    s.append_as_leader([b"after retention"], log.terms[-1])
    s.close()
    log.store = s = open_store(log.path, log.disk)
    assert (s.begin_index, s.end_index) == (begin, log.n)
    assert s.get(log.n).body == b"after retention"
    # truncating everything left goes back to the retention begin, not to 0
    s.truncate(begin)
    assert (s.end_index, s.end_term, s.end_chain_crc) == (
        begin - 1, log.terms[begin - 1], log.chains[begin - 1],
    )
    assert s.pos_of_next() == 4 * DATA_FILE_SIZE
    s.append_as_leader([b"fresh"], log.terms[-1])
    assert s.get(begin).body == b"fresh"


# --- the policy -------------------------------------------------------------------------------

NOW = 1_000_000_000.0


def _reference(
    candidates: list[Candidate], ratio: float, total: int, hours: float, check: float, force: float
) -> Plan:
    """The policy in words: nothing at or below `check`; above it delete leading expired
    files; above `force` also unexpired ones while usage is above `check`; full when usage
    stays above `force`."""
    if ratio <= check:
        return Plan(0, False)
    forcing = ratio > force
    n = 0
    for c in candidates:
        expired = c.mtime < NOW - hours * 3600
        if expired or (forcing and ratio > check):
            n += 1
            ratio -= c.size / total
        else:
            break
    return Plan(n, ratio > force)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes_ages=st.lists(
        st.tuples(st.integers(1, 1 << 30), st.floats(0, 500)), max_size=30
    ),
    ratio=st.floats(0, 1),
    total=st.integers(1 << 20, 1 << 40),
    hours=st.floats(0, 200),
    check=st.floats(0.1, 0.9),
    gap=st.floats(0, 0.3),
)
def test_plan_deletions_properties(
    sizes_ages: list[tuple[int, float]],
    ratio: float,
    total: int,
    hours: float,
    check: float,
    gap: float,
) -> None:
    force = min(check + gap, 1.0)
    candidates = [Candidate(size, NOW - age * 3600) for size, age in sizes_ages]
    plan = plan_deletions(candidates, ratio, total, NOW, hours, check, force)
    assert 0 <= plan.delete <= len(candidates)
    assert plan == _reference(candidates, ratio, total, hours, check, force)
    if ratio <= check:
        assert plan == Plan(0, False)
    if ratio <= force:
        assert not plan.disk_full
    # without forcing only expired files go
    if ratio <= force:
        for c in candidates[: plan.delete]:
            assert c.mtime < NOW - hours * 3600


def test_plan_deletions_examples() -> None:
    old, new = NOW - 100 * 3600, NOW - 3600
    gib = 1 << 30
    c = [Candidate(gib, old), Candidate(gib, old), Candidate(gib, new), Candidate(gib, old)]
    total = 10 * gib  # one file is 10% of the disk
    # at or below the check ratio: nothing
    assert plan_deletions(c, 0.70, total, NOW, 72, 0.70, 0.85) == Plan(0, False)
    # above it: the leading expired files only (stops at the first unexpired one)
    assert plan_deletions(c, 0.75, total, NOW, 72, 0.70, 0.85) == Plan(2, False)
    # above force: also unexpired ones until usage is back under the check ratio
    assert plan_deletions(c, 0.88, total, NOW, 72, 0.70, 0.85) == Plan(2, False)
    # ... the new file goes at 0.95 (0.75 left after two), and expired ones after it anyway
    assert plan_deletions(c, 0.95, total, NOW, 72, 0.70, 0.85) == Plan(4, False)
    # nothing to delete while above force: full
    assert plan_deletions([], 0.90, total, NOW, 72, 0.70, 0.85) == Plan(0, True)
    # all deletable files are not enough: full
    assert plan_deletions(c[:1], 0.99, total, NOW, 72, 0.70, 0.85) == Plan(1, True)
    # file_reserved_hours: a file exactly as old as the limit is not expired yet
    edge = [Candidate(gib, NOW - 72 * 3600)]
    assert plan_deletions(edge, 0.75, total, NOW, 72, 0.70, 0.85) == Plan(0, False)


def test_a_follower_holding_retention_under_pressure_is_reported(log: Log) -> None:
    """Disk pressure held back by a lagging follower is said (status, metrics, log), and a
    full disk then names the holder instead of stranding it silently."""
    s = log.store
    s.set_committed(log.n - 1)
    log.age(log.files(), 100)
    s.set_retention_floor(log.firsts[1] + 1, "follower n2")
    log.disk.ratio = 0.99
    s.run_retention()
    assert log.files()[0] == 1
    assert s.retention_held_by == f"follower n2 needs index {log.firsts[1] + 1}"
    err = s.pressure_error()
    assert err is not None and err.code == ResponseCode.DISK_FULL and "follower n2" in err.message
    assert s.write_error() is None
    s.set_retention_floor(None)
    s.run_retention()
    assert s.retention_held_by == ""


def test_retention_hours_delete_old_files_without_disk_pressure(log: Log) -> None:
    """`retention_hours` (Kafka's log.retention.hours): files last written longer ago go at
    any disk usage, oldest first, never past the commit index or a floor, and stop at the
    first younger file."""
    s = log.store
    s.retention_hours = 2.0
    log.disk.ratio = 0.0  # an empty disk: the pressure rules delete nothing
    log.age(range(4), 3)  # files 0..3 are 3 h old
    log.age([4], 1)  # file 4 is younger than the limit: it and all after it stay
    log.age(range(5, len(log.firsts) - 1), 3)
    s.run_retention()  # nothing committed yet: nothing goes
    assert log.files()[0] == 0
    s.set_committed(log.n - 1)
    s.set_retention_floor(log.firsts[2], "follower n2")  # a live follower needs file 2 on
    s.run_retention()
    assert log.files()[0] == 2
    log.check_begin(s, log.firsts[2])
    s.set_retention_floor(None)
    s.run_retention()
    assert log.files()[0] == 4  # file 4 is too young, and files after it wait for it
    log.check_begin(s, log.firsts[4])
    s.retention_hours = 0.0  # off: the old files after it stay too
    log.age([4], 3)
    s.run_retention()
    assert log.files()[0] == 4


def test_a_retention_pass_stats_each_file_once(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """One candidate list per pass (a stat() per data file, under the store lock), whatever
    the floors and rules: eager retention after a compaction request runs passes every few
    hundred ms. The pass still honours every rule from that one list."""
    from dledger.store import file as store_file

    stats: list[str] = []
    real = store_file._mtime

    def counting(f: Any) -> float:
        stats.append(f.path.name)
        return real(f)

    monkeypatch.setattr(store_file, "_mtime", counting)
    s = log.store
    s.set_committed(log.n - 1)
    s.set_retention_floor(log.firsts[3] + 1, "follower n2")
    s.run_retention()  # no pressure, age retention off: nothing goes
    assert log.files()[0] == 0
    # every file but the last, once (those below the committed floor: the held-back check's list)
    assert len(stats) == len(set(stats)) == len(log.firsts) - 1
    stats.clear()
    s.retention_hours = 2.0
    log.age(range(2), 3)
    log.disk.ratio = 0.99  # pressure: the follower's floor holds files 2.. back (reported)
    s.run_retention()
    assert len(stats) == len(set(stats)), f"a file was stat()ed twice in one pass: {stats}"
    assert log.files()[0] == 3
    assert s.retention_held_by == f"follower n2 needs index {log.firsts[3] + 1}"


def test_retention_hours_survive_a_reopen(tmp_path: Path) -> None:
    """The begin moved by age retention is checkpointed: a reopened store begins there."""
    lg = Log(tmp_path / "s", FakeDisk(0.0))
    lg.store.set_committed(lg.n - 1)
    lg.store.retention_hours = 1.0
    lg.age(range(3), 2)
    lg.store.run_retention()
    lg.store.close()
    s = open_store(lg.path, lg.disk)
    try:
        lg.check_begin(s, lg.firsts[3])
    finally:
        s.close()


def test_aged_out_examples() -> None:
    now = 1_000_000.0
    c = [Candidate(1, now - 5 * 3600), Candidate(1, now - 3 * 3600), Candidate(1, now - 1 * 3600),
         Candidate(1, now - 4 * 3600)]
    assert aged_out(c, now, 2) == 2  # stops at the first younger file
    assert aged_out(c, now, 0) == 0  # off
    assert aged_out(c, now, 6) == 0
    assert aged_out([Candidate(1, now - 2 * 3600)], now, 2) == 0  # exactly as old: kept


def test_retention_keys_and_upstream_names() -> None:
    """A member's TOML takes upstream DLedger's names (fileReservedHours); both names for one
    key are refused; a negative age is refused."""
    from dledger.config import ConfigError, DLedgerConfig

    cfg = DLedgerConfig.from_dict({"fileReservedHours": 5, "retention_hours": 0.5,
                                   "mappedFileSizeForEntryData": 1 << 20})
    assert (cfg.file_reserved_hours, cfg.retention_hours, cfg.data_file_size) == (5.0, 0.5, 1 << 20)
    with pytest.raises(ConfigError, match="file_reserved_hours is given twice"):
        DLedgerConfig.from_dict({"fileReservedHours": 5, "file_reserved_hours": 6})
    with pytest.raises(ConfigError, match="retention_hours must not be negative"):
        DLedgerConfig.from_dict({"retention_hours": -1}).validate()
