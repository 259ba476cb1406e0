"""NodeStatus: a frozen view of one member, what everything outside the core reads.

Metrics, `dledger status` (the METADATA answer), health, the controller and the simulator read
`Node.status()` instead of the node's parts (`quorum.pending`, the dispatchers, loose counters):
the parts can change shape without breaking their readers, and a reader cannot change them.
A reader that looks after every event (the simulator's invariants) reads `Node.role_view()`,
a handful of fields (building the whole status there doubled the simulator's time).
"""

from __future__ import annotations

import msgspec

from dledger.core.messages import Role


class RoleView(msgspec.Struct, frozen=True, gc=False):
    """The few facts a reader checks after every event (the simulator's invariants): cheap to
    build, unlike NodeStatus, which asks the store and every part."""

    role: Role
    term: int
    leader_id: str  # "" when none is known
    corrupt_index: int  # our first record known corrupt (-1: none)
    applied_index: int  # -1 without a state machine
    has_state_machine: bool

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER


class FollowerStatus(msgspec.Struct, frozen=True, gc=False):
    """The leader's view of one follower (its `Progress`)."""

    peer: str
    match_index: int
    needs_snapshot: bool  # it needs entries below our log begin: it gets a snapshot
    repair_index: int  # its first corrupt record, which we repair (-1: none)
    voter: bool = True  # False: a learner (or a member being removed)
    lag: int = -1  # our end index minus its match index (-1: unknown: not matched yet in this term)


class NodeStatus(msgspec.Struct, frozen=True):
    group: str
    self_id: str
    role: Role
    term: int
    leader_id: str  # "" when none is known
    begin_index: int
    end_index: int
    end_term: int
    committed_index: int
    durable_index: int
    pending_appends: int  # client appends waiting for the commit index
    store_error: str  # why the store cannot take writes ("" if it can)
    full: str  # why client appends are refused for want of space ("" if they are not)
    retention_held_by: str
    corrupt_index: int  # our first record known corrupt (-1: none)
    corrupt_reason: str
    applied_index: int  # -1 without a state machine
    snapshot_index: int
    state_machine_error: str  # why the state machine stopped ("" running, or none)
    has_state_machine: bool
    lease_valid: bool  # a leader inside its read lease
    leader_committed: int  # the highest commit index a leader's push named (a follower's lag)
    security_mode: str
    elections: int  # real (not pre-vote) rounds this member started
    leader_changes: int
    corruptions_found: int
    records_repaired: int
    snapshots_installed: int  # from leaders
    install_bytes_received: int
    installing: bool  # receiving a snapshot from the leader now
    install_index: int
    install_bytes: int
    install_total: int
    snapshots_sent: int  # installed by followers from us
    install_bytes_sent: int
    entries_read: int  # sent in answers to GET and READ
    read_body_bytes: int
    followers: tuple[FollowerStatus, ...] = ()  # a leader's view of each follower (empty otherwise)
    # the configuration in force (core.configs): (id, address) of each voter and learner
    voters: tuple[tuple[str, str], ...] = ()
    learners: tuple[tuple[str, str], ...] = ()
    config_index: int = -1  # its CONFIG_CHANGE entry (-1: the command line's peers)
    config_committed: bool = True  # that entry is committed
    committed_config_index: int = -1  # the newest committed configuration's entry
    not_a_member: bool = False  # neither the configuration in force nor the committed one names us

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER
