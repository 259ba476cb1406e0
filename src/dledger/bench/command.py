"""The `dledger bench` command: options, local group start-up, progress and report."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from dledger.bench.load import LoadResult, LoadSpec, plot, run_load, run_load_procs
from dledger.clitools import group_option, output_option, peers_option
from dledger.config import Peer, format_peers, parse_peers
from dledger.local_cluster import local_cluster
from dledger.ports import free_port_run

console = Console()


# options of the local group bench starts itself: beside --peers/DLEDGER_PEERS they would do nothing
LOCAL_ONLY = ("nodes", "flush", "base_port", "tls")


@click.command("bench")
@peers_option(required=False, extra=" Bench this running group; without it (and without DLEDGER_PEERS) bench "
                                    "starts a local group of its own.")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 9), help="Members of a local group.")
@click.option(
    "--flush",
    type=click.Choice(["async", "sync"]),
    default="async",
    show_default=True,
    help="Flush mode of the local group.",
)
@group_option()
@click.option("--clients", default=16, show_default=True, type=click.IntRange(1, 4096),
              help="Concurrent requesters, each with one request in flight.")
@click.option("--conns", default=0, type=click.IntRange(0, 4096),
              help="Connections the clients share (as etcd's benchmark --conns) [one per client].")
@click.option("--size", default=1024, show_default=True, type=click.IntRange(0, 4 << 20), help="Body bytes.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="Bodies per request (a member takes at most 10,000).")
@click.option("--duration", default=10.0, show_default=True, type=click.FloatRange(0.1), help="Seconds.")
@click.option("--count", default=0, type=click.IntRange(0), help="Stop after this many entries instead.")
@click.option("--rate", default=0.0, type=click.FloatRange(0), help="Open loop: target entries/s.")
@click.option(
    "--procs",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Load processes; the clients (and --rate/--count) are divided among them.",
)
@click.option("--warmup", default=1.0, show_default=True, type=click.FloatRange(0))
@click.option("--base-port", default=0, type=int, help="Ports of the local group (default: free ones).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write results as JSON.")
@output_option("table")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), help="Throughput/latency PNG.")
@click.option("--tls", is_flag=True, help="Run the local group and the clients with mutual TLS (certificates made "
                                        "for the run).")
@click.option("--tls-dir", default=None, envvar="DLEDGER_TLS_DIR", type=click.Path(file_okay=False),
              help="A running group's `dledger certs` directory (or DLEDGER_TLS_DIR): its clients use client.pem.")
@click.option("--failover", "failover", default=0, type=click.IntRange(0),
              help="SIGKILL the local group's leader this many times under the load, restarting it after each: "
                   "time to elect and to the next acknowledged append per kill, their median and p99, the "
                   "leaders' worst event-loop stall and the false elections. --duration is then the seconds of "
                   "load before each kill (and after the restarted member rejoined).")
@click.option("--member-config", default=None, type=click.Path(exists=True, dir_okay=False),
              help="A TOML configuration every member of the local group is started with (`dledger server "
                   "--config`): e.g. other heartbeat and election timers, compared side by side.")
@click.option("--idempotent", is_flag=True, help="Each connection's client appends as an idempotent producer (one "
                                                 "request in flight per producer; concurrent appends coalesce).")
def bench(
    peers: str | None,
    nodes: int,
    flush: str,
    group: str,
    clients: int,
    conns: int,
    size: int,
    batch: int,
    duration: float,
    count: int,
    rate: float,
    procs: int,
    warmup: float,
    base_port: int,
    json_path: str | None,
    output: str,
    plot_path: str | None,
    tls: bool,
    tls_dir: str | None,
    idempotent: bool,
    failover: int,
    member_config: str | None,
) -> None:
    """Load generator: entries/s, MB/s, requests/s, latency percentiles, errors by code; the
    summary as a table, or with -o json the report --json writes, as one line on stdout.

    Benches the group of --peers (or DLEDGER_PEERS), else starts a local group of its own;
    the first line on stderr says which. With --failover N it kills that local group's leader
    N times under the load and reports the failover times instead (docs/performance.md)."""
    if procs > clients:
        raise click.UsageError("--procs must not exceed --clients")
    if failover:
        _check_failover_options(click.get_current_context(), peers)
    if peers is not None:
        _refuse_local_options(click.get_current_context())
        parse_peers(peers)
    from dledger.runtime.transport import install_uvloop

    install_uvloop()
    spec = LoadSpec(peers or "", group, clients, size, batch, duration, count, rate, warmup, conns,
                    idempotent=idempotent)
    if peers is not None:
        spec.tls_dir = tls_dir or ""
        # said first: with DLEDGER_PEERS exported, bench no longer starts a group of its own
        click.echo(f"bench: against {_peers_source(click.get_current_context())} {peers} (group {group})", err=True)
        result = _run(spec, procs)
        label = "external group"
    else:
        port = base_port or free_port_run(nodes)
        spec.peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(nodes)})
        click.echo(f"bench: starting a local group of {nodes} member(s) on 127.0.0.1:{port}"
                   f"{f'..{port + nodes - 1}' if nodes > 1 else ''}, flush={flush}{', TLS' if tls else ''} "
                   "(--peers or DLEDGER_PEERS: bench a running group instead)", err=True)
        if failover:
            _bench_failover(spec, failover, nodes, flush, output, json_path, member_config)
            return
        with tempfile.TemporaryDirectory(prefix="dledger-bench-") as d:
            own_certs = None
            if tls:
                from dledger.security.certs import make_certs

                own_certs = Path(d) / "certs"
                make_certs(own_certs, [f"n{k}" for k in range(nodes)])
                spec.tls_dir = str(own_certs)
            with local_cluster(spec.peers, group, Path(d), flush=flush, tls_dir=own_certs):
                result = _run(spec, procs)
        label = f"local {nodes} members, flush={flush}{', TLS' if tls else ''}"
    report = result.report()
    report["config"] = {
        "target": label,
        "clients": clients,
        "conns": conns or clients,
        "size": size,
        "batch": batch,
        "rate": rate,
        "duration": duration,
        "count": count,
        "procs": procs,
        "idempotent": idempotent,
    }
    _emit(report, output, json_path, _print)
    if plot_path:
        plot(result, plot_path, f"dledger bench: {label}, {clients} clients, batch {batch}, {size} B")


def _check_failover_options(ctx: click.Context, peers: str | None) -> None:
    """--failover kills members of a group bench started itself, under a closed-loop load of one process."""
    if peers is not None:
        raise click.UsageError(f"--failover kills members of the local group bench starts; with {_peers_source(ctx)} "
                               "it would need to kill processes it does not own")
    given = [f"--{n}" for n in ("rate", "count", "procs", "plot_path", "tls")
             if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]
    if given:
        raise click.UsageError(f"{', '.join(g.replace('_path', '').replace('_', '-') for g in given)} "
                               "cannot be combined with --failover")
    nodes = ctx.params.get("nodes", 3)
    if nodes < 3:
        raise click.UsageError("--failover needs --nodes 3 or more (a majority must survive the kill)")


def _bench_failover(spec: LoadSpec, kills: int, nodes: int, flush: str, output: str, json_path: str | None,
                    member_config: str | None = None) -> None:
    from dledger.bench.failover import run_failover

    metrics_port = free_port_run(nodes)
    ports = {m: metrics_port + k for k, m in enumerate(parse_peers(spec.peers))}
    steady = spec.duration
    with tempfile.TemporaryDirectory(prefix="dledger-bench-") as d:
        extra = ["--config", str(Path(member_config).resolve())] if member_config else None
        lc = local_cluster(spec.peers, spec.group, Path(d), flush=flush, metrics_base_port=metrics_port, extra=extra)
        with lc:
            result = asyncio.run(run_failover(lc, spec, kills, steady, ports,
                                              lambda line: click.echo(f"bench: {line}", err=True)))
    report = result.report()
    report["config"] = {"target": f"local {nodes} members, flush={flush}", "kills": kills,
                        "clients": spec.clients, "conns": spec.conns or spec.clients, "size": spec.size,
                        "batch": spec.batch, "steady_s": steady, "warmup_s": spec.warmup,
                        "member_config": member_config or ""}
    _emit(report, output, json_path, _print_failover)


def _emit(report: dict[str, Any], output: str, json_path: str | None,
          print_table: Callable[[dict[str, Any]], None]) -> None:
    """The report on stdout (one JSON line, or a table), and in full at `json_path`."""
    if output == "json":
        click.echo(json.dumps(report))
    else:
        print_table(report)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))


def _print_failover(report: dict[str, Any]) -> None:
    t = Table(title=f"dledger bench --failover {report['kills']}")
    t.add_column("metric")
    t.add_column("median", justify="right")
    t.add_column("p99", justify="right")
    t.add_column("min", justify="right")
    t.add_column("max", justify="right")
    for key, label in (("elect_s", "kill -> new leader (s)"), ("append_s", "kill -> next acknowledged append (s)")):
        v = report[key]
        t.add_row(label, *("-" if v[q] is None else f"{v[q]:.3f}" for q in ("median", "p99", "min", "max")))
    console.print(t)
    stall, tenure = report["leader_stall_max_s"], report["leader_tenure_stall_le_s"]
    console.print(f"leaders' worst event-loop stall: {'-' if stall is None else f'{stall:.3f} s'} since they "
                  f"started, <= {'-' if tenure is None else f'{tenure:.3f} s'} while they led; "
                  f"terms {report['terms']} for {report['kills']} kills: {report['false_elections']} false "
                  f"election(s); {report['unrecovered']} kill(s) without a new acknowledged append; "
                  f"{report['entries_per_s']:,} entries/s")


def _peers_source(ctx: click.Context) -> str:
    """Where --peers came from, in the words the user set it with."""
    return "DLEDGER_PEERS" if ctx.get_parameter_source("peers") == ParameterSource.ENVIRONMENT else "--peers"


def _refuse_local_options(ctx: click.Context) -> None:
    """A usage error for local-group options given with a group to bench: today they would be
    ignored, and a report of `--flush sync` measured on whatever flush the group runs is
    wrong without a word (a warning line scrolls away; the numbers stay)."""
    given = [f"--{name.replace('_', '-')}" for name in LOCAL_ONLY
             if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
    if not given:
        return
    source = _peers_source(ctx)
    how = ("unset DLEDGER_PEERS (or run `DLEDGER_PEERS= dledger bench …`)" if source == "DLEDGER_PEERS"
           else "give no --peers")
    raise click.UsageError(f"{', '.join(given)} set up the local group bench starts; with {source} it benches "
                           f"that group as it runs. For a local group, {how}.")


def _run(spec: LoadSpec, procs: int = 1) -> LoadResult:
    total = spec.count or None
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[rate]}"))
    # no progress bar when the output is not a terminal: its refresh thread costs the load generator CPU
    # off a terminal: a plain line a second on stderr instead
    tty = console.is_terminal
    last_line = [0.0]
    with Progress(*cols, console=console, transient=True, disable=not tty) as progress:
        task = progress.add_task("warm-up", total=total or spec.duration, rate="")

        def show(entries: int, elapsed: float) -> None:
            done = entries if total else max(elapsed, 0.0)
            eps = entries / elapsed if elapsed > 0 else 0.0
            phase = "warm-up" if elapsed <= 0 else "measuring"
            progress.update(task, description=phase, completed=done, rate=f"{eps:,.0f} entries/s")
            now = time.monotonic()
            if not tty and now - last_line[0] >= 1.0:
                last_line[0] = now
                detail = f"{elapsed:.0f} s, {eps:,.0f} entries/s" if elapsed > 0 else f"{-elapsed:.0f} s left"
                click.echo(f"bench: {phase}, {detail}", err=True)

        if procs > 1:
            return run_load_procs(spec, procs, show)
        return asyncio.run(run_load(spec, lambda r, elapsed: show(r.entries, elapsed)))


def _print(report: dict[str, object]) -> None:
    t = Table(title="dledger bench")
    t.add_column("metric")
    t.add_column("value", justify="right")
    lat = report["latency_ms"]
    assert isinstance(lat, dict)
    rows = [
        ("entries/s", f"{report['entries_per_s']:,}"),
        ("MB/s", f"{report['mb_per_s']:,}"),
        ("requests/s", f"{report['requests_per_s']:,}"),
    ]
    rows += [(f"latency {k} (ms)", "none" if v is None else f"{v}") for k, v in lat.items()]
    rows.append(("load CPU (cores) / procs", f"{report['client_cpu_cores']} / {report['load_procs']}"))
    rows.append(("errors", ", ".join(f"{k}: {v}" for k, v in dict(report["errors"]).items()) or "none"))  # type: ignore[call-overload]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
