"""Partitions made with the members' fault hook (`inject_faults`): an isolated leader
steps down, a minority cannot elect, pre-vote keeps an isolated follower from raising
its term, and a deposed leader's uncommitted tail is truncated."""

from __future__ import annotations

import threading

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import Metadata

from .harness import MakeCluster, dump_store, holds_for, read_all, wait_until

pytestmark = pytest.mark.integration


def test_divergent_uncommitted_tail_is_truncated(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    old = c.wait_leader()
    others = [m for m in c.ids if m != old]
    cl = c.client()
    committed = {r.index: f"base-{k}".encode() for k, r in enumerate(cl.append_batch(
        [f"base-{k}".encode() for k in range(20)]))}
    before = c.wait_caught_up()

    c.isolate(old)
    # appends sent to the isolated leader alone: it stores them, but can never commit them
    stale_client = c.client(c.peer_entry(old), timeout=3.0)
    outcomes: list[tuple[str, list[bytes]]] = []

    def append_stale(k: int) -> None:
        bodies = [f"stale-{k}-{j}".encode() for j in range(5)]
        try:
            stale_client.append_batch(bodies)
            outcomes.append(("acknowledged", bodies))
        except DLedgerError as e:
            outcomes.append((e.code.name, bodies))

    threads = [threading.Thread(target=append_stale, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: (m := c.meta(old)) is not None and m.ledger_end_index > before, 15,
                   "the isolated leader stores the stale appends")
        new = c.wait_leader(others, 30, "a leader on the majority side")
        assert new != old
        maj = c.client(c.peers_of(others))
        for k, r in enumerate(maj.append_batch([f"fresh-{k}".encode() for k in range(10)])):
            committed[r.index] = f"fresh-{k}".encode()

        def stepped_down() -> Metadata | None:
            m = c.meta(old)
            return m if m is not None and m.role != "leader" else None

        old_view = wait_until(stepped_down, 20, "the isolated leader steps down")
        assert old_view.committed_index <= before
        stale_end = old_view.ledger_end_index
        assert stale_end > before
    finally:
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 3
    assert all(o != "acknowledged" for o, _ in outcomes), outcomes

    c.heal()
    end = c.wait_caught_up(timeout=60)
    assert c.agreed_leader() == new
    log = read_all(c.ctl)
    assert not [b for _, b in log.values() if b.startswith(b"stale-")]
    assert {i: b for i, (_, b) in log.items()} == committed

    c.stop()
    dumps = {m: dump_store(c.store_dir(m)) for m in c.ids}
    assert all(d.end_index == end for d in dumps.values()), {m: d.end_index for m, d in dumps.items()}
    assert dumps[old].entries == dumps[new].entries
    assert not [e for e in dumps[old].entries if e.body.startswith(b"stale-")]
    # the indexes the stale entries had now hold entries of the new leader's term
    assert all(e.term > dumps[old].entries[before].term for e in dumps[old].entries[before + 1:stale_end + 1])


def test_isolated_leader_steps_down_and_alone_cannot_lead(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    old = c.wait_leader()
    others = [m for m in c.ids if m != old]
    c.isolate(old)
    wait_until(lambda: (m := c.meta(old)) is not None and m.role != "leader", 20, "the isolated leader steps down")
    new = c.wait_leader(others, 30, "a leader on the majority side")
    assert new != old
    maj = c.client(c.peers_of(others))
    r = maj.append(b"majority")
    # one member of three, alone, never becomes leader
    holds_for(lambda: (m := c.meta(old)) is not None and m.role != "leader", 3.0, f"{old} alone stays no leader")

    c.heal()
    c.wait_caught_up(timeout=60)
    assert c.agreed_leader() == new
    assert c.ctl.get(r.index).body == b"majority"


def test_minority_of_five_cannot_elect_majority_can(make_cluster: MakeCluster) -> None:
    c = make_cluster(5)
    old = c.wait_leader()
    minority = [old, next(m for m in c.ids if m != old)]
    majority = [m for m in c.ids if m not in minority]
    c.partition(minority, majority)

    new = c.wait_leader(majority, 30, "a leader on the majority side")
    assert new in majority
    wait_until(lambda: all((m := c.meta(x)) is not None and m.role != "leader" for x in minority), 20,
               "the minority's leader steps down")
    holds_for(lambda: all((m := c.meta(x)) is not None and m.role != "leader" for x in minority), 3.0,
              f"no leader in the minority {minority}")
    r = c.client(c.peers_of(majority)).append(b"majority-of-five")
    # a client given only the minority's addresses learns the group's members from them
    # (MEMBERS, docs/clients.md): it fails, or the majority's leader commits its append
    try:
        m = c.client(c.peers_of(minority), timeout=2.0).append(b"minority-client")
    except DLedgerError as e:
        assert e.code in (ResponseCode.NOT_LEADER, ResponseCode.TIMEOUT, ResponseCode.TERM_CHANGED,
                          ResponseCode.WAIT_QUORUM_ACK_TIMEOUT), e
        m = None
    lead = c.meta(new)
    assert lead is not None and (m is None or m.term == lead.term)

    c.heal()
    c.wait_caught_up(timeout=60)
    assert c.agreed_leader() == new
    log = read_all(c.ctl)
    assert c.ctl.get(r.index).body == b"majority-of-five"
    assert m is None or log[m.index] == (m.term, b"minority-client")


def test_isolated_follower_does_not_raise_its_term(make_cluster: MakeCluster) -> None:
    """Pre-vote: a follower cut off from the group campaigns without raising its term,
    so when it comes back the leader is not disturbed."""
    c = make_cluster(3)
    leader = c.wait_leader()
    lead_view = c.meta(leader)
    assert lead_view is not None
    term = lead_view.term
    follower = next(m for m in c.ids if m != leader)
    c.isolate(follower)
    # it notices it lost its leader (and campaigns: pre-vote rounds only)
    wait_until(lambda: (m := c.meta(follower)) is not None and m.leader_id is None, 20,
               f"{follower} loses its leader")
    holds_for(lambda: (m := c.meta(follower)) is not None and m.term == term and m.role != "leader", 3.0,
              f"isolated {follower} stays in term {term}")
    rest = [m for m in c.ids if m != follower]
    assert c.agreed_leader(rest) == leader
    r = c.client(c.peers_of(rest)).append(b"while-isolated")

    c.heal()
    c.wait_caught_up(timeout=60)
    assert c.agreed_leader() == leader
    views = c.views()
    assert all(v is not None and v.term == term for v in views.values()), views
    assert c.ctl.get(r.index).body == b"while-isolated"
