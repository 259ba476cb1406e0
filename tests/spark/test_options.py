"""Option parsing, partition planning and admission control, without a cluster."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import dledger.spark.source as source_module
from dledger.spark.online import DataLossError
from dledger.spark.options import (
    EARLIEST,
    LATEST,
    IndexRange,
    OptionError,
    allocate,
    parse_groups,
    parse_index_spec,
    split_range,
)
from dledger.spark.source import DLedgerStreamReader, RangePartition, ReadConfig

pytestmark = pytest.mark.spark

P1 = "n0-127.0.0.1:1;n1-127.0.0.1:2"
P2 = "n0-127.0.0.1:3"


def test_groups_from_peers_or_json() -> None:
    assert parse_groups({"peers": P1}) == {"default": P1}
    assert parse_groups({"peers": P1, "group": "g"}) == {"g": P1}
    assert parse_groups({"groups": json.dumps({"a": P1, "b": P2})}) == {"a": P1, "b": P2}
    with pytest.raises(OptionError, match="not both"):
        parse_groups({"groups": json.dumps({"a": P1}), "peers": P1})
    with pytest.raises(OptionError, match="peers"):
        parse_groups({"group": "g"})
    with pytest.raises(OptionError, match=r"^option peers is missing.*or controller and brokers") as e:
        parse_groups({})  # no option at all: peers forgotten (or a catalog table's read)
    assert str(e.value).index("peers is missing") < str(e.value).index("catalog table")
    with pytest.raises(OptionError, match="bad peer"):
        parse_groups({"peers": "n0:1"})


def test_index_specs() -> None:
    groups = {"a": P1, "b": P2}
    assert parse_index_spec(None, "startingIndex", groups, EARLIEST) == {"a": EARLIEST, "b": EARLIEST}
    assert parse_index_spec("latest", "startingIndex", groups, EARLIEST) == {"a": LATEST, "b": LATEST}
    assert parse_index_spec('{"a": 7}', "startingIndex", groups, LATEST) == {"a": 7, "b": LATEST}
    with pytest.raises(OptionError, match="unknown group"):
        parse_index_spec('{"c": 7}', "startingIndex", groups, LATEST)
    with pytest.raises(OptionError, match="integer"):
        parse_index_spec('{"a": "x"}', "startingIndex", groups, LATEST)
    with pytest.raises(OptionError, match="startingIndex"):
        parse_index_spec("first", "startingIndex", groups, LATEST)


def test_batch_rejects_kafka_invalid_specs() -> None:
    with pytest.raises(OptionError, match="latest"):
        ReadConfig.from_options({"peers": P1, "startingIndex": "latest"}, streaming=False)
    with pytest.raises(OptionError, match="batch reads only"):
        ReadConfig.from_options({"peers": P1, "endingIndex": "latest"}, streaming=True)
    cfg = ReadConfig.from_options({"peers": P1}, streaming=True)
    assert cfg.starting == {"default": LATEST} and cfg.fail_on_data_loss
    cfg = ReadConfig.from_options({"peers": P1, "failOnDataLoss": "false"}, streaming=False)
    assert cfg.starting == {"default": EARLIEST} and not cfg.fail_on_data_loss


def test_split_is_aligned_and_deterministic() -> None:
    assert split_range("g", 5, 25, 10) == [IndexRange("g", 5, 10), IndexRange("g", 10, 20), IndexRange("g", 20, 25)]
    assert split_range("g", 7, 7, 10) == []
    # a replay of the same offsets plans the same partitions
    assert split_range("g", 123, 4567, 1000) == split_range("g", 123, 4567, 1000)


def test_allocate_bounds_and_uses_the_limit() -> None:
    assert allocate({"a": 5, "b": 3}, 100) == {"a": 5, "b": 3}
    shares = allocate({"a": 900, "b": 100, "c": 0}, 100)
    assert sum(shares.values()) == 100 and shares["c"] == 0 and shares["a"] > shares["b"] > 0
    shares = allocate({"a": 1, "b": 1, "c": 1}, 2)
    assert sum(shares.values()) == 2 and all(v <= 1 for v in shares.values())


def _reader(monkeypatch: pytest.MonkeyPatch, begin: int, committed: int, **options: str) -> DLedgerStreamReader:
    cfg = ReadConfig.from_options({"peers": P1, **options}, streaming=True)
    r = DLedgerStreamReader(cfg)
    monkeypatch.setattr(r, "_view", lambda group: (begin, committed + 1))  # (log begin, readable end)
    monkeypatch.setattr(r, "_controls", lambda group, start, end: ())  # no control records (no group to ask)
    return r


def test_latest_offset_respects_limits_and_available_now(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _reader(monkeypatch, 0, 999, maxEntriesPerTrigger="300")
    assert r.getDefaultReadLimit() == ReadMaxRows(300)
    assert r.latestOffset({"default": 100}, ReadMaxRows(300)) == {"default": 400}
    assert r.latestOffset({"default": 100}, ReadAllAvailable()) == {"default": 1000}
    assert r.reportLatestOffset() == {"default": 1000}
    assert r.latestOffset({"default": 1000}, ReadMaxRows(300)) == {"default": 1000}
    r._target = {"default": 500}  # what prepareForTriggerAvailableNow records
    assert r.latestOffset({"default": 400}, ReadMaxRows(300)) == {"default": 500}
    assert r.latestOffset({"default": 500}, ReadAllAvailable()) == {"default": 500}


def test_initial_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _reader(monkeypatch, 10, 99).initialOffset() == {"default": 100}
    assert _reader(monkeypatch, 10, 99, startingIndex="earliest").initialOffset() == {"default": 10}
    assert _reader(monkeypatch, 10, 99, startingIndex='{"default": 42}').initialOffset() == {"default": 42}


def test_data_loss_below_log_begin(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataLossError, match=r"entries \[50, 100\) were deleted"):
        _reader(monkeypatch, 100, 199).latestOffset({"default": 50}, ReadAllAvailable())
    r = _reader(monkeypatch, 100, 199, failOnDataLoss="false")
    assert r.latestOffset({"default": 50}, ReadMaxRows(10)) == {"default": 110}
    monkeypatch.setattr(source_module, "COMMIT_CATCH_UP_S", 0.3)
    with pytest.raises(DataLossError, match="reset"):
        _reader(monkeypatch, 0, 9).latestOffset({"default": 50}, ReadAllAvailable())


def test_a_new_leaders_lagging_commit_index_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader just elected names a commit index below the query's position until an entry of
    its term commits: the reader asks again, and goes on once it caught up."""
    r = _reader(monkeypatch, 0, 0)
    views = iter([(0, 40), (0, 40), (0, 120)])
    monkeypatch.setattr(r, "_view", lambda group: next(views))
    assert r.latestOffset({"default": 100}, ReadAllAvailable()) == {"default": 120}


