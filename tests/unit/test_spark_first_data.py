"""spark.online.first_data_index when the log begin passes the index asked for between the
driver's view and the read (retention, `dledger compact`, another member answering): the
failOnDataLoss rule decides, as for the view itself, instead of a non-retryable error."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.spark.online import DataLossError, first_data_index


@dataclass
class _Found:
    index: int


@dataclass
class _View:
    ledger_begin_index: int
    role: str = "leader"
    self_id: str = "n0"


class _CompactedLeader:
    """A stand-in client (read, metadata): its log begins at `begin`, data at `data`."""

    peers: dict[str, object] = {}

    def __init__(self, begin: int, data: int) -> None:
        self.begin, self.data = begin, data
        self.reads: list[int] = []

    def read(self, start: int, n: int, bodies: bool = True) -> list[_Found]:
        self.reads.append(start)
        if start < self.begin:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                               f"index {start} is before the log begin {self.begin}")
        return [_Found(max(start, self.data))]

    def metadata(self) -> _View:
        return _View(self.begin)

    def metadata_all(self) -> dict[str, object]:
        return {}


def test_a_moved_begin_is_data_loss_when_failing_on_it() -> None:
    c = _CompactedLeader(500, 510)
    with pytest.raises(DataLossError, match=r"group g: the query is at index 100 but the log now begins at 500.*"
                                            r"set failOnDataLoss=false"):
        first_data_index(c, "g", 100, timeout=5.0, fail_on_data_loss=True)  # type: ignore[arg-type]


def test_a_moved_begin_is_skipped_without_failing_on_data_loss() -> None:
    c = _CompactedLeader(500, 510)
    assert first_data_index(c, "g", 100, timeout=5.0, fail_on_data_loss=False) == 510  # type: ignore[arg-type]
    assert c.reads == [100, 500]


def test_a_member_beginning_later_than_the_leader_says_still_moves_on() -> None:
    """The member that refused may begin later than the leader's view says: each round moves
    past the index refused, so the search ends."""
    c = _CompactedLeader(500, 510)
    c.metadata = lambda: _View(50)  # type: ignore[method-assign]
    assert first_data_index(c, "g", 100, timeout=5.0, fail_on_data_loss=False) == 510  # type: ignore[arg-type]
    assert c.reads[:3] == [100, 101, 102] and c.reads[-1] == 500
