"""The KV store's wire forms: commands (entry bodies), queries and their results (msgpack).

Commands and queries are tagged structs, so a body says what it is and a future command
can be added without breaking old logs. Keys are at most 4 KiB; values are bounded by the
group's `max_body_bytes` (they travel in an entry body).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

MAX_KEY = 4096
MAX_RANGE = 10_000  # items per range answer
# bytes of keys and values per range answer (a page holds at least one pair, whatever its
# size): an answer is built in memory and must fit in a frame (80 MiB of values answered
# INTERNAL_ERROR before); the client goes on from the last key (KVClient.range)
MAX_RANGE_BYTES = 4 << 20

Key = Annotated[bytes, msgspec.Meta(max_length=MAX_KEY)]


class Put(msgspec.Struct, tag="put", array_like=True, frozen=True):
    key: Key
    value: bytes


class Delete(msgspec.Struct, tag="del", array_like=True, frozen=True):
    key: Key


class Cas(msgspec.Struct, tag="cas", array_like=True, frozen=True):
    """Set `key` to `value` (delete it when None) only if it is as expected: its mod index is
    `expect_index` (-1: the key does not exist) and/or its value is `expect_value`."""

    key: Key
    value: bytes | None
    expect_index: int | None = None
    expect_value: bytes | None = None


Command = Put | Delete | Cas


class Get(msgspec.Struct, tag="get", array_like=True, frozen=True):
    key: Key


class Range(msgspec.Struct, tag="range", array_like=True, frozen=True):
    """Keys starting with `prefix` in byte order, after `start_after` (paging), at most `limit`."""

    prefix: Annotated[bytes, msgspec.Meta(max_length=MAX_KEY)] = b""
    limit: int = 1000
    start_after: Key | None = None


Query = Get | Range


class Result(msgspec.Struct, array_like=True, frozen=True):
    """What a command did: `ok` (put: always; delete: the key existed; cas: it matched), the
    entry's index, and the key's value and mod index before it (None / -1: absent)."""

    ok: bool
    index: int
    prev: bytes | None = None
    prev_index: int = -1
    error: str = ""


class Item(msgspec.Struct, array_like=True, frozen=True):
    key: bytes
    value: bytes
    mod_index: int


class RangeResult(msgspec.Struct, array_like=True, frozen=True):
    items: list[Item]
    more: bool  # the limit or MAX_RANGE_BYTES cut it: ask again with start_after = the last key


_encoder = msgspec.msgpack.Encoder()
_command_decoder = msgspec.msgpack.Decoder(Command)
_query_decoder = msgspec.msgpack.Decoder(Query)
_result_decoder = msgspec.msgpack.Decoder(Result)
_item_decoder = msgspec.msgpack.Decoder(Item | None)
_range_decoder = msgspec.msgpack.Decoder(RangeResult)


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode_command(body: bytes) -> Command:
    cmd: Command = _command_decoder.decode(body)
    return cmd


def decode_query(body: bytes) -> Query:
    q: Query = _query_decoder.decode(body)
    return q


def decode_result(data: bytes) -> Result:
    return _result_decoder.decode(data)


def decode_item(data: bytes) -> Item | None:
    item: Item | None = _item_decoder.decode(data)
    return item


def decode_range(data: bytes) -> RangeResult:
    return _range_decoder.decode(data)
