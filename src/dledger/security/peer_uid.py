"""Which user holds the other end of a loopback TCP connection (Linux: /proc/net/tcp and tcp6).

A server with neither TLS nor a token serves loopback connections only (docs/security.md,
"Modes"), and of those only the ones of its own user: another user's process on the same
machine is refused, as PostgreSQL's "peer" authentication does for local sockets. A process of
the same user could as well write the store directory, which no network check can prevent.

The socket's owner is the uid column of the kernel's table, in the entry whose local address
is the peer's and whose remote address is ours. Where the table cannot be read (not Linux),
`peer_uid` says None and the check is skipped.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Any, Final

from dledger.security.roles import is_loopback

# Why a server without TLS or a token refuses a connection from another host ...
LOOPBACK_ONLY: Final = ("this server runs without TLS or an auth token and accepts connections from loopback "
                        "addresses only: give it TLS or a token, or start it with --insecure (docs/security.md)")
# ... and a loopback connection of another user of this machine (a process of our own user
# could as well write our store directory: that is the trust a loopback-only server extends).
OTHER_USER: Final = ("this server runs without TLS or an auth token and serves loopback connections of its own "
                     "user only: give it TLS or a token, or start it with --insecure (docs/security.md)")

_TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}


def _hex_address(host: str, port: int, family: int) -> str:
    """An address as the kernel's table writes it: the IP's 32-bit words in host order, hex."""
    packed = ipaddress.ip_address(host).packed
    words = [packed[k : k + 4] for k in range(0, len(packed), 4)]
    ip = "".join(f"{int.from_bytes(w, 'little'):08X}" for w in words)
    return f"{ip}:{port:04X}"


def _plain(host: str) -> str:
    """The host as the peer's own socket has it: an IPv4-mapped address (a dual-stack listener)
    is the IPv4 client it stands for."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def peer_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the socket at `remote` that is connected to our `local` (None: unknown)."""
    try:
        host, ours = _plain(remote[0]), _plain(local[0])
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        want_local = _hex_address(host, remote[1], family)
        want_remote = _hex_address(ours, local[1], family)
        lines = _TABLES[family].read_text().splitlines()[1:]
    except (OSError, ValueError):
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 7 and fields[1] == want_local and fields[2] == want_remote:
            try:
                return int(fields[7])
            except ValueError:
                return None
    return None


def not_local(sockname: Any, peername: Any) -> str | None:
    """Why a loopback-only server does not serve a connection between these socket names
    (None: it does): another host, or a loopback connection of another user of this machine."""
    host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
    if not is_loopback(host):
        return LOOPBACK_ONLY
    if isinstance(sockname, tuple) and isinstance(peername, tuple):
        uid = peer_uid((str(sockname[0]), int(sockname[1])), (host, int(peername[1])))
        if uid is not None and uid != os.getuid():
            return OTHER_USER
    return None


__all__ = ["LOOPBACK_ONLY", "OTHER_USER", "not_local", "peer_uid"]
