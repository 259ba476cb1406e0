"""Data faults in the stores (issue 11): a damaged record is found, named, and repaired in place.

Both stores hold the same bytes as the leader (followers copy records verbatim), so a damaged
record can be restored from the leader's copy: `repair` overwrites it only with a record that
verifies and is the same entry (index, term, pos, size, chain link) as the one it replaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.entry import HEADER_SIZE, MAGIC_NORMAL
from dledger.store.base import CorruptEntryError, LedgerStore, PushRejected, StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.memory import MemoryLedgerStore

CHAIN_FIELD = 36  # header bytes 36..39: chain_crc
NORMAL = frozenset([MAGIC_NORMAL])

KINDS = ["memory", "file"]


class Stores:
    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self.opened: list[LedgerStore] = []

    def make(self, name: str) -> LedgerStore:
        if self.kind == "memory":
            s: LedgerStore = MemoryLedgerStore()
        else:
            s = FileLedgerStore(self.tmp / name, data_file_size=64 << 10, index_file_size=32 * 64)
        self.opened.append(s)
        return s

    def reopen(self, s: LedgerStore) -> LedgerStore:
        assert isinstance(s, FileLedgerStore)
        s.close()
        again = FileLedgerStore(s.dir, data_file_size=64 << 10, index_file_size=32 * 64)
        self.opened.append(again)
        return again

    def close(self) -> None:
        for s in self.opened:
            s.close()


@pytest.fixture(params=KINDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    s = Stores(request.param, tmp_path)
    try:
        yield s
    finally:
        s.close()


def leader_and_follower(stores: Stores, n: int = 40) -> tuple[LedgerStore, LedgerStore]:
    """A leader store with n entries (two terms; enough to cross data files), and a follower
    holding the same records verbatim."""
    leader, follower = stores.make("leader"), stores.make("follower")
    leader.append_as_leader([f"entry-{k}".encode() * 40 for k in range(n // 2)], 1)
    leader.append_as_leader([f"entry-{k}".encode() * 40 for k in range(n // 2, n)], 2)
    i = 0
    while i <= leader.end_index:
        raw = leader.read_raw(i, 8 << 10)
        follower.append_as_follower(bytes(raw.data))
        raw.data.release()
        i += raw.count
    leader.set_committed(leader.end_index)
    follower.set_committed(follower.end_index)
    return leader, follower


def record(store: LedgerStore, index: int) -> bytes:
    raw = store.read_raw(index, 0)
    try:
        return bytes(raw.data)
    finally:
        raw.data.release()


def flip(store: LedgerStore, index: int, offset: int, mask: int = 0x5A) -> None:
    """Bit rot: flip a byte at `offset` of the stored record of `index` (behind the store's
    back: in the data file for the file store, as a damaged sector would)."""
    pos = store.get(index).pos if offset >= HEADER_SIZE else _pos(store, index)
    if isinstance(store, FileLedgerStore):
        f = store.data.locate(pos)
        fd = os.open(f.path, os.O_RDWR)
        try:
            old = os.pread(fd, 1, pos - f.start + offset)
            os.pwrite(fd, bytes([old[0] ^ mask]), pos - f.start + offset)
        finally:
            os.close(fd)
    else:
        assert isinstance(store, MemoryLedgerStore)
        store._buf[pos - store._base_pos + offset] ^= mask


def _pos(store: LedgerStore, index: int) -> int:
    return int.from_bytes(record(store, index)[24:32], "big")


@pytest.mark.parametrize("where", ["body", "chain"])
def test_a_damaged_record_is_found_and_named(stores: Stores, where: str) -> None:
    _, f = leader_and_follower(stores)
    bad = 23
    flip(f, bad, HEADER_SIZE + 5 if where == "body" else CHAIN_FIELD)
    reason = f.verify(bad)
    assert reason is not None and (("body crc" in reason) if where == "body" else ("chain" in reason.lower()))
    assert all(f.verify(i) is None for i in range(f.end_index + 1) if i not in (bad, bad + 1))
    with pytest.raises(CorruptEntryError) as e:
        f.verify_entry(bad)
    assert e.value.index in (bad, bad + 1)
    if where == "body":
        with pytest.raises(CorruptEntryError) as e:
            f.get(bad)
        assert e.value.index == bad
        with pytest.raises(CorruptEntryError) as e:
            f.read(bad - 3, 10)
        assert e.value.index == bad
        assert [x.index for x in f.read(bad - 3, 3)] == [bad - 3, bad - 2, bad - 1]
    # the columnar read (what the Spark source asks for) applies the same checks
    with pytest.raises(CorruptEntryError) as e:
        f.read_columns(bad - 3, 10, 1 << 20, NORMAL)
    assert e.value.index == bad
    assert f.read_columns(bad - 3, 3, 1 << 20, NORMAL).indexes.tolist() == [bad - 3, bad - 2, bad - 1]
    # what replication and votes rely on is unchanged: the log's end, its terms
    assert (f.end_index, f.end_term, f.term_at(bad)) == (39, 2, 2)


@pytest.mark.parametrize("field", ["magic", "channel", "pos"])
def test_rot_in_a_header_field_the_chain_crc_does_not_cover_is_found(stores: Stores, field: str) -> None:
    """magic, channel and pos are not in the chain CRC: verify() passed a record whose magic
    turned NORMAL into CONFIG_CHANGE, or whose channel was no longer 0, while a follower's push
    scan rejects the channel. verify now applies the push's single-record check and compares
    the magic with the index's."""
    leader, f = leader_and_follower(stores)
    bad = 23
    good = record(leader, bad)
    offset, mask = {"magic": (3, 0x02), "channel": (35, 0x01), "pos": (31, 0x08)}[field]
    flip(f, bad, offset, mask)
    reason = f.verify(bad)
    assert reason is not None, field
    if not (stores.kind == "file" and field == "pos"):  # the file store's pos rot fails its index: DISK_ERROR
        assert all(f.verify(i) is None for i in range(f.end_index + 1) if i != bad)
    with pytest.raises(StoreError):
        f.read(bad, 1)
    with pytest.raises(StoreError):
        f.read(bad - 2, 5)
    with pytest.raises(StoreError):
        f.read_columns(bad - 2, 5, 1 << 20, NORMAL)
    with pytest.raises(StoreError):
        f.read_columns(bad, 1, 1 << 20, NORMAL)
    f.repair(bad, good)
    assert record(f, bad) == good and f.verify(bad) is None


