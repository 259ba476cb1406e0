"""Free TCP ports on 127.0.0.1 for local groups: `dledger cluster`-style demos, benchmarks, tests.

Ports are drawn below the kernel's ephemeral range when it leaves room: a member restarted
later must be able to bind its port again, and an outgoing connection only ever takes a
port from the ephemeral range.
"""

from __future__ import annotations

import os
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
    lo, hi = (20000, low - n - 1) if low > 21000 + n else (30000, 60000 - n)
    return _slice(lo, hi, n)


def _slice(lo: int, hi: int, n: int) -> tuple[int, int]:
    """DLEDGER_PORT_SLICE=k/m: this process (and the groups it starts) draws only from the k-th
    of m equal parts of the range, so test workers run side by side never draw one port."""
    k, _, m = os.environ.get("DLEDGER_PORT_SLICE", "").partition("/")
    if not (k.isdigit() and m.isdigit() and 0 <= int(k) < int(m)):
        return lo, hi
    width = (hi + n - lo) // int(m)
    start = lo + int(k) * width
    return start, start + width - n


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
