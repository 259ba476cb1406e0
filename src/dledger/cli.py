"""The `dledger` command (docs/getting-started.md).

User mistakes (bad peers string, unreachable cluster, missing config) end with
one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from dledger.address import format_address
from dledger.clitools import (
    PEERS_HELP,
    Rows,
    UserError,
    WireInt,
    base64_output_option,
    body_chunks,
    body_json,
    check_store_dir,
    consistency_option,
    emit,
    emit_record,
    group_option,
    json_alias,
    lines_only,
    make_client,
    output_option,
    peers_option,
    run_member,
    security,
    security_options,
    server_security_options,
    write_body,
)
from dledger.codes import DLedgerError, ResponseCode
from dledger.config import ConfigError, DLedgerConfig, Peer, format_peers, parse_peers
from dledger.entry import MAGIC_NOOP, MAGIC_NORMAL, MAGIC_SESSION
from dledger.health import DEFAULT_MAX_LAG, assess, is_down
from dledger.local_cluster import busy_ports, local_certs, local_cluster
from dledger.members_command import JOIN_HELP, join_into
from dledger.membership import Membership
from dledger.runtime.client import DLedgerClient, Members, Metadata
from dledger.store.offline import LayoutError, member_store_dir

log = logging.getLogger(__name__)

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dledger", message="dledger %(version)s")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """dledger: a Raft-replicated commit log."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# --- members -------------------------------------------------------------------------------

RETENTION_HOURS_HELP = ("Delete data files last written longer ago than this, whatever the disk usage, once no "
                        "member needs them (docs/operations.md, Retention)")
FILE_RESERVED_HELP = "Under disk pressure, data files older than this may be deleted"


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML configuration file.")
@click.option("--group", default=None, help="Group name [default].")
@click.option("--id", "self_id", default=None, help="This member's id, e.g. n0.")
@click.option("--peers", default=None, help=PEERS_HELP)
@click.option("--join", default=None, metavar="PEERS", help=JOIN_HELP)
@click.option("--store-dir", default=None, help="Directory of this member's store.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default=None)
@click.option("--store", "store_type", type=click.Choice(["file", "memory"]), default=None)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default=None,
              help="... on this address [127.0.0.1; 0.0.0.0 for a Prometheus elsewhere: it has no authentication].")
@click.option("--preferred-leader", "preferred", default=None, help="Preferred leader ids, comma separated.")
@click.option("--enable-fault-injection", "fault_injection", is_flag=True,
              help="Obey FAULT requests (cut links on a client's word): for tests and chaos runs only.")
@click.option("--peer-listen", default=None,
              help="Member-only addresses, peers format: members talk there, clients on --peers.")
@click.option("--state-machine", default=None,
              help="Apply committed entries to: 'kv' (the replicated key-value store) or 'package.module:factory'.")
@click.option("--snapshot-threshold-entries", type=click.IntRange(0), default=None,
              help="Snapshot after this many applied entries [100000; 0: never].")
@click.option("--snapshot-threshold-bytes", type=click.IntRange(0), default=None,
              help="... or after this many applied body bytes [256 MiB; 0: never].")
@click.option("--snapshot-margin-entries", type=click.IntRange(0), default=None,
              help="Log entries kept behind a snapshot for slow followers; older ones are deleted [10000].")
@click.option("--retention-hours", type=click.FloatRange(0), default=None,
              help=RETENTION_HOURS_HELP + " [0: off].")
@click.option("--file-reserved-hours", type=click.FloatRange(0), default=None,
              help=FILE_RESERVED_HELP + " [72].")
@click.option("--producer-expiry-ms", type=click.IntRange(1), default=None,
              help="Forget an idempotent producer after this long without an append [86400000: a day].")
@click.option("--max-producers", type=click.IntRange(1), default=None,
              help="Idempotent producers remembered; the least recently used beyond are forgotten [100000].")
@click.option("--max-producers-per-principal", type=click.IntRange(1), default=None,
              help="... per principal (certificate or token): a principal beyond it forgets its own [50000].")
@click.option("--producer-creations-per-second", type=click.IntRange(1), default=None,
              help="New idempotent producers a principal may start per second, burst 10x [200].")
