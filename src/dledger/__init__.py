"""dledger: a Raft-replicated commit log for Python, after RocketMQ's DLedger."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dledger.broker.client import AsyncBrokerClient, BrokerClient, BrokerRecord, SendResult
    from dledger.codes import DLedgerError, ResponseCode
    from dledger.config import DLedgerConfig
    from dledger.runtime.client import (
        AppendResult,
        AsyncDLedgerClient,
        DLedgerClient,
        Entry,
        Member,
        Members,
        Metadata,
        ProposeResult,
    )
    from dledger.runtime.server import DLedgerServer
    from dledger.security.tls import TlsConfig
    from dledger.statemachine.api import AppliedEntry, SnapshotReader, SnapshotWriter, StateMachine

# where each public name lives: imported on first use, so `dledger --help` and a member's
# start do not load the clients, the broker and the server they do not need
_HOME = {
    "AppendResult": "dledger.runtime.client",
    "AsyncDLedgerClient": "dledger.runtime.client",
    "DLedgerClient": "dledger.runtime.client",
    "Entry": "dledger.runtime.client",
    "Member": "dledger.runtime.client",
    "Members": "dledger.runtime.client",
    "Metadata": "dledger.runtime.client",
    "ProposeResult": "dledger.runtime.client",
    "AsyncBrokerClient": "dledger.broker.client",
    "BrokerClient": "dledger.broker.client",
    "BrokerRecord": "dledger.broker.client",
    "SendResult": "dledger.broker.client",
    "DLedgerError": "dledger.codes",
    "ResponseCode": "dledger.codes",
    "DLedgerConfig": "dledger.config",
    "DLedgerServer": "dledger.runtime.server",
    "TlsConfig": "dledger.security.tls",
    "AppliedEntry": "dledger.statemachine.api",
    "SnapshotReader": "dledger.statemachine.api",
    "SnapshotWriter": "dledger.statemachine.api",
    "StateMachine": "dledger.statemachine.api",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'dledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "AppendResult",
    "AppliedEntry",
    "AsyncBrokerClient",
    "AsyncDLedgerClient",
    "BrokerClient",
    "BrokerRecord",
    "DLedgerClient",
    "DLedgerConfig",
    "DLedgerError",
    "DLedgerServer",
    "Entry",
    "Member",
    "Members",
    "Metadata",
    "ProposeResult",
    "ResponseCode",
    "SendResult",
    "SnapshotReader",
    "SnapshotWriter",
    "StateMachine",
    "TlsConfig",
]
__version__ = "0.1.0"
