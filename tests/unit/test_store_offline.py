"""The offline view of a store directory (store/offline.py, issue 27): file listing, the
record-header rules, a torn tail, the checkpoint and currterm rule (missing: None;
unreadable: an error every reader turns into a refusal or a reported problem), bools that
are not ints, and a store upstream DLedger wrote (../shared/fixtures/upstream-dledger-store)."""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from dledger.codes import ResponseCode
from dledger.entry import (
    BLANK,
    HEADER,
    HEADER_SIZE,
    MAGIC_NOOP,
    RUNS_PAST,
    CorruptRecord,
    decode_entry,
    encode_entry,
    header_fault,
    magic_stop,
    record_fault,
    scan,
)
from dledger.store import admin
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.offline import (
    LogBegin,
    StoreFile,
    TermFile,
    Trusted,
    UnreadableFile,
    as_int,
    chain_before,
    derive_begin,
    file_name,
    first_gap,
    list_files,
    read_checkpoint,
    read_currterm,
    read_header,
)

from .upstream_fixture import FIXTURE, expected, needs_fixture

FILE_SIZE = 1 << 16


def open_store(d: Path) -> FileLedgerStore:
    return FileLedgerStore(d, data_file_size=FILE_SIZE, index_file_size=32 * 256,
                           retention_check_interval_ms=3_600_000)


def written_store(d: Path, n: int = 40, committed: int | None = None) -> Path:
    """A closed store of `n` entries (two data files), committed through `committed`."""
    s = open_store(d)
    try:
        s.append_as_leader([b""], 1, magic=MAGIC_NOOP)
        s.append_as_leader([bytes([k % 251]) * 3000 for k in range(n - 1)], 1)
        s.save_term(1, None)
        s.set_committed(s.end_index if committed is None else committed)
    finally:
        s.close()
    return d


# --- file listing ------------------------------------------------------------------------------


