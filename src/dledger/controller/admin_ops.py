"""`dledger admin broker-sets` and `dledger admin controller-config get|set`: what upstream's
mqadmin shows of the controllers (getSyncStateSet over a cluster, getControllerConfig,
updateControllerConfig), with -o json|table (docs/brokers.md, "Operating broker sets")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import click

from dledger.clitools import UserError, emit, output_option, security_options
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError
from dledger.config_aliases import CONTROLLER_ALIASES
from dledger.controller import messages as m
from dledger.controller.admin_tools import CONTROLLER_HELP, ask, checked, refusal, replicas
from dledger.controller.client import ControllerClient


@click.command("broker-sets")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@output_option("table")
@security_options
def broker_sets(controllers: str, output: str) -> None:
    """Every broker set the controllers hold: its master (id, address, epoch), SyncStateSet
    and its epoch, and each replica, in sync or not, alive or not by the leader's heartbeats
    (-o json: one object a set)."""
    resp = checked(ask(controllers, lambda c: c.all_sync_state_data()))
    sets = sorted((resp.replicas_info or {}).items())
    if output == "json":
        emit([set_record(name, info) for name, info in sets], "json")
        return
    emit([_set_row(name, info) for name, info in sets], "table", "broker sets")


def set_record(name: str, info: m.ReplicasInfo) -> dict[str, Any]:
    return {"broker": name, "master_broker_id": info.master_broker_id, "master_address": info.master_address,
            "master_epoch": info.master_epoch, "sync_state_set": [r.broker_id for r in info.in_sync_replicas],
            "sync_state_set_epoch": info.sync_state_set_epoch, "replicas": replicas(info)}


def _set_row(name: str, info: m.ReplicasInfo) -> dict[str, object]:
    return {"broker": name, "master": info.master_broker_id, "master address": info.master_address,
            "master epoch": info.master_epoch,
            "SyncStateSet": ",".join(str(r.broker_id) for r in info.in_sync_replicas),
            "SyncStateSet epoch": info.sync_state_set_epoch,
            "replicas": [f"{r['broker_id']} {r['address']} {'alive' if r['alive'] else 'DEAD'}"
                         for r in replicas(info)]}


# --- controller-config ---------------------------------------------------------------------


@click.group("controller-config")
def controller_config() -> None:
    """Read or change each controller's runtime config (the [controller] keys; admin role).
    Each controller keeps its own: `set` changes every controller given, until it restarts."""


Answers = dict[str, m.Response | str]


def _each(controllers: str, call: Callable[[ControllerClient, str], Awaitable[m.Response]]) -> Answers:
    """`call` at every controller listed (admin credentials): its answer, or why none came."""
    async def all_of(c: ControllerClient) -> Answers:
        async def one(address: str) -> m.Response | str:
            try:
                return await call(c, address)
            except DLedgerError as e:
                return e.message

        return dict(zip(c.addresses, await asyncio.gather(*(one(a) for a in c.addresses)), strict=True))

    return ask(controllers, all_of, "admin")


def _fail_on_refusals(answers: Answers) -> None:
    """Exit 1 naming each controller that refused or did not answer, with the code."""
    bad = {a: r if isinstance(r, str) else refusal(r) for a, r in answers.items()
           if isinstance(r, str) or r.code != RC.SUCCESS}
    if len(bad) == len(answers) > 1 and len(set(bad.values())) == 1:
        raise UserError(f"every controller: {next(iter(bad.values()))}")
    if bad:
        raise UserError("; ".join(f"{a}: {why}" for a, why in bad.items()))


def parse_properties(text: str) -> dict[str, object]:
    """`key=value` lines as a dict (true/false and integers typed, as the config holds them)."""
    out: dict[str, object] = {}
    for line in text.splitlines():
        key, sep, value = (p.strip() for p in line.partition("="))
        if not sep or not key:
            continue
        out[key] = value == "true" if value in ("true", "false") else int(value) if value.lstrip("-").isdigit() \
            else value
    return out


@controller_config.command("get")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@output_option("table")
@security_options
def config_get(controllers: str, output: str) -> None:
    """Each controller's runtime config (-o json: {"controller","config"} a controller; -o
    table: a row a key, a column a controller)."""
    answers = _each(controllers, lambda c, a: c.get_controller_config(a))
    got = {a: parse_properties(r.properties or "") for a, r in answers.items()
           if not isinstance(r, str) and r.code == RC.SUCCESS}
    if output == "json":
        emit([{"controller": a, "config": cfg} for a, cfg in got.items()], "json")
    elif got:
        keys = list(dict.fromkeys(k for cfg in got.values() for k in cfg))
        emit([{"key": k, **{a: cfg.get(k) for a, cfg in got.items()}} for k in keys], "table", "controller config")
    _fail_on_refusals(answers)


@controller_config.command("set")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@click.argument("settings", nargs=-1, required=True)
@output_option("table")
@security_options
def config_set(controllers: str, settings: tuple[str, ...], output: str) -> None:
    """Set KEY=VALUE at every controller given (ours, e.g. scan_interval_ms=500, or
    upstream's name, e.g. scanNotActiveBrokerInterval=500). An unknown key or a bad value
    changes nothing (2005, naming it); black-listed keys are refused 16; without the admin
    role 430."""
    for s in settings:
        if "=" not in s or not s.partition("=")[0].strip():
            raise click.BadParameter(f"{s!r}: give KEY=VALUE", param_hint="SETTINGS")
    properties = "".join(f"{s}\n" for s in settings)
    answers = _each(controllers, lambda c, a: c.update_controller_config(a, properties))
    done = [a for a, r in answers.items() if not isinstance(r, str) and r.code == RC.SUCCESS]
    updated = {CONTROLLER_ALIASES.get(k, k): v for k, v in parse_properties(properties).items()}
    if done:
        emit([{"controller": a, "updated": updated} for a in done], output, "controller config updated")
    _fail_on_refusals(answers)
