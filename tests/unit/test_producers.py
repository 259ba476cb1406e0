"""The producer table (core.producers) folded from real logs in a memory store."""

from __future__ import annotations

import itertools
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import ConfigError, DLedgerConfig
from dledger.core import producers as producers_mod
from dledger.core.messages import AppendRequest, AppendResponse, EntriesResponse, GetRequest, ReadRequest
from dledger.core.node import Node, Reply
from dledger.core.producers import SPANS, CreationLimiter, ProducerTable, Run, SessionMarker, marker_body
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


def test_beyond_the_cap_the_least_recently_used_go_as_they_are_created() -> None:
    """Eviction happens as runs are folded: the same log positions on every member, whatever
    their commit points (a member folding a write in two parts evicts the same producers)."""
    store = MemoryLedgerStore()
    for k, pid in enumerate(("a", "b", "c")):
        write(store, 1, [Run(pid, 0, 1)], ts=1_000 + k)
    t = folded(store, ProducerTable(expiry_ms=DAY, max_producers=2))
    assert [p for p in "abc" if t.lookup(p)] == ["b", "c"]  # c took a's place
    write(store, 1, [Run("b", 1, 1)], ts=2_000)  # b used again: c is now the least recent
    write(store, 1, [Run("d", 0, 1)], ts=2_001)  # c goes
    write(store, 1, [Run("e", 0, 1)], ts=2_002)  # b goes
    folded(store, t)
    assert [p for p in "abcde" if t.lookup(p)] == ["d", "e"]
    again = ProducerTable(expiry_ms=DAY, max_producers=2)  # folded in other chunks: the same table
    for hi in range(0, store.end_index + 1, 2):
        again.fold(store, hi)
    folded(store, again)
    assert again.encode() == t.encode()


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


# --- ownership, reuse, creation bounds (issue 26) ------------------------------------------------


def test_a_marker_without_owners_keeps_its_bytes_and_owners_round_trip() -> None:
    """Stores written before owners existed, and DLedger-compatible readers, see the same bytes
    for anonymous appends; an older marker decodes with owner ""."""
    runs = [Run("orders/p0", 0, 3, 7), Run("", 0, 2)]
    assert marker_body(1_700_000_000_000, runs).hex() == \
        "92cf0000018bcfe568009294a96f72646572732f703000030794a0000200"
    decode = msgspec.msgpack.Decoder(SessionMarker).decode
    owned = decode(marker_body(5, [Run("a", 0, 1, 2, "CN=alice")]))
    assert owned.runs == [Run("a", 0, 1, 2, "CN=alice")]
    assert decode(msgspec.msgpack.encode([5, [["a", 0, 1, 2]]])).runs[0].owner == ""


def test_the_owner_is_folded_from_the_log_and_another_principal_is_refused() -> None:
    store = MemoryLedgerStore()
    write(store, 1, [Run("a", 0, 2, owner="alice")])
    t = folded(store)
    a = t.lookup("a")
    assert a is not None and a.owner == "alice"
    assert t.decide(a, "a", 2, 1, principal="alice").duplicates == 0
    for seq in (0, 2, 5):  # a duplicate, the next, a gap: all the same refusal, nothing learnt
        with pytest.raises(DLedgerError) as e:
            t.decide(a, "a", seq, 1, principal="bob")
        assert e.value.code == ResponseCode.PRODUCER_NOT_OWNED and "alice" not in e.value.message


def test_the_epochs_first_span_is_kept_beyond_the_recent_ones() -> None:
    """A process reusing an id from sequence 0 must find what sequence 0 is stored as, even
    where the table trimmed the producer's other old spans (over its budget)."""
    store = MemoryLedgerStore()
    first = write(store, 1, [Run("a", 0, 2)]) + 1
    for k in range(SPANS + 8):
        write(store, 1, [Run("a", 2 + k, 1)])
    kept = folded(store).lookup("a")  # within the budget: every span
    assert kept is not None and len(kept.spans) == 3 * (SPANS + 9) and kept.index_of(2) == first + 3
    a = folded(store, ProducerTable(DAY, 1000, max_spans=1)).lookup("a")
    assert a is not None
    assert (a.index_of(0), a.index_of(1)) == (first, first + 1)
    assert a.index_of(2) == -1 and a.index_of(SPANS + 9) >= 0  # over the budget the middle ones go
    assert len(a.spans) == 3 * (SPANS + 1)


