"""BrokerServer as the asyncio driver of its BrokerAgent, without sockets (never started): a
failure in one input, one effect or one tick costs that input, never the broker's timers or
an answer the agent (or a send) waits for; confirm-offset saves run one at a time
(docs/brokers.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dledger.broker import messages as bm
from dledger.broker import server as server_module
from dledger.broker.agent import CallController, Effect, SaveConfirm, SendDone, WakeHA
from dledger.broker.config import BrokerConfig
from dledger.broker.server import BrokerServer
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller import messages as cm
from dledger.store.base import StoreError

DEADLINE_S = 30.0  # a generous bound for a condition on a busy machine (never a timing assertion)


def broker(tmp_path: Path) -> BrokerServer:
    cfg = BrokerConfig(cluster="c", name="b0", controller="127.0.0.1:1", listen="127.0.0.1:1",
                       ha_listen="127.0.0.1:2", store_dir=str(tmp_path / "b"))
    return BrokerServer(cfg)


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


def run(tmp_path: Path, body: Callable[[BrokerServer], Awaitable[None]]) -> None:
    async def main() -> None:
        b = broker(tmp_path)
        try:
            await body(b)
        finally:
            b.store.close()

    asyncio.run(main())


def test_the_timer_loop_outlives_a_tick_that_raises(tmp_path: Path) -> None:
    ticks: list[int] = []

    def tick(now: int) -> list[Effect]:
        ticks.append(now)
        if len(ticks) <= 2:
            raise RuntimeError("a bug")
        return []

    async def body(b: BrokerServer) -> None:
        b.agent.tick = tick  # type: ignore[method-assign]
        task = asyncio.get_running_loop().create_task(b._drive())
        try:
            await until(lambda: len(ticks) >= 4 or task.done())
            assert not task.done()
        finally:
            task.cancel()

    run(tmp_path, body)


def test_an_input_that_raises_is_logged_not_raised_into_its_caller(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    def broken(now: int) -> list[Effect]:
        raise RuntimeError("a bug")

    async def body(b: BrokerServer) -> None:
        b.agent.slave_acked = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="dledger.broker.server"):
            b._on_slave_ack()  # (the HA listener's callback)
        assert "a slave's ack" in caplog.text and "a bug" in caplog.text

    run(tmp_path, body)


def test_an_effect_that_fails_does_not_lose_the_ones_after_it(tmp_path: Path) -> None:
    async def body(b: BrokerServer) -> None:
        def wake() -> None:
            raise RuntimeError("a bug")

        b.ha.wake = wake  # type: ignore[method-assign]
        fut: asyncio.Future[bm.SendResponse | DLedgerError] = asyncio.get_running_loop().create_future()
        b._sends[1] = fut
        answer = bm.SendResponse(1, 0, [0])
        b._run([WakeHA(), SendDone(1, answer)])
        assert fut.done() and fut.result() == answer

    run(tmp_path, body)


def test_confirm_offset_saves_never_overlap_and_the_newest_value_is_saved(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    lock, release = threading.Lock(), threading.Event()
    active, peak, written = [0], [0], []

    def slow_write(path: Path, value: int, index: int) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        release.wait(DEADLINE_S)  # a slow disk: held until the test has asked for more saves
        written.append(value)
        with lock:
            active[0] -= 1

    monkeypatch.setattr(server_module, "write_confirm", slow_write)

    async def body(b: BrokerServer) -> None:
        b._run([SaveConfirm(5)])
        await until(lambda: active[0] == 1)
        b._run([SaveConfirm(7)])
        b._run([SaveConfirm(9)])  # while 5 is being written: 7 is never written, 9 after 5
        await asyncio.sleep(0.2)
        release.set()
        await until(lambda: written[-1:] == [9] and active[0] == 0)
        await asyncio.sleep(0.1)

    run(tmp_path, body)
    assert written == [5, 9] and peak[0] == 1  # the SaveConfirm's values, one write at a time


def test_nothing_starts_once_stopping(tmp_path: Path) -> None:
    """Closing the HA listener may still report a proposal: no controller call starts then."""
    calls: list[cm.Request] = []

    async def body(b: BrokerServer) -> None:
        b.agent.proposal = lambda now: [CallController(99, cm.GetReplicaInfo("b0"))]  # type: ignore[method-assign]

        async def call(token: int, req: cm.Request) -> None:
            calls.append(req)

        b._call = call  # type: ignore[method-assign]
        real_close = b.ha.close

        async def close() -> Any:
            b._on_proposal(frozenset({1, 2}))
            await real_close()

        b.ha.close = close  # type: ignore[method-assign]
        await b.stop()
        await asyncio.sleep(0.05)
        assert calls == [] and not b._tasks

    run(tmp_path, body)


def test_a_failed_fsync_wait_is_told_to_the_agent(tmp_path: Path) -> None:
    """(The sends waiting for it get an answer, as when a send's own wait raised.)"""
    told: list[tuple[int, DLedgerError]] = []

    class BrokenFlush:
        async def wait(self, index: int) -> None:
            raise StoreError(ResponseCode.DISK_ERROR, "the flush thread is gone")

    def durable_failed(now: int, index: int, error: DLedgerError) -> list[Effect]:
        told.append((index, error))
        return []

    async def body(b: BrokerServer) -> None:
        b._durable = BrokenFlush()  # type: ignore[assignment]
        b.agent.durable_failed = durable_failed  # type: ignore[method-assign]
        await b._await_durable(7)
        assert len(told) == 1 and told[0][0] == 7 and told[0][1].code == ResponseCode.DISK_ERROR

    run(tmp_path, body)
