"""Writes of `format("dledger")`: batch and streaming, exactly once per row (docs/spark.md).

Each task appends its rows as an idempotent producer (core.producers) whose id does not
depend on the attempt: `<writeId>/p<partition>` for a batch write (writeId: the option, or
one drawn when the write is planned, so every attempt of a task shares it) and
`<queryId>/p<partition>` in epoch `batchId` for a micro-batch (the query id survives
restarts from the checkpoint; one producer per partition, each batch a new epoch, so the
leader's table does not grow with the batches, and a task of an older batch still running
is fenced). Rows are numbered in the order the task sees them, so a retried task, or a
micro-batch run again after a driver crash or a stop, sends the same numbers: what the log
holds already is answered with its original index and only the rest is appended. This
needs the retried task to see the same rows in the same order (Spark's replay of a
deterministic plan and of a replayable source, as Kafka's and ours).

A string column `group` routes each row to that group, as Kafka's `topic` column does:
null (or no such column) is the `group` option's; the groups are at `peers`, or each at
its own peers with option `groups` (JSON). A task keeps one producer per group it writes
to, each numbering that group's rows in row order (the same id: each group's producer
table is its own), so a retry numbers each group's rows alike and exactly-once holds per
group.

Within a task an append whose outcome is unknown (the leader died) is sent again by the
client, and again here until `writeTimeoutSeconds`: no task fails for a failover, nor for
PRODUCER_RATE_LIMITED (nothing written). What retrying cannot mend fails the task at once,
saying why: a retry whose rows differ from what an attempt stored (SEQUENCE_REUSED), a
retry re-sending rows older than the leader can still compare with what is stored
(DUPLICATE_UNVERIFIABLE: beyond max_producer_spans, or deleted by retention), a
producer id another principal made (PRODUCER_NOT_OWNED), a producer the leader forgot
(UNKNOWN_PRODUCER: the task's epochs are Spark's batch ids, so the client must not start a
session of its own, which would take the next micro-batch's epoch).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from dledger.broker.client import BrokerClient
from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import DLedgerClient
from dledger.spark.broker_online import send_bodies
from dledger.spark.isolation import ABORT, COMMIT, DEFAULT_TXN_TIMEOUT_S, job_id, producer_id, write_control
from dledger.spark.online import describe
from dledger.spark.options import (
    DEFAULT_BATCH_SIZE,
    ClientOptions,
    OptionError,
    get_batch_size,
    get_bool,
    get_float,
    get_str,
    parse_brokers,
    parse_groups,
)
from dledger.spark.retry import Retry, nobody_listens

log = logging.getLogger(__name__)

# Appends are sent once this many body bytes are pending, whatever `batchSize` says: one
# request stays far below the server's frame limit (64 MiB).
MAX_BATCH_BYTES = 8 << 20
DEFAULT_WRITE_TIMEOUT_S = 120.0
MAX_WRITE_ID = 80  # the producer id adds the partition (and a batch): 128 characters in all
# what retrying cannot mend: a bad request or a broken producer sequence
_FATAL = {ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.UNKNOWN_GROUP, ResponseCode.UNAUTHENTICATED,
          ResponseCode.OUT_OF_ORDER_SEQUENCE, ResponseCode.UNKNOWN_PRODUCER, ResponseCode.UNSUPPORTED,
          ResponseCode.PRODUCER_FENCED, ResponseCode.PRODUCER_NOT_OWNED, ResponseCode.SEQUENCE_REUSED,
          ResponseCode.DUPLICATE_UNVERIFIABLE, ResponseCode.REQUEST_WITH_EMPTY_BODYS}
# what an operator should know beside the code
_HINTS = {
    ResponseCode.SEQUENCE_REUSED: "this attempt's rows differ from those an earlier attempt (or an earlier write "
                                  "with the same writeId) stored under the same numbers: make the plan deterministic "
                                  "(sort within partitions, or partition by a key), or use a new writeId",
    ResponseCode.DUPLICATE_UNVERIFIABLE: "the retried task re-sent entries older than the leader can still compare "
                                         "with what an earlier attempt stored (its producer's places were trimmed "
                                         "beyond max_producer_spans, or the entries deleted by retention): raise "
                                         "max_producer_spans on the members, or use a new writeId",
    ResponseCode.PRODUCER_NOT_OWNED: "another principal (certificate or token) created this producer id: use "
                                     "another writeId (or query), or this job's own credentials",
    ResponseCode.UNKNOWN_PRODUCER: "the group forgot this task's producer (evicted or expired): rows this task "
                                   "appended before may be appended again by the retry",
}


@dataclass(frozen=True, slots=True)
class GroupAppend:
    """What one task appended to one group: `rows` entries, indexes first..last (-1 if none),
    `duplicates` of them in the log already (an earlier attempt had appended them)."""

    rows: int
    first_index: int
    last_index: int
    duplicates: int = 0


class AppendCommitMessage(WriterCommitMessage):
    """What one task appended: `rows` entries in all, `duplicates` of them in the log already;
    per group in `groups`. first_index..last_index: the write's group's (the only one
    without a `group` column; -1 if none)."""

    def __init__(self, rows: int, first_index: int, last_index: int, duplicates: int = 0,
                 groups: dict[str, GroupAppend] | None = None) -> None:
        self.rows, self.first_index, self.last_index, self.duplicates = rows, first_index, last_index, duplicates
        self.groups = groups or {}


@dataclass(frozen=True, slots=True)
class WriteConfig:
    group: str
    peers: str  # a broker set's: its controllers
    batch_size: int
    client: ClientOptions
    broker: bool = False
    idempotent: bool = True
    write_id: str = ""  # a batch write's: the producer ids' prefix
    write_timeout: float = DEFAULT_WRITE_TIMEOUT_S
    group_column: str | None = None  # routes each row to a group (Kafka's `topic` column); null: `group`
    routes: dict[str, str] | None = None  # option groups: each group's peers (else every group at `peers`)
    job: str = ""  # a transactional batch write's job (spark.isolation); "" not transactional
    txn_timeout: float = DEFAULT_TXN_TIMEOUT_S

    def peers_of(self, group: str) -> str | None:
        """Where `group` is; None: not among option groups."""
        return self.peers if self.routes is None else self.routes.get(group)

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: StructType) -> WriteConfig:
        brokers = parse_brokers(options)
        if brokers is not None and len(brokers) != 1:
            raise OptionError(f"a write goes to one broker set: `brokers` names {len(brokers)}")
        group_column = _column_name(schema.fieldNames(), "group")
        if group_column is not None and not isinstance(schema[group_column].dataType, StringType):
            raise OptionError(f"column `group` (each row's group) must be a string, not "
                              f"{schema[group_column].dataType.simpleString()}")
        routes: dict[str, str] | None = None
        if get_str(options, "groups") is not None:
            if group_column is None or brokers is not None:
                raise OptionError("a write goes to one group: give `peers` and `group`, not `groups` (or add a "
                                  "string column `group` that names each row's group among `groups`)")
            routes = parse_groups({k: v for k, v in options.items() if k.lower() != "group"})
            group = get_str(options, "group") or (next(iter(routes)) if len(routes) == 1 else "")
            if group and group not in routes:
                raise OptionError(f"option group {group!r} (rows with a null `group`) is not among option groups "
                                  f"({', '.join(sorted(routes))})")
            peers = ""
        else:
            ((group, peers),) = (brokers or parse_groups(options)).items()
        body = _body_name(schema.fieldNames())
        if body is None:
            raise OptionError(f"writing to dledger needs a `body` column (binary or string); columns are "
                              f"{', '.join(schema.fieldNames())}")
        if not isinstance(schema[body].dataType, (BinaryType, StringType)):
            raise OptionError(f"column `body` must be binary or string, not {schema[body].dataType.simpleString()}")
        write_id = get_str(options, "writeId") or uuid.uuid4().hex
        if len(write_id) > MAX_WRITE_ID:
            raise OptionError(f"option writeId: at most {MAX_WRITE_ID} characters, got {len(write_id)}")
        timeout = get_float(options, "writeTimeoutSeconds", DEFAULT_WRITE_TIMEOUT_S)
        if timeout <= 0:
            raise OptionError(f"option writeTimeoutSeconds must be > 0, got {timeout}")
        idempotent = get_bool(options, "idempotent", True)
        if brokers is not None and get_str(options, "idempotent") is not None and idempotent:
            raise OptionError("option idempotent: broker sets take plain sends (at-least-once); leave it out")
        transactional = get_bool(options, "transactional", False)
        txn_timeout = get_float(options, "transactionTimeoutSeconds", DEFAULT_TXN_TIMEOUT_S)
        if transactional and (brokers is not None or not idempotent):
            raise OptionError("option transactional: needs idempotent appends to Raft groups (not broker sets, "
                              "not idempotent=false)")
        if txn_timeout < 1:
            raise OptionError(f"option transactionTimeoutSeconds must be >= 1, got {txn_timeout}")
        return cls(group, peers, get_batch_size(options, DEFAULT_BATCH_SIZE), ClientOptions.from_options(options),
                   brokers is not None, idempotent and brokers is None, write_id, timeout, group_column, routes,
                   job_id(write_id, txn_timeout) if transactional else "", txn_timeout)

    def producer(self, streaming: bool) -> tuple[str, int] | None:
        """This task's producer id and epoch (None: plain appends), the same for every attempt."""
        if not self.idempotent:
            return None
        tc = TaskContext.get()
        if tc is None:  # not in a Spark task (a direct call): a producer of its own
            return uuid.uuid4().hex, 0
        if streaming:
            query, batch = tc.getLocalProperty("sql.streaming.queryId"), tc.getLocalProperty("streaming.sql.batchId")
            if not query or batch is None or not batch.isdigit():
                raise RuntimeError("dledger: a micro-batch task without its query and batch id (Spark changed?)")
            return f"{query}/p{tc.partitionId()}", int(batch)
        if self.job:
            return producer_id(self.job, f"p{tc.partitionId()}"), 0
        return f"{self.write_id}/p{tc.partitionId()}", 0

    def control(self, group: str, kind: str) -> int:
        """Write the job's commit or abort record to `group`; its index."""
        peers = self.peers_of(group)
        assert peers is not None and self.job
        client = self.client.client(peers, group, (producer_id(self.job, kind), 0))
        try:
            return write_control(client, self.job, kind)
        finally:
            client.close()


