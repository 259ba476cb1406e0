"""Fixed-size memory-mapped files named by their 20-digit start offset (docs/format.md).

DLedger's MmapFile / MmapFileList: a logical byte space cut into equal files.
Data and index files both use it. The file size is the store's own when it has files
(`store_file_size`): a store written with another size (upstream DLedger's, a changed
configuration) is opened as it is, never resized; the configured size is for new stores.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Callable
from pathlib import Path

from dledger.codes import ResponseCode
from dledger.fsutil import fsync_path
from dledger.store.base import StoreError, os_error
from dledger.store.offline import StoreFile, file_name, list_files

log = logging.getLogger(__name__)


class MappedFile:
    """One file of `size` bytes; `start` is its logical offset.

    Reads go through the mapping; writes go through `write` (pwrite), never stores into
    the mapping. On this kind of machine (a VM, ext4) faulting fresh pages of a shared
    file mapping for writing at tens of MB/s stalls every CPU for 10-40 ms a few times a
    second, even processes that touch no file; buffered writes of the same bytes do not
    (measured: docs/performance.md). Both share the page cache, so reads see the writes.
    """

    def __init__(self, path: Path, start: int, size: int, create: bool = False) -> None:
        self.path = path
        self.start = start
        self.size = size
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(self.fd).st_size
            if actual != size:
                if actual > size:  # MappedFileList checked the sizes (store_file_size): only a race gets here
                    raise StoreError(ResponseCode.DISK_ERROR,
                                     f"{path} is {actual} bytes, not {size} as the other files of its store")
                os.ftruncate(self.fd, size)  # new, or short where store_file_size allowed it
            # read-only: a store into the mapping would raise instead of stalling the machine
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self.closed = False

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` at file offset `offset` (page cache; `sync` makes it durable)."""
        n = len(data)
        try:
            done = os.pwrite(self.fd, data, offset)
            while done < n:  # a short write: only if interrupted or out of space
                done += os.pwrite(self.fd, memoryview(data)[done:], offset + done)
        except OSError as e:
            raise os_error(e, f"write of {n} bytes at {self.path}:{offset}") from e

    def sync(self) -> None:
        """fdatasync: on Linux it also writes back pages dirtied through the mapping."""
        os.fdatasync(self.fd)

    def zero(self, begin: int, end: int, chunk: int = 1 << 20) -> None:
        """Zero file bytes [begin, end), skipping chunks that are already zero."""
        zeros = bytes(min(chunk, max(end - begin, 0)))
        mm = self.mm
        while begin < end:
            stop = min(begin + chunk, end)
            n = stop - begin
            if mm[begin:stop] != zeros[:n]:
                self.write(begin, zeros[:n])
            begin = stop

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.mm.close()
        except BufferError:
            # a reader still holds a view; the mapping lives until it is released
            log.debug("%s still has readers; leaving its mapping to the GC", self.path)
        os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def store_file_size(directory: Path, configured: int, unit: int = 1, recorded: int | None = None,
                    may_extend: Callable[[StoreFile], bool] | None = None) -> int:
    """The size of the files of `directory`: the store's own, whatever is configured
    (`configured` is for a store without files). Refused (DISK_ERROR, nothing written) when
    the files disagree with it, or it is not a multiple of `unit`.

    The store's size is the one its checkpoint records (`recorded`), else the distance between
    its first two files' names, else the size of its only file. A file shorter than that is
    cut short: a 0-byte last file is a creation a crash interrupted (dledger, like upstream,
    creates a file and then sets its size; nothing was written into it); any other is kept
    only when `may_extend(file)` proves nothing it lacks was ever trusted (then recovery
    judges its content), else refused. A longer file is refused."""
    files = list_files(directory)
    if not files:
        return recorded or configured
    if recorded:
        size = recorded
    elif len(files) > 1:
        size = files[1].start - files[0].start
    else:
        size = files[0].size or configured
    if size <= 0 or size % unit:
        raise StoreError(ResponseCode.DISK_ERROR,
                         f"{files[0].path}: the files of {directory} are {size} bytes, not a positive multiple "
                         f"of {unit}. Nothing was changed")
    for k, f in enumerate(files):
        if f.size == size or (f.size == 0 and k == len(files) - 1):
            continue
        if f.size < size and may_extend is not None and may_extend(f):
            log.warning("%s is %d bytes, not %d as the store's other files: cut short by a crash or damage in "
                        "what was never known durable; it is extended with zeros", f.path, f.size, size)
            continue
        raise StoreError(
            ResponseCode.DISK_ERROR,
            f"{f.path} is {f.size} bytes, but the files of {directory} are {size} bytes (its other files, its "
            "checkpoint): a file cut short or extended. Nothing was changed. Restore it from a backup, or move "
            "this member's store away so it fetches the log from the others again",
        )
    if size != configured:
        log.info("%s: the store's files are %d bytes (configured: %d, for new stores): using the store's size",
                 directory, size, configured)
    return size


class MappedFileList:
    """The equal-sized files of one directory, contiguous in the logical byte space. The
    size is the files' own when there are any (`store_file_size`), else `file_size`."""

    def __init__(self, directory: Path, file_size: int, unit: int = 1, recorded: int | None = None,
                 may_extend: Callable[[StoreFile], bool] | None = None) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.file_size = file_size = store_file_size(directory, file_size, unit, recorded, may_extend)
        self.files: list[MappedFile] = []
        for start in (f.start for f in list_files(directory)):
            if start % file_size:
                raise StoreError(
                    ResponseCode.DISK_ERROR,
                    f"{directory / file_name(start)} does not start at a multiple of the file "
                    f"size {file_size}: was the store written with another file size?",
                )
            if self.files and start != self.files[-1].end:
                raise StoreError(
                    ResponseCode.DISK_ERROR,
                    f"missing file in {directory}: {file_name(self.files[-1].end)} "
                    f"(next present is {file_name(start)})",
                )
            self.files.append(MappedFile(directory / file_name(start), start, file_size))

    @property
    def first_start(self) -> int:
        return self.files[0].start if self.files else 0

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def locate(self, pos: int) -> MappedFile:
        """The file holding logical byte `pos`."""
        files = self.files
        if files:
            k = (pos - files[0].start) // self.file_size
            if 0 <= k < len(files):
                return files[k]
        raise StoreError(ResponseCode.DISK_ERROR, f"no file in {self.dir} holds position {pos}")

    def ensure(self, pos: int) -> MappedFile:
        """The file holding `pos`, creating it and any files between it and the others."""
        files = self.files
        if files and files[0].start <= pos < files[-1].end:
            return self.locate(pos)
        start = pos - pos % self.file_size
        if not files:
            files.append(self._create(start))
        while start < files[0].start:
            files.insert(0, self._create(files[0].start - self.file_size))
        while start >= files[-1].end:
            files.append(self._create(files[-1].end))
        fsync_path(self.dir)
        return self.locate(pos)

    def _create(self, start: int) -> MappedFile:
        return MappedFile(self.dir / file_name(start), start, self.file_size, create=True)

    def drop_after(self, pos: int) -> None:
        """Delete every file that starts after `pos`."""
        while self.files and self.files[-1].start > pos:
            self.files.pop().destroy()
        fsync_path(self.dir)

    def drop_first(self) -> None:
        self.files.pop(0).destroy()
        fsync_path(self.dir)

    def drop_all(self) -> None:
        while self.files:
            self.files.pop().destroy()
        fsync_path(self.dir)

    def close(self) -> None:
        for f in self.files:
            f.close()


