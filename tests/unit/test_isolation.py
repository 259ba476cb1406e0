"""read_committed's visibility from session markers (spark.isolation), on a stand-in log:
the last stable index, aborted and timed-out transactions, control records."""

from __future__ import annotations

import logging

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.core.producers import Run, marker_body
from dledger.runtime.client import Entry

pytest.importorskip("pyarrow")

import pyarrow as pa

from dledger.spark import isolation
from dledger.spark.isolation import (
    ABORT,
    BACK_SCAN,
    COMMIT,
    ControlCursor,
    Visibility,
    controls,
    drop_hidden,
    producer_id,
    scan,
)

JOB, OTHER = "w.aaaa.t10", "v.bbbb.t10"  # timeouts of 10 s


class Log:
    """A log of writes, each a marker then its entries: (ts_ms, runs)."""

    def __init__(self) -> None:
        self.markers: list[Entry] = []
        self.end = -1

    def write(self, ts_ms: int, *runs: tuple[str, int], owner: str = "") -> list[int]:
        """A marker and the runs' entries (appended by `owner`): their indexes."""
        at = self.end + 1
        self.markers.append(Entry(at, 1, 0, marker_body(ts_ms, [Run(p, 0, n, 0, owner) for p, n in runs]), 4))
        self.end = at + sum(n for _, n in runs)
        return list(range(at + 1, self.end + 1))

    def plain(self, n: int) -> list[int]:
        first = self.end + 1
        self.end += n
        return list(range(first, self.end + 1))

    def read_markers(self, index: int, max_entries: int = 1000, member: str | None = None
                     ) -> tuple[list[Entry], int, int]:
        found = [m for m in self.markers if m.index >= index][:max_entries]
        return found, self.end + 1, self.end


class ClosingLog(Log):
    closed = False

    def close(self) -> None:
        self.closed = True


def vis(log: Log, start: int = 0) -> Visibility:
    return scan(log, start, log.end + 1, 0.0)  # type: ignore[arg-type]


def test_an_open_transaction_is_the_last_stable_index_and_a_commit_shows_it() -> None:
    log = Log()
    before = log.plain(3)
    rows = log.write(1000, (producer_id(JOB, "p0"), 5))
    log.write(1500, ("plain-idempotent", 2))
    assert vis(log).end == rows[0] and before[-1] < rows[0]
    commit = log.write(2000, (producer_id(JOB, COMMIT), 1))
    v = vis(log)
    assert v.end == log.end + 1 and v.hidden == ((commit[0], commit[0]),)


def test_aborted_and_timed_out_transactions_are_hidden() -> None:
    log = Log()
    aborted = log.write(1000, (producer_id(JOB, "p0"), 3), ("x", 1), (producer_id(OTHER, "p1"), 2))
    log.write(2000, (producer_id(JOB, ABORT), 1))
    v = vis(log)
    assert v.end == aborted[4]  # OTHER is still open: nothing from its first entry on
    assert v.within(0, v.end) == ((aborted[0], aborted[2]),)
    log.write(1000 + 10_001, ("x", 1))  # the log's clock passes OTHER's timeout: aborted
    v = vis(log)
    assert v.end == log.end + 1
    assert (aborted[4], aborted[5]) in v.hidden and (aborted[0], aborted[2]) in v.hidden
    assert not any(a <= aborted[3] <= b for a, b in v.hidden)  # the plain entry between them is shown


def test_a_commit_later_than_the_timeout_counts_as_an_abort() -> None:
    log = Log()
    rows = log.write(1000, (producer_id(JOB, "p0"), 2))
    log.write(1000 + 10_001, (producer_id(JOB, COMMIT), 1))
    assert (rows[0], rows[1]) in vis(log).hidden


def test_drop_hidden_filters_by_index() -> None:
    batch = pa.record_batch({"index": pa.array(range(10), pa.int64())})
    kept = drop_hidden(batch, [(2, 3), (7, 7), (20, 30)])
    assert kept.column("index").to_pylist() == [0, 1, 4, 5, 6, 8, 9]


