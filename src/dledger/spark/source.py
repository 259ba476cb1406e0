"""`format("dledger")`: batch and streaming reads of committed entries, and writes (docs/spark.md).

Reads follow Kafka's source: offsets are next indexes per group
(`{"<group>": <next index>}`), ranges are end-exclusive, and a micro-batch's
partitions depend only on its (start, end) offsets, so a batch replayed after
a failure reads the same rows. The end of what may be read is the leader's
committed index + 1: uncommitted entries are never seen.

Broker sets (options `controller` and `brokers`) read the same way: the "group" is the
broker set, `term` its master epoch, `pos` the record's offset, and the end is the last
record within the master's confirm offset. Writes to a broker set go through BrokerClient.

Writes (spark.sink) append the `body` column, each task as an idempotent producer: a
retried task or micro-batch appends each row once.

Batch reads take filters on `index`, `term` and `group` (spark.pushdown): an index bound
narrows the planned ranges like startingIndex/endingIndex, a group filter drops groups. A
declared schema may name any of the columns, in any order; without `body` the members send
no bodies (PySpark has no column pruning hook for Python sources: the declared schema is it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from dledger.broker.client import BrokerClient
from dledger.runtime.client import DLedgerClient
from dledger.spark.broker_online import broker_bounds, read_broker_range
from dledger.spark.isolation import (
    ISOLATION_LEVELS,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ControlCursor,
    Visibility,
    controls,
    drop_hidden,
    visibility,
)
from dledger.spark.online import DataLossError, RangeReadSpec, first_data_index, read_range, wait_leader_view
from dledger.spark.options import (
    DEFAULT_ENTRIES_PER_PARTITION,
    DEFAULT_MAX_TRIGGER_DELAY_S,
    DEFAULT_TIMEOUT_S,
    EARLIEST,
    LATEST,
    READ_OPTIONS,
    WRITE_OPTIONS,
    ClientOptions,
    OptionError,
    allocate,
    check_names,
    get_bool,
    get_duration,
    get_float,
    get_int,
    get_str,
    hold_back,
    parse_brokers,
    parse_groups,
    parse_index_spec,
    resolve,
    split_range,
)
from dledger.spark.pushdown import Pushed, push
from dledger.spark.schema import (
    ARROW_ENTRY_SCHEMA,
    ENTRY_SCHEMA,
    TIMESTAMP_COLUMN,
    TIMESTAMP_FIELD,
    constant_timestamps,
    declared_columns,
)
from dledger.spark.sink import DLedgerStreamWriter, DLedgerWriter, WriteConfig

log = logging.getLogger(__name__)

# The key of a stream offset that holds when its micro-batch was planned (ms since the epoch):
# the timestamp column's value, kept in the checkpoint's offset log so a replayed micro-batch
# gets the same one. Present only when the query reads that column; no group name has an "@".
PLANNED_AT = "@plannedAtMs"


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
    min_partitions: int = 0  # at least this many tasks per group's range (Kafka's minPartitions)
    min_entries_per_trigger: int | None = None  # Kafka's minOffsetsPerTrigger
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY_S  # seconds; Kafka's maxTriggerDelay
    isolation: str = READ_UNCOMMITTED  # read_committed: transactions' rows once committed (spark.isolation)

    @classmethod
    def from_options(cls, options: Mapping[str, str], streaming: bool) -> ReadConfig:
        brokers = parse_brokers(options)
        groups = brokers or parse_groups(options)
        # Kafka's defaults: a batch reads everything, a new stream starts at the end
        starting = parse_index_spec(get_str(options, "startingIndex"), "startingIndex", groups,
                                    LATEST if streaming else EARLIEST)
        ending_raw = get_str(options, "endingIndex")
        if streaming and ending_raw is not None:
            # PySpark calls a source the same way at spark.read…load() and spark.readStream…load()
            # (checked with 4.3), so a stream learns this when it starts, before reading anything
            raise OptionError("option endingIndex is for batch reads only; a stream has no end: to read what is "
                              "committed when the query starts and stop, use .trigger(availableNow=True)")
        ending = parse_index_spec(ending_raw, "endingIndex", groups, LATEST)
        if not streaming:
            if any(v == LATEST for v in starting.values()):
                raise OptionError("option startingIndex: latest is not valid for a batch read (it would be empty)")
            if any(v == EARLIEST for v in ending.values()):
                raise OptionError("option endingIndex: earliest is not valid for a batch read")
        max_trigger = get_int(options, "maxEntriesPerTrigger", None)
        min_trigger = get_int(options, "minEntriesPerTrigger", None)
        if min_trigger is not None and max_trigger is not None and min_trigger > max_trigger:
            raise OptionError(f"option minEntriesPerTrigger ({min_trigger}) is above maxEntriesPerTrigger "
                              f"({max_trigger}): no micro-batch could satisfy both")
        delay = get_duration(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_S)
        if get_str(options, "maxTriggerDelay") is not None and min_trigger is None:
            raise OptionError("option maxTriggerDelay applies with minEntriesPerTrigger only (as Kafka's "
                              "maxTriggerDelay with minOffsetsPerTrigger)")
        if (max_trigger is not None or min_trigger is not None) and not streaming:
            log.info("maxEntriesPerTrigger and minEntriesPerTrigger are ignored by batch reads")
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
            min_partitions=get_int(options, "minPartitions", 0) or 0,
            min_entries_per_trigger=min_trigger,
            max_trigger_delay=delay,
            isolation=_isolation(options, brokers is not None),
        )

    @property
    def committed(self) -> bool:
        """isolation=read_committed."""
        return self.isolation == READ_COMMITTED

    def spec(self, group: str, start: int, end: int) -> RangeReadSpec:
        return RangeReadSpec(group, self.groups[group], start, end, self.fail_on_data_loss, self.timeout,
                             self.client, self.brokers)




@dataclass(frozen=True, slots=True)
class Columns:
    """The columns a read returns: those of its schema, the full one or a declared one naming
    any of ENTRY_SCHEMA's columns and the timestamp column (with their types) in any order."""

    names: tuple[str, ...]
    arrow: pa.Schema  # what Spark checks every batch against

    @classmethod
    def of(cls, schema: StructType | None) -> Columns:
        """Refuses unknown columns and wrong types, naming the valid columns. Spark shows a
        declared schema to the source only when it plans the read (the first action), not at
        load(), so that is where this fails."""
        if schema is None:
            return cls(tuple(ARROW_ENTRY_SCHEMA.names), ARROW_ENTRY_SCHEMA)
        from pyspark.sql.pandas.types import to_arrow_schema

        names = declared_columns(schema, f"{ENTRY_SCHEMA}, {TIMESTAMP_COLUMN}", 'format("dledger")')
        return cls(names, to_arrow_schema(schema, timezone="UTC"))

    @property
    def bodies(self) -> bool:
        return "body" in self.names

    @property
    def timestamp(self) -> bool:
        return TIMESTAMP_FIELD.name in self.names

    def project(self, batch: pa.RecordBatch, planned_ms: int = 0) -> pa.RecordBatch:
        """An entry batch (ARROW_ENTRY_SCHEMA) cut down to these columns, in their order; the
        timestamp column, when asked for, is `planned_ms` on every row."""
        if self.arrow.equals(batch.schema):
            return batch
        return pa.RecordBatch.from_arrays(
            [constant_timestamps(planned_ms, batch.num_rows) if n == TIMESTAMP_FIELD.name else batch.column(n)
             for n in self.names], schema=self.arrow)


