"""`dledger certs`: write a development CA and member/client certificates (registered by cli.py)."""

from __future__ import annotations

from pathlib import Path

import click

from dledger.clitools import emit, output_option
from dledger.config import ConfigError
from dledger.security.certs import DEFAULT_CLIENTS, DEFAULT_DAYS, DEFAULT_HOSTS, make_certs


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


@click.command("certs")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the PEM files into (created if missing).")
@click.option("--members", required=True, help="Member ids, comma separated, e.g. n0,n1,n2.")
@click.option("--hosts", default=",".join(DEFAULT_HOSTS), show_default=True,
              help="IP addresses / DNS names every member certificate also carries, comma separated.")
@click.option("--clients", default=",".join(DEFAULT_CLIENTS), show_default=True,
              help="Client certificate names, comma separated (may send client requests only).")
@click.option("--days", default=DEFAULT_DAYS, show_default=True, type=click.IntRange(1, 36500),
              help="Validity of every certificate.")
@click.option("--force", is_flag=True, help="Replace an existing CA (and every certificate it signed).")
@output_option(None, "'wrote FILE' lines and how to use them")
def certs(out_dir: Path, members: str, hosts: str, clients: str, days: int, force: bool, output: str | None) -> None:
    """Write a development CA and TLS certificates for a group's members and clients (with -o
    json: {"name","path","private_key"} per file, nothing else)."""
    member_ids = _split(members)
    try:
        written = make_certs(out_dir, member_ids, _split(hosts), _split(clients), days, force=force)
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
        _usage(out_dir, member_ids, _split(clients))


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
