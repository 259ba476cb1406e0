"""LeaderElector: elections with pre-vote, heartbeats, check-quorum and transfer (upstream's
DLedgerLeaderElector; docs/architecture.md).

Differences from DLedger, on purpose:
- a term change always clears the vote, persisted with the term (a vote kept across terms breaks Raft thesis §3.4);
- a receiver adopts a higher term at once (Raft), instead of DLedger's
  TERM_NOT_READY round trip;
- pre-vote: a candidate first asks whether it *could* win without raising its
  term; members that hear from a live leader say no, so a member cut off from
  the group does not drive the term up when it comes back;
- leader stickiness: a real vote is refused while the voter hears from a
  live leader, unless the candidate runs on the leader's behalf (transfer);
- a member whose store cannot write does not campaign (it would win and fail
  every append), and a win whose NOOP cannot be stored ends as a follower;
- a member holding a corrupt record neither campaigns nor takes a transfer until
  the leader repaired it (it still votes: its log end and last term are unchanged);
- membership (core.configs, docs/architecture.md "Membership"): only voters of the configuration
  in force campaign (and a member whose removal is not committed yet), take a hand-over or count
  (votes, check-quorum); a vote, real or pre-vote,
  goes only to a candidate that is a voter in the voter's configuration, so a removed member
  left running never raises anyone's term (thesis §4.2.3; leader stickiness refuses it too).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import Context, HeartbeatCtx, TransferCtx, VoteCtx
from dledger.core.env import MemberEnv
from dledger.core.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    ParseResult,
    Role,
    SimpleResponse,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.core.progress import NEVER, Progress
from dledger.core.starvation import RecentGaps, extra_wait
from dledger.ratelog import RateLimitedLog
from dledger.store.base import StoreError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Transfer:
    target: str
    token: Any  # client waiting for the outcome, or None (preferred-leader move)
    deadline: int
    sent: bool = False


class FollowerNotes(Protocol):
    """A follower's dispatcher, told what a heartbeat answer says (core.dispatcher.EntryDispatcher)."""

    def lost_match(self, end: int, matched: int) -> None: ...
    def note_durable(self, durable: int) -> None: ...
    def note_corrupt(self, index: int) -> None: ...
    def note_apply_needs(self, index: int) -> None: ...


class CommitNotes(Protocol):
    """The follower's side of commit and durability (core.handler.EntryHandler)."""

    def update_commit(self, leader_commit: int) -> None: ...
    def durable_match(self) -> int: ...


class ReadRounds(Protocol):
    """ReadIndex's heartbeat rounds and leases (core.read_index.ReadIndex)."""

    def next_round(self) -> int: ...
    def on_ack(self, peer: str, round_: int) -> None: ...
    def end_leases(self) -> None: ...


class ElectorContext(MemberEnv, Protocol):
    """All a LeaderElector needs of its member (the Node is one): the member, store, options,
    clock and randomness; what the leader knows of each follower (Progress) and their
    dispatchers; the follower's commit notes; ReadIndex's rounds; whether the member may lead
    (store space and faults, corruption, a state machine stuck, the retention floor); an
    outbox for requests and replies; and the role changes, which the node resets in one place
    (Node._change_role)."""

    @property
    def cfg(self) -> DLedgerConfig: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def progress(self) -> Mapping[str, Progress]: ...
    @property
    def dispatchers(self) -> Mapping[str, FollowerNotes]: ...
    @property
    def handler(self) -> CommitNotes: ...
    @property
    def reads(self) -> ReadRounds: ...
    @property
    def corrupt(self) -> tuple[int, str] | None: ...
    @property
    def corrupt_index(self) -> int: ...

    def unfit_to_lead(self) -> str: ...
    def full(self) -> StoreError | None: ...
    def apply_needs(self) -> int: ...
    def retention_floor(self) -> tuple[int, str]: ...
    def follow_retention_floor(self, floor: int, holder: str) -> None: ...
    def store_failed(self, e: StoreError) -> None: ...
    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Context, data: bytes | memoryview = b"",
             timeout_ms: int | None = None) -> None: ...
    def reply(self, token: Any, code: int, msg: msgspec.Struct) -> None: ...
    def become_candidate(self) -> None: ...
    def become_leader(self) -> bool: ...
    def follow(self, leader_id: str) -> None: ...
    def step_down(self, reason: str) -> None: ...


