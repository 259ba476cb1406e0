"""A hung member (SIGSTOP: the kernel still accepts its connections, nothing answers)
must not strand clients while a healthy majority serves (issue 10, item 6).

The client suspects a member that does not answer, asks every member at once who
leads, follows the new leader, and sends again only what certainly did not take
effect (or reads); an append that reached the hung member fails with TIMEOUT.
Deadlines here are generous (2 noisy cores); they only have to be shorter than the
hang, during which the old client failed every request."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import AppendResult, DLedgerClient

from .harness import Cluster, MakeCluster, read_all, wait_until

pytestmark = pytest.mark.integration

RECOVER_S = 15.0  # failover plus a client timeout, with room for a slow machine


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def hung(c: Cluster, member: str) -> Iterator[None]:
    """`member` stopped with SIGSTOP for the block, continued whatever happens."""
    p = c.procs[member]
    p.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _state(p.pid) == "T", 10, f"{member} stopped")
        yield
    finally:
        p.send_signal(signal.SIGCONT)


def make_leader(c: Cluster, member: str) -> None:
    """Until `member` leads with every member agreeing (a transfer may be refused while it lags)."""
    def leads() -> bool:
        if c.agreed_leader() != member:
            c.ctl.transfer_leadership(member)
        return c.agreed_leader() == member

    wait_until(leads, 60, f"{member} leads")


def append_until_success(client: DLedgerClient, body: bytes, within: float) -> tuple[AppendResult, list[str]]:
    """Append `body` (a new body per attempt: a failed one may still commit) until one is
    acknowledged; fails the test after `within` seconds. Returns the result and the failures."""
    failures: list[str] = []
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            return client.append(body + f"-{len(failures)}".encode()), failures
        except DLedgerError as e:
            failures.append(e.code.name)
    raise AssertionError(f"no append acknowledged within {within:.0f} s: {failures}")


def test_writer_follows_a_new_leader_while_the_old_one_hangs(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    old = c.wait_leader()
    others = [m for m in c.ids if m != old]
    writer = c.client(timeout=5.0)
    acked = {writer.append(b"before").index: b"before"}
    with hung(c, old):
        r, failures = append_until_success(writer, b"during", RECOVER_S)
        acked[r.index] = b"during-" + str(len(failures)).encode()
        assert writer.leader_id in others, writer.leader_id
        # and it keeps working while the old leader still hangs
        for k in range(20):
            acked[writer.append(f"more-{k}".encode()).index] = f"more-{k}".encode()
    c.wait_caught_up(timeout=60)
    log = read_all(c.ctl)
    assert {i: log[i][1] for i in acked} == acked
    bodies = [b for _, b in log.values()]
    assert len(bodies) == len(set(bodies)), "an append was stored twice"


@pytest.mark.parametrize("first_leads", [True, False], ids=["first-listed-leads", "first-listed-follows"])
def test_fresh_client_when_the_first_listed_member_hangs(make_cluster: MakeCluster, first_leads: bool) -> None:
    c = make_cluster(3)
    first = c.ids[0]
    assert c.peers.startswith(f"{first}-")
    make_leader(c, first if first_leads else c.ids[1])
    with hung(c, first):
        lead = c.wait_leader(c.ids[1:], 30, "a leader among the members still running")
        # one request each, with a timeout the old walk (3 s on the hung member first) could not meet
        fresh = c.client(timeout=5.0)
        r = fresh.append(b"fresh")
        assert fresh.leader_id == lead
        assert c.client(timeout=5.0).get(r.index).body == b"fresh"
        m = c.client(timeout=5.0).metadata()
        assert m.leader_id == lead and m.committed_index >= r.index


def test_append_sent_to_the_hung_leader_times_out_and_is_not_resent(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    old = c.wait_leader()
    writer = c.client(timeout=5.0)
    writer.append(b"before")
    with hung(c, old):
        with pytest.raises(DLedgerError) as err:
            writer.append(b"in-doubt")  # reached the hung leader's socket: outcome unknown
        assert err.value.code == ResponseCode.TIMEOUT, err.value
        r, _ = append_until_success(writer, b"after", RECOVER_S)
        new = writer.leader_id
        assert new is not None and new != old
    c.wait_caught_up(timeout=60)
    bodies = [b for _, b in read_all(c.ctl).values()]
    # the hung leader was deposed before it read the append, so only a resend could commit it
    assert b"in-doubt" not in bodies
    # resumed, the member is used again: leadership moves back and the same client follows
    make_leader(c, old)
    assert writer.append(b"back").index > r.index
    assert writer.leader_id == old


def test_reads_are_retried_on_the_new_leader(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    old = c.wait_leader()
    reader = c.client(timeout=RECOVER_S)
    r = reader.append(b"read-me")
    with hung(c, old):
        # the GET goes to the hung leader first, times out, and is asked again of the new one
        assert reader.get(r.index).body == b"read-me"
        assert reader.leader_id not in (None, old)
        assert [e.body for e in reader.read(r.index, 10)] == [b"read-me"]
        assert reader.metadata().leader_id == reader.leader_id
