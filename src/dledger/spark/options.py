"""Option parsing and offset arithmetic for the Spark sources (docs/spark.md).

Pure Python, no Spark import: every rule about what an option means lives here
so that it can be tested without a JVM and reads the same for batch and
streaming. Option names are matched case-insensitively by Spark already.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from dledger.broker.client import BrokerClient
from dledger.config import ConfigError, parse_peers
from dledger.core.messages import MAX_APPEND_BODIES
from dledger.runtime.client import DLedgerClient
from dledger.security.tls import TlsConfig

log = logging.getLogger(__name__)

# Kafka's conventions inside a JSON offset spec: -2 earliest, -1 latest.
EARLIEST = -2
LATEST = -1

# measured (docs/performance.md, "Spark connectors"): benchmarks/spark_sweep.py
DEFAULT_ENTRIES_PER_PARTITION = 100_000
DEFAULT_BATCH_SIZE = 5_000
DEFAULT_TIMEOUT_S = 120.0  # per request (spark.retry): an election, a restart, a stall of a minute
DEFAULT_CLIENT_TIMEOUT_S = 5.0


class OptionError(ValueError):
    """A bad option value; the message names the option."""


_CONNECTION = frozenset({"peers", "group", "groups", "controller", "brokers", "clientTimeoutSeconds", "tlsCa",
                         "tlsCert", "tlsKey", "tlsDir", "authToken"})
READ_OPTIONS = _CONNECTION | {"startingIndex", "endingIndex", "maxEntriesPerTrigger", "minEntriesPerTrigger",
                              "maxTriggerDelay", "failOnDataLoss", "entriesPerPartition", "minPartitions",
                              "timeoutSeconds", "includeTimestamp", "isolation"}
WRITE_OPTIONS = _CONNECTION | {"batchSize", "idempotent", "writeId", "writeTimeoutSeconds", "transactional",
                               "transactionTimeoutSeconds"}
FILES_OPTIONS = frozenset({"path", "includeUncommitted", "group", "mode", "member", "bytesPerPartition",
                           "verifyBodies"})
# what Spark itself may hand a source or sink along with the user's options
_SPARK_OWN = frozenset({"path", "paths", "checkpointLocation", "queryName"})

# Every option of Spark's Kafka source and sink (spark-sql-kafka, "Structured Streaming + Kafka
# Integration Guide") that users bring over, with ours or why it does not apply. "=" starts
# an option of ours ("did you mean"), anything else is a reason.
_NO_TIMESTAMP = "entries carry no timestamp (docs/format.md): give startingIndex/endingIndex as indexes"
_KAFKA: dict[str, str] = {
    "startingOffsets": "=startingIndex", "endingOffsets": "=endingIndex",
    "maxOffsetsPerTrigger": "=maxEntriesPerTrigger", "minOffsetsPerTrigger": "=minEntriesPerTrigger",
    "subscribe": "=group (or groups)", "topic": "=group", "assign": "=groups (a group has one log, no partitions)",
    "subscribePattern": "groups are named, not matched: list them in groups (JSON {\"group\": \"peers\", ...})",
    "startingOffsetsByTimestamp": _NO_TIMESTAMP, "endingOffsetsByTimestamp": _NO_TIMESTAMP,
    "startingTimestamp": _NO_TIMESTAMP, "endingTimestamp": _NO_TIMESTAMP,
    "startingOffsetsByTimestampStrategy": _NO_TIMESTAMP,
    "offset": "=startingIndex",
    "includeHeaders": "entries have a body only, no key and no headers: carry them inside the body (e.g. "
                      "to_json(struct(...)) as body, read back with from_json); option includeTimestamp "
                      "adds a timestamp column",
    "groupIdPrefix": "no consumer group: a query's position lives in its checkpoint (as with Kafka's source)",
    "kafka.group.id": "no consumer group: a query's position lives in its checkpoint (as with Kafka's source)",
    "kafka.bootstrap.servers": "=peers (or controller and brokers for broker sets)",
    "kafka.isolation.level": "=isolation", "isolation.level": "=isolation",
    "kafka.security.protocol": "=tlsDir (or tlsCa, tlsCert, tlsKey; authToken for a group run with tokens)",
    "kafkaConsumer.pollTimeoutMs": "=clientTimeoutSeconds", "fetchOffset.numRetries": "=timeoutSeconds",
    "fetchOffset.retryIntervalMs": "=timeoutSeconds", "maxRecordsPerPartition": "=entriesPerPartition",
    "key": "entries have a body only, no key: put it in the body", "value": "=body (a column, not an option)",
}
# Kafka's pass-through prefixes: client settings of Kafka's own, which a dledger client does not have
_KAFKA_PREFIXES = {
    "kafka.ssl.": "=tlsDir (or tlsCa, tlsCert, tlsKey)",
    "kafka.sasl.": "=authToken",
    "kafka.": "a Kafka client setting: dledger's client takes clientTimeoutSeconds, timeoutSeconds, tlsDir "
              "(or tlsCa, tlsCert, tlsKey) and authToken",
}


def kafka_hint(name: str) -> str | None:
    """What to use instead of Kafka's option `name`, or why it does not apply (None: not Kafka's)."""
    low = name.lower()
    said = next((v for k, v in _KAFKA.items() if k.lower() == low), None)
    if said is None:
        said = next((v for k, v in _KAFKA_PREFIXES.items() if low.startswith(k)), None)
    if said is None:
        return None
    return f"did you mean {said[1:]}?" if said.startswith("=") else f"Kafka's option does not apply: {said}"


def catalog_hint(fmt: str) -> str:
    """Why a catalog table of ours cannot work, and what does (checked with PySpark 4.3)."""
    return (f"PySpark hands a Python data source no options when a catalog table is read (CREATE TABLE … "
            f"USING {fmt} and saveAsTable keep them in the catalog, out of reach): use a temporary view, "
            f"CREATE TEMPORARY VIEW v USING {fmt} OPTIONS (...) (reads and INSERT INTO v work), or "
            f"spark.read.format({fmt!r})….load().createOrReplaceTempView('v'), and df.write….save()")


def no_options(options: Mapping[str, str]) -> bool:
    """Nothing but Spark's own keys: what a read of a catalog table hands the source."""
    return all(k.lower() in _SPARK_OWN or k.lower().startswith("spark.") for k in options)


