"""A group of real member processes: election, appends through every member, a leader
crash under load, and a follower catching up after a stop."""

from __future__ import annotations

import signal

import pytest

from dledger.runtime.client import AppendResult, DLedgerClient

from .harness import (
    Appender,
    Cluster,
    MakeCluster,
    StoreDump,
    check_acked_in_log,
    dump_store,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration


def stop_and_compare_stores(c: Cluster, end: int) -> dict[str, StoreDump]:
    """Stop the group cleanly and check that every member's log is the same, up to `end`."""
    c.stop()
    for m, p in c.procs.items():
        assert p.returncode == 0, f"{m} exited with code {p.returncode} on SIGTERM"
    dumps = {m: dump_store(c.store_dir(m)) for m in c.ids}
    for m, d in dumps.items():
        assert d.end_index == end, f"{m}: end index {d.end_index}, expected {end}"
        assert d.committed_index == end, f"{m}: committed index {d.committed_index} after a clean stop, expected {end}"
    reference = dumps[c.ids[0]]
    for m, d in dumps.items():
        assert d.last_chain_crc == reference.last_chain_crc, f"{m}: chain CRC at the end differs from {c.ids[0]}"
        assert d.entries == reference.entries, f"{m}: log differs from {c.ids[0]}'s"
    return dumps


def log_of(d: StoreDump) -> dict[int, tuple[int, bytes]]:
    return {e.index: (e.term, e.body) for e in d.entries}


@pytest.mark.parametrize("n", [3, 5])
def test_leader_elected_and_appends_through_every_member(make_cluster: MakeCluster, n: int) -> None:
    c = make_cluster(n)
    leader = c.wait_leader()
    views = c.views()
    roles = sorted(v.role for v in views.values() if v is not None)
    assert roles == sorted(["leader"] + ["follower"] * (n - 1)), views
    for v in views.values():
        assert v is not None and v.members == c.ids

    acked: dict[int, bytes] = {}
    for k, m in enumerate(c.ids):
        # a client whose first request goes to m: a follower must redirect it to the leader
        forced = c.client()
        forced._async.leader_id = m
        body = f"via-{m}".encode()
        r = forced.append(body)
        if m != leader:  # the answer came from the leader the follower named
            assert forced.leader_id is not None and forced.leader_id != m
        assert r.index not in acked
        acked[r.index] = body
        # a client given the peers string with m listed first
        rotated = c.client(c.peers_of(c.ids[k:] + c.ids[:k]))
        body = f"rotated-{m}".encode()
        rs = rotated.append_batch([body, body + b"-2"])
        assert [x.index for x in rs] == [rs[0].index, rs[0].index + 1]
        assert rs[0].term == rs[1].term
        assert rs[0].pos < rs[1].pos
        acked[rs[0].index] = body
        acked[rs[1].index] = body + b"-2"
        # read-your-writes across clients: asked through any member first, a read sees the
        # acknowledged entry at once (a follower redirects; its own commit index may lag)
        for j, first in enumerate(c.ids):
            reader = c.client(c.peers_of(c.ids[j:] + c.ids[:j]))
            assert reader.get(rs[1].index).body == body + b"-2", f"get through {first}"
            assert [e.body for e in reader.read(rs[0].index, 2)] == [body, body + b"-2"], f"read through {first}"
            assert reader.metadata().role == "leader", f"metadata through {first} is the leader's view"
            reader.close()

    log = read_all(c.ctl)
    for index, body in acked.items():
        assert log[index][1] == body
        assert c.ctl.get(index).body == body
    assert sorted(b for _, b in log.values()) == sorted(acked.values())
    end = c.wait_caught_up()
    assert end >= max(acked)
    stop_and_compare_stores(c, end)


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_leader_killed_during_appends(make_cluster: MakeCluster, flush: str) -> None:
    c = make_cluster(3, flush=flush)
    old = c.wait_leader()
    old_meta = c.meta(old)
    assert old_meta is not None
    app = Appender(c.peers, c.group, f"kill-{flush}").start()
    try:
        wait_until(lambda: len(app.acked) >= 50, 30, "appends acknowledged before the crash")
        c.kill(old, signal.SIGKILL)
        new = c.wait_leader(c.alive, 30, "a new leader after SIGKILL of the old one")
        assert new != old
        wait_until(lambda: any(a.term > old_meta.term for a in app.acked), 30,
                   "appends acknowledged in a later term")
        c.restart(old)
        # keep appending while the old leader catches up
        n = len(app.acked)
        wait_until(lambda: len(app.acked) >= n + 50, 30, "appends acknowledged after the restart")
    finally:
        app.stop()

    acked = app.acked
    assert len({a.index for a in acked}) == len(acked), "two acknowledgements for one index"
    end = c.wait_caught_up(timeout=60)
    assert end >= max(a.index for a in acked)

    log = read_all(c.ctl)
    check_acked_in_log(acked, log, "read through the client")
    for m in c.ids:  # each member serves what it knows is committed: all of it, once caught up
        assert read_all(c.ctl, member=m) == log, f"{m} serves a different committed log"
    bodies = [b for _, b in log.values()]
    assert len(bodies) == len(set(bodies)), "a body was stored twice"
    assert all(b.startswith(f"kill-{flush}-".encode()) for b in bodies)
    # bodies that failed may or may not be there (outcome unknown), but nothing else is
    sent = {a.body for a in acked} | {b for _, b in app.failed}
    assert set(bodies) <= sent

    dumps = stop_and_compare_stores(c, end)
    for m, d in dumps.items():
        check_acked_in_log(acked, log_of(d), f"store of {m}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopped_follower_catches_up(make_cluster: MakeCluster, sig: signal.Signals) -> None:
    c = make_cluster(3)
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    cl = c.client(timeout=15.0)
    acked = {r.index: b for b, r in zip(*_append(cl, "before", 10), strict=True)}
    c.wait_caught_up()
    stopped_at = c.meta(follower)
    assert stopped_at is not None

    c.kill(follower, sig)
    for k in range(20):
        bodies, results = _append(cl, f"while-down-{k}", 100)
        acked.update((r.index, b) for b, r in zip(bodies, results, strict=True))
    leader_end = c.wait_caught_up([m for m in c.ids if m != follower])
    assert leader_end >= stopped_at.ledger_end_index + 2000

    c.restart(follower)
    end = c.wait_caught_up(timeout=60)
    # live replication to it works too
    bodies, results = _append(cl, "after", 10)
    acked.update((r.index, b) for b, r in zip(bodies, results, strict=True))
    end = c.wait_caught_up(timeout=60)

    log = read_all(c.ctl)
    assert {i: b for i, (_, b) in log.items()} == acked
    assert read_all(c.ctl, member=follower) == log
    dumps = stop_and_compare_stores(c, end)
    assert {e.index: e.body for e in dumps[follower].entries if e.magic == 1} == acked


def _append(cl: DLedgerClient, prefix: str, size: int) -> tuple[list[bytes], list[AppendResult]]:
    """One batch of `size` bodies; checks the per-body results are consecutive."""
    bodies = [f"{prefix}-{k}".encode() for k in range(size)]
    results = cl.append_batch(bodies)
    assert len(results) == size
    assert [r.index for r in results] == list(range(results[0].index, results[0].index + size))
    return bodies, results
