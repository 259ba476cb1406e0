"""What the operator commands share (`dledger admin ...`, `dledger broker status`): asking the
controllers with the command's credentials, turning a refusal into one line with its code,
and a broker set's replicas as the controllers see them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import msgspec

from dledger.clitools import UserError, client_tls, client_token
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError
from dledger.config import ConfigError
from dledger.controller import messages as m
from dledger.controller.client import ControllerClient

T = TypeVar("T")

CONTROLLER_HELP = "Controllers: 'host:port;host:port' or their peers string."


def ask(controllers: str, call: Callable[[ControllerClient], Awaitable[T]], role: str = "client") -> T:
    """`call` on a client of `controllers`; `role`: the certificate (--tls-dir) or token this
    request needs: admin to steer."""
    tls, token = client_tls(role), client_token(role)

    async def run() -> T:
        async with ControllerClient(controllers, tls=tls, auth_token=token) as c:
            return await call(c)

    try:
        return asyncio.run(run())
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    except DLedgerError as e:
        raise UserError(f"no controller answered: {e.message}") from e


def code_name(code: int) -> str:
    """A controller answer's code by name (RocketMQ's; 430 UNAUTHENTICATED is ours)."""
    if code in RC._value2member_map_:
        return RC(code).name
    from dledger.codes import ResponseCode

    return ResponseCode(code).name if code in ResponseCode._value2member_map_ else str(code)


def refusal(resp: m.Response) -> str:
    return f"{code_name(resp.code)} ({resp.code}): {resp.remark}"


def checked(resp: m.Response, ok: tuple[int, ...] = (RC.SUCCESS,)) -> m.Response:
    if resp.code not in ok:
        raise UserError(refusal(resp))
    return resp


def json_line(obj: Any) -> None:
    """A struct as one JSON line (keys sorted): -o json prints JSON lines everywhere."""
    click.echo(json.dumps(msgspec.to_builtins(obj), sort_keys=True))


def replicas(info: m.ReplicasInfo) -> list[dict[str, Any]]:
    """A set's replicas by id: address, in the SyncStateSet, alive per the controller's heartbeats."""
    out = [{"broker_id": r.broker_id, "address": r.broker_address, "in_sync": in_sync, "alive": r.alive,
            "master": r.broker_id == info.master_broker_id}
           for in_sync, group in ((True, info.in_sync_replicas), (False, info.not_in_sync_replicas)) for r in group]
    return sorted(out, key=lambda r: r["broker_id"])


def sync_state_data(controllers: str, broker: str) -> m.ReplicasInfo:
    """One broker set as the controllers hold it (UserError 2008 when they hold none of that name)."""
    resp = checked(ask(controllers, lambda c: c.get_sync_state_data([broker])))
    info = (resp.replicas_info or {}).get(broker)
    if info is None:
        raise UserError(f"CONTROLLER_BROKER_METADATA_NOT_EXIST ({int(RC.CONTROLLER_BROKER_METADATA_NOT_EXIST)}): "
                        f"no broker set {broker!r}")
    return info
