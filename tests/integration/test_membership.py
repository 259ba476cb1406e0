"""Membership changes on real member processes (docs/operations.md): every original member
replaced one by one while a writer appends, the leader removed, a learner that catches up by
InstallSnapshot, a removed member left running. Members join with `dledger server --join`;
clients keep the peers string they started with and follow the configuration. Waits poll a
condition up to a generous deadline; nothing is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.local_cluster import local_certs
from dledger.membership import Membership
from dledger.ports import free_ports
from dledger.statemachine.snapshot import SnapshotStore
from integration.harness import (
    Appender,
    Cluster,
    MakeCluster,
    check_acked_in_log,
    holds_for,
    read_all,
    wait_until,
)
from integration.test_install_snapshot import compacting_cluster, fill

pytestmark = pytest.mark.integration


def _peers(members: dict[str, str]) -> str:
    return ";".join(f"{m}-{a}" for m, a in members.items())


def join(c: Cluster, member: str, through: dict[str, str], extra: Sequence[str] = (),
         command: str = "server") -> subprocess.Popen[bytes]:
    """Start `member` with `dledger server --join` (or `controller --join`) through the members
    `through` (id -> address); the test's cluster stops it at teardown like the others."""
    cmd = [sys.executable, "-m", "dledger", command, "--join", _peers(through), "--group", c.group, "--id", member,
           "--store-dir", str(c.store_dir(member)), "--enable-fault-injection", *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    c.procs[member] = p
    c._all_procs.append(p)
    c.ids.append(member)
    return p


def change_when_ready(change: Callable[[], object], wait_on: ResponseCode, taken: ResponseCode | None,
                      timeout: float, what: str) -> None:
    """`change`, asked again while it answers `wait_on`; `taken` means an earlier attempt took
    effect and its answer was lost."""
    def made() -> bool:
        try:
            change()
        except DLedgerError as e:
            if e.code == wait_on:
                return False
            if e.code == taken:
                return True
            raise
        return True

    wait_until(made, timeout, what)


def add_member(c: Cluster, member: str, address: str, members: dict[str, str], extra: Sequence[str] = (),
               command: str = "server") -> None:
    """add-learner (once the previous change is committed: MEMBERSHIP_CHANGE_PENDING until
    then; a leader that took over from a removed one is not ready until its NOOP commits, which
    the client waits out), --join, promote once caught up (LEARNER_BEHIND until then)."""
    change_when_ready(lambda: c.ctl.add_learner(member, address), ResponseCode.MEMBERSHIP_CHANGE_PENDING,
                      ResponseCode.MEMBER_EXISTS, 60, f"{member} added as a learner")
    join(c, member, members, extra, command)
    members[member] = address
    change_when_ready(lambda: c.ctl.promote(member), ResponseCode.LEARNER_BEHIND, None, 120, f"{member} promoted")


def remove_member(c: Cluster, member: str, members: dict[str, str], stop: bool = True) -> None:
    """remove (once the previous change is committed: MEMBERSHIP_CHANGE_PENDING until then)."""
    change_when_ready(lambda: c.ctl.remove_member(member), ResponseCode.MEMBERSHIP_CHANGE_PENDING,
                      ResponseCode.UNKNOWN_MEMBER, 60, f"{member} removed")
    members.pop(member)
    if stop:
        c.kill(member)
        c.ids.remove(member)
    c.down.add(member)


def voters(c: Cluster) -> set[str]:
    return {m.id for m in c.ctl.members().voters}


def test_every_original_member_replaced_one_by_one_while_a_writer_appends(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    members = {m: p.address for m, p in c.ctl.peers.items()}
    writer = Appender(c.peers, c.group, "w").start()  # keeps the original peers string throughout
    for old, new, port in zip(["n0", "n1", "n2"], ["n3", "n4", "n5"], free_ports(3), strict=True):
        before = len(writer.acked)
        add_member(c, new, f"127.0.0.1:{port}", members)
        remove_member(c, old, members)
        assert voters(c) == set(members)
        wait_until(lambda: len(writer.acked) > before + 20, 60, f"the writer goes on after {old} left")  # noqa: B023
    after_all = len(writer.acked)
    wait_until(lambda: len(writer.acked) > after_all + 20, 60, "the writer goes on with none of its members left")
    writer.stop()
    # the admin client followed too, from a leader's committed configuration: the answer to the
    # last removal may come from the member it removed, or from a leader not yet sure of it
    wait_until(lambda: not (voters(c) and set(c.ctl.peers) & {"n0", "n1", "n2"}), 60,
               "the admin client drops the removed members")
    fresh = c.client(_peers(members))
    check_acked_in_log(writer.acked, read_all(fresh), "after replacing every member")
    c.wait_caught_up(list(members), 60)  # a member learns the commit index a heartbeat later
    for m in members:  # each new member holds the whole committed log itself
        check_acked_in_log(writer.acked, read_all(fresh, member=m), f"{m}'s own copy")


def test_removing_the_leader_hands_over_to_a_remaining_voter(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    members = {m: p.address for m, p in c.ctl.peers.items()}
    acked = c.ctl.append(b"before")
    leader = c.wait_leader()
    remove_member(c, leader, members, stop=False)  # it steps down once the change commits
    rest = [m for m in c.ids if m != leader]
    new = c.wait_leader(rest, 60, "a leader among the remaining voters")
    assert new != leader
    assert voters(c) == set(rest)
    after = c.ctl.append(b"after")
    log = read_all(c.client(_peers(members)))
    assert log[acked.index] == (acked.term, b"before") and log[after.index] == (after.term, b"after")
    # the removed leader serves nothing any more
    with pytest.raises(DLedgerError) as e:
        c.client(f"{leader}-{c.peer_entry(leader).split('-', 1)[1]}", timeout=2.0).append(b"stray")
    assert e.value.code == ResponseCode.NOT_A_MEMBER


def test_a_learner_added_after_compaction_catches_up_by_install_snapshot(make_cluster: MakeCluster,
                                                                         tmp_path: Path) -> None:
    c = compacting_cluster(make_cluster, tmp_path)
    fill(c, "a", 400)
    leader = c.wait_leader()
    wait_until(lambda: (v := c.meta(leader)) is not None and v.ledger_begin_index > 100, 60,
               "the leader compacted its log")
    members = {m: p.address for m, p in c.ctl.peers.items()}
    (port,) = free_ports(1)
    toml = tmp_path / "small-files.toml"
    c.ctl.add_learner("n3", f"127.0.0.1:{port}")
    join(c, "n3", members, ["--config", str(toml), "--state-machine", "kv", "--snapshot-threshold-entries", "100",
                            "--snapshot-margin-entries", "20"])
    end = c.wait_caught_up(timeout=120)
    v = c.meta("n3")
    assert v is not None and v.ledger_begin_index > 0 and v.snapshot_index >= 0  # no entry 0: a snapshot came
    wait_until(lambda: (m := c.meta("n3")) is not None and m.applied_index >= end, 90, "n3 applied everything")
    assert {i.id: i.voter for i in c.ctl.members().members}["n3"] is False  # still a learner


def test_the_configuration_survives_compaction_in_snapshots(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """n3 replaces n0, then the log is compacted past both configuration entries: every
    member's newest snapshot records the configuration (voters n1, n2, n3) and its entry's
    index, and n1, restarted with its first command line (n0, n1, n2), takes it from there."""
    c = compacting_cluster(make_cluster, tmp_path)
    members = {m: p.address for m, p in c.ctl.peers.items()}
    (port,) = free_ports(1)
    toml = tmp_path / "small-files.toml"
    add_member(c, "n3", f"127.0.0.1:{port}", members,
               ["--config", str(toml), "--state-machine", "kv", "--snapshot-threshold-entries", "100",
                "--snapshot-margin-entries", "20"])
    remove_member(c, "n0", members)
    change = c.ctl.members().config_index
    fill(c, "a", 400)
    group = ["n1", "n2", "n3"]

    def compacted() -> bool:
        views = c.views(group)
        return all(v is not None and v.ledger_begin_index > change and v.snapshot_index > change
                   for v in views.values())

    wait_until(compacted, 90, f"every member compacted its log past configuration entry {change}")
    want = Membership({"n1": members["n1"], "n2": members["n2"], "n3": members["n3"]})
    for m in group:
        newest = SnapshotStore(c.store_dir(m)).newest()
        assert newest is not None, f"{m} has no snapshot"
        meta = newest[0]
        assert isinstance(meta.members, Membership) and meta.config_index == change, (m, meta)
        assert meta.members == want, (m, meta.members)
    c.kill("n1")
    c.restart("n1")
    assert {i.id for i in c.ctl.members("n1").voters} == {"n1", "n2", "n3"}
    # a learner added now starts from an InstallSnapshot: the snapshot's configuration (the one
    # it joined with names n4 as well, and the log after the snapshot holds that entry)
    (port4,) = free_ports(1)
    c.ctl.add_learner("n4", f"127.0.0.1:{port4}")
    join(c, "n4", {m: members[m] for m in group}, ["--config", str(toml), "--state-machine", "kv",
                                                  "--snapshot-threshold-entries", "100",
                                                  "--snapshot-margin-entries", "20"])
    c.wait_caught_up([*group, "n4"], 120)
    v = c.meta("n4")
    assert v is not None and v.ledger_begin_index > change  # no log before the snapshot: it was installed
    seen = c.ctl.members("n4")
    assert {i.id for i in seen.voters} == {"n1", "n2", "n3"} and [i.id for i in seen.learners] == ["n4"]
    c.kill("n2")  # n1 and n3: a majority of the voters in force only (n4 is a learner)
    assert c.ctl.append(b"after the restart").index > change


@pytest.mark.parametrize("window", [8, pytest.param(60, marks=pytest.mark.slow)])
def test_a_removed_member_left_running_causes_no_election(make_cluster: MakeCluster, window: int) -> None:
    """The removed member runs `window` seconds (the minute of `make soak`; CI's run is
    shorter) after a baseline as long with the same members: no election."""
    c = make_cluster(3)
    members = {m: p.address for m, p in c.ctl.peers.items()}
    leader = c.wait_leader()
    term = c.leader_meta().term
    rest = [m for m in c.ids if m != leader]
    removed, kept = rest[0], [leader, rest[1]]

    def stable() -> bool:
        views = c.views(kept)
        return all(v is not None and v.term == term and v.leader_id == leader for v in views.values())

    # the baseline: this machine keeps the group's term as it is for the window
    holds_for(stable, window, "the group's term without any change")
    remove_member(c, removed, members, stop=False)
    assert c.procs[removed].poll() is None  # left running, no longer a member
    holds_for(lambda: stable() and c.procs[removed].poll() is None, window,
              f"no election while removed member {removed} runs")
    assert c.ctl.append(b"still led by the same leader").term == term


def test_members_restarting_take_the_configuration_from_their_logs(make_cluster: MakeCluster) -> None:
    """After n3 joined and n0 left, n1 restarts with its first command line (peers n0, n1, n2)
    and n3 with --join again: both take the configuration from their own logs (voters n1, n2,
    n3), and the group goes on with n0 gone for good."""
    c = make_cluster(3)
    members = {m: p.address for m, p in c.ctl.peers.items()}
    (port,) = free_ports(1)
    add_member(c, "n3", f"127.0.0.1:{port}", members)
    remove_member(c, "n0", members)
    before = c.ctl.append(b"before the restarts")
    c.wait_caught_up(["n1", "n2", "n3"], 60)
    c.kill("n1")
    c.restart("n1")  # its command line still names n0 and not n3
    c.kill("n3")
    c.ids.remove("n3")
    join(c, "n3", {"n1": members["n1"], "n2": members["n2"]})
    c.down.discard("n3")
    for m in ("n1", "n3"):
        wait_until(lambda: {i.id for i in c.ctl.members(m).voters} == {"n1", "n2", "n3"}, 60,  # noqa: B023
                   f"{m}'s own configuration after its restart")
    c.kill("n2")  # n1 and n3 are a majority of the voters in force only
    after = c.ctl.append(b"n1 and n3 commit it")
    log = read_all(c.client(_peers({m: members[m] for m in ("n1", "n3")})))
    assert log[before.index] == (before.term, b"before the restarts")
    assert log[after.index] == (after.term, b"n1 and n3 commit it")


def test_a_member_down_during_every_change_follows_the_leader_they_made(make_cluster: MakeCluster,
                                                                       tmp_path: Path) -> None:
    """With TLS, n2 is down while n3 and n4 join and n0 and n1 leave (left running): restarted
    with its first command line, its log names neither n3 nor n4, one of which leads. It asks
    the members it knows (the removed n0 and n1 name the new configuration), follows that
    leader, takes the configuration from the log it receives, and counts as a voter: with the
    other new member killed, n2 and the leader commit."""
    tls = local_certs(tmp_path / "certs", members=["n0", "n1", "n2", "n3", "n4"])
    c = make_cluster(3, tls_dir=tls)
    members = {m: p.address for m, p in c.ctl.peers.items()}
    c.kill("n2")
    for new in ("n3", "n4"):
        (port,) = free_ports(1)
        add_member(c, new, f"127.0.0.1:{port}", members,
                   ["--tls-cert", str(tls / f"{new}.pem"), "--tls-key", str(tls / f"{new}-key.pem"),
                    "--tls-ca", str(tls / "ca.pem")])
    for old in ("n0", "n1"):
        remove_member(c, old, members, stop=False)
    before = c.ctl.append(b"while n2 was down")
    c.restart("n2")
    wait_until(lambda: {i.id for i in c.ctl.members("n2").voters} == {"n2", "n3", "n4"}, 60,
               "n2 follows the configuration it missed")
    leader = c.wait_leader(["n2", "n3", "n4"], 60)
    c.kill(next(m for m in ("n3", "n4") if m != leader))
    after = c.ctl.append(b"n2 and the leader commit it")
    log = read_all(c.client(_peers({m: members[m] for m in ("n2", leader)})))
    assert log[before.index] == (before.term, b"while n2 was down")
    assert log[after.index] == (after.term, b"n2 and the leader commit it")


def test_the_members_commands_on_a_live_group(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """The CLI end to end: list (JSON), a join refused before add-learner, add-learner, remove."""
    c = make_cluster(3)

    def dledger(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dledger", *args, "--group", c.group], capture_output=True,
                              text=True, timeout=120, check=False)

    listed = dledger("members", "list", "--peers", c.peers, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert sorted(m["id"] for m in doc["members"]) == ["n0", "n1", "n2"] and doc["committed"]
    assert all(m["voter"] for m in doc["members"]) and doc["leader"] in {"n0", "n1", "n2"}
    (port,) = free_ports(1)
    refused = dledger("server", "--join", c.peers, "--id", "n3", "--store-dir", str(tmp_path / "n3"))
    assert refused.returncode != 0 and "add-learner" in refused.stderr
    added = dledger("members", "add-learner", "--peers", c.peers, "--id", "n3", "--addr", f"127.0.0.1:{port}")
    assert added.returncode == 0, added.stderr
    again = dledger("members", "add-learner", "--peers", c.peers, "--id", "n3", "--addr", f"127.0.0.1:{port}")
    assert again.returncode != 0 and "MEMBER_EXISTS" in again.stderr
    table = dledger("status", "--peers", c.peers)
    assert "learner" in table.stdout
    removed = dledger("members", "remove", "--peers", c.peers, "--id", "n3")
    assert removed.returncode == 0, removed.stderr
    assert "n3" not in json.loads(dledger("members", "list", "--peers", c.peers, "-o", "json").stdout)["peers"]