def _column_name(names: list[str], name: str) -> str | None:
    """The column `name`'s spelling (Spark's names are case-insensitive)."""
    if name in names:
        return name
    return next((n for n in names if n.lower() == name), None)


def _body_name(names: list[str]) -> str | None:
    return _column_name(names, "body")


def _bodies(batch: pa.RecordBatch, seen: int) -> list[bytes]:
    """The batch's bodies, checked whole before any is sent (a null fails the task first)."""
    col = batch.column(_body_name(batch.schema.names) or "body")
    if col.null_count:
        at = seen + col.is_null().index(True).as_py()
        raise ValueError(f"dledger: row {at} of this task has a null body; filter nulls out or give an empty body")
    if not pa.types.is_binary(col.type):
        col = col.cast(pa.binary())  # string (UTF-8 already) or large variants, in Arrow: no call per row
    bodies: list[bytes] = col.to_pylist()  # bytes objects, each what the request sends
    return bodies


def _route(cfg: WriteConfig, batch: pa.RecordBatch, bodies: list[bytes], seen: int) -> dict[str, list[bytes]]:
    """The batch's bodies per group (the `group` column; null: the `group` option), each
    group's in row order: a retry, seeing the same rows, numbers each group's alike."""
    assert cfg.group_column is not None
    out: dict[str, list[bytes]] = {}
    for k, (group, body) in enumerate(zip(batch.column(cfg.group_column).to_pylist(), bodies, strict=True)):
        group = group or cfg.group
        if not group:
            raise ValueError(f"dledger: row {seen + k} of this task has a null `group` and option groups names "
                             f"several: set option group for such rows, or fill the column")
        if group not in out and cfg.peers_of(group) is None:
            assert cfg.routes is not None
            raise ValueError(f"dledger: row {seen + k} of this task names group {group!r}, not among option "
                             f"groups ({', '.join(sorted(cfg.routes))})")
        out.setdefault(group, []).append(body)
    return out


