"""Data faults on real member processes (issue 11).

- A flipped body byte in a committed record: the member holding it never serves it, says
  so (`store_error` in its metadata, the `problem` column of `dledger status`), does not
  lead, and gets the record back from the leader's copy (its data file holds the good
  bytes again). Reads through the group return the right body all along.
- A follower whose store is wiped while the group is idle catches up without any append.

Every wait polls a condition up to a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.entry import HEADER_SIZE
from dledger.store import FileLedgerStore
from integration.harness import Cluster, MakeCluster, read_all, wait_until
from integration.test_bench_metrics import scrape, value

pytestmark = pytest.mark.integration

DATA_FILE_SIZE = 1 << 30  # the CLI's default (the harness starts members with it)


def data_file_offset(store_dir: Path, pos: int) -> tuple[Path, int]:
    """The data file holding log position `pos`, and the offset in it (store/file.py layout:
    `data/` files named by their 20-digit start position)."""
    start = pos - pos % DATA_FILE_SIZE
    return store_dir / "data" / f"{start:020d}", pos - start


def flip_byte(path: Path, offset: int) -> int:
    """Flip a byte of the file in place (bit rot), as the page cache sees it: a running member
    reading through its mapping sees the damage. Returns the original byte."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, offset)[0]
        os.pwrite(fd, bytes([old ^ 0x5A]), offset)
        os.fsync(fd)
        return old
    finally:
        os.close(fd)


def byte_at(path: Path, offset: int) -> int:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(1)[0]


def positions(store_dir: Path, indexes: list[int]) -> dict[int, int]:
    """Log positions of entries, read from a stopped member's store (positions are the same on
    every member: followers store the leader's records verbatim)."""
    store = FileLedgerStore(store_dir)
    try:
        return {i: store.get(i).pos for i in indexes}
    finally:
        store.close()


def store_error(c: Cluster, member: str) -> str | None:
    m = c.meta(member)
    return None if m is None else m.store_error


def metric(c: Cluster, member: str, name: str) -> float:
    return value(scrape(c, member), name, group=c.group, member=member)


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_corrupt_committed_record_is_never_served_and_is_repaired(make_cluster: MakeCluster, flush: str) -> None:
    c = make_cluster(3, flush=flush, metrics=True)
    client = c.client(timeout=30)
    bodies = {client.append(f"entry-{k}-".encode() * 20).index: f"entry-{k}-".encode() * 20 for k in range(30)}
    end = c.wait_caught_up()
    leader = c.wait_leader()
    x = next(m for m in c.ids if m != leader)
    first, second = sorted(bodies)[10], sorted(bodies)[20]

    # --- x's record rots while the group is down; x comes back alone ---------------------------
    for m in c.ids:
        c.kill(m, signal.SIGTERM)
    pos = positions(c.store_dir(x), [first, second])
    path, off = data_file_offset(c.store_dir(x), pos[first] + HEADER_SIZE + 7)
    good = flip_byte(path, off)
    c.restart(x)
    # found by its scrub (or the read below): it says so, and never serves the damaged record
    wait_until(lambda: f"corrupt record at index {first}" in (store_error(c, x) or ""), 60,
               f"{x} reports its corrupt record {first}")
    with pytest.raises(DLedgerError) as e:
        client.get(first, member=x)
    assert e.value.code == ResponseCode.DISK_ERROR
    assert client.get(first - 1, member=x).body == bodies[first - 1]  # the rest is served
    assert metric(c, x, "dledger_store_corrupt") == 1
    assert metric(c, x, "dledger_store_corrupt_index") == first

    # --- the others come back: a healthy member leads, reads are right, x is repaired ----------
    for m in c.ids:
        if m != x:
            c.restart(m)
    lead = c.wait_leader(timeout=60)
    assert lead != x, f"{x} leads with a corrupt record"
    assert client.get(first).body == bodies[first]
    wait_until(lambda: byte_at(path, off) == good, 60, f"{x}'s data file holds the good byte again")
    wait_until(lambda: store_error(c, x) == "", 60, f"{x}'s store_error clears")
    assert client.get(first, member=x).body == bodies[first]
    c.wait_caught_up(timeout=60)

    # --- x leads; a record rots under it: it hands leadership over, the read succeeds -------
    c.ctl.transfer_leadership(x)
    assert c.wait_leader(timeout=60) == x
    path2, off2 = data_file_offset(c.store_dir(x), pos[second] + HEADER_SIZE + 3)
    good2 = flip_byte(path2, off2)
    assert client.get(second).body == bodies[second]  # retried at the member that leads next
    wait_until(lambda: c.agreed_leader() not in (None, x), 60, f"leadership leaves {x}")
    wait_until(lambda: byte_at(path2, off2) == good2, 60, f"{x}'s second record repaired")
    wait_until(lambda: store_error(c, x) == "", 60, f"{x}'s store_error clears again")
    assert c.wait_caught_up(timeout=60) > end
    log = read_all(client)
    assert {i: log[i][1] for i in bodies} == bodies
    assert read_all(client, member=x) == log
    assert metric(c, x, "dledger_store_corrupt") == 0
    assert metric(c, x, "dledger_records_repaired_total") >= 1  # (the first repair was before x restarted)


