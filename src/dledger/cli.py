"""The `dledger` command (SPEC §5).

User mistakes (bad peers string, unreachable cluster, missing config) end with
one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click

from dledger.codes import DLedgerError, ResponseCode
from dledger.config import ConfigError, DLedgerConfig, Peer, format_peers, parse_peers
from dledger.local_cluster import local_cluster

log = logging.getLogger(__name__)

PEERS_HELP = "Members, as 'n0-127.0.0.1:20911;n1-127.0.0.1:20912;…'."


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """dledger: a Raft-replicated commit log."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# --- members -------------------------------------------------------------------------------


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML configuration file.")
@click.option("--group", default=None, help="Group name [default].")
@click.option("--id", "self_id", default=None, help="This member's id, e.g. n0.")
@click.option("--peers", default=None, help=PEERS_HELP)
@click.option("--store-dir", default=None, help="Directory of this member's store.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default=None)
@click.option("--store", "store_type", type=click.Choice(["file", "memory"]), default=None)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--preferred-leader", "preferred", default=None, help="Preferred leader ids, comma separated.")
@click.option("--enable-fault-injection", "fault_injection", is_flag=True,
              help="Obey FAULT requests (cut links on a client's word): for tests and chaos runs only.")
def server(config_file: str | None, group: str | None, self_id: str | None, peers: str | None,
           store_dir: str | None, flush: str | None, store_type: str | None, metrics_port: int | None,
           preferred: str | None, fault_injection: bool) -> None:
    """Run one member until SIGINT/SIGTERM."""
    data: dict[str, object] = {}
    if config_file:
        data.update(vars(DLedgerConfig.from_toml(config_file)))
    overrides = {"group": group, "self_id": self_id, "peers": peers, "store_dir": store_dir, "flush": flush,
                 "store_type": store_type, "metrics_port": metrics_port}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if preferred is not None:
        data["preferred_leader_ids"] = [p for p in preferred.split(",") if p]
    if fault_injection:
        data["enable_fault_injection"] = True
    if "peers" not in data or "self_id" not in data:
        raise click.UsageError("give --config, or --id and --peers")
    if "store_dir" not in data:
        data["store_dir"] = str(Path("data") / str(data.get("group", "default")) / str(data["self_id"]))
    cfg = DLedgerConfig.from_dict(data)
    _run_member(cfg)


def _run_member(cfg: DLedgerConfig) -> None:
    from dledger.runtime.server import serve_forever
    from dledger.runtime.transport import install_uvloop

    install_uvloop()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_forever(cfg, stop)

    asyncio.run(main())


@cli.command()
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 9))
@click.option("--group", default="default", show_default=True)
@click.option("--base-port", default=20911, show_default=True, type=click.IntRange(1024, 65000))
@click.option("--data-dir", default="./data", show_default=True, type=click.Path(file_okay=False))
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True)
@click.option("--store", "store_type", type=click.Choice(["file", "memory"]), default="file", show_default=True)
@click.option("--metrics-base-port", type=int, default=0, help="Member nK serves metrics on this port + K.")
def cluster(nodes: int, group: str, base_port: int, data_dir: str, flush: str, store_type: str,
            metrics_base_port: int) -> None:
    """Run a local group as N member processes until SIGINT/SIGTERM."""
    peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", base_port + k) for k in range(nodes)})
    with local_cluster(peers, group, Path(data_dir), flush, store_type, metrics_base_port) as procs:
        click.echo(f"peers: {peers}", nl=True)
        sys.stdout.flush()
        stop = {"flag": False}

        def on_signal(signum: int, frame: object) -> None:
            stop["flag"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop["flag"]:
            for member, p in procs.items():
                if p.poll() is not None:
                    click.echo(f"member {member} exited with code {p.returncode}", err=True)
                    procs.pop(member)
                    break
            time.sleep(0.2)


# --- clients -------------------------------------------------------------------------------------


def _client(peers: str, group: str, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    from dledger.runtime.client import DLedgerClient

    return DLedgerClient(peers, group, timeout)


@cli.command()
@click.option("--peers", required=True, help=PEERS_HELP)
@click.option("--group", default="default", show_default=True)
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 100000),
              help="Send stdin lines in batches of this many entries.")
@click.argument("bodies", nargs=-1)
def append(peers: str, group: str, batch: int, bodies: tuple[str, ...]) -> None:
    """Append one entry per BODY, or per stdin line; print {"index","term","pos"} per entry."""
    parse_peers(peers)
    source: Iterator[str] = iter(bodies) if bodies else (line.rstrip("\n") for line in sys.stdin)
    with _client(peers, group) as c:
        chunk: list[bytes] = []
        for text in source:
            chunk.append(text.encode())
            if len(chunk) >= batch:
                _append_chunk(c, chunk)
                chunk = []
        if chunk:
            _append_chunk(c, chunk)


