"""Model-based tests of both ledger stores (memory and mmap file) against a Python list.

The stateful machine drives a store through leader appends, follower appends
(records taken verbatim from a second "leader" store with read_raw), truncate,
commit, reset and (file store) reopen, and checks every read against a model
of (term, magic, body) entries with their chain CRCs. Files are tiny (4 KiB data,
16-unit index files) so file boundaries are crossed all the time.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dledger.codes import ResponseCode
from dledger.entry import (
    HEADER_SIZE,
    MAGIC_CONFIG_CHANGE,
    MAGIC_NOOP,
    MAGIC_NORMAL,
    DLedgerEntry,
    chain_crc,
    decode_entry,
    scan,
)
from dledger.store.base import LedgerStore, StoreError
from dledger.store.file import FileLedgerStore
from dledger.store.memory import MemoryLedgerStore

DATA_FILE_SIZE = 4096
INDEX_FILE_SIZE = 32 * 16
BLANK_MAGIC = 0xFFFFFFFF


def open_file_store(path: Path | str, **kw: Any) -> FileLedgerStore:
    kw.setdefault("retention_check_interval_ms", 3_600_000)
    return FileLedgerStore(
        path, data_file_size=DATA_FILE_SIZE, index_file_size=INDEX_FILE_SIZE, **kw
    )


def make_body(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def data_file(store_dir: Path, start: int) -> bytes:
    return (store_dir / "data" / f"{start:020d}").read_bytes()


def _holding_bytes(store_dir: Path) -> dict[str, bytes]:
    """dir_image without the files that are all zeros: the next file created ahead of the log
    holds nothing, and an append that took it and failed deletes it again."""
    return {k: v for k, v in dir_image(store_dir).items() if v.strip(b"\0")}


def dir_image(store_dir: Path) -> dict[str, bytes]:
    """Every data and index file of a store, by relative path."""
    out = {}
    for sub in ("data", "index"):
        d = store_dir / sub
        if d.exists():
            for p in sorted(d.iterdir()):
                out[f"{sub}/{p.name}"] = p.read_bytes()
    return out


def feed(follower: LedgerStore, leader: LedgerStore, max_bytes: int = 1 << 20) -> None:
    """Copy the leader's records after the follower's end, verbatim, via read_raw."""
    while follower.end_index < leader.end_index:
        raw = leader.read_raw(follower.end_index + 1, max_bytes)
        try:
            assert raw.first_index == follower.end_index + 1
            assert raw.count >= 1
            end = follower.append_as_follower(raw.data)
        finally:
            raw.data.release()
        assert end == raw.first_index + raw.count - 1 == follower.end_index


def raw_bytes(store: LedgerStore, first: int, last: int) -> bytes:
    """Records first..last as one push (may span data files)."""
    out = bytearray()
    i = first
    while i <= last:
        raw = store.read_raw(i, 1 << 20)
        try:
            n = min(raw.count, last - i + 1)
            off = 0
            for _ in range(n):
                off += struct.unpack_from(">i", raw.data, off + 4)[0]
            out += raw.data[:off]
        finally:
            raw.data.release()
        i += n
    return bytes(out)


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here crashes, so fsync changes nothing observable; skip it to stay fast on a
    busy disk (durability is the subject of test_store_crash.py)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


# --- the model -------------------------------------------------------------------------


@dataclass
class ModelEntry:
    term: int
    magic: int
    body: bytes
    chain: int


@dataclass
class Model:
    begin_index: int = 0
    begin_term: int = -1
    begin_chain: int = 0
    entries: list[ModelEntry] = field(default_factory=list)
    committed: int = -1

    @property
    def end_index(self) -> int:
        return self.begin_index + len(self.entries) - 1

    @property
    def end_term(self) -> int:
        return self.entries[-1].term if self.entries else self.begin_term

    @property
    def end_chain(self) -> int:
        return self.entries[-1].chain if self.entries else self.begin_chain

    def entry(self, index: int) -> ModelEntry:
        assert self.begin_index <= index <= self.end_index
        return self.entries[index - self.begin_index]

    def chain_before(self, index: int) -> int:
        return self.begin_chain if index == self.begin_index else self.entry(index - 1).chain

    def term_before(self, index: int) -> int:
        return self.begin_term if index == self.begin_index else self.entry(index - 1).term

    def append(self, bodies: list[bytes], term: int, magic: int) -> None:
        chain = self.end_chain
        for body in bodies:
            chain = chain_crc(self.end_index + 1, term, zlib.crc32(body), chain)
            self.entries.append(ModelEntry(term, magic, body, chain))

    def truncate(self, from_index: int) -> None:
        del self.entries[from_index - self.begin_index :]

    def reset(self, begin_index: int, begin_term: int, begin_chain: int) -> None:
        self.begin_index = begin_index
        self.begin_term = begin_term
        self.begin_chain = begin_chain
        self.entries = []
        self.committed = max(self.committed, begin_index - 1)

    def first_index_of_term(self, term: int) -> int:
        for k, e in enumerate(self.entries):
            if e.term == term:
                return self.begin_index + k
        return -1


def assert_entry(e: DLedgerEntry, m: Model, index: int) -> None:
    want = m.entry(index)
    assert e.index == index
    assert (e.term, e.magic, e.body) == (want.term, want.magic, want.body), index
    assert e.body_crc == zlib.crc32(want.body)
    assert e.chain_crc == want.chain, index


def check_all(store: LedgerStore, m: Model) -> None:
    """Every entry of the model reads back (get and read)."""
    i = m.begin_index
    while i <= m.end_index:
        es = store.read(i, max_entries=300, max_bytes=1 << 20)
        assert es, i
        for e in es:
            assert_entry(e, m, i)
            i += 1
    if m.end_index >= m.begin_index:
        assert_entry(store.get(m.begin_index), m, m.begin_index)
        assert_entry(store.get(m.end_index), m, m.end_index)


def check_read_raw(store: LedgerStore, m: Model, index: int, max_bytes: int, file_backed: bool) -> None:
    raw = store.read_raw(index, max_bytes)
    try:
        data = bytes(raw.data)
        assert raw.first_index == index
        assert raw.count >= 1
    finally:
        raw.data.release()
    off = 0
    first_pos = -1
    for k in range(raw.count):
        e = decode_entry(data, off)
        assert_entry(e, m, index + k)
        if k == 0:
            first_pos = e.pos
        assert e.pos == first_pos + off  # contiguous records
        off += e.size
    assert off == len(data)  # whole records, nothing else
    if raw.count > 1:
        assert len(data) <= max_bytes
    # the records verify as a push would: index, pos, term order, body and chain CRCs
    res = scan(
        data, 0, len(data), index, first_pos, m.chain_before(index), m.term_before(index),
        strict=True,
    )
    assert (res.count, res.consumed) == (raw.count, len(data))
    # as many records as fit in max_bytes (file store: and in the data file of the first)
    nxt = index + raw.count
    if nxt <= m.end_index and len(data) + HEADER_SIZE + len(m.entry(nxt).body) <= max_bytes:
        assert file_backed, "memory store returned fewer records than fit"
        assert store.get(nxt).pos // DATA_FILE_SIZE != first_pos // DATA_FILE_SIZE
    check_tail_bytes(store, index)


def check_tail_bytes(store: LedgerStore, index: int) -> None:
    """What a leader asks before reading a push: the bytes one read from `index` returns through
    the log's end, or None when a data file ends first (it must not read to know)."""
    whole = store.read_raw(index, 1 << 62)
    try:
        reaches_end = whole.first_index + whole.count - 1 == store.end_index
        assert store.tail_bytes(index) == (len(whole.data) if reaches_end else None)
    finally:
        whole.data.release()


