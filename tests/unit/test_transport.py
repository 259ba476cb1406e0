"""Transport tests over real loopback sockets (plus the decoder and the send gate in isolation).

Every test binds 127.0.0.1 port 0 and never asserts on elapsed time: waits that depend on
the machine are deadline loops that only bound how long a failure takes to show.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import random
import struct
import tracemalloc
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import msgspec
import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.runtime.transport import (
    HEADER_SIZE,
    KIND_REQUEST,
    KIND_RESPONSE,
    Caller,
    FaultInjector,
    FrameDecoder,
    FrameError,
    Message,
    Respond,
    TransportClient,
    TransportServer,
    encode_frame,
    install_uvloop,
)
from dledger.runtime.transport_client import _ClientConnection

T = TypeVar("T")
Handler = Callable[[Message], Awaitable[Message]]
LOOPS = ["asyncio", "uvloop"]
_HEADER = struct.Struct(">IBQiI")


def run(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """asyncio.run with a hard cap, so a hang fails the test instead of stalling the suite."""
    factory = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(asyncio.wait_for(coro, 15))


async def echo(msg: Message) -> Message:
    return Message(ResponseCode.SUCCESS, msg.meta, msg.data)


async def start_server(handler: Handler = echo, **kwargs: Any) -> TransportServer:
    server = TransportServer(handler, **kwargs)
    await server.start("127.0.0.1", 0)
    return server


async def request_until_ok(client: TransportClient, address: str, msg: Message, deadline_s: float = 10) -> Message:
    """Retry through transient NETWORK_ERROR / TIMEOUT; the deadline only bounds a failure."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        try:
            return await client.request(address, msg, timeout=2)
        except DLedgerError as e:
            if e.code not in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT) or loop.time() > end:
                raise
        await asyncio.sleep(0.02)


async def eventually(cond: Callable[[], bool], deadline_s: float = 5) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


def error_text(msg: Message) -> str:
    decoded = msgspec.msgpack.decode(msg.meta, type=dict[str, str])
    return decoded["error"]


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before closing; a reset counts as closed."""
    out = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            out += chunk
    except ConnectionError:
        pass
    return out


class Proxy:
    """A TCP relay the test can cut, to kill connections without touching either end."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def kill(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.kill()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


# ---------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("loop", LOOPS)
def test_round_trip_with_meta_and_1mib_data(loop: str) -> None:
    blob = random.randbytes(1 << 20)

    async def handler(msg: Message) -> Message:
        term = msgspec.msgpack.decode(msg.meta, type=dict[str, int])["term"]
        meta = msgspec.msgpack.encode({"term": term, "len": len(msg.data)})
        return Message(ResponseCode.SUCCESS, meta, bytes(msg.data)[::-1])

    async def main() -> tuple[Message, Message]:
        server = await start_server(handler)
        client = TransportClient()
        try:
            big = await client.request(
                server.address,
                Message(RequestCode.PUSH, msgspec.msgpack.encode({"term": 7}), memoryview(blob)),
                timeout=5,
            )
            small = await client.request(
                server.address, Message(RequestCode.HEART_BEAT, msgspec.msgpack.encode({"term": 8})), timeout=5
            )
            return big, small
        finally:
            await client.close()
            await server.close()

    big, small = run(main(), loop)
    assert big.code == ResponseCode.SUCCESS
    assert msgspec.msgpack.decode(big.meta) == {"term": 7, "len": 1 << 20}
    assert bytes(big.data) == blob[::-1]
    assert msgspec.msgpack.decode(small.meta) == {"term": 8, "len": 0}
    assert bytes(small.data) == b""


