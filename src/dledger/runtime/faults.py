"""Fault injection for tests and chaos runs: simulated partitions and slow links.

One object per process (or per server), handed to the TransportClients that should obey it;
a client built without one never consults any of this (the production path). The members'
and brokers' FAULT requests (started with --enable-fault-injection) set it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

__all__ = ["BLOCKED", "FaultInjector"]

# What a request to a blocked address fails with (NETWORK_ERROR), as a partition would.
BLOCKED = "{} blocked by fault injection"


class FaultInjector:
    """Simulated partitions and slow links for tests that run members as separate processes.

    Call it from the event loop thread of the clients that use it.
    """

    def __init__(self, blocked: Iterable[str] = (), delay_s: float = 0.0) -> None:
        self.blocked: set[str] = set(_as_addresses(blocked))
        self.delay_s = delay_s
        self._listeners: list[Callable[[frozenset[str]], None]] = []

    def block(self, addresses: Iterable[str] | str) -> None:
        """Cut these addresses off; live connections to them are dropped at once."""
        new = frozenset(_as_addresses(addresses))
        self.blocked |= new
        for listener in list(self._listeners):
            listener(new)

    def unblock_all(self) -> None:
        self.blocked.clear()

    def is_blocked(self, address: str) -> bool:
        return address in self.blocked

    def subscribe(self, listener: Callable[[frozenset[str]], None]) -> None:
        """`listener` is told of every block (a client drops its connections to those addresses)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[frozenset[str]], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)


def _as_addresses(addresses: Iterable[str] | str) -> list[str]:
    return [addresses] if isinstance(addresses, str) else list(addresses)