def check_read(store: LedgerStore, m: Model, index: int, max_entries: int, max_bytes: int) -> None:
    es = store.read(index, max_entries=max_entries, max_bytes=max_bytes)
    assert 1 <= len(es) <= max_entries
    for k, e in enumerate(es):
        assert_entry(e, m, index + k)
    last = index + len(es) - 1
    total = sum(e.size for e in es)
    assert total <= max_bytes or len(es) == 1, "an answer holds more than max_bytes"
    # it stops only at the end, at max_entries, or where the next record would not fit
    assert (last == m.end_index or len(es) == max_entries
            or total + HEADER_SIZE + len(m.entry(last + 1).body) > max_bytes)
    check_read_columns(store, es, index, max_entries, max_bytes)


def check_read_columns(store: LedgerStore, es: list[DLedgerEntry], index: int, max_entries: int,
                       max_bytes: int) -> None:
    """read_columns passes over exactly the entries read returns and keeps those of the magics
    asked for, bodies joined in order (or none)."""
    for magics in (frozenset([MAGIC_NORMAL]), frozenset([MAGIC_NOOP, MAGIC_CONFIG_CHANGE])):
        for bodies in (True, False):
            c = store.read_columns(index, max_entries, max_bytes, magics, bodies)
            kept = [e for e in es if e.magic in magics]
            assert (c.scanned, c.next_index, c.size) == (len(es), index + len(es), sum(e.size for e in es))
            assert (c.indexes.tolist(), c.terms.tolist(), c.positions.tolist()) == (
                [e.index for e in kept], [e.term for e in kept], [e.pos for e in kept])
            assert c.body_sizes.tolist() == [len(e.body) if bodies else 0 for e in kept]
            assert b"".join(c.bodies) == (b"".join(e.body for e in kept) if bodies else b"")