@server_security_options
def server(config_file: str | None, group: str | None, self_id: str | None, peers: str | None, join: str | None,
           store_dir: str | None, flush: str | None, store_type: str | None, metrics_port: int | None,
           metrics_host: str | None, preferred: str | None, fault_injection: bool, peer_listen: str | None,
           state_machine: str | None,
           snapshot_threshold_entries: int | None, snapshot_threshold_bytes: int | None,
           snapshot_margin_entries: int | None, producer_expiry_ms: int | None, max_producers: int | None,
           max_producers_per_principal: int | None, producer_creations_per_second: int | None,
           retention_hours: float | None, file_reserved_hours: float | None) -> None:
    """Run one member until SIGINT/SIGTERM."""
    data: dict[str, object] = {}
    if config_file:
        data.update(vars(_from_toml(config_file)))
    overrides = {"group": group, "self_id": self_id, "peers": peers, "store_dir": store_dir, "flush": flush,
                 "store_type": store_type, "metrics_port": metrics_port, "metrics_host": metrics_host,
                 "peer_listen": peer_listen,
                 "state_machine": state_machine, "snapshot_threshold_entries": snapshot_threshold_entries,
                 "snapshot_threshold_bytes": snapshot_threshold_bytes,
                 "snapshot_margin_entries": snapshot_margin_entries, "producer_expiry_ms": producer_expiry_ms,
                 "max_producers": max_producers, "max_producers_per_principal": max_producers_per_principal,
                 "producer_creations_per_second": producer_creations_per_second,
                 "retention_hours": retention_hours, "file_reserved_hours": file_reserved_hours, **security()}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if preferred is not None:
        data["preferred_leader_ids"] = [p for p in preferred.split(",") if p]
    if fault_injection:
        data["enable_fault_injection"] = True
    joined = join_into(join, data, peers, "default") if join is not None else None
    if "peers" not in data or "self_id" not in data:
        raise click.UsageError("give --config, or --id and --peers (or --join)")
    if "store_dir" not in data:
        data["store_dir"] = str(Path("data") / str(data.get("group", "default")) / str(data["self_id"]))
    given = Path(str(data["store_dir"]))
    try:
        member_dir = member_store_dir(given, str(data["self_id"]))
    except LayoutError as e:
        raise UserError(e.message) from None
    if member_dir != given:  # upstream DLedger's <storeBaseDir>/dledger-<selfId>/
        log.warning("%s holds no data/ but %s does (upstream DLedger's layout): using it", given, member_dir)
        data["store_dir"] = str(member_dir)
    cfg = DLedgerConfig.from_dict(data)
    if cfg.store_type == "file":
        check_store_dir(Path(cfg.store_dir))
    _run_member(cfg, joined)


def _from_toml(path: str) -> DLedgerConfig:
    """DLedgerConfig.from_toml; a key written as a flag's name ("id", "store") is told which key
    that flag sets ("self_id", "store_type")."""
    flag_keys = {flag[2:]: p.name for p in server.params if p.name for flag in p.opts if flag.startswith("--")}
    return DLedgerConfig.from_toml(path, flag_keys)


def _run_member(cfg: DLedgerConfig, joined: Membership | None = None) -> None:
    """`joined`: the group's configuration read by --join (the node starts from it while its
    own log and snapshot hold none)."""
    from dledger.runtime.server import serve_forever

    run_member(cfg, lambda stop: serve_forever(cfg, stop, {cfg.group: joined} if joined is not None else None))


_CONTROLLER_ONLY = ("controllers", "broker_sets", "replicas", "all_ack")
_RAFT_ONLY = ("nodes", "state_machine", "retention_hours", "file_reserved_hours")


@cli.command()
@click.option("--mode", type=click.Choice(["raft", "controller"]), default="raft", show_default=True,
              help="raft: one Raft group; controller: controllers and broker sets (AutoSwitch HA).")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 9), help="Raft mode: members.")
@click.option("--group", default=None, help="The Raft group's name [default; controller mode: controller].")
@click.option("--base-port", default=20911, show_default=True, type=click.IntRange(1024, 65000))
@click.option("--data-dir", default="./data", show_default=True, type=click.Path(file_okay=False))
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="Members' (controllers' and brokers') fsync mode.")
@click.option("--store", "store_type", type=click.Choice(["file", "memory"]), default="file", show_default=True,
              help="Members' store (controller mode: the controllers'; brokers always keep files).")
@click.option("--metrics-base-port", type=int, default=0,
              help="Member nK (controller cK) serves metrics on this port + K.")
@click.option("--insecure", is_flag=True,
              help="No TLS (default: mutual TLS, certificates made in DATA_DIR/certs): loopback clients only.")
@click.option("--tls", is_flag=True, hidden=True, help="Mutual TLS (the default now; kept for old scripts).")
@click.option("--state-machine", default="", help="Raft mode: every member applies entries to it ('kv', or "
                                                  "module:factory).")
@click.option("--retention-hours", type=click.FloatRange(0), default=None,
              help="Raft mode: " + RETENTION_HOURS_HELP + " [0: off].")
@click.option("--file-reserved-hours", type=click.FloatRange(0), default=None,
              help="Raft mode: " + FILE_RESERVED_HELP + " [72].")
