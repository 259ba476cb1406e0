"""Recovery deletes only a provable torn tail (docs/format.md, "Recovery").

Without a checkpoint naming what was fsynced, the only tail recovery may drop is a last
record cut short: every byte after it zero and zeros from a sector boundary inside it on.
A flipped byte in the middle of the log, a zeroed header with records after it, an unknown
magic: the store refuses to open (DISK_ERROR naming file, offset, reason and what to run)
and not one byte of the directory changes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dledger.codes import ResponseCode
from dledger.entry import HEADER_SIZE
from dledger.store.base import StoreError
from dledger.store.file import FileLedgerStore

from .upstream_fixture import snapshot

DATA_FILE_SIZE = 64 << 10
INDEX_FILE_SIZE = 32 * 256


def open_store(d: Path) -> FileLedgerStore:
    return FileLedgerStore(d, data_file_size=DATA_FILE_SIZE, index_file_size=INDEX_FILE_SIZE,
                           retention_check_interval_ms=3_600_000)


def body(i: int) -> bytes:
    return (b"%06d:" % i) * (1 + i % 40)


LAST = bytes(range(256)) * 11 + b"end"


def written(d: Path, n: int = 300) -> list[int]:
    """A closed store of `n` entries over several data files, without its checkpoint (as a
    store another program wrote, or one whose checkpoint was lost); returns positions. The
    last body is 3000 bytes: its record spans sector boundaries."""
    s = open_store(d)
    s.append_as_leader([body(i) for i in range(n - 1)] + [LAST], 1)
    s.flush()
    pos = [s.get(i).pos for i in range(n)]
    s.close()
    (d / "checkpoint").unlink()
    return pos


def patch(d: Path, pos: int, data: bytes) -> None:
    name = d / "data" / f"{pos - pos % DATA_FILE_SIZE:020d}"
    fd = os.open(name, os.O_WRONLY)
    try:
        os.pwrite(fd, data, pos % DATA_FILE_SIZE)
    finally:
        os.close(fd)


def read_at(d: Path, pos: int, n: int) -> bytes:
    name = d / "data" / f"{pos - pos % DATA_FILE_SIZE:020d}"
    with open(name, "rb") as f:
        f.seek(pos % DATA_FILE_SIZE)
        return f.read(n)


def refuses(d: Path) -> str:
    before = snapshot(d)
    with pytest.raises(StoreError) as e:
        open_store(d)
    assert e.value.code == ResponseCode.DISK_ERROR
    assert snapshot(d) == before, "a refusal changed the store"
    return e.value.message


@pytest.mark.parametrize("where", ["body", "body_crc", "chain_crc", "magic", "index"])
def test_a_flipped_byte_mid_log_without_checkpoint_deletes_nothing(tmp_path: Path, where: str) -> None:
    d = tmp_path / "s"
    pos = written(d)
    p = pos[150]
    at = {"body": p + HEADER_SIZE + 3, "body_crc": p + 41, "chain_crc": p + 37, "magic": p + 3, "index": p + 15}[where]
    patch(d, at, bytes([read_at(d, at, 1)[0] ^ 0x10]))
    msg = refuses(d)
    assert f"{p % DATA_FILE_SIZE}" in msg and "dledger store truncate" in msg and "--from-index 150" in msg, msg
    assert "Nothing was changed" in msg


def test_a_zeroed_header_with_records_after_it_is_not_the_end(tmp_path: Path) -> None:
    d = tmp_path / "s"
    pos = written(d)
    patch(d, pos[100], bytes(HEADER_SIZE))
    msg = refuses(d)
    assert "should start there but the bytes are zero" in msg, msg


def test_a_last_record_cut_short_at_a_sector_is_dropped(tmp_path: Path) -> None:
    d = tmp_path / "s"
    n = 300
    pos = written(d, n)
    last = pos[-1]
    size = HEADER_SIZE + len(LAST)
    # zero the record from the first sector boundary inside it: a write a power loss cut short
    boundary = last + (-last % 512) or last + 512
    assert boundary < last + size
    patch(d, boundary, bytes(last + size - boundary))
    s = open_store(d)
    try:
        assert s.end_index == n - 2
        assert s.get(n - 2).body == body(n - 2)
    finally:
        s.close()


def test_a_last_record_with_a_flipped_byte_is_not_torn(tmp_path: Path) -> None:
    """Fully written (no zero sector) but failing its CRC: damage, not a torn write."""
    d = tmp_path / "s"
    pos = written(d, 300)
    at = pos[-1] + HEADER_SIZE + 1
    patch(d, at, bytes([read_at(d, at, 1)[0] ^ 1]))
    refuses(d)


def test_with_a_checkpoint_a_torn_tail_past_the_trusted_record_is_cut(tmp_path: Path) -> None:
    """The checkpoint's trusted record is the last one known fsynced: damage past it is a torn
    tail (a power loss may leave any mix of written and unwritten pages there)."""
    d = tmp_path / "s"
    s = open_store(d)
    s.append_as_leader([body(i) for i in range(100)], 1)
    s.flush()
    s.write_checkpoint()
    s.append_as_leader([body(i) for i in range(100, 200)], 1)
    p = s.get(150).pos
    s.close()
    # the close wrote a checkpoint trusting entry 199: put back one trusting 99
    s = open_store(d)
    s.close()
    import json

    ck = json.loads((d / "checkpoint").read_text())
    ck["trusted"] = None
    ck["committed_index"] = -1
    (d / "checkpoint").write_text(json.dumps(ck))
    patch(d, p + HEADER_SIZE, b"\xff\xfe")
    s = open_store(d)
    try:
        assert s.end_index == 149
    finally:
        s.close()


def test_an_unreadable_currterm_refuses_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "s"
    written(d)
    (d / "currterm").write_bytes(b"\x00garbage")
    msg = refuses(d)
    assert "currterm" in msg


def test_upstreams_store_after_a_snapshot_reset_opens_past_its_leading_blank(tmp_path: Path) -> None:
    """Upstream DLedger, after installing a snapshot, starts its first data file with a blank
    record as long as the bytes before the log (MmapFileList.resetOffset), CRC fields 0."""
    from dledger.entry import BLANK, HEADER, encode_entry

    d = tmp_path / "s"
    (d / "data").mkdir(parents=True)
    (d / "index").mkdir()
    skip = 4241
    buf = bytearray(DATA_FILE_SIZE)
    buf[0:8] = BLANK.pack(-1, skip)
    pos = skip
    for i in range(30, 60):
        rec = bytearray(encode_entry(body(i), index=i, term=3, pos=pos))
        h = list(HEADER.unpack_from(rec))
        h[6] = h[7] = 0  # upstream writes no CRCs
        HEADER.pack_into(rec, 0, *h)
        buf[pos : pos + len(rec)] = rec
        pos += len(rec)
    (d / "data" / f"{0:020d}").write_bytes(bytes(buf))
    (d / "currterm").write_text("voteLeader=\ncurrTerm=3\n")
    s = open_store(d)
    try:
        assert (s.begin_index, s.end_index) == (30, 59)
        assert [s.get(i).body for i in range(30, 60)] == [body(i) for i in range(30, 60)]
    finally:
        s.close()


def _zero_crcs(d: Path, positions: list[int]) -> None:
    """Make records upstream's: both CRC fields 0, as upstream DLedger writes them."""
    for p in positions:
        patch(d, p + 36, bytes(8))


