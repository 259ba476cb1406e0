"""The reference state machine: a replicated key-value store.

Keys and values are bytes. Every key remembers the index of the entry that last changed it
(`mod_index`, etcd's mod_revision), so compare-and-set can test it. Commands are the bodies
of log entries (msgpack, tagged); a body that is not a command gives an error result and
changes nothing: the state stays a function of the log whatever a client appended.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import BinaryIO

import msgspec
from sortedcontainers import SortedDict

from dledger.kv.commands import (
    MAX_RANGE,
    MAX_RANGE_BYTES,
    Cas,
    Command,
    Delete,
    Get,
    Item,
    Put,
    Query,
    Range,
    RangeResult,
    Result,
    decode_command,
    decode_query,
    encode,
)
from dledger.statemachine.api import AppliedEntry, SnapshotReader, SnapshotWriter, StateMachine

SNAPSHOT_FILE = "kv.msgpack"
_LEN = struct.Struct(">I")
_SNAPSHOT_BATCH = 10_000  # items per length-prefixed frame of the snapshot file

_items_decoder = msgspec.msgpack.Decoder(list[tuple[bytes, bytes, int]])


class KVStateMachine(StateMachine):
    def __init__(self) -> None:
        self._data: SortedDict = SortedDict()  # key -> (value, mod_index)

    def __len__(self) -> int:
        return len(self._data)

    # --- writes ------------------------------------------------------------------------------

    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        return [encode(self._apply_one(e)) for e in entries]

    def _apply_one(self, e: AppliedEntry) -> Result:
        try:
            cmd = decode_command(e.body)
        except (msgspec.DecodeError, UnicodeDecodeError) as err:
            return Result(False, e.index, error=f"not a KV command: {err}")
        return self._run(cmd, e.index)

    def _run(self, cmd: Command, index: int) -> Result:
        data = self._data
        old = data.get(cmd.key)
        prev, prev_index = (old[0], old[1]) if old is not None else (None, -1)
        if isinstance(cmd, Put):
            data[cmd.key] = (cmd.value, index)
            return Result(True, index, prev, prev_index)
        if isinstance(cmd, Delete):
            if old is not None:
                del data[cmd.key]
            return Result(old is not None, index, prev, prev_index)
        assert isinstance(cmd, Cas)
        if (cmd.expect_index is not None and cmd.expect_index != prev_index) or (
            cmd.expect_value is not None and cmd.expect_value != prev
        ):
            return Result(False, index, prev, prev_index)
        if cmd.value is None:
            data.pop(cmd.key, None)
        else:
            data[cmd.key] = (cmd.value, index)
        return Result(True, index, prev, prev_index)

    # --- reads -------------------------------------------------------------------------------

    def query(self, request: bytes) -> bytes:
        q: Query = decode_query(request)
        if isinstance(q, Get):
            found = self._data.get(q.key)
            return encode(None if found is None else Item(q.key, found[0], found[1]))
        assert isinstance(q, Range)
        return encode(self._range(q))

    def _range(self, q: Range) -> RangeResult:
        """A page: at most `limit` pairs and MAX_RANGE_BYTES of keys and values, but always
        one pair (a value may be as big as an entry body); `more` says where it was cut."""
        limit = min(max(q.limit, 1), MAX_RANGE)
        start = q.start_after + b"\x00" if q.start_after is not None else q.prefix
        out: list[Item] = []
        size = 0
        for key in self._data.irange(minimum=start):
            if not key.startswith(q.prefix):
                return RangeResult(out, False)
            value, index = self._data[key]
            size += len(key) + len(value)
            if len(out) == limit or (out and size > MAX_RANGE_BYTES):
                return RangeResult(out, True)
            out.append(Item(key, value, index))
        return RangeResult(out, False)

    def dump(self) -> list[tuple[bytes, bytes, int]]:
        """The whole state as (key, value, mod index), in key order (to compare copies)."""
        return [(k, v, i) for k, (v, i) in self._data.items()]

    def get(self, key: bytes) -> Item | None:
        """For an embedding program on the member itself (not linearizable: this copy)."""
        found = self._data.get(key)
        return None if found is None else Item(key, found[0], found[1])

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(self, writer: SnapshotWriter) -> None:
        enc = msgspec.msgpack.Encoder()
        with writer.open(SNAPSHOT_FILE) as f:
            batch: list[tuple[bytes, bytes, int]] = []
            for key, (value, index) in self._data.items():
                batch.append((key, value, index))
                if len(batch) == _SNAPSHOT_BATCH:
                    _write_frame(f, enc.encode(batch))
                    batch = []
            if batch:
                _write_frame(f, enc.encode(batch))

    def restore(self, reader: SnapshotReader | None) -> None:
        data: SortedDict = SortedDict()
        if reader is not None and SNAPSHOT_FILE in reader.names():
            with reader.open(SNAPSHOT_FILE) as f:
                while head := f.read(_LEN.size):
                    if len(head) != _LEN.size:
                        raise ValueError("KV snapshot ends inside a frame header")
                    (n,) = _LEN.unpack(head)
                    frame = f.read(n)
                    if len(frame) != n:
                        raise ValueError("KV snapshot ends inside a frame")
                    for key, value, index in _items_decoder.decode(frame):
                        data[key] = (value, index)
        self._data = data


def _write_frame(f: BinaryIO, payload: bytes) -> None:
    f.write(_LEN.pack(len(payload)))
    f.write(payload)