@click.option("--controllers", default=3, show_default=True, type=click.IntRange(1, 9), help="Controller mode.")
@click.option("--broker-sets", default=2, show_default=True, type=click.IntRange(1, 20), help="Controller mode.")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(1, 9), help="Controller mode.")
@click.option("--all-ack-in-sync-state-set", "all_ack", is_flag=True,
              help="Controller mode: brokers acknowledge a send once every SyncStateSet member has it.")
@click.pass_context
def cluster(ctx: click.Context, mode: str, nodes: int, group: str | None, base_port: int, data_dir: str, flush: str,
            store_type: str, metrics_base_port: int, insecure: bool, tls: bool, state_machine: str, controllers: int,
            broker_sets: int, replicas: int, all_ack: bool, retention_hours: float | None,
            file_reserved_hours: float | None) -> None:
    """Run a local group as N member processes (or, --mode controller, controllers and broker
    sets) until SIGINT/SIGTERM. Mutual TLS unless --insecure: the certificates go to
    DATA_DIR/certs, and clients use them with DLEDGER_TLS_DIR=DATA_DIR/certs."""
    _refuse_other_modes(ctx, mode, insecure, tls)
    tls_dir = None if insecure else Path(data_dir) / "certs"
    if mode == "controller":
        if store_type == "memory":
            raise click.UsageError("--store memory: brokers keep their logs in files (use --mode raft)")
        _controller_cluster(Path(data_dir), base_port, controllers, broker_sets, replicas, all_ack, tls_dir,
                            group or "controller", flush, metrics_base_port)
        return
    group = group or "default"
    members = [f"n{k}" for k in range(nodes)]
    peers = format_peers({m: Peer(m, "127.0.0.1", base_port + k) for k, m in enumerate(members)})
    busy = busy_ports(peers, metrics_base_port)  # before any member starts (local_cluster checks too)
    if busy:
        raise UserError(f"cannot start the cluster: ports already in use on 127.0.0.1: {', '.join(busy)}")
    if tls_dir is not None:
        local_certs(tls_dir, members=members)
    extra = ["--state-machine", state_machine] if state_machine else []
    for flag, value in (("--retention-hours", retention_hours), ("--file-reserved-hours", file_reserved_hours)):
        if value is not None:
            extra += [flag, repr(value)]
    with local_cluster(peers, group, Path(data_dir), flush, store_type, metrics_base_port, extra,
                       tls_dir=tls_dir) as procs:
        click.echo(f"peers: {peers}", nl=True)
        _say_tls(tls_dir)
        sys.stdout.flush()
        _watch(procs)


def _refuse_other_modes(ctx: click.Context, mode: str, insecure: bool, tls: bool) -> None:
    """An option of the other mode, given on the command line, is refused (never dropped)."""
    if insecure and tls:
        raise click.UsageError("--tls and --insecure contradict each other")
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    other = _RAFT_ONLY if mode == "controller" else _CONTROLLER_ONLY
    wrong = sorted(name for name in other if name in given)
    if wrong:
        flags = ", ".join("--" + ("all-ack-in-sync-state-set" if n == "all_ack" else n.replace("_", "-"))
                          for n in wrong)
        raise click.UsageError(f"{flags}: not an option of --mode {mode}")


def _say_tls(tls_dir: Path | None) -> None:
    if tls_dir is None:
        click.echo("no TLS (--insecure): members serve loopback connections only")
    else:
        click.echo(f"mutual TLS: export DLEDGER_TLS_DIR={tls_dir}  (client.pem for clients, admin.pem for "
                   "admin commands)")


