"""Ledger stores: the LedgerStore interface, a memory store and the mmap file store."""

from __future__ import annotations

from dledger.config import DLedgerConfig
from dledger.store.base import AppendedBatch, LedgerStore, RawRange, StoreError, TermVote
from dledger.store.file import FileLedgerStore
from dledger.store.memory import MemoryLedgerStore

__all__ = [
    "AppendedBatch",
    "FileLedgerStore",
    "LedgerStore",
    "MemoryLedgerStore",
    "RawRange",
    "StoreError",
    "TermVote",
    "open_store",
]


def open_store(config: DLedgerConfig) -> LedgerStore:
    """The store a member's config asks for."""
    if config.store_type == "memory":
        return MemoryLedgerStore(config.max_body_bytes)
    return FileLedgerStore(
        config.store_dir,
        data_file_size=config.data_file_size,
        index_file_size=config.index_file_size,
        max_body_bytes=config.max_body_bytes,
        flush=config.flush,
        flush_interval_ms=config.flush_interval_ms,
        checkpoint_interval_ms=config.checkpoint_interval_ms,
        file_reserved_hours=config.file_reserved_hours,
        retention_hours=config.retention_hours,
        disk_space_ratio_to_check_expired=config.disk_space_ratio_to_check_expired,
        disk_space_ratio_to_force_clean=config.disk_space_ratio_to_force_clean,
        retention_check_interval_ms=config.retention_check_interval_ms,
    )
