"""A broker's epoch file (upstream's EpochFileCache) and the truncation point: upstream's
EpochFileCacheTest, the file format's worked examples byte for byte, and the [improve]s."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.broker.epoch_file import (
    INFINITY,
    EpochEntry,
    EpochFileCache,
    EpochFileError,
    decode,
    encode,
    find_consistent_point,
)


@pytest.fixture
def cache(tmp_path: Path) -> EpochFileCache:
    c = EpochFileCache(tmp_path / "epochFileCheckpoint")
    for epoch, start in ((1, 100), (2, 300), (3, 500)):
        assert c.append_entry(epoch, start)
    return c


def test_the_file_format_byte_for_byte(cache: EpochFileCache) -> None:
    assert cache.path is not None
    assert cache.path.read_bytes() == b"3\n453994644\n1-100\n2-300\n3-500\n"
    assert encode([EpochEntry(7, 7000), EpochEntry(8, 8000)]) == b"2\n773307083\n7-7000\n8-8000\n"
    assert encode([]) == b"0\n0\n"


def test_setup_and_init_from_file(cache: EpochFileCache) -> None:
    """upstream's setup (entry 2 = 300..500) and testInitFromFile (ends survive a reload)."""
    assert cache.entries[1] == EpochEntry(2, 300, 500)
    again = EpochFileCache(cache.path)
    assert again.entries == [EpochEntry(1, 100, 300), EpochEntry(2, 300, 500), EpochEntry(3, 500, INFINITY)]


def test_truncate(cache: EpochFileCache) -> None:
    cache.truncate_suffix_by_offset(150)
    assert cache.entries == [EpochEntry(1, 100)]  # the last end is +infinity again (upstream: a copy's)
    assert EpochFileCache(cache.path).entries == [EpochEntry(1, 100)]


def test_find_by_offset(cache: EpochFileCache) -> None:
    found = cache.find_by_offset(350)
    assert found is not None and found.epoch == 2
    assert cache.find_by_offset(50) is None and cache.next_entry(2) == EpochEntry(3, 500)


@pytest.mark.parametrize(("local", "master", "point"), [
    ([(1, 100, 300), (2, 300, 500), (3, 500, INFINITY)], [(1, 100, 300), (2, 300, 450), (3, 450, INFINITY)], 450),
    ([(1, 100, 300), (2, 300, 500), (3, 500, 700)], [(1, 100, 300), (2, 300, 500), (3, 500, 600)], 600),
    ([(1, 100, 300), (2, 300, 500), (3, 500, 700)], [(1, 200, 500), (2, 500, INFINITY)], -1),
    ([(1, 100, 300), (2, 300, 500), (3, 500, 800), (4, 800, INFINITY)], [(1, 100, 300), (2, 300, 500),
                                                                         (3, 500, 700)], 700),
])
def test_find_consistent_point(local: list[tuple[int, int, int]], master: list[tuple[int, int, int]],
                               point: int) -> None:
    """upstream's testFindConsistentPointSample1..4 (upstream's EpochFileCacheTest)."""
    assert find_consistent_point([EpochEntry(*e) for e in local], [EpochEntry(*e) for e in master]) == point


def test_all_entries_truncated_stays_empty_after_a_restart(cache: EpochFileCache) -> None:
    """upstream's write([]) did nothing: the entries came back after a restart."""
    cache.truncate_suffix_by_epoch(1)
    assert cache.entries == [] and cache.last_epoch == -1
    assert cache.path is not None and cache.path.read_bytes() == b"0\n0\n"
    assert EpochFileCache(cache.path).entries == []


def test_an_epoch_without_data_is_replaced_not_lost(cache: EpochFileCache) -> None:
    """Two epochs beginning at the same offset (no data written in between): the newer one is
    kept (upstream refused it and lost the epoch, PR #9942); older or earlier ones are refused."""
    assert cache.append_entry(4, 500)
    assert [(e.epoch, e.start) for e in cache.entries] == [(1, 100), (2, 300), (4, 500)]
    assert not cache.append_entry(4, 900) and not cache.append_entry(5, 400)
    assert cache.last_epoch == 4 and cache.with_last_end(900)[-1] == EpochEntry(4, 500, 900)


def test_prefix_truncation_and_a_damaged_file(cache: EpochFileCache, tmp_path: Path) -> None:
    cache.truncate_prefix_by_offset(350)
    assert [e.epoch for e in cache.entries] == [2, 3]
    path = cache.path
    assert path is not None
    good = path.read_bytes()
    path.with_name(path.name + ".bak").write_bytes(good)
    path.write_bytes(good.replace(b"2-300", b"2-301"))  # the CRC no longer holds
    with pytest.raises(EpochFileError):
        decode(path.read_bytes())
    assert [e.epoch for e in EpochFileCache(path).entries] == [2, 3]  # from the .bak
    for bad in (b"", b"x\n", b"2\n0\n1-100\n"):
        with pytest.raises(EpochFileError):
            decode(bad)


def test_upstream_abnormal_write_and_read_reads_the_bak(tmp_path: Path) -> None:
    """CheckpointFileTest.testAbNormalWriteAndRead: write, delete the main file, read gives
    what was written (from the .bak); written again, read again."""
    path = tmp_path / "epochFileCheckpoint"
    c = EpochFileCache(path)
    c.append_entry(7, 7000)
    c.append_entry(8, 8000)
    want = [(7, 7000), (8, 8000)]
    path.unlink()
    again = EpochFileCache(path)
    assert [(e.epoch, e.start) for e in again.entries] == want
    again.append_entry(9, 9000)  # written again: both files
    assert path.read_bytes() == path.with_name(path.name + ".bak").read_bytes()
    assert [(e.epoch, e.start) for e in EpochFileCache(path).entries] == [*want, (9, 9000)]


def test_a_torn_main_file_reads_the_bak(tmp_path: Path) -> None:
    path = tmp_path / "epochFileCheckpoint"
    c = EpochFileCache(path)
    c.append_entry(1, 0)
    c.append_entry(2, 1570)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a torn write of the main file
    assert [(e.epoch, e.start) for e in EpochFileCache(path).entries] == [(1, 0), (2, 1570)]


def test_prefix_truncation_keeps_the_epoch_that_spans_the_offset_and_survives_a_restart(
        cache: EpochFileCache) -> None:
    """truncatePrefixByOffset: entries ending at or before the offset go; the one the offset
    falls in keeps its start (a slave compares starts to find the consistent point); the last
    one (end: +infinity) never goes."""
    cache.truncate_prefix_by_offset(300)
    assert [(e.epoch, e.start) for e in cache.entries] == [(2, 300), (3, 500)]
    cache.truncate_prefix_by_offset(10_000)
    assert cache.path is not None
    assert [(e.epoch, e.start, e.end) for e in EpochFileCache(cache.path).entries] == [(3, 500, INFINITY)]