def test_every_span_of_the_epoch_is_kept_and_found_in_one_pass() -> None:
    """A retried Spark task sends its whole partition again from sequence 0: every one of its
    requests' places is known, whatever its age."""
    store = MemoryLedgerStore()
    where = [write(store, 1, [Run("a", 3 * k, 3)]) + 1 for k in range(3 * SPANS)]
    t = folded(store)
    a = t.lookup("a")
    assert a is not None and t.span_count == a.span_count == 3 * SPANS and list(t.long) == ["a"]
    expect = [where[k] + j for k in range(3 * SPANS) for j in range(3)]
    assert a.indexes(0, len(expect)) == expect
    assert a.indexes(4, 5) == expect[4:9] and a.index_of(9 * SPANS - 1) == expect[-1]
    assert a.indexes(9 * SPANS - 1, 3) == [expect[-1], -1, -1]  # past the last: not kept
    d = t.decide(a, "a", 0, len(expect) + 2)
    assert (d.duplicates, d.indexes, d.wait_index) == (len(expect), expect, expect[-1])


def test_over_the_span_budget_the_least_recently_used_are_trimmed_alike_everywhere() -> None:
    """Beyond max_spans the least recently used producer keeps its epoch's first span and its
    SPANS most recent: the same spans on every member (folded in other chunks: the same
    table), and a duplicate whose place went is refused (438), not answered."""
    store = MemoryLedgerStore()
    budget = 2 * (SPANS + 5)
    for pid in ("x", "y"):  # SPANS + 5 spans each: the budget, full
        for k in range(SPANS + 5):
            write(store, 1, [Run(pid, k, 1)])
    write(store, 1, [Run("x", SPANS + 5, 1)])  # x again: one over, and y is now the least recent
    t = folded(store, ProducerTable(DAY, 1000, max_spans=budget))
    x, y = t.lookup("x"), t.lookup("y")
    assert x is not None and y is not None
    assert (x.span_count, y.span_count, t.span_count) == (SPANS + 6, SPANS + 1, 2 * SPANS + 7)
    assert list(t.long) == ["x"]
    assert y.index_of(0) >= 0 and y.index_of(3) == -1 and y.index_of(SPANS + 4) >= 0
    assert x.index_of(3) >= 0
    for step in (1, 2, 5, 7):  # other commit points: the same trims at the same log positions
        again = ProducerTable(DAY, 1000, max_spans=budget)
        for upto in range(0, store.end_index + 1, step):
            again.fold(store, upto)
        assert folded(store, again).encode() == t.encode() and again.span_count == t.span_count
    with pytest.raises(DLedgerError) as e:
        t.decide(y, "y", 3, 1)
    assert e.value.code == ResponseCode.DUPLICATE_UNVERIFIABLE and "sequence 3 of producer 'y'" in e.value.message
    assert t.decide(y, "y", 0, 1).indexes == [y.index_of(0)]  # the epoch's first stays comparable
    assert t.decide(x, "x", 3, 1).indexes == [x.index_of(3)]
    copy = ProducerTable(DAY, 1000, max_spans=budget)
    copy.load(t.encode())
    assert copy.encode() == t.encode() and copy.span_count == t.span_count and list(copy.long) == ["x"]


def test_the_span_count_follows_adds_epochs_and_evictions() -> None:
    store = MemoryLedgerStore()
    for k in range(SPANS + 3):
        write(store, 1, [Run("a", k, 1)])
    write(store, 1, [Run("b", 0, 1)])
    t = folded(store, ProducerTable(DAY, max_producers=2))
    assert t.span_count == SPANS + 4 and list(t.long) == ["a"]
    write(store, 1, [Run("a", 0, 1, epoch=1)])  # a new epoch: its old spans go
    folded(store, t)
    assert t.span_count == 2 and not t.long
    write(store, 1, [Run("c", 0, 1)])  # evicts b
    folded(store, t)
    assert t.span_count == 2 == sum(p.span_count for p in t.producers.values())


