"""A restart costs what recovery must read, not the size of the files (docs/performance.md,
"Restart cost"): the preallocated rest of the last data file is not faulted in, the data
below the checkpoint's trusted record is not read, and the scrub does not leave the pages it
verified resident."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dledger.codes import ResponseCode
from dledger.entry import MAGIC_CONFIG_CHANGE
from dledger.fsutil import evict_page_cache
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.marks import MAX_MARKS, MagicMarks

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
        evict_page_cache(tmp_path)
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


def _cfg(s: FileLedgerStore) -> list[int]:
    return s.indexes_with_magic(0, 1 << 40, MAGIC_CONFIG_CHANGE)


def _scanned(d: Path) -> list[int]:
    """The CONFIG_CHANGE entries by a scan of the index files alone (no checkpoint marks)."""
    ck = d / "checkpoint"
    state = json.loads(ck.read_text())
    state.pop("markers", None)
    ck.write_text(json.dumps(state))
    s = FileLedgerStore(d, data_file_size=1 * MIB)
    try:
        assert s._marks[MAGIC_CONFIG_CHANGE].upto != s.end_index  # nothing kept: a scan
        return _cfg(s)
    finally:
        s.close()


def test_config_change_entries_are_found_without_scanning_the_index(tmp_path: Path) -> None:
    """A start looks up the log's CONFIG_CHANGE entries (core.changes.recover_configs): the store
    keeps where they are in its checkpoint instead of scanning its whole index each time, and
    the answer is the scan's through appends, follower pushes, truncates and restarts."""
    d, f = tmp_path / "leader", tmp_path / "follower"
    s = FileLedgerStore(d, data_file_size=1 * MIB)
    try:
        s.append_as_leader([b"n" * 500] * 10, 1)
        s.append_as_leader([b"c1"], 1, MAGIC_CONFIG_CHANGE)  # 10
        s.append_as_leader([b"n" * 500] * 3000, 1)  # across data files
        s.append_as_leader([b"c2", b"c3"], 2, MAGIC_CONFIG_CHANGE)  # 3011, 3012
        s.append_as_leader([b"n"] * 5, 2)
        assert _cfg(s) == [10, 3011, 3012]
        s.flush()
        s.write_checkpoint()
        fol = FileLedgerStore(f, data_file_size=1 * MIB)
        try:
            i = 0
            while i <= s.end_index:
                raw = s.read_raw(i, 64 << 10)
                try:
                    fol.append_as_follower(raw.data)
                finally:
                    raw.data.release()
                i += raw.count
            assert _cfg(fol) == [10, 3011, 3012]
        finally:
            fol.close()
    finally:
        s.close()
    kept = json.loads((d / "checkpoint").read_text())["markers"]
    assert kept == {"3": {"upto": 3017, "indexes": [10, 3011, 3012]}, "4": {"upto": 3017, "indexes": []}}
    s = FileLedgerStore(d, data_file_size=1 * MIB)
    try:
        assert s._marks[MAGIC_CONFIG_CHANGE].upto == s.end_index  # taken from the checkpoint, no scan
        assert _cfg(s) == [10, 3011, 3012]
        s.truncate(3012)
        assert _cfg(s) == [10, 3011]
        s.append_as_leader([b"c4"], 3, MAGIC_CONFIG_CHANGE)
        assert _cfg(s) == [10, 3011, 3012]
        s.truncate(11)
        s.append_as_leader([b"n"] * 3, 3)
    finally:
        s.close()
    assert _scanned(d) == [10]
    # marks the log no longer holds (a checkpoint from before a truncate) are never taken
    ck = d / "checkpoint"
    state = json.loads(ck.read_text())
    state["markers"] = {"3": {"upto": 10**6, "indexes": [10, 12, 500000]}}
    ck.write_text(json.dumps(state))
    s = FileLedgerStore(d, data_file_size=1 * MIB)
    try:
        assert _cfg(s) == [10]
    finally:
        s.close()


def _fill_to_near_end(s: FileLedgerStore, files: int) -> None:
    """Append 1 KiB records until the log is in its `files`-th data file (of 1 MiB)."""
    while s.write_pos < (files - 1) * MIB + MIB // 2 + 4096:
        s.append_as_leader([os.urandom(1024)] * 16, 1)


def test_the_next_data_file_is_created_ahead_and_taken_by_the_appender(tmp_path: Path) -> None:
    s = FileLedgerStore(tmp_path, data_file_size=1 * MIB, index_file_size=64 << 10)
    try:
        s.data.settle()
        s.index.settle()  # a fresh store: its first files were created ahead too
        for n in range(1, 5):
            _fill_to_near_end(s, n)
            s.data.settle()
            ahead = s.data.ahead
            assert ahead is not None and ahead.start == n * MIB and ahead.path.exists()
        assert s.data.created_inline == 0, "the appender created a data file itself"
        assert s.index.created_inline == 0, "the appender created an index file itself"
        end = s.end_index
    finally:
        s.close()
    names = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert len(names) == 4, f"a clean close leaves no file past the log's: {names}"
    s = FileLedgerStore(tmp_path, data_file_size=1 * MIB, index_file_size=64 << 10)
    try:
        assert s.end_index == end
    finally:
        s.close()


def _crashed_with_ahead(d: Path) -> tuple[int, list[bytes]]:
    """A store whose next data and index files were created ahead, left as a power loss leaves
    it (not closed: copied while open, after a checkpoint); its end and bodies."""
    src = d.with_name(d.name + "-live")
    s = FileLedgerStore(src, data_file_size=1 * MIB, index_file_size=64 << 10)
    try:
        _fill_to_near_end(s, 2)
        s.flush()
        s.write_checkpoint()
        s.data.settle()
        s.index.settle()
        assert s.data.ahead is not None
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("lock"))
        return s.end_index, [s.get(i).body for i in range(s.end_index + 1)]
    finally:
        s.close()


def test_power_loss_with_a_file_created_ahead(tmp_path: Path) -> None:
    """Whatever a crash leaves of the file created ahead (whole and sparse, 0 bytes: its
    creation cut short, 1 byte), recovery opens the log as it was, and deletes only a file that
    holds nothing; a data file cut short in the middle of its last record loses only that record."""
    cases = ["whole", "zero bytes", "index zero bytes", "one byte", "cut mid-record"]
    for case in cases:
        d = tmp_path / case.replace(" ", "-")
        end, bodies = _crashed_with_ahead(d)
        data = sorted((d / "data").iterdir())
        index = sorted((d / "index").iterdir())
        assert len(data) == 3  # two with records, the next one created ahead
        if case == "zero bytes":
            os.truncate(data[-1], 0)
        elif case == "index zero bytes":
            os.truncate(index[-1], 0)
        elif case == "one byte":
            os.truncate(data[-1], 0)
            data[-1].write_bytes(b"\x01")  # not a creation of ours: never deleted unless provably torn
        elif case == "cut mid-record":
            ck = json.loads((d / "checkpoint").read_text())
            t = ck["trusted"]
            # a record past the checkpoint's trusted one, torn: the file ends inside it
            s = FileLedgerStore(d.with_name(d.name + "-live"), data_file_size=1 * MIB,
                                index_file_size=64 << 10)
            try:
                s.append_as_leader([b"t" * 3000], 1)
                pos = s.unit(s.end_index)[1]
            finally:
                s.close()
            assert pos > t["pos"]
            with open(data[1], "r+b") as fh:
                fh.seek(pos - MIB)
                fh.write(d.with_name(d.name + "-live").joinpath("data", data[1].name).read_bytes()[pos - MIB:
                                                                                                    pos - MIB + 100])
            os.truncate(data[1], pos - MIB + 100)
        s = FileLedgerStore(d, data_file_size=1 * MIB, index_file_size=64 << 10)
        try:
            assert s.end_index == end, case
            assert [s.get(i).body for i in range(end + 1)] == bodies, case
            assert all(s.verify(i) is None for i in range(end + 1))
            s.append_as_leader([b"after"], 1)
            assert s.get(end + 1).body == b"after"
        finally:
            s.close()
        left = sorted(p.name for p in (d / "data").iterdir())
        assert len(left) == 2, (case, left)


