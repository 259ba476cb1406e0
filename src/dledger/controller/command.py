"""`dledger controller` (run a controller member) and `dledger admin` (ask the controller)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from dledger.clitools import (
    PEERS_HELP,
    F,
    check_store_dir,
    emit,
    json_alias,
    output_option,
    run_member,
    security,
    security_options,
    server_security_options,
)
from dledger.codes import ControllerResponseCode as RC
from dledger.config import DLedgerConfig
from dledger.controller import messages as m
from dledger.controller.admin_ops import broker_sets, controller_config
from dledger.controller.admin_tools import CONTROLLER_HELP, sync_state_data
from dledger.controller.admin_tools import ask as _ask
from dledger.controller.admin_tools import checked as _checked
from dledger.controller.admin_tools import json_line as _json
from dledger.controller.config import ControllerConfig, load_controller_toml, member_config
from dledger.members_command import JOIN_HELP, join_into
from dledger.membership import Membership


@click.command("controller")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file: member keys, and controller keys in a [controller] table.")
@click.option("--group", default=None, help="Raft group name [controller].")
@click.option("--id", "self_id", default=None, help="This controller's id, e.g. n0.")
@click.option("--peers", default=None, help=PEERS_HELP)
@click.option("--join", default=None, metavar="PEERS", help=JOIN_HELP)
@click.option("--store-dir", default=None, help="Directory of this controller's log and snapshots.")
@click.option("--peer-listen", default=None, help="Member-only addresses, peers format.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default=None)
@click.option("--store", "store_type", type=click.Choice(["file", "memory"]), default=None)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default=None, help="... on this address [127.0.0.1: it has no authentication].")
@click.option("--enable-elect-unclean-master", "unclean", is_flag=True, default=None,
              help="Elect a replica outside the SyncStateSet when none in it lives (may lose acknowledged data).")
@click.option("--enable-fault-injection", "fault_injection", is_flag=True, help="Obey FAULT requests (tests only).")
@server_security_options
def controller(config_file: str | None, group: str | None, self_id: str | None, peers: str | None,
               join: str | None, store_dir: str | None, peer_listen: str | None, flush: str | None,
               store_type: str | None, metrics_port: int | None, metrics_host: str | None, unclean: bool | None,
               fault_injection: bool) -> None:
    """Run one controller member (a Raft group electing masters for broker sets) until SIGINT/SIGTERM."""
    data: dict[str, Any] = {}
    ccfg = ControllerConfig()
    if config_file:
        data, ccfg = load_controller_toml(config_file)
    overrides = {"group": group, "self_id": self_id, "peers": peers, "store_dir": store_dir,
                 "peer_listen": peer_listen, "flush": flush, "store_type": store_type,
                 "metrics_port": metrics_port, "metrics_host": metrics_host, **security()}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if fault_injection:
        data["enable_fault_injection"] = True
    if unclean:
        ccfg.enable_elect_unclean_master = True
    # a new controller of a running controller group (docs/operations.md)
    joined = join_into(join, data, peers, "controller") if join is not None else None
    if "peers" not in data or "self_id" not in data:
        raise click.UsageError("give --config, or --id and --peers (or --join)")
    data.setdefault("store_dir", str(Path("data") / str(data.get("group", "controller")) / str(data["self_id"])))
    cfg = member_config(data)
    if cfg.store_type == "file":
        check_store_dir(Path(cfg.store_dir))
    _run(cfg, ccfg, joined)


def _run(cfg: DLedgerConfig, ccfg: ControllerConfig, joined: Membership | None = None) -> None:
    from dledger.controller.machine import ControllerStateMachine
    from dledger.controller.service import ControllerService
    from dledger.runtime.server import DLedgerServer

    async def serve(stop: asyncio.Event) -> None:
        machine = ControllerStateMachine()
        server = DLedgerServer(cfg, {cfg.group: machine}, {cfg.group: joined} if joined is not None else None)
        service = ControllerService(server, cfg.group, ccfg, machine)
        await server.start()
        try:
            await service.start()
            await stop.wait()
        finally:
            await service.stop()
            await server.stop()

    run_member(cfg, serve)


# --- admin -------------------------------------------------------------------------------------


@click.group()
def admin() -> None:
    """Ask the controller about broker sets, and steer them."""


def _as_json_too(f: F) -> F:
    """-o/--output, and the --json these commands had before it (kept: an alias of -o json)."""
    f = output_option(None, "text lines")(f)
    return click.option("--json", "as_json", is_flag=True, help="-o json.")(f)


@admin.command("controller-status")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@_as_json_too
@security_options
def controller_status(controllers: str, as_json: bool, output: str | None) -> None:
    """Every controller's view: who leads, its term and applied index (-o json: one object
    keyed by address, a view or why the controller did not answer)."""
    views = _ask(controllers, lambda c: c.metadata())
    output = json_alias(as_json, output)
    if output == "json":
        _json(views)
    elif output == "table":
        emit([_view_row(address, v) for address, v in views.items()], "table", "controllers")
    else:
        for address, v in views.items():
            click.echo(_view_line(address, v))


def _view_row(address: str, v: m.MetadataInfo | str) -> dict[str, object]:
    if isinstance(v, str):
        return {"address": address, "role": "unreachable", "error": v}
    return {"address": address, "id": v.self_id, "role": "leader" if v.is_leader else "follower", "term": v.term,
            "leader": v.controller_leader_id, "committed": v.committed_index, "applied": v.applied_index}


def _view_line(address: str, v: m.MetadataInfo | str) -> str:
    if isinstance(v, str):
        return f"{address}  unreachable: {v}"
    role = "LEADER" if v.is_leader else "follower"
    return (f"{address}  {v.self_id:<6} {role:<9} term {v.term:<5} leader {v.controller_leader_id or '-':<6}"
            f" committed {v.committed_index:<8} applied {v.applied_index}")


@admin.command("sync-state-set")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@click.option("--broker", required=True, help="Broker set (broker name).")
@_as_json_too
@security_options
def sync_state_set(controllers: str, broker: str, as_json: bool, output: str | None) -> None:
    """A broker set's master, epochs, in-sync and out-of-sync replicas with liveness."""
    info = sync_state_data(controllers, broker)
    output = json_alias(as_json, output)
    if output == "json":
        _json(info)
        return
    title = (f"broker set {broker}: master {info.master_broker_id} at {info.master_address or '-'}, "
             f"master epoch {info.master_epoch}, SyncStateSet epoch {info.sync_state_set_epoch}")
    sets = (("in sync", info.in_sync_replicas), ("not in sync", info.not_in_sync_replicas))
    if output == "table":
        emit([{"id": r.broker_id, "address": r.broker_address, "master": r.broker_id == info.master_broker_id,
               "in_sync": label == "in sync", "alive": r.alive} for label, replicas in sets for r in replicas],
             "table", title)
        return
    click.echo(title)
    for label, replicas in sets:
        for r in replicas:
            click.echo(f"  {label:<12} id {r.broker_id:<4} {r.broker_address:<24} {'alive' if r.alive else 'DEAD'}")


