"""Files replaced atomically: what a crash leaves is the old file or the new one, whole."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` with exactly `mode`: a temporary file beside it, fsync, rename,
    fsync of the directory. Raises OSError; the temporary file does not outlive a failure."""
    tmp = path.with_name(f".{path.name}.tmp")  # one writer per directory (the store is locked)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_path(path.parent)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (which makes the names in it durable: a rename, a new or
    deleted file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def write_with_backup(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path.bak`, then to `path`, each atomically (upstream's CheckpointFile
    keeps the same `.bak`): whatever happens to the main file, one of the two holds the
    newest or the previous contents whole. Raises OSError."""
    write_atomic(backup_path(path), data, mode)
    write_atomic(path, data, mode)


def read_with_backup(path: Path, parse: Callable[[bytes], T], damaged: type[Exception] | tuple[type[Exception], ...],
                        ) -> tuple[T | None, list[str]]:
    """(`parse` of `path`, or of `path.bak` when the main file is missing or `parse` raises
    `damaged` on it; None when neither is there or readable, the reasons it was not read)."""
    problems: list[str] = []
    for candidate in (path, backup_path(path)):
        try:
            data = candidate.read_bytes()
        except FileNotFoundError:
            continue
        try:
            return parse(data), problems
        except damaged as e:
            problems.append(f"{candidate}: {e}")
    return None, problems


def evict_page_cache(d: Path) -> None:
    """Write back and drop every file's pages under `d` from the page cache, so the next
    open reads from disk (a cold start, as after a reboot: restart-cost measurements)."""
    for p in d.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
