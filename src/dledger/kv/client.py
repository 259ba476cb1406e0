"""KVClient: the replicated key-value store from Python (a group running `state_machine = "kv"`).

Writes are proposals (one round trip: appended, committed, applied, answered with the
result); reads are queries of the leader's state, which includes every write acknowledged
before the read began. Keys and values are bytes; str is encoded as UTF-8.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

from dledger.codes import DLedgerError, ResponseCode
from dledger.kv.commands import (
    MAX_RANGE,
    Cas,
    Delete,
    Get,
    Item,
    Put,
    Range,
    RangeResult,
    Result,
    decode_item,
    decode_range,
    decode_result,
    encode,
)
from dledger.runtime.client import AsyncDLedgerClient, DLedgerClient
from dledger.security.tls import TlsConfig

__all__ = ["AsyncKVClient", "Item", "KVClient", "RangeResult", "Result"]


def _b(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


def _checked(r: Result) -> Result:
    if r.error:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, r.error)
    return r


class AsyncKVClient:
    def __init__(self, peers: str, group: str = "default", timeout: float = 5.0,
                 tls: TlsConfig | ssl.SSLContext | None = None, auth_token: str | None = None,
                 client: AsyncDLedgerClient | None = None) -> None:
        self.log = client or AsyncDLedgerClient(peers, group, timeout, tls=tls, auth_token=auth_token)

    async def close(self) -> None:
        await self.log.close()

    async def __aenter__(self) -> AsyncKVClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def put(self, key: bytes | str, value: bytes | str) -> Result:
        return await self._propose(Put(_b(key), _b(value)))

    async def delete(self, key: bytes | str) -> Result:
        """`ok` says whether the key existed."""
        return await self._propose(Delete(_b(key)))

    async def cas(self, key: bytes | str, value: bytes | str | None, *, expect_index: int | None = None,
                  expect_value: bytes | str | None = None) -> Result:
        """Set (or delete, value None) only if the key's mod index is `expect_index` (-1: absent)
        and/or its value is `expect_value`; `ok` says whether it did."""
        if expect_index is None and expect_value is None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "cas needs expect_index or expect_value")
        return await self._propose(Cas(_b(key), None if value is None else _b(value), expect_index,
                                       None if expect_value is None else _b(expect_value)))

    async def get(self, key: bytes | str, consistency: str | None = None, member: str | None = None) -> Item | None:
        """`member`: that member's own applied copy (consistency "local" unless another is given:
        "linearizable" there is a follower read, see AsyncDLedgerClient.query)."""
        return decode_item(await self.log.query(encode(Get(_b(key))), consistency, member))

    async def range(self, prefix: bytes | str = b"", limit: int = 1000, start_after: bytes | str | None = None,
                    consistency: str | None = None, member: str | None = None) -> RangeResult:
        """Up to `limit` keys under `prefix` after `start_after`; `more`: the limit cut it. A
        member answers a page of at most MAX_RANGE_BYTES (kv.commands) at a time: the pages
        are asked for in turn, each consistent by itself."""
        items: list[Item] = []
        more = False
        async for r in self.pages(prefix, limit, start_after, consistency, member):
            items.extend(r.items)
            more = r.more
        return RangeResult(items, more)

    async def pages(self, prefix: bytes | str = b"", limit: int | None = None, start_after: bytes | str | None = None,
                    consistency: str | None = None, member: str | None = None,
                    page: int = MAX_RANGE) -> AsyncIterator[RangeResult]:
        """The range page by page (one query each, at most `page` keys), on from each page's
        last key until `limit` keys (None: all) or the last one; the last page's `more` says
        whether keys remain."""
        after = None if start_after is None else _b(start_after)
        left = limit
        while left is None or left > 0:
            q = Range(_b(prefix), page if left is None else min(left, page), after)
            r = decode_range(await self.log.query(encode(q), consistency, member))
            if left is not None:
                left -= len(r.items)
            yield r
            if not r.more or not r.items:
                return
            after = r.items[-1].key

    async def scan(self, prefix: bytes | str = b"", page: int = 1000) -> AsyncIterator[Item]:
        """Every key under `prefix`, a page per query (each page consistent by itself)."""
        async for r in self.pages(prefix, None, page=page):
            for item in r.items:
                yield item

    async def _propose(self, cmd: Any) -> Result:
        return _checked(decode_result((await self.log.propose(encode(cmd))).result))


class KVClient:
    """Blocking KVClient (runs the async one on DLedgerClient's private loop thread)."""

    def __init__(self, peers: str, group: str = "default", timeout: float = 5.0,
                 tls: TlsConfig | ssl.SSLContext | None = None, auth_token: str | None = None,
                 client: DLedgerClient | None = None) -> None:
        """`client`: an open log client to use (and close) instead of making one."""
        self._log = client or DLedgerClient(peers, group, timeout, tls=tls, auth_token=auth_token)
        self._kv = AsyncKVClient(peers, group, client=self._log._async)

    def put(self, key: bytes | str, value: bytes | str) -> Result:
        return self._log._run(self._kv.put(key, value))

    def delete(self, key: bytes | str) -> Result:
        return self._log._run(self._kv.delete(key))

    def cas(self, key: bytes | str, value: bytes | str | None, *, expect_index: int | None = None,
            expect_value: bytes | str | None = None) -> Result:
        return self._log._run(self._kv.cas(key, value, expect_index=expect_index, expect_value=expect_value))

    def get(self, key: bytes | str, consistency: str | None = None, member: str | None = None) -> Item | None:
        return self._log._run(self._kv.get(key, consistency, member))

    def range(self, prefix: bytes | str = b"", limit: int = 1000, start_after: bytes | str | None = None,
              consistency: str | None = None, member: str | None = None) -> RangeResult:
        return self._log._run(self._kv.range(prefix, limit, start_after, consistency, member))

    def snapshot(self, member: str) -> int:
        """Make `member` snapshot now (see DLedgerClient.snapshot)."""
        return self._log.snapshot(member)

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
