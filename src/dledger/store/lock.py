"""StoreDirLock: one writer per store directory.

Two processes writing one store (two members started with the same
`--store-dir`, a tool opening a live member's store) overwrite each other's
records and checkpoints, and an acknowledged append is lost at the next
recovery. The writer therefore holds an exclusive `flock` on `<dir>/lock` for
as long as the store is open; a second writer fails at once, naming the holder.

The kernel drops the lock when the holder's last descriptor closes, so a
member killed with SIGKILL never leaves a stale lock behind. The file itself
is never deleted: a deleted-and-recreated lock file could be locked by two
processes at once (each holding a different inode). Offline readers (the
Spark `dledger-files` source, audit) read without it.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from dledger.codes import ResponseCode
from dledger.store.base import StoreError

log = logging.getLogger(__name__)

LOCK_NAME = "lock"


class StoreDirLock:
    """An exclusive lock on a store directory, held until `release()`; the holder's pid
    is written into the lock file so a refused opener can say who holds it."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = directory  # as given: the user recognises their own spelling
        self.path = Path(directory) / LOCK_NAME
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StoreError(ResponseCode.DISK_ERROR, f"cannot open {self.path}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise StoreError(
                ResponseCode.DISK_ERROR,
                f"store directory {directory} is in use by {who} (another dledger member or tool); "
                "stop it or choose another --store-dir",
            ) from None
        except OSError as e:
            os.close(fd)
            raise StoreError(ResponseCode.DISK_ERROR, f"cannot lock {self.path}: {e.strerror or e}") from e
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:  # the lock holds without the pid; only the message of a refusal loses it
            log.warning("%s: cannot record this process's pid: %s", self.path, e)
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Clear the pid (so no later refusal names a process that let go) and unlock.
        Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError as e:
            log.warning("%s: cannot clear the pid: %s", self.path, e)
        finally:
            os.close(fd)  # closing the last descriptor drops the flock


def _holder(fd: int) -> int | None:
    """The pid the holder wrote, or None if it has not written it yet (or it is unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


__all__ = ["LOCK_NAME", "StoreDirLock"]
