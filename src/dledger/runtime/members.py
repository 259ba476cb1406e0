"""Who the members of a group are now, for the runtime: addresses and identities follow the
configuration in force on this member (core.membership), not the command line it started with.

A group's configuration changes with CONFIG_CHANGE entries (docs/operations.md); the node
keeps the one in force. The command line's `peers` (and `peer_listen`) stay the fallback for
a node that knows no configuration entry yet, and name the member-only address of a member
whose client address did not change (a configuration records client addresses only).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dledger.config import DLedgerConfig, Peer
from dledger.core.membership import Membership

if TYPE_CHECKING:
    from dledger.core.node import Node

log = logging.getLogger(__name__)


def node_membership(node: Node) -> Membership:
    """The configuration in force on `node` (core.configs.ConfigHistory.current: its newest
    CONFIG_CHANGE entry, committed or not; else its snapshot's, the one it joined with, or the
    command line's): what addresses and member identities follow."""
    return node.configs.current


class MemberAddresses:
    """Addresses of a group's members under its current configuration, and the command line's
    as the fallback (`DLedgerConfig.peers` / `peer_listen`)."""

    def __init__(self, cfg: DLedgerConfig) -> None:
        self._clients: dict[str, Peer] = cfg.peer_map  # the command line's client addresses
        self._members: dict[str, Peer] = cfg.member_map  # ... and member-only ones (peer_listen)
        self.membership: Membership | None = None
        # member id -> last address of a member the configuration dropped: the node may still
        # send to it (a leader tells a removed member nothing more, but a Send under way ends)
        self.former: dict[str, str] = {}

    def update(self, membership: Membership | None) -> set[str]:
        """Adopt the configuration in force; the member ids it no longer has (their
        connections are to be dropped)."""
        before = {i: self.address_of(i) for i in self.ids()}
        self.membership = membership
        removed = set(before) - set(self.ids())
        for i in removed:
            if before[i]:
                self.former[i] = before[i]  # type: ignore[assignment]
        for i in self.ids():
            self.former.pop(i, None)
        return removed

    def send_address(self, member_id: str) -> str | None:
        """Where to send what the node addresses to `member_id`: its address in the
        configuration in force, else the last one it had (a member just removed)."""
        return self.address_of(member_id) or self.former.get(member_id)

    def ids(self) -> list[str]:
        """Every member id (voters, then learners) of the configuration in force."""
        if self.membership is None:
            return list(self._clients)
        return list(self.membership.members)

    def client_address(self, member_id: str) -> str | None:
        """Where clients reach `member_id` (None: not a member)."""
        if self.membership is None:
            p = self._clients.get(member_id)
            return p.address if p is not None else None
        return self.membership.members.get(member_id)

    def address_of(self, member_id: str) -> str | None:
        """Where members reach `member_id` (None: not a member): its `peer_listen` address when
        the command line gave one and its client address is still the configuration's, else
        the configuration's (client) address."""
        client = self.client_address(member_id)
        if client is None:
            return None
        cmdline = self._clients.get(member_id)
        member = self._members.get(member_id)
        if member is not None and cmdline is not None and cmdline.address == client:
            return member.address
        return client

    def member_addresses(self) -> dict[str, str]:
        """member-to-member address -> member id, of every member (a server's check that the
        member it reached is the one the address belongs to)."""
        out: dict[str, str] = {}
        for i in self.ids():
            a = self.address_of(i)
            if a is not None:
                out[a] = i
        return out

    def peers_string(self) -> str:
        """The configuration in `--peers` form (client addresses)."""
        return ";".join(f"{i}-{self.client_address(i)}" for i in self.ids())


__all__ = ["MemberAddresses", "node_membership"]