@admin.command("elect-master")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@click.option("--broker", required=True, help="Broker set (broker name).")
@click.option("--id", "broker_id", type=click.IntRange(1), default=None,
              help="Make this replica master (it must be alive and in the SyncStateSet).")
@output_option(None, "one line")
@security_options
def elect_master(controllers: str, broker: str, broker_id: int | None, output: str | None) -> None:
    """Elect a master for a broker set now (the best live in-sync replica, or --id); with -o:
    {"broker","elected" (false: the master stayed),"master_broker_id",...}."""
    if broker_id is None:
        resp = _ask(controllers, lambda c: c.elect_master(broker), "admin")
    else:
        resp = _ask(controllers, lambda c: c.elect_master(broker, broker_id, designate=True), "admin")
    _checked(resp, (RC.SUCCESS, RC.CONTROLLER_MASTER_STILL_EXIST))
    if output is not None:
        emit([{"broker": broker, "elected": resp.code == RC.SUCCESS, "master_broker_id": resp.master_broker_id,
               "master_address": resp.master_address, "master_epoch": resp.master_epoch,
               "sync_state_set": resp.sync_state_set}], output)
        return
    what = "elected" if resp.code == RC.SUCCESS else "still master"
    click.echo(f"broker set {broker}: {what} {resp.master_broker_id} at {resp.master_address}, "
               f"master epoch {resp.master_epoch}, SyncStateSet {resp.sync_state_set}")


@admin.command("clean-broker")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@click.option("--broker", required=True, help="Broker set (broker name).")
@click.option("--ids", default="", help="Replica ids to forget, e.g. 2,3 (default: the whole broker set).")
@click.option("--clean-living-broker", is_flag=True, help="Also forget replicas that are alive.")
@output_option(None, "one line")
@security_options
def clean_broker(controllers: str, broker: str, ids: str, clean_living_broker: bool, output: str | None) -> None:
    """Forget dead replicas of a broker set, or the whole set (with -o: {"broker","ids","whole_set"})."""
    try:
        id_list = [int(p) for p in ids.replace(";", ",").split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{ids!r}: give ids as 1,2,3", param_hint="--ids") from None
    _checked(_ask(controllers, lambda c: c.clean_broker_data(broker, id_list, clean_living_broker=clean_living_broker),
                  "admin"))
    if output is not None:
        emit([{"broker": broker, "ids": id_list, "whole_set": not id_list}], output)
        return
    click.echo(f"broker set {broker}: {'replicas ' + ','.join(map(str, id_list)) if id_list else 'all'} cleaned")


admin.add_command(broker_sets)
admin.add_command(controller_config)
