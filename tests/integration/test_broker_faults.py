"""Broker sets on real processes when a process hangs or a connection dies.

A long-lived broker client leaves a hung master (SIGSTOP, its kernel still accepting
connections) for the master the controllers elect, while the old one is still stopped; at
most the send in flight when it stopped fails, saying its outcome is unknown, and every
acknowledged send is in the log afterwards. A slave killed while the master streams to it
leaves the SyncStateSet because its connection died (the other ways out, housekeeping and
the catch-up limit, are set far beyond the test's deadlines), and the all-ack master
acknowledges again. A flush=async master that lost its acknowledged tail to a power loss and
restarted while still counted master becomes the slave of the replica holding that tail.

No timing assertions: conditions are waited for with generous deadlines; the stall the
client saw is printed (pytest -s) for the record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dledger.broker.client import BrokerClient, SendResult
from dledger.codes import DLedgerError

from .harness import wait_until
from .test_broker import ALL_ACK, deployment, in_sync, the_master, the_slave

pytestmark = pytest.mark.integration

STOP_S = 10.0


@dataclass
class Writer:
    """Sends r0, r1, ... in a loop from one client object, recording every outcome."""

    client: BrokerClient
    acked: list[tuple[float, bytes, SendResult]] = field(default_factory=list)
    failed: list[tuple[float, bytes, DLedgerError]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            body = b"r%d" % i
            i += 1
            try:
                r = self.client.send(body)
            except DLedgerError as e:
                self.failed.append((time.monotonic(), body, e))
                continue
            self.acked.append((time.monotonic(), body, r))


def _try(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except DLedgerError as e:
        return e


def read_all(c: BrokerClient, replica: str | None = None) -> dict[int, bytes]:
    """Every confirmed record (index -> body), page by page."""
    log: dict[int, bytes] = {}
    while page := c.read(len(log), 10_000, replica=replica):
        log.update((r.index, r.body) for r in page)
    return log


def test_a_long_lived_client_leaves_a_hung_master(tmp_path: Path) -> None:
    with deployment(tmp_path) as d:
        master, slave = the_master(d), the_slave(d)
        wait_until(lambda: in_sync(d, 2), 30, "SyncStateSet of 2")
        old_epoch = d.info(master).master_epoch
        pid = d.brokers[master].pid
        # the writer: timeout 10 s, longer than an election, shorter than the stop; the reader's
        # timeout is beyond the test's deadlines: its read must leave the hung master, not time out
        with d.client("b0") as c, d.client("b0", timeout=300.0) as reader:
            w = Writer(c)
            t = threading.Thread(target=w.run, daemon=True)
            t.start()
            stopped = False
            read: list[object] = []
            reading = threading.Thread(target=lambda: read.append(_try(lambda: reader.read(0, 10))), daemon=True)
            try:
                wait_until(lambda: len(w.acked) >= 20, 30, "sends acknowledged before the stop")
                assert [x.body for x in reader.read(0, 2)] == [b"r0", b"r1"]  # (it knows the master now)
                os.kill(pid, signal.SIGSTOP)
                stopped, t_stop = True, time.monotonic()
                reading.start()
                # the same client object, acknowledged by the new master while the old one is stopped
                first_new = wait_until(lambda: next((a for a in w.acked if a[2].epoch > old_epoch), None), 60,
                                       "a send acknowledged by the new master")
                # and a read that went to the hung master answered (by another replica)
                wait_until(lambda: read, 60, "a read that went to the hung master")
                assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # (still there, still stopped)
                assert d.info(slave).role == "MASTER"
                assert isinstance(read[0], list) and [x.body for x in read[0]][:2] == [b"r0", b"r1"], read
                print(f"\nlong-lived client stalled {first_new[0] - t_stop:.2f} s after the stop "
                      f"(epoch {old_epoch} -> {first_new[2].epoch})")
                time.sleep(max(0.0, t_stop + STOP_S - time.monotonic()))
            finally:
                if stopped:
                    os.kill(pid, signal.SIGCONT)
                w.stop.set()
                t.join(60)
                reading.join(60)
            assert not t.is_alive() and not reading.is_alive()
            before = [f for f in w.failed if f[0] < t_stop]
            assert not before, before
            # at most the send in flight at the stop fails, and it says its outcome is unknown
            assert len(w.failed) <= 1, [(b, e) for _, b, e in w.failed]
            for _, _, e in w.failed:
                assert "outcome unknown" in e.message, e
            assert len(w.acked) > 20
            wait_until(lambda: d.info(master).role == "SLAVE", 60, "the old master rejoined as a slave")
            # every acknowledged send is in the log, at its index (an unknown outcome may or may not be)
            log = read_all(c)
            for _, body, r in w.acked:
                assert log.get(r.index) == body, (r, body, log.get(r.index))
            wait_until(lambda: read_all(c, d.specs[master].address) == log, 60, "the old master holds the same log")


def test_a_slave_killed_mid_stream_leaves_the_sync_state_set(tmp_path: Path) -> None:
    """SIGKILL of the slave while the master writes big batches to it, three times: each time
    the master proposes the dead slave out (its HA connection's clean-up: nothing else would
    within 10 minutes) and acknowledges all-ack sends again; the slave back, it rejoins."""
    config = tmp_path / "broker.toml"
    config.write_text("ha_housekeeping_ms = 600000\nha_max_time_slave_not_catchup_ms = 600000\n")
    with deployment(tmp_path, args=[*ALL_ACK, "--config", str(config)]) as d:
        master, slave = the_master(d), the_slave(d)
        batch = [b"z" * 4000] * 250  # 1 MB a send: the master is writing when the slave dies
        with d.client("b0", timeout=30.0) as c:
            for kill in range(3):
                wait_until(lambda: in_sync(d, 2), 60, f"SyncStateSet of 2 (kill {kill})")
                w = BatchWriter(c, batch)
                t = threading.Thread(target=w.run, daemon=True)
                t.start()
                try:
                    wait_until(lambda: w.acked >= 2, 60, "big batches acknowledged by both")  # noqa: B023
                    d.kill_broker(slave)
                    wait_until(lambda: in_sync(d, 1), 60, f"the dead slave out of the SyncStateSet (kill {kill})")
                    acked = w.acked
                    wait_until(lambda: w.acked > acked, 60, "the all-ack master acknowledges again")  # noqa: B023
                finally:
                    w.stop.set()
                    t.join(90)
                assert not t.is_alive()
                assert d.info(master).role == "MASTER"
                d.start_broker(slave)
            wait_until(lambda: in_sync(d, 2), 60, "SyncStateSet of 2 at the end")
            assert c.send(b"together").index > 0


@dataclass
class BatchWriter:
    client: BrokerClient
    batch: list[bytes]
    acked: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.send_batch(self.batch)
            except DLedgerError:
                continue  # (a send the slave's death left unacknowledged: FLUSH_SLAVE_TIMEOUT)
            self.acked += 1


def test_a_restarted_async_master_that_lost_its_tail_becomes_a_slave(tmp_path: Path) -> None:
    """flush=async, all-ack: records acknowledged on both copies, then the master loses power
    and its page cache with them (SIGKILL, then its log cut back to before them, as a power
    loss leaves an unsynced tail: `dledger store truncate`), and restarts while the
    controllers still count it master (a 10 s lease keeps it alive that long). It must not
    go on as master (its slave would cut the acknowledged records): the controllers elect
    the slave, which holds them, and the restarted master copies them back as its slave."""
    from dledger.broker.local import local_broker_cluster
    from dledger.ports import free_port_run

    ctl = tmp_path / "controller.toml"
    ctl.write_text("[controller]\nbroker_heartbeat_timeout_ms = 15000\n")
    broker = tmp_path / "broker.toml"
    broker.write_text("lease_ms = 10000\n")
    base = free_port_run(3 + 4)
    with local_broker_cluster(tmp_path / "d", controllers=3, broker_sets=1, replicas=2, base_port=base,
                              broker_args=[*ALL_ACK, "--config", str(broker)],
                              controller_args=["--config", str(ctl)]) as d:
        master, slave = the_master(d), the_slave(d)
        wait_until(lambda: in_sync(d, 2), 60, "SyncStateSet of 2")
        with d.client("b0", timeout=10.0) as c:
            kept = [c.send(b"a%d" % i) for i in range(20)]
            lost = [c.send(b"b%d" % i) for i in range(20)]  # acknowledged: on both copies
            epoch = d.info(master).master_epoch
            wait_until(lambda: d.info(slave).max_offset == d.info(master).max_offset, 30, "the slave has them")
            d.kill_broker(master)
            cut = subprocess.run([sys.executable, "-m", "dledger", "store", "truncate", "--force", "--store-dir",
                                  str(d.specs[master].store_dir / "commitlog"), "--from-index", str(lost[0].index)],
                                 capture_output=True, text=True, timeout=60)
            assert cut.returncode == 0, cut.stderr
            d.start_broker(master)
            wait_until(lambda: _try(lambda: d.info(master).max_offset) == lost[0].offset, 30,
                       "the restarted master, without its tail")
            wait_until(lambda: _try(lambda: d.info(slave).role) == "MASTER", 90, "the slave elected")
            # registered again while still counted master: its registration took the role away
            # (an epoch without a master), then the slave was elected
            assert d.info(slave).master_epoch >= epoch + 2
            wait_until(lambda: _try(lambda: d.info(master).role) == "SLAVE", 60, "the restarted master follows")
            after = c.send(b"after")
            expected = [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)] + [b"after"]
            assert [body for _, body in sorted(read_all(c).items())] == expected
            wait_until(lambda: _try(lambda: read_all(c, d.specs[master].address)) == dict(enumerate(expected)), 60,
                       "the restarted master's log")
            assert after.index == 40 and [r.index for r in kept + lost] == list(range(40))
