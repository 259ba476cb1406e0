"""Membership (dledger.membership, re-exported here): the group's configuration, as a
CONFIG_CHANGE entry (magic 3) carries it; the MEMBERS and CHANGE_MEMBERS messages.

A configuration names every member with its address, split into voters (they elect and
count for commit) and learners (they receive the log and snapshots, count for neither).
Each CONFIG_CHANGE entry holds a whole configuration, not a delta: a member that reads the
newest one in its log (or its snapshot's) knows the group without replaying the others.
Changes go one server at a time (Raft thesis §4.1): a configuration takes effect on a member
as soon as the entry is in its log, committed or not, and the leader refuses a new change
while an earlier one is uncommitted (docs/architecture.md, "Membership").
"""

from __future__ import annotations

from dledger.core.messages import (
    CHANGE_OPS,
    CHANGE_REFUSALS,
    MEMBERSHIP_TYPES,
    ChangeMembersRequest,
    ChangeMembersResponse,
    MemberInfo,
    MembersRequest,
    MembersResponse,
)
from dledger.membership import (
    MAX_MEMBERS,
    Address,
    Membership,
    decode_membership,
    encode_membership,
    membership_of,
)

__all__ = [
    "CHANGE_OPS",
    "CHANGE_REFUSALS",
    "MAX_MEMBERS",
    "MEMBERSHIP_TYPES",
    "Address",
    "ChangeMembersRequest",
    "ChangeMembersResponse",
    "MemberInfo",
    "MembersRequest",
    "MembersResponse",
    "Membership",
    "decode_membership",
    "encode_membership",
    "membership_of",
]
