"""Reading index ranges of a live group, as the Spark tasks do.

Why a member is pinned: a short answer must prove that the rest of a range
holds only NOOP entries, and leadership may move between two read calls. A
task first finds a member whose own committed index covers the whole range
(the leader), reads that member's own copy only (`member=`), and after a short
answer checks that member's committed index again. A member's committed index
never goes back while it runs, so a short answer from it means
the range is exhausted.

Each read (one chunk, with the search for a member that covers the range) is
retried through leader changes on its own deadline (spark.retry), so a task
that has read for long still rides out a stall of its leader.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import DLedgerClient, EntryColumns, Metadata
from dledger.spark.options import ClientOptions
from dledger.spark.retry import TRANSIENT, Retry, describe, nobody_listens
from dledger.spark.schema import columns_batch

__all__ = ["DataLossError", "RangeReadSpec", "describe", "first_data_index", "leader_view", "read_range",
           "wait_leader_view"]

log = logging.getLogger(__name__)

# at most this many entries per read call and per Arrow batch; the member's answer limit
# (max_read_bytes, 4 MiB by default) keeps big bodies to fewer
READ_CHUNK = 16384


class DataLossError(RuntimeError):
    """Entries the query needs are gone (deleted by retention, or the log was reset)."""


def leader_view(client: DLedgerClient) -> Metadata:
    """The leader's own metadata (a follower's committed index lags)."""
    m = client.metadata()  # follows a follower's pointer to the leader
    if m.role != "leader":
        raise DLedgerError(ResponseCode.LEADER_NOT_READY, f"{m.self_id} knows no leader yet")
    return m


def wait_leader_view(client: DLedgerClient, group: str, timeout: float) -> Metadata:
    """leader_view, retried through elections (spark.retry): the driver's view of a log."""
    attempt = Retry(f"group {group}: asking the leader for the committed index", timeout,
                    probe=nobody_listens(client))
    while True:
        try:
            return leader_view(client)
        except DLedgerError as e:
            attempt.failed(e)


def first_data_index(client: DLedgerClient, group: str, start: int, timeout: float, *,
                     fail_on_data_loss: bool) -> int | None:
    """The index of the first committed NORMAL entry at or after `start` (None: none yet).
    The members skip NOOP and configuration entries, so this is one small request. The log
    begin may pass `start` after the caller looked (retention, `dledger compact`, another
    member answering): then the failOnDataLoss rule decides, as for the caller's own view."""
    attempt = Retry(f"group {group}: looking for data from index {start}", timeout, probe=nobody_listens(client))
    at = start
    while True:
        try:
            entries = client.read(at, 1, bodies=False)
        except DLedgerError as e:
            if e.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                at = _past_begin(client, group, at, timeout, fail_on_data_loss)
                continue
            attempt.failed(e)
            continue
        return entries[0].index if entries else None


def _past_begin(client: DLedgerClient, group: str, index: int, timeout: float, fail_on_data_loss: bool) -> int:
    """Where to look on when `index` is before the log begin: DataLossError, or (failOnDataLoss
    false) the begin the leader reports now (past `index` in any case: the member that refused
    may begin later than the leader)."""
    begin = wait_leader_view(client, group, timeout).ledger_begin_index
    msg = (f"group {group}: the query is at index {index} but the log now begins at {max(begin, index + 1)}; "
           "the entries before were deleted")
    if fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them (failOnDataLoss=false)", msg)
    return max(begin, index + 1)


@dataclass(frozen=True, slots=True)
class RangeReadSpec:
    group: str
    peers: str
    start: int
    end: int  # exclusive
    fail_on_data_loss: bool
    timeout: float
    client: ClientOptions
    broker: bool = False  # `group` is a broker set and `peers` its controllers
    bodies: bool = True  # False: the members send empty bodies (the query has no `body` column)


def _member_covering(client: DLedgerClient, spec: RangeReadSpec, attempt: Retry) -> str:
    """A member (the leader) whose committed index reaches spec.end - 1."""
    need = spec.end - 1
    while True:
        try:
            m = leader_view(client)
        except DLedgerError as e:
            attempt.failed(e)
            continue
        if m.committed_index >= need:
            return m.self_id
        attempt.wait(f"no member has committed index {need} yet (leader {m.self_id} has committed up to "
                     f"{m.committed_index})")


def read_range(spec: RangeReadSpec) -> Iterator[pa.RecordBatch]:
    """Committed NORMAL entries with index in [start, end), as Arrow batches, in index order."""
    if spec.end <= spec.start:
        return
    client = spec.client.client(spec.peers, spec.group)
    try:
        yield from _read_range(client, spec)
    finally:
        client.close()


def _read_range(client: DLedgerClient, spec: RangeReadSpec) -> Iterator[pa.RecordBatch]:
    index = spec.start
    member: str | None = None
    probe = nobody_listens(client)
    attempt: Retry | None = None  # the read at `index`: each read gets the whole deadline
    while index < spec.end:
        if attempt is None:
            attempt = Retry(f"group {spec.group}: read at index {index} (range [{spec.start}, {spec.end}))",
                            spec.timeout, probe=probe)
        if member is None:
            member = _member_covering(client, spec, attempt)
        want = min(spec.end - index, READ_CHUNK)
        try:
            cols = client.read_columns(index, want, member=member, bodies=spec.bodies)
        except DLedgerError as e:
            if e.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                index = _skip_lost(client, spec, member, index)
                continue
            # INDEX_OUT_OF_RANGE: the member restarted and has not learnt its committed index yet
            attempt.failed(e, retryable=e.code in TRANSIENT or e.code == ResponseCode.INDEX_OUT_OF_RANGE)
            member = None  # raises, or backs off: then the leader is asked again
            continue
        attempt = None
        batch = _in_range(spec, cols)
        if batch is not None:
            yield batch
        index = max(index, cols.next_index)
        if cols.next_index > cols.committed_index and index < spec.end:
            # the member scanned through its committed index; it covered `end - 1` when
            # chosen, so the range is exhausted unless the member restarted meanwhile
            try:
                still = client.metadata(member=member).committed_index >= spec.end - 1
            except DLedgerError as e:
                if e.code not in TRANSIENT:
                    raise
                still = False
            if still:
                return
            member = None


def _in_range(spec: RangeReadSpec, cols: EntryColumns) -> pa.RecordBatch | None:
    """The answer's entries below spec.end (indexes ascend), as an entry batch."""
    n = cols.count
    if n and int.from_bytes(cols.indexes[-8:], "little", signed=True) >= spec.end:
        n = bisect.bisect_left(cols.index_list(), spec.end)
    return columns_batch(spec.group, cols, n) if n else None


def _skip_lost(client: DLedgerClient, spec: RangeReadSpec, member: str, index: int) -> int:
    begin = client.metadata(member=member).ledger_begin_index
    msg = (f"group {spec.group}: entries [{index}, {begin}) are no longer in the log (it now begins at "
           f"{begin}, older files were deleted)")
    if spec.fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them (failOnDataLoss=false)", msg)
    return max(begin, index + 1)