@pytest.mark.parametrize("loop", LOOPS)
def test_1000_concurrent_requests_share_one_connection_and_match_out_of_order(loop: str) -> None:
    completed: list[int] = []

    async def handler(msg: Message) -> Message:
        await asyncio.sleep(random.random() * 0.02)
        n = int.from_bytes(msg.meta, "big")
        completed.append(n)
        return Message(ResponseCode.SUCCESS, msg.meta, bytes(msg.data) * 2)

    async def main() -> tuple[list[Message], int]:
        server = await start_server(handler)
        client = TransportClient()
        try:
            # All start before any connection exists: they must share one connect attempt.
            results = await asyncio.gather(
                *(
                    client.request(
                        server.address, Message(RequestCode.APPEND, i.to_bytes(4, "big"), f"req-{i}".encode()), 10
                    )
                    for i in range(1000)
                )
            )
            return results, server.connection_count
        finally:
            await client.close()
            await server.close()

    results, connections = run(main(), loop)
    assert connections == 1
    for i, resp in enumerate(results):
        assert resp.code == ResponseCode.SUCCESS
        assert resp.meta == i.to_bytes(4, "big")
        assert bytes(resp.data) == f"req-{i}".encode() * 2
    assert sorted(completed) == list(range(1000))
    assert completed != sorted(completed), "handlers were expected to finish out of order"


def test_handler_errors_become_responses() -> None:
    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.APPEND:
            raise DLedgerError(ResponseCode.NOT_LEADER, "leader is n1")
        if msg.code == RequestCode.GET:
            raise ValueError("boom")
        return await echo(msg)

    async def main() -> tuple[Message, Message, Message]:
        server = await start_server(handler)
        client = TransportClient()
        try:
            not_leader = await client.request(server.address, Message(RequestCode.APPEND), 5)
            internal = await client.request(server.address, Message(RequestCode.GET), 5)
            ok = await client.request(server.address, Message(RequestCode.METADATA, b"m"), 5)
            return not_leader, internal, ok
        finally:
            await client.close()
            await server.close()

    not_leader, internal, ok = run(main())
    assert not_leader.code == 404
    assert error_text(not_leader) == "leader is n1"
    assert internal.code == ResponseCode.INTERNAL_ERROR
    assert "boom" in error_text(internal)
    assert ok == Message(ResponseCode.SUCCESS, b"m", b"")


# ---------------------------------------------------------------------------------------
# Failures


def test_unanswered_request_times_out_and_late_response_is_dropped() -> None:
    never = asyncio.Event()

    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.READ:
            await never.wait()
        if msg.code == RequestCode.METADATA:
            await asyncio.sleep(0.4)
            return Message(ResponseCode.SUCCESS, b"late")
        return await echo(msg)

    async def main() -> tuple[DLedgerError, DLedgerError, Message, Message, int]:
        server = await start_server(handler)
        client = TransportClient()
        try:
            with pytest.raises(DLedgerError) as silent:
                await client.request(server.address, Message(RequestCode.READ), timeout=0.2)
            with pytest.raises(DLedgerError) as late:
                await client.request(server.address, Message(RequestCode.METADATA), timeout=0.1)
            fresh = await client.request(server.address, Message(RequestCode.GET, b"fresh"), timeout=5)
            await asyncio.sleep(0.6)  # let the late response arrive; it must be ignored
            after = await client.request(server.address, Message(RequestCode.GET, b"after"), timeout=5)
            return silent.value, late.value, fresh, after, server.connection_count
        finally:
            await client.close()
            await server.close()

    silent, late, fresh, after, connections = run(main())
    assert silent.code == ResponseCode.TIMEOUT
    assert late.code == ResponseCode.TIMEOUT
    assert fresh.meta == b"fresh"
    assert after.meta == b"after"
    assert connections == 1, "a timeout must not cost the connection"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_request_is_forgotten_and_its_late_answer_dropped(loop: str) -> None:
    """A caller cancelled while its request is out leaves no entry behind in the connection,
    and the answer that comes later is dropped: the connection goes on serving."""
    never = asyncio.Event()

    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.READ:
            await never.wait()
        return await echo(msg)

    async def main() -> tuple[int, int, int, Message]:
        server = await start_server(handler)
        client = TransportClient()
        try:
            await client.request(server.address, Message(RequestCode.GET, b"warm"), timeout=5)
            conn = next(p.conn for p in client._peers.values() if p.conn is not None)
            task = asyncio.ensure_future(client.request(server.address, Message(RequestCode.READ), timeout=0.3))
            await asyncio.sleep(0.05)
            in_flight = len(conn.pending)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            at_cancel = len(conn.pending)
            never.set()  # the cancelled request's answer now comes, to nobody
            after = await client.request(server.address, Message(RequestCode.GET, b"after"), timeout=5)
            await asyncio.sleep(0.4)  # past the cancelled request's timeout too
            return in_flight, at_cancel, len(conn.pending), after
        finally:
            await client.close()
            await server.close()

    in_flight, at_cancel, left, after = run(main(), loop)
    assert in_flight == 1
    assert at_cancel == 0 and left == 0
    assert after.meta == b"after"


@pytest.mark.parametrize("loop", LOOPS)
def test_answered_requests_are_not_kept_behind_one_still_out(loop: str) -> None:
    """Whatever keeps a request's timeout holds none of its frame, future or answer once it
    is answered: while one request waits (a long poll, a push to a hung follower), the
    answered ones behind it with the same timeout cost no memory of their bytes."""
    hold = asyncio.Event()

    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.READ:
            await hold.wait()
        return await echo(msg)

    async def main() -> tuple[int, int]:
        server = await start_server(handler)
        client = TransportClient()
        try:
            await client.request(server.address, Message(RequestCode.GET, b"warm"), timeout=10)
            slow = asyncio.ensure_future(client.request(server.address, Message(RequestCode.READ), timeout=10))
            await asyncio.sleep(0.01)
            gc.collect()
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                for _ in range(300):  # 300 x 64 KiB each way: ~38 MiB if kept
                    await client.request(server.address, Message(RequestCode.GET, b"m", bytes(64 * 1024)), timeout=10)
                gc.collect()
                held = tracemalloc.get_traced_memory()[0] - base
            finally:
                tracemalloc.stop()
            hold.set()
            await slow
            conn = next(p.conn for p in client._peers.values() if p.conn is not None)
            return held, len(conn.pending)
        finally:
            hold.set()
            await client.close()
            await server.close()

    held, pending = run(main(), loop)
    assert held < 4 * 2**20, f"{held / 2**20:.1f} MiB kept after the answered requests"
    assert pending == 0


def test_server_down_then_backoff_then_recovery() -> None:
    now = [1000.0]
    ping = Message(RequestCode.METADATA, b"ping")

    def clock() -> float:
        return now[0]

    async def failure(client: TransportClient, address: str) -> DLedgerError:
        with pytest.raises(DLedgerError) as e:
            await client.request(address, ping, timeout=5)
        return e.value

    async def main() -> list[str]:
        seen: list[str] = []
        server = await start_server()
        address = server.address
        port = int(address.rpartition(":")[2])
        await server.close()
        client = TransportClient(clock=clock, backoff_initial_s=1.0, backoff_max_s=8.0)
        try:
            for step in ("refused", "backoff", "advance-1.5", "backoff"):
                if step.startswith("advance"):
                    now[0] += float(step.split("-")[1])
                err = await failure(client, address)
                assert err.code == ResponseCode.NETWORK_ERROR
                seen.append("backoff" if "backoff" in err.message else "connect")

            server = TransportServer(echo)
            await server.start("127.0.0.1", port)
            now[0] += 100  # past any backoff
            resp = await request_until_ok(client, address, ping)
            assert resp.meta == b"ping"
            seen.append("ok")

            # A success resets the backoff: after the next refusal 1 s is enough again.
            await server.close()

            def refused(err: DLedgerError) -> bool:
                return "connect to" in err.message

            end = asyncio.get_running_loop().time() + 10
            while not refused(err := await failure(client, address)):
                assert asyncio.get_running_loop().time() < end
                await asyncio.sleep(0.01)
            now[0] += 1.1
            err = await failure(client, address)
            seen.append("backoff" if "backoff" in err.message else "connect")
            return seen
        finally:
            await client.close()

    # The second failure after the advance is "backoff" because the backoff has doubled to 2 s.
    assert run(main()) == ["connect", "backoff", "connect", "backoff", "ok", "connect"]


