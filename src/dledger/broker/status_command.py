"""`dledger broker status`: each replica of a broker set as it sees itself (role, master epoch,
offsets, truncation, epoch entries; a master's slaves with their acks and lag), beside what
the controllers say of it (in the SyncStateSet, alive). What mqadmin's getBrokerEpoch and a
broker's runtime info show, from one command (docs/brokers.md, "Operating broker sets")."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from dledger.broker import messages as bm
from dledger.broker.client import AsyncBrokerClient
from dledger.broker.config import split_address
from dledger.clitools import client_tls, emit, output_option, security_options
from dledger.codes import DLedgerError
from dledger.controller.admin_tools import CONTROLLER_HELP, replicas, sync_state_data
from dledger.security.tls import TlsConfig


@click.command("status")
@click.option("--controller", "controllers", required=True, help=CONTROLLER_HELP)
@click.option("--broker", "broker_name", required=True, help="Broker set name.")
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds to wait for each replica.")
@output_option("table")
@security_options
def status(controllers: str, broker_name: str, timeout: float, output: str) -> None:
    """Each replica of a broker set: role, master epoch, max and confirm offsets,
    truncated_at, epoch entries and, on the master, each slave's ack offset and lag (-o json:
    one object a replica; one that does not answer has "role": "unreachable" and "error")."""
    known = replicas(sync_state_data(controllers, broker_name))
    records = asyncio.run(_ask_replicas(controllers, broker_name, known, timeout, client_tls()))
    if output == "json":
        emit(records, "json")
        return
    emit([_row(r) for r in records], "table", f"broker set {broker_name}")


async def _ask_replicas(controllers: str, broker: str, known: list[dict[str, Any]], timeout: float,
                        tls: TlsConfig | None) -> list[dict[str, Any]]:
    async with AsyncBrokerClient(controllers, broker, timeout, tls) as c:
        return list(await asyncio.gather(*(_one(c, r) for r in known)))


async def _one(c: AsyncBrokerClient, r: dict[str, Any]) -> dict[str, Any]:
    out = {"broker_id": r["broker_id"], "address": split_address(r["address"])[0], "alive": r["alive"],
           "in_sync": r["in_sync"]}
    try:
        info = await c.info(out["address"])
        epochs = await c.epoch_cache(out["address"])
    except DLedgerError as e:
        return {**out, "role": "unreachable", "error": str(e)}
    return {**out, **replica_record(info, epochs)}


def replica_record(info: bm.RuntimeInfo, epochs: bm.EpochCache) -> dict[str, Any]:
    """What a replica says of itself, as -o json prints it."""
    return {"role": info.role, "master_epoch": info.master_epoch, "master_broker_id": info.master_id,
            "max_offset": info.max_offset, "confirm_offset": info.confirm_offset, "truncated_at": info.truncated_at,
            "begin_index": info.begin_index, "end_index": info.end_index, "confirmed_index": info.confirmed_index,
            "sync_state_set": info.sync_state_set, "sync_state_set_epoch": info.sync_state_set_epoch,
            "lease_ms_left": info.lease_ms_left,
            "slaves": [{"broker_id": s.broker_id, "ack_offset": s.ack_offset, "lag": s.lag, "in_sync": s.in_sync}
                       for s in info.slaves],
            "epochs": [{"epoch": e.epoch, "start_offset": e.start_offset, "end_offset": e.end_offset}
                       for e in epochs.epochs]}


def _row(r: dict[str, Any]) -> dict[str, object]:
    row: dict[str, object] = {"id": r["broker_id"], "address": r["address"], "alive": r["alive"],
                              "role": r["role"]}
    if "error" in r:
        return {**row, "error": r["error"]}
    return {**row, "epoch": r["master_epoch"], "max": r["max_offset"], "confirm": r["confirm_offset"],
            "truncated_at": r["truncated_at"],
            "slaves (ack, lag)": [f"{s['broker_id']}: {s['ack_offset']}, lag {s['lag']}" for s in r["slaves"]],
            "epochs": [f"{e['epoch']}: {e['start_offset']}-{e['end_offset']}" for e in r["epochs"]]}