def test_only_20_digit_regular_files_are_listed_in_order(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    for start in (2048, 0, 1024):
        (d / file_name(start)).write_bytes(bytes(1024))
    (d / "00000000000000000000.tmp").write_bytes(b"x")
    (d / "0000000001").write_bytes(b"x")  # too short
    (d / file_name(4096)).mkdir()  # a directory is not a data file
    files = list_files(d)
    assert [(f.path.name, f.start, f.size, f.end) for f in files] == [
        (file_name(0), 0, 1024, 1024), (file_name(1024), 1024, 1024, 2048), (file_name(2048), 2048, 1024, 3072)]
    assert first_gap(files) is None
    assert list_files(tmp_path / "missing") == []


def test_a_missing_or_short_file_is_the_first_gap(tmp_path: Path) -> None:
    a, b, c = (StoreFile(tmp_path / file_name(s), s, 1024) for s in (0, 1024, 3072))
    assert first_gap([a, b, c]) == (b, c)
    short = StoreFile(tmp_path / file_name(0), 0, 1000)
    assert first_gap([short, b]) == (short, b)


# --- the record-header rules ------------------------------------------------------------------------


def test_each_header_rule_names_what_it_found() -> None:
    ok = (100, 52, 7, 1000, 0, 3)  # size, body size, index, pos, channel, term
    assert record_fault(*ok, room=100, want_index=7, want_pos=1000, term_floor=3) is None
    assert record_fault(100, 51, 7, 1000, 0, 3, 100, 7, 1000, 3) == "bad size 100 (body 51)"
    assert record_fault(48 - 1, -1, 7, 1000, 0, 3, 100, 7, 1000, 3) == "bad size 47 (body -1)"
    assert record_fault(*ok, room=99, want_index=7, want_pos=1000, term_floor=3) is RUNS_PAST
    assert record_fault(*ok, room=100, want_index=8, want_pos=1000, term_floor=3) == "index 7, expected 8"
    assert record_fault(*ok, room=100, want_index=7, want_pos=1048, term_floor=3) == "pos 1000, expected 1048"
    assert record_fault(*ok, room=100, want_index=7, want_pos=1000, term_floor=4) == "term 3 below previous term 4"
    assert record_fault(100, 52, 7, 1000, 9, 3, 100, 7, 1000, 3) == "bad channel 9 (reserved, must be 0)"


@pytest.mark.parametrize(("field", "value"), [
    (1, 61),  # size, not 48 + body size
    (8, -4),  # body size
    (1, 48 + 5000),  # size and body size agree, past the buffer
    (2, 9),  # index
    (4, 7),  # pos
    (3, 1),  # term below the previous
    (5, 2),  # channel
])
def test_scan_applies_record_fault_rule_by_rule(field: int, value: int) -> None:
    """entry.scan decides the common case inline (its per-record path): every rule still
    fails it with record_fault's reason, strict or not."""
    first = encode_entry(b"a" * 10, index=4, term=2, pos=0)
    second = encode_entry(b"b" * 12, index=5, term=2, pos=len(first), prev_chain=HEADER.unpack_from(first)[6])
    h = list(HEADER.unpack_from(second))
    h[field] = value
    if field == 1 and value > 1000:
        h[8] = value - HEADER_SIZE
    buf = first + HEADER.pack(*h) + second[HEADER_SIZE:]
    reason = record_fault(h[1], h[8], h[2], h[4], h[5], h[3], len(buf) - len(first), 5, len(first), 2)
    assert reason is not None
    res = scan(buf, 0, len(buf), 4, 0, 0, strict=False)
    assert res.count == 1
    assert res.stop == ("end" if reason is RUNS_PAST else "corrupt: " + reason)
    with pytest.raises(CorruptRecord) as e:
        scan(buf, 0, len(buf), 4, 0, 0, strict=True)
    assert e.value.reason == reason and e.value.offset == len(first)
    assert scan(first + second, 0, len(first) + len(second), 4, 0, 0).count == 2  # unchanged: both pass


def test_magic_stop_and_header_fault() -> None:
    rec = encode_entry(b"body", index=3, term=2, pos=96)
    h = HEADER.unpack_from(rec)
    assert header_fault(h, len(rec)) is None
    assert header_fault(h, len(rec) - 1) is RUNS_PAST
    assert header_fault((9, *h[1:]), len(rec)) == "bad magic 9"
    assert magic_stop(BLANK.pack(-1, 200), 0) == "blank"
    assert magic_stop(bytes(8), 0) == "zero"
    assert magic_stop(b"\x00\x00\x00\x00\x00\x00\x00\x01", 0) == "corrupt: bad magic 0"
    assert magic_stop(b"\x00\x00\x00\x09" + bytes(4), 0) == "corrupt: bad magic 9"
    channel = bytearray(rec)
    channel[35] = 1
    with pytest.raises(CorruptRecord, match="bad channel 1"):
        decode_entry(channel)
    assert "bad channel 1" in scan(channel, 0, len(channel), 3, 96, 0).stop


def test_chain_before_solves_the_missing_predecessor() -> None:
    rec = encode_entry(b"x" * 10, index=5, term=2, pos=0, prev_chain=0x1234_5678)
    assert chain_before(HEADER.unpack_from(rec)) == 0x1234_5678


# --- checkpoint and currterm: one rule -------------------------------------------------------


def test_a_store_checkpoint_is_read_whole(tmp_path: Path) -> None:
    d = written_store(tmp_path / "s")
    ckpt = read_checkpoint(d)
    assert ckpt is not None and ckpt.committed_index == 39
    assert ckpt.begin == LogBegin(0, -1, 0, 0)
    assert isinstance(ckpt.trusted, Trusted) and ckpt.trusted.index == 39
    assert read_currterm(d) is not None and read_currterm(d).term == 1  # type: ignore[union-attr]
    assert read_checkpoint(tmp_path) is None and read_currterm(tmp_path) is None  # missing: None


@pytest.mark.parametrize(("text", "why"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"committed_index": "5"}', "committed_index is '5', not an integer"),
    (b'{"committed_index": true}', "committed_index is True, not an integer"),  # bools are not ints
    (b'{"committed_index": 3, "begin_index": 1.5}', "begin_index is 1.5"),
    (b'{"committed_index": 3, "trusted": [1]}', "trusted is [1], not an object"),
    (b'{"committed_index": 3, "trusted": {"index": 1, "term": 1, "pos": 0}}', "chain_crc is None"),
])
def test_an_unreadable_checkpoint_is_an_error_naming_it(tmp_path: Path, text: bytes, why: str) -> None:
    (tmp_path / "checkpoint").write_bytes(text)
    with pytest.raises(UnreadableFile) as e:
        read_checkpoint(tmp_path)
    assert e.value.code == ResponseCode.DISK_ERROR and e.value.path == tmp_path / "checkpoint"
    assert str(tmp_path / "checkpoint") in e.value.message and why in e.value.message


