"""DLedgerConfig: defaults, TOML loading and validation (docs/configuration.md).

Validation happens once here so that every other module may trust its config;
a bad value is reported with the field name and the reason.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger.address import AddressError, format_address, parse_address
from dledger.codes import DLedgerError, ResponseCode

log = logging.getLogger(__name__)

MAX_LEASE_MS = 600_000  # heart_beat_time_interval_ms x max_heart_beat_leak: heartbeats carry it, bounded

MiB = 1024 * 1024
GiB = 1024 * MiB

_PEER_ID_RE = re.compile(r"[A-Za-z0-9_.]+")


@dataclass(frozen=True)
class Peer:
    id: str
    host: str
    port: int

    @functools.cached_property
    def address(self) -> str:
        """`host:port` (`[v6]:port`): the key members, clients and fault injection know it by
        (made once: a leader looks it up for every message it sends)."""
        return format_address(self.host, self.port)


def parse_peers(peers: str) -> dict[str, Peer]:
    """Parse DLedger's peers string `n0-127.0.0.1:20911;n1-…` (an IPv6 member: `n2-[::1]:20913`)
    into an ordered map. The id ends at the first '-' (ids have none); the rest is an address."""
    out: dict[str, Peer] = {}
    for part in (p.strip() for p in peers.split(";")):
        if not part:
            continue
        pid, sep, address = part.partition("-")
        if not sep or not _PEER_ID_RE.fullmatch(pid):
            raise ConfigError(f"bad peer {part!r}: expected id-host:port, e.g. n0-127.0.0.1:20911")
        try:
            host, port = parse_address(address)
        except AddressError as e:
            raise ConfigError(f"bad peer {part!r}: {e}") from None
        if pid in out:
            raise ConfigError(f"bad peers string: member id {pid!r} appears twice")
        out[pid] = Peer(pid, host, port)
    if not out:
        raise ConfigError(f"bad peers string {peers!r}: no members")
    return out


def format_peers(peers: dict[str, Peer]) -> str:
    return ";".join(f"{p.id}-{p.address}" for p in peers.values())


class ConfigError(DLedgerError):
    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.UNEXPECTED_ARGUMENT, message)


def _type_name(t: Any) -> str:
    origin = typing.get_origin(t)
    if origin is list:
        (item,) = typing.get_args(t)
        plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(item, _type_name(item))}"
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_name(a) for a in typing.get_args(t))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "none"}.get(
        t, getattr(t, "__name__", str(t)))


def _value_name(v: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a table"}
    return f"{kinds.get(type(v), type(v).__name__)} ({v!r})"


def _conform(t: Any, v: Any) -> tuple[bool, Any]:
    """Whether `v` is a value of the annotated type `t`, and the value to keep (an int given for
    a float becomes a float). bool is not an int here, though Python says it is."""
    origin = typing.get_origin(t)
    if origin is list:
        (item,) = typing.get_args(t)
        if not isinstance(v, list):
            return False, v
        out = []
        for x in v:
            ok, x = _conform(item, x)
            if not ok:
                return False, v
            out.append(x)
        return True, out
    if origin is typing.Union or origin is types.UnionType:  # `str | None`
        for arg in typing.get_args(t):
            ok, conformed = _conform(arg, v)
            if ok:
                return True, conformed
        return False, v
    if t is type(None):
        return v is None, v
    if t is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return True, float(v)
        return False, v
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    if isinstance(t, type):
        return isinstance(v, t), v
    return True, v  # an annotation this check does not know: validate() has the last word


def _check_types(cls: type[DLedgerConfig], data: dict[str, Any]) -> dict[str, Any]:
    """Every value of the annotated type of its field (a TOML `peers = 5` names the key)."""
    hints = typing.get_type_hints(cls)
    out = dict(data)
    for key, value in data.items():
        ok, out[key] = _conform(hints[key], value)
        if not ok:
            raise ConfigError(f"{key} must be {_type_name(hints[key])}, not {_value_name(value)}")
    return out



def _unknown_hints(data: dict[str, Any], unknown: list[str], known: set[str], flag_keys: dict[str, str]) -> str:
    """Each unknown key with the key it likely means: the snake_case spelling, the key its flag
    sets, a close name; a table (`[tls]`) is told keys are top-level."""
    said = []
    for k in unknown:
        shown = k if re.fullmatch(r"[\w.-]+", k) else repr(k)
        flag = k.replace("_", "-")
        if isinstance(data[k], dict):
            said.append(f"[{shown}] (a table: a member's keys are top-level, e.g. tls_cert)")
        elif k.replace("-", "_") in known:
            said.append(f"{shown} (keys are snake_case: {k.replace('-', '_')})")
        elif flag_keys.get(flag) in known:
            said.append(f"{shown} (the flag --{flag} sets the key {flag_keys[flag]})")
        elif close := difflib.get_close_matches(k, known, 1):
            said.append(f"{shown} (did you mean {close[0]}?)")
        else:
            said.append(shown)
    return ", ".join(said)


@dataclass
class DLedgerConfig:
    """One member's configuration; field names are docs/configuration.md's (snake_case of DLedger's)."""

    group: str = "default"  # the group's name (a process may serve several groups)
    self_id: str = "n0"  # this member's id: one of the ids in peers
    peers: str = "n0-127.0.0.1:20911"  # every member: id-host:port ([v6]:port), ";" between (clients connect there too)
    # this member's store directory (data/, index/, checkpoint, ...); `dledger server` uses
    # <store_dir>/dledger-<self_id>/ (upstream DLedger's layout) when only that holds a data/,
    # and refuses a directory holding both, or only another member's dledger-<id>/data/
    store_dir: str = "./data/default/n0"
    store_type: str = "file"  # file | memory (nothing survives a restart; tests and benchmarks)
    flush: str = "async"  # async: acknowledged in the page cache of a majority; sync: fsynced on a majority
    flush_interval_ms: int = 10  # async: how often the flusher fsyncs what was written
    # size of each data file of a new store (a record never spans two); a store with files keeps
    # theirs (docs/format.md): all members of a group need one size
    data_file_size: int = 1 * GiB
    # size of each index file of a new store (32 bytes per entry); a store with files keeps theirs
    index_file_size: int = 32 * 5_242_880
    # 0: min(4 MiB, data_file_size - 56); never more than the store's data files hold (their size - 56)
    max_body_bytes: int = 0
    checkpoint_interval_ms: int = 1000  # how often the checkpoint (committed index, trusted point) is saved
    heart_beat_time_interval_ms: int = 150  # the leader's heartbeat period
    max_heart_beat_leak: int = 4  # missed heartbeats before a follower campaigns (>= 2; lease: interval x leak <= 600s)
    # the most a follower adds to its election timeout, and a leader to its check-quorum window,
    # while heartbeats arrive late on a starved machine (twice the longest recent gap;
    # core.starvation): no flapping beside busy neighbours, the same failover on a quiet machine
    adaptive_timeout_max_ms: int = 2000
    min_vote_interval_ms: int = 300  # a candidate's randomised election timeout: at least ...
    max_vote_interval_ms: int = 500  # ... and at most this
    # leadership moves to the first of these that is caught up
    preferred_leader_ids: list[str] = field(default_factory=list)
    max_pending_requests: int = 10000  # appends waiting for commit on the leader; beyond: LEADER_PENDING_FULL
    max_wait_ack_ms: int = 2500  # an append not committed this long is answered WAIT_QUORUM_ACK_TIMEOUT
    max_push_timeout_ms: int = 1000  # a push to a follower not answered this long is sent again
    peer_push_quota: int = 20 * MiB  # bytes per second a leader pushes to a follower catching up
    max_batch_push_bytes: int = 1 * MiB  # bytes of records per push
    max_inflight_pushes: int = 8  # pushes in flight per follower (pipelining; small ones wait on a short link)
    leadership_transfer_timeout_ms: int = 3000  # a transfer not done this long is abandoned
    learner_max_lag: int = 1000  # a learner is promoted only within this many entries of the leader's end (0: none)
    # retention by age whatever the disk usage (Kafka's log.retention.hours): data files last
    # written longer ago are deleted, whole, once no member needs them (0: off; docs/operations.md)
    retention_hours: float = 0.0
    file_reserved_hours: float = 72.0  # retention under disk pressure: data files older than this may be deleted ...
    disk_space_ratio_to_check_expired: float = 0.70  # ... once the disk is this full
    disk_space_ratio_to_force_clean: float = 0.85  # beyond this, old files go whatever their age
    retention_check_interval_ms: int = 10_000  # how often retention looks
    retention_hold_ms: int = 600_000  # retention keeps what a follower heard from this recently still needs
    max_frame_bytes: int = 64 * MiB  # a bigger frame is refused and its connection closed
    metrics_port: int = 0  # 0: no metrics endpoint
    # where the metrics endpoint listens (it has no authentication: 0.0.0.0 to let a Prometheus
    # on another host scrape it, behind a firewall)
    metrics_host: str = "127.0.0.1"
    # state machine (docs/state-machines.md): "" a plain log | "kv" | "package.module:factory"
    state_machine: str = ""
    snapshot_threshold_entries: int = 100_000  # snapshot once this many entries were applied since the last (0: never)
    snapshot_threshold_bytes: int = 256 * MiB  # ... or this many body bytes (0: never)
    snapshot_margin_entries: int = 10_000  # entries kept behind a snapshot for slow followers (the rest deleted)
    # idempotent producers (core.producers): forgotten after this long without an append (by the
    # leaders' wall clocks, as written in the log), and the least recently used beyond the cap
    producer_expiry_ms: int = 24 * 3600 * 1000
    max_producers: int = 100_000  # idempotent producers remembered (beyond: the biggest holder's least recently used)
    # idempotent producers remembered per principal (a certificate's or token's name; without
    # either every client is the same one): beyond, that principal's least recently used go first
    max_producers_per_principal: int = 100_000
    # where idempotent producers' entries are (spans of consecutive sequences, 24 bytes each), so a
    # duplicate is compared with the stored entry: every span of each producer's current epoch is
    # kept while the table holds at most this many; beyond, the least recently used producers keep
    # only their epoch's first span and their 32 most recent (older duplicates: DUPLICATE_UNVERIFIABLE)
    max_producer_spans: int = 1_000_000
    # the leader creates at most this many producers per second per principal (bursts of 10 times
    # it); beyond, an append that would create one is refused (PRODUCER_RATE_LIMITED)
    producer_creations_per_second: int = 200
    install_chunk_bytes: int = 4 * MiB  # InstallSnapshot: bytes per request, one in flight per follower
    # lease reads: the leader's lease is the heartbeat lease (interval * leak) minus this margin for
    # clocks that run at different rates (at least 1; a tenth of the heartbeat lease is advised)
    lease_clock_drift_ms: int = 200
    enable_fault_injection: bool = False  # answer FAULT (tests, chaos): off, so no client can cut links
    # security (docs/security.md): mutual TLS between members and for clients, all three or none
    tls_cert: str = ""  # this member's certificate (PEM); it must name self_id
    tls_key: str = ""  # its private key (PEM)
    tls_ca: str = ""  # the CA that signed every member's and client's certificate
    auth_token: str = ""  # without TLS: the cluster token (members'; every role when it is the only token)
    client_token: str = ""  # without TLS: a token giving the client role only (read, write)
    admin_token: str = ""  # without TLS: a token giving the admin role (operator requests, and a client's)
    # neither TLS nor a token: serve other hosts too (every connection then has every role); without
    # it such a member accepts connections from loopback addresses only
    insecure: bool = False
    peer_listen: str = ""  # member-only addresses, peers format; member messages only there when set
    # bounded resources: what one misbehaving client can cost a member
    max_connections: int = 1024  # accepted connections, both listeners together
    idle_timeout_ms: int = 300_000  # a connection with no frame and nothing in flight this long is closed
    frame_timeout_ms: int = 30_000  # a frame must arrive whole within this long of its first byte
    max_read_bytes: int = 16 * MiB  # a READ answer never carries more, whatever the request asks
    frame_memory_bytes: int = 256 * MiB  # unfinished big frames of all connections together (≥ 2 frames)
    # answers queued for clients and not yet taken, all connections together: beyond it a READ gets
    # a smaller page, a bigger answer LEADER_PENDING_FULL (retry), a client not taking its answers waits
    answer_memory_bytes: int = 32 * MiB

    def __post_init__(self) -> None:
        if self.max_body_bytes == 0:
            self.max_body_bytes = min(4 * MiB, self.data_file_size - 56)
        self.validate()

    @property
    def peer_map(self) -> dict[str, Peer]:
        return parse_peers(self.peers)

    @property
    def member_map(self) -> dict[str, Peer]:
        """Where members reach each other: `peer_listen` when set, else `peers`."""
        return parse_peers(self.peer_listen or self.peers)

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert)

    @property
    def security_mode(self) -> str:
        """How connections are authenticated: "tls", "token", "insecure" (neither, every host
        served) or "loopback" (neither, loopback connections only: the default)."""
        if self.tls_enabled:
            return "tls"
        if self.auth_token or self.client_token or self.admin_token:
            return "token"
        return "insecure" if self.insecure else "loopback"

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
            "leadership_transfer_timeout_ms retention_check_interval_ms retention_hold_ms max_frame_bytes "
            "install_chunk_bytes"
        )
        for name in positive.split():
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")
        if self.install_chunk_bytes > self.max_frame_bytes - (64 << 10):
            raise ConfigError(f"install_chunk_bytes must leave room for the request in a frame "
                              f"(max_frame_bytes {self.max_frame_bytes} - 64 KiB)")
        if not isinstance(self.adaptive_timeout_max_ms, int) or not 0 <= self.adaptive_timeout_max_ms <= 60_000:
            raise ConfigError(f"adaptive_timeout_max_ms must be in [0, 60000] (0: off), not "
                              f"{self.adaptive_timeout_max_ms!r}")
        if self.max_vote_interval_ms < self.min_vote_interval_ms:
            raise ConfigError("max_vote_interval_ms must be >= min_vote_interval_ms")
        for name in ("disk_space_ratio_to_check_expired", "disk_space_ratio_to_force_clean"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1]")
        for name in ("file_reserved_hours", "retention_hours"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if not isinstance(self.learner_max_lag, int) or self.learner_max_lag < 0:
            raise ConfigError(f"learner_max_lag must be 0 (caught up exactly) or more, not {self.learner_max_lag!r}")
        if not 0 <= self.metrics_port < 65536:
            raise ConfigError("metrics_port must be 0 (off) or a TCP port")
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise ConfigError(f"metrics_host must be an address to listen on, not {self.metrics_host!r}")
        if not isinstance(self.enable_fault_injection, bool):
            raise ConfigError(f"enable_fault_injection must be true or false, not {self.enable_fault_injection!r}")
        self._validate_security(peers)

    def _validate_security(self, peers: dict[str, Peer]) -> None:
        for name in ("tls_cert", "tls_key", "tls_ca", "auth_token", "client_token", "admin_token", "peer_listen"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a string, not {getattr(self, name)!r}")
        if not isinstance(self.insecure, bool):
            raise ConfigError(f"insecure must be true or false, not {self.insecure!r}")
        tokens = [t for t in (self.auth_token, self.client_token, self.admin_token) if t]
        if len(set(tokens)) != len(tokens):
            raise ConfigError("auth_token, client_token and admin_token must differ: a token names its roles")
        if (self.client_token or self.admin_token) and not self.auth_token:
            raise ConfigError("client_token and admin_token need an auth_token for the members themselves")
        given = [n for n in ("tls_cert", "tls_key", "tls_ca") if getattr(self, n)]
        if given and len(given) != 3:
            raise ConfigError("tls_cert, tls_key and tls_ca go together: give all three or none")
        if self.peer_listen:
            members = parse_peers(self.peer_listen)
            if list(members) != list(peers):
                raise ConfigError(f"peer_listen names members {sorted(members)}, peers names {sorted(peers)}")
            clash = {p.address for p in members.values()} & {p.address for p in peers.values()}
            if clash:
                raise ConfigError(f"peer_listen reuses client addresses {sorted(clash)}: give members other ports")
        if self.max_heart_beat_leak < 2:  # a follower would time out exactly when the next heartbeat is due
            raise ConfigError(f"max_heart_beat_leak must be at least 2, not {self.max_heart_beat_leak}")
        lease = self.heart_beat_time_interval_ms * self.max_heart_beat_leak
        if lease > MAX_LEASE_MS:  # heartbeats and their answers carry it, bounded (core.messages)
            raise ConfigError(f"heart_beat_time_interval_ms x max_heart_beat_leak (the lease) must be at most "
                              f"{MAX_LEASE_MS} ms, not {lease}")
        # lease reads need a margin for clock-rate differences (Raft thesis §6.4.1): none is refused,
        # less than a tenth of the lease is told
        if not isinstance(self.lease_clock_drift_ms, int) or not 1 <= self.lease_clock_drift_ms < lease:
            raise ConfigError(f"lease_clock_drift_ms must be in [1, {lease}) (a margin within the heartbeat "
                              f"lease), not {self.lease_clock_drift_ms!r}")
        if self.lease_clock_drift_ms * 10 < lease:
            log.warning("lease_clock_drift_ms %d is less than a tenth of the heartbeat lease (%d ms): lease reads "
                        "assume the members' clocks run within %.0f%% of each other", self.lease_clock_drift_ms,
                        lease, 100 * self.lease_clock_drift_ms / lease)
        for name in ("snapshot_threshold_entries", "snapshot_threshold_bytes", "snapshot_margin_entries"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(f"{name} must be an integer >= 0 (0: never), not {getattr(self, name)!r}")
        if self.state_machine and self.state_machine != "kv" and ":" not in self.state_machine:
            raise ConfigError(f"state_machine must be \"\", \"kv\" or \"package.module:factory\", "
                              f"not {self.state_machine!r}")
        for name in ("max_connections", "idle_timeout_ms", "frame_timeout_ms", "max_read_bytes",
                     "frame_memory_bytes", "answer_memory_bytes", "producer_expiry_ms", "max_producers",
                     "max_producers_per_principal", "max_producer_spans", "producer_creations_per_second"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer, not {getattr(self, name)!r}")

    def replace(self, **changes: Any) -> DLedgerConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any], flag_keys: dict[str, str] | None = None) -> DLedgerConfig:
        """`flag_keys`: a command's flag names (as keys: "id") -> the key each sets ("self_id"),
        so a key written as its flag is told which key it means."""
        from dledger.config_aliases import MEMBER_ALIASES, resolve

        known = {f.name for f in dataclasses.fields(cls)}
        data = resolve(data, MEMBER_ALIASES, "configuration")  # upstream DLedgerConfig's names too
        if odd := [k for k in data if not isinstance(k, str)]:
            raise ConfigError(f"configuration keys are names, not {odd[0]!r}")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys: {_unknown_hints(data, unknown, known, flag_keys or {})}; "
                              f"valid keys are {', '.join(sorted(known))} (docs/configuration.md)")
        for key in ("preferred_leader_ids",):
            if isinstance(data.get(key), str):
                data = dict(data)
                data[key] = [s for s in re.split(r"[;,\s]+", data[key]) if s]
        data = _check_types(cls, data)
        try:
            return cls(**data)
        except TypeError as e:  # _check_types lets nothing through that should get here
            raise ConfigError(f"bad configuration value: {e}") from e

    @classmethod
    def from_toml(cls, path: str | Path, flag_keys: dict[str, str] | None = None) -> DLedgerConfig:
        return cls.from_dict(read_toml(path), flag_keys)


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's keys (ConfigError naming the file when it is missing or malformed)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} not found") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from e
