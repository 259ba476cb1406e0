"""The controller's own settings (upstream's ControllerConfig), the `[controller]` table of its TOML file;
the rest of the file is an ordinary member's configuration (config.DLedgerConfig).

Defaults are for a 2 s master failover end to end: brokers beat every 300 ms and are dead
after 1.5 s without one; the leader scans every 250 ms (upstream: 1 s, 10 s and 5 s).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.config import ConfigError, DLedgerConfig, read_toml
from dledger.config_aliases import CONTROLLER_ALIASES, CONTROLLER_MEMBER_ALIASES, resolve

# keys UPDATE_CONTROLLER_CONFIG may never change (upstream's configBlackList, and ours: what
# the state or the Raft group depends on, and unclean elections: an admin steers, but switching
# them on may lose acknowledged data, so only the controller's own configuration may)
BLACK_LIST = frozenset({"config_black_list", "config_store_path", "rocketmq_home", "enable_elect_unclean_master"})


@dataclass
class ControllerConfig:
    broker_heartbeat_interval_ms: int = 300  # what brokers are told to use (the broker client's default)
    broker_heartbeat_timeout_ms: int = 1500  # a broker whose heartbeat does not say its own timeout
    # a master lease is granted only if lease + this margin fits in the heartbeat timeout (a new
    # controller leader waits that long before electing, so no lease it never saw is still held)
    broker_lease_drift_ms: int = 200
    scan_interval_ms: int = 250  # the leader looks for dead masters this often
    enable_elect_unclean_master: bool = False  # may lose acknowledged data: off unless you accept that
    notify_broker_role_changed: bool = True  # push NOTIFY_BROKER_ROLE_CHANGED to the broker set's replicas
    elect_master_max_retry_count: int = 3  # controller-triggered attempts per dead master
    request_timeout_ms: int = 5000  # a write waits this long for its entry to be applied

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ConfigError(f"controller.{f.name} must be true or false, not {value!r}")
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ConfigError(f"controller.{f.name} must be a positive integer, not {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControllerConfig:
        """Our keys, or upstream's names for them (config_aliases)."""
        data = resolve(data, CONTROLLER_ALIASES, "controller")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown controller configuration keys: {', '.join(unknown)}")
        return cls(**data)

    def updated(self, properties: str) -> ControllerConfig:
        """This config with `key=value` lines applied (UPDATE_CONTROLLER_CONFIG; our keys or
        upstream's names for them); ConfigError names a key that is unknown, black-listed
        (PermissionError) or badly valued. Nothing changes unless every line is good."""
        changes: dict[str, Any] = {}
        types = {f.name: f.type for f in dataclasses.fields(self)}
        for line in properties.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            given, sep, value = (p.strip() for p in line.partition("="))
            key = CONTROLLER_ALIASES.get(given, given)
            named = given if key == given else f"{given} ({key})"
            if key in BLACK_LIST:
                raise PermissionError(f"the controller config key {named} cannot be updated")
            if not sep or key not in types:
                raise ConfigError(f"not a controller config key: {given!r}")
            changes[key] = _parse(key, value, types[key])
        return dataclasses.replace(self, **changes)  # (__post_init__ checks the values)

    def properties(self) -> str:
        return "".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n"
                       for k, v in dataclasses.asdict(self).items())


def _parse(key: str, value: str, kind: object) -> bool | int:
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise ConfigError(f"controller.{key} must be true or false, not {value!r}")
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"controller.{key} must be an integer, not {value!r}") from None


# A controller's Raft group: small entries, so snapshots come often and the log stays short.
CONTROLLER_GROUP_DEFAULTS: dict[str, Any] = {"group": "controller", "snapshot_threshold_entries": 10_000,
                                             "snapshot_margin_entries": 1_000, "data_file_size": 64 << 20}


def load_controller_toml(path: str | Path) -> tuple[dict[str, Any], ControllerConfig]:
    """(member keys, controller config) of a controller's TOML file."""
    data = read_toml(path)
    table = data.pop("controller", {})
    if not isinstance(table, dict):
        raise ConfigError("[controller] must be a table")
    # upstream's properties file is flat: its controller names may come at the top level too
    moved = {k: data.pop(k) for k in [k for k in data if k in CONTROLLER_ALIASES]}
    return resolve(data, CONTROLLER_MEMBER_ALIASES, "controller member"), ControllerConfig.from_dict({**table, **moved})


def member_config(data: dict[str, Any]) -> DLedgerConfig:
    """The controller group's member config: our defaults under what the user gave (our keys,
    or upstream's ControllerConfig names for them)."""
    return DLedgerConfig.from_dict({**CONTROLLER_GROUP_DEFAULTS, **resolve(data, CONTROLLER_MEMBER_ALIASES,
                                                                            "controller member")})
