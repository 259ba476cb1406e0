"""Upstream DLedger's state files and file sizes (docs/format.md, "Opening upstream DLedger's
stores"): `currterm` in both forms (dledger's JSON, upstream's Java Properties), written in
upstream's form; upstream's crash window (no `currterm`, a `currterm.tmp`/`.bak`); an older
upstream's Properties `checkpoint`; the data and index file sizes taken from the store, a
refusal changing no byte; upstream's `dledger-<selfId>` layout. Real stores on disk."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.codes import ResponseCode
from dledger.store import admin
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.mapped_file import check_sizes
from dledger.store.offline import (
    Checkpoint,
    LayoutError,
    TermFile,
    UnreadableFile,
    member_store_dir,
    read_checkpoint,
    read_currterm,
)
from dledger.store.properties import PropertiesError, format_properties, parse_properties

from .upstream_fixture import FIXTURE, copy_fixture, needs_fixture, snapshot

SMALL = 4096  # data files of the stores written here
UNITS = 32 * 16  # index files: 16 units each


def open_store(d: Path, data: int = SMALL, index: int = UNITS) -> FileLedgerStore:
    return FileLedgerStore(d, data_file_size=data, index_file_size=index, retention_check_interval_ms=3_600_000)


N = 150  # entries of the stores written here


def written(d: Path, n: int = N) -> Path:
    """A closed dledger store of `n` entries over several 4 KiB data files and 512-byte index
    files, its currterm in term 1."""
    s = open_store(d)
    s.save_term(1, "n0")
    s.append_as_leader([b"%04d" % i * (1 + i % 30) for i in range(n)], 1)
    s.flush()
    s.close()
    return d


def refused(d: Path, **kw: int) -> str:
    before = snapshot(d)
    with pytest.raises(StoreError) as e:
        open_store(d, **kw)
    assert e.value.code == ResponseCode.DISK_ERROR, e.value
    assert snapshot(d) == before, "a refusal changed the directory"
    return e.value.message


# --- Java Properties ------------------------------------------------------------------------------


def test_properties_are_read_as_java_reads_them() -> None:
    text = (b"# written by hand\n! another comment\n\n  currTerm : 12 \n"
            b"voteLeader\tn\\u0031\nlong = a\\\n    b\\\\\nk\\=ey=v\\:w\nempty\n")
    assert parse_properties(text) == {"currTerm": "12 ", "voteLeader": "n1", "long": "ab\\", "k=ey": "v:w",
                                      "empty": ""}
    assert parse_properties(b"a=1\na=2\n") == {"a": "2"}  # the last one wins
    with pytest.raises(PropertiesError):
        parse_properties(b"voteLeader=\\u00zz\n")


def test_properties_written_read_back_exactly() -> None:
    pairs = {"currTerm": "7", "voteLeader": " n=1:#!\\\t\u00e9\u4e2d", "k ey": ""}
    raw = format_properties(pairs)
    assert raw.decode("ascii")  # plain ASCII, as Java's Properties.store writes
    assert parse_properties(raw) == pairs


# --- currterm: both forms --------------------------------------------------------------------------


def test_currterm_is_read_in_both_forms(tmp_path: Path) -> None:
    (tmp_path / "currterm").write_text(json.dumps({"term": 3, "voted_for": "n2"}))
    assert read_currterm(tmp_path) == TermFile(3, "n2")
    (tmp_path / "currterm").write_bytes(b"voteLeader=\ncurrTerm=4\n")  # upstream's, as MemberState writes it
    assert read_currterm(tmp_path) == TermFile(4, None)
    (tmp_path / "currterm").write_bytes(b"#Tue Nov 24\ncurrTerm: 9\nvoteLeader = n1\n")
    assert read_currterm(tmp_path) == TermFile(9, "n1")


@pytest.mark.parametrize(("text", "why"), [
    (b"voteLeader=n1\n", "no currTerm"),
    (b"", "no currTerm"),
    (b"currTerm=\nvoteLeader=\n", "currTerm is '', not an integer"),
    (b"currTerm=4x\n", "currTerm is '4x', not an integer"),
    (b"currTerm=\\uZZZZ\n", "not Java Properties"),
    (b"\x00garbage", "no currTerm"),
    (b'{"voted_for": "n1"}', "no integer term"),
    (b"currTerm=9999999999999999999\nvoteLeader=n1\n", "not a term"),  # beyond a Java long
    (b"currTerm=-7\nvoteLeader=\n", "not a term"),  # upstream's term is never negative
    (b'{"term": -1}', "not a term"),
    (b'{"term": 5, "voted_for": 3}', "voted_for is 3"),  # never read as no vote
    (b'{"term": 5, "voted_for": ["n1"]}', "voted_for is ['n1']"),
    (b"currTerm=9223372036854775807\nvoteLeader=\n", "dledger store repair-term"),  # beyond the wire's limit
    (b'{"term": 4611686018427387904}', "dledger store repair-term"),
])
def test_an_unreadable_currterm_stays_a_refusal(tmp_path: Path, text: bytes, why: str) -> None:
    d = written(tmp_path / "s")
    (d / "currterm").write_bytes(text)
    with pytest.raises(UnreadableFile) as e:
        read_currterm(d)
    assert e.value.code == ResponseCode.DISK_ERROR and why in e.value.message, e.value.message
    msg = refused(d)
    assert "currterm" in msg and "refusing to forget a vote" in msg


def test_the_store_writes_upstreams_form_and_reads_it_back(tmp_path: Path) -> None:
    d = tmp_path / "s"
    s = open_store(d)
    s.save_term(7, "n2")
    assert parse_properties((d / "currterm").read_bytes()) == {"currTerm": "7", "voteLeader": "n2"}
    s.save_term(8, None)
    assert (d / "currterm").read_bytes() == b"currTerm=8\nvoteLeader=\n"  # no vote: empty, as upstream
    s.close()
    s = open_store(d)
    try:
        assert (s.load_term().term, s.load_term().voted_for) == (8, None)
    finally:
        s.close()
    (d / "currterm").write_text(json.dumps({"term": 11, "voted_for": "n1"}))  # a store dledger wrote before
    s = open_store(d)
    try:
        assert (s.load_term().term, s.load_term().voted_for) == (11, "n1")
        s.save_term(12, "n0")
    finally:
        s.close()
    assert (d / "currterm").read_bytes() == b"currTerm=12\nvoteLeader=n0\n"


# --- currterm: upstream's crash window -------------------------------------------------------------


def test_without_currterm_the_highest_term_of_tmp_and_bak_is_taken(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = written(tmp_path / "s")
    (d / "currterm").unlink()
    (d / "currterm.bak").write_bytes(b"voteLeader=n1\ncurrTerm=5\n")  # the old one, copied before the delete
    (d / "currterm.tmp").write_bytes(b"voteLeader=n2\ncurrTerm=6\n")  # the new one, not yet renamed
    with caplog.at_level(logging.WARNING, logger="dledger.store.offline"):
        assert read_currterm(d) == TermFile(6, "n2")
    assert any("currterm.tmp (term 6)" in r.getMessage() and "taking currterm.tmp's term 6" in r.getMessage()
               for r in caplog.records), caplog.text
    (d / "currterm.tmp").write_bytes(b"voteLeader=\ncurrTerm=4\n")  # never a lower term than the .bak's
    assert read_currterm(d) == TermFile(5, "n1")
    (d / "currterm.tmp").write_bytes(b"voteLeader=n2\ncurrTerm=5\n")  # a tie: the newer file, with its vote
    assert read_currterm(d) == TermFile(5, "n2")
    (d / "currterm.tmp").unlink()
    assert read_currterm(d) == TermFile(5, "n1")
    s = open_store(d)  # the member starts in that term, with that vote
    try:
        assert (s.load_term().term, s.load_term().voted_for) == (5, "n1")
    finally:
        s.close()


def test_a_present_currterm_wins_over_leftovers(tmp_path: Path) -> None:
    (tmp_path / "currterm").write_bytes(b"currTerm=3\nvoteLeader=\n")
    (tmp_path / "currterm.bak").write_bytes(b"currTerm=2\nvoteLeader=\n")  # upstream leaves it after every write
    (tmp_path / "currterm.tmp").write_bytes(b"currTerm=9\nvoteLeader=\n")  # a write that never completed
    assert read_currterm(tmp_path) == TermFile(3, None)


def test_an_unreadable_leftover_in_the_crash_window_refuses_and_repair_term_recovers(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    (d / "currterm").unlink()
    (d / "currterm.bak").write_bytes(b"voteLeader=n1\ncurrTerm=5\n")
    (d / "currterm.tmp").write_bytes(b"voteLead")  # torn
    msg = refused(d)
    assert "currterm.tmp is unreadable" in msg
    view = admin.inspect(d)  # inspect reports it
    assert view["term"] is None and any("currterm.tmp" in p for p in view["problems"])  # type: ignore[attr-defined]
    out = admin.repair_term(d, 6)  # the operator's way out: a term above any the member may have voted in
    assert out["term"] == {"before": None, "after": 6}
    assert (d / "currterm").read_bytes() == b"currTerm=6\nvoteLeader=\n"
    s = open_store(d)
    s.close()


def test_inspect_and_repair_term_read_upstreams_form(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    (d / "currterm").write_bytes(b"voteLeader=n2\ncurrTerm=3\n")
    view = admin.inspect(d)
    assert (view["term"], view["voted_for"], view["problems"]) == (3, "n2", [])
    out = admin.repair_term(d)
    assert out["term"] == {"before": 3, "after": 1} and out["voted_for"] == {"before": "n2", "after": None}
    assert read_currterm(d) == TermFile(1, None)


# --- an older upstream's Properties checkpoint --------------------------------------------------------


def test_an_upstream_properties_checkpoint_proves_nothing_durable(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_bytes(b"endIndex=12\ncommittedIndex=10\n")
    assert read_checkpoint(tmp_path) == Checkpoint(10, None, None, proves_durable=False)
    (tmp_path / "checkpoint").write_bytes(b"committedIndex=-1\nendIndex=-1\n")  # upstream's empty store
    assert read_checkpoint(tmp_path) == Checkpoint(-1, None, None, proves_durable=False)
    for bad, why in ((b"endIndex=12\n", "no committedIndex"), (b"committedIndex=ten\n", "not an integer")):
        (tmp_path / "checkpoint").write_bytes(bad)
        with pytest.raises(UnreadableFile, match=why):
            read_checkpoint(tmp_path)
    own = read_checkpoint(written(tmp_path / "s"))  # dledger's JSON one is unchanged, and proves what it names
    assert own is not None and own.proves_durable and own.committed_index == -1 and own.trusted is not None


def test_a_json_checkpoint_may_say_it_proves_nothing_durable(tmp_path: Path) -> None:
    """`dledger store import` writes `"proves_durable": false` before it rewrites records in place:
    recovery must not take bytes past the trusted record for a torn tail then. Absent: true."""
    d = written(tmp_path / "s")
    data = json.loads((d / "checkpoint").read_text())
    assert "proves_durable" not in data
    for value, proves in ((False, False), (True, True)):
        (d / "checkpoint").write_text(json.dumps({**data, "proves_durable": value}))
        ckpt = read_checkpoint(d)
        assert ckpt is not None and ckpt.proves_durable is proves and ckpt.trusted is not None
    for bad in (0, "false", None, [False]):
        (d / "checkpoint").write_text(json.dumps({**data, "proves_durable": bad}))
        with pytest.raises(UnreadableFile, match="proves_durable is"):
            read_checkpoint(d)


def test_a_store_with_upstreams_checkpoint_opens_with_its_committed_index(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    (d / "checkpoint").write_bytes(b"endIndex=149\ncommittedIndex=40\n")
    s = open_store(d)
    try:
        assert (s.end_index, s.committed_index) == (N - 1, 40)
    finally:
        s.close()


# --- file sizes: the store's own ---------------------------------------------------------------------


def test_a_new_store_uses_the_configured_sizes(tmp_path: Path) -> None:
    s = open_store(tmp_path / "s", data=8192, index=1024)
    try:
        s.append_as_leader([b"x"], 1)
        assert (s.data.file_size, s.index.file_size) == (8192, 1024)
    finally:
        s.close()
    assert [p.stat().st_size for p in (tmp_path / "s" / "data").iterdir()] == [8192]


def test_a_store_opens_with_its_own_sizes_whatever_is_configured(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    (d / "checkpoint").unlink()  # the sizes come from the files alone (as in upstream's stores)
    before = {k: v for k, v in snapshot(d).items() if k.startswith("data/")}
    for data, index in ((1 << 30, 32 * 5_242_880), (8192, 64), (SMALL, UNITS)):
        s = open_store(d, data=data, index=index)
        try:
            assert (s.data.file_size, s.index.file_size, s.end_index) == (SMALL, UNITS, N - 1)
            assert s.max_body_bytes == SMALL - 56  # a record still fits in the store's files
        finally:
            s.close()
    assert {k: v for k, v in snapshot(d).items() if k.startswith("data/")} == before  # not resized, not changed
    s = open_store(d, data=1 << 20, index=32 * 1024)  # new files get the store's size too
    try:
        n = len(list((d / "data").iterdir()))
        while len(list((d / "data").iterdir())) == n:
            s.append_as_leader([b"y" * 1000], 2)
    finally:
        s.close()
    assert {p.stat().st_size for p in (d / "data").iterdir()} == {SMALL}
    assert {p.stat().st_size for p in (d / "index").iterdir()} == {UNITS}
    assert json.loads((d / "checkpoint").read_text())["data_file_size"] == SMALL  # recorded for later opens


def test_data_files_of_different_sizes_are_refused_and_nothing_changes(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    files = sorted((d / "data").iterdir())
    assert len(files) >= 3
    with open(files[1], "r+b") as f:  # a file in the middle cut short: lost data, not a crash
        f.truncate(SMALL - 100)
    msg = refused(d)
    assert str(files[1]) in msg and f"{SMALL - 100} bytes" in msg and "Nothing was changed" in msg
    with open(files[1], "r+b") as f:
        f.truncate(SMALL + 100)  # one longer than the others
    assert str(files[1]) in refused(d)
    with open(files[1], "r+b") as f:
        f.truncate(SMALL)
    with open(files[-1], "ab") as f:  # the last one longer
        f.write(b"\0" * 10)
    assert str(files[-1]) in refused(d)


def test_a_short_last_data_file_is_refused_unless_it_lost_only_what_was_never_fsynced(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    last = sorted((d / "data").iterdir())[-1]
    used = len(last.read_bytes().rstrip(b"\0"))
    with open(last, "r+b") as f:  # cut into records the checkpoint names fsynced
        f.truncate(used - 10)
    assert str(last) in refused(d)
    d2 = written(tmp_path / "s2")
    last2 = sorted((d2 / "data").iterdir())[-1]
    used2 = len(last2.read_bytes().rstrip(b"\0"))
    with open(last2, "r+b") as f:  # only zeros past the last fsynced record lost
        f.truncate(used2 + 1)
    s = open_store(d2, data=1 << 20)
    try:
        assert s.end_index == N - 1 and last2.stat().st_size == SMALL
    finally:
        s.close()
    d3 = written(tmp_path / "s3")
    (d3 / "checkpoint").unlink()  # without dledger's checkpoint nothing proves it: refused
    last3 = sorted((d3 / "data").iterdir())[-1]
    with open(last3, "r+b") as f:
        f.truncate(len(last3.read_bytes().rstrip(b"\0")) + 1)
    assert str(last3) in refused(d3)


def test_a_zero_byte_last_file_is_a_creation_a_crash_interrupted(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    files = sorted((d / "data").iterdir())
    nxt = d / "data" / f"{int(files[-1].name) + SMALL:020d}"
    nxt.touch()  # created, never sized
    s = open_store(d, data=1 << 20)
    try:
        assert s.end_index == N - 1 and s.data.file_size == SMALL
    finally:
        s.close()
    assert not nxt.exists() or nxt.stat().st_size == SMALL  # sized, or dropped as past the log's end


def test_a_short_index_file_is_a_cache_extended_and_rebuilt(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    files = sorted((d / "index").iterdir())
    assert len(files) >= 3
    with open(files[1], "r+b") as f:
        f.truncate(100)
    s = open_store(d, index=32 * 5_242_880)
    try:
        assert s.index.file_size == UNITS and s.end_index == N - 1
        assert [s.get(i).index for i in range(N)] == list(range(N))
    finally:
        s.close()
    assert files[1].stat().st_size == UNITS


def test_index_files_of_a_size_not_a_multiple_of_32_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "s"
    (d / "data").mkdir(parents=True)
    (d / "index").mkdir()
    (d / "index" / f"{0:020d}").write_bytes(bytes(100))
    (d / "index" / f"{100:020d}").write_bytes(bytes(100))
    assert "not a positive multiple of 32" in refused(d)


@pytest.mark.parametrize(("key", "factor"), [("index_file_size", 2), ("data_file_size", 2), ("data_file_size", 0.5)])
def test_a_checkpoint_naming_other_sizes_is_refused_before_any_file_is_sized(
        tmp_path: Path, key: str, factor: float) -> None:
    """Every size is decided, read-only, before a file is opened: a refusal of the index's
    must not have extended a data or an index file first."""
    d = written(tmp_path / "s")
    ckpt = json.loads((d / "checkpoint").read_text())
    ckpt[key] = int(ckpt[key] * factor)
    (d / "checkpoint").write_text(json.dumps(ckpt))
    msg = refused(d)  # snapshot(): not one byte changed
    assert f"records files of {ckpt[key]} bytes" in msg and "another store's" in msg, msg
    assert check_sizes(d) == msg


def test_a_missing_data_file_is_named_missing_not_cut_short(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    (d / "checkpoint").unlink()  # as in upstream's stores: the size comes from the files
    files = sorted((d / "data").iterdir())
    files[1].unlink()
    msg = refused(d)
    assert (f"file {files[1].name} of {d / 'data'} is missing: {files[0].name} ends at {SMALL}, "
            f"{files[2].name} starts at {2 * SMALL}") in msg, msg
    assert "cut short" not in msg and "extended" not in msg
    files[3].unlink()  # two gaps: the first named
    assert f"file {files[1].name} of" in refused(d)


@pytest.mark.parametrize("damage", ["only file 1000 bytes", "middle file longer", "middle file missing"])
def test_an_index_file_of_the_wrong_size_says_to_delete_the_index(tmp_path: Path, damage: str) -> None:
    """The index is a cache of the data: its files' sizes never make a member give up its
    store, and the advice (delete the index files) works."""
    d = written(tmp_path / "s")
    (d / "checkpoint").unlink()
    files = sorted((d / "index").iterdir())
    if damage == "only file 1000 bytes":
        for f in files[1:]:
            f.unlink()
        os.truncate(files[0], 1000)
    elif damage == "middle file longer":
        os.truncate(files[1], UNITS + 32)
    else:
        files[1].unlink()
    msg = refused(d)
    assert f"delete the files of {d / 'index'}" in msg and "move this member's store away" not in msg, msg
    assert check_sizes(d) == msg
    for f in (d / "index").iterdir():
        f.unlink()
    s = open_store(d)
    try:
        assert s.end_index == N - 1 and [s.get(i).index for i in range(N)] == list(range(N))
    finally:
        s.close()


@pytest.mark.parametrize("short", ["index file", "0-byte last data file"])
def test_a_short_file_is_extended_only_once_recovery_decided_to_open(tmp_path: Path, short: str) -> None:
    """A short file a member would extend (a cache, a creation cut short) keeps its size when
    recovery then refuses: the refusal changes nothing, not even a file's size."""
    d = written(tmp_path / "s")
    (d / "checkpoint").unlink()  # nothing proves a torn tail: a bad record mid-log is refused
    if short == "index file":
        target = sorted((d / "index").iterdir())[1]
        os.truncate(target, 100)
    else:
        last = sorted((d / "data").iterdir())[-1]
        target = d / "data" / f"{int(last.name) + SMALL:020d}"
        target.touch()
    size = target.stat().st_size
    mid = sorted((d / "data").iterdir())[1]
    with open(mid, "r+b") as f:  # a body byte of the file's first record: its CRC fails, records follow
        f.seek(60)
        b = f.read(1)
        f.seek(60)
        f.write(bytes([b[0] ^ 0xFF]))
    msg = refused(d)  # snapshot(): every file as it was
    assert "not a torn tail" in msg and target.stat().st_size == size, msg
    with open(mid, "r+b") as f:  # repaired: the member opens and extends the short file
        f.seek(60)
        f.write(b)
    s = open_store(d)
    try:
        assert s.end_index == N - 1 and [s.get(i).index for i in range(N)] == list(range(N))
    finally:
        s.close()
    assert not target.exists() or target.stat().st_size in (SMALL, UNITS)


