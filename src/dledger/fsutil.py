"""Files replaced atomically: what a crash leaves is the old file or the new one, whole."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


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

