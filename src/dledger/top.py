"""`dledger top`: a live view of a group, refreshed every second (like `top`).

Each row is a member's own view (`metadata_all`): role, term, ledger end, commit index, how
far it trails the leader's commit (the leader `dledger health` names), and the rates between
two refreshes (appends/s from its ledger end). With members serving metrics (`--metrics-port`
on every host, or `--metrics-base-port` for a local cluster), it adds MB/s appended and the
mean fsync latency of the last interval (summed over the groups a process serves).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table

from dledger.codes import DLedgerError
from dledger.health import assess, is_down
from dledger.runtime.client import DLedgerClient, Metadata

_SCRAPED = ("dledger_appended_bytes_total", "dledger_fsync_seconds_sum", "dledger_fsync_seconds_count")


@dataclass
class Sample:
    at: float
    views: dict[str, Metadata | DLedgerError]
    metrics: dict[str, dict[str, float]]  # member -> metric -> value


def scrape(url: str) -> dict[str, float]:
    """The few counters top shows, summed over label sets, from a /metrics page ({} if down)."""
    out = dict.fromkeys(_SCRAPED, 0.0)
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:  # an operator's own URL
            text = r.read().decode()
    except OSError:
        return {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def sample(client: DLedgerClient, metrics_urls: Mapping[str, str]) -> Sample:
    return Sample(time.monotonic(), client.metadata_all(), {m: scrape(u) for m, u in metrics_urls.items()})


def render(group: str, prev: Sample | None, cur: Sample) -> Table:
    verdict = assess(cur.views)
    table = Table(title=f"dledger top — group {group} — {verdict.line}", title_justify="left")
    for col in ("member", "role", "term", "end", "commit", "lag", "appends/s", "MB/s", "fsync ms"):
        table.add_column(col, justify="left" if col in ("member", "role") else "right")
    lv = cur.views.get(verdict.leader) if verdict.leader is not None else None
    leader_commit = lv.committed_index if isinstance(lv, Metadata) else None
    dt = cur.at - prev.at if prev is not None else 0.0
    for m, v in cur.views.items():
        if isinstance(v, DLedgerError):
            table.add_row(m, "[red]down[/red]" if is_down(v) else "[red]error[/red]",
                          "", "", "", "", "", "", "")
            continue
        before = prev.views.get(m) if prev is not None else None
        rate = (v.ledger_end_index - before.ledger_end_index) / dt if isinstance(before, Metadata) and dt > 0 else None
        lag = max(0, leader_commit - v.ledger_end_index) if leader_commit is not None else None
        mb, fs = _metric_rates(prev.metrics.get(m, {}) if prev else {}, cur.metrics.get(m, {}), dt)
        table.add_row(m, v.role, str(v.term), str(v.ledger_end_index), str(v.committed_index),
                      "" if lag is None else str(lag), "" if rate is None else f"{rate:,.0f}", mb, fs)
    return table


def _metric_rates(before: Mapping[str, float], now: Mapping[str, float], dt: float) -> tuple[str, str]:
    if not before or not now or dt <= 0:
        return "", ""
    mb = (now["dledger_appended_bytes_total"] - before["dledger_appended_bytes_total"]) / dt / (1 << 20)
    n = now["dledger_fsync_seconds_count"] - before["dledger_fsync_seconds_count"]
    fs = (now["dledger_fsync_seconds_sum"] - before["dledger_fsync_seconds_sum"]) / n * 1000 if n > 0 else None
    return f"{mb:.2f}", "" if fs is None else f"{fs:.2f}"


def run(client: DLedgerClient, group: str, metrics_urls: Mapping[str, str], interval: float,
        iterations: int | None, console: Console | None = None) -> None:
    """Refresh every `interval` seconds, `iterations` times (None: until interrupted)."""
    prev: Sample | None = None
    cur = sample(client, metrics_urls)
    with Live(render(group, prev, cur), console=console, refresh_per_second=4, screen=False) as live:
        k = 1
        while iterations is None or k < iterations:
            time.sleep(interval)
            prev, cur = cur, sample(client, metrics_urls)
            live.update(render(group, prev, cur))
            k += 1
