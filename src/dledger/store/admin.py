"""Offline inspection and repair of a file store: `dledger store inspect|repair-term`.

`inspect` reads a store directory without writing anything and without the store's lock
(so it also works beside a running member): the term and vote of `currterm`, the log's
begin and end and the last entry's term, and what would stop a member from starting or
from ever writing again (a term beyond the wire limit, as a forged message could once
leave behind; a term below the log's; a corrupt record).

`repair-term` rewrites `currterm` while holding the store's lock (store/lock.py), so never
under a running member, through the store's own atomic writer (checkpoint.write_currterm).

The directory is read through store/offline.py (file names, checkpoint, currterm, the log
begin) and records are validated by `entry.scan`, the validator recovery uses; nothing here
parses the record format itself.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

from dledger.codes import ResponseCode
from dledger.core.messages import LIMIT
from dledger.entry import BLANK, scan
from dledger.store.base import StoreError
from dledger.store.checkpoint import write_currterm
from dledger.store.lock import StoreDirLock
from dledger.store.offline import (
    CURRTERM,
    UnreadableFile,
    chain_before,
    derive_begin,
    list_files,
    read_checkpoint,
    read_currterm,
    read_header,
)


@dataclass(frozen=True)
class LogEnd:
    """The log of a store as recovery would find it (read-only: nothing is cut)."""

    begin_index: int
    end_index: int  # begin_index - 1 when empty
    last_term: int  # the last entry's term; the term before the log begin when empty (-1: none)
    committed_index: int
    problem: str  # "" or why the scan stopped before the last record written


@dataclass(frozen=True)
class CurrTerm:
    term: int | None  # None: missing or unreadable
    voted_for: str | None
    problem: str  # "" or why `term` is None though the file exists


def check_store_dir(store_dir: Path) -> None:
    if not store_dir.is_dir() or not (store_dir / "data").is_dir():
        raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                         f"{store_dir} is not a dledger store directory (no data/ in it)")


def read_currterm_view(store_dir: Path) -> CurrTerm:
    """`currterm` as inspect shows it: an unreadable one is a problem to report."""
    try:
        tf = read_currterm(store_dir)
    except UnreadableFile as e:
        return CurrTerm(None, None, e.message)
    return CurrTerm(None, None, "") if tf is None else CurrTerm(tf.term, tf.voted_for, "")


def read_log_end(store_dir: Path) -> LogEnd:
    """Scan the data files from the log begin (checkpoint), as recovery does, without writing.

    An unreadable checkpoint, which stops a member from starting, is the problem reported;
    the scan then goes on as without one (the log begin derived from the data)."""
    problem = ckpt_problem = ""
    try:
        ckpt = read_checkpoint(store_dir)
    except UnreadableFile as e:
        ckpt, ckpt_problem = None, f"{e.message}: a member refuses to start on it"
    files = list_files(store_dir / "data")
    committed = ckpt.committed_index if ckpt is not None else -1
    begin = ckpt.begin if ckpt is not None else None
    if begin is None:  # as recovery: the first record is the begin
        first = files[0] if files else None
        begin = derive_begin(read_header(first.path, 0) if first else None, first.start if first else 0,
                             first.size if first else 0)
    index, pos, term = begin.index, begin.pos, begin.term
    chain: int | None = begin.chain_crc
    k = next((k for k, f in enumerate(files) if f.start <= pos < f.end), len(files))
    while k < len(files):
        f = files[k]
        path, start, size = f.path, f.start, f.size
        if size == 0:
            break
        if k and files[k - 1].end != start:
            problem = f"{path} does not follow the data file before it (a file is missing or has the wrong size)"
            break
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            off = pos - start
            first_chain = chain
            if first_chain is None:
                h = read_header(path, off)
                first_chain = chain_before(h) if h is not None else None
            res = scan(mm, off, size, index, pos, first_chain or 0, term)
            if res.count:
                chain, term = res.last_chain, res.last_term
            index += res.count
            pos += res.consumed
            if res.stop == "blank":
                length = BLANK.unpack_from(mm, pos - start)[1]
                if length == size - (pos - start) and k + 1 < len(files):
                    pos, k = start + size, k + 1
                    continue
                if length != size - (pos - start):
                    problem = f"blank record of bad length {length} in {path} at offset {pos - start}"
            elif res.stop.startswith("corrupt: "):
                problem = f"{res.stop.removeprefix('corrupt: ')} in {path} at offset {pos - start}"
        finally:
            mm.close()
        break
    return LogEnd(begin.index, index - 1, term, committed, "; ".join(p for p in (ckpt_problem, problem) if p))


def inspect(store_dir: str | Path) -> dict[str, object]:
    """What `dledger store inspect` prints: one JSON object."""
    d = Path(store_dir)
    check_store_dir(d)
    ct = read_currterm_view(d)
    log_end = read_log_end(d)
    problems = [p for p in (ct.problem, log_end.problem) if p]
    if ct.term is not None:
        if ct.term >= LIMIT:
            problems.append(f"currterm {ct.term} is beyond the limit 2**62-1: no record could be written in it")
        elif ct.term < 0:
            problems.append(f"currterm {ct.term} is negative")
        elif ct.term < log_end.last_term:
            problems.append(f"currterm {ct.term} is below the last entry's term {log_end.last_term}")
    elif not ct.problem and log_end.end_index >= log_end.begin_index:
        problems.append(f"currterm is missing, but the log holds entries of term {log_end.last_term}")
    if log_end.last_term >= LIMIT:
        problems.append(f"the last entry's term {log_end.last_term} is beyond the limit 2**62-1")
    if log_end.committed_index > log_end.end_index:
        problems.append(f"the log ends at index {log_end.end_index}, before the committed index "
                        f"{log_end.committed_index}: committed entries are missing")
    return {
        "store_dir": str(d),
        "term": ct.term,
        "voted_for": ct.voted_for,
        "begin_index": log_end.begin_index,
        "end_index": log_end.end_index,
        "last_term": log_end.last_term,
        "committed_index": log_end.committed_index,
        "problems": problems,
    }


def repair_term(store_dir: str | Path, term: int | None = None) -> dict[str, object]:
    """Set `currterm` to `term`, by default the last entry's term (the highest term the store
    knows for sure), and clear the vote; refused while another process holds the store.
    Returns what changed, for `dledger store repair-term` to print.

    A member may have voted in a term above its last entry's before `currterm` was damaged;
    lowering the term lets it vote in that term again. Use it on a damaged term only.
    """
    d = Path(store_dir)
    check_store_dir(d)
    lock = StoreDirLock(d)  # refuses, naming the holder, when a member has the store open
    try:
        before = read_currterm_view(d)
        log_end = read_log_end(d)
        last = log_end.last_term
        new = max(last, 0) if term is None else term
        if new >= LIMIT:
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, f"term {new} is beyond the limit 2**62-1")
        if new < max(last, 0):
            raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT,
                             f"term {new} is below the last entry's term {max(last, 0)} in {d}")
        try:
            write_currterm(d / CURRTERM, new, None)  # as FileLedgerStore.save_term
        except OSError as e:
            raise StoreError(ResponseCode.DISK_ERROR,
                             f"cannot write {d / CURRTERM}: {e.strerror or e}") from e
    finally:
        lock.release()
    return {
        "store_dir": str(d),
        "term": {"before": before.term, "after": new},
        "voted_for": {"before": before.voted_for, "after": None},
        "last_term": last,
    }


__all__ = ["CurrTerm", "LogEnd", "check_store_dir", "inspect", "read_currterm_view", "read_log_end", "repair_term"]
