"""`format("dledger")`: batch and streaming reads of committed entries, and writes (SPEC §7).

Reads follow Kafka's source: offsets are next indexes per group
(`{"<group>": <next index>}`), ranges are end-exclusive, and a micro-batch's
partitions depend only on its (start, end) offsets, so a batch replayed after
a failure reads the same rows. The end of what may be read is the leader's
committed index + 1: uncommitted entries are never seen.

Broker sets (options `controller` and `brokers`) read the same way: the "group" is the
broker set, `term` its master epoch, `pos` the record's offset, and the end is the last
record within the master's confirm offset. Writes to a broker set go through BrokerClient.

Writes append the `body` column in batches to the leader. A task that fails
after some of its batches were acknowledged is retried whole by Spark, so
rows may be appended twice: at-least-once, like Kafka's sink.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from dledger.broker.client import BrokerClient
from dledger.codes import DLedgerError
from dledger.runtime.client import DLedgerClient
from dledger.spark.broker_online import broker_bounds, read_broker_range, send_bodies
from dledger.spark.online import DataLossError, RangeReadSpec, describe, read_range, wait_leader_view
from dledger.spark.options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENTRIES_PER_PARTITION,
    DEFAULT_TIMEOUT_S,
    EARLIEST,
    LATEST,
    READ_OPTIONS,
    WRITE_OPTIONS,
    ClientOptions,
    OptionError,
    allocate,
    check_names,
    get_batch_size,
    get_bool,
    get_float,
    get_int,
    get_str,
    parse_brokers,
    parse_groups,
    parse_index_spec,
    resolve,
    split_range,
)
from dledger.spark.schema import ENTRY_SCHEMA

log = logging.getLogger(__name__)

# Appends are sent once this many body bytes are pending, whatever `batchSize`
# says: one request stays far below the server's frame limit (64 MiB).
MAX_BATCH_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class ReadConfig:
    groups: dict[str, str]
    starting: dict[str, int]
    ending: dict[str, int]
    max_entries_per_trigger: int | None
    fail_on_data_loss: bool
    entries_per_partition: int
    timeout: float
    client: ClientOptions
    brokers: bool = False  # `groups` are broker sets -> their controllers

    @classmethod
    def from_options(cls, options: Mapping[str, str], streaming: bool) -> ReadConfig:
        brokers = parse_brokers(options)
        groups = brokers or parse_groups(options)
        # Kafka's defaults: a batch reads everything, a new stream starts at the end
        starting = parse_index_spec(get_str(options, "startingIndex"), "startingIndex", groups,
                                    LATEST if streaming else EARLIEST)
        ending_raw = get_str(options, "endingIndex")
        if streaming and ending_raw is not None:
            raise OptionError("option endingIndex is for batch reads only; a stream has no end")
        ending = parse_index_spec(ending_raw, "endingIndex", groups, LATEST)
        if not streaming:
            if any(v == LATEST for v in starting.values()):
                raise OptionError("option startingIndex: latest is not valid for a batch read (it would be empty)")
            if any(v == EARLIEST for v in ending.values()):
                raise OptionError("option endingIndex: earliest is not valid for a batch read")
        max_trigger = get_int(options, "maxEntriesPerTrigger", None)
        if max_trigger is not None and not streaming:
            log.info("maxEntriesPerTrigger is ignored by batch reads")
        return cls(
            groups=groups,
            starting=starting,
            ending=ending,
            max_entries_per_trigger=max_trigger,
            fail_on_data_loss=get_bool(options, "failOnDataLoss", True),
            entries_per_partition=get_int(options, "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION) or 1,
            timeout=get_float(options, "timeoutSeconds", DEFAULT_TIMEOUT_S),
            client=ClientOptions.from_options(options),
            brokers=brokers is not None,
        )

    def spec(self, group: str, start: int, end: int) -> RangeReadSpec:
        return RangeReadSpec(group, self.groups[group], start, end, self.fail_on_data_loss, self.timeout,
                             self.client, self.brokers)


class Bounds:
    """Each log's (begin index, readable end index) from its leader (a Raft group: committed
    index + 1) or master (a broker set: the last confirmed record + 1); one client per log,
    kept until `close`."""

    def __init__(self, cfg: ReadConfig) -> None:
        self.cfg = cfg
        self._clients: dict[str, DLedgerClient | BrokerClient] = {}

    def __call__(self, name: str) -> tuple[int, int]:
        cfg, c = self.cfg, self._clients.get(name)
        if cfg.brokers:
            if c is None:
                c = self._clients[name] = cfg.client.broker_client(cfg.groups[name], name)
            assert isinstance(c, BrokerClient)
            return broker_bounds(c, name, cfg.timeout)
        if c is None:
            c = self._clients[name] = cfg.client.client(cfg.groups[name], name)
        assert isinstance(c, DLedgerClient)
        m = wait_leader_view(c, name, cfg.timeout)
        return m.ledger_begin_index, m.committed_index + 1

    def close(self) -> None:
        for c in self._clients.values():
            try:
                c.close()
            except Exception:  # closing is best effort when the query ends
                log.debug("closing a client failed", exc_info=True)
        self._clients.clear()


@dataclass
class RangePartition(InputPartition):
    """Entries of one group with index in [start, end); everything a task needs."""

    group: str
    peers: str
    start: int
    end: int
    fail_on_data_loss: bool
    timeout: float
    client: ClientOptions
    broker: bool = False

    def spec(self) -> RangeReadSpec:
        return RangeReadSpec(self.group, self.peers, self.start, self.end, self.fail_on_data_loss, self.timeout,
                             self.client, self.broker)


def _partitions(cfg: ReadConfig, group: str, start: int, end: int) -> list[RangePartition]:
    return [
        RangePartition(r.group, cfg.groups[group], r.start, r.end, cfg.fail_on_data_loss, cfg.timeout,
                       cfg.client, cfg.brokers)
        for r in split_range(group, start, end, cfg.entries_per_partition)
    ]


def _read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    # Spark substitutes a placeholder partition when a plan has none
    if isinstance(partition, RangePartition):
        spec = partition.spec()
        yield from (read_broker_range(spec) if spec.broker else read_range(spec))


class DLedgerBatchReader(DataSourceReader):
    """Plans on the driver from each group's leader view; tasks read the ranges."""

    def __init__(self, cfg: ReadConfig) -> None:
        self.cfg = cfg

    def partitions(self) -> list[InputPartition]:
        out: list[InputPartition] = []
        bounds = Bounds(self.cfg)
        try:
            for group in self.cfg.groups:
                out.extend(self._plan(group, *bounds(group)))
        finally:
            bounds.close()
        return out

    def _plan(self, group: str, begin: int, end: int) -> list[RangePartition]:
        start = resolve(self.cfg.starting[group], begin, end)
        stop = resolve(self.cfg.ending[group], begin, end)
        if stop > end:
            log.warning("group %s: endingIndex %d is beyond the committed entries; reading up to %d",
                        group, stop, end)
            stop = end
        if start < begin:
            msg = (f"group {group}: startingIndex {start} is below the log begin {begin} "
                   "(older entries were deleted)")
            if self.cfg.fail_on_data_loss:
                raise DataLossError(msg + "; set failOnDataLoss=false to start at the log begin")
            log.warning("%s; starting at %d", msg, begin)
            start = begin
        if start > stop:
            raise OptionError(f"group {group}: startingIndex {start} is after endingIndex {stop}")
        log.info("%s: batch read of [%d, %d)", group, start, stop)
        return _partitions(self.cfg, group, start, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)


class DLedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets: {"<group>": <next index>}.

    One instance lives on the driver for the whole query (it keeps one client per
    group); copies are pickled to the executors, without the clients.
    """

    def __init__(self, cfg: ReadConfig) -> None:
        self.cfg = cfg
        self._bounds: Bounds | None = None
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: never read past this
        self._latest: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_bounds"] = None
        return state

    def _view(self, group: str) -> tuple[int, int]:
        """(begin, readable end) of a log."""
        if self._bounds is None:
            self._bounds = Bounds(self.cfg)
        return self._bounds(group)

    def initialOffset(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for group in self.cfg.groups:
            out[group] = resolve(self.cfg.starting[group], *self._view(group))
        log.info("initial offsets %s", out)
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.cfg.max_entries_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {g: self._view(g)[1] for g in self.cfg.groups}
        log.info("Trigger.AvailableNow: reading up to %s", self._target)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        starts: dict[str, int] = {}
        available: dict[str, int] = {}
        latest: dict[str, int] = {}
        for group in self.cfg.groups:
            begin, end = self._view(group)
            readable = end
            if self._target is not None:
                end = min(end, self._target[group])
            latest[group] = end
            s = start.get(group)
            if s is None:  # a group added to the options after the query started
                log.warning("group %s is new to this query; reading it from its earliest entry %d", group, begin)
                s = begin
            if s < begin:
                msg = (f"group {group}: the query is at index {s} but the log now begins at {begin}; "
                       f"entries [{s}, {begin}) were deleted")
                if self.cfg.fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to skip them")
                log.warning("%s; skipping them", msg)
                s = begin
            if readable < s:
                msg = (f"group {group}: the query is at index {s} but the group has committed only up to "
                       f"{readable - 1} (was the log reset?)")
                if self.cfg.fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to wait for it")
                log.warning("%s; waiting", msg)
            starts[group] = s
            available[group] = max(0, end - s)
        for group in start:
            if group not in self.cfg.groups:
                log.warning("group %s is no longer in the options; it is dropped from the offsets", group)
        self._latest = latest
        if isinstance(limit, ReadMaxRows):
            take = allocate(available, limit.max_rows)
        else:
            if not isinstance(limit, ReadAllAvailable):
                log.info("read limit %r is not supported; reading all available entries", limit)
            take = available
        return {g: starts[g] + take[g] for g in self.cfg.groups}

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        out: list[InputPartition] = []
        for group in self.cfg.groups:
            e = end.get(group)
            if e is None:
                continue
            s = start.get(group, e)
            out.extend(_partitions(self.cfg, group, s, e))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)

    def commit(self, end: dict[str, int]) -> None:
        log.debug("committed offsets %s", end)

    def stop(self) -> None:
        if self._bounds is not None:
            self._bounds.close()
            self._bounds = None


# --- writes -------------------------------------------------------------------------------


@dataclass
class AppendCommitMessage(WriterCommitMessage):
    """What one task appended: `rows` entries, indexes first_index..last_index (-1 if none)."""

    rows: int
    first_index: int
    last_index: int


@dataclass(frozen=True, slots=True)
class WriteConfig:
    group: str
    peers: str  # a broker set's: its controllers
    batch_size: int
    client: ClientOptions
    broker: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: StructType) -> WriteConfig:
        brokers = parse_brokers(options)
        if brokers is not None and len(brokers) != 1:
            raise OptionError(f"a write goes to one broker set: `brokers` names {len(brokers)}")
        if get_str(options, "groups") is not None:
            raise OptionError("a write goes to one group: give `peers` and `group`, not `groups`")
        ((group, peers),) = (brokers or parse_groups(options)).items()
        body = _body_field(schema)
        if body is None:
            raise OptionError(f"writing to dledger needs a `body` column (binary or string); columns are "
                              f"{', '.join(schema.fieldNames())}")
        if not isinstance(schema[body].dataType, (BinaryType, StringType)):
            raise OptionError(f"column `body` must be binary or string, not {schema[body].dataType.simpleString()}")
        return cls(group, peers, get_batch_size(options, DEFAULT_BATCH_SIZE), ClientOptions.from_options(options),
                   brokers is not None)


def _body_field(schema: StructType) -> str | None:
    names = schema.fieldNames()
    if "body" in names:
        return "body"
    return next((n for n in names if n.lower() == "body"), None)


def _body_column(batch: pa.RecordBatch) -> pa.Array:
    names = batch.schema.names
    name = "body" if "body" in names else next(n for n in names if n.lower() == "body")
    return batch.column(name)


def append_batches(cfg: WriteConfig, batches: Iterator[pa.RecordBatch]) -> AppendCommitMessage:
    """Append every row's body, `batch_size` bodies (or 8 MiB) per request, in row order."""
    rows, first, last = 0, -1, -1
    pending: list[bytes] = []
    pending_bytes = 0
    client = cfg.client.broker_client(cfg.peers, cfg.group) if cfg.broker else cfg.client.client(cfg.peers, cfg.group)

    def flush() -> None:
        nonlocal rows, first, last, pending, pending_bytes
        if isinstance(client, BrokerClient):
            lo, hi = send_bodies(client, cfg.group, pending)
        else:
            try:
                results = client.append_batch(pending)
            except DLedgerError as e:
                raise RuntimeError(f"dledger: append of {len(pending)} entries to group {cfg.group} failed "
                                   f"({rows} rows of this task were appended before): {describe(e)}") from e
            lo, hi = results[0].index, results[-1].index
        if first < 0:
            first = lo
        last = hi
        rows += len(pending)
        pending, pending_bytes = [], 0

    try:
        for batch in batches:
            col = _body_column(batch)
            is_text = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
            for value in col.to_pylist():
                if value is None:
                    raise ValueError(f"dledger: a row has a null body (after {rows + len(pending)} rows); "
                                     "filter nulls out or give an empty body")
                body = value.encode() if is_text else bytes(value)
                pending.append(body)
                pending_bytes += len(body)
                if len(pending) >= cfg.batch_size or pending_bytes >= MAX_BATCH_BYTES:
                    flush()
        if pending:
            flush()
    finally:
        client.close()
    return AppendCommitMessage(rows, first, last)


