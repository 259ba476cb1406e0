"""A markers-only READ (what a read_committed reader attributes entries with): only the
committed session markers, naming each following entry's producer (core.reads)."""

from __future__ import annotations

import msgspec
import pytest

from dledger.core.producers import SessionMarker
from dledger.runtime.client import DLedgerClient

from .harness import MakeCluster

pytestmark = pytest.mark.integration


def test_markers_only_read_names_who_appended_each_entry(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1)
    plain = cluster.client()
    plain.append_batch([b"p0", b"p1"])
    with DLedgerClient(cluster.peers, cluster.group, timeout=30, idempotent=True, producer_id="txn:j/p0") as c:
        rows = c.append_batch([b"a", b"b", b"c"])
    with DLedgerClient(cluster.peers, cluster.group, timeout=30, idempotent=True, producer_id="secret-7") as c:
        c.append(b"s0")
    plain.append(b"p2")
    markers, nxt, committed = plain.read_markers(0)
    assert committed >= rows[-1].index and nxt == committed + 1
    assert len(markers) == 2 and {m.magic for m in markers} == {4} and markers[0].index == rows[0].index - 1
    m = msgspec.msgpack.decode(markers[0].body, type=SessionMarker)
    assert [(r.producer, r.first_seq, r.count) for r in m.runs] == [("txn:j/p0", 0, 3)]
    # another producer's id stays its own (docs/security.md): the run says how many entries only
    other = msgspec.msgpack.decode(markers[1].body, type=SessionMarker)
    assert [(r.producer, r.count, r.owner) for r in other.runs] == [("", 1, "")]
    assert not any(b"secret-7" in x.body for x in markers)
    assert len(plain.read_markers(rows[0].index)[0]) == 1  # from after the first: the second only
    # a plain READ still never shows markers
    assert [e.body for e in plain.read(0, 100)] == [b"p0", b"p1", b"a", b"b", b"c", b"s0", b"p2"]