def test_the_leaders_plan_holds_only_what_is_not_folded() -> None:
    """The leader's overlay copies only the spans its committed table does not hold (a long
    epoch is not copied at every write); a duplicate's place comes from either."""
    store = MemoryLedgerStore()
    where = [write(store, 1, [Run("a", k, 1)]) + 1 for k in range(50)]
    t = folded(store)
    a = t.lookup("a")
    assert a is not None
    plan = a.copy(t.folded)
    assert plan.span_count == 1 and (plan.last_seq, plan.last_index) == (49, where[-1])
    plan.add(50, store.end_index + 2, 1, 1000)
    t.note_own([("a", plan)])
    d = t.decide(t.lookup("a"), "a", 3, 49)
    assert d.duplicates == 48 and d.indexes == [*where[3:], store.end_index + 2]
    assert len(a.copy().spans) == len(a.spans)  # a whole copy by default


def test_the_table_with_owners_round_trips_and_old_snapshots_still_load() -> None:
    store = MemoryLedgerStore()
    write(store, 1, [Run("a", 0, 2, owner="alice"), Run("b", 0, 1)])
    t = folded(store)
    copy = ProducerTable(DAY, 1000)
    copy.load(t.encode())
    assert copy.encode() == t.encode() and copy.lookup("a").owner == "alice"  # type: ignore[union-attr]
    assert copy.owned == {"alice": {"a": None}, "": {"b": None}}
    old = msgspec.msgpack.encode([7, None, [["x", 4, 1000, [0, 3, 5], 2]]])  # before owners
    copy.load(old)
    x = copy.lookup("x")
    assert x is not None and (x.owner, x.epoch, x.last_seq, x.index_of(4)) == ("", 2, 4, 7)


def test_one_owner_at_its_cap_evicts_only_its_own_least_recently_used() -> None:
    store = MemoryLedgerStore()
    write(store, 1, [Run("bob-1", 0, 1, owner="bob")])
    for k in range(5):
        write(store, 1, [Run(f"m-{k}", 0, 1, owner="mallory")])
    write(store, 1, [Run("m-1", 1, 1, owner="mallory")])  # used again: m-2 is now its least recent
    write(store, 1, [Run("m-5", 0, 1, owner="mallory")])
    t = folded(store, ProducerTable(DAY, 1000, max_per_owner=3))
    assert [p for p in t.producers] == ["bob-1", "m-4", "m-1", "m-5"]
    assert list(t.owned["mallory"]) == ["m-4", "m-1", "m-5"]
    # the same table folded in other chunks (another member's commit points) evicts the same
    again = ProducerTable(DAY, 1000, max_per_owner=3)
    for hi in range(0, store.end_index + 1, 3):
        again.fold(store, hi)
    folded(store, again)
    assert again.encode() == t.encode()


def test_beyond_the_global_cap_the_biggest_holder_loses_its_own() -> None:
    """A principal creating producers beyond max_producers evicted the least recently used of
    everyone (a victim's id could then be taken by the attacker): now the owner holding the
    most gives up its least recently used, on every member alike."""
    store = MemoryLedgerStore()
    write(store, 1, [Run("bob-1", 0, 1, owner="bob")], ts=1_000)  # the oldest of all
    for k in range(6):
        write(store, 1, [Run(f"m-{k}", 0, 1, owner="mallory")], ts=1_001 + k)
    t = folded(store, ProducerTable(DAY, max_producers=4))
    assert list(t.producers) == ["bob-1", "m-3", "m-4", "m-5"]
    with pytest.raises(DLedgerError) as e:  # and bob's id stays bob's
        t.decide(t.lookup("bob-1"), "bob-1", 1, 1, 0, "mallory")
    assert e.value.code == ResponseCode.PRODUCER_NOT_OWNED


def test_with_the_table_full_a_flooder_evicts_its_own() -> None:
    """The biggest holder lost its own to anyone's creations: a victim with more producers than
    the flooder was squeezed down to parity. Now a creator that holds some evicts its own."""
    store = MemoryLedgerStore()
    for k in range(3):
        write(store, 1, [Run(f"v-{k}", 0, 1, owner="victim")], ts=1_000 + k)
    for k in range(5):
        write(store, 1, [Run(f"m-{k}", 0, 1, owner="mallory")], ts=2_000 + k)
    write(store, 1, [Run("v-0", 1, 1, owner="victim")], ts=3_000)  # a marker after the last creation
    t = folded(store, ProducerTable(DAY, max_producers=4))
    assert sorted(t.owned["victim"]) == ["v-0", "v-1", "v-2"]  # mallory's first took one place, then its own
    assert list(t.owned["mallory"]) == ["m-4"]


