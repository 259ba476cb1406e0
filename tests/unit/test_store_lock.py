"""One writer per store directory: a second FileLedgerStore (in this process or another)
is refused with DISK_ERROR naming the holder; closing or dying releases the directory;
offline readers need no lock and read a directory a live store holds."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dledger import DLedgerConfig, DLedgerServer
from dledger.codes import ResponseCode
from dledger.ports import free_ports
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.lock import LOCK_NAME


def open_store(path: Path) -> FileLedgerStore:
    return FileLedgerStore(path, data_file_size=1 << 16, index_file_size=32 * 256,
                           retention_check_interval_ms=3_600_000)


def test_second_store_on_one_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    d = tmp_path / "s"
    first = open_store(d)
    try:
        r = first.append_as_leader([b"a", b"b"], term=1)
        with pytest.raises(StoreError) as ei:
            open_store(d)
        assert ei.value.code == ResponseCode.DISK_ERROR
        msg = ei.value.message
        assert str(d) in msg and f"process {os.getpid()}" in msg, msg
        assert "\n" not in msg
        # the refusal changed nothing: the holder keeps writing and reading
        r2 = first.append_as_leader([b"c"], term=1)
        assert r2.first_index == r.last_index + 1
        assert [first.get(i).body for i in range(r.first_index, r2.first_index + 1)] == [b"a", b"b", b"c"]
        assert (d / LOCK_NAME).read_text().strip() == str(os.getpid())
    finally:
        first.close()
    again = open_store(d)  # closed: the directory is free, and nothing was lost
    try:
        assert [again.get(i).body for i in range(again.begin_index, again.end_index + 1)] == [b"a", b"b", b"c"]
    finally:
        again.close()


def test_the_lock_is_on_the_directory_not_its_name(tmp_path: Path) -> None:
    d = tmp_path / "s"
    link = tmp_path / "link"
    link.symlink_to(d, target_is_directory=True)
    first = open_store(d)
    try:
        with pytest.raises(StoreError) as ei:
            open_store(link)
        assert ei.value.code == ResponseCode.DISK_ERROR
        assert str(link) in ei.value.message  # named as the refused opener spelled it
    finally:
        first.close()


def test_failed_open_releases_the_directory(tmp_path: Path) -> None:
    d = tmp_path / "s"
    open_store(d).close()
    (d / "currterm").write_bytes(b"\x00garbage")  # recovery refuses to forget a vote
    with pytest.raises(StoreError) as ei:
        open_store(d)
    assert "currterm" in ei.value.message  # the real reason, not "in use"
    (d / "currterm").unlink()
    open_store(d).close()  # a lock left behind by the failed open would refuse this


WRITER = textwrap.dedent("""
    import sys, time
    from dledger.store.file import FileLedgerStore
    store = FileLedgerStore(sys.argv[1], data_file_size=1 << 16, index_file_size=32 * 256)
    store.append_as_leader([b"from the child"], term=1)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_a_holder_killed_with_sigkill_releases_the_directory(tmp_path: Path) -> None:
    d = tmp_path / "s"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError) as ei:
            open_store(d)
        assert ei.value.code == ResponseCode.DISK_ERROR
        assert f"process {child.pid}" in ei.value.message, ei.value.message
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        store = open_store(d)  # the kernel dropped the dead holder's lock
        try:
            assert store.get(store.end_index).body == b"from the child"
            assert (d / LOCK_NAME).read_text().strip() == str(os.getpid())
        finally:
            store.close()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()


def test_offline_reader_reads_a_directory_a_live_store_holds(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from dledger.spark.files import plan, read_file

    d = tmp_path / "s"
    store = open_store(d)
    try:
        bodies = [f"entry-{k}".encode() for k in range(50)]
        store.append_as_leader(bodies, term=1)
        store.flush()
        store.set_committed(store.end_index)
        store.write_checkpoint()
        parts = plan(d, include_uncommitted=False)
        read = [b for p in parts for batch in read_file(p) for b in batch.column("body").to_pylist()]
        assert read == bodies
        store.append_as_leader([b"still writable"], term=1)  # the reader took no lock
    finally:
        store.close()


def test_embedded_server_refuses_a_store_directory_in_use_and_unlocks_what_it_opened(tmp_path: Path) -> None:
    """A server whose second group's store is held fails to start, and closes the first
    group's store again: that directory is free afterwards."""
    (port,) = free_ports(1)
    held = open_store(tmp_path / "payments")
    try:
        def cfg(group: str, port: int) -> DLedgerConfig:
            return DLedgerConfig(group=group, self_id="n0", peers=f"n0-127.0.0.1:{port}",
                                 store_dir=str(tmp_path / group), data_file_size=1 << 16)

        server = DLedgerServer([cfg("orders", port), cfg("payments", port)])
        with pytest.raises(StoreError) as ei:
            asyncio.run(server.start())
        assert ei.value.code == ResponseCode.DISK_ERROR
        assert str(tmp_path / "payments") in ei.value.message
        open_store(tmp_path / "orders").close()  # released by the failed start
    finally:
        held.close()
