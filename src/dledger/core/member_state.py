"""MemberState: who this member is, its role, term, vote and known leader, and the group's
configuration in force (core.configs: the newest in its log, committed or not)."""

from __future__ import annotations

import logging

from dledger.core.messages import Role
from dledger.membership import Membership
from dledger.store.base import LedgerStore

log = logging.getLogger(__name__)


class MemberState:
    def __init__(self, group: str, self_id: str, members: list[str] | Membership, store: LedgerStore) -> None:
        """`members`: the configuration (a list of ids: every one a voter, addresses unknown)."""
        self.group = group
        self.self_id = self_id
        self.membership = members if isinstance(members, Membership) else Membership({p: "" for p in members})
        # every other member a leader replicates to and heartbeats: voters and learners of the
        # configuration in force and of the committed one (a member being removed hears of its
        # removal); the Node keeps it in step with the configuration (Node._sync_members)
        self.others = [p for p in self.membership.members if p != self_id]
        # a voter in the committed configuration (set with it by Node._sync_members): it may
        # campaign while a configuration removing it is not committed (below, `may_campaign`)
        self.committed_voter = self.self_id in self.membership.voters
        self.committed_members: frozenset[str] = frozenset(self.membership.members)  # of the committed one
        # a known member's committed configuration, newer than our log's, does not name us
        # (core.config_probe): we never campaign
        self.removed = False
        # voters of a configuration newer than our log's that a member we know named, each until
        # when (ms, the node's clock): their leader messages and votes are taken (core.config_probe)
        self.vouched: dict[str, int] = {}
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

    @property
    def peer_ids(self) -> list[str]:
        """Every member of the configuration in force, voters first."""
        return list(self.membership.members)

    @property
    def voters(self) -> dict[str, str]:
        return self.membership.voters

    @property
    def is_voter(self) -> bool:
        """Only voters campaign, and only their acknowledgements count (commit, reads, check-quorum)."""
        return self.self_id in self.membership.voters

    @property
    def may_campaign(self) -> bool:
        """A voter, or one whose removal is not committed yet: a member that appended its own
        removal may hold the newest log, which the voters need to elect anyone; it campaigns,
        counting the votes of the voters in force but not its own (thesis §4.2.2)."""
        return not self.removed and (self.is_voter or self.committed_voter)

    @property
    def other_voters(self) -> list[str]:
        return [p for p in self.membership.voters if p != self.self_id]

    @property
    def alone(self) -> bool:
        """The only voter: its own acknowledgement is a majority."""
        return self.is_voter and len(self.membership.voters) == 1

    @property
    def quorum(self) -> int:
        """A majority of the voters."""
        return len(self.membership.voters) // 2 + 1

    def is_quorum(self, n: int) -> bool:
        return n >= self.quorum

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER
