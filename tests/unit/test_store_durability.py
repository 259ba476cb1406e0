"""The durable index never names what the disk does not hold (issue 10, finding 2), and disk
errors surface as response codes."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.codes import ResponseCode
from dledger.store.base import LedgerStore, StoreError
from dledger.store.file import FileLedgerStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileLedgerStore]:
    s = FileLedgerStore(tmp_path / "s", flush="sync", data_file_size=1 << 20, index_file_size=32 * 1024)
    s._flusher.stop()  # flushes driven by hand, to force the interleaving
    yield s
    s.close()


def _truncate_in_publish_gap(s: FileLedgerStore, reappend: int) -> None:
    """Make the next publish first run what the event loop may run between the flush
    thread's computing the durable index and publishing it: a follower's TRUNCATE of
    entries 5.. and an APPEND of new, unsynced entries."""
    armed = {"on": True}
    orig = LedgerStore._publish_durable.__get__(s)

    def publish(index: int) -> None:
        if armed["on"]:
            armed["on"] = False
            s.truncate(5)
            s.append_as_leader([b"new%d" % i for i in range(reappend)], 2)
        orig(index)

    s._publish_durable = publish  # type: ignore[method-assign]


def test_a_truncate_during_publish_does_not_leave_unsynced_entries_durable(store: FileLedgerStore) -> None:
    """b_publish_race: durable_index jumped back above the truncate (to 9) although 5 and 6
    were never fsynced, and the next checkpoint failed the store for good."""
    store.append_as_leader([b"old%d" % i for i in range(10)], 1)
    _truncate_in_publish_gap(store, 2)
    store.flush_once()
    assert store.end_index == 6
    assert store.durable_index == 4
    store.write_checkpoint()  # raised DISK_ERROR before (unit 7 no longer exists)
    assert store.write_error() is None


def test_the_checkpoint_never_trusts_records_that_were_not_fsynced(store: FileLedgerStore) -> None:
    """b2_checkpoint: the re-appended entries commit; the checkpoint called them durable
    and committed although they were never fsynced."""
    store.append_as_leader([b"old%d" % i for i in range(10)], 1)
    _truncate_in_publish_gap(store, 5)
    store.flush_once()
    store.set_committed(9)
    store.write_checkpoint()
    ck = json.loads((store.dir / "checkpoint").read_text())
    assert ck["trusted"]["index"] <= 4
    assert ck["committed_index"] <= 4
    store.flush_once()
    store.write_checkpoint()
    ck = json.loads((store.dir / "checkpoint").read_text())
    assert ck["trusted"]["index"] == 9 and ck["committed_index"] == 9


def _fail_pwrite(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    def pwrite(fd: int, data: Any, offset: int) -> int:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_a_full_disk_is_disk_full_and_the_append_leaves_nothing(store: FileLedgerStore,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store.append_as_leader([b"a", b"b"], 1)
    with monkeypatch.context() as m:
        _fail_pwrite(m, errno.ENOSPC)
        with pytest.raises(StoreError) as e:
            store.append_as_leader([b"c"], 1)
    assert e.value.code == ResponseCode.DISK_FULL
    assert store.end_index == 1
    err = store.write_error()
    assert err is not None and err.code == ResponseCode.DISK_FULL  # until retention finds room again
    store.run_retention()  # the (fake-free) disk has room
    assert store.write_error() is None
    store.append_as_leader([b"c"], 1)
    assert store.get(2).body == b"c"


def test_an_io_error_is_disk_error(store: FileLedgerStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        _fail_pwrite(m, errno.EIO)
        with pytest.raises(StoreError) as e:
            store.append_as_leader([b"c"], 1)
    assert e.value.code == ResponseCode.DISK_ERROR
    assert store.end_index == -1


def test_a_failed_fsync_fails_the_store_for_good(store: FileLedgerStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append_as_leader([b"a"], 1)

    def fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "fdatasync", fdatasync)
        with pytest.raises(OSError):
            store.flush_once()
    store.fail(OSError(errno.EIO, "fsync failed"))  # what the flush thread does with that error
    err = store.write_error()
    assert err is not None and err.code == ResponseCode.DISK_ERROR
    with pytest.raises(StoreError):
        store.append_as_leader([b"b"], 1)


def test_a_write_that_fails_half_way_leaves_nothing_a_recovery_could_bring_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record bytes were written, the index unit write failed: the caller saw the append
    fail, so no reopen may find the record."""
    d = tmp_path / "s"
    s = FileLedgerStore(d, flush="sync", data_file_size=1 << 20, index_file_size=32 * 1024)
    s.append_as_leader([b"a"], 1)
    s.flush()
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:  # the data write went through; the index unit write fails
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, data, offset)

    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", pwrite)
        with pytest.raises(StoreError):
            s.append_as_leader([b"ghost"], 1)
    s.close()
    s = FileLedgerStore(d, flush="sync", data_file_size=1 << 20, index_file_size=32 * 1024)
    assert s.end_index == 0
    s.close()


_CRASH_CHILD = r'''
import os, sys
from dledger.store.file import FileLedgerStore
from dledger.store import mapped_file
d, what = sys.argv[1], sys.argv[2]
s = FileLedgerStore(d, flush="sync", data_file_size=4096, index_file_size=32 * 1024,
                    disk_usage=lambda: (0.95, 1 << 20))
for _ in range(20):
    s.append_as_leader([b"x" * 200] * 3, 1)
s.flush()
def crash(*a, **k):
    os._exit(0)  # power loss in the middle of the operation
if what == "retention":
    s.set_committed(s.end_index)
    s.write_checkpoint()
    mapped_file.MappedFileList.drop_first = crash  # after the new begin is checkpointed
    s.run_retention()
else:
    s.set_committed(30)
    s.write_checkpoint()
    if what == "truncate-zero":
        mapped_file.MappedFile.zero = crash  # the records are being zeroed
    else:
        import dledger.store.file as file_store
        file_store.write_atomic = crash  # the checkpoint is being rewritten
    s.truncate(40)
os._exit(3)
'''


def _crash_in(tmp_path: Path, what: str) -> FileLedgerStore:
    import subprocess
    import sys

    d = tmp_path / what
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    subprocess.run([sys.executable, "-c", _CRASH_CHILD, str(d), what], check=True, env=env)
    return FileLedgerStore(d, flush="sync", data_file_size=4096, index_file_size=32 * 1024)


def test_a_crash_during_retention_leaves_a_store_that_opens_and_reads(tmp_path: Path) -> None:
    """Found in review: retention deleted files, then checkpointed the new begin; a crash in
    between left a checkpoint naming deleted files and every read failed after the reopen."""
    s = _crash_in(tmp_path, "retention")
    try:
        assert s.begin_index > 0
        for i in range(s.begin_index, s.end_index + 1):
            assert s.get(i).index == i
        assert s.data.files[0].start == s.begin_pos  # the leftovers before the begin are gone
    finally:
        s.close()


@pytest.mark.parametrize("at", ["truncate-zero", "truncate-checkpoint"])
def test_a_crash_during_truncate_leaves_a_store_that_opens(tmp_path: Path, at: str) -> None:
    """Found in review: truncate zeroed records, then rewrote the checkpoint; a crash in
    between left a checkpoint trusting a zeroed record: the store refused to open."""
    s = _crash_in(tmp_path, at)
    try:
        assert s.end_index >= 39
        assert [s.get(i).index for i in range(40)] == list(range(40))
    finally:
        s.close()
