"""runtime.coalesce.Coalescer, shared by DLedgerClient's appends and BrokerClient's sends:
the calls of one loop iteration go as one request within its limits, each caller gets its
own result, and an error of the request reaches every caller in it."""

from __future__ import annotations

import asyncio

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.coalesce import Coalescer


class Recorder:
    def __init__(self, error: DLedgerError | None = None) -> None:
        self.requests: list[list[bytes]] = []
        self.error = error

    async def send_many(self, bodies: list[bytes]) -> list[tuple[int, bytes] | DLedgerError]:
        self.requests.append(list(bodies))
        await asyncio.sleep(0.01)  # the request is out: calls made now open the next batch
        if self.error is not None:
            raise self.error
        base = sum(len(r) for r in self.requests[:-1])
        return [(base + i, b) for i, b in enumerate(bodies)]


def test_one_request_per_loop_iteration_each_caller_its_own_result() -> None:
    async def main() -> tuple[list[tuple[int, bytes]], Recorder, int]:
        r = Recorder()
        c: Coalescer[tuple[int, bytes]] = Coalescer(r.send_many, max_bytes=1 << 20, max_bodies=1000)
        results = await asyncio.gather(*(c.submit(b"%d" % i) for i in range(50)))
        return results, r, c.batches

    results, r, batches = asyncio.run(main())
    assert batches == len(r.requests) == 1
    assert [b for _, b in results] == [b"%d" % i for i in range(50)]  # each caller its own body back
    assert sorted(i for i, _ in results) == list(range(50))


def test_the_limits_split_the_calls_into_several_requests() -> None:
    async def main() -> Recorder:
        r = Recorder()
        c: Coalescer[tuple[int, bytes]] = Coalescer(r.send_many, max_bytes=1 << 20, max_bodies=8)
        await asyncio.gather(*(c.submit(b"x") for i in range(20)))
        return r

    r = asyncio.run(main())
    assert all(len(req) <= 8 for req in r.requests) and sum(map(len, r.requests)) == 20


def test_an_error_of_the_request_reaches_every_caller_in_it() -> None:
    unknown = DLedgerError(ResponseCode.TIMEOUT, "no answer: outcome unknown (it may have been written)")

    async def main() -> list[object]:
        r = Recorder(unknown)
        c: Coalescer[tuple[int, bytes]] = Coalescer(r.send_many, max_bytes=1 << 20, max_bodies=1000)
        return await asyncio.gather(*(c.submit(b"x") for _ in range(10)), return_exceptions=True)

    out = asyncio.run(main())
    assert len(out) == 10
    for e in out:
        assert isinstance(e, DLedgerError) and e.code == ResponseCode.TIMEOUT and "outcome unknown" in e.message


def test_a_caller_cancelled_before_sending_leaves_the_others_their_request() -> None:
    async def main() -> tuple[list[tuple[int, bytes] | BaseException], Recorder]:
        r = Recorder()
        c: Coalescer[tuple[int, bytes]] = Coalescer(r.send_many, max_bytes=1 << 20, max_bodies=1000)
        first = asyncio.ensure_future(c.submit(b"first"))
        others = [asyncio.ensure_future(c.submit(b"o%d" % i)) for i in range(3)]
        await asyncio.sleep(0)  # the first opened the batch and yields; the others joined it
        assert c.batches == 0 and c._open is not None and len(c._open.bodies) == 4
        first.cancel()
        done = await asyncio.gather(first, *others, return_exceptions=True)
        return done, r

    done, r = asyncio.run(main())
    assert isinstance(done[0], asyncio.CancelledError)
    assert [d[1] for d in done[1:] if isinstance(d, tuple)] == [b"o0", b"o1", b"o2"]
    assert r.requests == [[b"o0", b"o1", b"o2"]]  # sent from a task of their own


@pytest.mark.parametrize("n", [1, 3])
def test_a_lone_call_is_a_request_of_its_own(n: int) -> None:
    async def main() -> int:
        r = Recorder()
        c: Coalescer[tuple[int, bytes]] = Coalescer(r.send_many, max_bytes=1 << 20, max_bodies=1000)
        for _ in range(n):
            await c.submit(b"x")
        return len(r.requests)

    assert asyncio.run(main()) == n
