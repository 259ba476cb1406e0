"""docs/configuration.md, generated from DLedgerConfig (`python -m dledger.config_doc`).

The reference cannot drift from the code: every key, its default and its meaning come from
the dataclass and the comments beside its fields; the CLI flag from `dledger server`'s
options. A test regenerates it and compares.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from types import ModuleType
from typing import Any

import click

from dledger import config

# `dledger server` parameters named otherwise than their keys
_PARAM_KEYS = {"preferred": "preferred_leader_ids", "fault_injection": "enable_fault_injection"}

HEADER = """# Configuration reference

Every key of a member's configuration: a TOML file (`dledger server --config FILE`, snake_case
keys, unknown keys refused) or the flags of `dledger server` (a flag wins over the file).
Sizes are bytes, times milliseconds unless the name says otherwise. Generated from
`DLedgerConfig` (`src/dledger/config.py`) by `python -m dledger.config_doc`; a test keeps it
current.

```toml
# a member of a 3-member group on three machines, mutual TLS, fsync before acknowledging
group = "orders"
self_id = "n0"
peers = "n0-10.0.0.1:20911;n1-10.0.0.2:20911;n2-10.0.0.3:20911"
store_dir = "/var/lib/dledger/orders/n0"
flush = "sync"
metrics_port = 9100
tls_cert = "/etc/dledger/n0.pem"    # `dledger certs` makes a development set (docs/security.md)
tls_key = "/etc/dledger/n0-key.pem"
tls_ca = "/etc/dledger/ca.pem"
```

Without TLS or a token a member serves loopback connections only (`insecure = true` serves
every host, with no authentication at all: docs/security.md).

A member that joins a running group starts with `dledger server --join PEERS --id ID
--store-dir DIR` instead of `--peers`: it reads the group's configuration (voters, learners,
their addresses) from any reachable member of PEERS, which must already name ID (`dledger
members add-learner` first; docs/operations.md), and starts as a learner with an empty store
the leader fills. The configuration read is the one the member starts from (`peers` is set
to it too) at each start with `--join`, used only while its own log and snapshot hold none:
once a membership change is in its log or snapshot, that configuration wins over the command
line. `--join` does not take `--peer-listen`: a configuration has one address per member.
The leader promotes a learner only while it trails by at most `learner_max_lag` entries (a
core option; a promotion of a learner further behind is refused with LEARNER_BEHIND, 440).

| key | default | CLI flag | meaning |
|---|---|---|---|
"""


def comments(module: ModuleType = config, name: str = "DLedgerConfig") -> dict[str, str]:
    """Each field's comment: the block of `#` lines above it and the one on its line."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    out: dict[str, str] = {}
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        k = node.lineno - 1
        above: list[str] = []
        j = k - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        own = lines[k].split("  # ", 1)[1].strip() if "  # " in lines[k] else ""
        out[node.target.id] = own or " ".join(above)  # a block above a commented field heads a section
    return out


def flags() -> dict[str, str]:
    """Config key -> `dledger server` flag."""
    from dledger.cli import server

    out: dict[str, str] = {}
    keys = {f.name for f in dataclasses.fields(config.DLedgerConfig)}
    for p in server.params:
        if isinstance(p, click.Option) and p.name is not None:
            key = _PARAM_KEYS.get(p.name, p.name)
            if key in keys:
                out[key] = max(p.opts, key=len)
    return out


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


BROKER_HEADER = """
## Broker retention

A broker replica (`dledger broker --config FILE`, docs/brokers.md) takes these keys beside
the ones docs/brokers.md lists; how they combine is in docs/brokers.md, "Retention".

| key | default | meaning |
|---|---|---|
"""
BROKER_RETENTION_KEYS = ("file_reserved_hours", "disk_max_used_space_ratio", "retention_check_interval_ms",
                         "retention_hold_ms")


def render() -> str:
    from dledger.broker import config as broker_config

    notes, cli = comments(), flags()
    rows = [f"| `{f.name}` | {_default(f)} | {f'`{cli[f.name]}`' if f.name in cli else ''} | "
            f"{notes.get(f.name, '').replace('|', '/')} |" for f in dataclasses.fields(config.DLedgerConfig)]
    broker_notes = comments(broker_config, "BrokerConfig")
    broker_rows = [f"| `{f.name}` | {_default(f)} | {broker_notes.get(f.name, '').replace('|', '/')} |"
                   for f in dataclasses.fields(broker_config.BrokerConfig) if f.name in BROKER_RETENTION_KEYS]
    return (HEADER + "\n".join(rows) + "\n" + BROKER_HEADER + "\n".join(broker_rows) + "\n"
            + upstream_names())


ALIASES_HEADER = """
## Upstream names

A group member's keys may also be written under upstream DLedger's camelCase names (its
`DLedgerConfig`) in its `--config` file. A controller's and a broker's keys may be written
under upstream RocketMQ's (its `ControllerConfig`, `BrokerConfig` and `MessageStoreConfig`),
wherever they are taken: a controller's TOML file (its top level, as upstream's flat
properties file has them, or its `[controller]` table), `dledger admin controller-config set`
(and an mqadmin-style UPDATE_CONTROLLER_CONFIG), a broker's `--config` file. They mean our key; the values are ours
(milliseconds, bytes; `flushDiskType` also takes `ASYNC_FLUSH` / `SYNC_FLUSH`). A key given
under both names is refused, and so is a name that is neither ours nor one of these, naming
it. `get` shows our names. Black-listed keys (`configBlackList`, `configStorePath`,
`rocketmqHome`, and `enableElectUncleanMaster`, which may lose acknowledged data) are refused
by `set` with 16 NO_PERMISSION.

| upstream name | our key | where |
|---|---|---|
"""


def upstream_names() -> str:
    """The alias table (config_aliases), so the page cannot drift from what is taken."""
    from dledger.config_aliases import BROKER_ALIASES, CONTROLLER_ALIASES, CONTROLLER_MEMBER_ALIASES, MEMBER_ALIASES

    where = (("group member (`dledger server --config`)", MEMBER_ALIASES),
             ("controller (`[controller]`, runtime)", CONTROLLER_ALIASES),
             ("controller member (top level)", CONTROLLER_MEMBER_ALIASES), ("broker", BROKER_ALIASES))
    rows = [f"| {name} | `{ours}` | {place} |" for place, table in where for name, ours in table.items()]
    return ALIASES_HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render(), end="")
