"""`dledger compact` on a plain log run as member processes: the log begin moves on every
running member, reads below it answer INDEX_LESS_THAN_LOCAL_BEGIN, a follower that was down
meanwhile catches up by InstallSnapshot, and every acknowledged entry above the point is
still there. Small data files (64 KiB) so a few thousand entries span several; periodic
retention is slowed to a minute, so only the compaction can have deleted anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dledger.cli import cli
from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import Entry
from integration.harness import Cluster, MakeCluster, wait_until

pytestmark = pytest.mark.integration


def _append(c: Cluster, start: int, n: int) -> dict[int, bytes]:
    client = c.client()
    acked: dict[int, bytes] = {}
    for k in range(start, start + n, 50):
        bodies = [b"entry-%06d-" % j + b"x" * 180 for j in range(k, min(k + 50, start + n))]
        for body, r in zip(bodies, client.append_batch(bodies), strict=True):
            acked[r.index] = body
    return acked


def _compact(c: Cluster, *args: str) -> tuple[int, list[dict[str, object]], str]:
    result = CliRunner().invoke(cli, ["compact", "--peers", c.peers, "--group", c.group, "-o", "json", *args])
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    failure = "" if result.exception is None or isinstance(result.exception, SystemExit) else str(result.exception)
    return result.exit_code, rows, result.stderr + failure


def test_compact_a_plain_log(make_cluster: MakeCluster, tmp_path: Path) -> None:
    toml = tmp_path / "small-files.toml"
    toml.write_text("data_file_size = 65536\nindex_file_size = 32768\nretention_check_interval_ms = 60000\n"
                    "retention_hold_ms = 1000\n")
    c = make_cluster(3, extra=["--config", str(toml)])
    acked = _append(c, 0, 1200)
    leader = c.wait_leader()
    lagging = next(m for m in c.ids if m != leader)
    lag_end = c.wait_caught_up()
    c.kill(lagging)
    acked |= _append(c, 1200, 600)  # the stopped follower misses these
    running = [m for m in c.ids if m != lagging]
    commit = c.leader_meta(running).committed_index

    # refused: an index not committed yet, and a member that does not answer (named, exit 1)
    code, rows, err = _compact(c, "--member", leader, "--through", str(commit + 1000))
    assert code == 1 and rows == [] and "only committed entries can be compacted" in err, err
    code, rows, err = _compact(c, "--through", "1700")
    assert code == 1 and f"not compacted: {lagging}" in err, err
    assert sorted(str(r["member"]) for r in rows) == sorted(running), rows
    for r in rows:
        assert r["through"] == 1700 and r["begin_before"] == 0, r
        # whole 64 KiB files (~250 entries each) before entry 1701 go: the begin is within a file of it
        assert 1700 - 300 < int(str(r["begin"])) <= 1701 and r["begin"] == r["target"], r
    begins = {str(r["member"]): int(str(r["begin"])) for r in rows}
    for m in running:  # what each member reports of itself
        v = c.meta(m)
        assert v is not None and v.ledger_begin_index == begins[m], (m, v)
        with pytest.raises(DLedgerError) as ei:
            c.ctl.get(begins[m] - 1, member=m, consistency="local")
        assert ei.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, ei.value
    with pytest.raises(DLedgerError) as ei:
        c.ctl.get(0)
    assert ei.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, ei.value

    # the stopped follower's log ends before the leader's begin: it installs a snapshot (the
    # compaction's, at the commit index then) and its log begins after it
    assert lag_end + 1 < begins[leader]
    c.restart(lagging)
    acked |= _append(c, 1800, 100)
    end = c.wait_caught_up(timeout=90)
    v = c.meta(lagging)
    assert v is not None and begins[leader] <= v.ledger_begin_index <= commit + 1, v
    begins[lagging] = v.ledger_begin_index
    for m in c.ids:
        got = {e.index: e.body for e in _read_from(c, begins[m], m)}
        want = {i: b for i, b in acked.items() if i >= begins[m]}
        assert {i: got.get(i) for i in want} == want, f"{m} lost acknowledged entries"
        assert max(got) == end

    # again without --through: each member through its commit index (the last file stays)
    code, rows, err = _compact(c)
    assert code == 0, err
    assert sorted(str(r["member"]) for r in rows) == sorted(c.ids), rows
    assert all(int(str(r["begin"])) >= begins[str(r["member"])] for r in rows), rows
    wait_until(lambda: (x := c.meta(leader)) is not None and x.ledger_begin_index > begins[leader], 30,
               "the leader compacted again")


def _read_from(c: Cluster, first: int, member: str) -> list[Entry]:
    out: list[Entry] = []
    nxt = first
    while True:
        batch = c.ctl.read(nxt, 1000, member=member)
        if not batch:
            return out
        out.extend(batch)
        nxt = batch[-1].index + 1


def test_age_retention_without_disk_pressure(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """`--retention-hours` on `dledger server`: whole data files last written longer ago go on
    an almost empty disk, on every member, and the acknowledged entries after them stay."""
    toml = tmp_path / "small-files.toml"
    toml.write_text("data_file_size = 65536\nindex_file_size = 32768\nretention_check_interval_ms = 200\n")
    c = make_cluster(3, extra=["--config", str(toml), "--retention-hours", "0.0005"])  # 1.8 s
    acked = _append(c, 0, 1200)
    end = c.wait_caught_up()
    wait_until(lambda: all((v := c.meta(m)) is not None and v.ledger_begin_index > 0 for m in c.ids), 60,
               "every member deleted its aged data files")
    leader = c.wait_leader()
    v = c.meta(leader)
    assert v is not None and 0 < v.ledger_begin_index <= end
    got = {e.index: e.body for e in _read_from(c, v.ledger_begin_index, leader)}
    assert {i: got.get(i) for i in acked if i >= v.ledger_begin_index} == {
        i: b for i, b in acked.items() if i >= v.ledger_begin_index}

    # a follower stopped just now still holds what it has not stored (retention_hold_ms, 10
    # minutes by default): a compaction stops there and says who holds it
    lag = next(m for m in c.ids if m != leader)
    c.kill(lag)
    _append(c, 1200, 600)
    code, rows, err = _compact(c, "--member", leader, "--wait", "2")
    assert code == 0 and len(rows) == 1, err
    note = str(rows[0]["note"])
    assert int(str(rows[0]["begin"])) < int(str(rows[0]["target"])), rows
    assert "held back" in note and f"follower {lag}" in note, rows
