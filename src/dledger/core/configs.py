"""ConfigHistory: the configurations of one member's log, the newest in force.

Single-server changes (Raft thesis §4.1): a configuration takes effect on a member as soon as
its CONFIG_CHANGE entry is in the member's log, committed or not, and stops when a truncate
removes the entry (the one before it is in force again). So the history keeps every
configuration entry above the commit index, plus the newest one at or below it (and what a
snapshot at the log's begin needs: `at`); its first element is the base — a snapshot's
configuration, or the command line's peers for a group that never changed (index -1).
A few elements: changes go one at a time and each must commit before the next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from dledger.entry import MAGIC_CONFIG_CHANGE
from dledger.membership import Membership, decode_membership
from dledger.store.base import LedgerStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChangeToken:
    """A CHANGE_MEMBERS request waiting in the quorum like an append (core.quorum): answered
    with a ChangeMembersResponse once its entry commits."""

    token: Any


class ConfigHistory:
    def __init__(self, base_index: int, base: Membership) -> None:
        self._entries: list[tuple[int, Membership]] = [(base_index, base)]
        self.version = 0  # grows whenever the configuration in force may have changed

    # --- reading ---------------------------------------------------------------------------

    @property
    def current(self) -> Membership:
        return self._entries[-1][1]

    @property
    def index(self) -> int:
        """The CONFIG_CHANGE entry in force (-1: the command line's peers)."""
        return self._entries[-1][0]

    def at(self, index: int) -> tuple[int, Membership]:
        """The configuration in force at log index `index` (the oldest known below the base)."""
        for i, m in reversed(self._entries):
            if i <= index:
                return i, m
        return self._entries[0]

    def committed(self, commit_index: int) -> tuple[int, Membership]:
        """The newest configuration whose entry is committed (a committed one never rolls back)."""
        return self.at(commit_index)

    def known(self, member: str) -> bool:
        """`member` is in a configuration this member knows (current, pending or committed)."""
        return any(m.has(member) for _, m in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # --- the log changed -----------------------------------------------------------------------

    def appended(self, store: LedgerStore, first: int, last: int) -> bool:
        """Entries first..last were appended: the CONFIG_CHANGE ones among them take effect now.
        True if one did."""
        found = False
        for i in store.indexes_with_magic(first, last, MAGIC_CONFIG_CHANGE):
            if i <= self._entries[-1][0]:
                continue
            entry = store.get(i)  # CorruptEntryError: the caller marks the record
            if entry.magic != MAGIC_CONFIG_CHANGE:
                # the record says otherwise (a stale or foreign checkpoint's marker): a client's
                # entry body is never taken for a configuration
                log.error("entry %d was listed as a configuration change but is not one (magic %d): ignored",
                          i, entry.magic)
                continue
            body = entry.body
            try:
                m = decode_membership(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                # (the body CRC matched: the leader wrote it so; nothing to take from it)
                log.error("configuration entry %d is unreadable (%s): ignored", i, e)
                continue
            self._entries.append((i, m))
            found = True
        if found:
            self.version += 1
        return found

    def add(self, index: int, m: Membership) -> None:
        """The leader appended configuration `m` at `index`."""
        self._entries.append((index, m))
        self.version += 1

    def truncated(self, from_index: int) -> bool:
        """Entries from `from_index` on were removed: their configurations with them (never the
        base: committed entries are never truncated). True if the one in force changed."""
        n = len(self._entries)
        while len(self._entries) > 1 and self._entries[-1][0] >= from_index:
            self._entries.pop()
        if len(self._entries) != n:
            self.version += 1
            return True
        return False

    def reset(self, index: int, m: Membership) -> None:
        """The log was replaced by a snapshot holding configuration `m` (of entry `index`)."""
        self._entries = [(index, m)]
        self.version += 1

    def forget_before(self, index: int) -> None:
        """Keep the newest configuration at or below `index` (a committed point the log still
        holds or a snapshot covers) and everything after it."""
        k = 0
        for j, (i, _) in enumerate(self._entries):
            if i <= index:
                k = j
        if k:
            del self._entries[:k]
