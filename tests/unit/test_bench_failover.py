"""The failover bench's summaries: percentiles, false elections, stalls read from /metrics."""

from __future__ import annotations

import math

from dledger.bench.failover import FailoverResult, Kill, StallScrape, _summary, parse_stall, worst_between

METRICS = """# HELP dledger_loop_stall_max_seconds The worst such lateness
# TYPE dledger_loop_stall_max_seconds gauge
dledger_loop_stall_max_seconds{group="default",member="n0"} 0.42
dledger_loop_stall_seconds_bucket{group="default",member="n0",le="0.01"} 90.0
dledger_loop_stall_seconds_bucket{group="default",member="n0",le="0.5"} 99.0
dledger_loop_stall_seconds_bucket{group="default",member="n0",le="+Inf"} 100.0
"""


def test_stall_is_read_from_the_metrics_text() -> None:
    s = parse_stall(METRICS)
    assert s is not None and s.worst == 0.42
    assert s.buckets == {0.01: 90.0, 0.5: 99.0, math.inf: 100.0}
    assert parse_stall("dledger_term{} 3\n") is None


def test_the_worst_stall_between_two_scrapes_is_bounded_by_the_bucket_holding_every_new_sample() -> None:
    before = StallScrape(0.42, {0.01: 90.0, 0.5: 99.0, math.inf: 100.0})
    assert worst_between(before, before) is None
    only_small = StallScrape(0.42, {0.01: 95.0, 0.5: 104.0, math.inf: 105.0})
    assert worst_between(before, only_small) == 0.01
    one_long = StallScrape(0.42, {0.01: 95.0, 0.5: 105.0, math.inf: 106.0})
    assert worst_between(before, one_long) == 0.5
    beyond = StallScrape(0.9, {0.01: 95.0, 0.5: 104.0, math.inf: 106.0})
    assert worst_between(before, beyond) == math.inf


def test_summary_and_false_elections() -> None:
    assert _summary([]) == {"median": None, "p99": None, "min": None, "max": None}
    xs = sorted([1.0 + k / 100 for k in range(20)])
    s = _summary(xs)
    assert s["median"] == round((xs[9] + xs[10]) / 2, 4) and s["p99"] == xs[-1] and s["min"] == 1.0
    # two kills explain terms 3 -> 4 and 4 -> 6 (a split vote); the group went from 3 to 8: two false
    r = FailoverResult(kills=[Kill("n0", 3, 1.0, 1.2, "n1", 4), Kill("n1", 4, 1.1, 1.3, "n2", 6)],
                       term_start=3, term_end=8)
    assert r.false_elections == 2
    rep = r.report()
    assert rep["terms"] == 5 and rep["false_elections"] == 2 and rep["unrecovered"] == 0


def test_failover_refuses_options_it_cannot_honour() -> None:
    from click.testing import CliRunner

    from dledger.cli import cli

    env = {"DLEDGER_PEERS": ""}
    for args, said in ((["--rate", "100"], "--rate cannot be combined with --failover"),
                       (["--procs", "2", "--clients", "4"], "--procs cannot be combined with --failover"),
                       (["--nodes", "1"], "--failover needs --nodes 3 or more")):
        result = CliRunner(env=env).invoke(cli, ["bench", "--failover", "2", *args])
        assert result.exit_code == 2 and said in result.output, (args, result.output)
