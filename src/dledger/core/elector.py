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
  the leader repaired it (it still votes: its log end and last term are unchanged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from dledger.codes import RequestCode, ResponseCode
from dledger.core.contexts import HeartbeatCtx, TransferCtx, VoteCtx
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
from dledger.ratelog import RateLimitedLog
from dledger.store.base import StoreError

if TYPE_CHECKING:
    from dledger.core.node import Node

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Transfer:
    target: str
    token: Any  # client waiting for the outcome, or None (preferred-leader move)
    deadline: int
    sent: bool = False


class LeaderElector:
    def __init__(self, node: Node) -> None:
        self.node = node
        cfg = node.cfg
        self.hb_ms = cfg.heart_beat_time_interval_ms
        self.leader_lease_ms = cfg.heart_beat_time_interval_ms * cfg.max_heart_beat_leak
        self.leader_lease_hint = 0  # our leader's lease, from its heartbeats (it may be configured longer)
        self.last_leader_contact = -(1 << 62)
        self.election_deadline = node.now + self._election_timeout()
        self.round = 0
        self.round_active = False
        self.round_pre_vote = False
        self.round_deadline = 0
        self.next_round_at = 0
        self.accepted: set[str] = set()
        self.responses: dict[str, int] = {}
        self.next_heartbeat = 0
        self.leader_since = 0
        self.progress = node.progress  # what we know of each follower (core.progress)
        self.transfer: _Transfer | None = None
        self.awaiting: _Transfer | None = None  # transfer handed over; waiting for the new leader
        self.elections = 0  # real (not pre-vote) rounds started, for metrics
        # a (re)started member may have acknowledged a leader's heartbeat just before it went
        # down: it votes for no one for a lease, as if that leader were still alive (lease reads
        # rely on every acknowledging member keeping out of elections that long)
        self.no_vote_until = node.now + self.leader_lease_ms
        self._log = RateLimitedLog.on_ms(log, lambda: node.now)

    @property
    def transferring(self) -> bool:
        return self.transfer is not None

    # --- timing -----------------------------------------------------------------

    def _election_timeout(self) -> int:
        """Lease plus jitter; preferred members draw from the lower half so they
        usually campaign first."""
        cfg = self.node.cfg
        spread = cfg.max_vote_interval_ms - cfg.min_vote_interval_ms
        lo, hi = 0, spread
        if cfg.preferred_leader_ids:
            half = spread // 2
            lo, hi = (0, half) if cfg.self_id in cfg.preferred_leader_ids else (half, spread)
        # never before our leader's lease ends, however short ours is (mixed heartbeat settings)
        return self._followed_lease_ms + self.node.rng.randint(lo, hi)

    def _revote_delay(self) -> int:
        cfg = self.node.cfg
        return self.node.rng.randint(cfg.min_vote_interval_ms, cfg.max_vote_interval_ms)

    def leader_alive(self) -> bool:
        m = self.node.member
        if m.role == Role.LEADER:
            return True
        return m.leader_id is not None and self.node.now - self.last_leader_contact < self._followed_lease_ms

    @property
    def _followed_lease_ms(self) -> int:
        """How long a follower stays loyal after hearing its leader: the longer of its own
        lease and the leader's (they differ during a rolling change of heartbeat settings)."""
        return max(self.leader_lease_ms, self.leader_lease_hint)

    # --- tick -----------------------------------------------------------------------

    def tick(self) -> None:
        now = self.node.now
        role = self.node.member.role
        if role == Role.FOLLOWER:
            if now >= self.election_deadline:
                self._campaign()
        elif role == Role.CANDIDATE:
            if self.round_active and now >= self.round_deadline:
                self._end_round(ParseResult.WAIT_TO_REVOTE)
            elif not self.round_active and now >= self.next_round_at:
                self._campaign()
        else:
            self._tick_leader(now)
        if self.awaiting is not None and now >= self.awaiting.deadline:
            self._finish_transfer(self.awaiting, ResponseCode.TAKE_LEADERSHIP_FAILED, "no new leader in time")
            self.awaiting = None

    def _tick_leader(self, now: int) -> None:
        if now >= self.next_heartbeat:
            self.heartbeat_now()
        # check quorum: a leader that cannot reach a majority steps down
        window = self.leader_lease_ms
        alive = 1 + sum(1 for p in self.progress.values() if p.heard_within(now, window, self.leader_since))
        if not self.node.member.is_quorum(alive):
            self.node.step_down(f"reached only {alive} members in {window} ms (check quorum)")
            self.election_deadline = now + self._election_timeout()
            return
        self._tick_transfer(now)

    # --- candidate ----------------------------------------------------------------

    def _campaign(self) -> None:
        """Start a pre-vote round, unless our store cannot write: then wait another timeout."""
        why = self.node.unfit_to_lead()
        if why:
            if self.node.member.role == Role.CANDIDATE:
                self.node.step_down(why)
            self.election_deadline = self.node.now + self._election_timeout()
            return
        self.start_round(pre_vote=True)

    def start_round(self, pre_vote: bool, transfer: bool = False) -> None:
        node, m = self.node, self.node.member
        node.become_candidate()
        self.round += 1
        self.round_active = True
        self.round_pre_vote = pre_vote
        self.round_deadline = node.now + node.cfg.max_vote_interval_ms
        self.accepted = {m.self_id}
        self.responses = {}
        if not pre_vote:
            try:
                m.set_term(m.term + 1, voted_for=m.self_id)
            except StoreError as e:  # the term cannot be persisted: no round
                self.round_active = False
                node.store_failed(e)
                self.election_deadline = node.now + self._election_timeout()
                return
            self.elections += 1
        term = m.term + 1 if pre_vote else m.term
        store = node.store
        log.debug("%s: %s round %d for term %d", m.self_id, "pre-vote" if pre_vote else "vote", self.round, term)
        for p in m.others:
            req = VoteRequest(m.group, m.self_id, p, term, store.end_index, store.end_term, pre_vote, transfer)
            ctx = VoteCtx(self.round, pre_vote, p)
            node.send(p, RequestCode.VOTE, req, ctx, timeout_ms=node.cfg.max_vote_interval_ms)
        self._check_round()

    def on_vote_response(self, ctx: VoteCtx, resp: msgspec.Struct | None) -> None:
        rnd, peer = ctx.round, ctx.peer
        m = self.node.member
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
        m = self.node.member
        if m.is_quorum(len(self.accepted)):
            self.round_active = False
            if self.round_pre_vote:
                self.start_round(pre_vote=False)
            else:
                if not self.node.become_leader():
                    self.election_deadline = self.node.now + self._election_timeout()
                    return
                self._send_heartbeats()
                self.next_heartbeat = self.node.now + self.hb_ms
        elif len(self.responses) + 1 >= len(m.peer_ids):
            self._end_round(ParseResult.WAIT_TO_REVOTE)

    def _end_round(self, result: ParseResult) -> None:
        self.round_active = False
        self.next_round_at = self.node.now + self._revote_delay()
        log.debug("%s: round %d ended %s: %s", self.node.member.self_id, self.round, result.name,
                  {p: VoteResult(r).name for p, r in self.responses.items()})

    # --- voter -------------------------------------------------------------------------

    def handle_vote(self, req: VoteRequest, token: Any) -> None:
        result = self._vote(req)
        self.node.reply(token, RequestCode.VOTE, VoteResponse(self.node.member.term, int(result), req.pre_vote))

    def _vote(self, req: VoteRequest) -> VoteResult:
        m, node = self.node.member, self.node
        if req.term < m.term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if self.leader_alive() and not req.transfer and m.leader_id != req.leader_id:
            return VoteResult.REJECT_ALREADY_HAS_LEADER
        if node.now < self.no_vote_until and not req.transfer:
            return VoteResult.REJECT_ALREADY_HAS_LEADER  # just started: a lease we acknowledged may hold
        ledger = self._compare_ledger(req)
        if req.pre_vote:
            return ledger  # a pre-vote changes nothing here
        if req.term > m.term:
            m.set_term(req.term)
            if m.role != Role.FOLLOWER:
                node.step_down(f"vote request of term {req.term}")
        if m.voted_for not in (None, req.leader_id):
            return VoteResult.REJECT_ALREADY_VOTED
        if ledger != VoteResult.ACCEPT:
            return ledger
        m.vote_for(req.leader_id)
        self.election_deadline = node.now + self._election_timeout()
        return VoteResult.ACCEPT

    def _compare_ledger(self, req: VoteRequest) -> VoteResult:
        """Raft's up-to-date check: the later last term wins, then the longer log."""
        store = self.node.store
        if req.ledger_end_term < store.end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if req.ledger_end_term == store.end_term and req.ledger_end_index < store.end_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        return VoteResult.ACCEPT

    # --- leader contact ------------------------------------------------------------------

    def accept_leader(self, term: int, leader_id: str) -> ResponseCode | None:
        """Checks shared by heartbeats and pushes; on success the sender is our leader."""
        m, node = self.node.member, self.node
        if term < m.term:
            return ResponseCode.EXPIRED_TERM
        if term > m.term:
            m.set_term(term)
            if m.role == Role.LEADER:
                # a leader of an older term: adopting the term ends its leadership (found
                # by the simulator: keeping the role made two leaders in one term)
                node.step_down(f"{leader_id} leads the newer term {term}")
        if m.role == Role.LEADER:
            return ResponseCode.INCONSISTENT_LEADER  # two leaders in one term cannot be
        if m.role == Role.CANDIDATE:
            self.round_active = False
            node.step_down(f"{leader_id} leads term {term}")
        if m.leader_id is None:
            node.follow(leader_id)
            # (a forged heartbeat of a higher term each time would log this for every one)
            self._log.info("follows", "%s/%s: follows %s in term %d", m.group, m.self_id, leader_id, term)
        elif m.leader_id != leader_id:
            return ResponseCode.INCONSISTENT_LEADER
        self.last_leader_contact = node.now
        self.election_deadline = node.now + self._election_timeout()
        if self.awaiting is not None and self.awaiting.target == leader_id:
            self._finish_transfer(self.awaiting, ResponseCode.SUCCESS, "")
            self.awaiting = None
        return None

    def handle_heartbeat(self, req: HeartBeatRequest, token: Any) -> None:
        err = self.accept_leader(req.term, req.leader_id)
        m = self.node.member
        if err is None:
            if req.lease_ms != self.leader_lease_hint:
                self.leader_lease_hint = req.lease_ms
                self.election_deadline = self.node.now + self._election_timeout()
            self.node.handler.update_commit(req.committed_index)
            self.node.follow_retention_floor(req.retention_floor, req.retention_holder)
        code = ResponseCode.SUCCESS if err is None else err
        node = self.node
        resp = HeartBeatResponse(int(code), m.term, m.leader_id or "", node.handler.durable_match(),
                                 node.full() is not None, node.store.end_index, node.corrupt_index,
                                 node.apply_needs())
        self.node.reply(token, RequestCode.HEART_BEAT, resp)

    def heartbeat_now(self) -> None:
        """Send a heartbeat round now (its tick, or reads waiting to be confirmed)."""
        self.next_heartbeat = self.node.now + self.hb_ms
        self._send_heartbeats()

    def _send_heartbeats(self) -> None:
        node, m = self.node, self.node.member
        floor, holder = node.retention_floor()
        round_ = node.reads.next_round()  # a majority acknowledging it confirms waiting reads
        for p in m.others:
            req = HeartBeatRequest(m.group, m.self_id, p, m.term, node.store.committed_index, floor, holder,
                                   self.leader_lease_ms)
            # what it had acknowledged when we asked: its answer must not report less
            matched = self.progress[p].match_index
            node.send(p, RequestCode.HEART_BEAT, req, HeartbeatCtx(p, m.term, matched, round_),
                      timeout_ms=self.leader_lease_ms)

    def on_heartbeat_response(self, ctx: HeartbeatCtx, resp: msgspec.Struct | None) -> None:
        peer, term, matched, round_ = ctx.peer, ctx.term, ctx.matched, ctx.round
        if resp is None:
            return
        assert isinstance(resp, HeartBeatResponse)
        if self.observe_term(resp.term):
            return
        if resp.code == ResponseCode.SUCCESS and term == self.node.member.term and self.node.member.is_leader:
            self.ack(peer)
            self.node.reads.on_ack(peer, round_)
            pr = self.progress[peer]
            pr.store_full = resp.store_full
            pr.corrupt = resp.corrupt_index >= 0
            d = self.node.dispatchers.get(peer)
            if d is not None:
                if resp.end_index is not None and resp.end_index < matched:
                    d.lost_match(resp.end_index, matched)  # wiped, or lost its tail: catch it up now
                d.note_durable(resp.durable_index)  # how a follower's fsync after a COMPARE reaches the commit
                d.note_corrupt(resp.corrupt_index)
                d.note_apply_needs(resp.apply_needs)

    def ack(self, peer: str) -> None:
        """Any successful answer from a follower proves it still follows us."""
        self.progress[peer].last_ack = self.node.now

    def observe_term(self, term: int) -> bool:
        """A higher term seen in a response ends our leadership; True if so."""
        m = self.node.member
        if term > m.term:
            self.node.step_down(f"a member is at term {term}")  # even if the term cannot be persisted
            self.election_deadline = self.node.now + self._election_timeout()
            m.set_term(term)
            return True
        return False

    # --- leadership transfer ------------------------------------------------------------

    def handle_transfer(self, req: LeadershipTransferRequest, token: Any) -> None:
        node, m = self.node, self.node.member
        if req.transfer_id and req.transferee_id == m.self_id:
            # the leader hands over to us: campaign now, past the leader's lease
            if req.term != m.term or req.transfer_id != m.leader_id:
                code = ResponseCode.EXPIRED_TERM if req.term < m.term else ResponseCode.INCONSISTENT_LEADER
                node.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(int(code), m.term))
                return
            why = node.unfit_to_lead()  # we would win and fail the NOOP, or serve a damaged record
            if why:
                refusal = SimpleResponse(int(ResponseCode.TAKE_LEADERSHIP_FAILED), m.term, m.leader_id or "", why)
                node.reply(token, RequestCode.LEADERSHIP_TRANSFER, refusal)
                return
            node.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(200, m.term))
            self.start_round(pre_vote=False, transfer=True)
            return
        target = req.transferee_id
        err = None
        if not m.is_leader:
            err = ResponseCode.NOT_LEADER
        elif target not in m.peer_ids:
            err = ResponseCode.UNKNOWN_MEMBER
        elif self.transfer is not None:
            err = ResponseCode.LEADER_TRANSFERRING
        elif target in self.progress and self.progress[target].corrupt:
            why = f"{target} reports a corrupt record; it takes no leadership until it is repaired"
            failed = int(ResponseCode.TAKE_LEADERSHIP_FAILED)
            node.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(failed, m.term, m.leader_id or "", why))
            return
        if err is not None:
            node.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(int(err), m.term, m.leader_id or ""))
            return
        if target == m.self_id:
            node.reply(token, RequestCode.LEADERSHIP_TRANSFER, SimpleResponse(200, m.term, m.self_id))
            return
        self.begin_transfer(target, token)

    def begin_transfer(self, target: str, token: Any) -> None:
        """Stop taking appends (LEADER_TRANSFERRING) until the target has caught up."""
        log.info("%s: transferring leadership to %s", self.node.member.self_id, target)
        self.transfer = _Transfer(target, token, self.node.now + self.node.cfg.leadership_transfer_timeout_ms)

    def _tick_transfer(self, now: int) -> None:
        node, m = self.node, self.node.member
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
        if not t.sent and pr is not None and pr.match_index >= node.store.end_index:
            t.sent = True
            node.reads.end_leases()  # the hand-over's votes ignore our lease, even after a time-out
            req = LeadershipTransferRequest(m.group, m.self_id, t.target, m.term, m.self_id, t.target)
            node.send(t.target, RequestCode.LEADERSHIP_TRANSFER, req, TransferCtx(t.target, m.term))

    def on_transfer_response(self, ctx: TransferCtx, resp: msgspec.Struct | None) -> None:
        t = self.transfer
        if t is None or t.target != ctx.target:
            return
        if resp is None or not isinstance(resp, SimpleResponse) or resp.code != ResponseCode.SUCCESS:
            t.sent = False  # try again while the deadline allows

    def on_leader(self) -> None:
        """We lead now (Node._change_role): heartbeats go at once, check-quorum counts from here."""
        self.leader_since = self.node.now
        self.next_heartbeat = 0

    def on_step_down(self) -> None:
        """Leadership ended: a transfer in flight now waits to see the target lead."""
        if self.transfer is not None:
            self.awaiting, self.transfer = self.transfer, None

    def _finish_transfer(self, t: _Transfer, code: ResponseCode, message: str) -> None:
        if t.token is not None:
            m = self.node.member
            resp = SimpleResponse(int(code), m.term, m.leader_id or "", message)
            self.node.reply(t.token, RequestCode.LEADERSHIP_TRANSFER, resp)

    def _check_preferred(self) -> None:
        """Hand leadership to a preferred member once it is caught up."""
        node, m = self.node, self.node.member
        preferred = node.cfg.preferred_leader_ids
        if not preferred or m.self_id in preferred or node.corrupt is not None:
            return
        for pid in preferred:
            pr = self.progress.get(pid)
            if pr is not None and pr.fit_to_lead(node.now, self.leader_lease_ms, node.store.end_index):
                self.begin_transfer(pid, None)
                return
