"""Upstream DLedger's own store (../shared/fixtures/upstream-dledger-store, beside the
repository: its README says how it was made) and the directory hash the store tests compare
before and after a refusal. One copy for the unit tests that open it every way a user can."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from dledger.store.offline import data_extents

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "upstream-dledger-store"
needs_fixture = pytest.mark.skipif(
    not (FIXTURE / "dledger-n0").is_dir(),
    reason=f"upstream DLedger's store fixture is not at {FIXTURE} (shared/fixtures beside the repository)",
)

Row = tuple[int, int, int, int, int, int, int, str]


def expected() -> list[Row]:
    """index term pos magic size body_length crc32(body) sha256(body), per upstream's get(i)."""
    rows = []
    for line in (FIXTURE / "expected.tsv").read_text().splitlines():
        i, t, p, m, s, n, c, h = line.split("\t")
        rows.append((int(i), int(t), int(p), int(m), int(s), int(n), int(c), h))
    return rows


def copy_fixture(tmp_path: Path) -> Path:
    """A writable copy of member n0's store at tmp_path/dledger-n0 (upstream's layout)."""
    d = tmp_path / "dledger-n0"
    shutil.copytree(FIXTURE / "dledger-n0", d)
    for p in [d, *d.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the fixture is read-only
    return d


def snapshot(d: Path) -> dict[str, tuple[int, str]]:
    """Every file of the directory (but the lock, which an open creates) by size and hash of
    its data extents with their offsets: the holes of a preallocated 1 GiB file are not read
    (zeros written into a hole count as a change)."""
    return {str(p.relative_to(d)): (p.stat().st_size, _extents_hash(p))
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != "lock"}


def _extents_hash(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        for a, b in data_extents(fd, 0, os.fstat(fd).st_size):
            h.update(b"%d:" % a)
            while a < b:
                chunk = os.pread(fd, min(b - a, 1 << 22), a)
                if not chunk:
                    break
                h.update(chunk)
                a += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()
