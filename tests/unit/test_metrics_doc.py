"""docs/metrics.md lists every metric a member exports (a new one must be documented)."""

from __future__ import annotations

from pathlib import Path

from dledger.runtime.metrics import Metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_metric_is_in_the_reference() -> None:
    text = DOC.read_text()
    names = [f.name + ("_total" if f.type == "counter" else "") for f in Metrics().registry.collect()]
    assert names and not [n for n in names if f"`{n}`" not in text]


def test_the_dashboard_uses_only_metrics_that_exist() -> None:
    import json
    import re

    dash = json.loads((DOC.parent / "grafana-dashboard.json").read_text())
    exported = {f.name for f in Metrics().registry.collect()}
    used = {re.sub(r"_(total|bucket|sum|count)$", "", name)
            for p in dash["panels"] for t in p["targets"] for name in re.findall(r"dledger_\w+", t["expr"])}
    assert used and used <= exported, used - exported
