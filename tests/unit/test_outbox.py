"""The loop's Outbox: frames queued on many connections in one loop iteration are written by one
callback, each connection's in one writelines and in the order queued."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from dledger.runtime.connection import WRITE_HIGH_WATER, FrameProtocol, outbox
from dledger.runtime.frames import KIND_RESPONSE, FrameDecoder


class _Transport:
    """What FrameProtocol writes through, recorded."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def writelines(self, parts: list[Any]) -> None:
        self.writes.append(b"".join(bytes(p) for p in parts))

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def _connection() -> tuple[FrameProtocol, _Transport]:
    conn = FrameProtocol(1 << 20)
    t = _Transport()
    conn._transport = t  # type: ignore[assignment]
    conn._outbox = outbox()
    return conn, t


def _frames(data: bytes) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    dec = FrameDecoder(lambda kind, rid, code, meta, body: got.append((rid, code)), 4 << 20)
    done = 0
    while done < len(data):
        buf = dec.get_buffer()
        n = min(len(buf), len(data) - done)
        buf[:n] = data[done : done + n]
        dec.buffer_updated(n)
        done += n
    return got


def test_one_callback_writes_every_connection_once_in_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls = 0
        real = loop.call_soon

        def counting(cb: Any, *args: Any, **kw: Any) -> Any:
            nonlocal calls
            calls += 1
            return real(cb, *args, **kw)

        conns = [_connection() for _ in range(50)]
        loop.call_soon = counting  # type: ignore[method-assign,assignment]
        try:
            for k, (conn, _) in enumerate(conns):
                for rid in range(3):
                    conn.queue_frame(KIND_RESPONSE, rid, 200 + k, b"m", b"")
        finally:
            loop.call_soon = real  # type: ignore[method-assign]
        assert calls == 1  # one callback for the 50 connections, not one each
        assert all(t.writes == [] for _, t in conns)  # nothing written before it runs
        await asyncio.sleep(0)
        for k, (_, t) in enumerate(conns):
            assert len(t.writes) == 1, k  # one writelines per connection
            assert _frames(t.writes[0]) == [(0, 200 + k), (1, 200 + k), (2, 200 + k)]

    asyncio.run(main())


def test_a_connection_flushed_directly_meanwhile_writes_nothing_twice() -> None:
    async def main() -> None:
        (a, ta), (b, tb) = _connection(), _connection()
        a.queue_frame(KIND_RESPONSE, 1, 200, b"m", b"")
        b.queue_frame(KIND_RESPONSE, 2, 200, b"m", b"")
        a.queue_frame(KIND_RESPONSE, 3, 200, b"x" * WRITE_HIGH_WATER, b"")  # full: written at once
        assert len(ta.writes) == 1 and _frames(ta.writes[0]) == [(1, 200), (3, 200)]
        a.queue_frame(KIND_RESPONSE, 4, 200, b"m", b"")  # listed again, after its direct flush
        await asyncio.sleep(0)
        assert [_frames(w) for w in ta.writes] == [[(1, 200), (3, 200)], [(4, 200)]]
        assert [_frames(w) for w in tb.writes] == [[(2, 200)]]
        await asyncio.sleep(0)
        assert len(ta.writes) == 2 and len(tb.writes) == 1  # nothing more, nothing lost

    asyncio.run(main())


def test_a_closed_loop_is_not_kept_by_its_outbox() -> None:
    async def main() -> weakref.ref[asyncio.AbstractEventLoop]:
        conn, t = _connection()
        conn.queue_frame(KIND_RESPONSE, 1, 200, b"m", b"")
        await asyncio.sleep(0)
        assert len(t.writes) == 1
        return weakref.ref(asyncio.get_running_loop())

    ref = asyncio.run(main())
    gc.collect()
    assert ref() is None
