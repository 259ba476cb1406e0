"""The reference state machine: a replicated key-value store (`state_machine = "kv"`).

`machine` and `commands` sit below the runtime (members load them); `client` and
`command` above it. The package exports lazily, so a member loading the state machine
does not import the client."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dledger.kv.client import AsyncKVClient, KVClient
    from dledger.kv.commands import Item, RangeResult, Result
    from dledger.kv.machine import KVStateMachine

_EXPORTS = {
    "AsyncKVClient": "dledger.kv.client",
    "KVClient": "dledger.kv.client",
    "Item": "dledger.kv.commands",
    "RangeResult": "dledger.kv.commands",
    "Result": "dledger.kv.commands",
    "KVStateMachine": "dledger.kv.machine",
}

__all__ = ["AsyncKVClient", "Item", "KVClient", "KVStateMachine", "RangeResult", "Result"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dledger.kv' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