COMMIT_CATCH_UP_S = 10.0  # how long a new leader's commit index may lag the query's position


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
        # the tasks planned from here on reach the group's members as the client knows them now
        # (it follows membership changes: docs/clients.md), not only those the options named
        known = c.peers_string()
        if known != cfg.groups[name]:
            log.info("group %s: members now %s (the options named %s)", name, known, cfg.groups[name])
            cfg.groups[name] = known
        return m.ledger_begin_index, m.committed_index + 1

    def first_data(self, name: str, start: int) -> int | None:
        """The first committed data entry's index at or after `start` in a Raft group (None:
        only NOOP and configuration entries so far); a broker set's records are all data."""
        c = self._clients.get(name)
        if self.cfg.brokers or not isinstance(c, DLedgerClient):
            return start
        return first_data_index(c, name, start, self.cfg.timeout, fail_on_data_loss=self.cfg.fail_on_data_loss)

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
    planned_ms: int = 0  # the timestamp column's value (ms since the epoch)
    hidden: tuple[tuple[int, int], ...] = ()  # control records, aborted transactions' entries (spark.isolation)

    def spec(self, bodies: bool = True) -> RangeReadSpec:
        return RangeReadSpec(self.group, self.peers, self.start, self.end, self.fail_on_data_loss, self.timeout,
                             self.client, self.broker, bodies)