def _watch(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Until SIGINT/SIGTERM; a process that exits is reported."""
    stop = {"flag": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stop["flag"]:
        for member, p in procs.items():
            if p.poll() is not None:
                click.echo(f"{member} exited with code {p.returncode}", err=True)
                procs.pop(member)
                break
        if not procs:  # nothing left to run: say so and fail (a parent without members helps nobody)
            raise UserError("every member exited; see their messages above")
        time.sleep(0.2)


def _controller_cluster(data_dir: Path, base_port: int, controllers: int, broker_sets: int, replicas: int,
                        all_ack: bool, tls_dir: Path | None, group: str, flush: str, metrics_base_port: int) -> None:
    from dledger.broker.local import local_broker_cluster

    args = ["--all-ack-in-sync-state-set"] if all_ack else []
    args += ["--flush", flush]
    deployment = local_broker_cluster(data_dir, controllers, broker_sets, replicas, base_port, args,
                                      tls_dir=tls_dir, group=group, flush=flush, metrics_base_port=metrics_base_port)
    busy = deployment.busy_ports()
    if busy:
        raise UserError(f"cannot start the cluster: ports already in use on 127.0.0.1: {', '.join(busy)}")
    with deployment:
        click.echo(f"controllers: {deployment.controller}")
        click.echo(f"controller peers: {deployment.peers}")
        for key, spec in deployment.specs.items():
            info = deployment.info(key)
            click.echo(f"broker {key}: {spec.address} (HA {spec.ha_address}) id {info.broker_id} {info.role}")
        _say_tls(tls_dir)
        click.echo(f"try: dledger send --controller '{deployment.controller}' --broker b0 hello")
        sys.stdout.flush()
        _watch({**deployment.controllers.procs, **deployment.brokers})


# --- clients -------------------------------------------------------------------------------------


@cli.command()
@peers_option()
@group_option()
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 100000),
              help="Send stdin lines in batches of this many entries.")
@click.option("--file", "files", multiple=True, type=click.Path(dir_okay=False),
              help="Append this file's bytes as one entry (repeatable).")
@click.option("--base64", "b64", is_flag=True, help="Each BODY or stdin record is base64: append the decoded bytes.")
@click.option("-0", "--null", is_flag=True, help="Stdin records are separated by NUL bytes, not newlines.")
@click.argument("bodies", nargs=-1)
@output_option("json")
@security_options
def append(peers: str, group: str, batch: int, files: tuple[str, ...], b64: bool, null: bool,
           bodies: tuple[str, ...], output: str) -> None:
    """Append one entry per BODY, per --file, or per stdin line; print {"index","term","pos"}
    per entry.

    Bodies are bytes: a stdin line (without its b"\\n") or an argument is sent as given,
    UTF-8 or not; binary data goes by --file, --base64 or -0 (NUL-separated stdin).
    """
    parse_peers(peers)
    if files and bodies:
        raise click.UsageError("give BODY arguments or --file, not both")
    with make_client(peers, group) as c, Rows(output, f"appended to group {group}") as rows:
        for chunk in body_chunks(bodies, batch, files, b64, null):
            for r in c.append_batch(chunk):
                rows.add({"index": r.index, "term": r.term, "pos": r.pos})  # JSON: as each is committed


@cli.command()
@peers_option()
@group_option()
@click.option("--index", required=True, type=WireInt(0))
@output_option(None, "the body's raw bytes")
@base64_output_option
@consistency_option
@security_options
def get(peers: str, group: str, index: int, output: str | None, b64: bool, consistency: str) -> None:
    """Print the committed body at INDEX, raw (with -o: {"index","term","body"} as `read`)."""
    parse_peers(peers)
    with make_client(peers, group) as c:
        e = c.get(index, consistency=consistency)
    if e.magic != MAGIC_NORMAL:  # a leader's NOOP (or a marker): no body of a user's to print
        kind = {MAGIC_NOOP: "a NOOP (a new leader's first entry)", MAGIC_SESSION: "an idempotent producer's marker"}
        raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                           f"entry {index} is {kind.get(e.magic, f'of magic {e.magic}')}, not an appended body")
    if output is not None:
        emit([{"index": e.index, "term": e.term, "body": body_json(e.body, b64)}], output, f"group {group}")
        return
    write_body(e.body, b64)
    sys.stdout.flush()


@cli.command()
@peers_option(required=False, extra=" (or --controller and --broker)")
@group_option()
@click.option("--controller", default=None, help="Read a broker set: its controllers, 'host:port;host:port'.")
@click.option("--broker", "broker_name", default=None, help="Read a broker set: its name (with --controller).")
@click.option("--from", "from_index", default=0, show_default=True, type=WireInt(0))
@click.option("--max", "max_entries", default=1000, show_default=True, type=WireInt(1))
@click.option("--follow", "-f", is_flag=True,
              help="Go on printing entries as they commit, until interrupted (like tail -f); --max is ignored.")
@base64_output_option
@output_option("json")
@consistency_option
@security_options
def read(peers: str | None, group: str, controller: str | None, broker_name: str | None, from_index: int,
         max_entries: int, follow: bool, b64: bool, output: str, consistency: str) -> None:
    """Print committed entries as JSON lines {"index","term","body"} (of a broker set: its
    confirmed records, {"index","offset","epoch","body"}; --from is a queue offset)."""
    if controller or broker_name:
        source = click.get_current_context().get_parameter_source("peers")
        if source is click.core.ParameterSource.ENVIRONMENT:
            peers = None  # DLEDGER_PEERS names a group, not this broker set: not a conflict
        if not (controller and broker_name) or peers:
            raise click.UsageError("a broker set is read with --controller and --broker (and no --peers)")
        from dledger.broker.command import read_broker

        read_broker(controller, broker_name, from_index, max_entries, follow, output, b64)
        return
    if not peers:
        raise click.UsageError("give --peers (or --controller and --broker)")
    parse_peers(peers)
    with make_client(peers, group) as c:
        entries = (c.subscribe(from_index, consistency="leader" if consistency == "linearizable" else consistency)
                   if follow else c.read(from_index, max_entries, consistency=consistency))
        last = None
        with Rows(lines_only(follow, output), f"group {group}") as rows:
            for last in entries:
                rows.add({"index": last.index, "term": last.term, "body": body_json(last.body, b64)}, flush=follow)
        if not follow and last is not None and len(entries) == max_entries:  # type: ignore[arg-type]
            click.echo(f"(stopped at --max {max_entries}; more may follow: --from {last.index + 1})", err=True)


class _GroupViews(dict[str, "Metadata | DLedgerError"]):
    """Each member's own view, or the error asking it; `config`: the group's configuration (the
    leader's, with each member's lag, when one leads; None from members without membership)."""

    config: Members | None = None


def _views(peers: str, group: str) -> _GroupViews:
    """Each member's own view, or the error asking it (all asked at once: a dead member costs
    one timeout, not one per member). The members are the group's configuration in force when a
    member tells it (a member replaced since --peers was written is asked, its old one not)."""
    members = parse_peers(peers)
    with make_client(peers, group, timeout=2.0) as c:
        views = c.metadata_all(list(members))
        config = _configuration(c, views)
        out = _GroupViews()
        if config is None:
            out.update(views)
            return out
        ids = [i.id for i in config.voters + config.learners]
        unasked = [m for m in ids if m not in views]
        if unasked:
            views.update(c.metadata_all(unasked))
        out.update({m: views[m] for m in ids})
        out.config = config
        return out


def _configuration(c: DLedgerClient, views: dict[str, Metadata | DLedgerError]) -> Members | None:
    """MEMBERS of the leader among `views` (else of any member that answered): None when no
    member tells (members without membership answer UNSUPPORTED)."""
    up = {m: v for m, v in views.items() if isinstance(v, Metadata)}
    term = max((v.term for v in up.values()), default=-1)
    leaders = [m for m, v in up.items() if v.role == "leader" and v.term == term]
    for m in leaders + [m for m in up if m not in leaders]:
        try:
            config = c.members(m)
        except DLedgerError as e:
            log.debug("%s: no configuration: %s", m, e)
            continue
        if config.leader_id and config.leader_id != m:  # a follower's: the leader's has each member's lag
            with contextlib.suppress(DLedgerError):
                config = c.members(config.leader_id)
        return config
    return None


def _known_members(c: DLedgerClient) -> list[str]:
    """The group's members: its configuration when a member tells it (the client learns it),
    else the client's peers."""
    with contextlib.suppress(DLedgerError):
        return [i.id for i in c.members().members]
    return list(c.peers)


