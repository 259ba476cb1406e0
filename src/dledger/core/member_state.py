"""MemberState: who this member is, its role, term, vote and known leader."""

from __future__ import annotations

import logging

from dledger.core.messages import Role
from dledger.store.base import LedgerStore

log = logging.getLogger(__name__)


class MemberState:
    def __init__(self, group: str, self_id: str, peer_ids: list[str], store: LedgerStore) -> None:
        self.group = group
        self.self_id = self_id
        self.peer_ids = list(peer_ids)
        self.others = [p for p in peer_ids if p != self_id]
        self.quorum = len(peer_ids) // 2 + 1
        self.store = store
        saved = store.load_term()
        self.term = saved.term
        self.voted_for = saved.voted_for
        self.role = Role.FOLLOWER
        self._leader_id: str | None = None
        self.leader_changes = 0  # times the leader known here became another member (metrics)
        self._last_leader: str | None = None

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    @leader_id.setter
    def leader_id(self, leader: str | None) -> None:
        self._leader_id = leader
        if leader is not None and self._last_leader != leader:
            if self._last_leader is not None:  # (the first one known after a start is no change)
                self.leader_changes += 1
            self._last_leader = leader

    def set_term(self, term: int, voted_for: str | None = None) -> None:
        """Persist, then adopt, a new term. The vote always resets with the term:
        carrying a vote into a new term is the flaw of a vote kept across terms (Raft thesis §3.4)."""
        if term < self.term:
            raise ValueError(f"term must not go back ({term} < {self.term})")
        if term > self.term:
            self.store.save_term(term, voted_for)
            self.term, self.voted_for, self.leader_id = term, voted_for, None

    def vote_for(self, candidate: str) -> None:
        """Persist the vote before it is granted, so a restart cannot vote twice."""
        if self.voted_for != candidate:
            self.store.save_term(self.term, candidate)
            self.voted_for = candidate

    def is_quorum(self, n: int) -> bool:
        return n >= self.quorum

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER
