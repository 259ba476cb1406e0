"""MemberEnv: what every role object of the core reads of its member.

Each role class (LeaderElector, EntryHandler, EntryDispatcher, SnapshotSender and -Receiver,
ReadIndex, FollowerReads) declares the narrow context it needs as a Protocol that extends
this one; the Node satisfies them all, and a unit test can pass something smaller.
"""

from __future__ import annotations

from typing import Protocol

from dledger.core.member_state import MemberState
from dledger.store.base import LedgerStore


class MemberEnv(Protocol):
    """The time (the driver's, passed in: the core reads no clock), the member's role, term
    and vote, and its log."""

    @property
    def now(self) -> int: ...
    @property
    def member(self) -> MemberState: ...
    @property
    def store(self) -> LedgerStore: ...
