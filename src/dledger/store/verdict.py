"""What recovery would do with a store directory, decided without writing a byte.

The offline tools (`dledger store inspect|truncate|import|export`, store/admin.py and
store/tools.py) must agree with the member about where a log ends and whether it may be
opened at all, so they do not carry a second copy of that rule: they run recovery's own
read-only steps (`recovery.scan_forward`, the scan, and `recovery.check_cut`, the refusal
rule of docs/format.md, "Recovery") over read-only mappings of the data files. Recovery's
write phase (cutting, rebuilding index units) never runs here.

The scan starts at the log begin (the checkpoint's, else derived from the first record, as
recovery derives it, with the chain CRC before it solved from that record: offline.chain_before),
not at the checkpoint's trusted record, so damage before it is seen. The trusted record is
checked as recovery checks it (`recovery._trusted_start`): one lost beyond repair makes a
member refuse, and so the verdict; one that rotted where its extent is certain is reported,
and the scan goes on past it as the member's does. The file sizes are the member's own check
(`mapped_file.check_sizes`).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from dledger.codes import ResponseCode
from dledger.store.base import StoreError
from dledger.store.mapped_file import check_sizes
from dledger.store.offline import (
    Checkpoint,
    LogBegin,
    StoreFile,
    UnreadableFile,
    chain_before,
    derive_begin_of,
    first_gap,
    list_files,
    read_checkpoint,
    read_header,
)
from dledger.store.recovery import ScanEnd, ScanStart, _trusted_start, check_cut, scan_forward


class ReadOnlyFile:
    """The attributes of a MappedFile that recovery's read-only steps use, mapped PROT_READ."""

    def __init__(self, f: StoreFile) -> None:
        self.path, self.start, self.size = f.path, f.start, f.size
        self.fd = os.open(f.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.mm = mmap.mmap(self.fd, f.size, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def end(self) -> int:
        return self.start + self.size

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class ReadOnlyFiles:
    """The part of MappedFileList recovery's scan reads: files in order, `locate`."""

    def __init__(self, files: list[StoreFile]) -> None:
        self.files: list[ReadOnlyFile] = []
        try:
            for f in files:
                if f.size == 0:
                    break  # an empty file holds nothing (and cannot be mapped): the log ends before it
                self.files.append(ReadOnlyFile(f))
        except BaseException:
            self.close()
            raise

    @property
    def first_start(self) -> int:
        return self.files[0].start if self.files else 0

    def locate(self, pos: int) -> ReadOnlyFile:
        for f in self.files:
            if f.start <= pos < f.end:
                return f
        raise StoreError(ResponseCode.DISK_ERROR, f"no data file holds position {pos}")

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []


@dataclass
class _View:
    """Enough of a RecoverableStore for `scan_forward`, `check_cut` and `_trusted_start`."""

    dir: Path
    data: ReadOnlyFiles
    index: ReadOnlyFiles
    begin_index: int
    begin_term: int
    begin_pos: int
    recovered_corrupt: tuple[int, str] | None = None


@dataclass
class Verdict:
    """Where the valid log of a store directory ends and what a member would do on opening it.

    `end_index` is the index the next record would get (the first one not valid), `end_pos`
    its position; `reason` why the scan stopped there ("" for a clean end). `refusal` is the
    message a member would refuse to start with (DISK_ERROR, nothing changed), "" when it
    would open; `cut` says, when it opens, what recovery would cut as a torn tail."""

    store_dir: Path
    files: list[StoreFile]
    checkpoint: Checkpoint | None
    checkpoint_problem: str  # an unreadable checkpoint: the member refuses on it
    begin: LogBegin
    end_index: int
    end_pos: int
    end_chain: int | None
    end_term: int
    reason: str
    where: str  # "FILE offset N" of end_pos
    unverified: int
    refusal: str = ""
    cut: str = ""
    gap: str = ""  # a data file missing or of another size than its neighbours' spacing
    trusted_problem: str = ""  # the checkpoint's durable record lost beyond repair: the member refuses
    size_problem: str = ""  # data or index files of sizes the member refuses (store_file_size)
    rotten: str = ""  # a durable record whose extent is certain but which rotted: the member keeps it, repairs it
    end_extent: int = 0  # where the record that failed ends, as far as its header tells (= end_pos if none)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def committed_index(self) -> int:
        return self.checkpoint.committed_index if self.checkpoint is not None else -1

    @property
    def proven(self) -> bool:
        """Whether the store has dledger's checkpoint, which names what was fsynced."""
        return self.checkpoint is not None and self.checkpoint.proves_durable


def judge(store_dir: str | Path) -> Verdict:
    """Scan the store as recovery would and decide as recovery would, writing nothing."""
    d = Path(store_dir)
    ckpt_problem = ""
    try:
        ckpt = read_checkpoint(d)
    except UnreadableFile as e:
        ckpt, ckpt_problem = None, e.message
    sizes = _size_problem(d)
    files = list_files(d / "data")
    gap = ""
    g = first_gap(files)
    if g is not None:
        gap = f"{g[1].path} does not follow {g[0].path} (a data file is missing or has another size)"
        files = files[: files.index(g[0]) + 1]  # recovery refuses such a directory; scan what is contiguous
    begin = ckpt.begin if ckpt is not None else None
    first = files[0] if files else None
    if begin is None:
        begin = derive_begin_of(first.path if first else None, first.start if first else 0,
                                first.size if first else 0)
    if begin.chain_crc is None and first is not None and first.start <= begin.pos < first.end:
        # the record before the begin is gone: the chain before it is the one its first record follows
        h = read_header(first.path, begin.pos - first.start)
        chain = chain_before(h) if h is not None else None
        if chain is not None:
            begin = LogBegin(begin.index, begin.term, begin.pos, chain)
    data = ReadOnlyFiles(files)
    index = ReadOnlyFiles([f for f in list_files(d / "index") if f.size])
    with _Closing(data), _Closing(index):
        view = _View(d, data, index, begin.index, begin.term, begin.pos)
        store = cast(Any, view)  # recovery's steps read only these attributes of the store
        end: ScanEnd = scan_forward(store, ScanStart(begin.index, begin.pos, begin.chain_crc, begin.term))
        committed = ckpt.committed_index if ckpt is not None else -1
        trusted_problem, rotten = "", ""
        try:
            start = _trusted_start(store, ckpt, begin.chain_crc)
        except StoreError as e:
            trusted_problem = e.message
        else:
            bad = view.recovered_corrupt
            if bad is not None:
                rotten = f"record {bad[0]} rotted ({bad[1]}): a member keeps it and repairs it from the leader's copy"
                if end.index == bad[0]:  # the scan stopped at it: go on past it, as the member does
                    seen = end.unverified
                    end = scan_forward(store, start)
                    end.unverified += seen
        where = _where(data, end.pos)
        verdict = Verdict(d, files, ckpt, ckpt_problem, begin, end.index, end.pos, end.chain, end.term,
                          end.reason, where, end.unverified, gap=gap, end_extent=end.extent,
                          trusted_problem=trusted_problem, rotten=rotten)
        verdict.refusal = verdict.size_problem = sizes
        verdict.refusal = verdict.refusal or trusted_problem
        try:
            check_cut(store, end, committed, proven=verdict.proven, begin=begin.index)
        except StoreError as e:
            verdict.refusal = verdict.refusal or e.message
        else:
            if end.reason:
                verdict.cut = f"record {end.index} at {where} fails its check ({end.reason}): " + (
                    "past the checkpoint's durable record, recovery cuts it as a torn tail" if verdict.proven
                    else "the last record, cut short: recovery drops it")
    return verdict


def _size_problem(d: Path) -> str:
    """Why a member refuses the sizes or names of the data or index files, in the member's
    words (mapped_file.check_sizes, the member's own read-only check); "" when it takes them."""
    return check_sizes(d) or ""


def _where(data: ReadOnlyFiles, pos: int) -> str:
    for f in data.files:
        if f.start <= pos < f.end:
            return f"{f.path} offset {pos - f.start}"
    return f"position {pos}"


class _Closing:
    def __init__(self, data: ReadOnlyFiles) -> None:
        self.data = data

    def __enter__(self) -> ReadOnlyFiles:
        return self.data

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.data.close()


__all__ = ["ReadOnlyFile", "ReadOnlyFiles", "Verdict", "judge"]
