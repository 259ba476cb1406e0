"""dledger: a Raft-replicated commit log for Python, after RocketMQ's DLedger."""

from __future__ import annotations

from dledger.codes import DLedgerError, ResponseCode
from dledger.config import DLedgerConfig

__all__ = ["DLedgerConfig", "DLedgerError", "ResponseCode"]
__version__ = "0.1.0"
