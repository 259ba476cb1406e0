"""Network addresses as text: one parser and one formatter for every `host:port` the project reads.

Peers strings, `--listen`, `--ha-listen`, controller lists, advertised broker addresses and the
transport's own peers all go through `parse_address`, so they accept the same forms:

    host:port          a hostname or an IPv4 literal (`127.0.0.1:20911`, `node-1.example:20911`)
    [v6]:port          an IPv6 literal in brackets (`[::1]:20911`, `[fe80::1%eth0]:20911`), as RFC 3986
                       writes it in a URL

The host comes back without brackets (what `socket` and asyncio take); `format_address` puts them
back for an IPv6 host. An IPv6 literal without brackets is refused rather than guessed at
(`::1:9000` could be `[::1]:9000` or `[::1:9000]`, with no port).

This module imports nothing of the project: config, the runtime, brokers, controllers, the CLI,
the clients and the Spark options all stand above it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, NamedTuple

__all__ = ["Address", "AddressError", "format_address", "parse_address", "socket_address"]

# A hostname or an IPv4 literal: DNS labels (letters, digits, '-'), dots, and '_' (seen in
# container names). Nothing that could be a separator of the strings addresses travel in
# (';' between peers, '|' before a broker's HA address, ',' in lists, '-' only after the id).
_HOST_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_PORT_RE = re.compile(r"[0-9]+")


class AddressError(ValueError):
    """Text that is not `host:port` or `[v6]:port`; the message says what is wrong with it."""


class Address(NamedTuple):
    """A parsed address: `host` without brackets (for sockets), `port` in 1..65535."""

    host: str
    port: int

    def __str__(self) -> str:
        return format_address(self.host, self.port)


def format_address(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets (`[::1]:9000`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def socket_address(name: Any) -> str:
    """`host:port` of a socket name as `getsockname`/`getpeername` give it (a 2-tuple for IPv4, a
    4-tuple for IPv6); anything else (a Unix socket's path) as text."""
    if isinstance(name, tuple) and len(name) >= 2:
        return format_address(str(name[0]), int(name[1]))
    return str(name)


def parse_address(text: str, what: str = "address") -> Address:
    """`host:port` or `[v6]:port` → Address; AddressError naming `what` otherwise (no port, a port
    out of range, an IPv6 literal without brackets, an empty or malformed host)."""
    if not isinstance(text, str):
        raise AddressError(f"{what} must be host:port, not {text!r}")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise AddressError(f"{what} {text!r}: '[' without its ']' (an IPv6 address is written [::1]:port)")
        host, rest = text[1:close], text[close + 1 :]
        if not rest.startswith(":"):
            raise AddressError(f"{what} {text!r} has no port: expected [{host}]:port")
        _check_v6(host, text, what)
        return Address(host, _port(rest[1:], text, what))
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise AddressError(f"{what} {text!r} has no port: expected host:port")
    if ":" in host:
        raise AddressError(f"{what} {text!r}: an IPv6 address needs brackets, e.g. [::1]:port")
    if not host:
        raise AddressError(f"{what} {text!r} has no host: expected host:port")
    if not _HOST_RE.fullmatch(host):
        raise AddressError(f"{what} {text!r}: {host!r} is not a hostname or an IPv4 address")
    return Address(host, _port(port_text, text, what))


def _check_v6(host: str, text: str, what: str) -> None:
    try:
        ipaddress.IPv6Address(host)  # (a scope id, %eth0, is accepted by the parser)
    except ValueError:
        raise AddressError(f"{what} {text!r}: {host!r} in brackets is not an IPv6 address") from None


def _port(port_text: str, text: str, what: str) -> int:
    if not _PORT_RE.fullmatch(port_text):
        raise AddressError(f"{what} {text!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 0 < port < 65536:
        raise AddressError(f"{what} {text!r}: port {port} out of range (1-65535)")
    return port