def _learners(views: _GroupViews) -> set[str]:
    return {i.id for i in views.config.learners} if views.config is not None else set()


def _views_once_ready(peers: str, group: str, deadline: float) -> _GroupViews:
    """`_views`, once this command's certificates exist: a `dledger cluster` just started may
    not have written DLEDGER_TLS_DIR's files yet (until `deadline`)."""
    while True:
        try:
            return _views(peers, group)
        except UserError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _refused_by_all(views: _GroupViews) -> bool:
    """Every member refused for good (a wrong group or credentials): waiting cannot help."""
    final = (ResponseCode.UNKNOWN_GROUP, ResponseCode.UNAUTHENTICATED)
    return all(isinstance(v, DLedgerError) and v.code in final for v in views.values())


def _status_row(v: Metadata | DLedgerError) -> dict[str, object]:
    if isinstance(v, DLedgerError):
        return {"role": "unreachable" if is_down(v) else "error", "error": str(v)}  # "CODE (n): message"
    row: dict[str, object] = {"role": v.role, "term": v.term, "leader": v.leader_id,
                              "ledger_end_index": v.ledger_end_index, "committed_index": v.committed_index,
                              "security": v.security}
    if v.applied_index >= 0 or v.snapshot_index >= 0:
        row["applied_index"] = v.applied_index
        row["snapshot_index"] = v.snapshot_index
    if v.install_index >= 0:
        row["installing"] = {"snapshot_index": v.install_index, "bytes": v.install_bytes, "total": v.install_total}
    if v.state_machine_error:
        row["state_machine_error"] = v.state_machine_error
    if v.store_error:
        row["store_error"] = v.store_error
    if v.retention_held_by:
        row["retention_held_by"] = v.retention_held_by
    return row


@cli.command()
@peers_option()
@group_option()
@click.option("--json", "as_json", is_flag=True, help="One JSON object keyed by member id (and the verdict): -o json.")
@output_option("table")
@click.option("--check", is_flag=True, help="Exit 1 unless the group is healthy (as `dledger health`).")
@click.option("--max-lag", default=DEFAULT_MAX_LAG, show_default=True, type=click.IntRange(0),
              help="With --check: entries a member may trail the leader's commit index.")
