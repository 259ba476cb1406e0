"""Membership changes, a part of `Node` (core.node) carved out of it (docs/architecture.md,
"Membership"): the configuration in force followed as the log changes (core.configs), the
leader's CHANGE_MEMBERS (one change at a time, answered once committed), MEMBERS, a removed
leader's hand-over, what a member knows of its own removal, and the configuration at start.

`MembershipPath` holds no state of its own; what it reads and calls of the node is declared
below.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dledger.address import Address, AddressError, parse_address
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig, parse_peers
from dledger.core.configs import ChangeToken, ConfigHistory
from dledger.core.messages import (
    CHANGE_OPS,
    ChangeMembersRequest,
    ChangeMembersResponse,
    MemberInfo,
    MembersResponse,
)
from dledger.core.progress import NEVER, Progress
from dledger.entry import MAGIC_CONFIG_CHANGE
from dledger.membership import MAX_MEMBERS, Membership, encode_membership, membership_of
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.base import AppendedBatch, CorruptEntryError, LedgerStore, StoreError

if TYPE_CHECKING:
    from collections.abc import Iterator

    import msgspec

    from dledger.core.config_probe import ConfigProbe
    from dledger.core.dispatcher import EntryDispatcher
    from dledger.core.elector import LeaderElector
    from dledger.core.member_state import MemberState
    from dledger.core.quorum import QuorumAckChecker
    from dledger.statemachine.applier import Applier

log = logging.getLogger(__name__)


class MembershipPath:
    """The Node's membership: the configuration followed, changed, reported."""

    if TYPE_CHECKING:  # the node's, used here
        cfg: DLedgerConfig
        store: LedgerStore
        member: MemberState
        elector: LeaderElector
        quorum: QuorumAckChecker
        applier: Applier | None
        snapshot_meta: SnapshotMeta | None
        configs: ConfigHistory
        probe: ConfigProbe
        progress: dict[str, Progress]
        dispatchers: dict[str, EntryDispatcher]
        now: int
        _synced: tuple[int, int]
        _left_in_term: int

        def reply(self, token: Any, code: int, msg: msgspec.Struct, data: bytes = b"") -> None: ...
        def request_pump(self) -> None: ...
        def mark_corrupt(self, index: int, reason: str) -> None: ...
        def step_down(self, reason: str) -> None: ...
        def _fit_followers(self) -> Iterator[str]: ...
        def _new_dispatcher(self, peer: str) -> EntryDispatcher: ...


    @property
    def not_a_member(self) -> bool:
        """Neither the configuration in force nor the committed one names us: removed (or not
        added yet), or a known member's committed configuration newer than ours does not
        (core.config_probe). We answer clients NOT_A_MEMBER and never campaign."""
        sid, c = self.member.self_id, self.configs
        gone = not c.current.has(sid) and not c.committed(self.store.committed_index)[1].has(sid)
        return gone or self.probe.removed

    def log_appended(self, first: int, last: int) -> None:
        """Entries first..last were appended (from a leader): a configuration among them is in
        force from now on, committed or not (thesis §4.1)."""
        try:
            changed = self.configs.appended(self.store, first, last)
        except CorruptEntryError as e:
            self.mark_corrupt(e.index, e.message)
            return
        if changed:
            self._sync_members()

    def log_truncated(self, end: int) -> None:
        """Our log now ends at `end`: a configuration entry removed with the rest stops being in
        force, the one before it is again."""
        if self.configs.truncated(end + 1):
            self._sync_members()

    def _sync_members(self) -> None:
        """Follow the configuration in force and the committed one (cheap when neither changed):
        the member state's voters; a Progress (and, leading, a dispatcher that starts at COMPARE
        from our end) for every other member of either — a member being removed keeps
        receiving the log until its removal commits, so it can learn of it; a dropped one's
        dispatcher stops and the answers to what it sent find nothing. A leader removed by a
        committed configuration hands over (`_leave`)."""
        c, store, m = self.configs, self.store, self.member
        cidx, committed = c.committed(store.committed_index)
        key = (c.version, cidx)
        if key != self._synced:
            self._synced = key
            self.probe.caught_up()
            before = m.membership
            m.membership = c.current
            m.committed_voter = committed.is_voter(m.self_id)
            m.committed_members = frozenset(committed.members)
            wanted = [p for p in {**c.current.members, **committed.members} if p != m.self_id]
            m.others = wanted
            for p in wanted:
                if p not in self.progress:
                    self.progress[p] = Progress(p)
                    if m.is_leader:
                        self.dispatchers[p] = self._new_dispatcher(p)
                        self.request_pump()
            for p in [p for p in self.progress if p not in wanted]:
                del self.progress[p]
                d = self.dispatchers.pop(p, None)
                if d is not None:
                    d.sender.stop()
                if m.is_leader and not c.current.has(p):
                    self.elector.farewell(p)  # its removal committed: tell it
            c.forget_before(min(store.begin_index - 1, store.committed_index))
            if before != m.membership:
                log.info("%s/%s: configuration %d in force (%s): voters %s, learners %s", m.group, m.self_id,
                         c.index, "committed" if c.index <= store.committed_index else "not committed yet",
                         ",".join(m.membership.voters), ",".join(m.membership.learners) or "none")
            if m.is_leader:
                self.quorum.advance()  # fewer voters may make an entry committed now
        # only once the configuration that removes us is in force AND committed (thesis §4.2.2): a
        # member promoted and elected before it learned the promotion committed is no removed leader
        m.removed = self.probe.removed
        if m.is_leader and not m.is_voter and not c.committed(store.committed_index)[1].is_voter(m.self_id):
            self._leave()

    def _leave(self) -> None:
        """A committed configuration removed us, the leader (thesis §4.2.2: we managed the group
        until it committed, not counting ourselves): hand over to the most caught-up voter, or
        step down when there is none (or a hand-over in this term failed already)."""
        m, el = self.member, self.elector
        if el.transferring:
            return
        why = f"removed from the voters by configuration entry {self.configs.committed(self.store.committed_index)[0]}"
        target = next(self._fit_followers(), None)
        if target is None:
            lease = el.leader_lease_ms
            alive = [(pr.match_index, p) for p in m.other_voters if (pr := self.progress.get(p)) is not None
                     and pr.last_ack != NEVER and self.now - pr.last_ack < lease]
            target = max(alive)[1] if alive else None
        if target is None or self._left_in_term == m.term:
            self.step_down(why)
            return
        self._left_in_term = m.term
        log.info("%s/%s: %s; handing leadership to %s", m.group, m.self_id, why, target)
        el.begin_transfer(target, None)

    def members_view(self) -> MembersResponse:
        """The MEMBERS answer: our configuration in force, its entry and whether it is committed;
        a leader adds each member's match index and lag (its end index minus the match)."""
        m, c, store = self.member, self.configs, self.store
        cur, end = c.current, store.end_index
        infos = []
        for mid, addr in cur.members.items():
            match = lag = -1
            if m.is_leader:
                if mid == m.self_id:
                    match, lag = end, 0
                elif (pr := self.progress.get(mid)) is not None and pr.match_index >= 0:
                    match, lag = pr.match_index, end - pr.match_index
            infos.append(MemberInfo(mid, addr, cur.is_voter(mid), match, lag))
        return MembersResponse(200, m.leader_id or "", m.term, c.index, c.index <= store.committed_index, infos)

    def _change_members(self, msg: ChangeMembersRequest, token: Any) -> None:
        """CHANGE_MEMBERS on the leader: one change at a time, each a whole new configuration in
        a CONFIG_CHANGE entry, in force here at once and answered once committed (as an append,
        with its timeout). Refused while an earlier one is not committed, including a new
        leader's until its first entry (the NOOP) commits: one of its term must commit before
        a change (the thesis' fix of single-server changes)."""
        m, store, c = self.member, self.store, self.configs
        if not m.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER, f"leader is {m.leader_id or 'unknown'}")
        if self.elector.transferring:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING, "leadership transfer in progress")
        if c.index > store.committed_index:
            raise DLedgerError(ResponseCode.MEMBERSHIP_CHANGE_PENDING,
                               f"configuration entry {c.index} is not committed yet")
        if store.committed_index < self.quorum.term_start:  # a leader not ready yet: clients ask again
            raise DLedgerError(ResponseCode.LEADER_NOT_READY,
                               f"term {m.term}: the leader's first entry is not committed yet")
        new = self._changed(c.current, msg)
        self._check_live_quorum(new)
        res = store.append_as_leader([encode_membership(new)], m.term, MAGIC_CONFIG_CHANGE)
        c.add(res.first_index, new)
        log.info("%s/%s: %s %s: configuration entry %d", m.group, m.self_id, msg.op, msg.member_id,
                 res.first_index)
        self._sync_members()
        self.quorum.add(ChangeToken(token), res, self.now + self.cfg.max_wait_ack_ms)
        if self.cfg.flush == "async" or store.durable_index >= res.last_index:
            self.quorum.ack_self(res.last_index)
        else:
            store.request_flush()
        self.request_pump()

    def _changed(self, cur: Membership, msg: ChangeMembersRequest) -> Membership:
        """The configuration `msg` asks for, or the refusal (DLedgerError with its code)."""
        op, mid, addr = msg.op, msg.member_id, msg.addr
        if op not in CHANGE_OPS:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"op {op!r}: one of {', '.join(CHANGE_OPS)}")
        if not mid:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{op}: which member (an id)")
        if op == "add-learner":
            if cur.has(mid):
                raise DLedgerError(ResponseCode.MEMBER_EXISTS, f"{mid} is a member already")
            if len(mid) > MAX_MEMBER_ID:  # heartbeats name members in 128-character fields
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                                   f"member id {mid[:20]}...: at most {MAX_MEMBER_ID} characters")
            try:  # ONE address: a ";" would add members to every peers string built from it
                where = parse_address(addr, "learner address")
            except AddressError as e:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, str(e)) from None
            parse_peers(f"{mid}-{addr}")  # ConfigError (UNEXPECTED_ARGUMENT): a bad id
            owner = next((i for i, a in cur.members.items() if _same_address(a, where)), None)
            if owner is not None:
                raise DLedgerError(ResponseCode.MEMBER_EXISTS, f"{addr} is the address of member {owner}")
            if len(cur.members) >= MAX_MEMBERS:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"a group has at most {MAX_MEMBERS} members")
            return Membership(cur.voters, {**cur.learners, mid: addr})
        if op == "promote":
            if mid not in cur.learners:
                raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{mid} is not a learner"
                                   + (" (it is a voter)" if cur.is_voter(mid) else ""))
            pr, end, lag = self.progress.get(mid), self.store.end_index, self.cfg.learner_max_lag
            lease = self.cfg.heart_beat_time_interval_ms * self.cfg.max_heart_beat_leak
            silent = pr is not None and pr.last_ack != NEVER and self.now - pr.last_ack > lease
            if pr is None or pr.last_ack == NEVER or pr.match_index < 0 or end - pr.match_index > lag or silent:
                # caught up AND answering (thesis §4.2.1: its last round within an election timeout):
                # a learner that has stopped would cost the group a voter the moment it is promoted
                behind = "has not answered yet" if pr is None or pr.match_index < 0 else \
                    f"has not answered for {self.now - pr.last_ack} ms" if silent else \
                    f"is {end - pr.match_index} entries behind"
                raise DLedgerError(ResponseCode.LEARNER_BEHIND,
                                   f"learner {mid} {behind} (promoted within {lag}: learner_max_lag)")
            learners = dict(cur.learners)
            return Membership({**cur.voters, mid: learners.pop(mid)}, learners)
        if not cur.has(mid):
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{mid} is not a member")
        if cur.is_voter(mid) and len(cur.voters) == 1:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{mid} is the last voter")
        return Membership({i: a for i, a in cur.voters.items() if i != mid},
                          {i: a for i, a in cur.learners.items() if i != mid})

    def _check_live_quorum(self, new: Membership) -> None:
        """Refuse a change whose voters heard within the lease are fewer than its quorum: it
        would commit (the old majority is alive) and leave a group that can elect no one, as
        removing a live follower of three while another is down does (etcd's strict
        reconfiguration check). Adding a learner changes no voter, so it always passes."""
        if new.voters == self.configs.current.voters:
            return
        lease = self.cfg.heart_beat_time_interval_ms * self.cfg.max_heart_beat_leak
        live = [v for v in new.voters if v == self.member.self_id or self._heard(v, lease)]
        if len(live) < new.quorum:
            down = sorted(set(new.voters) - set(live))
            raise DLedgerError(ResponseCode.MEMBERSHIP_UNSAFE,
                               f"the new voters {','.join(new.voters)} need {new.quorum} live, only "
                               f"{len(live)} answered within {lease} ms (not: {','.join(down)}): bring them "
                               "back, or remove a dead member first")

    def _heard(self, member: str, lease: int) -> bool:
        pr = self.progress.get(member)
        return pr is not None and pr.last_ack != NEVER and self.now - pr.last_ack <= lease

    def _change_answered(self, token: Any, code: ResponseCode, res: AppendedBatch | None, message: str) -> None:
        m = self.member
        index = res.first_index if res is not None else -1
        leader = m.self_id if code == ResponseCode.SUCCESS else (m.leader_id or "")
        self.reply(token, RequestCode.CHANGE_MEMBERS, ChangeMembersResponse(int(code), leader, m.term, index, message))

    def _config_unsaved(self) -> int:
        """A plain log's newest committed configuration entry that no snapshot of ours holds yet
        (-1: none): retention keeps it, and a snapshot is taken to hold it."""
        if self.applier is not None:
            return -1
        cidx = self.configs.committed(self.store.committed_index)[0]
        saved = self.snapshot_meta.config_index if self.snapshot_meta is not None else -1
        return cidx if cidx > saved else -1