def check_names(options: Mapping[str, str], known: frozenset[str], fmt: str) -> None:
    """Refuse option names the format does not know (Spark would silently ignore them: a
    Kafka name like startingOffsets then reads from the default position), and a catalog
    table being created (Spark then adds `provider`, `owner` and `option.*` keys)."""
    keys = {k.lower() for k in options}
    if {"provider", "owner"} <= keys and any(k.startswith("option.") for k in keys):
        raise OptionError(f"CREATE TABLE … USING {fmt} is not supported: {catalog_hint(fmt)}")
    lowered = {k.lower(): k for k in known | _SPARK_OWN}
    unknown = sorted(k for k in options if k.lower() not in lowered and not k.lower().startswith("spark."))
    if not unknown:
        return
    # Kafka's names are answered by the network format only (the files format has none of ours)
    hints = {k: kafka_hint(k) if "peers" in known else None for k in unknown}
    said = "; ".join(f"{k!r}" + (f" ({hints[k]})" if hints[k] else "") for k in unknown)
    raise OptionError(f"format {fmt!r}: unknown option(s) {said}; valid options are {', '.join(sorted(known))}")


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands us a case-insensitive dict; plain dicts in tests may differ in case
    if name in options:
        return options[name]
    lowered = name.lower()
    for k, v in options.items():
        if k.lower() == lowered:
            return v
    return None


