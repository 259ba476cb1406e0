"""Free TCP ports on 127.0.0.1 for local groups: `dledger cluster`-style demos, benchmarks, tests.

Ports are drawn below the kernel's ephemeral range when it leaves room: a member restarted
later must be able to bind its port again, and an outgoing connection only ever takes a
port from the ephemeral range.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

HOST = "127.0.0.1"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _range(n: int) -> tuple[int, int]:
    low = _ephemeral_low()
    return (20000, low - n - 1) if low > 21000 + n else (30000, 60000 - n)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(n: int, avoid: Iterable[int] = ()) -> list[int]:
    """n distinct free ports, none of `avoid`."""
    lo, hi = _range(1)
    rng = random.SystemRandom()
    chosen: list[int] = []
    taken = set(avoid)
    while len(chosen) < n:
        p = rng.randint(lo, hi)
        if p not in taken and port_free(p):
            chosen.append(p)
            taken.add(p)
    return chosen


def free_port_run(n: int) -> int:
    """The first of n consecutive free ports (member nK on base + K)."""
    lo, hi = _range(n)
    rng = random.SystemRandom()
    while True:
        base = rng.randint(lo, hi)
        if all(port_free(base + k) for k in range(n)):
            return base