@security_options
def status(peers: str, group: str, as_json: bool, output: str, check: bool, max_lag: int) -> None:
    """Each member's role, term, leader, ledger end and committed index (with a state machine:
    applied and snapshot index), a snapshot it is installing from the leader, and what is
    wrong with it (a store that cannot write, retention held back by a lagging member); then
    a one-line verdict on the group."""
    output = json_alias(as_json, output) or "table"
    views = _views(peers, group)
    out = {m: _status_row(v) for m, v in views.items()}
    if views.config is not None:
        for info in views.config.members:
            out[info.id]["membership"] = "voter" if info.voter else "learner"
            if info.lag >= 0:
                out[info.id]["lag"] = info.lag
    verdict = assess(views, max_lag, _learners(views))
    if output == "json":
        click.echo(json.dumps({**out, "health": verdict.as_json()} if check else out))
    else:
        _print_status(group, out)
        click.echo(verdict.line)
    errors = [v for v in views.values() if isinstance(v, DLedgerError)]
    if len(errors) == len(views):  # no member gave its view (down, or a wrong group): an error, with --json too
        first = errors[0]
        raise DLedgerError(first.code, f"no member of group {group} answered with its view (first: {first.message})")
    if check and not verdict.ok:
        sys.exit(1)


def _print_status(group: str, out: dict[str, dict[str, object]]) -> None:
    cols = ["role", "term", "leader", "ledger_end_index", "committed_index", "security"]
    if any("membership" in row for row in out.values()):
        cols[1:1] = ["membership", "lag"]
    if any("applied_index" in row for row in out.values()):
        cols += ["applied_index", "snapshot_index"]
    rows: list[dict[str, object]] = []
    for m, row in out.items():
        problem = "; ".join(str(row[k]) for k in ("error", "state_machine_error", "store_error",
                                                  "retention_held_by") if k in row)
        inst = row.get("installing")
        if isinstance(inst, dict):
            pct = 100 * inst["bytes"] // max(inst["total"], 1)
            problem = "; ".join(filter(None, (f"installing snapshot {inst['snapshot_index']} from the leader: "
                                              f"{pct}% of {inst['total']} bytes", problem)))
        rows.append({"member": m, **{k: row.get(k, "") for k in cols}, "problem": problem})
    emit(rows, "table", f"group {group}")


@cli.command()
@peers_option()
@group_option()
@click.option("--max-lag", default=DEFAULT_MAX_LAG, show_default=True, type=click.IntRange(0),
              help="Entries a member may trail the leader's commit index.")
@click.option("--json", "as_json", is_flag=True, help="The verdict as one JSON object: -o json.")
@output_option("table")
@click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0), metavar="SECONDS",
              help="Ask again until healthy, for up to SECONDS (a group just started: scripts wait on this).")
@security_options
def health(peers: str, group: str, max_lag: int, as_json: bool, output: str, wait: float) -> None:
    """Is the group healthy? Exit 0 only when one leader is elected, a quorum answers and no
    member trails the leader's commit index by more than --max-lag entries; one line says
    why ("leader n1, term 7, 3/3 up, max lag 12 entries")."""
    output = json_alias(as_json, output) or "table"
    deadline = time.monotonic() + wait
    views = _views_once_ready(peers, group, deadline)
    verdict = assess(views, max_lag, _learners(views))
    while not verdict.ok and not _refused_by_all(views) and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        views = _views(peers, group)
        verdict = assess(views, max_lag, _learners(views))
    waited = ""
    if wait and not verdict.ok:
        waited = " (every member refuses: waiting cannot help)" if _refused_by_all(views) else \
            f" (after waiting {wait:g} s)"
    if output == "json":
        click.echo(json.dumps(verdict.as_json()))
    else:
        click.echo(verdict.line + waited)
        for p in verdict.problems[1:] if not verdict.ok else verdict.problems:
            click.echo(f"  {p}")
    sys.exit(0 if verdict.ok else 1)


@cli.command()
@peers_option()
@group_option()
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds between refreshes.")
@click.option("--iterations", "-n", default=0, type=click.IntRange(0), help="Stop after this many refreshes [never].")
@click.option("--metrics-port", default=0, type=click.IntRange(0),
              help="Every member serves metrics on this port of its host (metrics_port, one per machine): adds "
                   "MB/s and fsync latency.")
@click.option("--metrics-base-port", default=0, type=click.IntRange(0),
              help="Member K of --peers serves metrics on this port + K (as `dledger cluster --metrics-base-port` "
                   "on one machine).")