def recover_configs(cfg: DLedgerConfig, store: LedgerStore, snapshot: SnapshotMeta | None,
                     membership: Membership | None) -> ConfigHistory:
    """The configuration at start: the newest of our snapshot's and the CONFIG_CHANGE entries
    of the log after it; else `membership` (a joining member's), else the command line's peers
    (a group that never changed: once it has, the log or a snapshot holds the configuration, and
    retention keeps it until a snapshot does)."""
    base = membership if membership is not None else Membership.from_peers(cfg.peers)
    base_index = -1
    if snapshot is not None and snapshot.members:
        base, base_index = membership_of(snapshot.members, base), snapshot.config_index
    history = ConfigHistory(base_index, base)
    first = max(store.begin_index, base_index + 1)
    if store.end_index >= first:
        try:
            history.appended(store, first, store.end_index)
        except StoreError as e:  # a rotten configuration record: the scrub finds it, the leader repairs it
            log.error("%s/%s: reading the configuration entries of the log: %s", cfg.group, cfg.self_id, e)
    return history


MAX_MEMBER_ID = 64  # "follower <id> (...)" and "leader <id>" must fit a heartbeat's 128-character fields


def _same_address(text: str, where: Address) -> bool:
    """`text` names the same host and port (normalised: `[::1]` and `::1`, case of a name);
    "localhost" and 127.0.0.1 stay apart (telling them equal takes a resolver)."""
    try:
        a = parse_address(text)
    except AddressError:
        return text == str(where)
    return a.port == where.port and a.host.lower() == where.host.lower()
