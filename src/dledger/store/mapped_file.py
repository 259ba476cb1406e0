"""Fixed-size memory-mapped files named by their 20-digit start offset (docs/format.md).

DLedger's MmapFile / MmapFileList: a logical byte space cut into equal files.
Data and index files both use it. The file size is the store's own when it has files
(`store_file_size`): a store written with another size (upstream DLedger's, a changed
configuration) is opened as it is, never resized; the configured size is for new stores.
Every size and name is checked reading only (`check_store_files`, both lists) before a file
is opened or extended, so a refusal changes nothing; `check_sizes` gives that refusal to
`dledger store inspect`, so the tool and the member agree.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from dledger.codes import ResponseCode
from dledger.entry import HEADER_SIZE, INDEX_UNIT_SIZE
from dledger.fsutil import fsync_path
from dledger.store.base import StoreError, os_error
from dledger.store.offline import (
    ZEROS,
    Checkpoint,
    StoreFile,
    UnreadableFile,
    data_extents,
    file_name,
    list_files,
    read_checkpoint,
    read_header,
)

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
        self.short = False  # shorter than `size` on disk: read from a copy until `extend`
        try:
            actual = os.fstat(self.fd).st_size
            if actual > size:  # MappedFileList checked the sizes (store_file_size): only a race gets here
                raise StoreError(ResponseCode.DISK_ERROR,
                                 f"{path} is {actual} bytes, not {size} as the other files of its store")
            if actual < size and create:
                os.ftruncate(self.fd, size)  # a new file: created by a write that was decided
                actual = size
            if actual < size:
                # short where store_file_size allowed it: read as extended with zeros, but the
                # file is extended only at the first write, or when the opener decided
                # (`extend`): a recovery that refuses has not changed its size
                self.mm = _copy_of(self.fd, actual, size)
                self.short = True
            else:
                # read-only: a store into the mapping would raise instead of stalling the machine
                self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self.closed = False

    def extend(self) -> None:
        """Give a short file its full size (zeros) and map the file itself."""
        if not self.short:
            return
        try:
            os.ftruncate(self.fd, self.size)
        except OSError as e:
            raise os_error(e, f"extension of {self.path} to {self.size} bytes") from e
        old, self.mm = self.mm, mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
        self.short = False
        with contextlib.suppress(BufferError):  # a reader's view keeps the copy until released
            old.close()

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` at file offset `offset` (page cache; `sync` makes it durable)."""
        n = len(data)
        self.extend()
        try:
            done = os.pwrite(self.fd, data, offset)
            while done < n:  # a short write: only if interrupted or out of space
                done += os.pwrite(self.fd, memoryview(data)[done:], offset + done)
        except OSError as e:
            raise os_error(e, f"write of {n} bytes at {self.path}:{offset}") from e

    def sync(self) -> None:
        """fdatasync: on Linux it also writes back pages dirtied through the mapping."""
        os.fdatasync(self.fd)

    def pread(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes at file offset `offset`, read with pread: nothing is mapped into this
        process (the page cache keeps them, reclaimable), so a walk over the log (the scrub)
        does not grow the member's resident memory with the size of its files."""
        if self.short:
            return bytes(self.mm[offset : offset + n])
        try:
            return os.pread(self.fd, n, offset)
        except OSError as e:
            raise os_error(e, f"read of {n} bytes at {self.path}:{offset}") from e

    def zero(self, begin: int, end: int, chunk: int = 1 << 20) -> None:
        """Zero file bytes [begin, end), skipping holes and chunks that are already zero.

        Only the file's data extents are read (SEEK_DATA), with pread, never through the
        mapping: recovery zeroes from the log's end to the end of its preallocated (sparse)
        file, and comparing that through the mapping faulted in every page of the hole, so a
        restarted member held its whole last data file resident (docs/performance.md,
        "Restart cost"). Bytes past the end of a short file read as zeros, as in `mm`."""
        for a, b in list(data_extents(self.fd, begin, end)):
            off = a
            while off < b:
                n = min(chunk, len(ZEROS), b - off)
                try:
                    got = os.pread(self.fd, n, off)
                except OSError as e:
                    raise os_error(e, f"read of {n} bytes at {self.path}:{off}") from e
                if not got:
                    break  # past the end of a short file: zeros
                if got != ZEROS[: len(got)]:  # memcmp, not a byte loop
                    self.write(off, ZEROS[: len(got)])
                off += len(got)

    def release(self, begin: int, end: int) -> None:
        """Drop this process's mapping of the whole pages within file bytes [begin, end)
        (MADV_DONTNEED: the pages stay in the page cache and a later read maps them again), so
        a walk over the log (the scrub) does not leave every page it read resident here. A
        read-only shared file mapping holds nothing else: no byte can be lost."""
        page = mmap.PAGESIZE
        lo = -(-begin // page) * page
        hi = end - end % page
        if self.closed or self.short or hi <= lo:
            return
        with contextlib.suppress(OSError, ValueError):  # advice only: a failure costs memory, not data
            self.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

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


def _copy_of(fd: int, actual: int, size: int, chunk: int = 1 << 20) -> mmap.mmap:
    """`size` bytes of anonymous memory holding the `actual` bytes of file `fd`, zeros after
    (untouched pages of an anonymous mapping cost nothing)."""
    mm = mmap.mmap(-1, size)
    off = 0
    while off < actual:
        data = os.pread(fd, min(chunk, actual - off), off)
        if not data:
            break
        mm[off : off + len(data)] = data
        off += len(data)
    return mm


def store_file_size(directory: Path, configured: int, unit: int = 1, recorded: int | None = None,
                    may_extend: Callable[[StoreFile], bool] | None = None, cache: bool = False) -> int:
    """The size of the files of `directory`: the store's own, whatever is configured
    (`configured` is for a store without files). Read-only: refused (DISK_ERROR, nothing
    written) when the files disagree with it, one is missing, or it is not a multiple of `unit`.

    The store's size is the one its checkpoint records (`recorded`), else the size most of its
    files have (a tie: the distance between the first two files' names), else `configured`.
    The files must start at multiples of it, each where the one before ends: a name skipped is
    a file missing. A file shorter than it is cut short: a 0-byte last file is a creation a
    crash interrupted (dledger, like upstream, creates a file and then sets its size; nothing
    was written into it); any other is kept only when `may_extend(file)` proves nothing it
    lacks was ever trusted (then recovery judges its content), else refused. A longer file is
    refused. `cache`: the files are the index, rebuilt from the data files: the refusal says
    to delete them rather than to give up the store."""
    files = list_files(directory)
    if not files:
        return recorded or configured
    size = recorded or _files_size(files) or configured
    by = "the size its checkpoint records" if recorded else "the size of its files"
    advice = (f"The index is a cache of the data files' record headers: delete the files of {directory} "
              "and start the member again, it rebuilds them from the data files"
              if cache else "Restore it from a backup, or move this member's store away so it fetches the log "
              "from the others again")

    def refuse(what: str) -> StoreError:
        return StoreError(ResponseCode.DISK_ERROR, f"{what}{'' if what.endswith('?') else '.'} Nothing was "
                          f"changed. {advice}")

    own = files[1].start - files[0].start if len(files) > 1 else None
    if recorded and own is not None and own != recorded and own == _files_size(files):
        raise refuse(f"the checkpoint of {directory.parent} records files of {recorded} bytes, but the files of "
                     f"{directory} are {own} bytes (their names and sizes): is the checkpoint another store's?")
    if size <= 0 or size % unit:
        raise refuse(f"{files[0].path}: the files of {directory} are {size} bytes, not a positive multiple of {unit}")
    for f in files:
        if f.start % size:
            raise refuse(f"{f.path} does not start at a multiple of {size} bytes ({by}): was the store written "
                         "with another file size?")
    for a, b in itertools.pairwise(files):
        if a.start + size != b.start:
            gone = [file_name(x) for x in range(a.start + size, b.start, size)]
            raise refuse(f"file {', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''} of {directory} is missing: "
                         f"{a.path.name} ends at {a.start + size}, {b.path.name} starts at {b.start}")
    for k, f in enumerate(files):
        if f.size == size or (f.size == 0 and k == len(files) - 1):
            continue
        if f.size < size and may_extend is not None and may_extend(f):
            continue  # the caller extends it (MappedFile), only once every file passed
        raise refuse(f"{f.path} is {f.size} bytes, but the files of {directory} are {size} bytes ({by}): "
                     f"{'cut short' if f.size < size else 'extended'}")
    return size


def _files_size(files: Sequence[StoreFile]) -> int:
    """The size most of `files` have (a 0-byte last one aside); on a tie, the distance between
    the first two names when it is one of them, else the largest: a missing file then shows as
    a gap in the names, a damaged one as a file of another size."""
    sizes = Counter(f.size for f in (files[:-1] if files[-1].size == 0 else files))
    if not sizes:
        return 0
    top = max(sizes.values())
    tied = [n for n, c in sizes.items() if c == top]
    if len(files) > 1 and files[1].start - files[0].start in tied:
        return files[1].start - files[0].start
    return max(tied)


def lost_bytes_unsynced(last: StoreFile, ckpt: Checkpoint | None) -> bool:
    """Whether the bytes a last data file shorter than the others lacks were never known
    fsynced: dledger's own checkpoint names the store's file size (so the file is dledger's,
    created full size and cut by a crash or damage) and its last fsynced record ends within
    what the file still holds. Extending it with zeros then loses nothing recovery trusts."""
    if ckpt is None or not ckpt.proves_durable or ckpt.data_file_size is None:
        return False
    if ckpt.trusted is None:
        durable_end = ckpt.begin.pos if ckpt.begin is not None else 0
    else:
        pos = ckpt.trusted.pos
        if pos < last.start:
            return True
        h = read_header(last.path, pos - last.start)
        if h is None or h[4] != pos or h[1] < HEADER_SIZE:
            return False
        durable_end = pos + int(h[1])
    return last.start + last.size >= durable_end


DATA = "data"
INDEX = "index"


def check_store_files(store_dir: Path, ckpt: Checkpoint | None, data_file_size: int,
                      index_file_size: int) -> tuple[int, int]:
    """The sizes of the data and index files of the store in `store_dir`, both decided before
    either is opened (so a refusal of the index has not extended a data file); read-only,
    StoreError (DISK_ERROR) when a member refuses to open them. `ckpt`: its checkpoint, None
    when missing or unreadable (recovery refuses that one itself)."""
    data = store_file_size(store_dir / DATA, data_file_size, 1, ckpt.data_file_size if ckpt else None,
                           lambda f: lost_bytes_unsynced(f, ckpt))
    index = store_file_size(store_dir / INDEX, index_file_size, INDEX_UNIT_SIZE,
                            ckpt.index_file_size if ckpt else None, lambda f: True, cache=True)
    return data, index


def checkpoint_for_sizes(store_dir: Path) -> Checkpoint | None:
    """The checkpoint, to size the files by; an unreadable one is taken as none here
    (recovery refuses it on its own, naming it)."""
    try:
        return read_checkpoint(store_dir)
    except UnreadableFile:
        return None


def check_sizes(store_dir: Path) -> str | None:
    """Why a member refuses to open the data or index files of `store_dir` for their sizes or
    names (a file missing, cut short, extended), as the member says it; None when it opens
    them. Read-only: for `dledger store inspect` to agree with the member. An unreadable
    checkpoint is taken as none here (the member refuses it on its own)."""
    try:
        check_store_files(store_dir, checkpoint_for_sizes(store_dir), 1 << 30, INDEX_UNIT_SIZE)
    except StoreError as e:
        return e.message
    return None


class MappedFileList:
    """The equal-sized files of one directory, contiguous in the logical byte space. The
    size is the files' own when there are any (`store_file_size`), else `file_size`."""

    def __init__(self, directory: Path, file_size: int, unit: int = 1, recorded: int | None = None,
                 may_extend: Callable[[StoreFile], bool] | None = None, cache: bool = False,
                 checked: bool = False) -> None:
        """`checked`: `file_size` is what `store_file_size` (`check_store_files`) decided for
        these files, and they are opened as they are."""
        self.dir = directory
        # every check first, read-only; then the directory and the files are opened (a short
        # file that passed is extended there)
        if not checked:
            file_size = store_file_size(directory, file_size, unit, recorded, may_extend, cache)
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self.ahead: MappedFile | None = None  # created by `prepare`, not yet taken by `ensure`
        self.created_inline = 0  # files `ensure` had to create itself at the end (none ahead)
        self.closed = False
        self._ahead_lock = threading.Lock()  # one creation at a time; guards `ahead`, `_gen`
        self._gen = 0  # bumped when the log is cut or reset: a creation asked for before is void
        self._worker: threading.Thread | None = None
        self._failed = -1  # the start of the last file whose creation ahead failed
        directory.mkdir(parents=True, exist_ok=True)
        try:
            for f in list_files(directory):
                if 0 < f.size < file_size:
                    log.warning("%s is %d bytes, not %d as the store's other files: cut short by a crash or "
                                "damage in what was never known durable; read as extended with zeros",
                                f.path, f.size, file_size)
                self.files.append(MappedFile(f.path, f.start, file_size))
        except BaseException:
            self.close()
            raise

    def extend_short(self) -> None:
        """Extend the files opened short (MappedFile.extend), once the opener decided to write."""
        for f in self.files:
            f.extend()

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
        """The file holding `pos`, creating it and any files between it and the others (the
        one `prepare` created ahead is taken as it is: no file system call then)."""
        files = self.files
        if files and files[0].start <= pos < files[-1].end:
            return self.locate(pos)
        start = pos - pos % self.file_size
        synced = True  # the directory holds the new names durably
        if not files:
            f, made = self._take_or_create(start)
            files.append(f)
            synced = synced and not made
        while start < files[0].start:
            files.insert(0, self._create(files[0].start - self.file_size))
            synced = False
        while start >= files[-1].end:
            f, made = self._take_or_create(files[-1].end)
            files.append(f)
            synced = synced and not made
        if not synced:
            fsync_path(self.dir)
        return self.locate(pos)

    def _create(self, start: int) -> MappedFile:
        return MappedFile(self.dir / file_name(start), start, self.file_size, create=True)

    # --- the next file, created ahead off the caller's thread ---------------------------------
    # A new file (open O_CREAT, ftruncate, mmap, fsync of the directory) costs milliseconds, far
    # more on a busy disk, and the appender used to pay it on the event loop each time the log
    # crossed into a new file. `prepare` creates it on a thread while the log still fills the
    # one before; `ensure` takes it. On disk it is what a creation by `ensure` leaves: the next
    # file under its own name, full size and sparse (no byte written), or, when a crash cut the
    # creation short, 0 bytes. Recovery ends the log before it either way (it holds no record)
    # and deletes it; `discard_ahead` deletes it when the log no longer ends before it.

    def prepare(self, start: int) -> None:
        """Create the file starting at `start` ahead, on a thread, unless it exists or is being
        created. Called by the appender (under its store's lock): it never waits here."""
        if self.closed or (self.files and self.files[0].start <= start < self.files[-1].end):
            return
        a = self.ahead
        worker = self._worker
        if (a is not None and a.start == start) or (worker is not None and worker.is_alive()) \
                or start == self._failed:
            return
        t = threading.Thread(target=self._prepare, args=(start, self._gen), daemon=True,
                             name=f"dledger-prealloc-{self.dir.name}")
        self._worker = t
        t.start()

    def _prepare(self, start: int, gen: int) -> None:
        with self._ahead_lock:
            if gen != self._gen or self.closed:
                return  # the log was cut or reset since it was asked for
            if self.ahead is not None:
                if self.ahead.start == start:
                    return
                self._destroy_ahead()
            path = self.dir / file_name(start)
            if path.exists():
                return  # `ensure` created it meanwhile, or it is not ours to overwrite
            try:
                f = MappedFile(path, start, self.file_size, create=True)
                try:
                    fsync_path(self.dir)
                except BaseException:
                    f.destroy()
                    raise
            except (OSError, StoreError) as e:  # the appender creates it itself then, and says why
                log.warning("%s: creating %s ahead failed: %s", self.dir, path.name, e)
                self._failed = start  # not again for this file (each append would ask)
                return
            self.ahead = f
            log.debug("%s: created %s ahead", self.dir, path.name)

    def _take_or_create(self, start: int) -> tuple[MappedFile, bool]:
        """The file at `start`: the one created ahead, else a new one (waiting for a creation
        ahead in progress, which may be that very file). Whether it was created here."""
        with self._ahead_lock:
            a = self.ahead
            if a is not None and a.start == start:
                self.ahead = None
                return a, False
            if a is not None:
                self._destroy_ahead()  # not where the log goes on: never a file past its end
            self.created_inline += 1
            return self._create(start), True

    def _destroy_ahead(self) -> None:
        a, self.ahead = self.ahead, None
        if a is not None:
            a.destroy()  # never written: nothing is lost
            fsync_path(self.dir)

    def discard_ahead(self) -> None:
        """Delete the file created ahead and cancel a creation asked for: the log was cut or
        reset, so it may no longer end just before that file."""
        with self._ahead_lock:
            self._gen += 1
            self._destroy_ahead()

    def drop_after(self, pos: int) -> None:
        """Delete every file that starts after `pos` (and the one created ahead with them: it
        no longer follows the last file)."""
        if self.files and self.files[-1].start > pos:
            self.discard_ahead()
        while self.files and self.files[-1].start > pos:
            self.files.pop().destroy()
        fsync_path(self.dir)

    def drop_first(self) -> None:
        self.files.pop(0).destroy()
        fsync_path(self.dir)

    def drop_all(self) -> None:
        self.discard_ahead()
        while self.files:
            self.files.pop().destroy()
        fsync_path(self.dir)

    def settle(self) -> None:
        """Wait for a creation ahead in progress (tests, close)."""
        if self._worker is not None:
            self._worker.join()

    def close(self) -> None:
        """Close the files; the one created ahead is deleted (a clean stop leaves no file past
        the log's)."""
        self.settle()
        with self._ahead_lock:
            self.closed = True
            with contextlib.suppress(OSError):
                self._destroy_ahead()
        for f in self.files:
            f.close()
