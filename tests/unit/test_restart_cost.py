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


def _evict(d: Path) -> None:
    """Drop the store's pages from the page cache (a cold start: reads fault in and read ahead)."""
    for p in d.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def test_pages_read_by_a_walk_over_the_log_are_released(tmp_path: Path) -> None:
    _build(tmp_path, 256 * MIB, 96, 1 * MIB)
    s = FileLedgerStore(tmp_path, data_file_size=256 * MIB)
    try:
        before = _rss_file_mib()
        for i in range(s.begin_index, s.end_index + 1):
            s.get(i)  # through the mapping
        read = _rss_file_mib() - before
        s.release_pages(s.begin_index, s.end_index)
        kept = _rss_file_mib() - before
        assert read > 64, f"the walk mapped only {read:.0f} MiB: nothing to release"
        assert kept < 32, f"{kept:.0f} of the {read:.0f} MiB the walk mapped are still resident"
    finally:
        s.close()


def test_the_scrub_walk_maps_nothing_on_a_cold_cache(tmp_path: Path) -> None:
    """verify_entry (the scrub) reads with pread: with a cold page cache the readahead of a
    read through the mapping maps whole folios ahead that release_pages never reaches."""
    _build(tmp_path, 256 * MIB, 96, 1 * MIB)
    s = FileLedgerStore(tmp_path, data_file_size=256 * MIB)
    try:
        _evict(tmp_path)
        before = _rss_file_mib()
        for i in range(s.begin_index, s.end_index + 1):
            assert s.verify_entry(i).index == i
        grew = _rss_file_mib() - before
        assert grew < 8, f"verifying 96 MiB of records left {grew:.0f} MiB of the store's files mapped"
    finally:
        s.close()


def test_verify_entry_by_pread_still_names_rot(tmp_path: Path) -> None:
    """The pread path only ever accepts: a record that fails any check is judged (and named)
    by the checks through the mapping, as before."""
    _build(tmp_path, 1 * MIB, 20, 1000)
    s = FileLedgerStore(tmp_path, data_file_size=1 * MIB)
    try:
        pos = s.unit(7)[1]
        f = s.data.locate(pos)
        body = f.pread(pos - f.start + 60, 1)
        f.write(pos - f.start + 60, bytes([body[0] ^ 1]))  # a body byte: body CRC fails
        assert s.verify(7) is not None and "7" in (s.verify(7) or "")
        assert s.verify(6) is None and s.verify(9) is None
        assert s.verify(8) is None  # its chain link reads the chain CRC in entry 7's header: intact
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
