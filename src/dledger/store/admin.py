"""Offline inspection and repair of a file store: `dledger store inspect|repair-term`.

`inspect` reads a store directory without writing anything and without the store's lock
(so it also works beside a running member): the term and vote of `currterm`, the log's
begin and end and the last entry's term, and what would stop a member from starting or
from ever writing again (a term beyond the wire limit, as a forged message could once
leave behind; a term below the log's; a corrupt record).

`repair-term` rewrites `currterm` while holding the store's lock (store/lock.py), so never
under a running member, through the store's own atomic writer (checkpoint.write_currterm).

The directory is read through store/offline.py (file names, checkpoint, currterm, the log
begin) and the log is judged by store/verdict.py, which runs recovery's own read-only scan
and refusal rule: inspect says a member would refuse exactly when one would. `truncate`,
`import` and `export` are in store/tools.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dledger.codes import ResponseCode
from dledger.core.messages import LIMIT
from dledger.store.base import StoreError
from dledger.store.checkpoint import write_currterm
from dledger.store.lock import StoreDirLock
from dledger.store.offline import CURRTERM, UnreadableFile, read_currterm, repair_checkpoint_hint
from dledger.store.verdict import judge


@dataclass(frozen=True)
class LogEnd:
    """The log of a store as recovery would find it (read-only: nothing is cut)."""

    begin_index: int
    end_index: int  # begin_index - 1 when empty
    last_term: int  # the last entry's term; the term before the log begin when empty (-1: none)
    committed_index: int
    problem: str  # "" or why the scan stopped before the last record written
    unverified: int = 0  # upstream DLedger's records (both CRC fields 0): read, not checked
    opens: bool = True  # whether a member would start on it (recovery would not refuse)
    stop: str = ""  # why the scan stopped before the end of the data ("" for a clean end), and where


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
    """Scan the data files from the log begin as recovery does and decide as recovery decides
    (store/verdict.py: recovery's own read-only steps), without writing.

    An unreadable checkpoint, which stops a member from starting, is a problem reported; the
    scan then goes on as without one (the log begin derived from the data). So is a record
    that would make a member refuse to start (a bad record with data after it and no
    checkpoint naming what was fsynced, or one inside the committed log), with recovery's
    own message, which says what to run."""
    v = judge(store_dir)
    problems = []
    if v.checkpoint_problem:
        problems.append(f"a member refuses to start on it: {v.checkpoint_problem}")  # its message names the way out
    if v.gap:
        problems.append(f"{v.gap}: a member refuses to start on it")
    if v.rotten:
        problems.append(v.rotten)
    if v.refusal:
        problems.append(f"a member refuses to start on this store: {v.refusal}")
    elif v.cut:
        problems.append(v.cut)
    return LogEnd(v.begin.index, v.end_index - 1, v.end_term, v.committed_index, "; ".join(problems),
                  v.unverified, not (v.refusal or v.checkpoint_problem or v.gap),
                  v.reason and f"{v.reason} at {v.where}")


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
        problems.append(f"the checkpoint claims committed index {log_end.committed_index}, more than the data holds "
                        f"(records through {log_end.end_index}): committed entries are missing or the checkpoint "
                        f"is wrong; {repair_checkpoint_hint(d)}")
    return {
        "store_dir": str(d),
        "term": ct.term,
        "voted_for": ct.voted_for,
        "begin_index": log_end.begin_index,
        "end_index": log_end.end_index,
        "last_term": log_end.last_term,
        "committed_index": log_end.committed_index,
        # records upstream DLedger wrote (both CRC fields 0): read as upstream reads them, not
        # checked; `dledger store import` fills their CRCs
        "unverified": log_end.unverified,
        "member_starts": log_end.opens and not ct.problem,
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


__all__ = ["CurrTerm", "LogEnd", "check_store_dir", "inspect", "read_currterm_view", "read_log_end",
           "repair_checkpoint_hint", "repair_term"]
