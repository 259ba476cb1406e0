"""Kafka-connector parity without a cluster: Kafka's option names, minEntriesPerTrigger with
maxTriggerDelay, the timestamp column's offsets, and the entries-behind-latest numbers."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from dledger.spark.lag import entries_behind_latest, lag_metrics
from dledger.spark.options import READ_OPTIONS, WRITE_OPTIONS, OptionError, check_names, get_duration, hold_back
from dledger.spark.schema import ARROW_ENTRY_SCHEMA, entry_batch
from dledger.spark.source import PLANNED_AT, Columns, DLedgerDataSource, DLedgerStreamReader, ReadConfig

pytestmark = pytest.mark.spark

P = "n0-127.0.0.1:1;n1-127.0.0.1:2"
BOTH = READ_OPTIONS | WRITE_OPTIONS


def _refused(name: str, value: str = "x") -> str:
    with pytest.raises(OptionError) as e:
        check_names({"peers": P, name: value}, BOTH, "dledger")
    return str(e.value)


@pytest.mark.parametrize(("name", "said"), [
    ("startingOffsets", "did you mean startingIndex?"),
    ("minOffsetsPerTrigger", "did you mean minEntriesPerTrigger?"),
    ("maxOffsetsPerTrigger", "did you mean maxEntriesPerTrigger?"),
    ("subscribe", "did you mean group (or groups)?"),
    ("assign", "did you mean groups"),
    ("topic", "did you mean group?"),
    ("kafka.bootstrap.servers", "did you mean peers (or controller and brokers"),
    ("includeHeaders", "no key and no headers: carry them inside the body"),
    ("subscribePattern", "groups are named, not matched"),
    ("groupIdPrefix", "no consumer group"),
    ("kafka.group.id", "no consumer group"),
    ("startingOffsetsByTimestamp", "entries carry no timestamp"),
    ("endingTimestamp", "entries carry no timestamp"),
    ("kafka.ssl.truststore.location", "did you mean tlsDir"),
    ("kafka.sasl.mechanism", "did you mean authToken?"),
    ("kafka.max.poll.records", "a Kafka client setting"),
    ("KAFKA.Group.Id", "no consumer group"),  # names are matched case-insensitively, as Spark does
])
def test_kafka_option_names_get_ours_or_a_reason(name: str, said: str) -> None:
    msg = _refused(name)
    assert said in msg and repr(name) in msg
    assert "valid options are" in msg


def test_our_new_options_pass_and_unknown_names_stay_refused() -> None:
    check_names({"peers": P, "minEntriesPerTrigger": "5", "maxTriggerDelay": "1m", "includeTimestamp": "true"},
                READ_OPTIONS, "dledger")
    assert "did you mean" not in _refused("nonsense")


def test_durations_read_as_spark_time_strings() -> None:
    def d(raw: str) -> float:
        return get_duration({"maxTriggerDelay": raw}, "maxTriggerDelay", 900.0)

    assert get_duration({}, "maxTriggerDelay", 900.0) == 900.0
    assert (d("15m"), d("30s"), d("500ms"), d("2h"), d("1d"), d("250"), d(" 2 min ")) == \
        (900.0, 30.0, 0.5, 7200.0, 86400.0, 0.25, 120.0)
    for bad in ("soon", "5 weeks", "-1s", "nan s", "inf"):
        with pytest.raises(OptionError, match="maxTriggerDelay"):
            d(bad)


def test_trigger_options_are_checked_together() -> None:
    with pytest.raises(OptionError, match="above maxEntriesPerTrigger"):
        ReadConfig.from_options({"peers": P, "minEntriesPerTrigger": "10", "maxEntriesPerTrigger": "5"}, True)
    with pytest.raises(OptionError, match="with minEntriesPerTrigger only"):
        ReadConfig.from_options({"peers": P, "maxTriggerDelay": "1m"}, True)
    cfg = ReadConfig.from_options({"peers": P, "minEntriesPerTrigger": "10"}, True)
    assert (cfg.min_entries_per_trigger, cfg.max_trigger_delay) == (10, 900.0)  # Kafka's default: 15m


def test_hold_back() -> None:
    assert hold_back(5, 10, 1.0, 60.0)
    assert not hold_back(5, 10, 61.0, 60.0)  # the delay passed: whatever is there
    assert not hold_back(10, 10, 1.0, 60.0)
    assert not hold_back(0, 10, 999.0, 60.0)  # nothing new: never (there is no batch anyway)
    assert not hold_back(5, None, 1.0, 60.0)


class _Log:
    """A fake log view the reader asks: (begin, readable end)."""

    def __init__(self, end: int) -> None:
        self.end = end

    def view(self, group: str) -> tuple[int, int]:
        return 0, self.end


def _reader(monkeypatch: pytest.MonkeyPatch, log: _Log, columns: Columns | None = None,
            **options: str) -> DLedgerStreamReader:
    r = DLedgerStreamReader(ReadConfig.from_options({"peers": P, **options}, streaming=True), columns)
    monkeypatch.setattr(r, "_view", log.view)
    monkeypatch.setattr(r, "_controls", lambda group, start, end: ())  # no control records (no group to ask)
    return r


def test_min_entries_wait_for_more_or_for_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log(105)
    r = _reader(monkeypatch, log, minEntriesPerTrigger="10", maxTriggerDelay="1h")
    limit = r.getDefaultReadLimit()
    assert limit == ReadMinRows(10)
    assert r.latestOffset({"default": 100}, limit) == {"default": 100}  # 5 < 10: no micro-batch
    assert r.reportLatestOffset() == {"default": 105}  # the progress still shows how far the log is
    log.end = 112
    assert r.latestOffset({"default": 100}, limit) == {"default": 112}
    log.end = 115
    assert r.latestOffset({"default": 112}, limit) == {"default": 112}
    r._last_batch = time.monotonic() - 3601  # an hour since the last micro-batch: maxTriggerDelay passed
    assert r.latestOffset({"default": 112}, limit) == {"default": 115}
    assert r.latestOffset({"default": 115}, limit) == {"default": 115}  # nothing new: nothing either way
    log.end = 116
    assert r.latestOffset({"default": 115}, ReadAllAvailable()) == {"default": 116}  # Spark's override (Once)
    r._target = {"default": 118}  # Trigger.AvailableNow must end: no waiting for a minimum
    log.end = 118
    assert r.latestOffset({"default": 116}, limit) == {"default": 118}


def test_min_with_max_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log(1000)
    r = _reader(monkeypatch, log, minEntriesPerTrigger="50", maxEntriesPerTrigger="300")
    assert r.getDefaultReadLimit() == ReadMaxRows(300)  # the minimum rides along, from the options
    assert r.latestOffset({"default": 100}, ReadMaxRows(300)) == {"default": 400}
    assert r.latestOffset({"default": 970}, ReadMaxRows(300)) == {"default": 970}  # 30 < 50
    assert r.latestOffset({"default": 970}, ReadAllAvailable()) == {"default": 1000}


def test_report_latest_offset_is_the_log_end_under_available_now(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _reader(monkeypatch, _Log(1000), maxEntriesPerTrigger="100")
    r._target = {"default": 500}
    assert r.latestOffset({"default": 0}, ReadMaxRows(100)) == {"default": 100}
    assert r.reportLatestOffset() == {"default": 1000}


def _with_timestamp() -> Columns:
    return Columns.of(StructType([StructField("index", LongType()), StructField("timestamp", TimestampType())]))


def test_timestamp_is_kept_in_the_offsets_for_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log(10)
    r = _reader(monkeypatch, log, _with_timestamp())
    end = r.latestOffset({"default": 0}, ReadAllAvailable())
    assert end["default"] == 10 and abs(end[PLANNED_AT] - time.time() * 1000) < 3_600_000
    assert r.latestOffset(end, ReadAllAvailable()) == end  # nothing new: the same offset, no empty batch
    parts = r.partitions({"default": 0}, end)
    assert parts and all(p.planned_ms == end[PLANNED_AT] for p in parts)  # type: ignore[attr-defined]
    # a replay plans from the offset log: the same time, whenever it runs
    assert [p.planned_ms for p in r.partitions({"default": 0}, dict(end))] == [end[PLANNED_AT]] * len(parts)  # type: ignore[attr-defined]
    plain = _reader(monkeypatch, log)
    assert PLANNED_AT not in plain.latestOffset({"default": 0}, ReadAllAvailable())  # offsets as before


def test_timestamp_column_values() -> None:
    cols = _with_timestamp()
    batch = entry_batch("g", [3, 4], [1, 1], [0, 64], [b"a", b"b"])
    assert batch.schema == ARROW_ENTRY_SCHEMA
    out = cols.project(batch, 1_700_000_000_123)
    assert out.schema.names == ["index", "timestamp"]
    assert out.column(1).type == pa.timestamp("us", tz="UTC")
    assert out.column(1).to_pylist()[0].timestamp() == 1_700_000_000.123
    assert len(set(out.column(1).to_pylist())) == 1


def test_include_timestamp_adds_the_column_to_the_schema() -> None:
    assert DLedgerDataSource({"peers": P}).schema().endswith("body binary")
    assert DLedgerDataSource({"peers": P, "includeTimestamp": "true"}).schema().endswith(", timestamp timestamp")


def _progress(end: object, latest: object) -> dict[str, object]:
    return {"sources": [{"description": "x", "startOffset": None, "endOffset": end, "latestOffset": latest}]}


def test_entries_behind_latest_from_a_progress() -> None:
    p = _progress(json.dumps({"a": 100, "b": 40, PLANNED_AT: 5}), json.dumps({"a": 130, "b": 40}))
    assert entries_behind_latest(p) == {"a": 30, "b": 0}
    assert lag_metrics(p) == {"minEntriesBehindLatest": 0, "maxEntriesBehindLatest": 30,
                              "avgEntriesBehindLatest": 15.0}
    assert entries_behind_latest(_progress({"a": 1}, {"a": 4})) == {"a": 3}  # parsed JSON too
    kafka = _progress(json.dumps({"t": {"0": 5}}), json.dumps({"t": {"0": 9}}))
    assert entries_behind_latest(kafka) == {} and lag_metrics(kafka) == {}  # another source's offsets
    assert lag_metrics(_progress(None, "null")) == {} and lag_metrics({}) == {}


def test_the_files_format_gives_no_kafka_hint() -> None:
    from dledger.spark.options import FILES_OPTIONS

    with pytest.raises(OptionError) as e:
        check_names({"path": "x", "startingOffsets": "earliest"}, FILES_OPTIONS, "dledger-files")
    assert "did you mean" not in str(e.value) and "valid options are" in str(e.value)


def test_include_timestamp_is_a_boolean_and_kept_with_write_options() -> None:
    with pytest.raises(OptionError, match="includeTimestamp"):
        DLedgerDataSource({"peers": P, "includeTimestamp": "sometimes"}).schema()
    # a temporary view serving reads and INSERTs alike
    view = DLedgerDataSource({"peers": P, "includeTimestamp": "true", "batchSize": "100"})
    assert view.schema().endswith(", timestamp timestamp")