# --- the state machine ---------------------------------------------------------------

BODY = st.builds(
    make_body,
    st.one_of(st.integers(0, 600), st.integers(0, 40)),
    st.integers(0, 2**16),
)
BATCH = st.integers(1, 20).flatmap(lambda n: st.lists(BODY, min_size=n, max_size=n))
MAGICS = st.sampled_from([MAGIC_NORMAL, MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG_CHANGE])


class StoreMachine(RuleBasedStateMachine):
    file_backed: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.tmp = Path(tempfile.mkdtemp(prefix="dledger-model-")) if self.file_backed else None
        self.store = self._open("follower")
        self.leader = self._open("leader")  # mirror that supplies verbatim records

    def _open(self, name: str) -> LedgerStore:
        if self.tmp is None:
            return MemoryLedgerStore()
        return open_file_store(self.tmp / name)

    def teardown(self) -> None:
        try:
            self.store.close()
            self.leader.close()
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)

    # --- writes ---

    @rule(bodies=BATCH, bump=st.integers(0, 2), magic=MAGICS)
    def append_as_leader(self, bodies: list[bytes], bump: int, magic: int) -> None:
        term = max(self.model.end_term, 0) + bump
        first = self.model.end_index + 1
        r = self.store.append_as_leader(bodies, term, magic)
        lr = self.leader.append_as_leader(bodies, term, magic)
        assert (r.first_index, r.term, r.last_index) == (first, term, first + len(bodies) - 1)
        assert list(r.positions) == list(lr.positions)
        ps = list(r.positions)
        sizes = [HEADER_SIZE + len(b) for b in bodies]
        for k in range(len(ps)):
            if self.file_backed:
                # within one file, with at least 8 bytes left for the blank
                assert ps[k] % DATA_FILE_SIZE + sizes[k] + 8 <= DATA_FILE_SIZE
            if k == 0:
                continue
            prev_end = ps[k - 1] + sizes[k - 1]
            if self.file_backed and ps[k] != prev_end:
                # moved on to the next file: only when it did not fit with 8 to spare
                assert ps[k] % DATA_FILE_SIZE == 0
                assert prev_end + sizes[k] + 8 > ps[k]
            else:
                assert ps[k] == prev_end
        self.model.append(bodies, term, magic)
        for k in (0, len(ps) - 1):
            assert self.store.get(first + k).pos == ps[k]

    @rule(
        batches=st.lists(
            st.tuples(
                st.integers(1, 8).flatmap(lambda n: st.lists(BODY, min_size=n, max_size=n)),
                st.integers(0, 2),
                MAGICS,
            ),
            min_size=1,
            max_size=3,
        ),
        max_bytes=st.one_of(st.just(0), st.integers(0, 6000)),
    )
    def append_as_follower(
        self, batches: list[tuple[list[bytes], int, int]], max_bytes: int
    ) -> None:
        for bodies, bump, magic in batches:
            term = max(self.model.end_term, 0) + bump
            self.leader.append_as_leader(bodies, term, magic)
            self.model.append(bodies, term, magic)
        feed(self.store, self.leader, max_bytes)

    @precondition(
        lambda self: self.model.end_index >= max(self.model.committed + 1, self.model.begin_index)
    )
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        lo = max(self.model.committed + 1, self.model.begin_index)
        frm = data.draw(st.integers(lo, self.model.end_index + 1), label="truncate from")
        self.store.truncate(frm)
        self.leader.truncate(frm)
        self.model.truncate(frm)

    @precondition(lambda self: self.model.committed >= self.model.begin_index)
    @rule(data=st.data())
    def truncate_committed_is_refused(self, data: st.DataObject) -> None:
        frm = data.draw(st.integers(self.model.begin_index, self.model.committed))
        with pytest.raises(StoreError) as ei:
            self.store.truncate(frm)
        assert ei.value.code == ResponseCode.INCONSISTENT_STATE

    @rule(data=st.data())
    def set_committed(self, data: st.DataObject) -> None:
        m = self.model
        i = data.draw(st.integers(m.begin_index - 1, m.end_index), label="commit")
        self.store.set_committed(i)
        m.committed = max(m.committed, i)
        with pytest.raises(StoreError) as ei:
            self.store.set_committed(m.end_index + 1)
        assert ei.value.code == ResponseCode.INDEX_OUT_OF_RANGE

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        m = self.model
        lo = max(m.committed + 1, 0)
        begin = data.draw(st.integers(lo, max(lo, m.end_index + 1) + 10), label="begin")
        term = max(m.end_term, 0) + data.draw(st.integers(0, 2), label="term bump")
        chain = data.draw(st.integers(0, 2**32 - 1), label="chain")
        if self.file_backed:
            pos = data.draw(
                st.one_of(
                    st.just(self.leader.pos_of_next()),
                    st.integers(0, 30).map(lambda k: k * DATA_FILE_SIZE),
                    st.tuples(st.integers(0, 30), st.integers(0, DATA_FILE_SIZE - 8)).map(
                        lambda t: t[0] * DATA_FILE_SIZE + t[1]
                    ),
                ),
                label="pos",
            )
        else:
            pos = data.draw(st.integers(0, 1 << 30), label="pos")
        self.store.reset(begin, term, chain, pos)
        self.leader.reset(begin, term, chain, pos)
        m.reset(begin, term, chain)
        assert self.store.pos_of_next() == pos

    def _reopen(self) -> None:
        s = self.store
        before = (
            s.begin_index, s.begin_term, s.begin_chain_crc,
            s.end_index, s.end_term, s.end_chain_crc, s.pos_of_next(),
        )
        s.close()
        self.store = s = self._open("follower")
        after = (
            s.begin_index, s.begin_term, s.begin_chain_crc,
            s.end_index, s.end_term, s.end_chain_crc, s.pos_of_next(),
        )
        assert after == before
        # a clean close flushes: the commit index survives (never above what was set)
        assert s.committed_index <= self.model.committed
        assert s.committed_index == self.model.committed
        check_all(s, self.model)

    # --- reads ---

    @precondition(lambda self: self.model.end_index >= self.model.begin_index)
    @rule(data=st.data())
    def check_reads(self, data: st.DataObject) -> None:
        m, s = self.model, self.store
        i = data.draw(st.integers(m.begin_index, m.end_index), label="index")
        assert_entry(s.get(i), m, i)
        assert s.term_at(i) == m.entry(i).term
        max_bytes = data.draw(st.integers(0, 9000), label="max_bytes")
        check_read_raw(s, m, i, max_bytes, self.file_backed)
        check_read(
            s, m, i, data.draw(st.integers(1, 50), label="max_entries"),
            data.draw(st.integers(0, 9000), label="read max_bytes"),
        )
        terms = [e.term for e in m.entries]
        t = data.draw(st.integers(min(terms) - 1, max(terms) + 1), label="term")
        assert s.first_index_of_term(t) == m.first_index_of_term(t)

    @rule()
    def check_bounds(self) -> None:
        m, s = self.model, self.store
        for index, code in (
            (m.begin_index - 1, ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN),
            (m.end_index + 1, ResponseCode.INDEX_OUT_OF_RANGE),
        ):
            with pytest.raises(StoreError) as ei:
                s.get(index)
            assert ei.value.code == code
            with pytest.raises(StoreError) as ei:
                s.read_raw(index, 100)
            assert ei.value.code == code
        assert s.term_at(m.begin_index - 1) == m.begin_term

    @rule()
    def check_everything(self) -> None:
        check_all(self.store, self.model)

    @invariant()
    def ends_match_model(self) -> None:
        m, s, ld = self.model, self.store, self.leader
        assert s.begin_index == m.begin_index
        assert s.begin_term == m.begin_term
        assert s.begin_chain_crc == m.begin_chain
        assert s.end_index == m.end_index
        assert s.end_term == m.end_term
        assert s.end_chain_crc == m.end_chain
        assert s.committed_index == m.committed
        assert (ld.end_index, ld.end_chain_crc) == (m.end_index, m.end_chain)
        # leader and follower lay records out identically
        assert s.pos_of_next() == ld.pos_of_next()


