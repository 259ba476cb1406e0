"""Snapshot directories under `<store_dir>/snapshot/`.

A snapshot is a directory named by its last included index (20 digits) holding the state
machine's files and `meta.json`: last included index and term, the chain CRC of that entry
(the log after it continues the chain from there), the group's members, and each file's
size and CRC32. It is written under a temporary name, every file and the directory fsynced,
then renamed and the parent fsynced: a crash leaves either no snapshot or a whole one. The
two newest are kept. On open, temporary leftovers are deleted and a snapshot whose meta or
files do not verify is skipped with a log line, never half-loaded.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Collection
from pathlib import Path
from typing import BinaryIO

import msgspec

from dledger.fsutil import fsync_path
from dledger.membership import Membership
from dledger.statemachine.api import DirectoryReader, SnapshotWriter, StateMachine

log = logging.getLogger(__name__)

META = "meta.json"
PRODUCERS_FILE = "dledger-producers"  # the producer table (core.producers), beside the state machine's files
KEEP = 2
MAX_FILES = 4096  # files per snapshot: every InstallSnapshot request names them all
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_DIR = re.compile(r"^\d{20}$")
_CHUNK = 1 << 20


class FileInfo(msgspec.Struct, frozen=True):
    size: int
    crc32: int


class SnapshotMeta(msgspec.Struct, frozen=True):
    """What a snapshot covers: the log through `last_index` (of `last_term`) is in its files."""

    last_index: int
    last_term: int
    chain_crc: int
    # the configuration at last_index (dledger.membership); a peers string in snapshots taken
    # before membership changes existed (every member a voter: membership_of reads both)
    members: str | Membership
    files: dict[str, FileInfo] = {}
    created_ms: int = 0
    version: int = 1
    next_pos: int = -1  # log position of entry last_index + 1: an installing follower's log begins there
    config_index: int = -1  # the CONFIG_CHANGE entry `members` came from (-1: the command line's peers)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


class SnapshotError(Exception):
    """A snapshot that cannot be used (why, and which directory)."""


class _Writer(SnapshotWriter):
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.names: list[str] = []

    def open(self, name: str) -> BinaryIO:
        if not valid_file_name(name) or name in self.names or name == PRODUCERS_FILE:
            raise ValueError(f"bad, reserved or repeated snapshot file name {name!r}")
        if len(self.names) >= MAX_FILES:
            raise ValueError(f"a snapshot holds at most {MAX_FILES} files")
        self.names.append(name)
        return (self.dir / name).open("xb")


class SnapshotStore:
    """The snapshots of one member of one group."""

    def __init__(self, store_dir: Path | str) -> None:
        self.dir = Path(store_dir) / "snapshot"
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.dir.iterdir():
            if p.name.startswith(".tmp-"):
                log.warning("deleting a snapshot left half-written: %s", p)
                shutil.rmtree(p, ignore_errors=True)

    def take(self, sm: StateMachine, last_index: int, last_term: int, chain_crc: int, members: str | Membership,
             next_pos: int = -1, keep: Collection[int] = (), producers: bytes = b"",
             config_index: int = -1) -> SnapshotMeta:
        """Write `sm`'s state (as of `last_index`) as the newest snapshot, with the producer
        table; prune old ones (but those in `keep`: being sent to a follower)."""
        final = self.dir / f"{last_index:020d}"
        tmp = self.dir / f".tmp-{last_index:020d}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            writer = _Writer(tmp)
            sm.snapshot(writer)
            names = list(writer.names)
            if producers:
                (tmp / PRODUCERS_FILE).write_bytes(producers)
                names.append(PRODUCERS_FILE)
            files = {name: _sealed(tmp / name) for name in names}
            meta = SnapshotMeta(last_index, last_term, chain_crc, members, files, int(time.time() * 1000),
                                next_pos=next_pos, config_index=config_index)
            (tmp / META).write_bytes(msgspec.json.encode(meta))
            fsync_path(tmp / META)
            fsync_path(tmp)
            if final.exists():  # the same index again (an on-demand snapshot): the new one wins
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_path(self.dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune(keep)
        log.info("snapshot %s: through index %d (term %d), %d files, %d bytes", final, last_index,
                 last_term, len(files), meta.size)
        return meta

    def prune(self, keep: Collection[int] = ()) -> None:
        """Keep the KEEP newest snapshots, and those in `keep` (a follower is installing them:
        deleting one restarted its install from 0, for ever under steady writes)."""
        for p in self._dirs()[KEEP:]:
            if int(p.name) not in keep:
                shutil.rmtree(p, ignore_errors=True)

    def _dirs(self) -> list[Path]:
        """Snapshot directories, newest first."""
        return sorted((p for p in self.dir.iterdir() if _DIR.match(p.name) and p.is_dir()), reverse=True)

    def newest(self) -> tuple[SnapshotMeta, DirectoryReader] | None:
        """The newest snapshot that verifies (meta, sizes, CRCs); damaged ones are skipped."""
        for p in self._dirs():
            try:
                return verify(p)
            except SnapshotError as e:
                log.error("skipping snapshot %s: %s", p, e)
        return None

    def metas(self) -> list[SnapshotMeta]:
        """Metas of the snapshots kept, newest first (not verified: for status)."""
        out = []
        for p in self._dirs():
            try:
                out.append(read_meta(p))
            except SnapshotError:
                continue
        return out


def read_meta(directory: Path) -> SnapshotMeta:
    try:
        meta = msgspec.json.decode((directory / META).read_bytes(), type=SnapshotMeta)
    except (OSError, msgspec.DecodeError) as e:
        raise SnapshotError(f"meta unreadable: {e}") from e
    if f"{meta.last_index:020d}" != directory.name:
        raise SnapshotError(f"meta says index {meta.last_index}, the directory {directory.name}")
    return meta


def verify(directory: Path) -> tuple[SnapshotMeta, DirectoryReader]:
    meta = read_meta(directory)
    check_files(directory, meta)
    return meta, DirectoryReader(directory, meta.files)


def check_files(directory: Path, meta: SnapshotMeta) -> None:
    """Every file `meta` names is in `directory` with its size and CRC (SnapshotError if not)."""
    for name, info in meta.files.items():
        if not valid_file_name(name):
            raise SnapshotError(f"bad file name {name!r} in meta")
        try:
            size, crc = _size_crc(directory / name)
        except OSError as e:
            raise SnapshotError(f"{name}: {e}") from e
        if (size, crc) != (info.size, info.crc32):
            raise SnapshotError(f"{name}: {size} bytes, CRC {crc:#010x}; meta says {info.size}, {info.crc32:#010x}")


def valid_file_name(name: str) -> bool:
    """A name a snapshot file may have: no path, not the meta's (a meta from the network names
    the files a follower writes)."""
    return bool(_NAME.match(name)) and name not in (META, ".", "..")


def _sealed(path: Path) -> FileInfo:
    size, crc = _size_crc(path)
    fsync_path(path)
    return FileInfo(size, crc)


def _size_crc(path: Path) -> tuple[int, int]:
    crc = size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def read_producers(directory: Path, meta: SnapshotMeta) -> bytes | None:
    """The producer table a snapshot holds (verified with the snapshot), or None."""
    return (directory / PRODUCERS_FILE).read_bytes() if PRODUCERS_FILE in meta.files else None
