"""Idempotent producers on real member processes: each body is stored once, whatever is retried.

A producer's appends are numbered; the leader answers a repeated sequence with the original
index (core.producers). The faults are real: SIGKILL of the leader while a producer appends,
and the whole group restarted."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import AsyncDLedgerClient, DLedgerClient

from .harness import Cluster, MakeCluster, read_all, wait_until

pytestmark = pytest.mark.integration
T = TypeVar("T")


def producer(cluster: Cluster, producer_id: str | None = None, timeout: float = 30.0) -> DLedgerClient:
    c = DLedgerClient(cluster.peers, cluster.group, timeout=timeout, idempotent=True, producer_id=producer_id)
    cluster._clients.append(c)
    return c


def bodies_in_log(cluster: Cluster) -> Counter[bytes]:
    return Counter(body for _, body in read_all(cluster.ctl).values())


def test_a_producer_sending_again_gets_the_original_indexes(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    first = producer(cluster, "job-1-part-0")
    bodies = [f"row-{k}".encode() for k in range(50)]
    original = first.append_batch(bodies[:30]) + first.append_batch(bodies[30:])
    # a retried task: a new client under the same id sends the same rows from sequence 0, in
    # other batches, and more rows after them
    again = producer(cluster, "job-1-part-0")
    resent = again.append_batch(bodies[:20]) + again.append_batch(bodies[20:45])
    assert [r.index for r in resent] == [r.index for r in original[:45]]
    assert [r.pos for r in resent] == [r.pos for r in original[:45]]
    more = again.append_batch([*bodies[45:], b"row-50"])  # five duplicates, one new
    assert [r.index for r in more[:5]] == [r.index for r in original[45:]]
    assert more[5].index > original[-1].index
    assert again._async.producer is not None and again._async.producer.duplicates == 50
    counts = bodies_in_log(cluster)
    assert all(counts[b] == 1 for b in [*bodies, b"row-50"]), counts.most_common(3)


def test_gaps_and_unknown_producers_are_refused(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    c = producer(cluster, "p-gap")
    c.append_batch([b"a", b"b"])
    p = c._async.producer
    assert p is not None
    p.next_seq = 5  # as if sequences 2..4 had been lost
    with pytest.raises(DLedgerError) as e:
        c.append(b"c")
    assert e.value.code == ResponseCode.OUT_OF_ORDER_SEQUENCE
    stranger = producer(cluster, "p-never-seen")
    q = stranger._async.producer
    assert q is not None
    q.next_seq, q.new_sessions = 3, False  # the member's answer, not the client's new session
    with pytest.raises(DLedgerError) as e:
        stranger.append(b"x")
    assert e.value.code == ResponseCode.UNKNOWN_PRODUCER
    assert bodies_in_log(cluster)[b"c"] == 0 and bodies_in_log(cluster)[b"x"] == 0


def test_an_expired_producer_starts_a_new_session(make_cluster: MakeCluster) -> None:
    """The leader answers a forgotten producer UNKNOWN_PRODUCER; the client starts the next
    epoch from sequence 0 under the same id by itself, chosen id or random."""
    cluster = make_cluster(3, extra=["--producer-expiry-ms", "1"])  # forgotten at the next other append
    chosen, auto, other = producer(cluster, "chosen"), producer(cluster), producer(cluster, "other")
    chosen.append(b"c0")
    auto.append(b"a0")
    time.sleep(0.05)
    other.append(b"o0")  # its marker is later than theirs by more than the expiry
    wait_until(lambda: _try(lambda: cluster.ctl.read(0, 100)) and len(cluster.ctl.read(0, 100)) == 3,
               what="the three appends read back")
    p, q = chosen._async.producer, auto._async.producer
    assert p is not None and q is not None
    old = q.id
    chosen.append(b"c1")
    auto.append(b"a1")
    assert (p.id, p.epoch, p.next_seq) == ("chosen", 1, 1)
    assert (q.id, q.epoch, q.next_seq) == (old, 1, 1)
    counts = bodies_in_log(cluster)
    assert all(counts[b] == 1 for b in (b"c0", b"c1", b"a0", b"a1")), counts


def test_an_evicted_producer_starts_a_new_session(make_cluster: MakeCluster) -> None:
    """Issue 26: a producer pushed out of the table (max_producers) stayed stuck
    (UNKNOWN_PRODUCER, then OUT_OF_ORDER_SEQUENCE); now its client goes on in a new session."""
    cluster = make_cluster(3, extra=["--max-producers", "1"])
    victim = producer(cluster, "victim")
    assert victim.append(b"v0").index >= 0
    for k in range(2):  # the second one's marker evicts the victim (the least recently used)
        producer(cluster, f"flood-{k}").append(f"f{k}".encode())
    more = victim.append_batch([b"v1", b"v2"])
    assert victim.append(b"v3").index > more[-1].index
    p = victim._async.producer
    assert p is not None and (p.id, p.epoch, p.next_seq) == ("victim", 1, 3)
    counts = bodies_in_log(cluster)
    assert all(counts[b] == 1 for b in (b"v0", b"v1", b"v2", b"v3", b"f0", b"f1")), counts


def test_leader_killed_while_producers_append_stores_each_body_once(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    acked: dict[bytes, int] = {}
    failed: list[bytes] = []
    stop = threading.Event()

    def run(name: str) -> None:
        c = producer(cluster, f"writer-{name}", timeout=60.0)
        k = 0
        while not stop.is_set():
            batch = [f"{name}-{k + j}".encode() for j in range(20)]
            try:
                for body, res in zip(batch, c.append_batch(batch), strict=True):
                    acked[body] = res.index
                k += 20
            except DLedgerError:
                failed.extend(batch)  # the next call sends the same rows again (deduplicated)

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in ("a", "b")]
    for t in threads:
        t.start()
    for _ in range(2):
        wait_until(lambda: len(acked) >= 400 + len(acked) // 2, what="appends before the kill", timeout=60)
        leader = cluster.wait_leader()
        cluster.kill(leader)
        wait_until(_grown(acked, 200), what="appends after the kill", timeout=90)
        cluster.restart(leader)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    cluster.wait_caught_up()
    log = read_all(cluster.ctl)
    counts = Counter(body for _, body in log.values())
    dups = [b for b, n in counts.items() if n > 1]
    assert not dups, f"stored twice: {dups[:5]}"
    for body, index in acked.items():
        assert log[index][1] == body, f"{body!r} acknowledged at {index}, the log holds {log.get(index)}"


def test_the_producer_table_survives_a_restart_of_every_member(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    c = producer(cluster, "restarted")
    bodies = [f"r-{k}".encode() for k in range(10)]
    original = c.append_batch(bodies)
    cluster.wait_caught_up()
    for m in cluster.ids:
        cluster.kill(m)
    for m in cluster.ids:
        cluster.restart(m)
    cluster.wait_leader()
    again = producer(cluster, "restarted")
    resent = wait_until(lambda: _try(lambda: again.append_batch(bodies)), what="the group answers", timeout=60)
    assert [r.index for r in resent] == [r.index for r in original]
    assert all(n == 1 for b, n in bodies_in_log(cluster).items() if b in bodies)


def _grown(d: dict[bytes, int], by: int) -> Callable[[], bool]:
    target = len(d) + by
    return lambda: len(d) > target


def _try(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except DLedgerError:
        return None


def test_bodies_of_a_cancelled_append_are_never_answered_for_others(make_cluster: MakeCluster) -> None:
    """Found in review: a cancelled append left its sequence free, the next append's bodies
    went out under it and were answered as duplicates of the cancelled ones (never stored).
    Now they are unsettled: a random id moves on, a chosen id refuses other bodies."""
    cluster = make_cluster(1)

    async def run(producer_id: str | None) -> tuple[list[int], DLedgerError | None]:
        c = AsyncDLedgerClient(cluster.peers, cluster.group, timeout=10.0, idempotent=True, producer_id=producer_id)
        try:
            for _ in range(20):  # cancel with the request out (some cancellations land before sending)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(c.append_batch([b"cancelled"]), 0.002)
            try:
                return [r.index for r in await c.append_batch([b"other-" + (producer_id or "r").encode()])], None
            except DLedgerError as e:
                return [], e
        finally:
            await c.close()

    indexes, err = asyncio.run(run(None))
    assert err is None and len(indexes) == 1
    log = read_all(cluster.ctl)
    assert log[indexes[0]][1] == b"other-r"  # stored, at the index it was answered with
    indexes, err = asyncio.run(run("chosen-one"))
    if err is not None:  # the cancelled bodies were unsettled: others are refused, not dropped
        assert err.code == ResponseCode.OUT_OF_ORDER_SEQUENCE and "send them again first" in err.message
    else:
        assert read_all(cluster.ctl)[indexes[0]][1] == b"other-chosen-one"