class LeaderElector:
    def __init__(self, env: ElectorContext) -> None:
        self.env = env
        cfg = env.cfg
        # how late what should come every heartbeat period came recently (our leader's messages,
        # our own ticks, our followers' answers): timeouts stretch to twice it (core.starvation)
        self.gaps = RecentGaps()
        self.hb_ms = cfg.heart_beat_time_interval_ms
        self.leader_lease_ms = cfg.heart_beat_time_interval_ms * cfg.max_heart_beat_leak
        self.leader_lease_hint = 0  # our leader's lease, from its heartbeats (it may be configured longer)
        self.last_leader_contact = -(1 << 62)
        self.election_deadline = env.now + self._election_timeout()
        self.last_tick = env.now
        self.graced_deadline = -1  # an election deadline already put off for a stall (see tick)
        self.quorum_check_after = 0  # a leader that stalled checks its quorum from then on
        self.quorum_checked_at = 0  # when check-quorum last ran (a stall postpones it once per check)
        self.stall_graces = 0  # how often (metrics, tests)
        self.round = 0
        self.round_active = False
        self.round_pre_vote = False
        self.round_deadline = 0
        self.next_round_at = 0
        self.accepted: set[str] = set()
        self.responses: dict[str, int] = {}
        self.next_heartbeat = 0
        self.leader_since = 0
        self.progress = env.progress  # what we know of each follower (core.progress)
        self.transfer: _Transfer | None = None
        self.awaiting: _Transfer | None = None  # transfer handed over; waiting for the new leader
        self.elections = 0  # real (not pre-vote) rounds started, for metrics
        # a (re)started member may have acknowledged a leader's heartbeat just before it went
        # down: it votes for no one for a lease, as if that leader were still alive (lease reads
        # rely on every acknowledging member keeping out of elections that long)
        self.no_vote_until = env.now + self.leader_lease_ms
        self._log = RateLimitedLog.on_ms(log, lambda: env.now)

    @property
    def transferring(self) -> bool:
        return self.transfer is not None

    # --- timing -----------------------------------------------------------------

    def _election_timeout(self) -> int:
        """Lease plus jitter; preferred members draw from the lower half so they
        usually campaign first."""
        cfg = self.env.cfg
        spread = cfg.max_vote_interval_ms - cfg.min_vote_interval_ms
        lo, hi = 0, spread
        if cfg.preferred_leader_ids:
            half = spread // 2
            lo, hi = (0, half) if cfg.self_id in cfg.preferred_leader_ids else (half, spread)
        # never before our leader's lease ends, however short ours is (mixed heartbeat settings)
        base = self._followed_lease_ms
        return base + self.starved_extra_ms(base) + self.env.rng.randint(lo, hi)

    def starved_extra_ms(self, base_ms: int) -> int:
        """What a timeout of `base_ms` waits longer on a machine where heartbeats came late
        recently (core.starvation; 0 on a quiet machine)."""
        return extra_wait(self.gaps.longest(self.env.now), base_ms, self.env.cfg.adaptive_timeout_max_ms)

    def _revote_delay(self) -> int:
        cfg = self.env.cfg
        return self.env.rng.randint(cfg.min_vote_interval_ms, cfg.max_vote_interval_ms)

    def leader_alive(self) -> bool:
        m = self.env.member
        if m.role == Role.LEADER:
            return True
        # on a starved machine as long as our own timeout (core.starvation): a member that
        # restarted, its gaps forgotten, would otherwise win votes the moment the lease ended.
        # Only ever longer than the lease: lease reads rely on this refusal lasting at least that
        lease = self._followed_lease_ms
        silent = self.env.now - self.last_leader_contact
        return m.leader_id is not None and silent < lease + self.starved_extra_ms(lease)

    @property
    def read_lease_ms(self) -> int:
        """The lease a leader's reads may count on: its own, or a voter's own when shorter. A
        follower keeps to our lease while it runs, but one that restarts has forgotten it and
        refuses votes only for its own (no_vote_until): with mixed heartbeat settings, ours
        counted in full would let a rival win inside it (thesis §6.4.1)."""
        m = self.env.member
        shortest = min((pr.lease_ms for p, pr in self.progress.items() if p in m.other_voters and pr.lease_ms),
                       default=self.leader_lease_ms)
        return min(self.leader_lease_ms, shortest)

    @property
    def _followed_lease_ms(self) -> int:
        """How long a follower stays loyal after hearing its leader: the longer of its own
        lease and the leader's (they differ during a rolling change of heartbeat settings)."""
        return max(self.leader_lease_ms, self.leader_lease_hint)

    # --- tick -----------------------------------------------------------------------

    def tick(self) -> None:
        now = self.env.now
        role = self.env.member.role
        # we did not run for more than a heartbeat period (the loop held by other work, or the
        # process not scheduled at all on a starved machine): what the leader sent meanwhile
        # may still wait unread in our sockets, so its silence proves nothing yet
        stalled = now - self.last_tick > self.hb_ms
        if stalled:
            self.gaps.note(now - self.last_tick, now)
        self.last_tick = now
        if role == Role.FOLLOWER:
            if now >= self.election_deadline:
                if stalled and self.election_deadline != self.graced_deadline:
                    # one heartbeat period to read what arrived; never twice for one deadline,
                    # so a member that stalls all the time still campaigns (liveness)
                    self.stall_graces += 1
                    self.election_deadline = self.graced_deadline = now + self.hb_ms
                    self._log.info("stall", "%s/%s: did not run for a while: reads before campaigning",
                                   self.env.member.group, self.env.member.self_id)
                else:
                    self._campaign()
        elif role == Role.CANDIDATE:
            if self.round_active and now >= self.round_deadline:
                self._end_round(ParseResult.WAIT_TO_REVOTE)
            elif not self.round_active and now >= self.next_round_at:
                self._campaign()
        else:
            # the followers' answers may wait unread too: judge them a period later, but only
            # once until the check runs again, so a leader that stalls on every tick still
            # checks its quorum (check-quorum, Raft thesis §6.2)
            if stalled and self.quorum_check_after <= self.quorum_checked_at:
                self.quorum_check_after = now + self.hb_ms
            self._tick_leader(now)
        if self.awaiting is not None and now >= self.awaiting.deadline:
            self._finish_transfer(self.awaiting, ResponseCode.TAKE_LEADERSHIP_FAILED, "no new leader in time")
            self.awaiting = None

    def _tick_leader(self, now: int) -> None:
        if now >= self.next_heartbeat:
            self.heartbeat_now()
        # check quorum: a leader that cannot reach a majority of the voters steps down (itself
        # counted while it is one)
        if now < self.quorum_check_after:
            self._tick_transfer(now)
            return
        self.quorum_checked_at = now
        window, m, progress = self.quorum_window_ms(), self.env.member, self.progress
        alive = int(m.is_voter)
        for v in m.other_voters:
            p = progress.get(v)
            alive += p is not None and p.heard_within(now, window, self.leader_since)
        if not self.env.member.is_quorum(alive):
            self.env.step_down(f"reached only {alive} members in {window} ms (check quorum)")
            self.election_deadline = now + self._election_timeout()
            return
        self._tick_transfer(now)

    def quorum_window_ms(self) -> int:
        """How long check-quorum waits for a follower's answer: the lease, longer on a starved
        machine (stepping down later risks nothing: leases count from confirmed rounds)."""
        return self.leader_lease_ms + self.starved_extra_ms(self.leader_lease_ms)

    # --- candidate ----------------------------------------------------------------

    def _campaign(self) -> None:
        """Start a pre-vote round, unless we are no voter (a learner, a removed member) or our
        store cannot write: then wait another timeout."""
        why = "" if self.env.member.may_campaign else "not a voter in our configuration"
        why = why or self.env.unfit_to_lead()
        if why:
            if self.env.member.role == Role.CANDIDATE:
                self.env.step_down(why)
            self.election_deadline = self.env.now + self._election_timeout()
            return
        self.start_round(pre_vote=True)

    def start_round(self, pre_vote: bool, transfer: bool = False) -> None:
        env, m = self.env, self.env.member
        env.become_candidate()
        self.round += 1
        self.round_active = True
        self.round_pre_vote = pre_vote
        self.round_deadline = env.now + env.cfg.max_vote_interval_ms
        self.accepted = {m.self_id}
        self.responses = {}
        if not pre_vote:
            try:
                m.set_term(m.term + 1, voted_for=m.self_id)
            except StoreError as e:  # the term cannot be persisted: no round
                self.round_active = False
                env.store_failed(e)
                self.election_deadline = env.now + self._election_timeout()
                return
            self.elections += 1
        term = m.term + 1 if pre_vote else m.term
        store = env.store
        log.debug("%s: %s round %d for term %d", m.self_id, "pre-vote" if pre_vote else "vote", self.round, term)
        for p in m.other_voters:
            req = VoteRequest(m.group, m.self_id, p, term, store.end_index, store.end_term, pre_vote, transfer)
            ctx = VoteCtx(self.round, pre_vote, p)
            env.send(p, RequestCode.VOTE, req, ctx, timeout_ms=env.cfg.max_vote_interval_ms)
        self._check_round()

    def on_vote_response(self, ctx: VoteCtx, resp: msgspec.Struct | None) -> None:
        rnd, peer = ctx.round, ctx.peer
        m = self.env.member
        if rnd != self.round or not self.round_active or m.role != Role.CANDIDATE:
            return
        if resp is None:
            self.responses[peer] = VoteResult.UNKNOWN
        else:
            assert isinstance(resp, VoteResponse)
            if resp.result == VoteResult.ACCEPT:
                self.accepted.add(peer)
            elif resp.term > m.term:
                self._end_round(ParseResult.WAIT_TO_VOTE_NEXT)
                self.observe_term(resp.term)
                return
            self.responses[peer] = resp.result
        self._check_round()

    def _check_round(self) -> None:
        m = self.env.member
        voters = m.voters
        if m.is_quorum(sum(1 for p in self.accepted if p in voters)):
            self.round_active = False
            if self.round_pre_vote:
                self.start_round(pre_vote=False)
            else:
                if not self.env.become_leader():
                    self.election_deadline = self.env.now + self._election_timeout()
                    return
                self._send_heartbeats()
                self.next_heartbeat = self.env.now + self.hb_ms
        elif sum(1 for p in self.responses if p in voters) >= len(m.other_voters):
            self._end_round(ParseResult.WAIT_TO_REVOTE)

    def _end_round(self, result: ParseResult) -> None:
        self.round_active = False
        if self.round_pre_vote and result == ParseResult.WAIT_TO_REVOTE:
            # a pre-vote costs no term: ask again within a heartbeat period. A voter that said
            # no usually still heard the dead leader a little later than we did (a backlog of
            # its pushes read late): its lease runs out soon, and a full re-vote delay after
            # that would be most of a failover
            hb = self.hb_ms
            self.next_round_at = self.env.now + self.env.rng.randint(hb // 2, hb)
        else:
            self.next_round_at = self.env.now + self._revote_delay()
        log.debug("%s: round %d ended %s: %s", self.env.member.self_id, self.round, result.name,
                  {p: VoteResult(r).name for p, r in self.responses.items()})

    # --- voter -------------------------------------------------------------------------

    def handle_vote(self, req: VoteRequest, token: Any) -> None:
        result = self._vote(req)
        self.env.reply(token, RequestCode.VOTE, VoteResponse(self.env.member.term, int(result), req.pre_vote))

    def _vote(self, req: VoteRequest) -> VoteResult:
        m, env = self.env.member, self.env
        if not m.membership.has(req.leader_id) and req.leader_id not in m.committed_members and \
                m.vouched.get(req.leader_id, -1) <= env.now:
            # neither configuration we know names it, and no member we know named it a voter of a
            # newer one (core.config_probe): a removed member (or a stranger). A learner
            # of ours may be a voter in a newer configuration we have not received yet: its vote
            # request is granted on the usual rules (thesis §4.1; etcd applies no membership
            # check to votes), or a promoted member holding the newest log could never be elected
            return VoteResult.REJECT_UNKNOWN_LEADER
        if req.term < m.term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if self.leader_alive() and not req.transfer and m.leader_id != req.leader_id:
            return VoteResult.REJECT_ALREADY_HAS_LEADER
        if env.now < self.no_vote_until and not req.transfer:
            return VoteResult.REJECT_ALREADY_HAS_LEADER  # just started: a lease we acknowledged may hold
        ledger = self._compare_ledger(req)
        if req.pre_vote:
            return ledger  # a pre-vote changes nothing here
        if req.term > m.term:
            m.set_term(req.term)
            if m.role != Role.FOLLOWER:
                env.step_down(f"vote request of term {req.term}")
        if m.voted_for not in (None, req.leader_id):
            return VoteResult.REJECT_ALREADY_VOTED
        if ledger != VoteResult.ACCEPT:
            return ledger
        m.vote_for(req.leader_id)
        self.election_deadline = env.now + self._election_timeout()
        return VoteResult.ACCEPT

    def _compare_ledger(self, req: VoteRequest) -> VoteResult:
        """Raft's up-to-date check: the later last term wins, then the longer log."""
        store = self.env.store
        if req.ledger_end_term < store.end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if req.ledger_end_term == store.end_term and req.ledger_end_index < store.end_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        return VoteResult.ACCEPT

    # --- leader contact ------------------------------------------------------------------

    def accept_leader(self, term: int, leader_id: str) -> ResponseCode | None:
        """Checks shared by heartbeats and pushes; on success the sender is our leader."""
        m, env = self.env.member, self.env
        if term < m.term:
            return ResponseCode.EXPIRED_TERM
        if term > m.term:
            m.set_term(term)
            if m.role == Role.LEADER:
                # a leader of an older term: adopting the term ends its leadership (found
                # by the simulator: keeping the role made two leaders in one term)
                env.step_down(f"{leader_id} leads the newer term {term}")
        if m.role == Role.LEADER:
            return ResponseCode.INCONSISTENT_LEADER  # two leaders in one term cannot be
        if m.role == Role.CANDIDATE:
            self.round_active = False
            env.step_down(f"{leader_id} leads term {term}")
        if m.leader_id is None:
            env.follow(leader_id)
            # (a forged heartbeat of a higher term each time would log this for every one)
            self._log.info("follows", "%s/%s: follows %s in term %d", m.group, m.self_id, leader_id, term)
        elif m.leader_id != leader_id:
            return ResponseCode.INCONSISTENT_LEADER
        else:  # our leader still: how late it came
            gap = env.now - self.last_leader_contact
            # a near miss of the unstretched timeout counts; a longer gap was survived only
            # thanks to the stretch, and counting it would ratchet the timeout up to the cap
            # for a leader that stays just in time (a limping leader is still replaced)
            cfg = env.cfg
            if gap < self._followed_lease_ms + cfg.max_vote_interval_ms - cfg.min_vote_interval_ms:
                self.gaps.note(gap, env.now)
        self.last_leader_contact = env.now
        self.election_deadline = env.now + self._election_timeout()
        if self.awaiting is not None and self.awaiting.target == leader_id:
            self._finish_transfer(self.awaiting, ResponseCode.SUCCESS, "")
            self.awaiting = None
        return None

    def handle_heartbeat(self, req: HeartBeatRequest, token: Any) -> None:
        err = self.accept_leader(req.term, req.leader_id)
        m = self.env.member
        if err is None:
            if req.lease_ms != self.leader_lease_hint:
                self.leader_lease_hint = req.lease_ms
                self.election_deadline = self.env.now + self._election_timeout()
            self.env.handler.update_commit(req.committed_index)
            self.env.follow_retention_floor(req.retention_floor, req.retention_holder)
        code = ResponseCode.SUCCESS if err is None else err
        env = self.env
        resp = HeartBeatResponse(int(code), m.term, m.leader_id or "", env.handler.durable_match(),
                                 env.full() is not None, env.store.end_index, env.corrupt_index,
                                 env.apply_needs(), self.leader_lease_ms)
        self.env.reply(token, RequestCode.HEART_BEAT, resp)

    def heartbeat_now(self) -> None:
        """Send a heartbeat round now (its tick, or reads waiting to be confirmed)."""
        self.next_heartbeat = self.env.now + self.hb_ms
        self._send_heartbeats()

    def _send_heartbeats(self) -> None:
        env, m = self.env, self.env.member
        floor, holder = env.retention_floor()
        round_ = env.reads.next_round()  # a majority acknowledging it confirms waiting reads
        for p in m.others:
            req = HeartBeatRequest(m.group, m.self_id, p, m.term, env.store.committed_index, floor, holder,
                                   self.leader_lease_ms)
            # what it had acknowledged when we asked: its answer must not report less
            pr = self.progress.get(p)
            matched = pr.match_index if pr is not None else -1
            env.send(p, RequestCode.HEART_BEAT, req, HeartbeatCtx(p, m.term, matched, round_),
                      timeout_ms=self.leader_lease_ms)

    def farewell(self, peer: str) -> None:
        """One last heartbeat to a member a committed configuration removed: its commit index,
        so the member learns its removal (it holds the entry) and says so; nothing follows."""
        env, m = self.env, self.env.member
        floor, holder = env.retention_floor()
        req = HeartBeatRequest(m.group, m.self_id, peer, m.term, env.store.committed_index, floor, holder,
                               self.leader_lease_ms)
        env.send(peer, RequestCode.HEART_BEAT, req, HeartbeatCtx(peer, m.term, -1, 0), timeout_ms=self.leader_lease_ms)

    def on_heartbeat_response(self, ctx: HeartbeatCtx, resp: msgspec.Struct | None) -> None:
        peer, term, matched, round_ = ctx.peer, ctx.term, ctx.matched, ctx.round
        if resp is None:
            return
        assert isinstance(resp, HeartBeatResponse)
        if self.observe_term(resp.term):
            return
        if resp.code == ResponseCode.SUCCESS and term == self.env.member.term and self.env.member.is_leader:
            pr = self.progress.get(peer)
            if pr is None:
                return  # no longer a member (a configuration removed it): nothing to note
            if resp.lease_ms:
                pr.lease_ms = resp.lease_ms
            self.ack(peer)
            self.env.reads.on_ack(peer, round_)
            pr.store_full = resp.store_full
            pr.corrupt = resp.corrupt_index >= 0
            d = self.env.dispatchers.get(peer)
            if d is not None:
                if resp.end_index is not None and resp.end_index < matched:
                    d.lost_match(resp.end_index, matched)  # wiped, or lost its tail: catch it up now
                d.note_durable(resp.durable_index)  # how a follower's fsync after a COMPARE reaches the commit
                d.note_corrupt(resp.corrupt_index)
                d.note_apply_needs(resp.apply_needs)

    def ack(self, peer: str) -> None:
        """Any successful answer from a follower proves it still follows us."""
        pr = self.progress.get(peer)
        if pr is not None:
            now = self.env.now
            # a voter's near miss of the unstretched window counts (a longer silence was an
            # outage, and counting it would let one peer, or a learner, hold a cut-off leader
            # in place for the whole cap)
            if pr.last_ack != NEVER and now - pr.last_ack < self.leader_lease_ms \
                    and peer in self.env.member.other_voters:
                self.gaps.note(now - pr.last_ack, now)
            pr.last_ack = now

    def observe_term(self, term: int) -> bool:
        """A higher term seen in a response ends our leadership; True if so."""
        m = self.env.member
        if term > m.term:
            self.env.step_down(f"a member is at term {term}")  # even if the term cannot be persisted
            self.election_deadline = self.env.now + self._election_timeout()
            m.set_term(term)
            return True
        return False

    # --- leadership transfer ------------------------------------------------------------

    def handle_transfer(self, req: LeadershipTransferRequest, token: Any) -> None:
        env, m = self.env, self.env.member
        if req.transfer_id and req.transferee_id == m.self_id:
            # the leader hands over to us: campaign now, past the leader's lease
            if req.term != m.term or req.transfer_id != m.leader_id:
                code = ResponseCode.EXPIRED_TERM if req.term < m.term else ResponseCode.INCONSISTENT_LEADER
                env.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(int(code), m.term))
                return
            # no voter: we could not win; else we would win and fail the NOOP, or serve a damaged record
            why = "" if m.is_voter else f"{m.self_id} is not a voter"
            why = why or env.unfit_to_lead()
            if why:
                refusal = SimpleResponse(int(ResponseCode.TAKE_LEADERSHIP_FAILED), m.term, m.leader_id or "", why)
                env.reply(token, RequestCode.LEADERSHIP_TRANSFER, refusal)
                return
            env.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(200, m.term))
            self.start_round(pre_vote=False, transfer=True)
            return
        target = req.transferee_id
        err = None
        if not m.is_leader:
            err = ResponseCode.NOT_LEADER
        elif not m.membership.is_voter(target):  # leadership goes to voters only
            err = ResponseCode.UNKNOWN_MEMBER
        elif self.transfer is not None:
            err = ResponseCode.LEADER_TRANSFERRING
        elif target in self.progress and self.progress[target].corrupt:
            why = f"{target} reports a corrupt record; it takes no leadership until it is repaired"
            failed = int(ResponseCode.TAKE_LEADERSHIP_FAILED)
            env.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(failed, m.term, m.leader_id or "", why))
            return
        if err is not None:
            env.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(int(err), m.term, m.leader_id or ""))
            return
        if target == m.self_id:
            env.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(200, m.term, m.self_id))
            return
        self.begin_transfer(target, token)

    def begin_transfer(self, target: str, token: Any) -> None:
        """Stop taking appends (LEADER_TRANSFERRING) until the target has caught up."""
        log.info("%s: transferring leadership to %s", self.env.member.self_id, target)
        self.transfer = _Transfer(target, token, self.env.now + self.env.cfg.leadership_transfer_timeout_ms)

    def _tick_transfer(self, now: int) -> None:
        env, m = self.env, self.env.member
        t = self.transfer
        if t is None:
            self._check_preferred()
            return
        if now >= t.deadline:
            self.transfer = None
            self._finish_transfer(t, ResponseCode.TAKE_LEADERSHIP_FAILED, f"{t.target} did not take over in time")
            log.warning("%s: transfer to %s timed out; resuming", m.self_id, t.target)
            return
        pr = self.progress.get(t.target)
        if not t.sent and pr is not None and pr.match_index >= env.store.end_index:
            t.sent = True
            env.reads.end_leases()  # the hand-over's votes ignore our lease, even after a time-out
            req = LeadershipTransferRequest(m.group, m.self_id, t.target, m.term, m.self_id, t.target)
            env.send(t.target, RequestCode.LEADERSHIP_TRANSFER, req, TransferCtx(t.target, m.term))

    def on_transfer_response(self, ctx: TransferCtx, resp: msgspec.Struct | None) -> None:
        t = self.transfer
        if t is None or t.target != ctx.target:
            return
        if resp is None or not isinstance(resp, SimpleResponse) or resp.code != ResponseCode.SUCCESS:
            t.sent = False  # try again while the deadline allows

    def on_leader(self) -> None:
        """We lead now (Node._change_role): heartbeats go at once, check-quorum counts from here."""
        self.leader_since = self.env.now
        self.next_heartbeat = 0

    def on_step_down(self) -> None:
        """Leadership ended: a transfer in flight now waits to see the target lead."""
        if self.transfer is not None:
            self.awaiting, self.transfer = self.transfer, None

    def _finish_transfer(self, t: _Transfer, code: ResponseCode, message: str) -> None:
        if t.token is not None:
            m = self.env.member
            resp = SimpleResponse(int(code), m.term, m.leader_id or "", message)
            self.env.reply(t.token, RequestCode.LEADERSHIP_TRANSFER, resp)

    def _check_preferred(self) -> None:
        """Hand leadership to a preferred member once it is caught up."""
        env, m = self.env, self.env.member
        preferred = env.cfg.preferred_leader_ids
        if not preferred or m.self_id in preferred or env.corrupt is not None:
            return
        for pid in preferred:
            if not m.membership.is_voter(pid):
                continue
            pr = self.progress.get(pid)
            if pr is not None and pr.fit_to_lead(env.now, self.leader_lease_ms, env.store.end_index):
                self.begin_transfer(pid, None)
                return
