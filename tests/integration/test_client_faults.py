"""The client against a member that dies with a request in flight, over real TCP.

A peer that accepts an append and drops the connection before answering may or may
not have stored it: the client must report NETWORK_ERROR and must not send it again
(a retry could store the entry twice, as a leader killed mid-append showed)."""

from __future__ import annotations

import socket
import threading

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import DLedgerClient

pytestmark = pytest.mark.integration


def test_append_is_not_resent_after_the_connection_is_lost() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        requests: list[bytes] = []
        stop = threading.Event()

        def member_that_dies_after_reading() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(5)
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        continue
                    if data:
                        requests.append(data)
                    # close without answering, as a member killed after reading the request

        t = threading.Thread(target=member_that_dies_after_reading, daemon=True)
        t.start()
        try:
            with DLedgerClient(f"n0-127.0.0.1:{port}", "g", timeout=2.0) as c, pytest.raises(DLedgerError) as err:
                c.append(b"maybe-stored")
        finally:
            stop.set()
            t.join(timeout=10)
    assert err.value.code == ResponseCode.NETWORK_ERROR, err.value
    assert len(requests) == 1, f"the append was sent {len(requests)} times"