@security_options
def top(peers: str, group: str, interval: float, iterations: int, metrics_port: int, metrics_base_port: int) -> None:
    """A live view of the group, refreshed every second: per member role, term, end and commit
    index, lag behind the leader's commit, appends/s (and MB/s, fsync latency with metrics)."""
    from dledger.top import run

    if metrics_port and metrics_base_port:
        raise click.UsageError("give --metrics-port (one port on every host) or --metrics-base-port, not both")
    members = parse_peers(peers)
    urls = {m: f"http://{format_address(p.host, metrics_port or metrics_base_port + k)}/metrics"
            for k, (m, p) in enumerate(members.items())} if metrics_port or metrics_base_port else {}
    with make_client(peers, group, timeout=2.0) as c, contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: as q
        run(c, group, urls, interval, iterations or None)


@cli.command()
@peers_option()
@group_option()
@click.option("--to", "target", required=True, help="Member id to hand leadership to.")
@output_option("json")
@security_options
def transfer(peers: str, group: str, target: str, output: str) -> None:
    """Move leadership to member TO."""
    parse_peers(peers)
    with make_client(peers, group, timeout=10.0, role="admin") as c:
        if target not in c.peers:
            _known_members(c)  # a member added since --peers was written
        if target not in c.peers:
            raise ConfigError(f"--to {target}: not a member of {c.peers_string()}")
        c.transfer_leadership(target)
    emit([{"leader": target}], output, f"group {group}")


@cli.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--master", default=None,
              help="Spark master URL: run on Spark [default: in this process up to 256 MiB of records, "
                   "else on Spark local[*]].")
@click.option("--include-uncommitted", is_flag=True, help="Also compare entries past each member's committed index.")
@output_option(None, "text: each member's indexes, then 'agree up to index N' or the first divergence")
def audit(dirs: tuple[str, ...], master: str | None, include_uncommitted: bool, output: str | None) -> None:
    """Compare members' store directories (DIR...) offline, in process or on Spark.

    Prints the first divergence (exit code 1) or "agree up to index N"; with -o json one
    object (members with their records' bytes, agree_up_to, divergence or null), with -o
    table a row per member. Progress goes to stderr. Spark (small stores skip it) needs
    Java 17 (a JDK on PATH or JAVA_HOME).
    """
    import importlib.util

    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        raise click.ClickException("audit runs on Spark: pip install 'dledger[spark]' (and Java 17)")
    from dledger.spark.audit import main_audit

    try:
        code = main_audit(dirs, master, include_uncommitted, output)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    sys.exit(code)


@cli.command()
def demo() -> None:
    """Run the end-to-end demo (what `make demo` runs)."""
    from dledger.demo import run_demo

    sys.exit(run_demo())


@cli.group()
def store() -> None:
    """Inspect, repair, truncate, import or export a stopped member's store directory, offline."""


@store.command("inspect")
@click.option("--store-dir", required=True, help="The member's store directory.")
@output_option("json")
def store_inspect(store_dir: str, output: str) -> None:
    """Print the store's term, vote, log bounds and last entry's term, and its problems, as
    one JSON object. Reads only: safe beside a running member."""
    from dledger.store.admin import inspect

    emit_record(inspect(store_dir), output, f"store {store_dir}")


@store.command("repair-term")
@click.option("--store-dir", required=True, help="The member's store directory (the member must be stopped).")
@click.option("--term", type=int, default=None,
              help="The term to set [default: the last entry's term, the highest the log knows].")
@output_option("json")
def store_repair_term(store_dir: str, term: int | None, output: str) -> None:
    """Rewrite a damaged currterm (e.g. a term beyond 2**62-1) and clear the vote; print the change.

    Only for a damaged term: a member that voted in a term above its last entry's may
    vote in that term again after the repair.
    """
    from dledger.store.admin import repair_term

    emit_record(repair_term(store_dir, term), output, f"repaired store {store_dir}")


@store.command("truncate")
@click.option("--store-dir", required=True, help="The member's store directory (the member must be stopped).")
@click.option("--from-index", "from_index", type=int, required=True,
              help="The first entry to drop: entries before it are kept.")
@click.option("--force", is_flag=True, default=False,
              help="Also when it drops committed entries (the member must then be caught up by the leader).")
@output_option("json")
def store_truncate(store_dir: str, from_index: int, force: bool, output: str) -> None:
    """Drop the entries from --from-index on, and whatever damage follows them; print what was cut.

    What recovery's refusal message tells you to run for a damaged log: the member then fetches
    the dropped entries from the leader. Crash-safe (run it again after a crash). Refused at or
    below the committed index unless --force.
    """
    from dledger.store.tools import truncate

    result = truncate(store_dir, from_index, force)
    if "warning" in result:
        click.echo(f"WARNING: {result['warning']}", err=True)
    emit_record(result, output, f"truncated store {store_dir}")


