"""SimDiskStore: a memory store whose writes are durable only once "fsynced".

The simulator decides when a flush completes (after a simulated fsync delay);
a crash drops every entry past the last flush, as a power loss drops the page
cache. currterm is written through at once, as the file store does with fsync.
"""

from __future__ import annotations

from collections.abc import Callable

from dledger.store.memory import MemoryLedgerStore


class SimDiskStore(MemoryLedgerStore):
    def __init__(self) -> None:
        super().__init__()
        self.synced_index = -1
        self.flush_requested = False
        self.on_request: Callable[[], None] | None = None

    def _mark_written(self) -> None:
        # MemoryLedgerStore reports everything durable; here only a flush does
        self.durable_index = min(self.durable_index, self.synced_index)

    def append_as_leader(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        res = super().append_as_leader(*args, **kwargs)
        self._mark_written()
        return res

    def append_as_follower(self, data):  # type: ignore[no-untyped-def]
        end = super().append_as_follower(data)
        self._mark_written()
        return end

    def truncate(self, from_index: int) -> None:
        super().truncate(from_index)
        # a truncate is made durable at once (the file store zeroes and fsyncs)
        self.synced_index = min(self.synced_index, self.end_index)
        self.durable_index = min(self.durable_index, self.synced_index)

    def request_flush(self) -> None:
        if not self.flush_requested:
            self.flush_requested = True
            if self.on_request is not None:
                self.on_request()

    def complete_flush(self) -> int:
        """The simulated fsync finished: everything written so far is durable."""
        self.flush_requested = False
        self.synced_index = self.end_index
        self._publish_durable(self.end_index)
        return self.end_index

    def crash(self) -> None:
        """Lose what was not flushed. The commit index kept is at most the durable one,
        as the file store's checkpoint keeps it."""
        self.committed_index = min(self.committed_index, self.synced_index)
        if self.end_index > self.synced_index:
            super().truncate(self.synced_index + 1)
        self.durable_index = self.end_index
        self.flush_requested = False
        self._flush_listeners.clear()
