"""docs/metrics.md lists every metric a member exports (a new one must be documented)."""

from __future__ import annotations

from pathlib import Path

from dledger.runtime.metrics import Metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_metric_is_in_the_reference() -> None:
    text = DOC.read_text()
    names = [f.name + ("_total" if f.type == "counter" else "") for f in Metrics().registry.collect()]
    assert names and not [n for n in names if f"`{n}`" not in text]