@store.command("repair-checkpoint")
@click.option("--store-dir", required=True, help="The member's store directory (the member must be stopped).")
@output_option("json")
def store_repair_checkpoint(store_dir: str, output: str) -> None:
    """Move aside a checkpoint a member refuses to start on (unreadable, or claiming a committed
    index beyond the data) to checkpoint.unreadable-<time>, writing none; print what moved.

    Nothing is deleted. The member then opens as on a store without a checkpoint.
    """
    from dledger.store.tools import repair_checkpoint

    emit_record(repair_checkpoint(store_dir), output, f"repaired store {store_dir}")


@store.command("import")
@click.option("--store-dir", required=True, help="The member's store directory (the member must be stopped).")
@output_option("json")
def store_import(store_dir: str, output: str) -> None:
    """Fill the CRCs of records upstream DLedger wrote (their CRC fields are 0), so every record
    verifies from then on. Crash-safe and idempotent; needs free space for one copy of data/.
    """
    from dledger.store.tools import import_store

    emit_record(import_store(store_dir), output, f"imported store {store_dir}")


@store.command("export")
@click.option("--store-dir", required=True, help="The member's store directory (the member must be stopped).")
@click.option("--to", "to", required=True, help="A new or empty directory for the copy.")
@click.option("--dledger", "upstream", is_flag=True, required=True,
              help="Write what upstream DLedger (openmessaging/dledger) reads (the only form today).")
@click.option("--data-file-size", type=int, default=1 << 30, show_default=True,
              help="Upstream's mappedFileSizeForEntryData.")
@click.option("--index-file-size", type=int, default=32 * 5 * 1024 * 1024, show_default=True,
              help="Upstream's mappedFileSizeForEntryIndex.")
@output_option("json")
def store_export(store_dir: str, to: str, upstream: bool, data_file_size: int, index_file_size: int,
                 output: str) -> None:
    """Write an upstream-DLedger-readable copy of the store: same indexes, terms and bodies;
    SESSION records become NOOPs; files of upstream's sizes; currterm in Properties form.
    """
    from dledger.store.tools import export

    result = export(store_dir, to, data_file_size, index_file_size)
    if result.get("session_records_as_noop"):
        click.echo(f"note: {result['session_records_as_noop']} SESSION records (idempotent producers' markers, "
                   "which upstream cannot read) were written as NOOPs with an empty body", err=True)
    emit_record(result, output, f"exported store {store_dir}")


@cli.command()
@peers_option()
@group_option()
@click.option("--member", default=None, help="Only this member [default: every member].")
@output_option(None, "'MEMBER: snapshot through index N' lines")
@security_options
def snapshot(peers: str, group: str, member: str | None, output: str | None) -> None:
    """Make members snapshot their state machine now (each writes its own); print the index
    each snapshot covers (with -o: {"member","index"}); a member that fails is named on stderr."""
    parse_peers(peers)
    failed = []
    with make_client(peers, group, timeout=60.0, role="admin") as c, Rows(output or "json", f"group {group}") as rows:
        members = [member] if member else _known_members(c)
        for m in members:
            try:
                index = c.snapshot(m)
            except DLedgerError as e:
                failed.append(m)
                click.echo(f"{m}: {e}", err=True)
                continue
            if output is None:
                click.echo(f"{m}: snapshot through index {index}")
            else:
                rows.add({"member": m, "index": index})
    if failed:
        raise UserError(f"no snapshot on {', '.join(failed)}")


def _register_extra_commands() -> None:
    from dledger.bench.command import bench
    from dledger.broker.command import broker, send
    from dledger.compact_command import compact
    from dledger.controller.command import admin, controller
    from dledger.kv.command import kv
    from dledger.members_command import members
    from dledger.security.certs_command import certs

    cli.add_command(admin)
    cli.add_command(bench)
    cli.add_command(broker)
    cli.add_command(compact)
    cli.add_command(send)
    cli.add_command(controller)
    cli.add_command(certs)
    cli.add_command(kv)
    cli.add_command(members)


_register_extra_commands()


def main() -> None:
    """Entry point: every failure ends with one line on stderr (exit 1, 2 for a usage error),
    never a traceback (with -vv an unexpected one is logged before that line)."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `dledger` alone: the help text
            e.show()
        else:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            _error_line(f"{e.format_message()}{hint}")
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except (UserError, DLedgerError) as e:
        _error_line(str(e))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        os._exit(0)
    except OSError as e:  # the machine's, not ours: a file that cannot be read, …
        reason = e.strerror or str(e)
        _error_line(f"{e.filename}: {reason}" if e.filename is not None else reason)
        sys.exit(1)
    except Exception as e:
        if log.isEnabledFor(logging.DEBUG):
            log.exception("internal error")
        msg = " ".join(str(e).split())  # one line
        click.echo(f"dledger: internal error: {type(e).__name__}: {msg} (run with -vv for the traceback)", err=True)
        sys.exit(1)


def _error_line(message: str) -> None:
    click.echo(f"dledger: error: {' '.join(message.split())}", err=True)
