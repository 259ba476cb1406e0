"""The producer table (core.producers) folded from real logs in a memory store."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.codes import DLedgerError, ResponseCode
from dledger.core import producers as producers_mod
from dledger.core.producers import ProducerTable, Run, marker_body
from dledger.entry import MAGIC_NOOP, MAGIC_SESSION
from dledger.store.memory import MemoryLedgerStore

DAY = 86_400_000


def write(store: MemoryLedgerStore, term: int, runs: list[Run], ts: int = 1000, keep: int | None = None) -> int:
    """A leader's write: the marker, then its bodies (only the first `keep` of them: the rest
    lost with the leader). The marker's index."""
    m = store.append_as_leader([marker_body(ts, runs)], term, MAGIC_SESSION).first_index
    bodies = [f"{r.producer}-{r.first_seq + k}".encode() for r in runs for k in range(r.count)]
    if keep is not None:
        bodies = bodies[:keep]
    if bodies:
        store.append_as_leader(bodies, term)
    return m


def folded(store: MemoryLedgerStore, table: ProducerTable | None = None) -> ProducerTable:
    table = table or ProducerTable(DAY, 1000)
    store.set_committed(store.end_index)
    while not table.fold(store, store.committed_index):
        pass
    return table


def test_a_whole_write_is_folded_and_duplicates_get_their_indexes() -> None:
    store = MemoryLedgerStore()
    m = write(store, 1, [Run("a", 0, 3), Run("", 0, 2), Run("b", 0, 1)])
    t = folded(store)
    a, b = t.lookup("a"), t.lookup("b")
    assert a is not None and b is not None
    assert (a.last_seq, a.last_index, b.last_seq, b.last_index) == (2, m + 3, 0, m + 6)
    d = t.decide(a, "a", 1, 4)  # sequences 1, 2 are in; 3, 4 are new
    assert (d.duplicates, d.indexes, d.wait_index) == (2, [m + 2, m + 3], m + 3)
    assert t.decide(a, "a", 3, 2).duplicates == 0


def test_a_write_cut_short_by_a_new_leader_counts_only_what_survived() -> None:
    store = MemoryLedgerStore()
    m = write(store, 1, [Run("a", 0, 5)], keep=3)
    store.append_as_leader([b""], 2, MAGIC_NOOP)  # the next leader's NOOP follows the survivors
    t = folded(store)
    a = t.lookup("a")
    assert a is not None and a.last_seq == 2 and t.open is None
    d = t.decide(a, "a", 0, 5)  # the client's retry of the whole batch
    assert d.duplicates == 3 and d.indexes == [m + 1, m + 2, m + 3]


def test_a_write_committed_in_parts_is_folded_across_commits() -> None:
    store = MemoryLedgerStore()
    m = write(store, 1, [Run("a", 0, 4)])
    t = ProducerTable(DAY, 1000)
    store.set_committed(m + 2)
    t.fold(store, m + 2)
    assert t.lookup("a").last_seq == 1  # type: ignore[union-attr]
    assert t.open is not None
    folded(store, t)
    assert t.lookup("a").last_seq == 3 and t.open is None  # type: ignore[union-attr]


def test_folding_a_long_log_goes_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producers_mod, "FOLD_CHUNK", 5)
    store = MemoryLedgerStore()
    for k in range(6):
        write(store, 1, [Run("a", 3 * k, 3)])
    t = ProducerTable(DAY, 1000)
    store.set_committed(store.end_index)
    calls = 1
    while not t.fold(store, store.committed_index):
        calls += 1
    assert calls >= 4 and t.lookup("a").last_seq == 17  # type: ignore[union-attr]


def test_gaps_and_unknown_producers_are_refused() -> None:
    store = MemoryLedgerStore()
    write(store, 1, [Run("a", 0, 2)])
    t = folded(store)
    with pytest.raises(DLedgerError) as e:
        t.decide(t.lookup("a"), "a", 3, 1)
    assert e.value.code == ResponseCode.OUT_OF_ORDER_SEQUENCE
    with pytest.raises(DLedgerError) as e:
        t.decide(None, "new", 1, 1)
    assert e.value.code == ResponseCode.UNKNOWN_PRODUCER
    assert t.decide(None, "new", 0, 1).duplicates == 0


def test_idle_producers_expire_by_the_log_clock() -> None:
    store = MemoryLedgerStore()
    write(store, 1, [Run("old", 0, 1)], ts=1_000)
    write(store, 1, [Run("recent", 0, 1)], ts=45_000)
    write(store, 1, [Run("c", 0, 1)], ts=60_000)
    t = folded(store, ProducerTable(expiry_ms=20_000, max_producers=1000))
    assert t.lookup("old") is None  # idle longer than the expiry when c's marker came
    assert t.lookup("recent") is not None and t.lookup("c") is not None