@pytest.mark.parametrize("loop", LOOPS)
def test_connection_killed_mid_flight_fails_pending_then_reconnects(loop: str) -> None:
    release = asyncio.Event()
    arrived: list[int] = []

    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.PULL:
            arrived.append(msg.meta[0])
            await release.wait()  # answers only after its connection is gone
        return await echo(msg)

    async def main() -> tuple[list[BaseException | Message], Message]:
        server = await start_server(handler)
        proxy = Proxy(server.address)
        address = await proxy.start()
        client = TransportClient()
        try:
            pending = [
                asyncio.create_task(client.request(address, Message(RequestCode.PULL, bytes([i])), 10))
                for i in range(3)
            ]
            await eventually(lambda: len(arrived) == 3)
            proxy.kill()
            results = await asyncio.gather(*pending, return_exceptions=True)
            release.set()
            after = await request_until_ok(client, address, Message(RequestCode.GET, b"after"))
            await asyncio.sleep(0.05)  # the released handlers write to a dead connection: no crash
            return results, after
        finally:
            await client.close()
            await proxy.close()
            await server.close()

    results, after = run(main(), loop)
    for r in results:
        assert isinstance(r, DLedgerError)
        assert r.code == ResponseCode.NETWORK_ERROR
    assert after.meta == b"after"


def _frame(kind: int, rid: int, code: int, meta: bytes = b"", data: bytes = b"") -> bytes:
    return b"".join(encode_frame(kind, rid, code, meta, data))


MALFORMED = {
    "oversized length": struct.pack(">I", 4097) + b"\x00" * 64,
    "garbage": b"\xffGET / HTTP/1.1\r\n\r\n" * 4,
    "shorter than header": struct.pack(">I", 5) + b"\x00" * 16,
    "unknown kind": _HEADER.pack(17, 7, 1, RequestCode.GET, 0),
    "meta longer than frame": _HEADER.pack(20, KIND_REQUEST, 1, RequestCode.GET, 4) + b"abc",
    "response sent to server": _frame(KIND_RESPONSE, 1, ResponseCode.SUCCESS),
    "valid then garbage": _frame(KIND_REQUEST, 9, RequestCode.GET, b"x") + b"\xff" * 32,
}


@pytest.mark.parametrize("loop", LOOPS)
def test_malformed_frames_close_only_that_connection(loop: str) -> None:
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.PULL:
            arrived.set()
            await release.wait()
        return await echo(msg)

    async def main() -> tuple[dict[str, bytes], Message, Message]:
        server = await start_server(handler, max_frame_bytes=4096)
        client = TransportClient()
        try:
            # A request in flight on the good connection for the whole attack.
            slow = asyncio.create_task(client.request(server.address, Message(RequestCode.PULL, b"slow"), 10))
            await asyncio.wait_for(arrived.wait(), 5)
            host, _, port = server.address.rpartition(":")
            replies: dict[str, bytes] = {}
            for name, payload in MALFORMED.items():
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(payload)
                replies[name] = await read_until_closed(reader)
                writer.close()
            await eventually(lambda: server.connection_count == 1)
            release.set()
            slow_resp = await slow
            ok = await client.request(server.address, Message(RequestCode.GET, b"still here"), 5)
            return replies, slow_resp, ok
        finally:
            await client.close()
            await server.close()

    replies, slow_resp, ok = run(main(), loop)
    assert set(replies) == set(MALFORMED)  # every bad connection was closed by the server
    assert slow_resp.meta == b"slow"
    assert ok.meta == b"still here"


