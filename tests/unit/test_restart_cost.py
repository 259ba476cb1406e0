"""A restart costs what recovery must read, not the size of the files (docs/performance.md,
"Restart cost"): the preallocated rest of the last data file is not faulted in, the data
below the checkpoint's trusted record is not read, and the scrub does not leave the pages it
verified resident."""

from __future__ import annotations

import os
from pathlib import Path

from dledger.store.file import FileLedgerStore

MIB = 1 << 20


def _rss_file_mib() -> float:
    """File-backed pages mapped into this process (/proc/self/status RssFile)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile in /proc/self/status")


def _build(d: Path, file_size: int, entries: int, body: int) -> None:
    s = FileLedgerStore(d, data_file_size=file_size)
    try:
        for _ in range(entries):
            s.append_as_leader([os.urandom(body)], 1)
        s.flush()
        s.committed_index = s.end_index
        s.write_checkpoint()
    finally:
        s.close()


def test_opening_does_not_fault_in_the_preallocated_rest_of_the_last_file(tmp_path: Path) -> None:
    _build(tmp_path, 256 * MIB, 8, 64 << 10)  # half a MiB written in a 256 MiB file
    before = _rss_file_mib()
    s = FileLedgerStore(tmp_path, data_file_size=256 * MIB)
    try:
        grew = _rss_file_mib() - before
        assert s.end_index == 7
        # recovery zeroes from the log's end to the file's end: comparing that through the
        # mapping faulted in all 256 MiB of the hole
        assert grew < 64, f"opening mapped {grew:.0f} MiB of a store holding half a MiB"
    finally:
        s.close()


def test_damage_below_the_trusted_record_is_not_read_on_open(tmp_path: Path) -> None:
    size = 1 * MIB
    _build(tmp_path, size, 40, 100 << 10)  # 4 data files of 1 MiB
    first = sorted((tmp_path / "data").iterdir())[0]
    assert len(list((tmp_path / "data").iterdir())) >= 3
    with open(first, "r+b") as f:  # a body byte of a record in the middle of the first file
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    s = FileLedgerStore(tmp_path, data_file_size=size)
    try:
        # the damage is real (the scrub would report it), but recovery starts at the trusted
        # record, in the last file: it neither cut the log there nor refused to open
        assert s.end_index == 39
        assert s.recovered_corrupt is None
        assert any(s.verify(i) is not None for i in range(s.begin_index, 10))
    finally:
        s.close()


def test_pages_read_by_a_walk_over_the_log_are_released(tmp_path: Path) -> None:
    _build(tmp_path, 256 * MIB, 96, 1 * MIB)
    s = FileLedgerStore(tmp_path, data_file_size=256 * MIB)
    try:
        before = _rss_file_mib()
        for i in range(s.begin_index, s.end_index + 1):
            s.verify_entry(i)
        read = _rss_file_mib() - before
        s.release_pages(s.begin_index, s.end_index)
        kept = _rss_file_mib() - before
        assert read > 64, f"the walk mapped only {read:.0f} MiB: nothing to release"
        assert kept < 32, f"{kept:.0f} of the {read:.0f} MiB the walk mapped are still resident"
    finally:
        s.close()


def test_the_index_check_of_the_trusted_file_leaves_nothing_resident(tmp_path: Path) -> None:
    size = 64 * MIB
    s = FileLedgerStore(tmp_path, data_file_size=size)
    try:
        body = os.urandom(1024)
        while s.write_pos < size - 4 * MIB:  # the trusted record near the end of the first file
            s.append_as_leader([body] * 1024, 1)
        s.flush()
        s.committed_index = s.end_index
        s.write_checkpoint()
    finally:
        s.close()
    before = _rss_file_mib()
    s = FileLedgerStore(tmp_path, data_file_size=size)
    try:
        kept = _rss_file_mib() - before
        # recovery walked the headers of ~60 MiB of records to check their index units
        assert kept < 16, f"{kept:.0f} MiB of the store's files stay mapped after its open"
    finally:
        s.close()
