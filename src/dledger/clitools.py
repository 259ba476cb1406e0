"""What the `dledger` commands share (cli.py and the commands other modules register):
user errors, wire-bounded integers, the security options and a client built from them."""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import re
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dledger.core.messages import LIMIT

if TYPE_CHECKING:
    from dledger.config import DLedgerConfig
    from dledger.runtime.client import DLedgerClient
    from dledger.security.tls import TlsConfig

PEERS_HELP = "Members, as 'n0-127.0.0.1:20911;n1-127.0.0.1:20912;…'."


class UserError(Exception):
    """A problem of the user's setup (a port in use, an unusable store directory): main()
    prints `dledger: error: <message>` and exits 1."""


if TYPE_CHECKING:  # click >= 8.2 types its ParamType by value and input; 8.1's is not generic
    _IntParamType = click.ParamType[int, Any]
else:
    _IntParamType = click.ParamType


class WireInt(_IntParamType):
    """An index or count a request can carry: `low` <= N < 2**62 (the wire limit)."""

    name = "integer"

    def __init__(self, low: int) -> None:
        self.low = low

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        n: int = click.INT.convert(value, param, ctx)
        if n < self.low:
            self.fail(f"{n} is below {self.low}", param, ctx)
        if n >= LIMIT:
            self.fail(f"{n} is beyond the limit: indexes and counts must be below 2**62", param, ctx)
        return n


F = TypeVar("F", bound=Callable[..., Any])  # a click command function


def _remember(ctx: click.Context, param: click.Parameter, value: object) -> None:
    if value:
        ctx.meta.setdefault("dledger.security", {})[param.name] = value


def _shared_security_options(f: F) -> F:
    for name, help_text in reversed([
        ("--tls-cert", "Certificate (PEM) to present: a member's own, or a client's."),
        ("--tls-key", "Its private key (PEM)."),
        ("--tls-ca", "The CA (PEM): with the two above, every connection is mutual TLS."),
    ]):
        f = click.option(name, expose_value=False, callback=_remember, type=click.Path(dir_okay=False),
                         help=help_text)(f)
    return click.option("--auth-token", expose_value=False, callback=_remember, envvar="DLEDGER_AUTH_TOKEN",
                        help="Token of a group run without TLS (or set DLEDGER_AUTH_TOKEN; admin commands "
                             "take DLEDGER_ADMIN_TOKEN first). A server's: the cluster token.")(f)


def security_options(f: F) -> F:
    """A client command's --tls-cert/--tls-key/--tls-ca, --tls-dir and --auth-token
    (docs/security.md); kept in the context, not passed to the command, so every command
    takes them the same way."""
    f = click.option("--tls-dir", expose_value=False, callback=_remember, envvar="DLEDGER_TLS_DIR",
                     type=click.Path(file_okay=False),
                     help="A `dledger certs` directory (or set DLEDGER_TLS_DIR): ca.pem, and client.pem for client "
                          "commands, admin.pem for admin ones (transfer, snapshot, compact, admin "
                          "elect/clean/config).")(f)
    return _shared_security_options(f)


def server_security_options(f: F) -> F:
    """A server's: its certificate or cluster token, its client and admin tokens, --insecure."""
    f = click.option("--insecure", expose_value=False, callback=_remember, is_flag=True,
                     help="Without TLS or a token, serve every host (default: loopback connections only). "
                          "Anyone who can connect may then do anything: docs/security.md.")(f)
    f = click.option("--admin-token", expose_value=False, callback=_remember, envvar="DLEDGER_ADMIN_TOKEN",
                     help="Without TLS: a token giving the admin role (or set DLEDGER_ADMIN_TOKEN).")(f)
    f = click.option("--client-token", expose_value=False, callback=_remember, envvar="DLEDGER_CLIENT_TOKEN",
                     help="Without TLS: a token giving the client role only (or set DLEDGER_CLIENT_TOKEN).")(f)
    return _shared_security_options(f)


def security() -> dict[str, str]:
    """The security options given to this command, as config keys (--tls-dir is a client's:
    see client_tls)."""
    sec = dict(click.get_current_context().meta.get("dledger.security", {}))
    sec.pop("tls_dir", None)
    return sec


