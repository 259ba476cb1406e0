"""The transport's defences, over real loopback sockets: receive buffers that grow only as
bytes arrive, per-turn fairness, graceful close after garbage, the connection cap, frame and
idle timeouts, the shared-token gate and mutual TLS with name checks.

No timing is asserted: waits are deadline loops that only bound how long a failure takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import struct
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.runtime.frames import BIG_ANSWER_STEP
from dledger.runtime.transport import (
    KIND_REQUEST,
    ByteBudget,
    Caller,
    FrameDecoder,
    FrameError,
    Limits,
    Message,
    Respond,
    TransportClient,
    TransportServer,
    encode_frame,
)
from dledger.security.certs import make_certs
from dledger.security.roles import Tokens, expect_members
from dledger.security.tls import TlsConfig, client_context, server_context

T = TypeVar("T")
_HEADER = struct.Struct(">IBQiI")


def run(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    factory = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(asyncio.wait_for(coro, 30))


async def eventually(cond: Callable[[], bool], deadline_s: float = 15) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.02)


async def echo(msg: Message) -> Message:
    return Message(ResponseCode.SUCCESS, msg.meta, msg.data)


def frame(request_id: int, code: int = 1, meta: bytes = b"", data: bytes = b"") -> bytes:
    return b"".join(bytes(p) for p in encode_frame(KIND_REQUEST, request_id, code, meta, data))


async def raw_connection(server: TransportServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = server.address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    length, _kind, request_id, code, mlen = _HEADER.unpack(await reader.readexactly(21))
    rest = await reader.readexactly(length - 17)
    return request_id, code, rest[:mlen]


async def closed_by_peer(reader: asyncio.StreamReader, deadline_s: float = 20) -> bool:
    """The server closed the connection (EOF or a reset) within the deadline."""
    try:
        async with asyncio.timeout(deadline_s):
            while await reader.read(65536):
                pass
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    return True


# --- the decoder ----------------------------------------------------------------------------


def test_an_announced_big_frame_costs_only_the_bytes_sent() -> None:
    out: list[bytes] = []
    decoder = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)), max_frame_bytes=64 << 20)
    decoder.feed(_HEADER.pack(64 << 20, KIND_REQUEST, 1, 1, 0))  # announces 64 MiB, sends a header
    assert decoder.pending
    assert len(decoder.get_buffer()) <= 1 << 20  # the buffer is what arrived plus a step, not 64 MiB
    body = b"x" * (3 << 20)  # a real big frame grows as it arrives and arrives whole
    decoder2 = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)), max_frame_bytes=64 << 20)
    decoder2.feed(frame(2, data=body))
    assert out == [body]
    assert not decoder2.pending


def test_a_bulk_readers_decoder_takes_a_big_answer_in_one_buffer_up_to_a_bound() -> None:
    """A bulk reader's client (big_answers) reading a member's 3 MiB answer: one buffer of
    the frame's length from its first bytes, no doubling and copying as it arrives; a lying
    64 MiB length gets at most BIG_ANSWER_STEP up front; a server's decoder (and a member's
    links to its peers: the default) still holds only what arrived plus a step."""
    body = b"z" * (3 << 20)
    wire = frame(3, data=body)
    sizes = {}
    for big in (True, False):
        out: list[bytes] = []
        decoder = FrameDecoder(lambda k, r, c, m, d, out=out: out.append(bytes(d)),  # type: ignore[misc]
                               max_frame_bytes=64 << 20, big_answers=big)
        decoder.feed(wire[: 1 << 16])
        sizes[big] = len(decoder.get_buffer())
        decoder.feed(wire[1 << 16 :])
        assert out == [body]
    assert sizes[True] >= len(body) - (1 << 16) and sizes[False] < 1 << 20
    liar = FrameDecoder(lambda k, r, c, m, d: None, max_frame_bytes=64 << 20, big_answers=True)
    liar.feed(_HEADER.pack(64 << 20, KIND_REQUEST, 1, 1, 0))  # announces 64 MiB, sends a header
    assert len(liar.get_buffer()) <= BIG_ANSWER_STEP


def test_a_fresh_decoder_starts_small_and_grows_for_a_bigger_frame() -> None:
    out: list[bytes] = []
    decoder = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)))
    assert len(decoder.get_buffer()) <= 16 * 1024
    decoder.feed(frame(1, data=b"y" * 100_000))  # bigger than the first buffer, smaller than a chunk
    assert out == [b"y" * 100_000]


def test_the_budget_leaves_frames_for_the_next_turn() -> None:
    out: list[int] = []
    decoder = FrameDecoder(lambda k, r, c, m, d: out.append(r), budget=3)
    wire = b"".join(frame(i) for i in range(10))
    buf = decoder.get_buffer()
    buf[: len(wire)] = wire
    decoder.buffer_updated(len(wire))
    assert out == [0, 1, 2] and decoder.backlog
    while decoder.backlog:
        decoder.parse_more()
    assert out == list(range(10))


def test_big_frames_of_all_connections_share_one_memory_budget() -> None:
    memory = ByteBudget(8 << 20)
    out: list[bytes] = []
    a = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)), max_frame_bytes=64 << 20, memory=memory)
    b = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)), max_frame_bytes=64 << 20, memory=memory)
    big = frame(1, data=b"a" * (16 << 20))
    a.feed(big[: 3 << 20])  # a holds 3 MiB of an unfinished frame (its buffer: at most half more)
    assert 3 << 20 <= memory.used <= 5 << 20
    with pytest.raises(FrameError, match="frame_memory_bytes"):
        b.feed(frame(2, data=b"b" * (memory.limit - memory.used + 1)))  # b's would overdraw the budget
    b.close()
    a.close()  # a's connection is gone: its memory comes back
    assert memory.used == 0
    c = FrameDecoder(lambda k, r, c, m, d: out.append(bytes(d)), max_frame_bytes=64 << 20, memory=memory)
    c.feed(frame(3, data=b"c" * (3 << 20)))
    assert out == [b"c" * (3 << 20)] and memory.used == 0  # a whole frame gives its memory back


def test_unfinished_frames_past_the_servers_memory_budget_close_their_connection() -> None:
    async def main() -> None:
        server = TransportServer(echo, max_frame_bytes=4 << 20, limits=Limits(frame_memory_bytes=8 << 20))
        await server.start("127.0.0.1", 0)
        try:
            part = frame(1, data=b"p" * ((4 << 20) - 64))[: 3 << 20]
            holders = []
            for _ in range(2):  # two connections hold about 6 MiB of unfinished frames
                r, w = await raw_connection(server)
                w.write(part)
                await w.drain()
                holders.append((r, w))
            await eventually(lambda: server.frame_memory.used >= 6 << 20)
            r3, w3 = await raw_connection(server)
            w3.write(part)  # a third would overdraw the 8 MiB: its connection is closed
            assert await closed_by_peer(r3)
            assert server.frame_memory.used <= 8 << 20
            for _, w in holders:
                w.close()
            w3.close()
            await eventually(lambda: server.frame_memory.used == 0)  # closed connections give it back
            r, w = await raw_connection(server)
            w.write(frame(9, data=b"ok" * 100_000))
            assert (await read_frame(r))[0] == 9
            w.close()
        finally:
            await server.close()

    run(main())


# --- the server -----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_valid_frame_followed_by_garbage_is_answered_then_closed(loop: str) -> None:
    async def main() -> None:
        server = TransportServer(echo)
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await raw_connection(server)
            writer.write(frame(7, meta=b"hello") + struct.pack(">I", 3) + b"garbage")
            request_id, code, meta = await read_frame(reader)
            assert (request_id, code, meta) == (7, ResponseCode.SUCCESS, b"hello")
            assert await closed_by_peer(reader)
            writer.close()
        finally:
            await server.close()

    run(main(), loop)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_one_connection_flood_does_not_hold_the_loop(loop: str) -> None:
    """While one connection pipelines thousands of frames, a timer still fires often."""

    async def main() -> None:
        server = TransportServer(echo)
        await server.start("127.0.0.1", 0)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        try:
            reader, writer = await raw_connection(server)
            wire = b"".join(frame(i) for i in range(20_000))
            task = asyncio.create_task(ticker())
            writer.write(wire)
            got = 0
            while got < 20_000:
                await read_frame(reader)
                got += 1
            task.cancel()
            assert ticks > 20_000 // 64 // 2  # the ticker ran between the budgets
            writer.close()
        finally:
            await server.close()

    run(main(), loop)


def test_at_the_cap_a_busy_server_refuses_and_an_idle_one_makes_room() -> None:
    release = asyncio.Event()

    async def held(msg: Message) -> Message:
        if msg.code == 2:
            await release.wait()
        return Message(ResponseCode.SUCCESS)

    async def main() -> None:
        server = TransportServer(held, limits=Limits(max_connections=3))
        await server.start("127.0.0.1", 0)
        try:
            conns = [await raw_connection(server) for _ in range(3)]
            for _, w in conns:  # each has a request in flight: none may be closed for room
                w.write(frame(1, code=2))
            await eventually(lambda: server.connection_count == 3
                             and all(c.inflight for c in server._connections))
            await asyncio.sleep(1.2)
            reader, writer = await raw_connection(server)
            assert await closed_by_peer(reader)
            assert server.connection_count == 3
            writer.close()
            release.set()
            for r, _ in conns:  # answered: now idle
                assert (await read_frame(r))[1] == ResponseCode.SUCCESS
            end = asyncio.get_running_loop().time() + 15
            while True:  # once they have been idle a while, a newcomer evicts the longest idle one
                reader, writer = await raw_connection(server)
                writer.write(frame(9))
                try:
                    assert (await read_frame(reader))[0] == 9
                    break
                except (asyncio.IncompleteReadError, ConnectionError):
                    writer.close()
                    assert asyncio.get_running_loop().time() < end, "no room was made"
                    await asyncio.sleep(0.2)
            closed = 0
            for r, w in conns:
                try:
                    w.write(frame(3))
                    await asyncio.wait_for(read_frame(r), 10)
                except (asyncio.IncompleteReadError, ConnectionError):
                    closed += 1
            assert closed == 1
            assert server.connection_count <= 3
            for _, w in conns:
                w.close()
            writer.close()
        finally:
            await server.close()

    run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_slow_sender_and_an_idle_connection_are_closed(loop: str) -> None:
    async def main() -> None:
        server = TransportServer(echo, limits=Limits(frame_timeout_s=0.5, idle_timeout_s=1.0))
        await server.start("127.0.0.1", 0)
        try:
            slow_r, slow_w = await raw_connection(server)
            slow_w.write(frame(1)[:5])  # part of a header, then silence
            idle_r, idle_w = await raw_connection(server)
            idle_w.write(frame(2))
            assert (await read_frame(idle_r))[0] == 2
            assert await closed_by_peer(slow_r)
            assert await closed_by_peer(idle_r)
            slow_w.close()
            idle_w.close()
        finally:
            await server.close()

    run(main(), loop)


def test_a_connection_waiting_on_the_handler_is_not_idle() -> None:
    release = asyncio.Event()

    async def slow(msg: Message) -> Message:
        await release.wait()
        return Message(ResponseCode.SUCCESS)

    async def main() -> None:
        server = TransportServer(slow, limits=Limits(idle_timeout_s=0.2, frame_timeout_s=0.2))
        await server.start("127.0.0.1", 0)
        client = TransportClient()
        try:
            pending = asyncio.create_task(client.request(server.address, Message(1), timeout=20))
            await asyncio.sleep(1.0)  # several idle timeouts pass while the request is in flight
            release.set()
            assert (await pending).code == ResponseCode.SUCCESS
        finally:
            await client.close()
            await server.close()

    run(main())


# --- the token gate -------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_auth_token_gates_every_request(loop: str) -> None:
    async def main() -> None:
        server = TransportServer(echo, tokens=Tokens(b"s3cret"))
        await server.start("127.0.0.1", 0)
        good = TransportClient(auth_token=b"s3cret")
        bad = TransportClient(auth_token=b"wrong")
        none = TransportClient()
        try:
            assert (await good.request(server.address, Message(1, b"m"), 10)).meta == b"m"
            with pytest.raises(DLedgerError) as e:
                await bad.request(server.address, Message(1), 10)
            assert e.value.code == ResponseCode.UNAUTHENTICATED
            answer = await none.request(server.address, Message(1), 10)
            assert answer.code == ResponseCode.UNAUTHENTICATED
            # a raw AUTH with the wrong token is answered, then the connection closes
            reader, writer = await raw_connection(server)
            writer.write(frame(5, RequestCode.AUTH, b"nope"))
            assert (await read_frame(reader))[1] == ResponseCode.UNAUTHENTICATED
            assert await closed_by_peer(reader)
            writer.close()
        finally:
            for c in (good, bad, none):
                await c.close()
            await server.close()

    run(main(), loop)


# --- mutual TLS -----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tls_names_reach_the_handler_and_the_client_checks_the_server(tmp_path: Path, loop: str) -> None:
    make_certs(tmp_path, ["n0", "n1"], hosts=["127.0.0.1"])

    def tls(name: str) -> TlsConfig:
        return TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}-key.pem"))

    seen: list[frozenset[str]] = []

    def direct(msg: Message, respond: Respond, caller: Caller) -> None:
        seen.append(caller.names)
        respond(Message(ResponseCode.SUCCESS, msg.meta))

    async def main() -> None:
        server = TransportServer(direct=direct, ssl=server_context(tls("n0")))
        await server.start("127.0.0.1", 0)
        address = server.address
        as_n1 = TransportClient(ssl=client_context(tls("n1")), server_check=expect_members({address: "n0"}))
        as_client = TransportClient(ssl=client_context(tls("client")), server_check=expect_members({address: "n0"}))
        expects_other = TransportClient(ssl=client_context(tls("n1")), server_check=expect_members({address: "n1"}))
        plain = TransportClient(connect_timeout_s=5)
        try:
            assert (await as_n1.request(address, Message(1, b"a"), 10)).meta == b"a"
            assert (await as_client.request(address, Message(1, b"b"), 10)).meta == b"b"
            assert seen == [frozenset({"n1"}), frozenset({"client"})]
            with pytest.raises(DLedgerError) as e:
                await expects_other.request(address, Message(1), 10)
            assert e.value.code == ResponseCode.UNAUTHENTICATED
            refused = await plain.request(address, Message(1), 10)  # told it lacks TLS, then closed
            assert refused.code == ResponseCode.UNAUTHENTICATED and b"requires mutual TLS" in refused.meta
            assert len(seen) == 2
        finally:
            for c in (as_n1, as_client, expects_other, plain):
                await c.close()
            await server.close()

    run(main(), loop)


def test_plain_socket_to_tls_server_never_reaches_the_handler(tmp_path: Path) -> None:
    make_certs(tmp_path, ["n0"], hosts=["127.0.0.1"])
    tls = TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "n0.pem"), str(tmp_path / "n0-key.pem"))
    calls: list[Message] = []

    async def record(msg: Message) -> Message:
        calls.append(msg)
        return Message(ResponseCode.SUCCESS)

    async def main() -> None:
        server = TransportServer(record, ssl=server_context(tls))
        await server.start("127.0.0.1", 0)
        try:
            host, _, port = server.address.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(frame(1))
            await asyncio.sleep(0.3)
            sock.close()
            assert calls == []
        finally:
            await server.close()

    run(main())


def test_frames_after_a_refused_token_reach_nobody() -> None:
    calls: list[bytes] = []

    async def record(msg: Message) -> Message:
        calls.append(msg.meta)
        return Message(ResponseCode.SUCCESS)

    async def main() -> None:
        server = TransportServer(record, tokens=Tokens(b"right"))
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await raw_connection(server)
            # a good AUTH, a request, then a wrong AUTH and requests after it, in one send
            writer.write(frame(1, RequestCode.AUTH, b"right") + frame(2, meta=b"before")
                         + frame(3, RequestCode.AUTH, b"wrong") + frame(4, meta=b"after")
                         + frame(5, RequestCode.AUTH, b"right") + frame(6, meta=b"later"))
            answers = []
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                while True:
                    answers.append((await read_frame(reader))[:2])
            assert sorted(answers) == [(1, ResponseCode.SUCCESS), (2, ResponseCode.SUCCESS),
                                       (3, ResponseCode.UNAUTHENTICATED)]  # the handler may answer 2 last
            assert calls == [b"before"]
            writer.close()
        finally:
            await server.close()

    run(main())


def test_a_stranger_is_closed_unless_it_presents_the_token_and_sends_only_small_frames() -> None:
    async def main() -> None:
        server = TransportServer(echo, tokens=Tokens(b"t"), limits=Limits(handshake_timeout_s=0.5))
        await server.start("127.0.0.1", 0)
        try:
            silent_r, silent_w = await raw_connection(server)
            assert await closed_by_peer(silent_r)
            big_r, big_w = await raw_connection(server)
            big_w.write(_HEADER.pack(17 + 100_000, KIND_REQUEST, 1, RequestCode.AUTH, 0))  # a big frame, no token yet
            assert await closed_by_peer(big_r)
            ok_r, ok_w = await raw_connection(server)
            ok_w.write(frame(1, RequestCode.AUTH, b"t") + frame(2, data=b"z" * 100_000))  # after the token: fine
            assert (await read_frame(ok_r))[1] == ResponseCode.SUCCESS
            assert (await read_frame(ok_r))[:2] == (2, ResponseCode.SUCCESS)
            for w in (silent_w, big_w, ok_w):
                w.close()
        finally:
            await server.close()

    run(main())


def test_the_turn_budget_spreads_costly_requests_over_loop_turns() -> None:
    """Requests whose handler charges a lot are handed up a few per loop turn, whatever
    the per-connection frame budget would allow."""
    turns: list[int] = []
    turn = 0

    def direct(msg: Message, respond: Respond, caller: Caller) -> None:
        caller.charge(400)  # e.g. a READ with a big answer
        turns.append(turn)
        respond(Message(ResponseCode.SUCCESS))

    async def main() -> None:
        nonlocal turn
        server = TransportServer(direct=direct)
        await server.start("127.0.0.1", 0)

        async def count_turns() -> None:
            nonlocal turn
            while True:
                await asyncio.sleep(0)
                turn += 1

        counter = asyncio.create_task(count_turns())
        try:
            reader, writer = await raw_connection(server)
            writer.write(b"".join(frame(i) for i in range(40)))
            for _ in range(40):
                await read_frame(reader)
            writer.close()
        finally:
            counter.cancel()
            await server.close()

    run(main())
    per_turn = max(turns.count(t) for t in set(turns))
    assert per_turn <= 2, f"{per_turn} costly requests handled in one loop turn"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_peer_that_never_reads_its_answers_is_cut(loop: str, tls: bool, tmp_path: Path) -> None:
    """Each connection that stops reading holds up to a READ answer in memory: not for ever.
    Under TLS the TLS layer moves the answers below itself, so the connection never looked
    stalled: the socket's own transport is watched too."""
    ssl_ctx = client_ssl = None
    if tls:
        make_certs(tmp_path, ["n0"], hosts=["127.0.0.1"])
        ssl_ctx = server_context(TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "n0.pem"),
                                           str(tmp_path / "n0-key.pem")))
        client_ssl = client_context(TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "client.pem"),
                                              str(tmp_path / "client-key.pem")))

    async def main() -> None:
        server = TransportServer(echo, limits=Limits(frame_timeout_s=0.5), ssl=ssl_ctx)
        await server.start("127.0.0.1", 0)
        try:
            if client_ssl is None:
                _reader, writer = await raw_connection(server)
            else:
                host, _, port = server.address.rpartition(":")
                sock = socket.create_connection((host, int(port)))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                _reader, writer = await asyncio.open_connection(sock=sock, ssl=client_ssl, server_hostname="n0")
            # one echo of 12 MiB: more than the kernel buffers take (and, under TLS, all of it below
            # the TLS layer at once: nothing more is ever asked, so our side never pauses)
            writer.write(frame(1, data=b"a" * (12 << 20)))
            await eventually(lambda: server.connection_count == 1)
            await eventually(lambda: server.connection_count == 0, 30)
            writer.close()
        finally:
            await server.close()

    run(main(), loop)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tls_connections_cut_during_their_handshake_are_forgotten(tmp_path: Path, loop: str) -> None:
    """A TLS handshake runs on a connection already counted against max_connections. One that
    is cut mid-handshake (by the peer, or by the handshake timeout) must leave the count: uvloop
    reports such a connection as a finished handshake, and the loss of it to nobody."""
    make_certs(tmp_path, ["n0"], hosts=["127.0.0.1"])
    tls = TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "n0.pem"), str(tmp_path / "n0-key.pem"))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    hello_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    hello_ctx.check_hostname, hello_ctx.verify_mode = False, ssl.CERT_NONE
    with contextlib.suppress(ssl.SSLWantReadError):
        hello_ctx.wrap_bio(incoming, outgoing).do_handshake()
    hello = outgoing.read()

    async def main() -> None:
        server = TransportServer(echo, ssl=server_context(tls), limits=Limits(handshake_timeout_s=0.5))
        await server.start("127.0.0.1", 0)
        host, _, port = server.address.rpartition(":")
        try:
            writers = []
            for _ in range(20):
                _, writer = await asyncio.open_connection(host, int(port))
                writer.write(hello)  # then nothing: the handshake never finishes
                writers.append(writer)
            await eventually(lambda: server.connection_count == 20)
            for writer in writers[:10]:  # cut by the peer mid-handshake
                writer.transport.abort()
            await eventually(lambda: server.connection_count == 0)  # the rest, by the handshake timeout
            for writer in writers[10:]:
                writer.close()
        finally:
            await server.close()

    run(main(), loop)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_closed_connection_is_freed_without_the_cyclic_collector(tmp_path: Path, loop: str, tls: bool) -> None:
    """A closed connection (with the answers queued for it) stayed in memory until Python's
    cyclic collector ran, which a quiet process rarely does: 60 rounds of 16 TLS connections
    that asked for 16 MiB and reset took a member from 42 to 537 MiB for good."""
    server_ssl = client_ssl = None
    if tls:
        make_certs(tmp_path, ["n0"], hosts=["127.0.0.1"])
        server_ssl = server_context(TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "n0.pem"),
                                              str(tmp_path / "n0-key.pem")))
        client_ssl = client_context(TlsConfig(str(tmp_path / "ca.pem"), str(tmp_path / "client.pem"),
                                              str(tmp_path / "client-key.pem")))

    async def main() -> None:
        server = TransportServer(echo, ssl=server_ssl)
        await server.start("127.0.0.1", 0)
        client = TransportClient(ssl=client_ssl)
        try:
            assert (await client.request(server.address, Message(1, b"x" * 100_000), 10)).meta == b"x" * 100_000
            conn = weakref.ref(next(iter(server._connections)))
            await client.close()
            await eventually(lambda: server.connection_count == 0)
            for _ in range(5):
                await asyncio.sleep(0.05)  # the loop's own callbacks let go of it
            assert conn() is None, gc.get_referrers(conn())
        finally:
            await server.close()

    gc.disable()
    try:
        run(main(), loop)
    finally:
        gc.enable()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_request_that_came_with_the_tls_handshake_does_not_start_the_frame_timeout(tmp_path: Path,
                                                                                       loop: str) -> None:
    """A client's first request often arrives with its last handshake flight (TLS 1.3), and is
    read from the backlog once the handshake is done. Its connection, answered and then idle,
    was closed 30 s later as if a frame had been arriving all along ("a frame took over 30 s",
    three times in every `make demo`). Here: a raw TLS client that sends its handshake's last
    flight and a request in one write, and then stays idle past the frame timeout."""
    make_certs(tmp_path, ["n0"], hosts=["127.0.0.1"])
    ca = str(tmp_path / "ca.pem")
    server_ssl = server_context(TlsConfig(ca, str(tmp_path / "n0.pem"), str(tmp_path / "n0-key.pem")))
    client_ssl = client_context(TlsConfig(ca, str(tmp_path / "client.pem"), str(tmp_path / "client-key.pem")))

    async def one_client(host: str, port: int) -> socket.socket:
        """TLS by hand (memory BIOs): the client's Finished and the request leave in one write."""
        sock = socket.create_connection((host, port))
        sock.setblocking(False)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = client_ssl.wrap_bio(incoming, outgoing, server_hostname="n0")
        loop_ = asyncio.get_running_loop()
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    await loop_.sock_sendall(sock, outgoing.read())
                incoming.write(await loop_.sock_recv(sock, 65536))
        tls.write(frame(1, meta=b"hello"))
        await loop_.sock_sendall(sock, outgoing.read())  # the last flight and the request at once
        return sock

    async def main() -> None:
        server = TransportServer(echo, ssl=server_ssl, limits=Limits(frame_timeout_s=0.4))
        await server.start("127.0.0.1", 0)
        host, _, port = server.address.rpartition(":")
        socks: list[socket.socket] = []
        try:
            for _ in range(8):
                socks.append(await one_client(host, int(port)))
            await eventually(lambda: server.connection_count == 8)
            await eventually(lambda: all(c.partial_since is None for c in server._connections))
            await asyncio.sleep(1.2)  # three frame timeouts, idle
            assert server.connection_count == 8, "an idle connection was closed as a slow frame"
        finally:
            for sock in socks:
                sock.close()
            await server.close()

    run(main(), loop)