def test_partitions_cover_the_range_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _reader(monkeypatch, 0, 10**6, entriesPerPartition="1000")
    parts = r.partitions({"default": 1500}, {"default": 4200})
    assert all(isinstance(p, RangePartition) for p in parts)
    ranges = [(p.start, p.end) for p in parts if isinstance(p, RangePartition)]
    assert ranges == [(1500, 2000), (2000, 3000), (3000, 4000), (4000, 4200)]
    assert r.partitions({"default": 7}, {"default": 7}) == []


def test_min_partitions_cuts_smaller_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _reader(monkeypatch, 0, 10**6, minPartitions="4")  # default entriesPerPartition: one task for 2,000
    ranges = [(p.start, p.end) for p in r.partitions({"default": 0}, {"default": 2000})
              if isinstance(p, RangePartition)]
    assert ranges == [(0, 500), (500, 1000), (1000, 1500), (1500, 2000)]
    assert ranges == [(p.start, p.end) for p in r.partitions({"default": 0}, {"default": 2000})
                      if isinstance(p, RangePartition)]  # the same range plans the same tasks
    with pytest.raises(OptionError, match="minPartitions"):
        _reader(monkeypatch, 0, 10, minPartitions="0")


def test_unknown_option_names_fail_with_a_hint() -> None:
    from dledger.spark.options import READ_OPTIONS, check_names

    check_names({"peers": P1, "startingIndex": "earliest", "path": "x", "spark.foo": "1"}, READ_OPTIONS, "dledger")
    with pytest.raises(OptionError, match=r"'startingOffsets' \(did you mean startingIndex\?\)"):
        check_names({"peers": P1, "startingOffsets": "earliest"}, READ_OPTIONS, "dledger")
    with pytest.raises(OptionError, match=r"valid options are .*startingIndex"):
        check_names({"peers": P1, "nonsense": "1"}, READ_OPTIONS, "dledger")
