"""`dledger bench` against a real group, and the members' Prometheus metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dledger import DLedgerClient, DLedgerError, ResponseCode

from .harness import Cluster, MakeCluster, wait_until

pytestmark = pytest.mark.integration


def scrape(c: Cluster, member: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`member`'s /metrics as {(sample name, sorted labels): value}."""
    port = c.metrics_base_port + c.ids.index(member)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not exported; have {sorted({k[0] for k in samples})}"
    return samples[key]


def test_metrics_follow_the_group(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, flush="sync", metrics=True)
    leader = c.wait_leader()
    lm = c.meta(leader)
    assert lm is not None
    bodies = [f"metric-{k}".encode() * 10 for k in range(40)]
    for k in range(0, 40, 4):
        c.ctl.append_batch(bodies[k : k + 4])  # 10 requests of 4 entries
    end = c.wait_caught_up()
    lab = {"group": c.group, "member": leader}

    def leader_view() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        s = scrape(c, leader)
        lag_done = all(value(s, "dledger_replication_lag_entries", follower=f, **lab) == 0
                       for f in c.ids if f != leader)
        return s if lag_done and value(s, "dledger_committed_index", **lab) == end else None

    s = wait_until(leader_view, 30, "the leader's metrics show the caught-up group")
    assert value(s, "dledger_is_leader", **lab) == 1
    assert value(s, "dledger_role", **lab) == 2
    assert value(s, "dledger_term", **lab) == lm.term
    assert value(s, "dledger_ledger_end_index", **lab) == end
    assert value(s, "dledger_durable_index", **lab) == end  # sync mode: fsynced before acknowledged
    assert value(s, "dledger_pending_requests", **lab) == 0
    assert value(s, "dledger_append_latency_seconds_count", **lab) == 10
    assert value(s, "dledger_append_batch_entries_sum", **lab) == 40
    assert value(s, "dledger_appended_bytes_total", **lab) == sum(map(len, bodies))
    assert value(s, "dledger_fsync_seconds_count", **lab) >= 1
    assert value(s, "dledger_elections_total", **lab) >= 1  # it won one
    assert value(s, "dledger_appended_entries_total", **lab) == 40
    assert value(s, "dledger_requests_total", kind="client", request="APPEND", code="SUCCESS", **lab) == 10
    assert value(s, "dledger_member_state", state="leader", **lab) == 1
    assert value(s, "dledger_member_state", state="follower", **lab) == 0
    assert value(s, "dledger_leader_changes_total", **lab) >= 0  # exported (0: no change since its start)

    follower = next(m for m in c.ids if m != leader)
    fs = scrape(c, follower)
    flab = {"group": c.group, "member": follower}
    assert value(fs, "dledger_is_leader", **flab) == 0
    assert value(fs, "dledger_term", **flab) == lm.term
    assert value(fs, "dledger_ledger_end_index", **flab) == end
    assert value(fs, "dledger_append_latency_seconds_count", **flab) == 0  # appends are the leader's
    assert value(fs, "dledger_requests_total", kind="member", request="PUSH", code="SUCCESS", **flab) >= 1
    assert value(fs, "dledger_member_state", state="follower", **flab) == 1
    assert value(fs, "dledger_follower_lag_entries", **flab) == 0  # caught up

    # a leadership transfer is a leader change every member that knew the old leader counts
    def changes() -> dict[str, float]:
        return {m: value(scrape(c, m), "dledger_leader_changes_total", group=c.group, member=m) for m in c.ids}

    before = changes()
    c.ctl.transfer_leadership(follower)
    assert c.wait_leader() == follower

    def risen() -> dict[str, float] | None:
        now = changes()
        return now if any(now[m] > before[m] for m in c.ids) else None

    after = wait_until(risen, 30, f"dledger_leader_changes_total rises after the transfer (before: {before})")
    assert max(after.values()) >= 1


def test_requests_are_counted_by_kind_and_refusals_too(make_cluster: MakeCluster) -> None:
    """dledger_requests_total tells client from member traffic (kind), and counts a request
    for a group no member hosts (refused before any group: group "?", the member's own id)."""
    c = make_cluster(3, metrics=True)
    c.ctl.append(b"counted")
    with DLedgerClient(c.peers, group="nope", timeout=10) as nope, pytest.raises(DLedgerError) as e:
        nope.get(0)
    assert e.value.code == ResponseCode.UNKNOWN_GROUP

    def requests(member: str) -> dict[tuple[str, ...], float]:
        """`member`'s dledger_requests_total: (group, member, kind, request, code) -> value."""
        return {tuple(dict(lab)[k] for k in ("group", "member", "kind", "request", "code")): v
                for (name, lab), v in scrape(c, member).items() if name == "dledger_requests_total"}

    def counted() -> dict[str, dict[tuple[str, ...], float]] | None:
        """Every member's series, once the append, the refusal and the members' own traffic
        (a leader's heartbeats and pushes reach at least two of three members) show."""
        views = {m: requests(m) for m in c.ids}
        appended = any(views[m].get((c.group, m, "client", "APPEND", "SUCCESS"), 0) >= 1 for m in c.ids)
        refused = any(k[4] == "UNKNOWN_GROUP" for s in views.values() for k in s)
        followed = [m for m, s in views.items()
                    if any(k[2] == "member" and k[3] in ("HEART_BEAT", "PUSH") for k in s)]
        return views if appended and refused and len(followed) >= 2 else None

    views = wait_until(counted, 60, "the append, the refusal and member traffic counted")
    for m, series in views.items():
        assert {k[0] for k in series} <= {c.group, "?"}, series  # no "nope": one series for every stranger
        assert {k[1] for k in series} == {m}
        assert all(k[2] == ("member" if k[3] in ("VOTE", "HEART_BEAT", "PUSH") else "client") for k in series), series
        for k in series:
            if k[4] == "UNKNOWN_GROUP":  # what the client asked a member about group "nope"
                assert k[0] == "?" and k[2] == "client", k


def test_bench_reports_json_and_plot(make_cluster: MakeCluster, tmp_path: Path) -> None:
    c = make_cluster(3)
    before = c.leader_meta().committed_index
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    # a warm-up, then a measuring phase longer than the 1 s between progress lines: each
    # phase prints at least one line (off a terminal, the progress is lines on stderr)
    cmd = [sys.executable, "-m", "dledger", "bench", "--peers", c.peers, "--group", c.group, "--clients", "8",
           "--conns", "2", "--size", "100", "--batch", "5", "--duration", "1.5", "--warmup", "1",
           "--json", str(out), "--plot", str(png)]
    p = subprocess.run(cmd, capture_output=True, timeout=120)  # not a TTY
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, err
    lines = err.splitlines()
    assert lines[0] == f"bench: against --peers {c.peers} (group {c.group})", err  # no local group started
    assert any(re.fullmatch(r"bench: warm-up, \d+ s left", x) for x in lines), err
    assert any(re.fullmatch(r"bench: measuring, \d+ s, [\d,]+ entries/s", x) for x in lines), err
    report = json.loads(out.read_text())
    assert report["entries"] > 0
    assert report["requests"] * 5 == report["entries"]
    for key in ("entries_per_s", "mb_per_s", "requests_per_s"):
        assert report[key] > 0, key
    lat = report["latency_ms"]
    assert set(lat) >= {"p50", "p90", "p99", "p999", "max"}
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"]
    assert report["errors"] == {}
    assert report["config"]["conns"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"entries/s" in p.stdout  # the summary table
    # every acknowledged entry was committed in the group
    assert c.leader_meta().committed_index >= before + report["entries"]
