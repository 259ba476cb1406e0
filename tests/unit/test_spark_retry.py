"""spark.retry: each request's own deadline, what ends it early, and what it waits out."""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Iterator

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime import client as client_mod
from dledger.runtime.client import DLedgerClient, never_sent, refused
from dledger.runtime.transport_client import REFUSED as REFUSED_MARK
from dledger.runtime.transport_client import TransportClient, _is_refusal
from dledger.spark import retry
from dledger.spark.retry import Retry, nobody_listens

REFUSED = DLedgerError(ResponseCode.NETWORK_ERROR, f"connect to 127.0.0.1:1 failed, {REFUSED_MARK}: "
                                                   "ConnectionRefusedError(111, 'Connect call failed')")


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


def test_only_a_refused_connection_counts_as_nothing_listening() -> None:
    """A connect timeout (a partition, a stalled member's handshake) or a TLS failure never
    sent the request either (never_sent: the client may resend anything), but a member may be
    there: only ECONNREFUSED means nothing listens."""
    timeout = DLedgerError(ResponseCode.NETWORK_ERROR, "connect to 10.0.0.1:20911 failed: TimeoutError()")
    tls = DLedgerError(ResponseCode.NETWORK_ERROR, "connect to 10.0.0.1:20911 failed: SSLError(1, 'bad handshake')")
    backoff = DLedgerError(ResponseCode.NETWORK_ERROR, "10.0.0.1:20911 unreachable, in backoff after a failed connect")
    for e in (timeout, tls, backoff):
        assert never_sent(e) and not refused(e), e
    assert refused(REFUSED) and never_sent(REFUSED)
    assert refused(DLedgerError(ResponseCode.NETWORK_ERROR, "10.0.0.1:20911 unreachable, in backoff after a "
                                                            f"failed connect, {REFUSED_MARK}"))
    # the leader search's summary counts only when every member refused
    mixed = DLedgerError(ResponseCode.NETWORK_ERROR, "connect to every member failed: no member accepts connections "
                                                     f"(n0: {REFUSED.message}; n1: {timeout.message})")
    assert never_sent(mixed) and not refused(mixed)
    # asyncio joins the errors of several addresses of one name into one OSError
    assert _is_refusal(ConnectionRefusedError(111, "Connect call failed"))
    assert _is_refusal(OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 1), "
                               "[Errno 111] Connect call failed ('127.0.0.1', 1)"))
    assert not _is_refusal(OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 1), "
                                   "[Errno 110] Connect call failed ('127.0.0.1', 1)"))
    assert not _is_refusal(TimeoutError())


@pytest.fixture
def silent_member() -> Iterator[str]:
    """A member that accepts connections and never answers (its event loop stalled)."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


def _until_it_fails(client: DLedgerClient, attempt: Retry) -> DLedgerError:
    while True:
        try:
            client.metadata("n0")
        except DLedgerError as e:
            try:
                attempt.failed(e)
            except DLedgerError as final:
                return final


def test_a_stalled_member_is_waited_out_and_a_refusing_one_fails_fast(monkeypatch: pytest.MonkeyPatch,
                                                                       silent_member: str) -> None:
    """Over real connections: a member whose token exchange never completes (the connect times
    out) is waited for until the request's deadline; a port nobody listens on fails in
    UNREACHABLE_S, long before it."""
    monkeypatch.setattr(retry, "UNREACHABLE_S", 0.2)
    monkeypatch.setattr(retry, "MAX_DELAY_S", 0.1)
    # connects time out well within the request's timeout: every attempt fails connecting
    monkeypatch.setattr(client_mod, "TransportClient", functools.partial(TransportClient, connect_timeout_s=0.2))
    with DLedgerClient(f"n0-{silent_member}", "g", timeout=5.0, auth_token="t") as client:
        attempt = Retry("group g: asking the leader", 2.0, probe=nobody_listens(client))
        final = _until_it_fails(client, attempt)
    # (each attempt failed connecting: the connect itself, or its back-off)
    assert final.code == ResponseCode.NETWORK_ERROR, final
    assert "failed connect" in final.message or "connect to" in final.message, final
    assert "still failing after" in final.message and "every connection refused" not in final.message, final
    assert attempt.attempts >= 3  # (UNREACHABLE_S passed many times over)
    with DLedgerClient(f"n0-127.0.0.1:{_closed_port()}", "g", timeout=5.0) as client:
        attempt = Retry("group g: asking the leader", 120.0, probe=nobody_listens(client))
        final = _until_it_fails(client, attempt)
    assert "every connection refused" in final.message, final
    assert attempt.attempts < 100