def test_creations_are_bounded_per_principal_by_a_token_bucket() -> None:
    lim = CreationLimiter(per_second=2, burst=4)
    lim.check("mallory", 4, 0)
    lim.spend("mallory", 4, 0)
    with pytest.raises(DLedgerError) as e:
        lim.check("mallory", 1, 100)
    assert e.value.code == ResponseCode.PRODUCER_RATE_LIMITED
    lim.check("alice", 4, 100)  # another principal's bucket is full
    lim.check("mallory", 1, 500)  # one more after half a second
    with pytest.raises(DLedgerError):
        lim.check("mallory", 2, 500)


class _Leader:
    """A one-member group's Node, driven by hand: appends by principal, reads."""

    def __init__(self, **cfg: Any) -> None:
        self.cfg = DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1", store_type="memory", **cfg)
        self.store = MemoryLedgerStore()
        self.now = 0
        self.node = Node(self.cfg, self.store, 0, random.Random(1))
        self.answers: dict[int, Any] = {}
        self._tokens = itertools.count()
        while not (self.node.member.is_leader and self.store.committed_index >= 0):
            self.tick(50)

    def tick(self, ms: int) -> None:
        self.now += ms
        self.node.tick(self.now)
        self._drain()

    def _drain(self) -> None:
        for a in self.node.drain():
            if isinstance(a, Reply):
                self.answers[a.token] = a.msg

    def ask(self, code: int, msg: Any, principal: str = "") -> Any:
        token = next(self._tokens)
        self.node.handle(code, msg, b"", token, self.now, principal=principal)
        self._drain()
        self._drain()
        return self.answers.pop(token)

    def append(self, bodies: list[bytes], producer: str, seq: int, principal: str = "",
               epoch: int = 0) -> AppendResponse:
        r = self.ask(RequestCode.APPEND, AppendRequest("g", "", "", bodies, producer=producer, sequence=seq,
                                                       epoch=epoch), principal)
        assert isinstance(r, AppendResponse)
        return r

    def several(self, appends: list[tuple[list[bytes], str, int]], principal: str = "") -> list[AppendResponse]:
        """Appends taken in one drain (one store write)."""
        tokens = []
        for bodies, producer, seq in appends:
            tokens.append(next(self._tokens))
            self.node.handle(RequestCode.APPEND, AppendRequest("g", "", "", bodies, producer=producer, sequence=seq),
                             b"", tokens[-1], self.now, principal=principal)
        self._drain()
        self._drain()
        return [self.answers.pop(t) for t in tokens]


def test_the_leader_refuses_another_principals_producer_before_writing() -> None:
    g = _Leader()
    first = g.append([b"a0", b"a1"], "orders", 0, principal="alice")
    assert first.code == ResponseCode.SUCCESS
    end = g.store.end_index
    for seq in (0, 2):  # the victim's duplicate, or its next sequence
        r = g.append([b"forged"], "orders", seq, principal="bob")
        assert r.code == ResponseCode.PRODUCER_NOT_OWNED, r
    assert g.store.end_index == end
    assert g.append([b"a1", b"a2"], "orders", 1, principal="alice").duplicates == 1
    assert g.append([b"b0"], "bobs", 0, principal="bob").code == ResponseCode.SUCCESS
    anonymous = folded(g.store).lookup("orders")  # the owner is in the log: a new leader knows it
    assert anonymous is not None and anonymous.owner == "alice"


def test_a_duplicate_with_another_body_is_refused_not_answered() -> None:
    """The redeploy of issue 26: a second process under the same id, from sequence 0, got the
    first one's indexes for B1..B3 and only B4 was stored."""
    g = _Leader()
    original = g.append([b"A1", b"A2", b"A3"], "svc", 0)
    end = g.store.end_index
    r = g.append([b"B1", b"B2", b"B3", b"B4"], "svc", 0)
    assert r.code == ResponseCode.SEQUENCE_REUSED and "sequence 0 of producer 'svc'" in r.message
    assert g.store.end_index == end
    again = g.append([b"A1", b"A2", b"A3", b"A4"], "svc", 0)  # a real retry, one body more
    assert again.code == ResponseCode.SUCCESS and again.duplicates == 3
    assert again.indexes[:3] == [original.index + k for k in range(3)] and again.indexes[3] > end


