"""Leadership transfer and the preferred leader, on real member processes."""

from __future__ import annotations

import signal

import pytest

from dledger.codes import DLedgerError, ResponseCode

from .harness import MakeCluster, read_all, wait_until

pytestmark = pytest.mark.integration


def test_leadership_transfer(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    old = c.leader_meta()
    cl = c.client(timeout=10.0)
    first = cl.append(b"before-transfer")
    follower = next(m for m in c.ids if m != old.self_id)
    for target in (follower, old.self_id):  # away, and back
        before = c.leader_meta()
        cl.transfer_leadership(target)
        wait_until(lambda: c.agreed_leader() == target, 30, f"{target} leads after the transfer")  # noqa: B023
        after = c.meta(target)
        assert after is not None and after.role == "leader"
        assert after.term > before.term
        r = cl.append(f"after-transfer-to-{target}".encode())
        assert r.term >= after.term
        assert cl.get(r.index).body == f"after-transfer-to-{target}".encode()
    assert cl.get(first.index).body == b"before-transfer"
    c.wait_caught_up()
    # transfer to the current leader is a no-op
    lead = c.leader_meta()
    cl.transfer_leadership(lead.self_id)
    assert c.leader_meta().term == lead.term


def test_transfer_to_cut_off_member_fails(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    lead = c.leader_meta()
    target = next(m for m in c.ids if m != lead.self_id)
    rest = [m for m in c.ids if m != target]
    c.isolate(target)
    cl = c.client(timeout=10.0)
    before = cl.append(b"before-failed-transfer")
    with pytest.raises(DLedgerError) as err:
        cl.transfer_leadership(target)
    # the leader's answer, not the client giving up first (TIMEOUT)
    assert err.value.code == ResponseCode.TAKE_LEADERSHIP_FAILED, err.value
    # the old leader takes appends again, in the same term
    r = cl.append(b"after-failed-transfer")
    assert r.term == lead.term
    assert c.agreed_leader(rest) == lead.self_id
    now = c.meta(lead.self_id)
    assert now is not None and now.role == "leader" and now.term == lead.term

    c.heal()
    c.wait_caught_up(timeout=60)
    assert c.agreed_leader() == lead.self_id
    bodies = {i: b for i, (_, b) in read_all(c.ctl).items()}
    assert bodies == {before.index: b"before-failed-transfer", r.index: b"after-failed-transfer"}


def test_preferred_leader(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, extra=["--preferred-leader", "n2"])
    wait_until(lambda: c.agreed_leader() == "n2", 30, "the preferred member n2 leads")
    cl = c.client(timeout=10.0)
    acked = {r.index: b"p-0" for r in [cl.append(b"p-0")]}

    c.kill("n2", signal.SIGKILL)
    other = c.wait_leader(["n0", "n1"], 30, "a leader while n2 is down")
    assert other != "n2"
    for k, r in enumerate(cl.append_batch([f"p-down-{k}".encode() for k in range(200)])):
        acked[r.index] = f"p-down-{k}".encode()

    c.restart("n2")
    wait_until(lambda: c.agreed_leader() == "n2", 60, "leadership moves back to n2 once it caught up")
    r = cl.append(b"p-back")
    acked[r.index] = b"p-back"
    c.wait_caught_up(timeout=60)
    assert {i: b for i, (_, b) in read_all(c.ctl).items()} == acked
