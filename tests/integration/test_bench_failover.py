"""`dledger bench --failover`: leader kills on a real local group, reported as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_failover_kills_the_leader_and_reports_each_kill() -> None:
    cmd = [sys.executable, "-m", "dledger", "bench", "--failover", "2", "--duration", "1", "--warmup", "0.5",
           "--clients", "4", "--size", "100", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, timeout=240)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, err
    report = json.loads(p.stdout)
    assert report["kills"] == 2 and len(report["per_kill"]) == 2, report
    assert report["unrecovered"] == 0, report
    for kill in report["per_kill"]:
        assert kill["elect_s"] > 0 and kill["append_s"] > 0, kill
        assert kill["new_leader"] not in (None, kill["leader"]), kill
        assert kill["new_term"] > kill["term"], kill
        assert kill["leader_stall_s"] is not None and kill["leader_stall_s"] >= 0, kill  # scraped from its metrics
    # the second kill's leader is the one the first elected (unless a false election moved it)
    if report["false_elections"] == 0:
        assert report["per_kill"][1]["leader"] == report["per_kill"][0]["new_leader"], report
        assert report["per_kill"][1]["tenure_stall_le_s"] is not None  # scraped at its election and its kill
    for key in ("elect_s", "append_s"):
        s = report[key]
        assert 0 < s["min"] <= s["median"] <= s["p99"] <= s["max"], (key, s)
    explained = sum(k["new_term"] - k["term"] for k in report["per_kill"])
    assert report["terms"] >= explained >= 2
    assert report["false_elections"] == report["terms"] - explained
    assert report["leader_stall_max_s"] >= max(k["leader_stall_s"] for k in report["per_kill"])
    assert report["entries"] > 0
    assert sum(1 for line in err.splitlines() if line.startswith("bench: kill ")) == 2, err


def test_bench_failover_refuses_a_group_it_does_not_own() -> None:
    cmd = [sys.executable, "-m", "dledger", "bench", "--failover", "2", "--peers", "n0-127.0.0.1:1"]
    p = subprocess.run(cmd, capture_output=True, timeout=60)
    assert p.returncode == 2 and b"--failover kills members of the local group" in p.stderr, p.stderr
