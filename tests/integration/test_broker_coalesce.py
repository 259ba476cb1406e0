"""Broker sends on real processes: concurrent `send` calls of one client coalesced into fewer
SEND_MESSAGE requests, each caller with its own offset and index; and a master change
followed by sends leaves each replica's epoch file agreeing with its log (the epoch-file
writes and the new master's fsync run off the event loop, docs/brokers.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger.broker.client import AsyncBrokerClient
from dledger.broker.epoch_file import decode
from dledger.broker.local import local_broker_cluster
from dledger.broker.server import EPOCH_FILE
from dledger.ports import free_port_run

from .harness import wait_until
from .test_broker import ALL_ACK, the_master, the_slave

pytestmark = pytest.mark.integration


def deployment(tmp_path: Path, args: list[str]) -> local_broker_cluster:
    return local_broker_cluster(tmp_path, controllers=3, broker_sets=1, replicas=2, base_port=free_port_run(7),
                                broker_args=args)


async def _concurrent(controller: str, n: int, coalesce: bool) -> tuple[list[tuple[bytes, int, int]], int]:
    async with AsyncBrokerClient(controller, "b0", timeout=20.0, coalesce=coalesce) as c:
        bodies = [f"c{coalesce}-{i}".encode() for i in range(n)]
        results = await asyncio.gather(*(c.send(b) for b in bodies))
        return [(b, r.offset, r.index) for b, r in zip(bodies, results, strict=True)], c.send_requests


def test_concurrent_sends_are_coalesced_and_each_caller_gets_its_own_record(tmp_path: Path) -> None:
    with deployment(tmp_path, ALL_ACK) as d:
        master = the_master(d)
        wait_until(lambda: len(d.info(master).sync_state_set) == 2, 30, "SyncStateSet of 2")
        sent, requests = asyncio.run(_concurrent(d.controller, 64, coalesce=True))
        assert 1 <= requests < 64  # fewer SEND_MESSAGE requests than sends
        indexes = sorted(i for _, _, i in sent)
        assert indexes == list(range(64))  # every caller its own index, none twice
        assert len({o for _, o, _ in sent}) == 64
        with d.client("b0") as c:
            by_index = {r.index: r for r in c.read(0, 1000)}
            for body, offset, index in sent:  # the record at a caller's index is its own body
                assert by_index[index].body == body and by_index[index].offset == offset
        # off: one request per send (the old path, the benchmark's "before")
        sent_off, requests_off = asyncio.run(_concurrent(d.controller, 8, coalesce=False))
        assert requests_off == 0 and sorted(i for _, _, i in sent_off) == list(range(64, 72))


def test_master_changes_then_sends_keep_epoch_file_and_log_consistent(tmp_path: Path) -> None:
    """Two failovers with sends in between: each master's epoch begins where its log ended
    when it took over, every replica's epoch cache (read from the file it wrote off the loop)
    names every epoch that wrote, and the records read back are the acknowledged ones."""
    with deployment(tmp_path, [*ALL_ACK, "--flush", "sync"]) as d:
        acked: list[tuple[int, int, bytes]] = []
        for round_ in range(3):
            _send_round(d, round_, acked, failover=round_ < 2)
        master = the_master(d)
        wait_until(lambda: all(d.info(k).max_offset == d.info(master).max_offset for k in d.specs), 60,
                   "every replica caught up")
        epochs_seen = {e for _, e, _ in acked}
        with d.client("b0") as c:
            records = {r.index: r for r in c.read(0, 1000)}
            for index, epoch, body in acked:
                assert records[index].body == body and records[index].epoch == epoch
            for key in d.specs:
                cache = c.epoch_cache(d.specs[key].address)
                starts = [(e.epoch, e.start_offset) for e in cache.epochs]
                assert [s for _, s in starts] == sorted(s for _, s in starts)
                assert epochs_seen <= {e for e, _ in starts}, (key, starts, epochs_seen)
                for e in cache.epochs:  # each entry's range holds only records of its epoch
                    held = [r for r in records.values() if e.start_offset <= r.offset < e.end_offset]
                    assert all(r.epoch == e.epoch for r in held), (key, e)
                # the file (written by a worker thread) says what the replica's memory says
                _file_says(d.specs[key].store_dir / EPOCH_FILE, starts)


def _send_round(d: local_broker_cluster, round_: int, acked: list[tuple[int, int, bytes]], failover: bool) -> None:
    master, slave = the_master(d), the_slave(d)
    wait_until(lambda: len(d.info(master).sync_state_set) == 2, 60, "SyncStateSet of 2")
    with d.client("b0", timeout=20.0) as c:
        for i in range(20):
            body = f"r{round_}-{i}".encode()
            r = c.send(body)
            acked.append((r.index, r.epoch, body))
    wait_until(lambda: d.info(slave).max_offset == d.info(master).max_offset, 30, "the slave caught up")
    if failover:
        d.kill_broker(master)
        wait_until(lambda: d.master_of("b0") == slave, 60, "the slave elected")
        d.start_broker(master)


def _file_says(path: Path, starts: list[tuple[int, int]]) -> None:
    wait_until(lambda: [(x.epoch, x.start) for x in decode(path.read_bytes())] == starts, 30,
               f"{path} written")
