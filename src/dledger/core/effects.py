"""Effects: what a role object asks of other parts of its member, as values.

A role object (core.handler.EntryHandler, core.dispatcher.EntryDispatcher) does not call
these parts itself: it appends effects to its `effects` list, in order, and the node takes
them (`take_effects`) right after each call and applies them in one place
(`Node._apply_effects`), in that order, before any other part reads the state they change.
A unit test reads them instead of recording calls on a fake. Role changes are not effects
(docs/architecture.md, "Role objects and their contexts"): they must take effect inside the
step that caused them.

Frozen: the values may be kept (a test compares them); msgspec structs for the hot path
(a `PushReply` per push). Only `PushReply` may hold a reference cycle (its token).
"""

from __future__ import annotations

from typing import Any

import msgspec

from dledger.core.messages import PushResponse


class MarkCorrupt(msgspec.Struct, frozen=True, gc=False):
    """One of our records fails verification (core.integrity.Integrity.mark; a leader then
    hands leadership over)."""

    index: int
    reason: str


class ForgetCorruptAbove(msgspec.Struct, frozen=True, gc=False):
    """A truncate removed our records after `end`: a corrupt one among them is gone."""

    end: int


class BeyondRepair(msgspec.Struct, frozen=True, gc=False):
    """The leader's log begins at `leader_begin`: it cannot repair what lies below."""

    leader_begin: int


class Repaired(msgspec.Struct, frozen=True, gc=False):
    """A REPAIR push covered records [first, last]; `indexes` were rewritten from its copies."""

    first: int
    last: int
    indexes: tuple[int, ...]


class Pump(msgspec.Struct, frozen=True, gc=False):
    """Run the dispatchers' pump before the next actions are handed out (`Node.drain`)."""


class PushReply(msgspec.Struct, frozen=True):
    """Answer push `token` with `resp`. Its `corrupt_index` is what the handler knows (-1, or
    the record a failed read just named); when the reply is applied, the member's own first
    corrupt record, if any, takes its place: an answer always names the member's integrity
    as it stands after the effects before it."""

    token: Any
    resp: PushResponse


Effect = MarkCorrupt | ForgetCorruptAbove | BeyondRepair | Repaired | Pump | PushReply
