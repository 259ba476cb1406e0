"""The state machine layer without processes: the applier's order and waiters, snapshot
directories (atomic, verified, pruned, damaged ones skipped), and the KV state machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.entry import MAGIC_NOOP
from dledger.kv.commands import Cas, Delete, Get, Put, Range, decode_item, decode_range, decode_result, encode
from dledger.kv.machine import KVStateMachine
from dledger.statemachine.api import AppliedEntry
from dledger.statemachine.applier import Applier, Proposal
from dledger.statemachine.snapshot import SnapshotStore
from dledger.store.memory import MemoryLedgerStore


def _entries(*bodies: bytes, start: int = 0) -> list[AppliedEntry]:
    return [AppliedEntry(start + k, 1, b) for k, b in enumerate(bodies)]


# --- the applier -----------------------------------------------------------------------------


def test_the_applier_hands_out_committed_normal_entries_in_order_one_batch_at_a_time() -> None:
    store = MemoryLedgerStore()
    store.append_as_leader([b""], 1, magic=MAGIC_NOOP)  # a leader's NOOP: advances, never applied
    store.append_as_leader([b"a", b"b", b"c"], 1)
    a = Applier(-1)
    assert a.next_batch(store) is None  # nothing committed
    store.set_committed(2)
    batch = a.next_batch(store)
    assert batch is not None and (batch.first, batch.last) == (0, 2)
    assert [e.body for e in batch.entries] == [b"a", b"b"]
    assert a.next_batch(store) is None  # one batch in flight at a time
    store.set_committed(3)
    assert list(a.applied([b"ra", b"rb"])) == []
    assert a.applied_index == 2
    batch = a.next_batch(store)
    assert batch is not None and [e.index for e in batch.entries] == [3]


def test_proposals_and_queries_wait_for_their_index() -> None:
    store = MemoryLedgerStore()
    store.append_as_leader([b"x", b"y", b"z"], 1)
    a = Applier(-1)
    a.wait_proposal(Proposal("p", 1, 2, 1, [0, 0]))
    a.wait_query(2, "q2", b"")
    a.wait_query(0, "q0", b"")
    assert [q.token for q in a.due_queries()] == []  # nothing applied
    store.set_committed(0)
    a.next_batch(store)
    assert list(a.applied([b"r0"])) == []
    assert [q.token for q in a.due_queries()] == ["q0"]
    store.set_committed(2)
    a.next_batch(store)
    done = list(a.applied([b"r1", b"r2"]))
    assert [(p.token, p.results) for p in done] == [("p", [b"r1", b"r2"])]
    assert [q.token for q in a.due_queries()] == ["q2"]


def test_a_proposal_spanning_batches_gets_every_result() -> None:
    """Review: only the last batch's results reached a proposal split over several batches
    (more than a batch's entries, or a commit index that moved half-way): 4,096 of 5,000 were
    empty."""
    store = MemoryLedgerStore()
    store.append_as_leader([b"x%d" % k for k in range(10)], 1)
    a = Applier(-1)
    a.wait_proposal(Proposal("p", 2, 8, 1, [0] * 7))
    for committed in (4, 9):
        store.set_committed(committed)
        batch = a.next_batch(store)
        assert batch is not None
        done = list(a.applied([b"r%d" % e.index for e in batch.entries]))
    assert [(p.token, p.results) for p in done] == [("p", [b"r%d" % i for i in range(2, 9)])]


def test_a_wrong_number_of_results_is_refused_and_a_failure_stops_the_applier() -> None:
    store = MemoryLedgerStore()
    store.append_as_leader([b"x", b"y"], 1)
    store.set_committed(1)
    a = Applier(-1)
    a.next_batch(store)
    with pytest.raises(ValueError, match="1 results for 2 entries"):
        list(a.applied([b"only one"]))
    a.fail("boom")
    assert a.next_batch(store) is None and a.stopped == "boom"


def test_snapshots_are_due_by_entries_or_bytes_and_never_twice_at_once() -> None:
    store = MemoryLedgerStore()
    store.append_as_leader([b"x" * 100] * 10, 1)
    store.set_committed(9)
    a = Applier(-1)
    a.next_batch(store)
    list(a.applied([b""] * 10))
    assert a.snapshot_due(10, 0) and a.snapshot_due(0, 1000) and not a.snapshot_due(11, 1001)
    a.snapshotting = True
    assert not a.snapshot_due(10, 0)
    a.snapshot_taken(9)
    assert not a.snapshot_due(1, 1) and a.snapshot_index == 9


# --- snapshot directories ----------------------------------------------------------------------


def _kv_with(n: int) -> KVStateMachine:
    sm = KVStateMachine()
    sm.apply(_entries(*(encode(Put(f"k{i}".encode(), f"v{i}".encode())) for i in range(n))))
    return sm


def test_snapshots_round_trip_and_only_the_two_newest_stay(tmp_path: Path) -> None:
    snaps = SnapshotStore(tmp_path)
    for index in (9, 19, 29):
        meta = snaps.take(_kv_with(index + 1), index, 2, 1234 + index, "n0-127.0.0.1:1")
        assert meta.last_index == index and meta.files["kv.msgpack"].size > 0
    assert [m.last_index for m in snaps.metas()] == [29, 19]
    found = snaps.newest()
    assert found is not None
    meta, reader = found
    assert (meta.last_index, meta.last_term, meta.chain_crc) == (29, 2, 1263)
    restored = KVStateMachine()
    restored.restore(reader)
    assert len(restored) == 30 and restored.get(b"k29") is not None


def test_a_damaged_or_half_written_snapshot_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    snaps = SnapshotStore(tmp_path)
    snaps.take(_kv_with(5), 4, 1, 0, "")
    snaps.take(_kv_with(9), 8, 1, 0, "")
    blob = tmp_path / "snapshot" / f"{8:020d}" / "kv.msgpack"
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    (tmp_path / "snapshot" / ".tmp-00000000000000000012-1-1").mkdir()
    again = SnapshotStore(tmp_path)  # a restart
    assert not (tmp_path / "snapshot" / ".tmp-00000000000000000012-1-1").exists()
    found = again.newest()
    assert found is not None and found[0].last_index == 4
    assert "skipping snapshot" in caplog.text and "CRC" in caplog.text
    (tmp_path / "snapshot" / f"{4:020d}" / "meta.json").write_text("{not json")
    assert again.newest() is None


def test_a_state_machine_that_fails_mid_snapshot_leaves_nothing_behind(tmp_path: Path) -> None:
    class Broken(KVStateMachine):
        def snapshot(self, writer):  # type: ignore[no-untyped-def]
            with writer.open("part") as f:
                f.write(b"half")
            raise RuntimeError("disk gone")

    snaps = SnapshotStore(tmp_path)
    with pytest.raises(RuntimeError):
        snaps.take(Broken(), 3, 1, 0, "")
    assert list((tmp_path / "snapshot").iterdir()) == []


# --- the KV state machine ----------------------------------------------------------------------


def test_kv_commands_results_and_bad_bodies() -> None:
    sm = KVStateMachine()
    out = [decode_result(r) for r in sm.apply(_entries(
        encode(Put(b"a", b"1")), b"\xc1 not msgpack", encode(Cas(b"a", b"2", expect_value=b"1")),
        encode(Cas(b"a", b"3", expect_index=0)), encode(Delete(b"a")), encode(Delete(b"a")),
        encode(Cas(b"b", None, expect_index=-1)),
    ))]
    assert [r.ok for r in out] == [True, False, True, False, True, False, True]
    assert out[1].error.startswith("not a KV command")
    assert (out[2].prev, out[2].prev_index) == (b"1", 0)
    assert decode_item(sm.query(encode(Get(b"a")))) is None
    assert decode_item(sm.query(encode(Get(b"b")))) is None  # cas of None on an absent key: still absent


def test_a_range_page_is_capped_in_bytes_and_the_client_pages_on_from_its_last_key() -> None:
    """A page holds at most MAX_RANGE_BYTES of keys and values (always one pair); KVClient's
    range goes on from where a page stopped (80 MiB of values answered INTERNAL_ERROR:
    the answer exceeded the frame)."""
    import asyncio

    from dledger.kv.client import AsyncKVClient
    from dledger.kv.commands import MAX_RANGE_BYTES

    sm = KVStateMachine()
    value = 1 << 20
    sm.apply(_entries(*(encode(Put(b"k%02d" % k, bytes([k]) * value)) for k in range(13)),
                      encode(Put(b"k99", b"x" * (MAX_RANGE_BYTES + 1)))))  # one pair above the cap
    answer = sm.query(encode(Range(b"k", 1000)))
    page = decode_range(answer)
    assert page.more and 0 < len(page.items) < 13 and len(answer) <= MAX_RANGE_BYTES + 1024
    big = decode_range(sm.query(encode(Range(b"k", 1000, b"k12"))))
    assert [i.key for i in big.items] == [b"k99"] and not big.more  # a pair above the cap: a page of its own

    class Log:  # the state machine's answers, as a group's leader would give them
        queries = 0

        async def query(self, request: bytes, consistency: str | None, member: str | None) -> bytes:
            Log.queries += 1
            return sm.query(request)

    kv = AsyncKVClient("", client=Log())  # type: ignore[arg-type]
    whole = asyncio.run(kv.range("k"))
    assert [i.key for i in whole.items] == [b"k%02d" % k for k in range(13)] + [b"k99"] and not whole.more
    assert all(i.value == bytes([k]) * value for k, i in enumerate(whole.items[:13]))
    assert Log.queries >= 4  # 17 MiB: one page could not hold it
    five = asyncio.run(kv.range("k", limit=5))
    assert [i.key for i in five.items] == [b"k%02d" % k for k in range(5)] and five.more


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "del", "cas"]), st.binary(max_size=3), st.binary(max_size=4),
                          st.integers(-1, 40)), max_size=40))
def test_kv_is_deterministic_and_a_snapshot_restores_it_exactly(tmp_path_factory: pytest.TempPathFactory,
                                                               ops: list[tuple[str, bytes, bytes, int]]) -> None:
    bodies = [encode(Put(k, v)) if op == "put" else encode(Delete(k)) if op == "del"
              else encode(Cas(k, v, expect_index=i)) for op, k, v, i in ops]
    a, b = KVStateMachine(), KVStateMachine()
    assert a.apply(_entries(*bodies)) == b.apply(_entries(*bodies))
    snaps = SnapshotStore(tmp_path_factory.mktemp("s"))
    snaps.take(a, max(len(bodies) - 1, 0), 1, 0, "")
    found = snaps.newest()
    assert found is not None
    c = KVStateMachine()
    c.restore(found[1])
    whole = encode(Range(b"", 10_000))
    assert decode_range(c.query(whole)) == decode_range(a.query(whole)) == decode_range(b.query(whole))


# --- compaction behind a snapshot ----------------------------------------------------------------


def test_a_compaction_point_deletes_covered_files_whatever_the_disk_usage(tmp_path: Path) -> None:
    from dledger.store.file import FileLedgerStore

    store = FileLedgerStore(tmp_path / "s", data_file_size=4096, index_file_size=1024,
                            retention_check_interval_ms=3_600_000, disk_usage=lambda: (0.01, 1 << 40))
    try:
        store.append_as_leader([b"x" * 200] * 100, 1)  # ~20 data files
        store.flush()
        store.set_committed(99)
        store.set_retention_floor(60, "a follower")
        store.set_compaction_point(80)
        store.run_retention()  # the disk is nearly empty: only the snapshot makes room
        assert 40 < store.begin_index <= 60  # whole files before the follower's floor
        assert store.get(store.begin_index).body == b"x" * 200
        store.set_retention_floor(None)
        store.set_compaction_point(80)
        store.run_retention()
        assert 60 < store.begin_index <= 81 and store.get(99).index == 99
    finally:
        store.close()
    reopened = FileLedgerStore(tmp_path / "s", data_file_size=4096, index_file_size=1024)
    try:
        assert 60 < reopened.begin_index <= 81 and reopened.end_index == 99
    finally:
        reopened.close()


def test_the_memory_store_drops_what_a_snapshot_covers_at_once() -> None:
    store = MemoryLedgerStore()
    store.append_as_leader([b"y"] * 10, 1)
    store.set_committed(9)
    store.durable_index = 9
    store.set_retention_floor(4)
    store.set_compaction_point(7)
    assert store.begin_index == 4
    store.set_retention_floor(None)
    store.set_compaction_point(7)
    assert store.begin_index == 8 and store.get(9).body == b"y"
