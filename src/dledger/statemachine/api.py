"""What an embedded state machine implements, and what it is handed.

A group with a state machine applies every committed NORMAL entry to it, in index order, on
every member (NOOP and configuration entries advance the applied index without reaching it).
`apply` runs on one worker thread, never on the event loop, one batch at a time; `query`
and `snapshot` run on the same thread, between batches, so none of the three ever sees the
state change under it. The state lives in memory and in snapshots: on start the newest valid
snapshot is restored and the log after it is applied again, so `apply` must be
deterministic (the same entries give the same state and results on every member).
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec


class AppliedEntry(msgspec.Struct, frozen=True, array_like=True):
    """A committed entry as the state machine sees it."""

    index: int
    term: int
    body: bytes


class SnapshotWriter(ABC):
    """Where `StateMachine.snapshot` writes its files (names without '/', at most 128 chars)."""

    @abstractmethod
    def open(self, name: str) -> BinaryIO:
        """A new file of the snapshot, opened for binary writing; closing it is the caller's job."""


class SnapshotReader(ABC):
    """The files of a verified snapshot (each one's CRC was checked before `restore` runs)."""

    @abstractmethod
    def names(self) -> list[str]:
        """The state machine's files in this snapshot."""

    @abstractmethod
    def open(self, name: str) -> BinaryIO:
        """One of them, opened for binary reading."""


class StateMachine(ABC):
    """A deterministic function of the committed log: DLedger's StateMachine, with results."""

    @abstractmethod
    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        """Apply committed entries (consecutive NORMAL entries, index order); one result per
        entry, handed to whoever proposed it. An exception here stops the member's applier
        (the state would no longer be a function of the log): make bad input a result."""

    @abstractmethod
    def snapshot(self, writer: SnapshotWriter) -> None:
        """Write the whole state as of the last applied entry."""

    @abstractmethod
    def restore(self, reader: SnapshotReader | None) -> None:
        """Replace the whole state with a snapshot's (None: the empty state, before entry 0)."""

    def query(self, request: bytes) -> bytes:
        """A read-only function of the state (`AsyncDLedgerClient.query`)."""
        raise NotImplementedError(f"{type(self).__name__} answers no queries")


class NullStateMachine(StateMachine):
    """The plain log: nothing to apply (results are empty), an empty snapshot."""

    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        return [b""] * len(entries)

    def snapshot(self, writer: SnapshotWriter) -> None:
        return None

    def restore(self, reader: SnapshotReader | None) -> None:
        return None


class DirectoryReader(SnapshotReader):
    """The files of a snapshot directory (snapshot.SnapshotStore verifies them first)."""

    def __init__(self, directory: Path, names: Iterable[str]) -> None:
        self.dir = directory
        self._names = sorted(names)

    def names(self) -> list[str]:
        return list(self._names)

    def open(self, name: str) -> BinaryIO:
        if name not in self._names:
            raise FileNotFoundError(f"{name} is not a file of the snapshot in {self.dir}")
        return (self.dir / name).open("rb")


class MemoryWriter(SnapshotWriter):
    """A snapshot kept in memory (`files`: name -> bytes, each set when its file is closed):
    for the simulator, and for testing a state machine's snapshot without a disk."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def open(self, name: str) -> BinaryIO:
        return _MemoryFile(self.files, name)


class _MemoryFile(io.BytesIO):
    def __init__(self, files: dict[str, bytes], name: str) -> None:
        super().__init__()
        self._files, self._name = files, name

    def close(self) -> None:
        if not self.closed:
            self._files[self._name] = self.getvalue()
        super().close()


class MemoryReader(SnapshotReader):
    """The files of a snapshot held in memory (as MemoryWriter.files)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def names(self) -> list[str]:
        return sorted(self.files)

    def open(self, name: str) -> BinaryIO:
        return io.BytesIO(self.files[name])
