"""Entries behind latest, from a streaming query's progress (docs/spark.md, "Source metrics").

Kafka's source reports minOffsetsBehindLatest, maxOffsetsBehindLatest and avgOffsetsBehindLatest
in each source's `metrics` map of StreamingQueryProgress. A Python data source cannot fill that
map (PySpark 4.3's DataSourceStreamReader has no metrics hook), so the `dledger` source reports
each log's readable end through reportLatestOffset, which Spark shows as the source's
`latestOffset` next to its `endOffset`; these functions turn the two into Kafka's numbers.
Pure Python: a StreamingQueryListener or a monitoring job can call them on any progress,
as PySpark hands it or as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _offsets(value: Any) -> dict[str, int] | None:
    """A dledger offset {"<group>": next index, ...} from a progress field (a JSON string or
    its parsed form); None for another source's offsets or none at all."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping) or not value:
        return None
    out: dict[str, int] = {}
    for k, v in value.items():
        if str(k).startswith("@"):  # the planning time kept for the timestamp column
            continue
        if not isinstance(v, int) or isinstance(v, bool):
            return None  # not ours (Kafka's are nested per partition)
        out[str(k)] = v
    return out or None


def entries_behind_latest(progress: Mapping[str, Any]) -> dict[str, int]:
    """{group: indexes between the last micro-batch's end and the log's readable end} over the
    query's dledger sources (a group read by two sources: the larger). Indexes, not rows: the
    NOOPs an election writes count. Empty when no progress names both offsets yet."""
    out: dict[str, int] = {}
    for source in progress.get("sources") or []:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        for group, top in latest.items():
            if group in end:
                out[group] = max(out.get(group, 0), max(0, top - end[group]))
    return out


def lag_metrics(progress: Mapping[str, Any]) -> dict[str, int | float]:
    """Kafka's three source metrics under our names: minEntriesBehindLatest,
    maxEntriesBehindLatest, avgEntriesBehindLatest (over groups); empty when not known."""
    behind = entries_behind_latest(progress)
    if not behind:
        return {}
    values = list(behind.values())
    return {"minEntriesBehindLatest": min(values), "maxEntriesBehindLatest": max(values),
            "avgEntriesBehindLatest": sum(values) / len(values)}