MACHINE_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class MemoryStoreMachine(StoreMachine):
    file_backed = False


class FileStoreMachine(StoreMachine):
    file_backed = True

    @rule()
    def reopen(self) -> None:
        self._reopen()


TestMemoryStoreModel = MemoryStoreMachine.TestCase
TestMemoryStoreModel.settings = MACHINE_SETTINGS
TestFileStoreModel = FileStoreMachine.TestCase
TestFileStoreModel.settings = MACHINE_SETTINGS


# --- explicit examples: file boundaries ---------------------------------------------------


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[..., LedgerStore]]:
    """Factory of stores ("memory" or "file" + a name), all closed at the end."""
    opened: list[LedgerStore] = []

    def make(kind: str, name: str = "s", **kw: Any) -> LedgerStore:
        s: LedgerStore = (
            MemoryLedgerStore(**kw) if kind == "memory" else open_file_store(tmp_path / name, **kw)
        )
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


FIRST_BODY = b"x" * 100  # a 148-byte record at position 0
REST = DATA_FILE_SIZE - (HEADER_SIZE + len(FIRST_BODY))  # 3948 bytes left in file 0


@pytest.mark.parametrize("short", range(9))
@pytest.mark.parametrize("mode", ["separate", "one batch", "follower"])
def test_record_at_end_of_data_file(tmp_path: Path, short: int, mode: str) -> None:
    """A record is written only if size + 8 bytes remain. `short` is how many bytes the
    second record lacks: 0 leaves exactly 8 bytes, 8 would fill the file exactly."""
    size = REST - 8 + short
    second = make_body(size - HEADER_SIZE, short)
    third = b"third record"
    writer = open_file_store(tmp_path / "w")
    try:
        if mode == "one batch":
            r = writer.append_as_leader([FIRST_BODY, second, third], 1)
            positions = list(r.positions)
        else:
            positions = []
            for body in (FIRST_BODY, second, third):
                positions += list(writer.append_as_leader([body], 1).positions)
        if mode == "follower":
            store = open_file_store(tmp_path / "f")
            for i in range(3):
                raw = writer.read_raw(i, 0)
                try:
                    store.append_as_follower(raw.data)
                finally:
                    raw.data.release()
            d = tmp_path / "f"
        else:
            store = writer
            d = tmp_path / "w"
        f0 = data_file(d, 0)
        f1 = data_file(d, DATA_FILE_SIZE)
        assert len(f0) == len(f1) == DATA_FILE_SIZE
        assert positions[0] == 0
        assert positions[1] == (HEADER_SIZE + len(FIRST_BODY) if short == 0 else DATA_FILE_SIZE)
        if short == 0:
            # the second record leaves exactly 8 bytes: they hold the blank that closes file 0
            blank_at = DATA_FILE_SIZE - 8
            assert positions[2] == DATA_FILE_SIZE
            first_in_f1 = 2
        else:
            blank_at = HEADER_SIZE + len(FIRST_BODY)
            assert positions[2] == DATA_FILE_SIZE + size
            first_in_f1 = 1
        assert struct.unpack_from(">Ii", f0, blank_at) == (BLANK_MAGIC, DATA_FILE_SIZE - blank_at)
        e = decode_entry(f1, 0)
        assert (e.index, e.pos) == (first_in_f1, DATA_FILE_SIZE)
        for i, body in enumerate((FIRST_BODY, second, third)):
            got = store.get(i)
            assert (got.body, got.pos) == (body, positions[i])
        assert store.pos_of_next() == positions[2] + HEADER_SIZE + len(third)
        if mode == "follower":
            # verbatim replication: the follower's files are byte for byte the leader's (once
            # closed: a live store may have its next file created ahead, at its own time)
            store.close()
            writer.close()
            assert dir_image(tmp_path / "f") == dir_image(tmp_path / "w")
        writer.close()
        # and all of it survives a reopen
        again = open_file_store(d)
        try:
            assert again.end_index == 2
            assert again.pos_of_next() == positions[2] + HEADER_SIZE + len(third)
            for i, body in enumerate((FIRST_BODY, second, third)):
                got = again.get(i)
                assert (got.body, got.pos) == (body, positions[i])
            assert again.append_as_leader([b"more"], 1).positions[0] == again.get(3).pos
        finally:
            again.close()
    finally:
        writer.close()


