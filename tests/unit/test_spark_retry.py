"""spark.retry: each request's own deadline, what ends it early, and what it waits out."""

from __future__ import annotations

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.spark import retry
from dledger.spark.retry import Retry

REFUSED = DLedgerError(ResponseCode.NETWORK_ERROR, "connect to 127.0.0.1:1 failed: connection refused")


def test_an_error_retrying_cannot_mend_raises_at_once_with_its_hint() -> None:
    attempt = Retry("group g: read at index 5", 60.0)
    with pytest.raises(DLedgerError, match=r"UNKNOWN_GROUP \(400\): group g: read at index 5: n0: no group "
                                           r"'g' here; the members named by `peers` serve no group") as e:
        attempt.failed(DLedgerError(ResponseCode.UNKNOWN_GROUP, "n0: no group 'g' here"))
    assert e.value.code == ResponseCode.UNKNOWN_GROUP
    assert attempt.attempts == 0


def test_a_transient_error_is_retried_until_the_request_deadline() -> None:
    attempt = Retry("group g: append of 3 entries", 0.3, "writeTimeoutSeconds")
    with pytest.raises(DLedgerError, match=r"TIMEOUT \(300\): group g: append of 3 entries: still failing after "
                                           r"\d+ s and \d+ attempts \(option writeTimeoutSeconds = 0.3 s\): no reply"):
        while True:
            attempt.failed(DLedgerError(ResponseCode.TIMEOUT, "no reply"))
    assert attempt.attempts >= 2


def test_each_request_gets_the_whole_deadline() -> None:
    """A request made late (a task that read for long) starts its own clock."""
    first = Retry("read at 0", 0.2)
    first.failed(DLedgerError(ResponseCode.NOT_LEADER, "n1 leads"))
    later = Retry("read at 2000", 0.2)
    assert later.started >= first.started
    later.failed(DLedgerError(ResponseCode.NOT_LEADER, "n1 leads"))  # backs off, does not raise
    assert later.attempts == 1


def test_every_member_refusing_connections_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "UNREACHABLE_S", 0.2)
    attempt = Retry("group g: asking the leader", 120.0, probe=lambda: "n0 at 127.0.0.1:1: refused")
    with pytest.raises(DLedgerError, match=r"no member is reachable .*tried n0 at 127.0.0.1:1: refused.*"
                                           r"check the option `peers`"):
        while True:
            attempt.failed(REFUSED)


def test_a_member_that_answers_keeps_the_request_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """An election (members answer, none leads): only the deadline ends it."""
    monkeypatch.setattr(retry, "UNREACHABLE_S", 0.05)
    attempt = Retry("group g: asking the leader", 0.5, probe=lambda: None)
    with pytest.raises(DLedgerError, match=r"still failing after"):
        while True:
            attempt.failed(REFUSED)


def test_waiting_for_data_ends_at_the_deadline_with_why() -> None:
    attempt = Retry("group g: read at 10", 0.2)
    with pytest.raises(DLedgerError, match=r"TIMEOUT \(300\): .*still failing.*leader n0 has committed up to 8"):
        while True:
            attempt.wait("leader n0 has committed up to 8")
