"""LongPolls: long-poll READs wait until their index commits or their wait ends."""

from __future__ import annotations

from dledger.core.long_poll import MAX_PARKED, LongPolls


def test_reads_are_due_in_index_order_and_expire_at_their_deadline() -> None:
    polls = LongPolls()
    for start, deadline, name in [(5, 100, "a"), (3, 50, "b"), (9, 200, "c")]:
        assert polls.park(start, deadline, False, lambda: 0, name)
    due = polls.pop_due(4)
    assert due is not None and due.token == "b" and polls.pop_due(4) is None
    assert polls.expired(99) == []
    assert [r.token for r in polls.expired(100)] == ["a"]
    assert len(polls) == 1
    assert [r.token for r in polls.take_leader_reads()] == ["c"] and len(polls) == 0


def test_a_full_table_refuses_to_park() -> None:
    polls = LongPolls()
    for k in range(MAX_PARKED):
        assert polls.park(k, 10, True, lambda: 0, k)
    assert not polls.park(0, 10, True, lambda: 0, "late")
    assert polls.take_leader_reads() == [] and len(polls) == MAX_PARKED  # local reads stay