def test_a_partial_log_begin_is_derived_from_the_data(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_bytes(b'{"committed_index": 3, "begin_index": 2}')
    ckpt = read_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.begin is None and ckpt.committed_index == 3 and ckpt.trusted is None


def test_every_reader_refuses_or_reports_an_unreadable_checkpoint(tmp_path: Path) -> None:
    d = written_store(tmp_path / "s")
    (d / "checkpoint").write_bytes(b"\x00garbage")
    with pytest.raises(StoreError) as e:  # recovery: never guess the committed index
        open_store(d)
    assert e.value.code == ResponseCode.DISK_ERROR and "checkpoint is unreadable" in e.value.message
    view = admin.inspect(d)  # inspect reports it, and still reads the log (begin from the data)
    assert view["end_index"] == 39 and view["committed_index"] == -1
    assert any("checkpoint is unreadable" in p and "refuses to start" in p for p in view["problems"])  # type: ignore[attr-defined]
    pytest.importorskip("pyspark")
    from dledger.spark.files import CorruptStoreError, plan

    with pytest.raises(CorruptStoreError, match="checkpoint is unreadable"):
        plan(d, include_uncommitted=False)


def test_a_bool_term_is_not_a_term(tmp_path: Path) -> None:
    assert as_int(True) is None and as_int(False) is None and as_int(0) == 0 and as_int("1") is None
    d = written_store(tmp_path / "s")
    (d / "currterm").write_text(json.dumps({"term": True, "voted_for": "n1"}))
    with pytest.raises(UnreadableFile, match="no integer term"):
        read_currterm(d)
    with pytest.raises(StoreError, match="refusing to forget a vote"):  # the store took it as term 1
        open_store(d)
    view = admin.inspect(d)
    assert view["term"] is None and any("unreadable" in p for p in view["problems"])  # type: ignore[attr-defined]


# --- the log begin, a torn tail -------------------------------------------------------------------


def _at(buf: bytes) -> Callable[[int], tuple[int, ...] | None]:
    return lambda off: HEADER.unpack_from(buf, off) if off + HEADER_SIZE <= len(buf) else None


def test_the_log_begin_without_a_checkpoint(tmp_path: Path) -> None:
    assert derive_begin(lambda off: None, 0, 0) == LogBegin(0, -1, 0, 0)
    rec = encode_entry(b"x", index=7, term=2, pos=4096, prev_chain=99)
    assert derive_begin(_at(rec), 4096, FILE_SIZE) == LogBegin(7, -1, 4096, None)
    assert derive_begin(_at(rec), 0, FILE_SIZE) == LogBegin(0, -1, 0, 0)  # not at its pos
    first = encode_entry(b"x", index=0, term=1, pos=0)
    assert derive_begin(_at(first), 0, FILE_SIZE) == LogBegin(0, -1, 0, 0)


def test_a_leading_blank_of_upstreams_snapshot_reset_starts_the_log_after_it() -> None:
    """Upstream DLedger, installing a snapshot, closes the bytes before the first record with a
    blank as long as they are (MmapFileList.resetOffset); the log begins after it."""
    rec = encode_entry(b"x", index=30, term=3, pos=4096 + 200)
    buf = BLANK.pack(-1, 200) + bytes(192) + rec
    assert derive_begin(_at(buf), 4096, FILE_SIZE) == LogBegin(30, -1, 4096 + 200, None)
    # a blank not followed by a sound record there: no begin past it
    assert derive_begin(_at(BLANK.pack(-1, 200) + bytes(300)), 4096, FILE_SIZE) == LogBegin(0, -1, 4096, 0)


def test_without_a_checkpoint_a_log_past_index_0_takes_its_first_chain_as_given(tmp_path: Path) -> None:
    """Recovery and inspect agree: no checkpoint, or one without a log begin, over a log whose
    first record is not index 0 (its predecessors deleted): the first record's chain CRC is
    taken as given, every later one checked (recovery used to demand 0 with a checkpoint)."""
    d = tmp_path / "s"
    data = d / "data"
    data.mkdir(parents=True)
    buf = bytearray(FILE_SIZE)
    chain, pos = 0xABCD, 0
    for k in range(5):
        rec = encode_entry(b"body %d" % k, index=10 + k, term=3, pos=pos, prev_chain=chain)
        buf[pos : pos + len(rec)] = rec
        chain = HEADER.unpack_from(rec)[6]
        pos += len(rec)
    (data / file_name(0)).write_bytes(bytes(buf))
    (d / "currterm").write_text(json.dumps({"term": 3, "voted_for": None}))
    for ckpt in (None, {"committed_index": 12}):
        if ckpt is not None:
            (d / "checkpoint").write_text(json.dumps(ckpt))
        view = admin.inspect(d)
        assert (view["begin_index"], view["end_index"], view["problems"]) == (10, 14, []), view
        s = open_store(d)
        try:
            assert (s.begin_index, s.end_index) == (10, 14) and s.get(14).body == b"body 4"
        finally:
            s.close()


def test_a_torn_tail_ends_the_log_for_every_reader(tmp_path: Path) -> None:
    d = written_store(tmp_path / "s", committed=30)
    last = list_files(d / "data")[-1]
    s = open_store(d)
    try:
        end_pos = s.write_pos
    finally:
        s.close()
    h = read_header(last.path, 0)
    assert h is not None and h[0] in (1, 2)
    torn = encode_entry(b"y" * 500, index=40, term=1, pos=end_pos)[:200]  # the body cut short
    with open(last.path, "r+b") as f:
        f.seek(end_pos - last.start)
        f.write(torn[:HEADER_SIZE] + bytes(len(torn) - HEADER_SIZE))
    view = admin.inspect(d)
    assert view["end_index"] == 39 and view["committed_index"] == 30
    assert any("body crc mismatch" in p for p in view["problems"]), view  # type: ignore[attr-defined]
    pytest.importorskip("pyspark")
    from dledger.spark.files import plan, read_file

    rows = [i for p in plan(d, include_uncommitted=True) for b in read_file(p) for i in b.column("index").to_pylist()]
    assert rows == list(range(1, 40))  # the torn record past the committed index ends the read
    s = open_store(d)  # recovery cuts it
    try:
        assert s.end_index == 39
    finally:
        s.close()


# --- a store upstream DLedger wrote ----------------------------------------------------------------


def _expected() -> list[tuple[int, ...]]:
    return [row[:7] for row in expected()]  # all but the body's sha256


@needs_fixture
def test_a_store_upstream_wrote_lists_and_passes_the_header_rules(tmp_path: Path) -> None:
    d = FIXTURE / "dledger-n0"
    files = list_files(d / "data")
    assert len(files) == 9 and first_gap(files) is None and all(f.size == 65536 for f in files)
    assert [f.start for f in list_files(d / "index")] == [0]
    assert read_checkpoint(d) is None  # upstream keeps none
    assert read_currterm(d) == TermFile(4, None)  # a Java Properties file: currTerm=4, voteLeader=
    assert derive_begin(lambda off: read_header(files[0].path, off), 0, files[0].size) == LogBegin(0, -1, 0, 0)

    # walk every record with the header rules alone, blanks closing files, as the readers do
    got: list[tuple[int, ...]] = []
    index, term_floor = 0, -1
    for f in files:
        buf = f.path.read_bytes()
        off = 0
        while off + 8 <= len(buf):
            if int.from_bytes(buf[off : off + 4], "big", signed=True) not in (1, 2):
                stop = magic_stop(buf, off)
                assert stop in ("blank", "zero"), stop
                if stop == "blank":
                    assert BLANK.unpack_from(buf, off)[1] == len(buf) - off
                break
            h = HEADER.unpack_from(buf, off)
            assert record_fault(h[1], h[8], h[2], h[4], h[5], h[3], len(buf) - off, index, f.start + off,
                                term_floor) is None
            assert (h[6], h[7]) == (0, 0)  # upstream writes no CRCs
            body = buf[off + HEADER_SIZE : off + h[1]]
            got.append((h[2], h[3], h[4], h[0], h[1], h[8], zlib.crc32(body)))
            index, term_floor, off = index + 1, h[3], off + h[1]
    assert got == _expected()

    # dledger reads them as upstream's: unverified (CRC fields 0), the whole log listed
    copy = tmp_path / "n0"
    shutil.copytree(d, copy)
    view = admin.inspect(copy)
    assert view["end_index"] == 401 and view["begin_index"] == 0, view


@pytest.mark.parametrize(("field", "value"), [(1, 61), (8, -4), (1, 48 + 70_000), (2, 9), (4, 7), (3, 0), (5, 2)])
def test_dledger_files_applies_record_fault_rule_by_rule(tmp_path: Path, field: int, value: int) -> None:
    """Spark's copy-free scan decides the common case inline too: every rule still fails a
    committed record with record_fault's reason, naming the file and offset."""
    pytest.importorskip("pyspark")
    from dledger.spark.files import CorruptStoreError, plan, read_file

    d = written_store(tmp_path / "s")
    path = list_files(d / "data")[0].path
    buf = bytearray(path.read_bytes())
    off = 0
    for _ in range(5):  # to record 5
        off += HEADER.unpack_from(buf, off)[1]
    h = list(HEADER.unpack_from(buf, off))
    h[field] = value
    if field == 1 and value > 1000:
        h[8] = value - HEADER_SIZE
    HEADER.pack_into(buf, off, *h)
    path.write_bytes(bytes(buf))
    reason = record_fault(h[1], h[8], h[2], h[4], h[5], h[3], len(buf) - off, 5, off, 1)
    assert reason is not None
    with pytest.raises(CorruptStoreError) as e:
        for p in plan(d, include_uncommitted=False):
            list(read_file(p))
    assert f"{path}: corrupt record at offset {off} (index 5 expected): {reason}" in str(e.value)
