"""`dledger broker` (run a replica of a broker set) and `dledger send` (to a broker set)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import click

from dledger.broker.config import BrokerConfig, load_broker_toml
from dledger.broker.status_command import status
from dledger.clitools import (
    Rows,
    check_store_dir,
    client_tls,
    lines_only,
    output_option,
    security,
    security_options,
    server_security_options,
)

log = logging.getLogger(__name__)

CONTROLLER_HELP = "Controllers: 'host:port;host:port' or their peers string."


@click.group("broker", invoke_without_command=True)
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file with the same keys (top level or a [broker] table).")
@click.option("--cluster", default=None, help="Cluster name.")
@click.option("--name", default=None, help="Broker set name, e.g. b0 (its replicas share it).")
@click.option("--controller", default=None, help=CONTROLLER_HELP)
@click.option("--listen", default=None, help="Client address host:port.")
@click.option("--ha-listen", default=None, help="HA (replication) address host:port.")
@click.option("--store-dir", default=None, help="Directory of this replica's log, epoch file and identity.")
@click.option("--in-sync-replicas", type=click.IntRange(1), default=None,
              help="Copies a send waits for, the master counting [1].")
@click.option("--min-in-sync-replicas", type=click.IntRange(1), default=None,
              help="Refuse sends while the SyncStateSet is smaller [1].")
@click.option("--all-ack-in-sync-state-set", "all_ack", is_flag=True, default=None,
              help="A send waits for every SyncStateSet member.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default=None,
              help="sync: a send also waits for its fsync on the master [async].")
@click.option("--election-priority", type=click.IntRange(0), default=None, help="Lower is preferred.")
@click.option("--enable-fault-injection", "fault_injection", is_flag=True, default=None,
              help="Obey FAULT requests (isolate from controllers, pause HA): tests and chaos runs only.")
@server_security_options
@click.pass_context
def broker(ctx: click.Context, /, config_file: str | None, **options: Any) -> None:
    """Run one replica of a broker set until SIGINT/SIGTERM (its master is elected by the
    controllers); `dledger broker status` shows a set's replicas."""
    if ctx.invoked_subcommand is not None:
        return
    data: dict[str, Any] = load_broker_toml(config_file) if config_file else {}
    options["all_ack_in_sync_state_set"] = options.pop("all_ack")
    options["enable_fault_injection"] = options.pop("fault_injection")
    sec = security()
    if any(sec.pop(k, None) for k in ("auth_token", "client_token", "admin_token")):
        raise click.UsageError("brokers take TLS (--tls-cert/--tls-key/--tls-ca) or --insecure, not tokens")
    options.update(sec)
    data.update({k: v for k, v in options.items() if v is not None})
    cfg = BrokerConfig.from_dict(data)
    check_store_dir(Path(cfg.store_dir))
    _run(cfg)


broker.add_command(status)


def _run(cfg: BrokerConfig) -> None:
    from dledger.broker.server import BrokerServer
    from dledger.clitools import run_process, socket_os_error

    async def serve(stop: asyncio.Event) -> None:
        server = BrokerServer(cfg)
        await server.start()
        try:
            await stop.wait()
        finally:
            await server.stop()

    run_process(serve, socket_os_error)


@click.command("send")
@click.option("--controller", required=True, help=CONTROLLER_HELP)
@click.option("--broker", "broker_name", required=True, help="Broker set name.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="Send stdin lines in batches of this many records.")
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(0.1))
@click.argument("bodies", nargs=-1)
@output_option("json")
@security_options
def send(controller: str, broker_name: str, batch: int, timeout: float, bodies: tuple[str, ...],
         output: str) -> None:
    """Send one record per BODY, or per stdin line, to a broker set's master; print
    {"offset","index","epoch"} per record once acknowledged."""
    from dledger.broker.client import BrokerClient
    from dledger.clitools import body_chunks

    with (BrokerClient(controller, broker_name, timeout, tls=client_tls()) as c,
          Rows(output, f"sent to broker set {broker_name}") as rows):
        for chunk in body_chunks(bodies, batch):
            for r in c.send_batch(chunk):
                rows.add({"offset": r.offset, "index": r.index, "epoch": r.epoch})  # JSON: as each is acknowledged


def read_broker(controller: str, broker_name: str, from_offset: int, max_entries: int, follow: bool,
                output: str = "json", b64: bool = False) -> None:
    """`dledger read --controller P --broker b0`: confirmed records as JSON lines (or, not
    following, a table); bodies as `read`'s (base64 text with `b64`)."""
    from dledger.broker.client import BrokerClient
    from dledger.clitools import body_json

    with (BrokerClient(controller, broker_name, tls=client_tls()) as c,
          Rows(lines_only(follow, output), f"broker set {broker_name}") as rows):
        records = c.subscribe(from_offset) if follow else c.read(from_offset, max_entries)
        for r in records:
            rows.add({"index": r.index, "offset": r.offset, "epoch": r.epoch, "body": body_json(r.body, b64)},
                     flush=follow)


__all__ = ["broker", "read_broker", "send"]
