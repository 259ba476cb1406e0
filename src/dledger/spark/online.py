"""Reading index ranges of a live group, as the Spark tasks do.

Why a member is pinned: a short answer must prove that the rest of a range
holds only NOOP entries, and leadership may move between two read calls. A
task first finds a member whose own committed index covers the whole range
(the leader), reads that member's own copy only (`member=`), and after a short
answer checks that member's committed index again. A member's committed index
never goes back while it runs, so a short answer from it means
the range is exhausted.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import DLedgerClient, EntryColumns, Metadata
from dledger.spark.options import ClientOptions
from dledger.spark.schema import columns_batch

log = logging.getLogger(__name__)

# at most this many entries per read call and per Arrow batch; the member's answer limit
# (max_read_bytes, 4 MiB by default) keeps big bodies to fewer
READ_CHUNK = 16384

# Worth waiting for: an election, a member restarting, a network hiccup.
_TRANSIENT = {
    ResponseCode.TIMEOUT,
    ResponseCode.NETWORK_ERROR,
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_NOT_READY,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_PENDING_FULL,
    ResponseCode.TERM_CHANGED,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
}


class DataLossError(RuntimeError):
    """Entries the query needs are gone (deleted by retention, or the log was reset)."""


def describe(e: DLedgerError) -> str:
    """The response code's name and number first: what an operator greps for."""
    return f"{e.code.name} ({int(e.code)}): {e.message}"


def leader_view(client: DLedgerClient) -> Metadata:
    """The leader's own metadata (a follower's committed index lags)."""
    m = client.metadata()  # follows a follower's pointer to the leader
    if m.role != "leader":
        raise DLedgerError(ResponseCode.LEADER_NOT_READY, f"{m.self_id} knows no leader yet")
    return m


def wait_leader_view(client: DLedgerClient, group: str, timeout: float) -> Metadata:
    """leader_view, retried through elections until `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return leader_view(client)
        except DLedgerError as e:
            if e.code not in _TRANSIENT or time.monotonic() >= deadline:
                tried = ", ".join(f"{m} at {p.address}" for m, p in client.peers.items())
                raise DLedgerError(e.code, f"group {group}: no leader answered within {timeout:.0f} s "
                                           f"(tried {tried}): {describe(e)}") from e
            log.info("group %s: waiting for a leader (%s)", group, describe(e))
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


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


def _member_covering(client: DLedgerClient, spec: RangeReadSpec, deadline: float) -> str:
    """A member (the leader) whose committed index reaches spec.end - 1."""
    need = spec.end - 1
    delay = 0.1
    while True:
        try:
            m = leader_view(client)
            if m.committed_index >= need:
                return m.self_id
            last = f"leader {m.self_id} has committed up to {m.committed_index}"
        except DLedgerError as e:
            if e.code not in _TRANSIENT:
                raise
            last = describe(e)
        if time.monotonic() >= deadline:
            raise DLedgerError(ResponseCode.TIMEOUT, f"group {spec.group}: no member has committed index {need} "
                                                     f"within {spec.timeout:.0f} s ({last})")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def read_range(spec: RangeReadSpec) -> Iterator[pa.RecordBatch]:
    """Committed NORMAL entries with index in [start, end), as Arrow batches, in index order."""
    if spec.end <= spec.start:
        return
    deadline = time.monotonic() + spec.timeout
    client = spec.client.client(spec.peers, spec.group)
    try:
        yield from _read_range(client, spec, deadline)
    finally:
        client.close()


def _read_range(client: DLedgerClient, spec: RangeReadSpec, deadline: float) -> Iterator[pa.RecordBatch]:
    index = spec.start
    member: str | None = None
    while index < spec.end:
        if member is None:
            member = _member_covering(client, spec, deadline)
        want = min(spec.end - index, READ_CHUNK)
        try:
            cols = client.read_columns(index, want, member=member, bodies=spec.bodies)
        except DLedgerError as e:
            if e.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                index = _skip_lost(client, spec, member, index)
                continue
            # INDEX_OUT_OF_RANGE: the member restarted and has not learnt its committed index yet
            if (e.code in _TRANSIENT or e.code == ResponseCode.INDEX_OUT_OF_RANGE) and time.monotonic() < deadline:
                log.info("group %s: read at %d from %s failed (%s); retrying", spec.group, index, member, describe(e))
                member = None
                time.sleep(0.2)
                continue
            raise DLedgerError(e.code, f"group {spec.group}: read at index {index} failed: {describe(e)}") from e
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
                if e.code not in _TRANSIENT:
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
