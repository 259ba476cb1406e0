"""`dledger kv`: the replicated key-value store from the shell (registered by cli.py).

`get` writes the value's bytes as they are (like `etcdctl get --print-value-only`), so
binary values survive a pipe; `range` writes `key<TAB>value` lines (text, undecodable
bytes escaped); writes print one JSON object with what they did. Every subcommand takes
`-o json|table`: JSON lines (values as `dledger read`'s bodies: text, or {"b64": …}) or a table.
"""

from __future__ import annotations

import base64
import sys

import click

from dledger.clitools import (
    UserError,
    WireInt,
    base64_output_option,
    body_json,
    consistency_option,
    emit,
    group_option,
    make_client,
    output_option,
    peers_option,
    security_options,
    write_body,
)
from dledger.kv.client import KVClient
from dledger.kv.commands import Item, Result


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "backslashreplace")


def _print_result(r: Result, output: str) -> None:
    prev = None if r.prev is None else body_json(r.prev)
    emit([{"ok": r.ok, "index": r.index, "prev": prev, "prev_mod_index": r.prev_index}], output)


def _item(item: Item, b64: bool = False) -> dict[str, object]:
    return {"key": body_json(item.key), "value": body_json(item.value, b64), "mod_index": item.mod_index}


def _kv(ctx: click.Context) -> KVClient:
    return KVClient("", client=make_client(ctx.obj["peers"], ctx.obj["group"]))


def _value(value: str | None, stdin: bool) -> bytes:
    if stdin:
        return sys.stdin.buffer.read()
    if value is None:
        raise click.UsageError("give VALUE, or --stdin to read it (any bytes) from standard input")
    return value.encode()


@click.group()
@peers_option()
@group_option()
@security_options
@click.pass_context
def kv(ctx: click.Context, peers: str, group: str) -> None:
    """The replicated key-value store of a group run with --state-machine kv."""
    ctx.obj = {"peers": peers, "group": group}


@kv.command()
@click.argument("key")
@click.argument("value", required=False)
@click.option("--stdin", is_flag=True, help="Read the value from standard input (binary-safe).")
@output_option("json")
@click.pass_context
def put(ctx: click.Context, key: str, value: str | None, stdin: bool, output: str) -> None:
    """Set KEY to VALUE; print {"ok","index","prev","prev_mod_index"}."""
    data = _value(value, stdin)
    with _kv(ctx) as c:
        _print_result(c.put(key, data), output)


@kv.command()
@click.argument("key")
@output_option(None, "the value's raw bytes")
@base64_output_option
@consistency_option
@click.pass_context
def get(ctx: click.Context, key: str, output: str | None, b64: bool, consistency: str) -> None:
    """Write KEY's value to standard output (with -o: {"key","value","mod_index"}); exit 1
    when there is no such key."""
    with _kv(ctx) as c:
        item = c.get(key, consistency)
    if item is None:
        raise UserError(f"no key {key!r}")
    if output is not None:
        emit([_item(item, b64)], output)
        return
    write_body(item.value, b64)
    if sys.stdout.isatty() and not b64:
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


@kv.command("del")
@click.argument("key")
@output_option("json")
@click.pass_context
def delete(ctx: click.Context, key: str, output: str) -> None:
    """Delete KEY (`ok` says whether it existed)."""
    with _kv(ctx) as c:
        _print_result(c.delete(key), output)


@kv.command()
@click.argument("key")
@click.argument("value", required=False)
@click.option("--stdin", is_flag=True, help="Read the new value from standard input.")
@click.option("--delete", "remove", is_flag=True, help="Delete the key instead of setting it.")
@click.option("--expect-index", type=WireInt(-1), default=None,
              help="Only if KEY was last changed by this entry (-1: only if KEY does not exist).")
@click.option("--expect-value", default=None, help="Only if KEY holds this value.")
@output_option("json")
@click.pass_context
def cas(ctx: click.Context, key: str, value: str | None, stdin: bool, remove: bool, expect_index: int | None,
        expect_value: str | None, output: str) -> None:
    """Compare-and-set: change KEY only if it is as expected; exit 1 if it was not."""
    if expect_index is None and expect_value is None:
        raise click.UsageError("give --expect-index and/or --expect-value")
    data = None if remove else _value(value, stdin)
    with _kv(ctx) as c:
        r = c.cas(key, data, expect_index=expect_index, expect_value=expect_value)
    _print_result(r, output)
    if not r.ok:
        raise UserError(f"compare failed: {key!r} was last changed by entry {r.prev_index}")


@kv.command("range")
@click.argument("prefix", default="")
@click.option("--limit", type=click.IntRange(1), default=1000, show_default=True)
@output_option(None, "key<TAB>value lines, undecodable bytes escaped")
@base64_output_option
@consistency_option
@click.pass_context
def range_(ctx: click.Context, prefix: str, limit: int, output: str | None, b64: bool, consistency: str) -> None:
    """Keys starting with PREFIX in byte order, as `key<TAB>value` lines (with -o:
    {"key","value","mod_index"})."""
    with _kv(ctx) as c:
        r = c.range(prefix, limit, None, consistency)
    if output is None:
        for item in r.items:
            value = base64.b64encode(item.value).decode() if b64 else _text(item.value)
            click.echo(f"{_text(item.key)}\t{value}")
    else:
        emit([_item(item, b64) for item in r.items], output, f"keys starting with {prefix!r}" if prefix else "")
    if r.more:
        click.echo(f"(more: stopped at --limit {limit})", err=True)