class _Appender:
    """One task's appends to one group: bodies gathered into requests of `batch_size` (or 8 MiB)."""

    def __init__(self, cfg: WriteConfig, group: str, producer: tuple[str, int] | None) -> None:
        self.cfg = cfg
        self.group = group
        peers = cfg.peers_of(group)
        assert peers is not None  # checked by _route
        self.client: DLedgerClient | BrokerClient = (
            cfg.client.broker_client(peers, group) if cfg.broker
            else cfg.client.client(peers, group, producer))
        if isinstance(self.client, DLedgerClient) and self.client.producer is not None:
            self.client.producer.new_sessions = False  # its epochs are Spark's: UNKNOWN_PRODUCER fails the task
        self.rows = self.duplicates = 0
        self.first = self.last = -1
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, bodies: list[bytes]) -> None:
        """Requests cut where a body-by-body walk would cut them (`batch_size` bodies, or
        the body that reaches MAX_BATCH_BYTES), taken a slice at a time where no body in it
        reaches the byte limit (no Python step per row)."""
        k, n = 0, len(bodies)
        while k < n:
            chunk = bodies[k : k + self.cfg.batch_size - len(self.pending)]
            size = sum(map(len, chunk))
            if self.pending_bytes + size >= MAX_BATCH_BYTES:
                for body in chunk:  # the limit falls inside this slice: find the body that reaches it
                    self.pending.append(body)
                    self.pending_bytes += len(body)
                    k += 1
                    if self.pending_bytes >= MAX_BATCH_BYTES:
                        break
                self.flush()
                continue
            self.pending.extend(chunk)
            self.pending_bytes += size
            k += len(chunk)
            if len(self.pending) >= self.cfg.batch_size:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        client = self.client
        if isinstance(client, BrokerClient):
            lo, hi = send_bodies(client, self.group, self.pending)
        else:
            lo, hi = self._append(client)
        if self.first < 0:
            self.first = lo
        self.last = hi
        self.rows += len(self.pending)
        self.pending, self.pending_bytes = [], 0

    def _append(self, client: DLedgerClient) -> tuple[int, int]:
        """Send the pending bodies until they are in; an idempotent producer resends the same
        bodies after any failure that retrying can mend (they are stored once)."""
        attempt = Retry(f"group {self.cfg.group}: append of {len(self.pending)} entries", self.cfg.write_timeout,
                        "writeTimeoutSeconds", nobody_listens(client))
        producer = client.producer
        while True:
            try:
                span = client.append_span(self.pending)
                self.duplicates += span.duplicates
                return span.first_index, span.last_index
            except DLedgerError as e:
                try:  # spark.retry: backs off, or raises (the deadline, or no member reachable)
                    if producer is None or e.code in _FATAL:
                        raise
                    attempt.failed(e, retryable=True)
                except DLedgerError as final:
                    hint = f"; {_HINTS[e.code]}" if e.code in _HINTS and producer is not None else ""
                    raise RuntimeError(
                        f"dledger: append of {len(self.pending)} entries to group {self.group} failed "
                        f"({self.rows} rows of this task were appended before): {describe(final)}{hint}") from e

    def close(self) -> None:
        self.client.close()