def test_a_control_record_by_another_principal_is_ignored() -> None:
    log = Log()
    rows = log.write(1000, (producer_id(JOB, "p0"), 2), owner="writer")
    log.write(1100, (producer_id(JOB, COMMIT), 1), owner="intruder")
    assert vis(log).end == rows[0]  # still open
    log.write(1200, (producer_id(JOB, ABORT), 1), owner="writer")
    assert (rows[0], rows[1]) in vis(log).hidden


def test_read_uncommitted_hides_only_the_control_records_of_its_range() -> None:
    log = ClosingLog()
    first = log.write(1000, (producer_id(JOB, "p0"), 3))
    abort = log.write(1100, (producer_id(JOB, ABORT), 1))
    rows = log.write(1200, (producer_id(OTHER, "p0"), 2), ("plain", 1))  # OTHER still open: shown anyway
    commit = log.write(1300, (producer_id(OTHER, COMMIT), 1))
    assert controls(log, 0, log.end + 1, 1.0) == ((abort[0], abort[0]), (commit[0], commit[0]))  # type: ignore[arg-type]
    assert log.closed
    # a range that starts after a control record's marker still finds it; one that ends before does not
    assert controls(log, commit[0], log.end + 1, 1.0) == ((commit[0], commit[0]),)  # type: ignore[arg-type]
    assert controls(log, first[0], rows[-1] + 1, 1.0) == ((abort[0], abort[0]),)  # type: ignore[arg-type]
    assert controls(log, rows[0], rows[-1] + 1, 1.0) == ()  # type: ignore[arg-type]


def test_plain_writes_markers_move_the_log_clock_past_a_timeout() -> None:
    log = Log()
    rows = log.write(1000, (producer_id(JOB, "p0"), 2))
    log.write(1000 + 10_001, ("plain-idempotent", 1))  # no transaction: its time still counts
    v = vis(log)
    assert v.end == log.end + 1 and (rows[0], rows[-1]) in v.hidden


def test_members_without_markers_only_reads_show_control_records_rather_than_fail(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    class OldMembers(ClosingLog):
        def read_markers(self, index: int, max_entries: int = 1000, member: str | None = None
                         ) -> tuple[list[Entry], int, int]:
            raise DLedgerError(ResponseCode.UNSUPPORTED, "the member does not serve markers-only reads")

    log = OldMembers()
    log.write(1000, (producer_id(JOB, COMMIT), 1))
    monkeypatch.setattr(isolation, "_told_unsupported", False)
    with caplog.at_level(logging.DEBUG, logger="dledger.spark.isolation"):
        for _ in range(3):  # a stream's triggers: warned once
            assert controls(log, 0, log.end + 1, 1.0) == ()  # type: ignore[arg-type]
    assert log.closed
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_a_stream_resumes_its_control_scan_where_the_last_batch_ended() -> None:
    """Batches [0, a), [a, b), ...: the second reads markers from a only (no back scan), and a
    control record named by a marker of the first batch but lying in the second is still found."""

    class Counting(ClosingLog):
        asked: list[int] = []

        def read_markers(self, index: int, max_entries: int = 1000, member: str | None = None
                         ) -> tuple[list[Entry], int, int]:
            self.asked.append(index)
            return super().read_markers(index, max_entries, member)

    log = Counting()
    log.plain(200_000)
    spans = log.write(1000, (producer_id(JOB, "p0"), 2), (producer_id(JOB, COMMIT), 1))  # marker, rows, commit
    cut = spans[1] + 1  # the first batch ends just before the commit record
    later = log.write(2000, (producer_id(OTHER, ABORT), 1))
    cursor = ControlCursor()
    assert controls(log, 190_000, cut, 1.0, cursor) == ()  # type: ignore[arg-type]
    assert log.asked[0] == 190_000 - BACK_SCAN
    log.asked.clear()
    assert controls(log, cut, log.end + 1, 1.0, cursor) == ((spans[2], spans[2]), (later[0], later[0]))  # type: ignore[arg-type]
    assert log.asked and min(log.asked) >= cut  # no back scan
    # a replayed batch (not where the cursor is) scans back again, and finds the same
    log.asked.clear()
    assert controls(log, cut, log.end + 1, 1.0, cursor) == ((spans[2], spans[2]), (later[0], later[0]))  # type: ignore[arg-type]
    assert min(log.asked) == cut - BACK_SCAN