def test_malformed_or_stray_responses_on_client_side() -> None:
    """A server that answers garbage costs the client that connection, nothing more."""

    async def fake_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        header = await reader.readexactly(HEADER_SIZE)
        _, _, rid, code, _ = _HEADER.unpack(header)
        if code == RequestCode.GET:  # a stray id is dropped, the real answer still matches
            writer.write(_frame(KIND_RESPONSE, rid + 1000, ResponseCode.SUCCESS, b"stray"))
            writer.write(_frame(KIND_RESPONSE, rid, ResponseCode.SUCCESS, b"mine"))
        elif code == RequestCode.VOTE:  # a request sent to a client
            writer.write(_frame(KIND_REQUEST, rid, RequestCode.VOTE))
        else:
            writer.write(struct.pack(">I", 3) + b"junk")
        await read_until_closed(reader)
        writer.close()

    async def main() -> tuple[Message, list[BaseException | Message]]:
        server = await asyncio.start_server(fake_server, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client = TransportClient()
        try:
            mine = await client.request(address, Message(RequestCode.GET), 5)
            await client.close()
            failures: list[BaseException | Message] = []
            for code in (RequestCode.VOTE, RequestCode.PULL):
                fresh = TransportClient()
                failures += await asyncio.gather(fresh.request(address, Message(code), 5), return_exceptions=True)
                await fresh.close()
            return mine, failures
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    mine, failures = run(main())
    assert mine.meta == b"mine"
    for failure in failures:
        assert isinstance(failure, DLedgerError)
        assert failure.code == ResponseCode.NETWORK_ERROR


def test_frames_over_max_frame_bytes_are_refused() -> None:
    seen: list[int] = []

    async def handler(msg: Message) -> Message:
        seen.append(len(msg.data))
        if msg.code == RequestCode.GET:
            return Message(ResponseCode.SUCCESS, b"", b"x" * 8192)  # too big to send back
        return await echo(msg)

    async def main() -> tuple[DLedgerError, Message, DLedgerError, Message]:
        server = await start_server(handler, max_frame_bytes=4096)
        client = TransportClient()
        small_client = TransportClient(max_frame_bytes=1024)
        try:
            with pytest.raises(DLedgerError) as refused:
                await client.request(server.address, Message(RequestCode.APPEND, b"", b"y" * 8192), 5)
            ok = await request_until_ok(client, server.address, Message(RequestCode.APPEND, b"", b"z" * 1000))
            with pytest.raises(DLedgerError) as local:
                await small_client.request(server.address, Message(RequestCode.APPEND, b"", b"y" * 2048), 5)
            too_big_response = await client.request(server.address, Message(RequestCode.GET), 5)
            return refused.value, ok, local.value, too_big_response
        finally:
            await small_client.close()
            await client.close()
            await server.close()

    refused, ok, local, too_big_response = run(main())
    assert refused.code == ResponseCode.NETWORK_ERROR
    assert bytes(ok.data) == b"z" * 1000
    assert local.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert too_big_response.code == ResponseCode.INTERNAL_ERROR
    assert "max_frame_bytes" in error_text(too_big_response)
    assert seen == [1000, 0], "the oversized request must never reach the handler"


def test_fault_injector_blocks_and_unblocks() -> None:
    arrived = asyncio.Event()

    async def handler(msg: Message) -> Message:
        if msg.code == RequestCode.PULL:
            arrived.set()
            await asyncio.Event().wait()
        return await echo(msg)

    async def main() -> list[str]:
        server = await start_server(handler)
        faults = FaultInjector()
        client = TransportClient(faults=faults)
        events: list[str] = []
        try:
            await client.request(server.address, Message(RequestCode.GET, b"a"), 5)
            in_flight = asyncio.create_task(client.request(server.address, Message(RequestCode.PULL), 10))
            await asyncio.wait_for(arrived.wait(), 5)

            faults.block(server.address)
            assert faults.is_blocked(server.address)
            assert not faults.is_blocked("127.0.0.1:1")
            for attempt in (in_flight, client.request(server.address, Message(RequestCode.GET), 5)):
                with pytest.raises(DLedgerError) as e:
                    await attempt
                events.append(e.value.code.name)
            await eventually(lambda: server.connection_count == 0)  # the live connection was cut

            faults.unblock_all()
            assert not faults.is_blocked(server.address)
            events.append((await client.request(server.address, Message(RequestCode.GET, b"b"), 5)).meta.decode())
            faults.delay_s = 0.05
            events.append((await client.request(server.address, Message(RequestCode.GET, b"c"), 5)).meta.decode())
            return events
        finally:
            await client.close()
            await server.close()

    assert run(main()) == ["NETWORK_ERROR", "NETWORK_ERROR", "b", "c"]


def test_closed_client_and_bad_address() -> None:
    release = asyncio.Event()

    async def handler(msg: Message) -> Message:
        await release.wait()
        return await echo(msg)

    async def main() -> list[ResponseCode]:
        server = await start_server(handler)
        client = TransportClient()
        codes: list[ResponseCode] = []
        try:
            with pytest.raises(DLedgerError) as bad:
                await client.request("no-port-here", Message(RequestCode.GET), 1)
            codes.append(bad.value.code)
            pending = asyncio.create_task(client.request(server.address, Message(RequestCode.GET), 10))
            await eventually(lambda: server.connection_count == 1)
            await client.close()
            for attempt in (pending, client.request(server.address, Message(RequestCode.GET), 1)):
                with pytest.raises(DLedgerError) as e:
                    await attempt
                codes.append(e.value.code)
            return codes
        finally:
            release.set()
            await server.close()

    assert run(main()) == [
        ResponseCode.UNEXPECTED_ARGUMENT,
        ResponseCode.NETWORK_ERROR,
        ResponseCode.NETWORK_ERROR,
    ]


# ---------------------------------------------------------------------------------------
# Pieces in isolation


_frames = st.lists(
    st.tuples(
        st.sampled_from([KIND_REQUEST, KIND_RESPONSE]),
        st.integers(0, 2**64 - 1),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=100),
        st.binary(max_size=2000),
    ),
    max_size=6,
)


