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
    plain.append(b"p2")
    markers, nxt, committed = plain.read_markers(0)
    assert committed >= rows[-1].index and nxt == committed + 1
    assert len(markers) == 1 and markers[0].magic == 4 and markers[0].index == rows[0].index - 1
    m = msgspec.msgpack.decode(markers[0].body, type=SessionMarker)
    assert [(r.producer, r.first_seq, r.count) for r in m.runs] == [("txn:j/p0", 0, 3)]
    assert plain.read_markers(rows[0].index)[0] == []  # from after it: none
    # a plain READ still never shows markers
    assert [e.body for e in plain.read(0, 100)] == [b"p0", b"p1", b"a", b"b", b"c", b"p2"]