def get_int(options: Mapping[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name}: must be at least {minimum}, got {value}")
    return value


def get_float(options: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"option {name}: expected a number, got {raw!r}") from None
    # float() takes "nan" and "inf": a nan timeout passes every comparison, an infinite one
    # waits for ever on a dead member
    if not math.isfinite(value):
        raise OptionError(f"option {name}: must be a finite number, got {raw!r}")
    if value <= 0:
        raise OptionError(f"option {name}: must be positive, got {value}")
    return value


_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's maxTriggerDelay default, 15m


def get_duration(options: Mapping[str, str], name: str, default: float) -> float:
    """Seconds from a Spark time string as Kafka's maxTriggerDelay takes it: `15m`, `30s`,
    `500ms`, `1h`, `2d`; a bare number is milliseconds (Spark's timeStringAsMs)."""
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = text[len(number):].strip() or "ms"
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise OptionError(f"option {name}: expected a duration such as 15m, 30s or 500ms, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise OptionError(f"option {name}: must be a finite duration >= 0, got {raw!r}")
    return value


def get_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: expected true or false, got {raw!r}")


def get_str(options: Mapping[str, str], name: str) -> str | None:
    raw = _get(options, name)
    return raw if raw else None


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How a task reaches a group: timeout and, for a group run with TLS or a token, the
    credentials (file paths, so they travel to executors as text; the files must be there)."""

    timeout: float = DEFAULT_CLIENT_TIMEOUT_S
    tls: TlsConfig | None = None
    auth_token: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ClientOptions:
        paths = {name: get_str(options, name) for name in ("tlsCa", "tlsCert", "tlsKey")}
        given = [n for n, v in paths.items() if v]
        if given and len(given) != 3:
            raise OptionError("options tlsCa, tlsCert and tlsKey go together: give all three or none")
        tls = TlsConfig(paths["tlsCa"] or "", paths["tlsCert"] or "", paths["tlsKey"] or "") if given else None
        tls_dir = get_str(options, "tlsDir")
        if tls_dir and given:
            raise OptionError("option tlsDir or options tlsCa/tlsCert/tlsKey, not both")
        if tls_dir:  # a `dledger certs` directory: its CA and client certificate
            tls = TlsConfig.from_dir(tls_dir)
        return cls(get_float(options, "clientTimeoutSeconds", DEFAULT_CLIENT_TIMEOUT_S), tls,
                   get_str(options, "authToken"))

    def client(self, peers: str, group: str, producer: tuple[str, int] | None = None) -> DLedgerClient:
        """A client; with `producer` (id, epoch), an idempotent producer."""
        try:
            return DLedgerClient(peers, group, self.timeout, tls=self.tls, auth_token=self.auth_token,
                                 idempotent=producer is not None, producer_id=producer[0] if producer else None,
                                 producer_epoch=producer[1] if producer else 0)
        except ConfigError as e:  # a TLS file that is missing or bad on this machine
            raise OptionError(f"options tlsCa/tlsCert/tlsKey: {e.message}") from None

    def broker_client(self, controller: str, broker: str) -> BrokerClient:
        """A broker set's client (brokers take TLS, not a token)."""
        if self.auth_token:
            raise OptionError("option authToken: broker sets take TLS (tlsCa/tlsCert/tlsKey), not a token")
        try:
            return BrokerClient(controller, broker, self.timeout, tls=self.tls)
        except ConfigError as e:
            raise OptionError(f"options tlsCa/tlsCert/tlsKey: {e.message}") from None


def get_batch_size(options: Mapping[str, str], default: int) -> int:
    """Bodies per APPEND: at most what a member accepts in one request."""
    size = get_int(options, "batchSize", default) or default
    if size > MAX_APPEND_BODIES:
        raise OptionError(f"option batchSize: at most {MAX_APPEND_BODIES} bodies per request, got {size}")
    return size


def parse_groups(options: Mapping[str, str]) -> dict[str, str]:
    """{group: peers string} from `groups` (JSON) or from `peers` + `group`."""
    groups_raw = get_str(options, "groups")
    peers = get_str(options, "peers")
    if groups_raw is not None:
        if peers is not None or get_str(options, "group") is not None:
            raise OptionError("give either `groups` or `peers`/`group`, not both")
        try:
            data = json.loads(groups_raw)
        except ValueError as e:
            raise OptionError(f"option groups: not JSON ({e}); expected {{\"group\": \"peers\", ...}}") from None
        if not isinstance(data, dict) or not data:
            raise OptionError('option groups: expected a non-empty JSON object {"group": "peers string", ...}')
        out: dict[str, str] = {}
        for g, p in data.items():
            if not isinstance(p, str):
                raise OptionError(f"option groups: peers of group {g!r} must be a string")
            out[str(g)] = p
    else:
        if peers is None:
            missing = ("option peers is missing: format 'dledger' needs the group's members, e.g. "
                       ".option('peers', 'n0-127.0.0.1:20911;n1-127.0.0.1:20912') (or groups for several groups, "
                       "or controller and brokers for broker sets)")
            if no_options(options):  # also what a catalog table's read hands the source: say so last
                missing += "; no option reached it at all (a catalog table? docs/spark.md, 'Catalog tables')"
            raise OptionError(missing)
        out = {get_str(options, "group") or "default": peers}
    for g, p in out.items():
        try:
            parse_peers(p)
        except ConfigError as e:
            raise OptionError(f"peers of group {g!r}: {e.message}") from None
    return out


def parse_brokers(options: Mapping[str, str]) -> dict[str, str] | None:
    """{broker set: controllers} from `controller` + `brokers` (names, comma-separated or a
    JSON list); None when the options name Raft groups instead."""
    controller, names = get_str(options, "controller"), get_str(options, "brokers")
    if controller is None and names is None:
        return None
    if controller is None or names is None:
        raise OptionError("broker sets are read and written with both `controller` and `brokers`")
    if get_str(options, "peers") is not None or get_str(options, "groups") is not None:
        raise OptionError("give either `controller`/`brokers` (broker sets) or `peers`/`groups` (Raft groups)")
    if names.lstrip().startswith("["):
        try:
            listed = json.loads(names)
        except json.JSONDecodeError as e:
            raise OptionError(f"option brokers: not JSON ({e}); expected [\"b0\", ...] or b0,b1") from None
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise OptionError('option brokers: expected a JSON list of names ["b0", ...]')
    else:
        listed = names.split(",")
    out = {n.strip(): controller for n in listed if n.strip()}
    if not out:
        raise OptionError("option brokers: no broker set named")
    return out


def parse_index_spec(raw: str | None, name: str, groups: Mapping[str, str], default: int) -> dict[str, int]:
    """`earliest` | `latest` | JSON {"group": index} into {group: index or EARLIEST/LATEST}.

    Groups missing from a JSON spec get `default`; unknown group names are an
    error (a typo would otherwise silently read from the default position).
    """
    if raw is None or raw.strip() == "":
        return dict.fromkeys(groups, default)
    text = raw.strip()
    if text.lower() == "earliest":
        return dict.fromkeys(groups, EARLIEST)
    if text.lower() == "latest":
        return dict.fromkeys(groups, LATEST)
    try:
        data = json.loads(text)
    except ValueError:
        raise OptionError(f'option {name}: expected earliest, latest or JSON {{"group": index}}, got {raw!r}') from None
    if not isinstance(data, dict):
        raise OptionError(f'option {name}: expected a JSON object {{"group": index}}, got {raw!r}')
    unknown = sorted(set(data) - set(groups))
    if unknown:
        raise OptionError(f"option {name}: unknown group(s) {', '.join(unknown)}; groups are {', '.join(groups)}")
    out = dict.fromkeys(groups, default)
    for g, v in data.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < EARLIEST:
            raise OptionError(f"option {name}: index of group {g!r} must be an integer >= 0 "
                              f"(or -2 earliest, -1 latest), got {v!r}")
        out[g] = v
    return out


def resolve(spec: int, begin: int, end: int) -> int:
    """A concrete next index: EARLIEST -> begin, LATEST -> end (committed + 1)."""
    if spec == EARLIEST:
        return begin
    if spec == LATEST:
        return end
    return spec


@dataclass(frozen=True, slots=True)
class IndexRange:
    """Entries of `group` with index in [start, end) (end exclusive, like Kafka's offsets)."""

    group: str
    start: int
    end: int


def split_range(group: str, start: int, end: int, per_partition: int) -> list[IndexRange]:
    """Split [start, end) at multiples of `per_partition`: the same range always gives
    the same partitions, so a replayed micro-batch reads the same rows in the same tasks."""
    out: list[IndexRange] = []
    s = start
    while s < end:
        e = min(end, (s // per_partition + 1) * per_partition)
        out.append(IndexRange(group, s, e))
        s = e
    return out


def hold_back(new_entries: int, minimum: int | None, waited: float, max_delay: float) -> bool:
    """Whether to skip this trigger (Kafka's minOffsetsPerTrigger with maxTriggerDelay): fewer
    than `minimum` new indexes are available and the last micro-batch was less than `max_delay`
    seconds ago (`waited`). With nothing new there is no micro-batch anyway."""
    return minimum is not None and 0 < new_entries < minimum and waited < max_delay


def allocate(available: Mapping[str, int], limit: int) -> dict[str, int]:
    """Share `limit` indexes among groups in proportion to their backlog (as Kafka's
    maxOffsetsPerTrigger does among partitions); deterministic, never above the backlog,
    and the whole limit is used when the backlog exceeds it."""
    total = sum(max(0, a) for a in available.values())
    if total <= limit:
        return {g: max(0, a) for g, a in available.items()}
    shares = {g: max(0, a) * limit // total for g, a in available.items()}
    left = limit - sum(shares.values())
    for g in sorted(available, key=lambda g: (-(available[g] - shares[g]), g)):
        if left <= 0:
            break
        if shares[g] < available[g]:
            shares[g] += 1
            left -= 1
    return shares