@given(frames=_frames, chunk=st.sampled_from([HEADER_SIZE, 64, 1000, 256 * 1024]), cuts=st.lists(st.integers(0, 13000)))
@settings(max_examples=150, deadline=None)
def test_decoder_reassembles_frames_from_any_split(
    frames: list[tuple[int, int, int, bytes, bytes]], chunk: int, cuts: list[int]
) -> None:
    wire = b"".join(_frame(*f) for f in frames)
    out: list[tuple[int, int, int, bytes, bytes]] = []
    decoder = FrameDecoder(lambda k, r, c, m, d: out.append((k, r, c, m, bytes(d))), 1 << 20, chunk)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    for a, b in itertools.pairwise(points):
        decoder.feed(wire[a:b])
    assert out == frames


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (struct.pack(">I", 101), "exceeds max_frame_bytes"),
        (struct.pack(">I", 16), "shorter"),
        (_HEADER.pack(17, 2, 0, 0, 0), "kind"),
        (_HEADER.pack(18, 0, 0, 0, 2), "meta length"),
    ],
)
def test_decoder_rejects_malformed_headers(payload: bytes, reason: str) -> None:
    decoder = FrameDecoder(lambda *_: None, max_frame_bytes=100)
    with pytest.raises(FrameError, match=reason):
        decoder.feed(payload)


def test_decoder_accepts_frame_of_exactly_max_frame_bytes() -> None:
    out: list[bytes] = []
    decoder = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)), max_frame_bytes=100, chunk_size=64)
    decoder.feed(_frame(KIND_REQUEST, 1, 0, b"", b"d" * 83))  # L = 17 + 83
    assert out == [b"d" * 83]


