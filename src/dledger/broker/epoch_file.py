"""A broker's epoch file (upstream's EpochFileCache): which master epoch wrote
which byte range of the log, used to find where a slave's log and its master's diverge.

On disk (upstream's CheckpointFile, byte for byte):

    <number of entries>\\n
    <crc32 of the entry lines, & 0x7FFFFFFF; 0 = not checked>\\n
    <epoch>-<startOffset>\\n   (ascending)

A write goes to `<file>.bak` first, then to the file, each temp + fsync + rename (upstream's
CheckpointFile copied to `.bak`, then overwrote the file in place); a file missing or torn is
read from its `.bak`. [improve]s over upstream: the atomic writes; truncating every entry
writes an explicit empty file (upstream's `write([])` did nothing, and the entries came back after a
restart); an epoch that begins where the last one began (no data in between) replaces it
(upstream rejected it, and the new epoch went missing, PR #9942); the last entry's end is
+infinity in memory after every truncation (upstream set it on a copy).
"""

from __future__ import annotations

import itertools
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

from dledger.codes import DLedgerError, ResponseCode
from dledger.fsutil import backup_path, read_with_backup, write_with_backup

log = logging.getLogger(__name__)

INFINITY = 2**63 - 1  # Long.MAX_VALUE: the last epoch's end


class EpochFileError(DLedgerError):
    """The file (and its `.bak`) cannot be read: a count or CRC mismatch, or bad lines."""

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.INCONSISTENT_STATE, message)


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start: int
    end: int = INFINITY


def encode(entries: list[EpochEntry]) -> bytes:
    block = "".join(f"{e.epoch}-{e.start}\n" for e in entries).encode()
    crc = zlib.crc32(block) & 0x7FFFFFFF if entries else 0
    return f"{len(entries)}\n{crc}\n".encode() + block


def decode(data: bytes) -> list[EpochEntry]:
    """The entries of a file's bytes, ends filled in (EpochFileError when they do not check out)."""
    try:
        lines = data.decode("ascii").split("\n")
        count, crc = int(lines[0]), int(lines[1])
        body = lines[2 : 2 + count]
        pairs = [tuple(int(x) for x in line.split("-", 1)) for line in body]
    except (UnicodeDecodeError, ValueError, IndexError) as e:
        raise EpochFileError(f"not an epoch file: {e}") from e
    if len(pairs) != count or any(len(p) != 2 for p in pairs):
        raise EpochFileError(f"epoch file says {count} entries, holds {len(pairs)}")
    block = "".join(f"{line}\n" for line in body).encode()
    if crc and zlib.crc32(block) & 0x7FFFFFFF != crc:
        raise EpochFileError("epoch file fails its CRC")
    return _with_ends([EpochEntry(p[0], p[1]) for p in pairs])


def _with_ends(entries: list[EpochEntry]) -> list[EpochEntry]:
    out = [EpochEntry(e.epoch, e.start, nxt.start) for e, nxt in itertools.pairwise(entries)]
    if entries:
        out.append(EpochEntry(entries[-1].epoch, entries[-1].start))
    return out


class EpochFileCache:
    """The entries in memory (ascending epochs, strictly ascending starts), written through to
    `path` on every change (none: memory only, for the simulator and tests).

    `deferred` (the broker runtime sets it once the replica is built): a change is made in
    memory only and counted in `version`; the runtime writes `snapshot()` with `write` from a
    worker thread (off its event loop) and says so with `written_up_to`. Until then
    `unwritten` holds, and whatever must not outrun the file waits for it (a new master's
    sends, a slave's next records: broker.server, broker.ha_slave)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.entries: list[EpochEntry] = self._load() if path is not None else []
        self.deferred = False
        self.version = 0  # changes made in memory
        self.written = 0  # the newest change on disk

    def _load(self) -> list[EpochEntry]:
        assert self.path is not None
        entries, damaged = read_with_backup(self.path, decode, EpochFileError)
        for d in damaged:
            log.warning("epoch file %s; trying %s", d, backup_path(self.path))
        if entries is not None:
            return entries
        if damaged:  # an error, not an empty file (the replica would lose its epochs)
            raise EpochFileError(f"the epoch file cannot be read ({'; '.join(damaged)}): restore it, or move the "
                                 "store directory away and let the replica copy its log again")
        return []

    def _flush(self) -> None:
        self.entries = _with_ends(self.entries)
        self.version += 1
        if self.path is not None and self.deferred:
            return  # the runtime writes it (`snapshot`, `write`, `written_up_to`)
        if self.path is not None:
            write_with_backup(self.path, encode(self.entries))
        self.written = self.version

    # --- deferred writes ---------------------------------------------------------------------

    @property
    def unwritten(self) -> bool:
        """A change is in memory that is not on disk yet (deferred writes only)."""
        return self.written < self.version

    def snapshot(self) -> tuple[int, bytes]:
        """The current version and its bytes (taken on the owner's thread)."""
        return self.version, encode(self.entries)

    def write(self, data: bytes) -> None:
        """Write a snapshot's bytes (`.bak`, then the file): touches no state, so a worker
        thread may run it; one at a time (the temp files have one name each)."""
        assert self.path is not None
        write_with_backup(self.path, data)

    def written_up_to(self, version: int) -> None:
        self.written = max(self.written, version)

    # --- changes ---------------------------------------------------------------------------

    def append_entry(self, epoch: int, start: int) -> bool:
        """A new epoch beginning at `start`; False (nothing changes) when it is not newer."""
        last = self.entries[-1] if self.entries else None
        if last is not None and (epoch <= last.epoch or start < last.start):
            log.warning("epoch entry (%d, %d) refused after (%d, %d)", epoch, start, last.epoch, last.start)
            return False
        if last is not None and start == last.start:
            self.entries.pop()  # the last epoch wrote nothing: the new one takes its place
        self.entries.append(EpochEntry(epoch, start))
        self._flush()
        return True

    def truncate_suffix_by_offset(self, offset: int) -> None:
        """Forget the epochs that begin at or after `offset` (the log was cut there)."""
        self.entries = [e for e in self.entries if e.start < offset]
        self._flush()

    def truncate_suffix_by_epoch(self, epoch: int) -> None:
        self.entries = [e for e in self.entries if e.epoch < epoch]
        self._flush()

    def truncate_prefix_by_offset(self, offset: int) -> None:
        """Forget the epochs that end at or before `offset` (their log files were deleted)."""
        self.entries = [e for e in self.entries if e.end > offset]
        self._flush()

    # --- queries ---------------------------------------------------------------------------

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else -1

    def find_by_offset(self, offset: int) -> EpochEntry | None:
        """The epoch that wrote `offset` (start <= offset < end)."""
        return next((e for e in self.entries if e.start <= offset < e.end), None)

    def next_entry(self, epoch: int) -> EpochEntry | None:
        return next((e for e in self.entries if e.epoch > epoch), None)

    def with_last_end(self, end: int) -> list[EpochEntry]:
        """The entries with the last one ending at `end` (the log's max offset)."""
        if not self.entries:
            return []
        *head, last = self.entries
        return [*head, EpochEntry(last.epoch, last.start, end)]


def find_consistent_point(local: list[EpochEntry], master: list[EpochEntry]) -> int:
    """Where the slave's log stops agreeing with its master's: for the newest local epoch
    that the master has with the same start, the lesser of the two ends; -1 when there is none.
    Both lists carry real ends (`with_last_end`)."""
    theirs = {e.epoch: e for e in master}
    for mine in reversed(local):
        m = theirs.get(mine.epoch)
        if m is not None and m.start == mine.start:
            return min(mine.end, m.end)
    return -1
