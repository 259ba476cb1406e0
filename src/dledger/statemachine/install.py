"""InstallSnapshot's byte stream, without the protocol (docs/state-machines.md; the leader's and follower's
sides of the push come next).

A snapshot travels as one stream: its files in name order, back to back (the meta, which
says every file's size and CRC, travels beside it). The leader reads it in chunks
(`SnapshotSource`); the follower writes it into a temporary directory in order
(`InstallSink`): a chunk that does not start where the last one ended, or whose CRC is wrong,
is refused and the follower says where to resume, so a dropped connection costs only the
chunk in flight. When all bytes are in, every file's size and CRC is checked against the
meta, everything is fsynced, and the directory is renamed into place: a crash leaves no
snapshot or a whole one (a `.tmp-` leftover is deleted when the store opens).
"""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path
from typing import BinaryIO

import msgspec

from dledger.fsutil import fsync_path
from dledger.statemachine.api import DirectoryReader
from dledger.statemachine.snapshot import (
    META,
    SnapshotError,
    SnapshotMeta,
    SnapshotStore,
    check_files,
    valid_file_name,
)

# free space an install leaves on the store's disk (the log and its checkpoints go on writing)
SPACE_MARGIN_BYTES = 64 << 20


def _layout(meta: SnapshotMeta) -> list[tuple[str, int, int]]:
    """(name, start in the stream, size) of every file, in stream order."""
    out, start = [], 0
    for name in sorted(meta.files):
        size = meta.files[name].size
        out.append((name, start, size))
        start += size
    return out


class SnapshotSource:
    """The leader's side: a verified snapshot directory read as one stream."""

    def __init__(self, directory: Path, meta: SnapshotMeta) -> None:
        self.dir = directory
        self.meta = meta
        self._layout = _layout(meta)
        self.total = meta.size

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Bytes [offset, offset + max_bytes) of the stream (fewer at its end)."""
        if not 0 <= offset <= self.total:
            raise SnapshotError(f"offset {offset} outside the {self.total}-byte snapshot {self.dir}")
        end = min(self.total, offset + max_bytes)
        parts = []
        for name, start, size in self._layout:
            lo, hi = max(offset, start), min(end, start + size)
            if lo < hi:
                with (self.dir / name).open("rb") as f:
                    f.seek(lo - start)
                    parts.append(f.read(hi - lo))
        data = b"".join(parts)
        if len(data) != end - offset:
            raise SnapshotError(f"snapshot {self.dir} changed under its reader")
        return data


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still put on `directory`'s filesystem."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


class InstallSpaceError(SnapshotError):
    """The meta declares more than the disk has room for. Its message says "No space left",
    which the follower's node answers as DISK_FULL (core.install_snapshot)."""


class InstallSink:
    """The follower's side: the stream written back, in order, into a temporary directory."""

    def __init__(self, store: SnapshotStore, meta: SnapshotMeta) -> None:
        bad = [n for n in meta.files if not valid_file_name(n)]
        if bad or meta.size < 0 or any(f.size < 0 for f in meta.files.values()):
            raise SnapshotError(f"install of {meta.last_index}: bad file names or sizes in the meta {bad}")
        # before anything is written: a meta is the sender's word (a forged one declaring 2**61
        # bytes wrote 544 MB in 3 s), and a copy that cannot fit would only fill the disk the
        # log needs; chunks never go past what the meta declares (write)
        room = free_bytes(store.dir) - SPACE_MARGIN_BYTES
        if meta.size > room:
            raise InstallSpaceError(f"install of {meta.last_index}: No space left for its {meta.size} bytes: the "
                                    f"store's disk has {max(room, 0)} free beyond a margin of {SPACE_MARGIN_BYTES}")
        self.store = store
        self.meta = meta
        self.tmp = store.dir / f".tmp-install-{meta.last_index:020d}"
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        self._layout = _layout(meta)
        self.total = meta.size
        self.received = 0
        self._open: tuple[str, BinaryIO] | None = None

    @property
    def done(self) -> bool:
        return self.received == self.total

    def write(self, offset: int, data: bytes | memoryview, crc: int) -> int:
        """Take a chunk that starts at `received` and matches `crc`; the next offset wanted
        (unchanged when the chunk is refused: the leader sends from there)."""
        if offset != self.received or zlib.crc32(data) != crc:
            return self.received
        if offset + len(data) > self.total:
            raise SnapshotError(f"chunk at {offset} of {len(data)} bytes runs past the {self.total}-byte snapshot")
        end = offset + len(data)
        for name, start, size in self._layout:
            lo, hi = max(offset, start), min(end, start + size)
            if lo < hi:
                self._file(name).write(data[lo - offset : hi - offset])
        self.received = end
        return end

    def _file(self, name: str) -> BinaryIO:
        if self._open is None or self._open[0] != name:
            self._close()
            self._open = (name, (self.tmp / name).open("ab"))
        return self._open[1]

    def _close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            fsync_path(self.tmp / self._open[0])
            self._open = None

    def finish(self) -> tuple[SnapshotMeta, DirectoryReader]:
        """All bytes in: check every file against the meta (once: the chunks' CRCs covered the
        wire, this covers the assembly), fsync, rename into place (replacing a snapshot of the
        same index); the installed snapshot."""
        if not self.done:
            raise SnapshotError(f"install of {self.meta.last_index}: {self.received} of {self.total} bytes")
        self._close()
        for name, _, _ in self._layout:
            if not (self.tmp / name).exists():  # an empty file gets no chunk
                (self.tmp / name).touch()
        (self.tmp / META).write_bytes(msgspec.json.encode(self.meta))
        fsync_path(self.tmp / META)
        fsync_path(self.tmp)
        final = self.store.dir / f"{self.meta.last_index:020d}"
        try:
            check_files(self.tmp, self.meta)
        except SnapshotError:
            self.abort()
            raise
        if final.exists():
            shutil.rmtree(final)
        self.tmp.rename(final)
        fsync_path(self.store.dir)
        self.store.prune()
        return self.meta, DirectoryReader(final, self.meta.files)

    def abort(self) -> None:
        self._close()
        shutil.rmtree(self.tmp, ignore_errors=True)