def test_upstreams_records_after_dledgers_open_as_unverified(tmp_path: Path) -> None:
    """A store that went from dledger back to upstream: upstream's records (CRC fields 0)
    follow dledger's verified ones. They open, counted unverified, past a checkpoint too
    (they are not a torn tail), and the chain starts again from 0 after them."""
    d = tmp_path / "s"
    s = open_store(d)
    s.append_as_leader([body(i) for i in range(100)], 1)
    s.flush()
    s.write_checkpoint()  # trusts entry 99
    s.append_as_leader([body(i) for i in range(100, 150)], 2)
    pos = [s.get(i).pos for i in range(150)]
    s.close()
    import json

    ck = json.loads((d / "checkpoint").read_text())
    ck["trusted"] = None  # as if the last checkpoint predates upstream's records
    (d / "checkpoint").write_text(json.dumps(ck))
    _zero_crcs(d, pos[100:])
    s = open_store(d)
    try:
        assert s.end_index == 149 and s.unverified == 50
        assert [s.get(i).body for i in range(150)] == [body(i) for i in range(150)]
        s.append_as_leader([b"after"], 2)  # dledger's next record chains from 0
        assert s.get(150).body == b"after"
    finally:
        s.close()
    s = open_store(d)
    try:
        assert s.get(150).body == b"after"
    finally:
        s.close()