def test_a_reused_id_is_found_at_sequence_0_after_many_requests() -> None:
    g = _Leader()
    for k in range(SPANS + 5):
        assert g.append([f"A{k}".encode()], "svc", k).code == ResponseCode.SUCCESS
    assert g.append([b"B0"], "svc", 0).code == ResponseCode.SEQUENCE_REUSED
    assert g.append([b"A0"], "svc", 0).duplicates == 1


def test_an_old_duplicate_is_compared_with_the_stored_entry() -> None:
    """Issue 26: after 40 requests, sequence 5 sent again with another body was answered 200
    with index -1 (older than the 32 spans kept). Every span of the epoch is kept now."""
    g = _Leader()
    at = [g.append([f"A{k}".encode()], "svc", k).index for k in range(45)]
    end = g.store.end_index
    r = g.append([b"other"], "svc", 5)
    assert r.code == ResponseCode.SEQUENCE_REUSED and "sequence 5 of producer 'svc'" in r.message, r
    same = g.append([b"A5"], "svc", 5)
    assert same.code == ResponseCode.SUCCESS and (same.duplicates, same.indexes) == (1, [at[5]])
    whole = g.append([f"A{k}".encode() for k in range(46)], "svc", 0)  # a retried task: all again, one new
    assert whole.code == ResponseCode.SUCCESS and whole.duplicates == 45
    assert whole.indexes[:45] == at and whole.indexes[45] > end


def test_an_old_duplicate_beside_new_bodies_in_one_write_is_found() -> None:
    """The leader's plan holds only what is not folded yet: a duplicate the same write plans
    around is found in the committed table."""
    g = _Leader()
    at = [g.append([f"A{k}".encode()], "svc", k).index for k in range(40)]
    new, old, reused = g.several([([b"A40"], "svc", 40), ([b"A5"], "svc", 5), ([b"B6"], "svc", 6)])
    assert new.code == ResponseCode.SUCCESS and new.index > at[-1]
    assert old.code == ResponseCode.SUCCESS and old.indexes == [at[5]]
    assert reused.code == ResponseCode.SEQUENCE_REUSED


def test_over_a_tiny_span_budget_an_old_duplicate_is_refused_not_answered() -> None:
    g = _Leader(max_producer_spans=SPANS + 10)
    at = [g.append([f"A{k}".encode()], "old", k).index for k in range(SPANS + 10)]
    assert g.append([b"n0"], "new", 0).code == ResponseCode.SUCCESS  # over the budget: "old" is trimmed
    end = g.store.end_index
    r = g.append([b"A5"], "old", 5)
    assert r.code == ResponseCode.DUPLICATE_UNVERIFIABLE and "max_producer_spans" in r.message, r
    assert g.store.end_index == end
    assert g.append([b"A0"], "old", 0).indexes == [at[0]]  # the epoch's first span stays
    assert g.append([f"A{SPANS + 9}".encode()], "old", SPANS + 9).indexes == [at[-1]]  # and the recent ones


def test_a_duplicate_below_the_log_begin_is_refused_not_answered() -> None:
    """Retention deleted the entry: its body cannot be compared, so it is not answered."""
    g = _Leader()
    at = [g.append([f"A{k}".encode()], "svc", k).index for k in range(4)]
    g.store.drop_prefix(at[2])
    r = g.append([b"A1", b"A2"], "svc", 1)
    assert r.code == ResponseCode.DUPLICATE_UNVERIFIABLE and f"its entry {at[1]}" in r.message, r
    assert g.append([b"A2", b"A3", b"A4"], "svc", 2).indexes[:2] == at[2:]


def test_the_span_budget_is_a_positive_setting() -> None:
    with pytest.raises(ConfigError, match="max_producer_spans"):
        DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1", max_producer_spans=0)
    assert DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1").max_producer_spans == 1_000_000


def test_a_duplicate_within_one_write_is_compared_with_the_planned_body() -> None:
    """Two requests of one producer in one drain: the second's duplicate is not in the store
    yet, it is compared with the body the first is writing."""
    g = _Leader()
    ok, reused = g.several([([b"x0"], "p", 0), ([b"y0"], "p", 0)])
    assert ok.code == ResponseCode.SUCCESS and reused.code == ResponseCode.SEQUENCE_REUSED
    ok, dup = g.several([([b"x1"], "p", 1), ([b"x1", b"x2"], "p", 1)])
    assert ok.code == ResponseCode.SUCCESS and dup.duplicates == 1 and dup.indexes[0] == ok.index


def test_producer_creation_is_rate_limited_per_principal() -> None:
    g = _Leader(producer_creations_per_second=1)  # bursts of 10
    for k in range(10):
        assert g.append([b"m"], f"m-{k}", 0, principal="mallory").code == ResponseCode.SUCCESS
    end = g.store.end_index
    r = g.append([b"m"], "m-10", 0, principal="mallory")
    assert r.code == ResponseCode.PRODUCER_RATE_LIMITED and g.store.end_index == end
    assert g.append([b"m"], "m-0", 1, principal="mallory").code == ResponseCode.SUCCESS  # not a creation
    assert g.append([b"a"], "alice-0", 0, principal="alice").code == ResponseCode.SUCCESS
    g.tick(1000)
    assert g.append([b"m"], "m-10", 0, principal="mallory").code == ResponseCode.SUCCESS


def test_session_markers_are_never_returned_to_readers() -> None:
    g = _Leader()
    r = g.append([b"x", b"y"], "secret-producer", 0)
    marker = r.index - 1
    assert g.store.get(marker).magic == MAGIC_SESSION
    for local in (False, True):
        read = g.ask(RequestCode.READ, ReadRequest("g", "", "", 0, 100, 1 << 20, False, local, "leader"))
        assert isinstance(read, EntriesResponse) and read.code == ResponseCode.SUCCESS
        assert [e.body for e in read.entries if e.magic != MAGIC_NOOP] == [b"x", b"y"]
        assert all(e.magic != MAGIC_SESSION for e in read.entries)
        assert read.next_index == g.store.end_index + 1
        got = g.ask(RequestCode.GET, GetRequest("g", "", "", marker, local, "leader"))
        assert got.code == ResponseCode.INDEX_OUT_OF_RANGE and not got.entries
    only_marker = g.ask(RequestCode.READ, ReadRequest("g", "", "", marker, 1, 1 << 20, False, False, "leader"))
    assert [e.body for e in only_marker.entries] == [b"x"] and only_marker.next_index == marker + 2  # past it


def test_a_table_folded_short_of_the_log_begin_refuses_what_it_cannot_know() -> None:
    """A snapshot whose table was folded short of its label (written by an older version): the
    installing member's log begins after markers its table never folded. A producer it knows
    may have appended there, so an append past what it knows is refused as unverifiable, not
    stored again as new; once the log shows the producer again, the table knows it again."""
    store = MemoryLedgerStore()
    m = write(store, 1, [Run("a", 0, 2)])
    t = folded(store)
    saved = t.encode()  # folded through m + 2
    write(store, 1, [Run("a", 2, 2)])  # the stretch the table never folds
    last = store.end_index
    follower = MemoryLedgerStore()
    follower.reset(last + 1, 1, store.chain_at(last), 0)  # installed: the log begins after it
    table = ProducerTable(DAY, 1000)
    table.load(saved)
    folded(follower, table)
    a = table.lookup("a")
    assert a is not None and a.gap
    assert table.decide(a, "a", 0, 2).indexes == [m + 1, m + 2]  # what it knows still answers
    for first, n in ((2, 1), (1, 2), (4, 1)):
        with pytest.raises(DLedgerError) as ei:
            table.decide(a, "a", first, n)
        assert ei.value.code == ResponseCode.DUPLICATE_UNVERIFIABLE, (first, n, ei.value)
    assert table.decide(a, "a", 0, 1, epoch=1).duplicates == 0  # a new epoch is new
    copy = ProducerTable(DAY, 1000)
    copy.load(table.encode())
    assert copy.lookup("a").gap  # type: ignore[union-attr]
    m2 = write(follower, 1, [Run("a", 4, 1)])  # the producer appends again (a full table decided it)
    folded(follower, table)
    a = table.lookup("a")
    assert a is not None and not a.gap and a.last_seq == 4 and a.index_of(4) == m2 + 1
    assert table.decide(a, "a", 5, 1).duplicates == 0
    with pytest.raises(DLedgerError) as ei:
        table.decide(a, "a", 2, 1)  # in the stretch never folded: not comparable
    assert ei.value.code == ResponseCode.DUPLICATE_UNVERIFIABLE
