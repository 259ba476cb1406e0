"""dledger: a Raft-replicated commit log for Python, after RocketMQ's DLedger."""

from __future__ import annotations

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