class DLedgerWriter(DataSourceArrowWriter):
    def __init__(self, cfg: WriteConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AppendCommitMessage:
        return append_batches(self.cfg, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        n = sum(m.rows for m in messages if isinstance(m, AppendCommitMessage))
        log.info("group %s: appended %d entries", self.cfg.group, n)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        n = sum(m.rows for m in messages if isinstance(m, AppendCommitMessage))
        log.warning("group %s: write aborted; %d entries appended by finished tasks stay in the log "
                    "(at-least-once)", self.cfg.group, n)


class DLedgerStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, cfg: WriteConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AppendCommitMessage:
        return append_batches(self.cfg, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        n = sum(m.rows for m in messages if isinstance(m, AppendCommitMessage))
        log.info("group %s: micro-batch %d appended %d entries", self.cfg.group, batchId, n)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        n = sum(m.rows for m in messages if isinstance(m, AppendCommitMessage))
        log.warning("group %s: micro-batch %d aborted; %d entries already appended stay in the log and will be "
                    "appended again when the batch is retried (at-least-once)", self.cfg.group, batchId, n)


class DLedgerDataSource(DataSource):
    """`spark.read/readStream/write/writeStream.format("dledger")`."""

    @classmethod
    def name(cls) -> str:
        return "dledger"

    def schema(self) -> str:
        """Called at load(): option names and values are checked here, so a stream's bad
        option fails before start()."""
        check_names(self.options, READ_OPTIONS | WRITE_OPTIONS, "dledger")
        if not (set(map(str.lower, self.options)) & {k.lower() for k in WRITE_OPTIONS - READ_OPTIONS}):
            ReadConfig.from_options(self.options, streaming=get_str(self.options, "endingIndex") is None)
        return ENTRY_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        check_names(self.options, READ_OPTIONS, "dledger")
        return DLedgerBatchReader(ReadConfig.from_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_names(self.options, READ_OPTIONS, "dledger")
        return DLedgerStreamReader(ReadConfig.from_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DLedgerWriter:
        check_names(self.options, WRITE_OPTIONS, "dledger")
        if overwrite:
            raise OptionError("a dledger log is append-only: use mode('append'), not overwrite")
        return DLedgerWriter(WriteConfig.from_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DLedgerStreamWriter:
        check_names(self.options, WRITE_OPTIONS, "dledger")
        return DLedgerStreamWriter(WriteConfig.from_options(self.options, schema))