def client_tls(role: str = "client") -> TlsConfig | None:
    """The TLS settings of this command: its --tls-* options, else the `role` certificate
    (client.pem, admin.pem) of --tls-dir / DLEDGER_TLS_DIR (None without them)."""
    from dledger.security.tls import TlsConfig

    sec = dict(click.get_current_context().meta.get("dledger.security", {}))
    paths = [sec.get(k, "") for k in ("tls_ca", "tls_cert", "tls_key")]
    if any(paths) and not all(paths):
        raise click.UsageError("--tls-cert, --tls-key and --tls-ca go together")
    if all(paths):
        return TlsConfig(*paths)
    tls_dir = sec.get("tls_dir")
    if not tls_dir:
        return None
    d = Path(tls_dir)
    for name in (f"{role}.pem", "ca.pem"):  # `dledger certs` writes ca.pem last
        if not (d / name).exists():
            raise UserError(f"--tls-dir {d}: no {name} there (this command needs the {role} role's certificate "
                            f"and the CA; `dledger certs` writes them)")
    return TlsConfig(str(d / "ca.pem"), str(d / f"{role}.pem"), str(d / f"{role}-key.pem"))


def client_token(role: str = "client") -> str | None:
    """The token this command presents: an admin command takes DLEDGER_ADMIN_TOKEN when it is
    set and no --auth-token was given; else --auth-token / DLEDGER_AUTH_TOKEN."""
    sec = dict(click.get_current_context().meta.get("dledger.security", {}))
    if role == "admin" and os.environ.get("DLEDGER_ADMIN_TOKEN"):
        given = sec.get("auth_token")
        if not given or given == os.environ.get("DLEDGER_AUTH_TOKEN"):
            return os.environ["DLEDGER_ADMIN_TOKEN"]
    return sec.get("auth_token") or None


def make_client(peers: str, group: str, timeout: float = 5.0, role: str = "client") -> DLedgerClient:
    """A client with the security options given to this command (`role`: which certificate
    of --tls-dir, which token)."""
    from dledger.runtime.client import DLedgerClient

    return DLedgerClient(peers, group, timeout, tls=client_tls(role), auth_token=client_token(role))


