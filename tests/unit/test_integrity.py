"""Integrity (core.integrity) on its own: a store and the time, no Node."""

from __future__ import annotations

from dledger.core.integrity import SCRUB_BUSY_EVERY, SCRUB_PAUSE_MS, Integrity
from dledger.entry import MAGIC_NORMAL
from dledger.store.memory import MemoryLedgerStore


def _store(n: int) -> MemoryLedgerStore:
    s = MemoryLedgerStore()
    for k in range(n):
        s.append_as_leader([b"x%d" % k], 1, MAGIC_NORMAL)
    s.set_committed(n - 1)
    return s


def test_only_the_first_corrupt_record_is_news() -> None:
    i = Integrity(_store(10), "g", "n0", 0)
    assert i.mark(5, "bad")
    assert not i.mark(7, "later")  # after the known one: nothing changes
    assert i.mark(3, "earlier") and i.corrupt == (3, "earlier")
    assert i.corruptions_found == 2


def test_a_record_below_what_the_leader_holds_is_beyond_repair() -> None:
    i = Integrity(_store(10), "g", "n0", 0)
    i.mark(2, "bad")
    i.beyond_repair(4)
    assert i.corrupt is None and i.is_beyond_repair(3)
    assert not i.mark(3, "again")
    i.forget_beyond_repair()  # a new leader may hold it still
    assert i.mark(3, "again")


def test_a_truncate_past_the_corrupt_record_clears_it() -> None:
    i = Integrity(_store(10), "g", "n0", 0)
    i.mark(8, "bad")
    i.forget_above(8)
    assert i.corrupt is not None
    i.forget_above(7)
    assert i.corrupt is None


def test_a_repair_clears_the_mark_once_the_record_verifies() -> None:
    i = Integrity(_store(10), "g", "n0", 0)
    i.mark(4, "bad")  # (the store's copy is good: the repair finds it verifying)
    i.repaired(3, 6, [4], now=100)
    assert i.corrupt is None and i.records_repaired == 1 and i.scrub_next == 7


def test_the_scrub_verifies_idle_logs_and_pauses_after_a_pass() -> None:
    i = Integrity(_store(5), "g", "n0", 0)
    assert i.scrub(now=0) == []
    assert i.scrub_next == 0  # the pass reached the commit index: from the begin, after a pause
    i.scrub_next = 3
    assert i.scrub(now=SCRUB_PAUSE_MS - 1) == []
    assert i.scrub_next == 3


def test_a_busy_member_scrubs_one_record_now_and_then() -> None:
    i = Integrity(_store(50), "g", "n0", 0)
    for _ in range(SCRUB_BUSY_EVERY - 1):
        i.active = True
        i.scrub(now=0)
        assert i.scrub_next == 0
    i.active = True
    i.scrub(now=0)
    assert i.scrub_next == 1