def test_largest_body_fills_a_file_leaving_the_blank(tmp_path: Path) -> None:
    s = open_file_store(tmp_path / "s")
    try:
        biggest = DATA_FILE_SIZE - HEADER_SIZE - 8
        assert s.max_body_bytes == biggest
        r = s.append_as_leader([b"a"], 1)
        r2 = s.append_as_leader([b"b" * biggest, b"c" * biggest], 1)
        assert list(r2.positions) == [DATA_FILE_SIZE, 2 * DATA_FILE_SIZE]
        assert r.positions[0] == 0
        with pytest.raises(StoreError) as ei:
            s.append_as_leader([b"d" * (biggest + 1)], 1)
        assert ei.value.code == ResponseCode.UNEXPECTED_ARGUMENT
        f1 = data_file(tmp_path / "s", DATA_FILE_SIZE)
        assert struct.unpack_from(">Ii", f1, DATA_FILE_SIZE - 8) == (BLANK_MAGIC, 8)
        assert s.get(2).body == b"c" * biggest
    finally:
        s.close()


def test_index_files_roll_over(tmp_path: Path) -> None:
    """16 units per index file: entries 0..49 need four index files."""
    s = open_file_store(tmp_path / "s")
    bodies = [make_body(i % 7, i) for i in range(50)]
    try:
        for i in range(0, 50, 7):
            s.append_as_leader(bodies[i : i + 7], 1 + i // 20)
        names = sorted(p.name for p in (tmp_path / "s" / "index").iterdir())
        assert names == [f"{k * INDEX_FILE_SIZE:020d}" for k in range(4)]
        unit = (tmp_path / "s" / "index" / names[2]).read_bytes()[32 * 3 : 32 * 4]  # entry 35
        magic, pos, size, index, term = struct.unpack(">iqiqq", unit)
        assert (magic, pos, size, index, term) == (
            MAGIC_NORMAL, s.get(35).pos, HEADER_SIZE + len(bodies[35]), 35, s.get(35).term,
        )
    finally:
        s.close()
    s = open_file_store(tmp_path / "s")
    try:
        assert [s.get(i).body for i in range(50)] == bodies
    finally:
        s.close()


# --- bad input ------------------------------------------------------------------------------

KINDS = ["memory", "file"]


def _state(s: LedgerStore) -> tuple[Any, ...]:
    return (
        s.begin_index, s.end_index, s.end_term, s.end_chain_crc, s.committed_index,
        s.pos_of_next(), [(e.index, e.term, e.body, e.chain_crc) for e in s.read(s.begin_index)],
    )


@pytest.mark.parametrize("kind", KINDS)
def test_bad_appends_are_refused(kind: str, stores: Callable[..., LedgerStore]) -> None:
    s = stores(kind, max_body_bytes=100)
    s.append_as_leader([b"a", b"b"], 3)
    before = _state(s)
    with pytest.raises(StoreError) as ei:
        s.append_as_leader([], 3)
    assert ei.value.code == ResponseCode.REQUEST_WITH_EMPTY_BODYS
    with pytest.raises(StoreError) as ei:
        s.append_as_leader([b"ok", b"x" * 101], 3)
    assert ei.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    with pytest.raises(StoreError) as ei:
        s.append_as_leader([b"old term"], 2)
    assert ei.value.code == ResponseCode.EXPIRED_TERM
    assert _state(s) == before
    s.append_as_leader([b"x" * 100], 3)  # exactly the limit is fine
    assert s.get(2).body == b"x" * 100


@pytest.mark.parametrize("kind", KINDS)
def test_follower_append_with_wrong_first_index(
    kind: str, stores: Callable[..., LedgerStore]
) -> None:
    leader = stores(kind, "leader")
    follower = stores(kind, "follower")
    leader.append_as_leader([b"r%d" % i for i in range(6)], 1)
    follower.append_as_follower(raw_bytes(leader, 0, 2))
    before = _state(follower)
    for first in (1, 2, 4, 5):  # overlap or gap: the push must start at end_index + 1 == 3
        with pytest.raises(StoreError) as ei:
            follower.append_as_follower(raw_bytes(leader, first, 5))
        assert ei.value.code == ResponseCode.INCONSISTENT_INDEX
        assert _state(follower) == before
    follower.append_as_follower(raw_bytes(leader, 3, 5))
    assert _state(follower) == _state(leader)


def _find_first_index_in_file(store: LedgerStore, file_no: int) -> int:
    for i in range(store.begin_index, store.end_index + 1):
        if store.get(i).pos >= file_no * DATA_FILE_SIZE:
            return i
    raise AssertionError(f"no entry in data file {file_no}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["mid file", "file start", "across files"])
@pytest.mark.parametrize(
    ("damage", "which"),
    [(d, w) for d in ("body", "chain", "term") for w in ("middle", "first")]
    + [("truncated", "last")],
)
def test_follower_append_with_corrupt_record_keeps_nothing(
    kind: str,
    where: str,
    damage: str,
    which: str,
    stores: Callable[..., LedgerStore],
    tmp_path: Path,
) -> None:
    leader = stores(kind, "leader")
    follower = stores(kind, "follower")
    bodies = [make_body(60 + (i * 37) % 300, i) for i in range(60)]
    for i in range(0, 60, 6):
        leader.append_as_leader(bodies[i : i + 6], 1 + i // 30)
    j1 = _find_first_index_in_file(leader, 1)
    j2 = _find_first_index_in_file(leader, 2)
    if where == "mid file":
        have, push_to = j1 + 1, j2 - 2
    elif where == "file start":
        # the push starts file 2: the follower must close file 1 with a blank first
        have, push_to = j2, j2 + 6
    else:
        have, push_to = j2 - 3, j2 + 4
    follower.append_as_follower(raw_bytes(leader, 0, have - 1))
    push = bytearray(raw_bytes(leader, have, push_to))
    # the record in the middle of the batch
    offs = []
    off = 0
    while off < len(push):
        offs.append(off)
        off += struct.unpack_from(">i", push, off + 4)[0]
    k = len(offs) // 2 if which == "middle" else 0
    assert k == 0 or 0 < k < len(offs) - 1
    if damage == "body":
        push[offs[k] + HEADER_SIZE + 5] ^= 0x40
    elif damage == "chain":
        push[offs[k] + 37] ^= 0x01
    elif damage == "term":
        push[offs[k] + 23] ^= 0x04
    else:
        push = push[: offs[-1] + 30]  # the last record is cut in its header
    before = _state(follower)
    if isinstance(follower, FileLedgerStore):  # its next files may be in creation ahead
        follower.data.settle()
        follower.index.settle()
    image = _holding_bytes(tmp_path / "follower") if kind == "file" else {}
    with pytest.raises(StoreError) as ei:
        follower.append_as_follower(push)
    assert ei.value.code in (ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.INCONSISTENT_STATE)
    if damage != "truncated":
        assert ei.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert _state(follower) == before
    if kind == "file":
        assert _holding_bytes(tmp_path / "follower") == image
    # the good push is then taken, and the follower matches the leader
    follower.append_as_follower(raw_bytes(leader, have, leader.end_index))
    assert _state(follower)[1:4] == _state(leader)[1:4]
    assert [e.body for e in follower.read(0, 100)] == bodies


@pytest.mark.parametrize("kind", KINDS)
def test_truncate_and_read_bounds(kind: str, stores: Callable[..., LedgerStore]) -> None:
    s = stores(kind)
    s.append_as_leader([b"e%d" % i for i in range(10)], 1)
    s.set_committed(5)
    with pytest.raises(StoreError) as ei:
        s.truncate(5)
    assert ei.value.code == ResponseCode.INCONSISTENT_STATE
    with pytest.raises(StoreError) as ei:
        s.truncate(12)
    assert ei.value.code == ResponseCode.INDEX_OUT_OF_RANGE
    s.set_committed(3)  # never moves backwards
    assert s.committed_index == 5
    with pytest.raises(StoreError) as ei:
        s.set_committed(10)
    assert ei.value.code == ResponseCode.INDEX_OUT_OF_RANGE
    s.truncate(6)
    assert (s.end_index, s.end_term) == (5, 1)
    assert s.end_chain_crc == s.get(5).chain_crc
    for index, code in (
        (-1, ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN),
        (6, ResponseCode.INDEX_OUT_OF_RANGE),
        (100, ResponseCode.INDEX_OUT_OF_RANGE),
    ):
        with pytest.raises(StoreError) as ei:
            s.get(index)
        assert ei.value.code == code
        if index != s.begin_index - 1:  # term_at(begin - 1) is begin_term
            with pytest.raises(StoreError) as ei:
                s.term_at(index)
            assert ei.value.code == code
    assert s.term_at(-1) == -1
    # the truncated tail is gone for good, and the next entry continues the chain
    r = s.append_as_leader([b"new"], 2)
    assert r.first_index == 6
    assert s.get(6).chain_crc == chain_crc(6, 2, zlib.crc32(b"new"), s.get(5).chain_crc)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "begin_pos", [0, 3 * DATA_FILE_SIZE, 3 * DATA_FILE_SIZE + 1000, 4 * DATA_FILE_SIZE - 60]
)
def test_reset_then_append_then_reopen(
    kind: str, begin_pos: int, stores: Callable[..., LedgerStore], tmp_path: Path
) -> None:
    s = stores(kind)
    s.append_as_leader([b"old" * 30] * 5, 1)
    s.set_committed(2)
    s.reset(100, 7, 0xDEADBEEF, begin_pos)
    assert (s.begin_index, s.end_index, s.end_term, s.end_chain_crc) == (100, 99, 7, 0xDEADBEEF)
    assert s.committed_index == 99
    assert s.pos_of_next() == begin_pos
    assert s.term_at(99) == 7
    for index, code in (
        (4, ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN),
        (99, ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN),
        (100, ResponseCode.INDEX_OUT_OF_RANGE),
    ):
        with pytest.raises(StoreError) as ei:
            s.get(index)
        assert ei.value.code == code
    with pytest.raises(StoreError):
        s.append_as_leader([b"x"], 6)  # below the snapshot's term
    bodies = [make_body(100, i) for i in range(12)]
    r = s.append_as_leader(bodies, 7)
    assert r.first_index == 100
    if kind == "file" and begin_pos % DATA_FILE_SIZE == DATA_FILE_SIZE - 60:
        assert r.positions[0] == begin_pos + 60  # 148 bytes do not fit: next file
    else:
        assert r.positions[0] == begin_pos
    m = Model(begin_index=100, begin_term=7, begin_chain=0xDEADBEEF, committed=99)
    m.append(bodies, 7, MAGIC_NORMAL)
    check_all(s, m)
    if kind == "file":
        end_pos = s.pos_of_next()
        s.close()
        s = stores("file")
        assert (s.begin_index, s.begin_term, s.begin_chain_crc) == (100, 7, 0xDEADBEEF)
        assert (s.end_index, s.end_term, s.end_chain_crc) == (111, 7, m.end_chain)
        assert s.committed_index == 99
        assert s.pos_of_next() == end_pos
        check_all(s, m)
        s.append_as_leader([b"after reopen"], 8)
        m.append([b"after reopen"], 8, MAGIC_NORMAL)
        check_all(s, m)
        assert s.first_index_of_term(8) == 112
        assert s.first_index_of_term(7) == 100
        assert s.first_index_of_term(1) == -1
