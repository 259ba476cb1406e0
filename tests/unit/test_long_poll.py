"""LongPolls: long-poll READs wait until their index commits or their wait ends."""

from __future__ import annotations

from dledger.core.long_poll import MAX_PARKED, LongPolls


def test_reads_are_due_in_index_order_and_expire_at_their_deadline() -> None:
    polls = LongPolls()
    answered: list[str] = []
    for start, deadline, name in [(5, 100, "a"), (3, 50, "b"), (9, 200, "c")]:
        assert polls.park(start, deadline, False, lambda n=name: answered.append(n), name)  # type: ignore[misc]
    assert [r.token for r in polls.due(4)] == ["b"]
    assert polls.expired(99) == []
    assert [r.token for r in polls.expired(100)] == ["a"]
    assert len(polls) == 1
    assert [r.token for r in polls.take_leader_reads()] == ["c"] and len(polls) == 0


def test_a_full_table_refuses_to_park() -> None:
    polls = LongPolls()
    for k in range(MAX_PARKED):
        assert polls.park(k, 10, True, lambda: None, k)
    assert not polls.park(0, 10, True, lambda: None, "late")
    assert polls.take_leader_reads() == [] and len(polls) == MAX_PARKED  # local reads stay
