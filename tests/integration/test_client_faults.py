"""The client against members that die, never answer or are not there, over real TCP.

A peer that accepts an append and drops the connection before answering may or may
not have stored it: the client must report NETWORK_ERROR and must not send it again
(a retry could store the entry twice, as a leader killed mid-append showed). Where no
member listens the client says so at once; a closed client refuses every request instead
of connecting again."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.ports import free_ports
from dledger.runtime.client import AsyncDLedgerClient, DLedgerClient

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


def test_no_member_listening_fails_fast_naming_every_member() -> None:
    """Nothing listens on any member's port: the client says so after one round of
    connection attempts, naming each member, instead of retrying until its timeout."""
    ports = free_ports(3)
    peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(ports))
    started = time.monotonic()
    with DLedgerClient(peers, "g", timeout=120.0) as c, pytest.raises(DLedgerError) as err:
        c.append(b"nobody home")
    elapsed = time.monotonic() - started
    assert err.value.code == ResponseCode.NETWORK_ERROR, err.value
    assert "no member accepts connections" in err.value.message, err.value
    for k, port in enumerate(ports):
        assert f"n{k}: connect to 127.0.0.1:{port}" in err.value.message, err.value
    assert elapsed < 60, f"took {elapsed:.0f} s of its 120 s timeout"  # generous: it is about a second


def test_request_timeout_is_capped_by_the_timeout() -> None:
    """No single request outlives the call's `timeout` (else a short timeout would wait a
    whole request timeout on a member that never answers)."""
    peers = "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"
    assert AsyncDLedgerClient(peers, timeout=2.0).request_timeout <= 2.0
    assert AsyncDLedgerClient(peers, timeout=2.0, request_timeout=30.0).request_timeout == 2.0
    assert AsyncDLedgerClient(peers, timeout=60.0, request_timeout=1.5).request_timeout == 1.5
    c = DLedgerClient(peers, timeout=2.0)  # the blocking client passes its timeout on
    try:
        assert c._async.request_timeout <= 2.0
    finally:
        c.close()


@contextmanager
def silent_members(n: int) -> Iterator[tuple[str, list[socket.socket]]]:
    """n members that accept connections and never answer (a hung process's kernel does
    the same); yields the peers string and the connections accepted so far."""
    listeners = []
    accepted: list[socket.socket] = []
    stop = threading.Event()
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        s.settimeout(0.1)
        listeners.append(s)

    def accept() -> None:
        while not stop.is_set():
            for s in listeners:
                with suppress(TimeoutError):
                    accepted.append(s.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield ";".join(f"n{k}-127.0.0.1:{s.getsockname()[1]}" for k, s in enumerate(listeners)), accepted
    finally:
        stop.set()
        t.join(timeout=10)
        for s in [*listeners, *accepted]:
            s.close()


def test_a_closed_async_client_refuses_every_request() -> None:
    """After close() every request raises "this client is closed" (as the blocking client
    does), a subscription in flight included, and none opens a connection again: it would
    wait out the timeout on members that never answer."""
    with silent_members(3) as (peers, accepted):
        async def main() -> None:
            c = AsyncDLedgerClient(peers, "g", timeout=60.0)

            async def first_entry() -> object:
                async for e in c.subscribe(0, wait=1.0):
                    return e
                return None

            follower = asyncio.create_task(first_entry())
            for _ in range(200):  # until its leader search reached the members
                if accepted:
                    break
                await asyncio.sleep(0.05)
            assert accepted and not follower.done()
            await c.close()
            async with asyncio.timeout(30):  # generous: it ends at once; before, never
                with pytest.raises(DLedgerError, match="this client is closed") as err:
                    await follower
            assert err.value.code == ResponseCode.UNEXPECTED_ARGUMENT
            connections = len(accepted)
            await c.close()  # again: nothing happens

            calls: dict[str, Callable[[], Awaitable[object]]] = {
                "append": lambda: c.append(b"x"),
                "append_batch": lambda: c.append_batch([b"x"]),
                "propose": lambda: c.propose(b"x"),
                "propose_batch": lambda: c.propose_batch([b"x"]),
                "query": lambda: c.query(b"q"),
                "snapshot": lambda: c.snapshot("n0"),
                "get": lambda: c.get(0),
                "get from a member": lambda: c.get(0, member="n1"),
                "read": lambda: c.read(0),
                "metadata": lambda: c.metadata(),
                "metadata of a member": lambda: c.metadata("n2"),
                "metadata_all": lambda: c.metadata_all(),
                "transfer_leadership": lambda: c.transfer_leadership("n1"),
                "inject_faults": lambda: c.inject_faults("n0", []),
                "subscribe": lambda: anext(c.subscribe(0)),
            }
            for name, call in calls.items():
                async with asyncio.timeout(30):
                    with pytest.raises(DLedgerError, match="this client is closed") as err:
                        await call()
                assert err.value.code == ResponseCode.UNEXPECTED_ARGUMENT, name
            assert len(accepted) == connections, "a closed client connected again"

        asyncio.run(main())


def test_a_blocking_client_closed_from_another_thread_ends_its_calls() -> None:
    """close() from one thread while others wait (a get between retries, a subscription):
    they end with "this client is closed", never hang on a loop that stopped under them."""
    with silent_members(3) as (peers, accepted):
        c = DLedgerClient(peers, "g", timeout=60.0)
        results: dict[str, str] = {}

        def call(name: str, fn: Callable[[], object]) -> None:
            try:
                fn()
                results[name] = "returned"
            except DLedgerError as e:
                results[name] = e.message

        threads = [threading.Thread(target=call, args=("get", lambda: c.get(1)), daemon=True),
                   threading.Thread(target=call, args=("subscribe", lambda: next(iter(c.subscribe(0)))), daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not accepted and time.monotonic() < deadline:  # until they reached the members
            time.sleep(0.05)
        c.close()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), f"a call hung after close: {results}"
        assert results == {"get": "this client is closed", "subscribe": "this client is closed"}, results