def test_a_reset_store_without_its_checkpoint_begins_at_its_first_record(tmp_path: Path) -> None:
    """An InstallSnapshot reset puts the log's begin inside a data file, zeros before it; with
    the checkpoint lost the begin is found past the zeros, with the chain its first record
    says came before (never a refusal suggesting a truncate that drops the whole log)."""
    d = tmp_path / "s"
    s = open_store(d)
    s.append_as_leader([body(i) for i in range(50)], 1)
    s.flush()
    first = s.get(30)
    chain29 = s.chain_at(29)
    s.close()
    # what a reset leaves: the log from 30, nothing before it in the file
    patch(d, 0, bytes(first.pos))
    (d / "checkpoint").unlink()
    s = open_store(d)
    try:
        assert (s.begin_index, s.end_index) == (30, 49)
        assert s.begin_chain_crc == chain29
        assert [s.get(i).body for i in range(30, 50)] == [body(i) for i in range(30, 50)]
    finally:
        s.close()


def test_a_last_file_closed_by_a_blank_is_a_clean_end(tmp_path: Path) -> None:
    """Upstream writes the blank that closes a file, then creates the next one: a crash in
    between leaves the last file ending in a blank record, which is no data after the end."""
    from dledger.entry import BLANK

    d = tmp_path / "s"
    pos = written(d, 300)
    files = sorted((d / "data").iterdir())
    last = files[-1]
    start = int(last.name)
    # keep the records of the last file that precede its final stretch, then close it with a blank
    cut = max(p for p in pos if p - start < DATA_FILE_SIZE // 2 and p >= start)
    kept = pos.index(cut)
    patch(d, cut, BLANK.pack(-1, start + DATA_FILE_SIZE - cut) + bytes(start + DATA_FILE_SIZE - cut - 8))
    s = open_store(d)
    try:
        assert s.end_index == kept - 1
    finally:
        s.close()


def test_a_refusal_at_the_log_begin_names_no_truncate(tmp_path: Path) -> None:
    d = tmp_path / "s"
    written(d)
    patch(d, 3, b"\x09")  # record 0's magic: unknown
    msg = refuses(d)
    assert "dledger store truncate" not in msg and "nothing a truncate would keep" in msg, msg


def test_a_checkpoint_claiming_more_than_the_data_names_repair_checkpoint(tmp_path: Path) -> None:
    """Upstream's older Properties checkpoint says committedIndex=500 of a log that ends
    cleanly at 299: the checkpoint (or the data) is not this store's; the way out is named."""
    d = tmp_path / "s"
    written(d)
    (d / "checkpoint").write_text("endIndex=500\ncommittedIndex=500\n")
    msg = refuses(d)
    assert "ends cleanly at 299" in msg and "dledger store repair-checkpoint" in msg, msg


def test_an_unreadable_checkpoint_names_repair_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "s"
    written(d)
    (d / "checkpoint").write_text("{not json")
    msg = refuses(d)
    assert "dledger store repair-checkpoint" in msg, msg