def test_without_a_checkpoint_only_an_empty_file_past_the_log_is_deleted(tmp_path: Path) -> None:
    """No checkpoint names what was fsynced (it was lost): the file created ahead, 0 bytes or
    whole, holds nothing and goes; one holding a byte is not provably torn: refused, kept."""
    for case in ("zero bytes", "whole", "one byte"):
        d = tmp_path / case.replace(" ", "-")
        end, bodies = _crashed_with_ahead(d)
        (d / "checkpoint").unlink()
        last = sorted((d / "data").iterdir())[-1]
        if case == "zero bytes":
            os.truncate(last, 0)
        elif case == "one byte":
            os.truncate(last, 0)
            last.write_bytes(b"\x01")
        if case == "one byte":
            with pytest.raises(StoreError) as ei:
                FileLedgerStore(d, data_file_size=1 * MIB, index_file_size=64 << 10)
            assert ei.value.code == ResponseCode.DISK_ERROR
            assert last.read_bytes() == b"\x01"
            continue
        s = FileLedgerStore(d, data_file_size=1 * MIB, index_file_size=64 << 10)
        try:
            assert s.end_index == end and [s.get(i).body for i in range(end + 1)] == bodies
        finally:
            s.close()
        assert not last.exists()


def test_magic_marks_learn_from_their_end_and_give_up_when_not_rare() -> None:
    log = {5: 4, 9: 4, 400: 4}  # index -> magic of the entries that are not NORMAL
    scans: list[tuple[int, int]] = []

    def scan(a: int, b: int) -> list[int]:
        scans.append((a, b))
        return [i for i in range(a, b + 1) if log.get(i) == 4]

    m = MagicMarks(4)
    m.load(None, 0, 999, 999)  # a store without marks: nothing known
    assert m.find(0, 99, 0, scan) == [5, 9] and m.upto == 99
    assert m.find(50, 199, 0, scan) == [] and scans[-1] == (100, 199)  # only what is not known
    assert m.find(0, 150, 0, scan) == [5, 9] and len(scans) == 2  # all known: no scan
    assert m.find(900, 950, 0, scan) == [] and scans[-1] == (900, 950) and m.upto == 199  # far ahead: not learnt
    m.truncated(8)
    assert m.find(0, 8, 0, scan) == [5]
    m.appended(9, 20, 4)
    assert m.find(0, 20, 0, scan) == [5, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    m.appended(21, 21 + MAX_MARKS, 4)  # not rare: dropped, the index is scanned
    assert m.upto is None and m.state(0, 10**6) is None
    n = len(scans)
    assert m.find(0, 500, 0, scan) == [5, 9, 400] and len(scans) == n + 1


def test_a_truncate_into_an_earlier_file_deletes_the_file_created_ahead(tmp_path: Path) -> None:
    s = FileLedgerStore(tmp_path, data_file_size=1 * MIB, index_file_size=64 << 10)
    try:
        _fill_to_near_end(s, 2)
        s.truncate(s.end_index)  # within the last file: the file ahead still follows it
        s.data.settle()
        ahead = s.data.ahead
        assert ahead is not None and ahead.path.exists()
        s.truncate(5)  # into the first file: the second goes, and the one ahead with it
        assert s.data.ahead is None and not ahead.path.exists()
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [f"{0:020d}"]
        s.append_as_leader([b"again"] * 3, 2)
        end = s.end_index
    finally:
        s.close()
    s = FileLedgerStore(tmp_path, data_file_size=1 * MIB, index_file_size=64 << 10)
    try:
        assert s.end_index == end and s.get(end).body == b"again"
    finally:
        s.close()