def append_batches(cfg: WriteConfig, batches: Iterator[pa.RecordBatch], producer: tuple[str, int] | None = None
                   ) -> AppendCommitMessage:
    """Append every row's body, in row order, as `producer` (id, epoch; None: plain appends):
    to the write's group, or with a `group` column to each row's, a producer per group
    (each group's producer table is its own, so the ids are the same)."""
    appenders: dict[str, _Appender] = {}

    def to(group: str) -> _Appender:
        a = appenders.get(group)
        if a is None:
            a = appenders[group] = _Appender(cfg, group, producer)
        return a

    seen = 0
    try:
        for batch in batches:
            bodies = _bodies(batch, seen)
            if cfg.group_column is None:
                to(cfg.group).add(bodies)
            else:
                for group, part in _route(cfg, batch, bodies, seen).items():
                    to(group).add(part)
            seen += len(bodies)
        for a in appenders.values():
            a.flush()
    finally:
        for a in appenders.values():
            a.close()
    groups = {g: GroupAppend(a.rows, a.first, a.last, a.duplicates) for g, a in appenders.items()}
    own = groups.get(cfg.group, GroupAppend(0, -1, -1))
    return AppendCommitMessage(sum(g.rows for g in groups.values()), own.first_index, own.last_index,
                               sum(g.duplicates for g in groups.values()), groups)


