"""Columnar READ answers (the Spark source's bulk read): the columns a member older than the
option sends as entries are the same columns, and Arrow takes the buffers as they are."""

from __future__ import annotations

import msgspec
import pytest

from dledger.core.messages import EntriesResponse, EntryMsg
from dledger.entry import MAGIC_NOOP, MAGIC_NORMAL
from dledger.runtime.client import _columns_of

pa = pytest.importorskip("pyarrow")


def _entries() -> list[EntryMsg]:
    return [EntryMsg(5, 2, 0, MAGIC_NORMAL, b"abc"), EntryMsg(6, 2, 51, MAGIC_NOOP, b""),
            EntryMsg(7, 3, 99, MAGIC_NORMAL, b""), EntryMsg(8, 3, 147, MAGIC_NORMAL, b"xy" * 300)]


def test_an_old_members_entries_become_the_same_columns() -> None:
    old = _columns_of(EntriesResponse(200, "n0", _entries(), 9, 12))
    assert (old.count, old.next_index, old.committed_index) == (3, 9, 12)
    assert list(old.index_list()) == [5, 7, 8]
    from dledger.spark.schema import columns_batch

    batch = columns_batch("g", old)
    assert batch.to_pydict() == {"group": ["g"] * 3, "index": [5, 7, 8], "term": [2, 3, 3], "pos": [0, 99, 147],
                                 "body": [b"abc", b"", b"xy" * 300]}
    assert columns_batch("g", old, 2).column("index").to_pylist() == [5, 7]


def test_a_columnar_answer_survives_the_wire() -> None:
    old = _columns_of(EntriesResponse(200, "n0", _entries(), 9, 12))
    resp = EntriesResponse(200, "n0", [], 9, 12, columnar=True, indexes=old.indexes, terms=old.terms,
                           positions=old.positions, body_ends=old.body_ends, bodies=old.bodies)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(resp), type=EntriesResponse)
    assert _columns_of(back) == old
