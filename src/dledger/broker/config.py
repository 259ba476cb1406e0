"""A broker's settings: the `dledger broker` options and the same keys in TOML (`[broker]` table
or top level). Defaults aim at a 2 s failover (upstream's add up to 15 s; docs/brokers.md, "Failover").

A broker's advertised address carries both its ports, `host:port|host:haport`, so the
master's HA address travels in the controller's metadata (upstream took it from NameServer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.address import AddressError, parse_address
from dledger.broker.ha_master import HAConfig
from dledger.broker.ha_service import AckSettings
from dledger.config import ConfigError, read_toml
from dledger.config_aliases import BROKER_ALIASES, FLUSH_DISK_TYPES, resolve
from dledger.controller.messages import HA_SEPARATOR
from dledger.security.tls import TlsConfig
from dledger.store.retention import EXPIRE_AT_ANY_USAGE

# upstream's diskSpaceWarningLevelRatio: above it, with nothing more retention may delete (a
# replica still needs the files), the master refuses sends (DISK_FULL) until there is room
DISK_FULL_RATIO = 0.90


def broker_address(listen: str, ha_listen: str) -> str:
    return f"{listen}{HA_SEPARATOR}{ha_listen}"


def split_address(address: str) -> tuple[str, str]:
    """(client address, HA address) of an advertised broker address (a bare one: no HA)."""
    client, _, ha = address.partition(HA_SEPARATOR)
    return client, ha


def check_host_port(what: str, value: str) -> str:
    """`value` if it is an address (`host:port`, `[v6]:port`), else a ConfigError saying why."""
    try:
        parse_address(value, what)
    except AddressError as e:
        raise ConfigError(str(e)) from None
    return value


@dataclass
class BrokerConfig:
    cluster: str
    name: str
    controller: str  # controller addresses, ';'-separated (or a peers string)
    listen: str
    ha_listen: str
    store_dir: str
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    all_ack_in_sync_state_set: bool = False
    election_priority: int = 2**31 - 1  # lower is preferred
    heartbeat_interval_ms: int = 300  # to every controller
    lease_ms: int = 1000  # a master acknowledges sends only this long after its lease was renewed
    sync_metadata_ms: int = 1000  # replica info poll (NOTIFY is the fast path)
    check_sync_state_set_ms: int = 1000
    slave_timeout_ms: int = 3000  # a send waits this long for its copies (then FLUSH_SLAVE_TIMEOUT)
    ha_heartbeat_ms: int = 1000
    ha_housekeeping_ms: int = 5000
    ha_max_time_slave_not_catchup_ms: int = 5000
    ha_transfer_batch_bytes: int = 256 << 10
    flush: str = "async"  # async | sync (a send waits for its fsync too)
    data_file_size: int = 64 << 20
    # retention (upstream's CleanCommitLogService): whole data files, oldest first, never one
    # holding a record a replica still needs (docs/brokers.md, "Retention")
    file_reserved_hours: float = 72.0  # fileReservedTime: a data file last written longer ago is deleted
    # diskMaxUsedSpaceRatio (as a fraction, upstream: a percentage): above it the oldest files go,
    # expired or not, until usage is back under it
    disk_max_used_space_ratio: float = 0.75
    retention_check_interval_ms: int = 10_000  # cleanResourceInterval: how often retention looks
    # a master's retention keeps what a slave heard from this recently still needs (as a
    # group member's retention_hold_ms): a slave restarting within it finds its next record
    retention_hold_ms: int = 600_000
    enable_fault_injection: bool = False  # obey FAULT requests (tests and chaos runs only)
    tls_cert: str = ""  # with tls_key and tls_ca: mutual TLS on the client and HA ports, and to the controllers
    tls_key: str = ""
    tls_ca: str = ""
    # without TLS: serve every host on the client and HA ports (default: loopback connections only)
    insecure: bool = False
    advertise: str = ""  # the client address others use (default: listen)
    ha_advertise: str = ""

    def __post_init__(self) -> None:
        for key in ("cluster", "name", "controller", "store_dir"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ConfigError(f"broker.{key} is required")
        for key in ("cluster", "name"):
            if any(c in getattr(self, key) for c in "#;|\n"):
                raise ConfigError(f"broker.{key} may not contain '#', ';', '|' or a newline")
        check_host_port("--listen", self.listen)
        check_host_port("--ha-listen", self.ha_listen)
        for what, value in (("--advertise", self.advertise), ("--ha-advertise", self.ha_advertise)):
            if value:
                check_host_port(what, value)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"broker.{f.name} must be a positive integer, not {value!r}")
            if f.type == "bool" and not isinstance(value, bool):
                raise ConfigError(f"broker.{f.name} must be true or false, not {value!r}")
        if self.min_in_sync_replicas > self.in_sync_replicas and not self.all_ack_in_sync_state_set:
            raise ConfigError(f"min-in-sync-replicas ({self.min_in_sync_replicas}) is more than in-sync-replicas "
                              f"({self.in_sync_replicas})")
        if self.flush not in ("async", "sync"):
            raise ConfigError(f"broker.flush must be 'async' or 'sync', not {self.flush!r}")
        given = [k for k in ("tls_cert", "tls_key", "tls_ca") if getattr(self, k)]
        if given and len(given) != 3:
            raise ConfigError("broker.tls_cert, tls_key and tls_ca go together")
        for key in ("file_reserved_hours", "disk_max_used_space_ratio"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ConfigError(f"broker.{key} must be a number, not {value!r}")
            setattr(self, key, float(value))
        if self.file_reserved_hours < 0:
            raise ConfigError("broker.file_reserved_hours must not be negative")
        if not 0.0 < self.disk_max_used_space_ratio <= 1.0:
            raise ConfigError("broker.disk_max_used_space_ratio must be in (0, 1] (upstream's 75 is 0.75)")
        if self.data_file_size < 1 << 20:
            raise ConfigError("broker.data_file_size must be at least 1 MiB")

    @property
    def address(self) -> str:
        return broker_address(self.advertise or self.listen, self.ha_advertise or self.ha_listen)

    @property
    def ha(self) -> HAConfig:
        return HAConfig(heartbeat_ms=self.ha_heartbeat_ms, housekeeping_ms=self.ha_housekeeping_ms,
                        transfer_batch_bytes=self.ha_transfer_batch_bytes,
                        max_not_catchup_ms=self.ha_max_time_slave_not_catchup_ms)

    @property
    def acks(self) -> AckSettings:
        return AckSettings(self.in_sync_replicas, self.min_in_sync_replicas, self.all_ack_in_sync_state_set)

    @property
    def tls(self) -> TlsConfig | None:
        return TlsConfig(self.tls_ca, self.tls_cert, self.tls_key) if self.tls_cert else None

    @property
    def retention(self) -> dict[str, Any]:
        """The commit log store's retention arguments (store.file.FileLedgerStore): expired
        files go at any disk usage, and above the disk ratio the oldest go too, down to it;
        only the floor the broker sets (what its replicas still need) bounds it."""
        return {"file_reserved_hours": self.file_reserved_hours,
                "disk_space_ratio_to_check_expired": EXPIRE_AT_ANY_USAGE,
                "disk_space_ratio_to_force_clean": self.disk_max_used_space_ratio,
                "force_clean_until": self.disk_max_used_space_ratio,
                "disk_full_ratio": max(DISK_FULL_RATIO, self.disk_max_used_space_ratio),
                "retention_check_interval_ms": self.retention_check_interval_ms,
                "floor_only": True}

    @property
    def store_path(self) -> Path:
        return Path(self.store_dir)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BrokerConfig:
        data = resolve({k.replace("-", "_"): v for k, v in data.items()}, BROKER_ALIASES, "broker")
        if isinstance(data.get("flush"), str):
            data["flush"] = FLUSH_DISK_TYPES.get(data["flush"], data["flush"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown broker configuration keys: {', '.join(unknown)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in data)
        if missing:
            raise ConfigError(f"broker configuration lacks {', '.join(missing)}")
        return cls(**data)


def load_broker_toml(path: str | Path) -> dict[str, Any]:
    """A broker TOML file's keys (a `[broker]` table or top-level keys)."""
    data = read_toml(path)
    table = data.pop("broker", None)
    if table is None:
        return data
    if not isinstance(table, dict):
        raise ConfigError("[broker] must be a table")
    return {**data, **table}