def check_store_dir(store_dir: Path) -> None:
    """Refuse a store directory the member could not create or write, naming it."""
    if store_dir.exists() and not store_dir.is_dir():
        raise UserError(f"store directory {store_dir} is not a directory")
    existing = next((p for p in (store_dir, *store_dir.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise UserError(f"cannot create store directory {store_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):  # root may write anyway: then it passes
        what = "is not writable" if existing == store_dir else f"cannot be created: {existing} is not writable"
        raise UserError(f"store directory {store_dir} {what}")


_BIND_ADDRESS = re.compile(r"address \('?([^',]*)'?, (\d+)")


def member_os_error(cfg: DLedgerConfig, e: OSError) -> str:
    """One line for an OSError a member's start failed with: a port it cannot listen on
    (asyncio names the address; prometheus' metrics server does not), else the file."""
    reason = (os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else e.strerror or str(e)).lower()
    m = _BIND_ADDRESS.search(str(e))
    if m is not None:
        return f"cannot listen on {m[1]}:{m[2]}: {reason}"
    if isinstance(e, socket.gaierror):  # a host name that does not resolve
        return f"cannot listen on {cfg.peer_map[cfg.self_id].address}: {reason}"
    if e.errno == errno.EADDRINUSE and cfg.metrics_port:
        return f"cannot serve metrics on port {cfg.metrics_port}: {reason}"
    if e.filename is not None:
        return f"{e.filename}: {reason}"
    return f"cannot start member {cfg.self_id}: {reason}"


def run_member(cfg: DLedgerConfig, serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `serve(stop)` on uvloop until SIGINT/SIGTERM sets `stop`; a port or file the member
    cannot use ends the command with one line (UserError)."""
    run_process(serve, lambda e: member_os_error(cfg, e))


def run_process(serve: Callable[[asyncio.Event], Awaitable[None]],
                os_error: Callable[[OSError], str] | None = None) -> None:
    """Run `serve(stop)` on uvloop until SIGINT/SIGTERM sets `stop`; an OSError (a port in
    use, a file) ends the command with the one line `os_error` makes of it (UserError)."""
    from dledger.runtime.transport import install_uvloop

    install_uvloop()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(stop)

    try:
        asyncio.run(main())
    except OSError as e:
        raise UserError((os_error or socket_os_error)(e)) from e


def socket_os_error(e: OSError) -> str:
    """One line for an OSError of a process's start: the address it cannot listen on, else the file."""
    reason = (os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else e.strerror or str(e)).lower()
    m = _BIND_ADDRESS.search(str(e))
    if m is not None:
        return f"cannot listen on {m[1]}:{m[2]}: {reason}"
    return f"{e.filename}: {reason}" if e.filename is not None else reason


def body_chunks(bodies: tuple[str, ...], batch: int, files: tuple[str, ...] = (), b64: bool = False,
                null: bool = False) -> Iterator[list[bytes]]:
    """The bodies to append, in lists of at most `batch`: each of `files` whole, else the BODY
    arguments, else stdin's records — lines without their b"\n", or with `null` separated by
    NUL bytes (binary-safe, as `find -print0`). An argument or a record is sent as given,
    UTF-8 or not (click hands over non-UTF-8 argv as surrogate escapes: fsencode gives back
    the bytes); with `b64` each is base64 text, decoded."""
    source: Iterable[bytes]
    if files:
        source = (_read_file(f) for f in files)
    elif bodies:
        source = (os.fsencode(b) for b in bodies)
    else:
        source = _stdin_records(b"\0" if null else b"\n")
    if b64:
        source = (_b64(b) for b in source)
    chunk: list[bytes] = []
    for body in source:
        chunk.append(body)
        if len(chunk) >= batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _stdin_records(sep: bytes) -> Iterator[bytes]:
    if sep == b"\n":
        for line in sys.stdin.buffer:
            yield line[:-1] if line.endswith(b"\n") else line
        return
    rest = b""
    while chunk := sys.stdin.buffer.read(1 << 16):
        *records, rest = (rest + chunk).split(sep)
        yield from records
    if rest:
        yield rest


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from e


def _b64(text: bytes) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except ValueError as e:
        raise UserError(f"not base64: {text[:40]!r}") from e


def body_json(body: bytes, b64: bool = False) -> object:
    """A body for a JSON line: its text, or {"b64": ...} when it is not UTF-8; with `b64`
    always base64 text (one type for programs that must not look at the content)."""
    if b64:
        return base64.b64encode(body).decode()
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(body).decode()}


def write_body(body: bytes, b64: bool) -> None:
    """A body on stdout as its raw bytes (binary-safe through a pipe), or with `b64` as one
    base64 line."""
    sys.stdout.buffer.write(base64.b64encode(body) + b"\n" if b64 else body)


def base64_output_option(f: F) -> F:
    """--base64 of the commands that print bodies (read, get, kv get/range)."""
    return click.option("--base64", "b64", is_flag=True,
                        help='Bodies as base64 text (raw output: base64 lines; JSON: "body": "…"), '
                             'not text or {"b64": …} by content.')(f)


def peers_option(required: bool = True, extra: str = "") -> Callable[[F], F]:
    """--peers, or DLEDGER_PEERS from the environment (as etcdctl's ETCDCTL_ENDPOINTS)."""
    # no default=None when required: with it click (8.2+) lets a missing --peers through as None
    return click.option("--peers", envvar="DLEDGER_PEERS", show_envvar=True, required=required,
                        help=PEERS_HELP + extra)


def group_option() -> Callable[[F], F]:
    """--group, or DLEDGER_GROUP from the environment."""
    return click.option("--group", envvar="DLEDGER_GROUP", show_envvar=True, default="default",
                        show_default=True)


OUTPUTS = ("json", "table")


def output_option(default: str | None, unset: str = "") -> Callable[[F], F]:
    """-o/--output json|table: JSON (one object per line: for programs) or a table (for people).

    `default` None keeps a command's own format when -o is not given (raw bytes, text lines:
    what scripts and the docs already read); `unset` names that format in the help."""
    if default is None and not unset:
        raise ValueError("output_option(None) needs `unset`: the format printed without -o")
    help_text = "JSON lines for programs, or a table for people."
    if default is None:
        help_text += f" [default: {unset}]"
    return click.option("-o", "--output", type=click.Choice(OUTPUTS), default=default,
                        show_default=default is not None, help=help_text)


def json_alias(as_json: bool, output: str | None) -> str | None:
    """--json (kept where it was before -o existed) means -o json; with another -o given it is a
    usage error, not a silent choice of one."""
    if not as_json:
        return output
    if output != "json" and _given("output"):
        raise click.UsageError(f"--json is -o json: it contradicts -o {output}")
    return "json"


def lines_only(follow: bool, output: str) -> str:
    """Following prints each entry as it commits: JSON lines; -o table then is a usage error."""
    if follow and output == "table" and _given("output"):
        raise click.UsageError("--follow prints JSON lines as entries commit: a table has no end to wait for")
    return "json" if follow else output


def _given(param: str) -> bool:
    return click.get_current_context().get_parameter_source(param) is click.core.ParameterSource.COMMANDLINE


def emit(rows: list[dict[str, object]], output: str, title: str = "") -> None:
    """Rows as JSON lines, or as one table with a column per key."""
    if output == "json":
        for row in rows:
            click.echo(json.dumps(row))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if not rows:  # not a blank line: say so (on stderr, as the hints)
        click.echo(f"(none{': ' + title if title else ''})", err=True)
        return
    # Text, never markup: titles and cells carry user data ("[/]" in a key, a path, a body);
    # fold, never "…": a table must show all of a value, over several lines if need be
    table = Table(title=Text(_visible(title)) if title else None)
    cols = list(dict.fromkeys(k for row in rows for k in row))
    for col in cols:
        table.add_column(Text(_visible(col)), overflow="fold")
    for row in rows:
        table.add_row(*(Text(_visible(_cell(row.get(c)))) for c in cols))
    Console().print(table)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _visible(text: str) -> str:
    """Control characters as \\xNN: a stored body must not recolour or retitle the terminal
    (ESC sequences) nor lose bytes silently."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def emit_record(record: dict[str, object], output: str, title: str = "") -> None:
    """One result object: a JSON line, or a two-column (field, value) table, as its values
    may be long (paths, lists of problems) for one row."""
    if output == "json":
        click.echo(json.dumps(record))
        return
    emit([{"field": k, "value": v} for k, v in record.items()], "table", title)


def _cell(value: object) -> str:
    """A table cell: None empty, a list one item a line, a dict (a {"b64": …} body) as JSON."""
    if value is None:
        return ""
    if isinstance(value, list):
        return "\n".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


class Rows:
    """A command's result rows: with -o json each is printed as it comes (a pipe, or --follow,
    sees it at once); with -o table they are gathered into one table printed on leaving the
    `with` block, on an error too (what was done before it shows, as the JSON lines did)."""

    def __init__(self, output: str, title: str = "") -> None:
        self.output = output
        self.title = title
        self.rows: list[dict[str, object]] = []

    def add(self, row: dict[str, object], flush: bool = False) -> None:
        if self.output == "table":
            self.rows.append(row)
            return
        click.echo(json.dumps(row))
        if flush:
            sys.stdout.flush()

    def __enter__(self) -> Rows:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.output == "table" and (self.rows or exc[0] is None):
            emit(self.rows, "table", self.title)


def consistency_option(f: F) -> F:
    """--consistency of reads (dledger.AsyncDLedgerClient.query explains the levels)."""
    from dledger.core.messages import CONSISTENCY

    return click.option("--consistency", type=click.Choice(CONSISTENCY), default="linearizable", show_default=True,
                        help="linearizable: the leader confirms it leads (a heartbeat round); lease: no round "
                             "while its lease holds; leader: no check; local: the member's own copy.")(f)