def _append_chunk(c: object, chunk: list[bytes]) -> None:
    for r in c.append_batch(chunk):  # type: ignore[attr-defined]
        click.echo(json.dumps({"index": r.index, "term": r.term, "pos": r.pos}))


@cli.command()
@click.option("--peers", required=True, help=PEERS_HELP)
@click.option("--group", default="default", show_default=True)
@click.option("--index", required=True, type=click.IntRange(0))
def get(peers: str, group: str, index: int) -> None:
    """Print the committed body at INDEX, raw."""
    parse_peers(peers)
    with _client(peers, group) as c:
        e = c.get(index)
    sys.stdout.buffer.write(e.body)
    sys.stdout.flush()


@cli.command()
@click.option("--peers", required=True, help=PEERS_HELP)
@click.option("--group", default="default", show_default=True)
@click.option("--from", "from_index", default=0, show_default=True, type=click.IntRange(0))
@click.option("--max", "max_entries", default=1000, show_default=True, type=click.IntRange(1))
def read(peers: str, group: str, from_index: int, max_entries: int) -> None:
    """Print committed entries as JSON lines {"index","term","body"}."""
    parse_peers(peers)
    with _client(peers, group) as c:
        for e in c.read(from_index, max_entries):
            click.echo(json.dumps({"index": e.index, "term": e.term, "body": _body_json(e.body)}))


def _body_json(body: bytes) -> object:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(body).decode()}


@cli.command()
@click.option("--peers", required=True, help=PEERS_HELP)
@click.option("--group", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object keyed by member id.")
def status(peers: str, group: str, as_json: bool) -> None:
    """Each member's role, term, leader, ledger end and committed index, and what is wrong
    with it (a store that cannot write, retention held back by a lagging member)."""
    members = parse_peers(peers)
    out: dict[str, dict[str, object]] = {}
    with _client(peers, group, timeout=2.0) as c:
        for m in members:
            try:
                v = c.metadata(m)
                out[m] = {"role": v.role, "term": v.term, "leader": v.leader_id,
                          "ledger_end_index": v.ledger_end_index, "committed_index": v.committed_index}
                if v.store_error:
                    out[m]["store_error"] = v.store_error
                if v.retention_held_by:
                    out[m]["retention_held_by"] = v.retention_held_by
            except DLedgerError as e:
                out[m] = {"role": "unreachable", "error": e.message}
    if as_json:
        click.echo(json.dumps(out))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"group {group}")
        for col in ("member", "role", "term", "leader", "ledger_end_index", "committed_index", "problem"):
            table.add_column(col)
        for m, v in out.items():
            problem = "; ".join(str(v[k]) for k in ("error", "store_error", "retention_held_by") if k in v)
            table.add_row(m, *(str(v.get(k, "")) for k in ("role", "term", "leader", "ledger_end_index",
                                                           "committed_index")), problem)
        Console().print(table)
    if all(v["role"] == "unreachable" for v in out.values()):
        # an unreachable cluster is an error (SPEC §5), with --json too
        raise DLedgerError(ResponseCode.NETWORK_ERROR, f"no member of group {group} answered")


@cli.command()
@click.option("--peers", required=True, help=PEERS_HELP)
@click.option("--group", default="default", show_default=True)
@click.option("--to", "target", required=True, help="Member id to hand leadership to.")
def transfer(peers: str, group: str, target: str) -> None:
    """Move leadership to member TO."""
    if target not in parse_peers(peers):
        raise ConfigError(f"--to {target}: not a member of {peers}")
    with _client(peers, group, timeout=10.0) as c:
        c.transfer_leadership(target)
        click.echo(json.dumps({"leader": target}))


@cli.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--include-uncommitted", is_flag=True, help="Also compare entries past each member's committed index.")
def audit(dirs: tuple[str, ...], master: str, include_uncommitted: bool) -> None:
    """Compare members' store directories (DIR...) offline on Spark.

    Prints the first divergence (exit code 1) or "agree up to index N".
    """
    import importlib.util

    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        raise click.ClickException("audit runs on Spark: pip install 'dledger[spark]' (and Java 17)")
    from dledger.spark.audit import main_audit

    try:
        code = main_audit(dirs, master, include_uncommitted)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    sys.exit(code)


@cli.command()
def demo() -> None:
    """Run the end-to-end demo (what `make demo` runs)."""
    from dledger.demo import run_demo

    sys.exit(run_demo())


def _register_extra_commands() -> None:
    from dledger.bench.command import bench

    cli.add_command(bench)


_register_extra_commands()


def main() -> None:
    """Entry point: user mistakes end with one line on stderr, never a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except DLedgerError as e:
        click.echo(f"dledger: error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        os._exit(0)