@pytest.mark.parametrize("where", ["body", "chain"])
def test_repair_restores_the_record_in_place(stores: Stores, where: str) -> None:
    leader, f = leader_and_follower(stores)
    bad = 7
    good = record(leader, bad)
    flip(f, bad, HEADER_SIZE + 1 if where == "body" else CHAIN_FIELD)
    assert record(f, bad) != good
    f.repair(bad, good)
    assert record(f, bad) == good
    assert all(f.verify(i) is None for i in range(f.end_index + 1))
    assert f.get(bad).body == b"entry-7" * 40
    if stores.kind == "file":
        f = stores.reopen(f)  # fsynced in place: a restart keeps it
        assert record(f, bad) == good and f.verify(bad) is None
        assert (f.end_index, f.committed_index) == (39, 39)


def test_repair_refuses_what_is_not_the_same_entry(stores: Stores) -> None:
    leader, f = leader_and_follower(stores)
    other = stores.make("other")  # same indexes and terms, other bodies: another history
    other.append_as_leader([f"other-{k}".encode() * 40 for k in range(20)], 1)
    bad = 9
    flip(f, bad, HEADER_SIZE + 3)
    damaged = record(f, bad)
    good = record(leader, bad)
    rotten_copy = bytearray(good)
    rotten_copy[HEADER_SIZE] ^= 1
    wrong_index = record(leader, bad + 1)
    for candidate in (record(other, bad), bytes(rotten_copy), wrong_index, good[:-1]):
        with pytest.raises(StoreError):
            f.repair(bad, candidate)
        assert record(f, bad) == damaged  # nothing written
    f.repair(bad, good)
    assert f.verify(bad) is None


def test_repair_refuses_a_record_our_next_entry_does_not_chain_onto(stores: Stores) -> None:
    """Same index, term, position and size, chained onto our previous entry, other body: only
    our next record's chain CRC tells it is not the entry we held."""
    leader, f = leader_and_follower(stores)
    bad = 9
    forged = stores.make("forged")
    forged.append_as_leader([f"entry-{k}".encode() * 40 for k in range(bad)], 1)
    forged.append_as_leader([f"ENTRY-{bad}".encode() * 40], 1)  # same length as entry-9 * 40
    flip(f, bad, HEADER_SIZE + 3)
    damaged = record(f, bad)
    with pytest.raises(StoreError, match="does not chain onto"):
        f.repair(bad, record(forged, bad))
    assert record(f, bad) == damaged
    f.repair(bad, record(leader, bad))
    assert f.verify(bad) is None and f.verify(bad + 1) is None


