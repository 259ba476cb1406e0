"""Transactions of batch writes and `isolation=read_committed` reads (docs/spark.md, "Atomic
batch writes"; the records: docs/format.md, "Transaction records").

Kafka's design on what the log already holds. A transactional write (sink option
`transactional`) is a job `<writeId>.<nonce>` whose tasks append as idempotent producers
`txn:<job>/p<partition>`; its driver ends it with one control record per group, itself an
idempotent append by producer `txn:<job>/commit` (or `.../abort`). Every idempotent write
is preceded by a session marker naming each entry's producer (core.producers), so a reader
that reads the markers (a markers-only READ) attributes every entry to its job, and knows
each job's outcome, without reading a single body:

- a job is *open* from its first entry until its control record; the **last stable index**
  is the first entry of the first open job: a read_committed reader reads below it only,
- entries of committed jobs are shown; those of aborted jobs never; control records never,
- a job still open `timeout_ms` after its first entry, by the log's own clock (the markers'
  timestamps), counts as aborted (its driver died): the driver never commits that late, so
  every reader, whenever it reads, decides the same.

Plain and idempotent writes outside transactions are shown as they come, as Kafka's
non-transactional records are to read_committed consumers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from dledger.codes import DLedgerError, ResponseCode
from dledger.core.producers import TRANSACTIONAL_PREFIX, SessionMarker
from dledger.runtime.client import DLedgerClient, Entry
from dledger.spark.retry import Retry, nobody_listens

log = logging.getLogger(__name__)

READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
TXN_PREFIX = TRANSACTIONAL_PREFIX
COMMIT, ABORT = "commit", "abort"
# a control record's body: this prefix, then msgpack [kind, job, ts_ms] (docs/format.md)
CONTROL_PREFIX = b"\x00dledger-txn\x01"
DEFAULT_TXN_TIMEOUT_S = 900.0
# how far before a read's start its markers are looked for: a marker precedes the entries of
# its write, and one write holds at most a drain's appends
BACK_SCAN = 1 << 17
_MARKERS_PER_READ = 10_000
_decode_marker = msgspec.msgpack.Decoder(SessionMarker).decode

Span = tuple[int, int]  # first and last index, inclusive


def job_id(write_id: str, timeout_s: float) -> str:
    """A new job of `write_id`: a nonce (a re-run is a transaction of its own: its rows are not
    answered as duplicates of an aborted run's), and its timeout, which every reader reads
    from the id itself, so all decide alike."""
    return f"{write_id}.{uuid.uuid4().hex[:8]}.t{max(1, int(timeout_s))}"


def job_timeout_ms(job: str) -> int:
    _, _, t = job.rpartition(".t")
    return int(t) * 1000 if t.isdigit() else int(DEFAULT_TXN_TIMEOUT_S * 1000)


def producer_id(job: str, part: str) -> str:
    return f"{TXN_PREFIX}{job}/{part}"


def job_of(producer: str) -> tuple[str, str] | None:
    """(job, part) of a transactional producer id; None for any other."""
    if not producer.startswith(TXN_PREFIX):
        return None
    job, _, part = producer[len(TXN_PREFIX):].rpartition("/")
    return (job, part) if job else None


def control_body(kind: str, job: str) -> bytes:
    return CONTROL_PREFIX + msgspec.msgpack.encode([kind, job, int(time.time() * 1000)])


def write_control(client: DLedgerClient, job: str, kind: str) -> int:
    """Append the job's commit or abort record to the client's group (an idempotent
    append: sent again after an unknown outcome, stored once); its index."""
    if client.producer is None or client.producer.id != producer_id(job, kind):
        raise ValueError("write_control needs a client that is the job's control producer")
    return client.append_batch([control_body(kind, job)])[0].index


@dataclass
class _Job:
    first_ts: int = -1  # its first entry's marker time (the leader's clock)
    owner: str | None = None  # its first row's owner (a digest): a control record by another is forged
    spans: list[Span] = field(default_factory=list)
    controls: list[tuple[str, int, str, int]] = field(default_factory=list)  # (kind, ts_ms, owner, index)

    def outcome(self) -> tuple[str, int]:
        """(commit/abort/"", when): its first control record by its own writer."""
        for kind, ts, owner, at in self.controls:
            if owner == self.owner:
                return kind, ts
            log.warning("a %s record at %d is by another principal than the transaction's writer: ignored", kind, at)
        return "", 0


@dataclass(frozen=True, slots=True)
class Visibility:
    """What a read_committed reader of [start, end) may show: indexes below `end` (the last
    stable index, or the asked end) outside `hidden`."""

    end: int
    hidden: tuple[Span, ...] = ()

    def within(self, start: int, end: int) -> tuple[Span, ...]:
        return tuple((max(a, start), min(b, end - 1)) for a, b in self.hidden if b >= start and a < end)


@dataclass(frozen=True, slots=True)
class _Run:
    """A run of entries one producer appended (from its session marker)."""

    span: Span
    job: str  # "" outside transactions
    part: str  # p<partition>, or commit / abort (a control record); "" outside transactions
    owner: str  # its writer's digest
    ts_ms: int  # the marker's time (the leader's clock)


def _runs(client: DLedgerClient, start: int, stop: int | None, deadline: float, back: int = BACK_SCAN
          ) -> Iterator[_Run]:
    """The runs whose markers lie in [start - back, stop), or through the committed index
    when `stop` is None."""
    index = max(0, start - back)
    committed: int | None = None
    while committed is None or index <= (committed if stop is None else min(committed, stop - 1)):
        markers, nxt, c = _read_markers(client, index, deadline)
        committed = c if committed is None else committed
        for m in markers:
            marker = _decode_marker(m.body)
            at = m.index + 1
            for run in marker.runs:
                span = (at, at + run.count - 1)
                at += run.count
                job, part = (job_of(run.producer) if run.producer else None) or ("", "")
                yield _Run(span, job, part, run.owner, marker.ts_ms)
        if nxt <= index:
            break
        index = nxt


@dataclass
class ControlCursor:
    """Where a stream's last control scan ended: every marker below `scanned` was read, and
    `ahead` holds the control records they named at or after it. The next micro-batch, which
    starts there, reads markers from there only, not BACK_SCAN indexes back each time."""

    scanned: int = -1
    ahead: tuple[Span, ...] = ()


_told_unsupported = False  # members without markers-only reads were warned about in this process


def controls(client: DLedgerClient, start: int, end: int, timeout: float,
             cursor: ControlCursor | None = None) -> tuple[Span, ...]:
    """The control records in [start, end), hidden from every reader as Kafka hides its
    (read_uncommitted included); a client of its own (closed here). With a `cursor` at
    `start` (a stream's next batch) only markers from `start` are read; it moves to `end`."""
    resume = cursor is not None and cursor.scanned == start
    try:
        deadline = time.monotonic() + timeout
        found = _runs(client, start, end, deadline, back=0 if resume else BACK_SCAN)
        spans = [r.span for r in found if r.part in (COMMIT, ABORT)]
    except DLedgerError as e:
        if e.code != ResponseCode.UNSUPPORTED:
            raise
        # a member older than markers-only reads (a rolling upgrade): read as before, control
        # records included, rather than fail every default read; said once per process (a
        # stream plans every trigger), then at debug level
        global _told_unsupported
        (log.debug if _told_unsupported else log.warning)(
            "group members do not serve markers-only reads (%s): control records are shown as rows", e.message)
        _told_unsupported = True
        return ()
    finally:
        client.close()
    if resume and cursor is not None:
        spans.extend(cursor.ahead)
    if cursor is not None:
        cursor.scanned, cursor.ahead = end, tuple(x for x in spans if x[1] >= end)
    return tuple(_merge(x for x in spans if x[1] >= start and x[0] < end))


def scan(client: DLedgerClient, start: int, end: int, deadline: float) -> Visibility:
    """The visibility of [start, end) from the group's markers (read from start - BACK_SCAN
    through the committed index, where outcomes of jobs with entries in the range are)."""
    jobs: dict[str, _Job] = {}
    control: list[Span] = []
    clock = 0  # the log's clock: the latest marker's time
    for r in _runs(client, start, None, deadline):
        clock = max(clock, r.ts_ms)
        if not r.job:
            continue
        j = jobs.setdefault(r.job, _Job())
        if r.part in (COMMIT, ABORT):
            control.append(r.span)
            j.controls.append((r.part, r.ts_ms, r.owner, r.span[0]))
        else:
            if j.owner is None:
                j.first_ts, j.owner = r.ts_ms, r.owner
            j.spans.append(r.span)
    stable = end
    hidden: list[Span] = list(control)
    for job, j in jobs.items():
        if not j.spans:
            continue
        (outcome, outcome_ts), timeout_ms = j.outcome(), job_timeout_ms(job)
        if outcome == COMMIT and outcome_ts - j.first_ts > timeout_ms:
            outcome = ABORT  # committed after its timeout: readers had been free to take it as aborted
        if not outcome and clock - j.first_ts > timeout_ms:
            outcome = ABORT
            log.info("transaction %s is open for longer than %d ms: taken as aborted", job, timeout_ms)
        if not outcome:
            stable = min(stable, max(start, min(a for a, _ in j.spans)))
        elif outcome == ABORT:
            hidden.extend(j.spans)
    return Visibility(stable, tuple(_merge(s for s in hidden if s[1] >= start)))


def visibility(client: DLedgerClient, start: int, end: int, timeout: float) -> Visibility:
    """`scan` with a client of its own (closed here), retrying for `timeout` seconds."""
    try:
        return scan(client, start, end, time.monotonic() + timeout)
    finally:
        client.close()


def _read_markers(client: DLedgerClient, index: int, deadline: float) -> tuple[list[Entry], int, int]:
    """One markers read, retried through leader changes (spark.retry) until `deadline`."""
    attempt = Retry(f"markers read at index {index}", max(0.0, deadline - time.monotonic()),
                    probe=nobody_listens(client))
    while True:
        try:
            return client.read_markers(index, _MARKERS_PER_READ)
        except DLedgerError as e:
            attempt.failed(e)


def _merge(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def drop_hidden(batch: pa.RecordBatch, hidden: Sequence[Span]) -> pa.RecordBatch:
    """The batch without rows whose `index` is in a hidden span."""
    if not hidden or not batch.num_rows:
        return batch
    idx = batch.column("index")
    lo, hi = pc.min(idx).as_py(), pc.max(idx).as_py()
    keep = None
    for a, b in hidden:
        if b < lo or a > hi:
            continue
        out = pc.or_(pc.less(idx, a), pc.greater(idx, b))
        keep = out if keep is None else pc.and_(keep, out)
    return batch if keep is None else batch.filter(keep)
