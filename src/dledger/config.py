"""DLedgerConfig: defaults, TOML loading and validation (SPEC §4).

Validation happens once here so that every other module may trust its config;
a bad value is reported with the field name and the reason.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger.codes import DLedgerError, ResponseCode

MiB = 1024 * 1024
GiB = 1024 * MiB

_PEER_RE = re.compile(r"^(?P<id>[A-Za-z0-9_.]+)-(?P<host>[^:;\s]+):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class Peer:
    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_peers(peers: str) -> dict[str, Peer]:
    """Parse DLedger's peers string `n0-127.0.0.1:20911;n1-…` into an ordered map."""
    out: dict[str, Peer] = {}
    for part in (p.strip() for p in peers.split(";")):
        if not part:
            continue
        m = _PEER_RE.match(part)
        if m is None:
            raise ConfigError(f"bad peer {part!r}: expected id-host:port, e.g. n0-127.0.0.1:20911")
        port = int(m["port"])
        if not 0 < port < 65536:
            raise ConfigError(f"bad peer {part!r}: port {port} out of range")
        if m["id"] in out:
            raise ConfigError(f"bad peers string: member id {m['id']!r} appears twice")
        out[m["id"]] = Peer(m["id"], m["host"], port)
    if not out:
        raise ConfigError(f"bad peers string {peers!r}: no members")
    return out


def format_peers(peers: dict[str, Peer]) -> str:
    return ";".join(f"{p.id}-{p.host}:{p.port}" for p in peers.values())


class ConfigError(DLedgerError):
    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.UNEXPECTED_ARGUMENT, message)


@dataclass
class DLedgerConfig:
    """One member's configuration; field names are SPEC §4's (snake_case of DLedger's)."""

    group: str = "default"
    self_id: str = "n0"
    peers: str = "n0-127.0.0.1:20911"
    store_dir: str = "./data/default/n0"
    store_type: str = "file"  # file | memory
    flush: str = "async"  # async | sync
    flush_interval_ms: int = 10
    data_file_size: int = 1 * GiB
    index_file_size: int = 32 * 5_242_880
    max_body_bytes: int = 0  # 0: min(4 MiB, data_file_size - 56)
    checkpoint_interval_ms: int = 1000
    heart_beat_time_interval_ms: int = 250
    max_heart_beat_leak: int = 4
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 700
    preferred_leader_ids: list[str] = field(default_factory=list)
    max_pending_requests: int = 10000
    max_wait_ack_ms: int = 2500
    max_push_timeout_ms: int = 1000
    peer_push_quota: int = 20 * MiB
    max_batch_push_bytes: int = 1 * MiB
    max_inflight_pushes: int = 8
    leadership_transfer_timeout_ms: int = 3000
    file_reserved_hours: float = 72.0
    disk_space_ratio_to_check_expired: float = 0.70
    disk_space_ratio_to_force_clean: float = 0.85
    retention_check_interval_ms: int = 10_000
    retention_hold_ms: int = 600_000  # retention keeps what a follower heard from this recently still needs
    max_frame_bytes: int = 64 * MiB
    metrics_port: int = 0  # 0: no metrics endpoint
    enable_fault_injection: bool = False  # answer FAULT (tests, chaos): off, so no client can cut links

    def __post_init__(self) -> None:
        if self.max_body_bytes == 0:
            self.max_body_bytes = min(4 * MiB, self.data_file_size - 56)
        self.validate()

    @property
    def peer_map(self) -> dict[str, Peer]:
        return parse_peers(self.peers)

    def validate(self) -> None:
        """Reject values that would corrupt data or never elect, naming the field."""
        if self.store_type not in ("file", "memory"):
            raise ConfigError(f"store_type must be 'file' or 'memory', not {self.store_type!r}")
        if self.flush not in ("async", "sync"):
            raise ConfigError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        if not self.group or not re.match(r"^[A-Za-z0-9_.-]+$", self.group):
            raise ConfigError(f"group {self.group!r}: use letters, digits, '_', '.', '-'")
        peers = parse_peers(self.peers)
        if self.self_id not in peers:
            raise ConfigError(f"self_id {self.self_id!r} is not in peers {self.peers!r}")
        for pid in self.preferred_leader_ids:
            if pid not in peers:
                raise ConfigError(f"preferred_leader_ids: {pid!r} is not in peers")
        if self.data_file_size < 4096:
            raise ConfigError("data_file_size must be at least 4096 bytes")
        if self.index_file_size < 32 or self.index_file_size % 32:
            raise ConfigError("index_file_size must be a positive multiple of 32")
        if not 0 < self.max_body_bytes <= self.data_file_size - 56:
            raise ConfigError(
                f"max_body_bytes must be in 1..data_file_size-56 ({self.data_file_size - 56})"
            )
        positive = (
            "flush_interval_ms heart_beat_time_interval_ms max_heart_beat_leak "
            "min_vote_interval_ms max_pending_requests max_wait_ack_ms max_push_timeout_ms "
            "peer_push_quota max_batch_push_bytes max_inflight_pushes checkpoint_interval_ms "
            "leadership_transfer_timeout_ms retention_check_interval_ms retention_hold_ms max_frame_bytes"
        )
        for name in positive.split():
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")
        if self.max_vote_interval_ms < self.min_vote_interval_ms:
            raise ConfigError("max_vote_interval_ms must be >= min_vote_interval_ms")
        for name in ("disk_space_ratio_to_check_expired", "disk_space_ratio_to_force_clean"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1]")
        if self.file_reserved_hours < 0:
            raise ConfigError("file_reserved_hours must not be negative")
        if not 0 <= self.metrics_port < 65536:
            raise ConfigError("metrics_port must be 0 (off) or a TCP port")
        if not isinstance(self.enable_fault_injection, bool):
            raise ConfigError(f"enable_fault_injection must be true or false, not {self.enable_fault_injection!r}")

    def replace(self, **changes: Any) -> DLedgerConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DLedgerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
        if isinstance(data.get("preferred_leader_ids"), str):
            data = dict(data)
            ids = data["preferred_leader_ids"]
            data["preferred_leader_ids"] = [s for s in re.split(r"[;,\s]+", ids) if s]
        try:
            return cls(**data)
        except TypeError as e:  # wrong value types surface as TypeError in comparisons
            raise ConfigError(f"bad configuration value: {e}") from e

    @classmethod
    def from_toml(cls, path: str | Path) -> DLedgerConfig:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError as e:
            raise ConfigError(f"config file {path} not found") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from e
        return cls.from_dict(data)
