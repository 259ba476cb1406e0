"""Fault injection for tests and chaos runs: simulated partitions and slow links.

One object per process (or per server), built only when it runs with
--enable-fault-injection, holds every hook: the addresses its TransportClients refuse to
reach, the member ids each hosted group drops traffic to and from, and a broker's HA cuts.
Everything that obeys it holds it as `faults: FaultInjector | None`; without one (the
production path) nothing of this is consulted: a single `is not None` test, no lookups.
The members' and brokers' FAULT requests set it.
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
        # a member's, per hosted group: the ids it drops traffic to and from, and whether it
        # still sends its hand-overs of a leadership transfer (set_member)
        self._dropped: dict[str, frozenset[str]] = {}
        self._spare_handover: dict[str, bool] = {}
        # a broker's: send nothing to the slaves (a master); no connection to the master (a slave)
        self.ha_paused = False
        self.ha_cut = False

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

    def set_member(self, group: str, ids: Iterable[str], spare_handover: bool, addresses: Iterable[str]) -> None:
        """A member of `group` drops all traffic to and from `ids` (at `addresses`); with
        `spare_handover` it drops it at its own door only (its client still reaches them)
        and still sends its hand-over of a leadership transfer. Blocked addresses are the
        process's: the last FAULT request sets them (as it always did)."""
        self._dropped[group] = frozenset(ids)
        self._spare_handover[group] = spare_handover
        self.unblock_all()
        addresses = list(addresses)
        if addresses and not spare_handover:
            self.block(addresses)

    def drops_from(self, group: str, sender: str) -> bool:
        """Whether a request from member `sender` of `group` is dropped on arrival."""
        return bool(sender) and sender in self._dropped.get(group, ())

    def drops_to(self, group: str, peer: str, handover: bool) -> bool:
        """Whether a request to member `peer` of `group` is dropped before it is sent
        (`handover`: it is the hand-over of a leadership transfer)."""
        if peer not in self._dropped.get(group, ()):
            return False
        return not (handover and self._spare_handover.get(group, False))

    def subscribe(self, listener: Callable[[frozenset[str]], None]) -> None:
        """`listener` is told of every block (a client drops its connections to those addresses)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[frozenset[str]], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)


def _as_addresses(addresses: Iterable[str] | str) -> list[str]:
    return [addresses] if isinstance(addresses, str) else list(addresses)