def _partitions(cfg: ReadConfig, group: str, start: int, end: int, planned_ms: int = 0) -> list[RangePartition]:
    """Tasks of `entries_per_partition` indexes, smaller when `min_partitions` asks for more
    (a function of the range and the options only: a replayed micro-batch plans the same)."""
    per = cfg.entries_per_partition
    if cfg.min_partitions > 1 and end > start:
        per = max(1, min(per, -(-(end - start) // cfg.min_partitions)))
    return [
        RangePartition(r.group, cfg.groups[group], r.start, r.end, cfg.fail_on_data_loss, cfg.timeout,
                       cfg.client, cfg.brokers, planned_ms)
        for r in split_range(group, start, end, per)
    ]


def _isolation(options: Mapping[str, str], brokers: bool) -> str:
    level = (get_str(options, "isolation") or READ_UNCOMMITTED).lower()
    if level not in ISOLATION_LEVELS:
        raise OptionError(f"option isolation: {' or '.join(ISOLATION_LEVELS)}, not {level!r}")
    if brokers and level == READ_COMMITTED:
        raise OptionError("option isolation: broker sets have no transactions; read_committed is for Raft groups")
    return level


def _controls(cfg: ReadConfig, group: str, start: int, end: int,
              cursor: ControlCursor | None = None) -> tuple[tuple[int, int], ...]:
    """The control records of [start, end) (spark.isolation.controls), with a client of its own."""
    return controls(cfg.client.client(cfg.groups[group], group), start, end, cfg.timeout, cursor)


def _visible_partitions(cfg: ReadConfig, group: str, start: int, end: int, planned_ms: int = 0,
                        controls_of: Callable[[str, int, int], tuple[tuple[int, int], ...]] | None = None
                        ) -> list[RangePartition]:
    """_partitions, each task told which indexes of its range it must not show: control
    records (always, as Kafka's consumers never see them) and, under read_committed, aborted
    transactions' entries, the range cut at the last stable index."""
    if cfg.brokers or end <= start:  # broker sets have no transactions
        return _partitions(cfg, group, start, end, planned_ms)
    if not cfg.committed:
        hidden = controls_of(group, start, end) if controls_of is not None else _controls(cfg, group, start, end)
        return [replace(p, hidden=Visibility(end, hidden).within(p.start, p.end))
                for p in _partitions(cfg, group, start, end, planned_ms)]
    vis = visibility(cfg.client.client(cfg.groups[group], group), start, end, cfg.timeout)
    if vis.end < end:
        log.info("group %s: read_committed stops at %d (an open transaction), not %d", group, vis.end, end)
    return [replace(p, hidden=vis.within(p.start, p.end)) for p in _partitions(cfg, group, start, vis.end, planned_ms)]


def _read_partition(partition: InputPartition, columns: Columns, pushed: Pushed) -> Iterator[pa.RecordBatch]:
    # Spark substitutes a placeholder partition when a plan has none
    if isinstance(partition, RangePartition):
        spec = partition.spec(bodies=columns.bodies)  # a broker set sends bodies anyway
        for batch in read_broker_range(spec) if spec.broker else read_range(spec):
            batch = pushed.mask(drop_hidden(batch, partition.hidden))
            if batch.num_rows:
                yield columns.project(batch, partition.planned_ms)


class DLedgerBatchReader(DataSourceReader):
    """Plans on the driver from each group's leader view; tasks read the ranges."""

    def __init__(self, cfg: ReadConfig, columns: Columns | None = None) -> None:
        self.cfg = cfg
        self.columns = columns or Columns.of(None)
        self.pushed = Pushed()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Take what spark.pushdown applies exactly; Spark evaluates the rest after the scan.
        Called on the driver before partitions(), on this same object."""
        self.pushed, rest = push(filters, self.columns.names)
        log.info("pushed %s; left to Spark: %s", self.pushed, rest)
        return rest

    def partitions(self) -> list[InputPartition]:
        out: list[InputPartition] = []
        if self.pushed.empty:
            log.info("the filters rule out every row: nothing to read")
            return out
        wanted = self.pushed.groups
        bounds = Bounds(self.cfg)
        planned_ms = time.time_ns() // 1_000_000  # the timestamp column of a batch read
        try:
            for group in self.cfg.groups:
                if wanted is None or group in wanted:
                    out.extend(self._plan(group, *bounds(group), planned_ms))
        finally:
            bounds.close()
        return out

    def _plan(self, group: str, begin: int, end: int, planned_ms: int = 0) -> list[RangePartition]:
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
        start, stop = self.pushed.index_range(start, stop)
        log.info("%s: batch read of [%d, %d)", group, start, stop)
        return _visible_partitions(self.cfg, group, start, stop, planned_ms)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition, self.columns, self.pushed)


class DLedgerBatchReaderNoPushdown(DLedgerBatchReader):
    """For a session with `spark.sql.python.filterPushdown.enabled` false: PySpark refuses to
    plan a reader that overrides pushFilters there (DATA_SOURCE_PUSHDOWN_DISABLED); it tells by
    the method's function being DataSourceReader's own, so this puts that one back."""

    pushFilters = DataSourceReader.pushFilters


class DLedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets: {"<group>": <next index>}.

    One instance lives on the driver for the whole query (it keeps one client per
    group); copies are pickled to the executors, without the clients.
    """

    def __init__(self, cfg: ReadConfig, columns: Columns | None = None) -> None:
        self.cfg = cfg
        self.columns = columns or Columns.of(None)
        self._bounds: Bounds | None = None
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: never read past this
        self._latest: dict[str, int] | None = None
        # when the last micro-batch was planned (monotonic; this run's start before the first):
        # what maxTriggerDelay counts from
        self._last_batch = time.monotonic()
        self._control_cursors: dict[str, ControlCursor] = {}  # read_uncommitted: each group's control scan

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_bounds"] = None
        return state

    def _await_commit(self, group: str, at: int, readable: int) -> int:
        """The readable end once it reaches `at`, or as it is after COMMIT_CATCH_UP_S: a leader
        just elected knows the commit index only once an entry of its term commits (Raft
        §5.4.2), so for a moment it names one below what its predecessor had committed and
        this query read. A log that was really reset stays short."""
        deadline = time.monotonic() + min(COMMIT_CATCH_UP_S, self.cfg.timeout)
        while readable < at and time.monotonic() < deadline:
            time.sleep(0.1)
            readable = self._view(group)[1]
        return readable

    def _controls(self, group: str, start: int, end: int) -> tuple[tuple[int, int], ...]:
        """The control records of a micro-batch's range, the group's scan resumed where the
        last one ended."""
        return _controls(self.cfg, group, start, end, self._control_cursors.setdefault(group, ControlCursor()))

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
        """ReadMaxRows, or ReadMinRows when only a minimum is set (PySpark has no composite
        limit: with both, the minimum is applied from the options whenever Spark passes this
        default back; a ReadAllAvailable from Spark, e.g. Trigger.Once, overrides both)."""
        n, m = self.cfg.max_entries_per_trigger, self.cfg.min_entries_per_trigger
        if n:
            return ReadMaxRows(n)
        return ReadMinRows(m) if m else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {g: self._view(g)[1] for g in self.cfg.groups}
        log.info("Trigger.AvailableNow: reading up to %s", self._target)

    def _data_ahead(self, group: str, start: int, end: int) -> int:
        """The new indexes [start, end) of a log, or 0 when they hold no data: the NOOP a new
        leader appends (or a configuration entry) would else make an empty micro-batch. The
        offset stays exact: it stays at `start` until data follows, and the micro-batch that
        then reads [start, ...) skips those entries."""
        if end <= start or self._bounds is None:
            return max(0, end - start)
        first = self._bounds.first_data(group, start)
        if first is None or first >= end:
            log.debug("group %s: [%d, %d) holds no data; no new offset", group, start, end)
            return 0
        return end - start

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        starts: dict[str, int] = {}
        available: dict[str, int] = {}
        latest: dict[str, int] = {}
        for group in self.cfg.groups:
            begin, end = self._view(group)
            readable = end
            if self._target is not None:
                end = min(end, self._target[group])
            latest[group] = readable
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
                readable = latest[group] = self._await_commit(group, s, readable)
                end = readable if self._target is None else min(readable, self._target[group])
            if readable < s:
                msg = (f"group {group}: the query is at index {s} but the group has committed only up to "
                       f"{readable - 1} (was the log reset?)")
                if self.cfg.fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to wait for it")
                log.warning("%s; waiting", msg)
            starts[group] = s
            if self.cfg.committed and end > s:  # not past an open transaction
                end = visibility(self.cfg.client.client(self.cfg.groups[group], group), s, end, self.cfg.timeout).end
            available[group] = self._data_ahead(group, s, end)
        for group in start:
            if group not in self.cfg.groups and group != PLANNED_AT:
                log.warning("group %s is no longer in the options; it is dropped from the offsets", group)
        self._latest = latest
        if isinstance(limit, ReadMaxRows):
            take = allocate(available, limit.max_rows)
        else:
            if not isinstance(limit, (ReadAllAvailable, ReadMinRows)):
                log.info("read limit %r is not supported; reading all available entries", limit)
            take = available
        out: dict[str, int] = {g: starts[g] + take[g] for g in self.cfg.groups}
        new = sum(take.values())
        # the options' minimum holds where Spark passed our default limit back (not a
        # ReadAllAvailable of its own), and never under Trigger.AvailableNow, which must end
        minimum = self.cfg.min_entries_per_trigger if isinstance(limit, (ReadMaxRows, ReadMinRows)) else None
        if isinstance(limit, ReadMinRows):
            minimum = limit.min_rows
        if self._target is not None:
            minimum = None
        now = time.monotonic()
        if hold_back(new, minimum, now - self._last_batch, self.cfg.max_trigger_delay):
            log.debug("%d new entries, fewer than minEntriesPerTrigger %s: waiting", new, minimum)
            return dict(start)  # the same offset: Spark plans no micro-batch
        if new and minimum is not None and new < minimum:
            log.info("maxTriggerDelay passed: a micro-batch of %d entries (minEntriesPerTrigger %d)", new, minimum)
        if self.columns.timestamp:
            if new:
                out[PLANNED_AT] = time.time_ns() // 1_000_000
            elif PLANNED_AT in start:
                out[PLANNED_AT] = start[PLANNED_AT]  # nothing new: an unchanged offset, no empty batch
        if new:
            self._last_batch = now
        return out

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Each log's readable end (next index) at the last latestOffset: Spark shows it as
        the source's `latestOffset` in StreamingQueryProgress, next to `endOffset`, so the entries
        behind latest are their difference (spark.lag; PySpark has no hook for a
        source's own metrics, Kafka's `metrics` map)."""
        return self._latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        out: list[InputPartition] = []
        for group in self.cfg.groups:
            e = end.get(group)
            if e is None:
                continue
            s = start.get(group, e)
            # a checkpoint written without the column has no time: this planning's then
            planned = end.get(PLANNED_AT) or time.time_ns() // 1_000_000
            out.extend(_visible_partitions(self.cfg, group, s, e, planned, self._controls))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition, self.columns, Pushed())  # PySpark pushes no filter into a stream

    def commit(self, end: dict[str, int]) -> None:
        log.debug("committed offsets %s", end)

    def stop(self) -> None:
        if self._bounds is not None:
            self._bounds.close()
            self._bounds = None


# --- writes -------------------------------------------------------------------------------


def _check_options(options: Mapping[str, str], applies: frozenset[str], what: str) -> None:
    """Unknown names fail; names of the other direction pass (a temporary view's options serve
    its reads and its INSERTs alike) and are said to be ignored."""
    both = READ_OPTIONS | WRITE_OPTIONS
    check_names(options, both, "dledger")
    other = {n.lower() for n in both - applies}
    ignored = sorted(k for k in options if k.lower() in other)
    if ignored:
        log.info("format 'dledger': %s ignores option(s) %s (they are for the other direction)", what,
                 ", ".join(ignored))


class DLedgerDataSource(DataSource):
    """`spark.read/readStream/write/writeStream.format("dledger")`."""

    # False in the subclass register() puts in place of this one where the session turned
    # Python filter pushdown off: batch reads then plan without pushFilters
    pushdown: ClassVar[bool] = True

    @classmethod
    def name(cls) -> str:
        return "dledger"

    def schema(self) -> str:
        """Called at load(): option names and values are checked here, so a stream's bad
        option fails before start()."""
        check_names(self.options, READ_OPTIONS | WRITE_OPTIONS, "dledger")
        if not (set(map(str.lower, self.options)) & {k.lower() for k in WRITE_OPTIONS - READ_OPTIONS}):
            ReadConfig.from_options(self.options, streaming=get_str(self.options, "endingIndex") is None)
        return f"{ENTRY_SCHEMA}, {TIMESTAMP_COLUMN}" if get_bool(self.options, "includeTimestamp", False) \
            else ENTRY_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_options(self.options, READ_OPTIONS, "a read")
        cls = DLedgerBatchReader if self.pushdown else DLedgerBatchReaderNoPushdown
        return cls(ReadConfig.from_options(self.options, streaming=False), Columns.of(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_options(self.options, READ_OPTIONS, "a stream")
        return DLedgerStreamReader(ReadConfig.from_options(self.options, streaming=True), Columns.of(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DLedgerWriter:
        _check_options(self.options, WRITE_OPTIONS, "a write")
        if overwrite:
            raise OptionError("a dledger log is append-only: use mode('append'), not overwrite")
        return DLedgerWriter(WriteConfig.from_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DLedgerStreamWriter:
        _check_options(self.options, WRITE_OPTIONS, "a streaming write")
        return DLedgerStreamWriter(WriteConfig.from_options(self.options, schema))
