"""Membership: a group's configuration (voters and learners with their addresses), as a
CONFIG_CHANGE entry (magic 3) and a snapshot's meta carry it.

It lives below `core` and `statemachine` (both store it: the log's entries, the snapshots'
meta.json); `dledger.core.membership` is its public name, beside the MEMBERS and CHANGE_MEMBERS
messages. A configuration names every member with its address, split into voters (they elect
and count for commit) and learners (they receive the log and snapshots, count for neither).
Each CONFIG_CHANGE entry holds a whole configuration, not a delta: a member that reads the
newest one in its log (or its snapshot's) knows the group without replaying the others.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from dledger.config import ConfigError, parse_peers

MAX_MEMBERS = 64
Address = Annotated[str, msgspec.Meta(max_length=300)]
MemberId = Annotated[str, msgspec.Meta(max_length=128)]


class Membership(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=False):
    """voters and learners: id -> "host:port" (a client's address of the member)."""

    voters: Annotated[dict[MemberId, Address], msgspec.Meta(max_length=MAX_MEMBERS)]
    learners: Annotated[dict[MemberId, Address], msgspec.Meta(max_length=MAX_MEMBERS)] = {}

    @property
    def members(self) -> dict[str, str]:
        return {**self.voters, **self.learners}

    def is_voter(self, member: str) -> bool:
        return member in self.voters

    def has(self, member: str) -> bool:
        return member in self.voters or member in self.learners

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def peers_string(self) -> str:
        """The voters and learners in the `--peers` form (`id-host:port;...`), voters first."""
        return ";".join(f"{i}-{a}" for i, a in self.members.items())

    @classmethod
    def from_peers(cls, peers: str) -> Membership:
        """A command line's (or an older snapshot's) peers string: every member a voter."""
        return cls({p.id: p.address for p in parse_peers(peers).values()})


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Membership)


def encode_membership(m: Membership) -> bytes:
    """The body of a CONFIG_CHANGE entry."""
    return _encoder.encode(m)


def decode_membership(body: bytes | memoryview) -> Membership:
    """A CONFIG_CHANGE entry's body; msgspec.DecodeError / ValidationError when damaged."""
    return _decoder.decode(body)


def membership_of(members: str | Membership | None, fallback: Membership) -> Membership:
    """What a snapshot's `members` says: a Membership, or (snapshots taken before membership
    changes existed) a peers string, every member a voter; `fallback` when it says nothing."""
    if isinstance(members, Membership):
        return members
    if members:
        try:
            return Membership.from_peers(members)
        except ConfigError:
            return fallback
    return fallback
