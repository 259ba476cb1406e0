"""`dledger certs`: write a development CA and member/client certificates (registered by cli.py)."""

from __future__ import annotations

from pathlib import Path

import click

from dledger.clitools import emit, output_option
from dledger.config import ConfigError
from dledger.security.certs import DEFAULT_ADMINS, DEFAULT_CLIENTS, DEFAULT_DAYS, DEFAULT_HOSTS, make_certs


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


@click.command("certs")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the PEM files into (created if missing).")
@click.option("--members", default="", help="Member ids of a Raft group, comma separated, e.g. n0,n1,n2 (OU=member).")
@click.option("--controllers", default="",
              help="Controller ids, comma separated, e.g. c0,c1,c2 (OU=member and OU=controller).")
@click.option("--brokers", default="",
              help="Broker replicas as SET/REPLICA, comma separated, e.g. b0/r0,b0/r1 (OU=broker:SET; files "
                   "SET-REPLICA.pem).")
@click.option("--hosts", default=",".join(DEFAULT_HOSTS), show_default=True,
              help="IP addresses / DNS names every member certificate also carries, comma separated.")
@click.option("--clients", default=",".join(DEFAULT_CLIENTS), show_default=True,
              help="Client certificate names, comma separated (OU=client: read and write).")
@click.option("--admins", default=",".join(DEFAULT_ADMINS), show_default=True,
              help="Admin certificate names, comma separated (OU=admin: operator requests too).")
@click.option("--days", default=DEFAULT_DAYS, show_default=True, type=click.IntRange(1, 36500),
              help="Validity of every certificate.")
@click.option("--force", is_flag=True, help="Replace an existing CA (and every certificate it signed).")
@output_option(None, "'wrote FILE' lines and how to use them")
def certs(out_dir: Path, members: str, controllers: str, brokers: str, hosts: str, clients: str, admins: str,
          days: int, force: bool, output: str | None) -> None:
    """Write a development CA and TLS certificates, each carrying its role: members, controllers,
    broker replicas, clients and admins (with -o json: {"name","path","private_key"} per file,
    nothing else)."""
    member_ids = _split(members)
    if not member_ids and not _split(controllers):
        raise click.UsageError("give --members or --controllers (the certificates of the servers)")
    try:
        written = make_certs(out_dir, member_ids, _split(hosts), _split(clients), days, force=force,
                             controllers=_split(controllers), brokers=_split(brokers), admins=_split(admins))
    except ConfigError as e:
        raise click.ClickException(e.message) from e
    keys = {name: path.name.endswith("-key.pem") for name, path in written.items()}  # private key: mode 0600
    if output is None:
        for name, path in written.items():
            click.echo(f"wrote {path}{'  (private key, mode 0600)' if keys[name] else ''}")
    else:
        emit([{"name": name, "path": str(path), "private_key": keys[name]} for name, path in written.items()],
             output, f"written to {out_dir}")
    if output != "json":
        _usage(out_dir, member_ids or _split(controllers), _split(clients))


def _usage(out_dir: Path, member_ids: list[str], clients: list[str]) -> None:
    """How members and clients use the files (for people: not in -o json)."""
    first = member_ids[0]
    click.echo(
        f"start member {first} with: --tls-cert {out_dir / f'{first}.pem'} "
        f"--tls-key {out_dir / f'{first}-key.pem'} --tls-ca {out_dir / 'ca.pem'}"
        + (f"  (likewise {', '.join(member_ids[1:])})" if len(member_ids) > 1 else "")
    )
    for name in clients[:1]:
        click.echo(
            f"clients use: --tls-cert {out_dir / f'{name}.pem'} "
            f"--tls-key {out_dir / f'{name}-key.pem'} --tls-ca {out_dir / 'ca.pem'}"
        )
    click.echo(f"or: export DLEDGER_TLS_DIR={out_dir}  (client.pem for client commands, admin.pem for admin ones)")
