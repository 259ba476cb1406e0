"""Progress: what a leader knows of one follower (etcd's Progress), and its two answers: may
leadership be handed to it, and what retention keeps for it."""

from __future__ import annotations

from dledger.core.progress import NEVER, Progress

LEASE = 1000


def _fit(**kw: object) -> Progress:
    p = Progress("n1", match_index=10, last_ack=500, store_full=False)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_a_live_caught_up_follower_with_room_is_fit_to_lead() -> None:
    assert _fit().fit_to_lead(now=1000, lease_ms=LEASE, end_index=10)


def test_a_follower_lacking_part_of_our_log_is_not_fit() -> None:
    assert not _fit(match_index=9).fit_to_lead(1000, LEASE, 10)


def test_a_follower_silent_for_a_lease_is_not_fit() -> None:
    assert not _fit(last_ack=0).fit_to_lead(1000, LEASE, 10)
    assert not _fit(last_ack=NEVER).fit_to_lead(1000, LEASE, 10)


def test_a_follower_whose_disk_is_unknown_is_not_fit() -> None:
    """The strict rule: until a heartbeat answer says it has room, no hand-over."""
    assert not _fit(store_full=None).fit_to_lead(1000, LEASE, 10)
    assert not _fit(store_full=True).fit_to_lead(1000, LEASE, 10)


def test_a_corrupt_or_disk_faulted_follower_is_not_fit() -> None:
    assert not _fit(corrupt=True).fit_to_lead(1000, LEASE, 10)
    assert not _fit(disk_fault=True).fit_to_lead(1000, LEASE, 10)


def test_a_new_leadership_forgets_replication_facts_but_not_the_disk() -> None:
    p = _fit(durable=9, follower_commit=8, disk_fault=True, needs_snapshot=True, installed_through=3,
             repair_index=4)
    p.begin_term()
    assert (p.match_index, p.durable, p.follower_commit, p.last_ack) == (-1, -1, -1, NEVER)
    assert not p.disk_fault and not p.needs_snapshot
    assert (p.installed_through, p.repair_index) == (-1, -1)
    assert p.store_full is False  # what its heartbeat answers said stands until the next one


def test_a_follower_that_lost_its_tail_counts_for_nothing() -> None:
    p = _fit(durable=10)
    p.lost()
    assert p.counted(sync=False) == -1 and p.counted(sync=True) == -1


def test_counted_mark_is_the_match_or_in_sync_mode_the_durable_prefix() -> None:
    p = _fit(durable=7)
    assert (p.counted(sync=False), p.counted(sync=True)) == (10, 7)


def test_retention_keeps_a_plain_logs_follower_fsynced_end() -> None:
    assert _fit(durable=4).retention_hold(-1, plain_log=True, floor=100) == (5, "follower n1")
    assert _fit(durable=4).retention_hold(-1, plain_log=False, floor=100) is None  # it installs a snapshot
    assert _fit(durable=4).retention_hold(-1, plain_log=True, floor=5) is None  # held lower already


def test_retention_keeps_what_follows_a_snapshot_being_installed() -> None:
    held = _fit(durable=50).retention_hold(20, plain_log=True, floor=100)
    assert held is not None and held[0] == 20 and "installing" in held[1]


def test_retention_keeps_a_record_being_repaired() -> None:
    held = _fit(durable=50, repair_index=7).retention_hold(20, plain_log=True, floor=100)
    assert held == (7, "follower n1 (repairing record 7)")


def test_heard_within_counts_from_the_start_of_leadership_until_it_answers() -> None:
    p = Progress("n1")
    assert p.heard_within(now=1500, window_ms=LEASE, since=1000)
    assert not p.heard_within(now=2500, window_ms=LEASE, since=1000)
    p.last_ack = 2000
    assert p.heard_within(now=2500, window_ms=LEASE, since=0)