def _summary(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, AppendCommitMessage)]
    return sum(m.rows for m in done), sum(m.duplicates for m in done)


class DLedgerWriter(DataSourceArrowWriter):
    def __init__(self, cfg: WriteConfig) -> None:
        self.cfg = cfg
        self.started = time.monotonic()  # on the driver, before any task: a transaction's clock

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AppendCommitMessage:
        return append_batches(self.cfg, iterator, self.cfg.producer(streaming=False))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, dups = _summary(messages)
        if self.cfg.job:
            self._end_transaction(messages)
        log.info("group %s: write %s appended %d entries (%d were in the log already)", self.cfg.group,
                 self.cfg.job or self.cfg.write_id, rows, dups)

    def _end_transaction(self, messages: list[WriterCommitMessage | None]) -> None:
        """The commit records, one per group the tasks wrote to; past half its timeout the job
        aborts instead (readers take a job open past its timeout for aborted, by the log's
        clock: committing that late could show it to some and not to others)."""
        groups = sorted({g for m in messages if isinstance(m, AppendCommitMessage) for g in m.groups})
        elapsed = time.monotonic() - self.started
        if elapsed > self.cfg.txn_timeout / 2:
            for g in groups:
                self.cfg.control(g, ABORT)
            raise RuntimeError(f"dledger: transaction {self.cfg.job} took {elapsed:.0f} s, more than half its "
                               f"transactionTimeoutSeconds ({self.cfg.txn_timeout:.0f}): aborted, its rows are never "
                               f"shown to read_committed readers; raise transactionTimeoutSeconds")
        for g in groups:
            at = self.cfg.control(g, COMMIT)
            log.info("group %s: transaction %s committed (record at %d)", g, self.cfg.job, at)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, _ = _summary(messages)
        if self.cfg.job:
            groups = {g for m in messages if isinstance(m, AppendCommitMessage) for g in m.groups}
            groups |= set(self.cfg.routes or ()) | {self.cfg.group}
            for g in sorted(groups):
                try:
                    self.cfg.control(g, ABORT)
                except Exception as e:  # readers take it for aborted at its timeout anyway
                    log.error("group %s: abort record of transaction %s not written (%s); read_committed readers "
                              "wait for its timeout (%.0f s)", g, self.cfg.job, e, self.cfg.txn_timeout)
            log.warning("transaction %s aborted: %d entries appended by finished tasks stay in the log, never shown "
                        "to read_committed readers; a re-run is a new transaction", self.cfg.job, rows)
            return
        how = (f"run it again with option writeId={self.cfg.write_id} and the same rows to append each row "
               f"once" if self.cfg.idempotent else "(at-least-once: idempotent=false)")
        log.warning("group %s: write aborted; %d entries appended by finished tasks stay in the log: %s",
                    self.cfg.group, rows, how)


class DLedgerStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, cfg: WriteConfig) -> None:
        if cfg.job:
            raise OptionError("option transactional is for batch writes (a micro-batch is not a transaction here)")
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AppendCommitMessage:
        return append_batches(self.cfg, iterator, self.cfg.producer(streaming=True))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, dups = _summary(messages)
        log.info("group %s: micro-batch %d appended %d entries (%d were in the log already)", self.cfg.group,
                 batchId, rows, dups)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, _ = _summary(messages)
        log.warning("group %s: micro-batch %d aborted; %d entries appended stay in the log (the batch run again "
                    "appends only the rest)", self.cfg.group, batchId, rows)