def test_check_sizes_says_what_the_member_says(tmp_path: Path) -> None:
    d = written(tmp_path / "s")
    assert check_sizes(d) is None
    assert check_sizes(tmp_path / "none") is None  # no files: a new store
    files = sorted((d / "data").iterdir())
    os.truncate(files[-1], 10)  # into records the checkpoint names fsynced
    assert check_sizes(d) == refused(d)
    os.truncate(files[-1], SMALL)
    os.truncate(files[1], SMALL + 1)
    assert check_sizes(d) == refused(d)


@needs_fixture
def test_upstreams_store_opens_with_its_64k_and_32k_files_and_every_entry_as_upstream_read_it(
        tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    before = {k: v for k, v in snapshot(d).items() if k.startswith("data/")}
    s = FileLedgerStore(d)  # dledger's defaults: 1 GiB data files, 160 MiB index files
    try:
        assert (s.data.file_size, s.index.file_size) == (65536, 32768)
        assert (s.begin_index, s.end_index, s.unverified) == (0, 401, 402)
        assert (s.load_term().term, s.load_term().voted_for) == (4, None)
        for line in (FIXTURE / "expected.tsv").read_text().splitlines():
            index, term, pos, magic, size, blen, _crc, sha = line.split("\t")
            e = s.get(int(index))
            assert (e.term, e.pos, e.magic, e.size, len(e.body)) == (int(term), int(pos), int(magic), int(size),
                                                                      int(blen)), line
            assert hashlib.sha256(e.body).hexdigest() == sha, line
            assert s.verify_entry(int(index)) == e  # the scrub's check (header, unit, chain link)
        assert [e.index for e in s.read(0, 1000)] == list(range(402))  # the read path's chain checks
    finally:
        s.close()
    assert {k: v for k, v in snapshot(d).items() if k.startswith("data/")} == before
    assert [p.stat().st_size for p in (d / "index").iterdir()] == [32768]


# --- upstream's layout --------------------------------------------------------------------------------


def test_upstreams_layout_is_used_only_when_the_directory_holds_no_store(tmp_path: Path) -> None:
    base = tmp_path / "store"
    assert member_store_dir(base, "n0") == base  # nothing there: a new store in the directory given
    (base / "dledger-n0" / "data").mkdir(parents=True)
    assert member_store_dir(base, "n0") == base / "dledger-n0"
    (tmp_path / "own" / "data").mkdir(parents=True)
    (tmp_path / "own" / "dledger-n1").mkdir()  # no data/ in it: not a store
    assert member_store_dir(tmp_path / "own", "n0") == tmp_path / "own"  # a store of its own


def test_another_members_upstream_store_is_never_shadowed_by_a_new_one(tmp_path: Path) -> None:
    """A wrong --id beside upstream's dledger-<id>/data would create DIR/data, a new empty store,
    and from then on the right id would open that one too: refused, nothing created."""
    base = tmp_path / "store"
    (base / "dledger-n0" / "data").mkdir(parents=True)
    with pytest.raises(LayoutError) as e:
        member_store_dir(base, "n1")
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert "--id n1 wrong" in e.value.message and str(base / "dledger-n0") in e.value.message
    assert sorted(p.name for p in base.iterdir()) == ["dledger-n0"]


def test_both_layouts_in_one_directory_are_refused_naming_both(tmp_path: Path) -> None:
    base = tmp_path / "store"
    (base / "dledger-n0" / "data").mkdir(parents=True)
    (base / "data").mkdir()
    with pytest.raises(LayoutError) as e:
        member_store_dir(base, "n0")
    assert str(base / "data") in e.value.message and str(base / "dledger-n0" / "data") in e.value.message
    # another id has only dledger's own store here: that one is used
    assert member_store_dir(base, "n1") == base


@pytest.mark.parametrize("layout", ["both", "other id"])
def test_the_server_refuses_an_ambiguous_layout_and_creates_nothing(tmp_path: Path, layout: str) -> None:
    base = tmp_path / "store"
    (base / "dledger-n0" / "data").mkdir(parents=True)
    if layout == "both":
        (base / "data").mkdir()
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    self_id = "n0" if layout == "both" else "n1"
    res = subprocess.run([sys.executable, "-m", "dledger", "server", "--id", self_id, "--peers",
                          f"{self_id}-127.0.0.1:1", "--store-dir", str(base)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "Nothing was created" in res.stderr, res.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