def test_a_damaged_push_names_the_failing_record_and_keeps_nothing(stores: Stores) -> None:
    """The handler rejected a whole batch naming "offset 0" (the file store reported where the
    push began, not the failing record): the leader could not tell which record was bad."""
    leader, _ = leader_and_follower(stores)
    g = stores.make("g")
    g.append_as_follower(record(leader, 0) + record(leader, 1) + record(leader, 2))
    recs = [record(leader, i) for i in range(3, 8)]
    push = bytearray(b"".join(recs))
    at = len(recs[0]) + len(recs[1])  # record 5
    push[at + HEADER_SIZE + 2] ^= 0x01
    with pytest.raises(PushRejected) as e:
        g.append_as_follower(bytes(push))
    assert e.value.index == 5 and e.value.reason == "body crc mismatch"
    assert "entry 5" in e.value.message and f"offset {at}" in e.value.message
    assert g.end_index == 2
    g.append_as_follower(b"".join(recs))  # the good copy goes in
    assert g.end_index == 7


def test_a_rotten_header_at_the_trusted_point_skips_the_checkpoint_not_the_store(tmp_path: Path) -> None:
    """The periodic checkpoint read its trusted point from the last durable record's header:
    rot there (the term field) made the flush thread fail the store for good."""
    s = FileLedgerStore(tmp_path / "s", data_file_size=64 << 10, index_file_size=32 * 64)
    try:
        s.append_as_leader([f"body-{k}".encode() for k in range(8)], 1)
        s.set_committed(7)
        s.flush()
        s.write_checkpoint()
        flip(s, 7, 23)  # a byte of the term field
        s.write_checkpoint()  # skipped, with a warning
        assert s.write_error() is None
        s.append_as_leader([b"after"], 1)  # the store still writes
        assert s.end_index == 8
    finally:
        s.close()


@pytest.mark.parametrize("columnar", [False, True])
def test_a_read_answer_stops_before_a_damaged_record_and_the_next_one_names_it(stores: Stores,
                                                                                columnar: bool) -> None:
    """Both READ answers (entries and columns) share one rule: what verified before the damage
    is served, the damaged record is reported, and the read that starts at it fails with it."""
    from array import array

    from dledger.codes import RequestCode
    from dledger.config import DLedgerConfig
    from dledger.core.member_state import MemberState
    from dledger.core.messages import EntriesResponse
    from dledger.core.reads import ReadPath

    _, f = leader_and_follower(stores)
    bad = 23
    flip(f, bad, HEADER_SIZE + 5)
    answers: list[EntriesResponse] = []
    marked: list[int] = []

    def reply(_token: object, _code: int, msg: object) -> None:
        assert isinstance(msg, EntriesResponse)
        answers.append(msg)

    def no_error(_code: int, _err: object, _msg: str) -> EntriesResponse:
        raise AssertionError("a local read answers or raises")

    cfg = DLedgerConfig(group="g", self_id="a", peers="a-127.0.0.1:1")
    reads = ReadPath(f, MemberState("g", "a", ["a", "b", "c"], f), cfg, reply, no_error, lambda: 0,
                     lambda: False, lambda i, _m: marked.append(i),
                     None, None)  # type: ignore[arg-type]  # (local reads never ask a read index)

    def read(start: int) -> list[int]:
        reads.handle_read(RequestCode.READ, start, 100, 1 << 20, True, True, "", None, columnar=columnar)
        a = answers.pop()
        return list(array("q", a.indexes)) if columnar else [e.index for e in a.entries]

    assert read(bad - 3) == [bad - 3, bad - 2, bad - 1]
    assert set(marked) == {bad}  # reported (the store keeps the first report)
    with pytest.raises(CorruptEntryError) as e:
        read(bad)
    assert e.value.index == bad
    assert read(bad + 2)[0] == bad + 2  # the rest of the log is served


def test_a_rotten_last_record_leaves_the_records_before_it_readable(tmp_path: Path) -> None:
    """`read_raw` looks at the log's last record first (a push of the tail takes all of it):
    a rotten header there must not stop reads and pushes of the records before it (a binary
    search that probed it did), and the read that reaches it still names it."""
    s = FileLedgerStore(tmp_path / "s", data_file_size=1 << 20, index_file_size=32 * 1024)
    try:
        s.append_as_leader([b"x" * 100 for _ in range(64)], 1)
        before = record(s, 0)
        whole = s.read_raw(0, 1 << 20)
        assert whole.count == 64
        whole.data.release()
        flip(s, 63, 16, mask=1)  # the term field of the last record's header: its unit is rebuilt and refused
        raw = s.read_raw(0, 1 << 20)
        try:
            assert raw.count == 63 and bytes(raw.data[: len(before)]) == before
        finally:
            raw.data.release()
        assert s.read_raw(30, 0).count == 1
        with pytest.raises(CorruptEntryError) as e:
            s.read_raw(63, 0)
        assert e.value.index == 63
    finally:
        s.close()
