"""Which user holds the other end of a loopback TCP connection (Linux: /proc/net/tcp and tcp6).

A server with neither TLS nor a token serves loopback connections only (docs/security.md,
"Modes"), and of those only the ones of its own user: another user's process on the same
machine is refused, as PostgreSQL's "peer" authentication does for local sockets. A process of
the same user could as well write the store directory, which no network check can prevent.

The socket's owner is the uid of the socket whose local address is the peer's and whose remote
address is ours, in either family (a client's socket may be IPv6 to an IPv4-mapped address while
the listener sees IPv4). The kernel is asked for that one socket (sock_diag over netlink, as `ss`
does: an exact lookup); only where that is not available is the whole table read
(/proc/net/tcp and tcp6, whose text the kernel makes anew for every socket of the machine on
each read: tens of milliseconds on a busy host, once per accepted connection, on the event loop).
A socket found nowhere is refused. Where neither can be asked (not Linux), `peer_uid` says None
and the check is skipped.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
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


def _forms(host: str) -> dict[int, str]:
    """The ways a socket table may list an address: IPv4 in /proc/net/tcp; IPv6 (an IPv4 one as
    ::ffff:a.b.c.d) in /proc/net/tcp6. A client's own socket may be either family whatever the
    listener's: both are searched."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        v4 = ip.ipv4_mapped
        return {socket.AF_INET6: str(ip), **({socket.AF_INET: str(v4)} if v4 is not None else {})}
    return {socket.AF_INET: str(ip), socket.AF_INET6: f"::ffff:{ip}"}


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one request for one socket by its addresses.
_NETLINK_SOCK_DIAG = 4  # NETLINK_SOCK_DIAG (formerly NETLINK_INET_DIAG)
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; inet_diag_sockid: sport, dport (big-endian),
# src[16], dst[16], if, cookie[2] (INET_DIAG_NOCOOKIE: no cookie to match)
_REQ = struct.Struct("=BBBxI")
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
_NOCOOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_ENOENT = 2  # the kernel's answer for "no such socket"
_UID_OFFSET = _NLMSG.size + 4 + 48 + 12  # inet_diag_msg: 4 bytes, the sockid, expires/rqueue/wqueue, uid


def _diag_uid(family: int, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid of the TCP socket of `family` bound to `local` and connected to `remote`, asked of
    the kernel by sock_diag; -1 if it has none such; None if the kernel cannot be asked so."""
    src = socket.inet_pton(family, local[0]).ljust(16, b"\0")
    dst = socket.inet_pton(family, remote[0]).ljust(16, b"\0")
    body = (_REQ.pack(family, socket.IPPROTO_TCP, 0, _ALL_STATES)
            + _SOCKID.pack(local[1], remote[1], src, dst) + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE))
    msg = _NLMSG.pack(_NLMSG.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + body
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(msg, (0, 0))
            answer = nl.recv(8192)
    except (OSError, AttributeError):  # no netlink (not Linux), or no sock_diag here
        return None
    if len(answer) < _NLMSG.size:
        return None
    _, kind, _, _, _ = _NLMSG.unpack_from(answer)
    if kind == _NLMSG_ERROR:
        err = -struct.unpack_from("=i", answer, _NLMSG.size)[0]
        return -1 if err == _ENOENT else None
    if kind != _SOCK_DIAG_BY_FAMILY or len(answer) < _UID_OFFSET + 4:
        return None
    return int(struct.unpack_from("=I", answer, _UID_OFFSET)[0])



def peer_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the socket at `remote` that is connected to our `local`; None where the
    tables cannot be read (not Linux); -1 where they can, but list no such socket (then nobody
    can tell whose it is, and a loopback-only server refuses it)."""
    try:
        peer, ours = _forms(remote[0]), _forms(local[0])
    except ValueError:
        return -1
    asked = False
    for family in _TABLES:
        if family in peer and family in ours:
            uid = _diag_uid(family, (peer[family], remote[1]), (ours[family], local[1]))
            if uid is not None and uid >= 0:
                return uid
            asked = asked or uid is not None
    if asked:
        return -1  # the kernel was asked, and holds no such socket in either family
    return _table_uid(peer, ours, local, remote)


def _table_uid(peer: dict[int, str], ours: dict[int, str], local: tuple[str, int],
               remote: tuple[str, int]) -> int | None:
    """`peer_uid` from the kernel's text tables (where sock_diag cannot be asked)."""
    read_any = False
    for family, table in _TABLES.items():
        if family not in peer or family not in ours:
            continue
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        want_local, want_remote = _hex_address(peer[family], remote[1], family), \
            _hex_address(ours[family], local[1], family)
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[1] == want_local and fields[2] == want_remote:
                try:
                    return int(fields[7])
                except ValueError:
                    return -1
    return -1 if read_any else None


def not_local(sockname: Any, peername: Any) -> str | None:
    """Why a loopback-only server does not serve a connection between these socket names
    (None: it does): another host, or a loopback connection of another user of this machine."""
    host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
    if not is_loopback(host):
        return LOOPBACK_ONLY
    if not isinstance(sockname, tuple) or not isinstance(peername, tuple):
        return OTHER_USER  # (not a TCP socket: nothing tells whose it is)
    uid = peer_uid((str(sockname[0]), int(sockname[1])), (host, int(peername[1])))
    if uid is not None and uid != os.getuid():
        return OTHER_USER
    return None


__all__ = ["LOOPBACK_ONLY", "OTHER_USER", "not_local", "peer_uid"]
