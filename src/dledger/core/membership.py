"""Membership: the group's configuration, as a CONFIG_CHANGE entry (magic 3) carries it.

A configuration names every member with its address, split into voters (they elect and
count for commit) and learners (they receive the log and snapshots, count for neither).
Each CONFIG_CHANGE entry holds a whole configuration, not a delta: a member that reads the
newest one in its log (or its snapshot's) knows the group without replaying the others.
Changes go one server at a time (Raft thesis §4.1): a configuration takes effect on a member
as soon as the entry is in its log, committed or not, and the leader refuses a new change
while an earlier one is uncommitted (docs/architecture.md, "Membership").
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from dledger.codes import ResponseCode
from dledger.core.messages import Index, Msg, Name

MAX_MEMBERS = 64
Address = Annotated[str, msgspec.Meta(max_length=300)]


class Membership(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=False):
    """voters and learners: id -> "host:port" (a client's address of the member)."""

    voters: Annotated[dict[Name, Address], msgspec.Meta(max_length=MAX_MEMBERS)]
    learners: Annotated[dict[Name, Address], msgspec.Meta(max_length=MAX_MEMBERS)] = {}

    @property
    def members(self) -> dict[str, str]:
        return {**self.voters, **self.learners}

    def is_voter(self, member: str) -> bool:
        return member in self.voters

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def peers_string(self) -> str:
        """The voters and learners in the `--peers` form (`id-host:port;...`), voters first."""
        return ";".join(f"{i}-{a}" for i, a in self.members.items())


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Membership)


def encode_membership(m: Membership) -> bytes:
    """The body of a CONFIG_CHANGE entry."""
    return _encoder.encode(m)


def decode_membership(body: bytes) -> Membership:
    """A CONFIG_CHANGE entry's body; msgspec.DecodeError / ValidationError when damaged."""
    return _decoder.decode(body)


# --- the wire: MEMBERS (anyone who may read metadata) and CHANGE_MEMBERS (admin) -------------


class MembersRequest(Msg):
    pass


class MemberInfo(msgspec.Struct, array_like=True):
    id: str
    addr: str
    voter: bool
    match_index: int = -1  # as the leader knows it (-1: unknown, or not answered by the leader)
    lag: int = -1  # leader's end index - match_index (-1: unknown)


class MembersResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    term: int = -1
    config_index: int = -1  # index of the CONFIG_CHANGE entry in force (-1: the command line's)
    committed: bool = True  # that entry is committed
    members: list[MemberInfo] = []
    message: str = ""


CHANGE_OPS = ("add-learner", "promote", "remove")


class ChangeMembersRequest(Msg):
    op: Annotated[str, msgspec.Meta(max_length=16)] = ""  # one of CHANGE_OPS
    member_id: Name = ""
    addr: Address = ""  # add-learner only


class ChangeMembersResponse(msgspec.Struct, array_like=True):
    code: int
    leader_id: str = ""
    term: int = -1
    config_index: Index = -1  # the CONFIG_CHANGE entry appended (its commit is awaited before answering)
    message: str = ""


CHANGE_REFUSALS = (
    ResponseCode.MEMBERSHIP_CHANGE_PENDING,
    ResponseCode.LEARNER_BEHIND,
    ResponseCode.UNKNOWN_MEMBER,
    ResponseCode.MEMBER_EXISTS,
)
