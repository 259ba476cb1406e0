"""A synthetic state machine for snapshot benchmarks (benchmarks/install_snapshot.py).

Its whole state is one number, a byte size, yet its snapshot is that many bytes on disk: a
tiny entry (b"grow:<n>") makes the state n bytes bigger, so a benchmark reaches a 1 GiB
snapshot with a handful of appends instead of pushing 1 GiB through the log. Snapshots are
cut into files of at most 256 MiB (as a real state machine might shard its state), filled
with a pattern that depends only on the size: every member writes the same bytes, and
writing or checking them costs little CPU, so what a benchmark measures is the snapshot
transfer, not this machine.

`--state-machine dledger.bench.blob_machine:BlobMachine`
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import BinaryIO

from dledger.statemachine.api import AppliedEntry, SnapshotReader, SnapshotWriter, StateMachine

MiB = 1 << 20
BLOCK = MiB  # bytes per write and per read: big enough to be fast, small enough to stay out of the way
FILE_BYTES = 256 * MiB  # most bytes in one blob file
SIZE_FILE = "size"
GROW = b"grow:"


def blob_name(k: int) -> str:
    return f"blob-{k:04d}"


def pattern(size: int) -> bytes:
    """The 1 MiB block every blob file repeats: derived from the size alone (deterministic on
    every member), random-looking so no layer below can compress it away."""
    return random.Random(size).randbytes(BLOCK)


def parse_grow(body: bytes) -> int:
    """How many bytes a body adds: n for b"grow:<n>" (n >= 0 decimal), else 0."""
    if not body.startswith(GROW):
        return 0
    digits = body[len(GROW):]
    if not digits.isdigit():
        return 0
    return int(digits)


class BlobMachine(StateMachine):
    """State: a byte size. apply grows it; snapshot writes that many bytes; restore streams them."""

    def __init__(self) -> None:
        self.size = 0

    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        for e in entries:
            self.size += parse_grow(e.body)
        return [b""] * len(entries)

    def snapshot(self, writer: SnapshotWriter) -> None:
        """The size file, then blob-0000... of at most FILE_BYTES, written BLOCK at a time."""
        with writer.open(SIZE_FILE) as f:
            f.write(str(self.size).encode())
        block = pattern(self.size)
        left, k = self.size, 0
        while left > 0:
            n = min(left, FILE_BYTES)
            with writer.open(blob_name(k)) as f:
                _write_blob(f, block, n)
            left -= n
            k += 1

    def restore(self, reader: SnapshotReader | None) -> None:
        """Read the size and stream through every blob (never holding one in memory), checking
        that their lengths add up: a short or missing blob fails the restore, not a later read."""
        if reader is None:
            self.size = 0
            return
        names = set(reader.names())
        if SIZE_FILE not in names:
            raise ValueError(f"snapshot has no {SIZE_FILE!r} file")
        with reader.open(SIZE_FILE) as f:
            size = int(f.read())
        total, k = 0, 0
        while blob_name(k) in names:
            with reader.open(blob_name(k)) as f:
                n = _read_blob(f)
            if n > FILE_BYTES or (n < FILE_BYTES and total + n != size):
                raise ValueError(f"{blob_name(k)}: {n} bytes (at {total} of {size})")
            total += n
            k += 1
        if total != size:
            raise ValueError(f"blob files hold {total} bytes; the size file says {size}")
        self.size = size

    def query(self, request: bytes) -> bytes:
        """The size, in decimal (any request): lets a benchmark check a member's state."""
        return str(self.size).encode()


def _write_blob(f: BinaryIO, block: bytes, n: int) -> None:
    full, rest = divmod(n, len(block))
    for _ in range(full):
        f.write(block)
    if rest:
        f.write(block[:rest])


def _read_blob(f: BinaryIO) -> int:
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    n = 0
    while got := f.readinto(view):  # type: ignore[attr-defined]
        n += got
    return n


__all__ = ["BlobMachine", "parse_grow", "pattern"]