class FakeTransport(asyncio.Transport):
    """Records frames and lets a test play the kernel's send buffer filling up."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.protocol: _ClientConnection | None = None
        self.pause_on_write = False
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.written.append(b"".join(list_of_data))
        if self.pause_on_write and self.protocol is not None:
            self.protocol.pause_writing()

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True

    def request_ids(self) -> list[int]:
        return [_HEADER.unpack_from(frame)[2] for frame in self.written]


def test_send_waits_for_drain_and_keeps_frame_order() -> None:
    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def main() -> tuple[list[int], list[int], list[int], BaseException | None]:
        conn = _ClientConnection("x:1", 1 << 20, lambda _: None)
        transport = FakeTransport()
        transport.protocol = conn
        conn.connection_made(transport)

        conn.pause_writing()
        senders = [asyncio.create_task(conn.send_frame(KIND_REQUEST, i, 1, b"", b"")) for i in range(5)]
        await settle()
        assert transport.written == [], "nothing may be written while paused"
        senders[1].cancel()  # a sender that gives up must not stall those behind it
        conn.resume_writing()
        await asyncio.gather(*senders, return_exceptions=True)
        # A sender cancelled right after being handed its turn passes the turn on.
        conn.pause_writing()
        senders = [asyncio.create_task(conn.send_frame(KIND_REQUEST, i, 1, b"", b"")) for i in (5, 6)]
        await settle()
        conn.resume_writing()
        senders[0].cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        first = transport.request_ids()

        # Each write fills the buffer again: one frame per resume, still in order, latecomers last.
        transport.written.clear()
        transport.pause_on_write = True
        conn.pause_writing()
        senders = [asyncio.create_task(conn.send_frame(KIND_REQUEST, i, 1, b"", b"")) for i in (10, 11)]
        await settle()
        conn.resume_writing()
        await settle()
        late = asyncio.create_task(conn.send_frame(KIND_REQUEST, 12, 1, b"", b""))
        await settle()
        one_per_resume = transport.request_ids()
        conn.resume_writing()
        await settle()
        conn.resume_writing()
        await settle()
        all_in_order = transport.request_ids()

        # Losing the connection fails whoever still waits.
        stuck = asyncio.create_task(conn.send_frame(KIND_REQUEST, 13, 1, b"", b""))
        await settle()
        conn.connection_lost(None)
        results = await asyncio.gather(stuck, late, *senders, return_exceptions=True)
        return first, one_per_resume, all_in_order, results[0] if isinstance(results[0], BaseException) else None

    first, one_per_resume, all_in_order, stuck_error = run(main())
    assert first == [0, 2, 3, 4, 6]
    assert one_per_resume == [10]
    assert all_in_order == [10, 11, 12]
    assert isinstance(stuck_error, DLedgerError)
    assert stuck_error.code == ResponseCode.NETWORK_ERROR


def test_install_uvloop() -> None:
    try:
        assert install_uvloop() is True
        assert isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)
    finally:
        asyncio.set_event_loop_policy(None)


# ---------------------------------------------------------------------------------------
# Heartbeats and votes ahead of bulk work


def test_heartbeats_and_votes_have_a_connection_of_their_own() -> None:
    seen: dict[int, set[str]] = {}

    def direct(msg: Message, respond: Respond, caller: Caller) -> None:
        seen.setdefault(msg.code, set()).add(caller.peer)
        respond(Message(ResponseCode.SUCCESS, msg.meta))

    async def main() -> int:
        server = TransportServer(direct=direct)
        await server.start("127.0.0.1", 0)
        client = TransportClient()
        try:
            for code in (RequestCode.PUSH, RequestCode.HEART_BEAT, RequestCode.VOTE, RequestCode.APPEND):
                await client.request(server.address, Message(code, b"x"), timeout=5)
            return server.connection_count
        finally:
            await client.close()
            await server.close()

    assert run(main()) == 2
    assert seen[RequestCode.HEART_BEAT] == seen[RequestCode.VOTE]
    assert seen[RequestCode.PUSH] == seen[RequestCode.APPEND]
    assert seen[RequestCode.HEART_BEAT] != seen[RequestCode.PUSH]


def test_a_spent_turn_budget_holds_bulk_frames_but_not_heartbeats() -> None:
    async def main() -> tuple[Message, bool]:
        server = await start_server()
        client = TransportClient()
        try:
            await client.request(server.address, Message(RequestCode.PUSH, b"warm"), timeout=5)
            await client.request(server.address, Message(RequestCode.HEART_BEAT, b"warm"), timeout=5)
            server.turn_cost = 1 << 30  # bulk work spent this turn's budget (and keeps spending it)
            beat = await client.request(server.address, Message(RequestCode.HEART_BEAT, b"beat"), timeout=5)
            push = asyncio.ensure_future(client.request(server.address, Message(RequestCode.PUSH, b"p"), timeout=5))
            await asyncio.sleep(0.2)
            held = not push.done()
            server.turn_cost = 0
            server.charge(0)  # a new turn: the held connection is read again
            await push
            return beat, held
        finally:
            await client.close()
            await server.close()

    beat, held = run(main())
    assert beat.meta == b"beat"
    assert held, "bulk frames wait for the next turn's budget"


@pytest.mark.parametrize("loop", LOOPS)
def test_no_timeout_and_a_spent_one_mean_what_they_did(loop: str) -> None:
    """inf waits for the answer (a caller that wants no timeout); 0 fails at once; neither
    may go out and then raise something else."""

    async def main() -> tuple[Message, DLedgerError, Message]:
        server = await start_server()
        client = TransportClient()
        try:
            await client.request(server.address, Message(RequestCode.GET, b"warm"), timeout=5)
            forever = await client.request(server.address, Message(RequestCode.GET, b"inf"), timeout=math.inf)
            with pytest.raises(DLedgerError) as spent:
                await client.request(server.address, Message(RequestCode.GET, b"zero"), timeout=0)
            after = await client.request(server.address, Message(RequestCode.GET, b"after"), timeout=5)
            return forever, spent.value, after
        finally:
            await client.close()
            await server.close()

    forever, spent, after = run(main(), loop)
    assert forever.meta == b"inf"
    assert spent.code == ResponseCode.TIMEOUT
    assert after.meta == b"after"