def test_a_corrupt_leader_hands_over_when_a_wiped_follower_catches_up_from_it(make_cluster: MakeCluster) -> None:
    """The issue's report: a follower wiped and catching up from a leader holding a flipped
    byte was stuck for ever (its handler rejected the whole batch every 50 ms, naming "offset
    0", and the leader logged nothing). Now the leader finds its copy damaged (through the
    follower's answer, a read or its scrub), hands leadership to the healthy follower, and
    both damaged members end up with the good record."""
    c = make_cluster(3)
    client = c.client(timeout=30)
    bodies = {client.append(f"rot-{k}-".encode() * 30).index: f"rot-{k}-".encode() * 30 for k in range(30)}
    c.wait_caught_up()
    leader = c.wait_leader()
    y, z = (m for m in c.ids if m != leader)
    bad = sorted(bodies)[12]
    c.kill(y, signal.SIGTERM)
    pos = positions(c.store_dir(y), [bad])[bad]
    path, off = data_file_offset(c.store_dir(leader), pos + HEADER_SIZE + 11)
    good = flip_byte(path, off)  # under the running leader
    shutil.rmtree(c.store_dir(y))
    c.restart(y)
    wait_until(lambda: c.agreed_leader() == z, 60, f"leadership moves to the healthy {z}")
    end = c.wait_caught_up(timeout=60)
    wait_until(lambda: byte_at(path, off) == good, 60, f"{leader}'s record {bad} repaired")
    wait_until(lambda: store_error(c, leader) == "", 60, f"{leader}'s store_error clears")
    log = read_all(client)
    assert {i: log[i][1] for i in bodies} == bodies
    for m in c.ids:
        assert read_all(client, member=m) == log, m
    assert c.meta(y) is not None and c.meta(y).ledger_end_index == end  # type: ignore[union-attr]


def test_a_wiped_follower_catches_up_while_the_group_is_idle(make_cluster: MakeCluster) -> None:
    """It stayed empty until the next append, while the leader still counted it as matched."""
    c = make_cluster(3)
    client = c.client()
    for k in range(20):
        client.append(f"idle-{k}".encode())
    end = c.wait_caught_up()
    before = c.leader_meta()
    x = next(m for m in c.ids if m != before.self_id)
    c.kill(x, signal.SIGTERM)
    shutil.rmtree(c.store_dir(x))
    c.restart(x)

    def caught_up() -> bool:
        m = c.meta(x)
        return m is not None and m.ledger_end_index == end and m.committed_index == end

    wait_until(caught_up, 60, f"wiped {x} catches up to {end} with no new append")
    after = c.leader_meta()
    # no append, no election happened meanwhile: the catch-up came from the idle leader
    assert (after.self_id, after.term, after.ledger_end_index) == (before.self_id, before.term, end)
    assert read_all(client, member=x) == read_all(client)


def test_a_member_whose_last_durable_record_rotted_starts_and_is_repaired(make_cluster: MakeCluster) -> None:
    """A rotten record at the checkpoint's trusted point made recovery refuse the store: the
    member could never start again until wiped. Now it starts, reports the record, does not
    lead, and gets it back from the leader (here a header field: only its index unit as
    written still says where the record ends)."""
    c = make_cluster(3)
    client = c.client(timeout=30)
    for k in range(20):
        client.append(f"last-{k}-".encode() * 10)
    end = c.wait_caught_up()
    leader = c.wait_leader()
    x = next(m for m in c.ids if m != leader)
    c.kill(x, signal.SIGTERM)  # a clean stop: its last record is the trusted point
    pos = positions(c.store_dir(x), [end])[end]
    path, off = data_file_offset(c.store_dir(x), pos + 8)  # the header's index field
    good = flip_byte(path, off)
    # no leader reaches it until it was seen reporting the record (a repair within the first poll
    # hid the report: members reconnect within half a second now). Every other member drops it:
    # on a loaded machine the other one may be elected meanwhile, and it repaired x at once
    others = [m for m in c.ids if m != x]
    for m in others:
        c.ctl.inject_faults(m, [x])
    c.restart(x)
    wait_until(lambda: f"corrupt record at index {end}" in (store_error(c, x) or ""), 60,
               f"{x} starts and reports its rotten record {end}")
    for m in others:
        c.ctl.inject_faults(m, [])
    wait_until(lambda: byte_at(path, off) == good, 60, f"{x}'s record {end} repaired from the leader")
    wait_until(lambda: store_error(c, x) == "", 60, f"{x}'s store_error clears")
    client.append(b"after the repair")
    c.wait_caught_up(timeout=60)
    assert read_all(client, member=x) == read_all(client)
