"""Progress: everything a leader knows of one follower (etcd's `Progress`).

One object per other member, kept for the node's life. The replication facts (match,
durable prefix, what it committed, disk faults, installs, repairs, when it last answered)
are valid only in the leadership that learnt them: `begin_term` clears them when this member
wins an election. What its heartbeat answers said of its disk (`store_full`) and of its records
(`corrupt`) survives, replaced by its next answer.

The dispatcher (replication), the elector (heartbeats, check-quorum, transfers) and the quorum
(commit index) all read and write the same object, and two questions have one answer each:
`fit_to_lead` (may leadership be handed to it) and `retention_hold` (the first entry retention
keeps for it).
"""

from __future__ import annotations

from dataclasses import dataclass

NEVER = -(1 << 62)  # "not heard from in this leadership"


@dataclass(slots=True)
class Progress:
    peer: str
    match_index: int = -1  # highest index known equal to our log (this term)
    durable: int = -1  # highest `durable_index` it reported in this term (what a sync leader counts)
    follower_commit: int = -1  # the commit index it acknowledged knowing
    last_ack: int = NEVER  # when it last answered with success, in this leadership
    disk_fault: bool = False  # its disk answered DISK_FULL / DISK_ERROR to our last push
    needs_snapshot: bool = False  # it needs entries below our log begin (metric)
    installed_through: int = -1  # it installed our snapshot through here and is catching up
    repair_index: int = -1  # its first corrupt record, which we send again (-1: none)
    store_full: bool | None = None  # its heartbeat answers: it refuses client appends (None: not heard yet)
    corrupt: bool = False  # its answers report a corrupt record of its own
    lease_ms: int = 0  # its own lease, from its heartbeat answers (0: not said): core.elector.read_lease_ms

    def begin_term(self) -> None:
        """This member won an election: what it learnt of the follower in an earlier leadership
        of its own proves nothing now (a dispatcher's epochs restart every term)."""
        self.match_index = self.durable = self.follower_commit = -1
        self.last_ack = NEVER
        self.disk_fault = self.needs_snapshot = False
        self.installed_through = self.repair_index = -1

    def lost(self) -> None:
        """Its log now ends below what it had acknowledged (wiped, or a crash cut its unsynced
        tail): it counts toward nothing until it acknowledges entries anew."""
        self.match_index = self.durable = -1

    def counted(self, sync: bool) -> int:
        """Its mark toward the commit index: the match index, or in `sync` flush mode only the
        prefix it reported fsynced and equal to our log."""
        return self.durable if sync else self.match_index

    def heard_within(self, now: int, window_ms: int, since: int) -> bool:
        """It answered within `window_ms` of `now` (`since`: when it is taken to have answered
        if it has not yet in this leadership)."""
        return now - (self.last_ack if self.last_ack != NEVER else since) < window_ms

    def fit_to_lead(self, now: int, lease_ms: int, end_index: int) -> bool:
        """May leadership be handed to it at once: alive within a lease, holding our whole log,
        its disk known to have room (an unknown disk is not: its first heartbeat answer says),
        no corrupt record, and no disk fault on our last push. The strict rule where the two
        older checks disagreed: a hand-over to a member that then refuses every client append is
        a failover for nothing, a wait for one heartbeat costs little."""
        return (now - self.last_ack < lease_ms and self.store_full is False and not self.corrupt
                and not self.disk_fault and self.match_index >= end_index)

    def retention_hold(self, install_hold: int, plain_log: bool, floor: int) -> tuple[int, str] | None:
        """The first entry retention keeps for it if below `floor` (and why), else None:
        what follows a snapshot it installs (`install_hold`, -1: none), its fsynced end + 1 (a
        plain log only: with a state machine a lagging follower installs a snapshot instead),
        and a record of its own we are repairing. Ties keep the earlier reason."""
        held: tuple[int, str] | None = None
        p = self.peer
        if 0 <= install_hold < floor:
            why = f"follower {p} (installing a snapshot, or catching up after one)"
            floor, held = install_hold, (install_hold, why)
        if plain_log and self.durable + 1 < floor:
            floor, held = self.durable + 1, (self.durable + 1, f"follower {p}")
        if 0 <= self.repair_index < floor:  # our copy is what can repair its record
            held = (self.repair_index, f"follower {p} (repairing record {self.repair_index})")
        return held