def test_beyond_the_cap_the_least_recently_used_go_at_the_next_marker() -> None:
    """Eviction happens at markers only: the same log positions on every member, whatever
    their commit points (a member folding a write in two parts evicts the same producers)."""
    store = MemoryLedgerStore()
    for k, pid in enumerate(("a", "b", "c")):
        write(store, 1, [Run(pid, 0, 1)], ts=1_000 + k)
    t = folded(store, ProducerTable(expiry_ms=DAY, max_producers=2))
    assert [p for p in "abc" if t.lookup(p)] == ["a", "b", "c"]  # the last write's producers pass the cap
    write(store, 1, [Run("b", 1, 1)], ts=2_000)  # a goes; b used again: c is now the least recent
    write(store, 1, [Run("d", 0, 1)], ts=2_001)
    write(store, 1, [Run("e", 0, 1)], ts=2_002)  # c goes
    folded(store, t)
    assert [p for p in "abcde" if t.lookup(p)] == ["b", "d", "e"]


def test_a_higher_epoch_restarts_a_producer_and_fences_the_older() -> None:
    store = MemoryLedgerStore()
    write(store, 1, [Run("q/p0", 0, 3, epoch=7)])
    t = folded(store)
    p = t.lookup("q/p0")
    assert p is not None and (p.epoch, p.last_seq) == (7, 2)
    assert t.decide(p, "q/p0", 0, 3, epoch=7).duplicates == 3  # batch 7 run again
    assert t.decide(p, "q/p0", 0, 2, epoch=8).duplicates == 0  # batch 8: a new session from 0
    with pytest.raises(DLedgerError) as e:
        t.decide(p, "q/p0", 3, 1, epoch=8)
    assert e.value.code == ResponseCode.UNKNOWN_PRODUCER
    with pytest.raises(DLedgerError) as e:
        t.decide(p, "q/p0", 3, 1, epoch=6)
    assert e.value.code == ResponseCode.PRODUCER_FENCED
    write(store, 1, [Run("q/p0", 0, 2, epoch=8)])
    folded(store, t)
    p = t.lookup("q/p0")
    assert p is not None and (p.epoch, p.last_seq) == (8, 1) and p.index_of(2) == -1


def test_the_table_round_trips_through_a_snapshot_mid_write() -> None:
    store = MemoryLedgerStore()
    m = write(store, 1, [Run("a", 0, 4), Run("b", 7, 2)])
    store.set_committed(m + 2)
    t = ProducerTable(DAY, 1000)
    t.fold(store, m + 2)
    copy = ProducerTable(DAY, 1000)
    copy.load(t.encode())
    folded(store, copy)
    folded(store, t)
    assert copy.encode() == t.encode()
    assert copy.lookup("b").last_seq == 8  # type: ignore[union-attr]


def test_the_leaders_overlay_answers_until_its_writes_are_folded() -> None:
    store = MemoryLedgerStore()
    t = folded(store)
    view = t.lookup("a")
    assert t.decide(view, "a", 0, 2).duplicates == 0
    m = write(store, 1, [Run("a", 0, 2)])
    from dledger.core.producers import Producer

    p = Producer()
    p.add(0, m + 1, 2, 1000)
    t.note_own([("a", p)])
    assert t.decide(t.lookup("a"), "a", 0, 2).duplicates == 2  # not committed, still known
    folded(store, t)
    assert not t.overlay and t.lookup("a").last_index == m + 2  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5), st.booleans()), min_size=1, max_size=12))
def test_folding_matches_the_surviving_entries(writes: list[tuple[int, int, bool]]) -> None:
    """Any sequence of writes, some cut short by a new leader: every producer's last sequence
    is the last one whose entry is in the log, and each sequence maps to its own entry."""
    store = MemoryLedgerStore()
    term, nxt = 1, {"a": 0, "b": 0}
    for count, keep, cut in writes:
        pid = "a" if count % 2 else "b"
        kept = min(keep, count) if cut else count
        write(store, term, [Run(pid, nxt[pid], count)], keep=kept)
        nxt[pid] += kept
        if cut:
            term += 1
            store.append_as_leader([b""], term, MAGIC_NOOP)
    t = folded(store)
    for pid, n in nxt.items():
        p = t.lookup(pid)
        assert (p.last_seq if p is not None else -1) == n - 1
        if p is not None:
            for seq in range(max(0, n - 3), n):
                i = p.index_of(seq)
                assert i < 0 or store.get(i).body == f"{pid}-{seq}".encode()
