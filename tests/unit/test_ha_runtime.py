"""The HA runtime on real asyncio streams (uvloop, as brokers run): a slave's connection that
dies under the master's write loop still takes the slave out of the SyncStateSet.

uvloop raises RuntimeError ("unable to perform operation on <TCPTransport closed=True>") for
a write to a transport that closed while the write loop was between writes; the master's
clean-up must run for it as for a reset or an end of stream, or an all-ack master waits for
a dead slave until housekeeping removes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig
from dledger.broker.ha_runtime import HAListener, SlaveRunner
from dledger.broker.ha_service import MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.ports import free_ports
from dledger.runtime.faults import FaultInjector
from dledger.store.memory import MemoryLedgerStore

uvloop = pytest.importorskip("uvloop")

# no other way out of the set within the test: silence and lag limits far beyond its deadlines
CFG = HAConfig(heartbeat_ms=100, housekeeping_ms=600_000, max_not_catchup_ms=600_000, handshake_retry_ms=100)


async def until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for `cond` (a generous deadline: it only bounds how long a failure takes to show)."""
    try:
        async with asyncio.timeout(timeout):
            while not cond():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:.0f} s") from None


async def transport_closed_under_the_write_loop() -> None:
    master_log, slave_log = BrokerLog(MemoryLedgerStore()), BrokerLog(MemoryLedgerStore())
    epochs = EpochFileCache()
    epochs.append_entry(1, 0)
    for i in range(50):
        master_log.append([b"x" * (i + 1)], 1)
    ha = MasterHA(1, master_log, epochs, CFG, {1})
    proposals: list[frozenset[int]] = []

    def accept(proposal: frozenset[int]) -> None:  # the controller accepts every proposal
        proposals.append(proposal)
        ha.set_sync_state_set(proposal)

    address = f"127.0.0.1:{free_ports(1)[0]}"
    listener = HAListener(lambda: ha, accept, lambda: None)
    await listener.start(address)
    faults = FaultInjector()
    runner = SlaveRunner(SlaveClient(2, slave_log, EpochFileCache(), CFG), address, lambda: None, faults=faults)
    slave = asyncio.get_running_loop().create_task(runner.run())
    try:
        await until(lambda: ha.tracker.effective == {1, 2} and proposals[-1:] == [frozenset({1, 2})]
                    and slave_log.max_offset == master_log.max_offset, "the slave in the SyncStateSet")
        master_log.append([b"y" * 4096], 1)
        end = master_log.max_offset
        assert ha.confirm_offset < end  # all-ack: waits for the slave
        # the connection is lost (uvloop closes the handle once connection_lost has run) and
        # the write loop is woken with bytes to send in the same turn, before the read loop
        # sees the end of the stream: its write meets the closed handle (RuntimeError). The
        # slave is kept from coming back.
        (writer,) = listener._writers
        writer.transport.abort()
        listener.wake()
        faults.ha_cut = True
        await until(lambda: proposals[-1] == frozenset({1}), "the dead slave proposed out of the set")
        assert not ha.connections and not listener._writers
        assert ha.confirm_offset == end  # the master alone: it acknowledges again
    finally:
        slave.cancel()
        await asyncio.gather(slave, return_exceptions=True)
        await listener.close()


def test_a_transport_closed_under_the_write_loop_removes_the_slave(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dledger.broker.ha_runtime")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(transport_closed_under_the_write_loop())
    closed = [r for r in caplog.records if r.getMessage().startswith("HA connection from")]
    assert len(closed) == 1 and closed[0].levelno == logging.WARNING, closed  # once, as a connection's end
    assert "the handler is closed" in closed[0].getMessage()  # (the exact error this test is about)
