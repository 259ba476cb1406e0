"""EntryDispatcher: the leader's replication to one follower (seeds 000, 002, 004).

States as DLedger: COMPARE finds the highest index both logs share, TRUNCATE
drops the follower's entries past it, APPEND streams records. Improvements:
- term skipping done as Raft's conflict-term rule: on a mismatch at index i the
  follower names its term x there and the first index of x; the leader jumps
  to its own last entry of term x (when it has one below i) or just before
  that first index. The match found is the highest shared index, so TRUNCATE
  only ever removes entries that differ from the leader's (never committed);
- pipelining as SOFAJRaft: up to `max_inflight_pushes` APPEND pushes in
  flight, responses applied strictly in send order, any failure or gap resets
  to COMPARE (the epoch counter makes late answers of the old window inert);
- ack-clocked small pushes: on a short link (smoothed push round trip within
  COALESCE_RTT_MS) a push that would go out less than half full with the end of the
  log waits while pushes are in flight, and leaves with what arrived meanwhile when
  they are answered (or once the oldest is overdue: a lost answer does not hold the
  log back until its push times out): fewer, larger pushes (less CPU on both sides,
  which is what the tail latency of a busy machine is made of: docs/performance.md).
  Full pushes, and pushes cut at a data file's end, still pipeline; on a long link (a
  WAN) every push leaves at once, as before;
- pushes carry raw record bytes straight from the store (`read_raw`);
- flow control: a follower catching up from far behind the commit index is
  limited to `peer_push_quota` bytes/s, so it cannot starve live replication to
  others; the followers the commit waits for are never throttled;
- what counts toward the commit: in `async` flush mode the match index; in `sync`
  mode only what the follower reports both fsynced and equal to our log
  (`durable_index` of its answers, see handler), whichever path reported the match;
- a follower whose disk cannot write (DISK_FULL / DISK_ERROR) is retried after a
  heartbeat interval, not re-probed in a tight loop;
- data faults: a follower that rejects a pushed record as damaged (`bad_index`) makes
  us verify our own copy: damaged, we are corrupt (the node hands leadership over);
  intact, we warn (rate-limited, naming follower, index and reason) and retry every
  heartbeat interval. A follower reporting a corrupt record of its own
  (`corrupt_index`) gets our verified copies in REPAIR pushes, beside replication;
- a follower whose answers show a log ending below what it had acknowledged (its
  store wiped, its unsynced tail lost) is matched again at once (`lost_match`), even
  when nothing new is appended, and no longer counts toward the commit;
- INSTALL (Raft §7): a follower that needs entries before our log begin (compacted
  behind a snapshot, deleted by retention, or a new empty member) gets our newest
  snapshot (core.install_snapshot), then is matched from its last entry as usual.
"""

from __future__ import annotations

import logging
from collections import deque
from enum import IntEnum
from typing import Protocol

import msgspec

from dledger.codes import DISK_FAULTS, PushType, RequestCode, ResponseCode
from dledger.core.contexts import ChunkCtx, Context, InstallCtx, PushCtx
from dledger.core.effects import Effect, MarkCorrupt, Pump
from dledger.core.install_snapshot import SenderContext, SnapshotSender
from dledger.core.messages import InstallSnapshotResponse, PushRequest, PushResponse
from dledger.entry import HEADER, scan
from dledger.ratelog import RateLimitedLog

log = logging.getLogger(__name__)


PUMP = Pump()
STRANDED_RETRY_MS = 1000
# a link whose pushes are answered within this (loopback, a LAN) clocks small pushes by their
# answers; waiting for one costs less there than the CPU of many small pushes on both sides
COALESCE_RTT_MS = 5.0
WARN_EVERY_MS = 10_000  # one warning per kind and follower in this time; the next says how many were held back


class State(IntEnum):
    COMPARE = PushType.COMPARE
    TRUNCATE = PushType.TRUNCATE
    APPEND = PushType.APPEND
    INSTALL = PushType.INSTALL_SNAPSHOT



class TermWatch(Protocol):
    """The elector's reaction to a higher term in an answer (core.elector.LeaderElector)."""

    def observe_term(self, term: int) -> bool: ...


class CommitAdvance(Protocol):
    """The quorum's commit step once a match moved (core.quorum.QuorumAckChecker)."""

    def advance(self) -> bool: ...


class DispatcherContext(SenderContext, Protocol):
    """All an EntryDispatcher needs of its leader (the Node is one): what its SnapshotSender
    needs, plus the elector's term watch, the quorum's commit step, an outbox for pushes, and
    the integrity calls for a record of ours found damaged while repairing a follower (a call:
    whether we still lead decides what is sent next). A pump request, and a record of ours a
    follower rejected found damaged, are effects (core.effects), which the node takes after
    each call (`take_effects`)."""

    @property
    def elector(self) -> TermWatch: ...
    @property
    def quorum(self) -> CommitAdvance: ...

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Context, data: bytes | memoryview = b"",
             timeout_ms: int | None = None) -> None: ...
    def mark_corrupt(self, index: int, reason: str) -> None: ...
    def is_beyond_repair(self, index: int) -> bool: ...


class EntryDispatcher:
    def __init__(self, env: DispatcherContext, peer: str) -> None:
        self.env = env
        self.peer = peer
        self.state = State.COMPARE
        self.epoch = 0
        self.progress = env.progress[peer]  # what we know of the follower (shared with elector and quorum)
        self.next_index = env.store.end_index + 1
        self.compare_index = env.store.end_index - 1  # a new leader's NOOP is not there yet
        self.compare_floor = -1  # highest index known to match (COMPARE searches above it)
        self.busy = False  # a COMPARE / TRUNCATE / COMMIT is in flight
        self.inflight: deque[tuple[int, int, int, int]] = deque()  # (seq, first, last, sent at) in send order
        self.srtt_ms = -1.0  # smoothed round trip of APPEND pushes (-1: none answered yet)
        self.early: dict[int, PushResponse | None] = {}  # answers that overtook an earlier push
        self.seq = 0
        self.tokens = float(env.cfg.peer_push_quota)
        self.last_refill = env.now
        self.paused_until = 0  # its disk failed: retry from then
        self.sender = SnapshotSender(env, peer)  # INSTALL state: our snapshot, chunk by chunk
        self.repair_busy = False  # a REPAIR push is in flight
        self.repair_paused_until = 0
        self.effects: list[Effect] = []  # Pump / MarkCorrupt, in order, until the node takes them
        # the follower's answers (one per push of ours) trigger these lines: rate-limited
        self._log = RateLimitedLog.on_ms(log, lambda: self.env.now, WARN_EVERY_MS / 1000)
        self._warn = self._log.warning

    def take_effects(self) -> list[Effect]:
        """What the calls so far asked for, in order (core.effects); the caller applies them."""
        out, self.effects = self.effects, []
        return out

    # --- state changes ---------------------------------------------------------------


    @property
    def node(self) -> DispatcherContext:
        """The name `env` had before the dispatcher took a narrow context (scripts that trace
        it still read `dispatcher.node.now`); the same object, seen through the Protocol."""
        return self.env
    def reset(self, compare_at: int, why: str) -> None:
        if self.state != State.COMPARE or self.inflight:
            self._log.info("compare", "push to %s: back to COMPARE at %d (%s)", self.peer, compare_at, why)
        self.state = State.COMPARE
        self.epoch += 1
        self.inflight.clear()
        self.early.clear()
        self.busy = False
        self.sender.stop()
        self.compare_floor = self.progress.match_index
        self.compare_index = max(min(compare_at, self.env.store.end_index), self.progress.match_index)

    # --- sending -----------------------------------------------------------------------

    def tick(self) -> None:
        self.pump()

    def pump(self) -> None:
        env = self.env
        if not env.member.is_leader:
            return
        self._pump_repair()
        if env.now < self.paused_until or not env.member.is_leader:
            return
        if self.state == State.APPEND:
            self._send_appends()
            if not self.inflight and not self.busy and self.progress.follower_commit < env.store.committed_index:
                self._send(PushType.COMMIT, self.progress.match_index)
        elif self.state == State.INSTALL:
            if not self.sender.active and not self.sender.start():
                self._stranded()
                return
            self.sender.pump(self.epoch)
        elif not self.busy:
            at = self.compare_index if self.state == State.COMPARE else self.compare_floor
            if at < env.store.begin_index - 1:  # compaction passed it meanwhile
                self._install()
                return
            self._send(PushType(self.state), at)

    def _send(self, kind: PushType, prev_index: int, first: int = 0, count: int = 0,
              data: bytes | memoryview = b"") -> None:
        env, m = self.env, self.env.member
        store = env.store
        prev_term = store.term_at(prev_index) if prev_index >= store.begin_index - 1 else -1
        next_term = -1
        if kind == PushType.TRUNCATE and prev_index + 1 <= store.end_index:
            next_term = store.term_at(prev_index + 1)
        req = PushRequest(m.group, m.self_id, self.peer, m.term, int(kind), prev_index, prev_term,
                          first, count, store.committed_index, next_term)
        if kind == PushType.APPEND:
            self.seq += 1
            self.inflight.append((self.seq, first, first + count - 1, env.now))
            ctx = PushCtx(self.peer, self.epoch, self.seq, int(kind), prev_index, m.term)
        else:
            self.busy = True
            ctx = PushCtx(self.peer, self.epoch, 0, int(kind), prev_index, m.term)
        env.send(self.peer, RequestCode.PUSH, req, ctx, data)

    def _send_appends(self) -> None:
        env = self.env
        store = env.store
        cfg = env.cfg
        while len(self.inflight) < cfg.max_inflight_pushes and self.next_index <= store.end_index:
            if self.next_index < store.begin_index:  # compaction passed it while it lagged
                self._install()
                return
            if not self._quota_allows():
                return
            if self._hold():
                return  # ack-clocked: leaves with more when the pushes in flight are answered
            raw = store.read_raw(self.next_index, cfg.max_batch_push_bytes)
            try:
                if self.next_index <= store.committed_index:  # catching up: old records, maybe rotten
                    store.check_magics(raw)
                # bytes() copies once: the view must not outlive a later truncate of the store
                data = bytes(raw.data)
            finally:
                raw.data.release()
            self._send(PushType.APPEND, self.next_index - 1, self.next_index, raw.count, data)
            self.next_index += raw.count
            self.tokens -= len(data)

    def _hold(self) -> bool:
        """Whether the push from `next_index` waits for the answers in flight (ack-clocked):
        on a short link, for a push that would carry the log's tail and leave less than half
        full (a push cut short by a data file's end does not wait), while the oldest push in
        flight is on time (a lost answer does not hold the log back until its push times out:
        a tick sends it once the oldest is 2 x COALESCE_RTT_MS old). Asked before the records
        are read: at a moderate rate most pumps end here."""
        if not self.inflight or not 0 <= self.srtt_ms <= COALESCE_RTT_MS \
                or self.env.now - self.inflight[0][3] > 2 * COALESCE_RTT_MS:
            return False
        tail = self.env.store.tail_bytes(self.next_index)
        return tail is not None and tail < self.env.cfg.max_batch_push_bytes // 2

    def _quota_allows(self) -> bool:
        """Token bucket, applied only to a follower catching up from far behind the commit index.

        DLedger's checkQuotaAndWait throttles a follower that lags the leader's *end* by more
        than a window. After a burst (an async leader stores far faster than it replicates)
        every follower lags so, and commits crawled at the quota: the group stalled for
        minutes. A follower within a window of the commit index is one the commit waits for
        (the commit index is a majority's match), so it is never throttled."""
        env = self.env
        cfg = env.cfg
        quota = cfg.peer_push_quota
        self.tokens = min(float(quota), self.tokens + (env.now - self.last_refill) * quota / 1000)
        self.last_refill = env.now
        if self.progress.match_index >= env.store.committed_index - cfg.max_pending_requests:
            return True
        return self.tokens > 0

    # --- answers -----------------------------------------------------------------------

    def on_response(self, ctx: PushCtx, resp: msgspec.Struct | None) -> None:
        epoch, seq, kind, prev_index, term = ctx.epoch, ctx.seq, ctx.kind, ctx.prev_index, ctx.term
        if kind == PushType.REPAIR:  # beside the COMPARE / APPEND states: epochs do not apply
            if term == self.env.member.term and self.env.member.is_leader:
                self._on_repair(prev_index, resp)
            return
        # every term's dispatchers count epochs from 0: the term tells an answer to a push
        # of an earlier leadership of ours apart
        if epoch != self.epoch or term != self.env.member.term or not self.env.member.is_leader:
            return
        if resp is not None:
            assert isinstance(resp, PushResponse)
            if self.env.elector.observe_term(resp.term):
                return
            if resp.term == self.env.member.term:
                self.note_durable(resp.durable_index)
                self.note_corrupt(resp.corrupt_index)
            if resp.code != ResponseCode.SUCCESS and resp.bad_index >= 0:
                self._on_rejected_record(resp)
                self.effects.append(PUMP)
                return
            if resp.code != ResponseCode.SUCCESS and resp.corrupt_index >= 0:
                # its own record is damaged: REPAIR runs beside; do not re-probe in a tight loop
                self.paused_until = self.env.now + self.env.cfg.heart_beat_time_interval_ms
            if resp.code == ResponseCode.SUCCESS:
                self.progress.last_ack = self.env.now  # it still follows us
                self.progress.disk_fault = False
            elif resp.code in DISK_FAULTS:
                if not self.progress.disk_fault:
                    self._warn("disk", "push to %s: its disk cannot write (%s); retrying every %d ms", self.peer,
                               ResponseCode(resp.code).name, self.env.cfg.heart_beat_time_interval_ms)
                self.progress.disk_fault = True
                self.paused_until = self.env.now + self.env.cfg.heart_beat_time_interval_ms
                # it says nothing of its log: try the same push again later
                self.reset(self.compare_index if self.state == State.COMPARE else self.next_index - 1,
                           f"its disk answered {ResponseCode(resp.code).name}")
                self.effects.append(PUMP)
                return
        if kind == PushType.APPEND:
            self._on_append(seq, resp if isinstance(resp, PushResponse) else None)
        else:
            self.busy = False
            if isinstance(resp, PushResponse):
                self._on_control(PushType(kind), prev_index, resp)
        self.effects.append(PUMP)

    def _on_control(self, kind: PushType, prev_index: int, resp: PushResponse) -> None:
        ok = resp.code == ResponseCode.SUCCESS
        if kind == PushType.COMMIT:
            if ok:
                pr = self.progress
                pr.follower_commit = max(pr.follower_commit, min(resp.end_index, self.env.store.committed_index))
            else:
                self.reset(self.next_index - 1, f"COMMIT answered {resp.code}")
        elif kind == PushType.COMPARE:
            self._on_compare(prev_index, resp)
        elif kind == PushType.TRUNCATE:
            if ok:
                self._start_append()
            else:  # (it refused: at once again it refuses again, a COMPARE and a TRUNCATE per round trip)
                self.paused_until = self.env.now + self.env.cfg.heart_beat_time_interval_ms
                self.reset(self.next_index - 1, f"TRUNCATE answered {resp.code}")

    def _on_compare(self, i: int, resp: PushResponse) -> None:
        """Search the highest shared index; only entries above it may be truncated,
        and those differ from ours, so they were never committed."""
        if resp.code == ResponseCode.SUCCESS:
            self.compare_floor = max(self.compare_floor, i)
            self._matched(i)
            higher = min(resp.end_index, self.env.store.end_index)
            if higher > i:
                self.compare_index = higher  # the follower may share more: probe there
                return
        else:
            if resp.end_index < self.compare_floor:
                # The follower's log now ends below what it had acknowledged: a crash cut
                # its unsynced tail (async flush acks from the page cache). What matched
                # before proves nothing; search again from its end, or we would push past
                # its end forever. Its quorum mark is stale too: it is raised again as it
                # acknowledges entries anew.
                self._warn("lost", "push to %s: its log ends at %d, below the %d it had acknowledged; matching again",
                           self.peer, resp.end_index, self.compare_floor)
                self.progress.lost()
                self.compare_floor = -1
            nxt = self._next_compare(i, resp)
            if nxt > self.compare_floor:
                if nxt < self.env.store.begin_index - 1:  # the search goes where our log was deleted
                    self._install()
                    return
                self.compare_index = nxt
                return
        # the highest shared index is compare_floor
        if resp.end_index > self.compare_floor:
            self.state = State.TRUNCATE
        else:
            self._start_append()

    def _start_append(self) -> None:
        if self.compare_floor + 1 < self.env.store.begin_index:  # matched below our log (e.g. both empty
            self._install()  # at -1), but what it needs next is deleted here
            return
        self.state = State.APPEND
        self.next_index = self.compare_floor + 1

    def _next_compare(self, i: int, resp: PushResponse) -> int:
        """Where to compare next after a mismatch at i (conflict-term skipping)."""
        store = self.env.store
        if resp.x_term < 0:
            nxt = min(resp.end_index, i - 1)  # follower's log ends before i
        else:
            last = self._last_index_of_term(resp.x_term, i - 1)
            nxt = last if last >= resp.x_index else resp.x_index - 1
        if nxt >= store.begin_index - 1:
            self.progress.needs_snapshot = False
        return max(nxt, -1)

    # --- INSTALL -------------------------------------------------------------------------------

    def _install(self) -> None:
        """It needs entries before our log begin: send our snapshot instead."""
        self.progress.needs_snapshot = True
        self.reset(self.progress.match_index, "it needs entries before our log begin")  # a new epoch, nothing in flight
        if self.sender.start():
            self.state = State.INSTALL
        else:
            self._stranded()

    def _stranded(self) -> None:
        """No snapshot reaches our log begin (a state machine whose log was lost before its
        first snapshot): ask again now and then, not in a tight loop."""
        self.state = State.COMPARE
        self.compare_index = max(self.env.store.begin_index - 1, self.progress.match_index)
        self.paused_until = self.env.now + STRANDED_RETRY_MS

    def install_hold(self) -> int:
        """The first entry retention keeps for this follower's install (-1: none): what follows
        the snapshot it is receiving, then what it has not matched yet until it caught up
        once (else compaction could pass it meanwhile and send it back to INSTALL, for ever
        when installs take longer than compacting)."""
        if self.sender.meta is not None:
            return self.sender.meta.last_index + 1
        if self.progress.installed_through >= 0:
            if self.progress.match_index >= self.env.store.committed_index:
                self.progress.installed_through = -1
                return -1
            return max(self.progress.installed_through, self.progress.match_index) + 1
        return -1

    def note_apply_needs(self, index: int) -> None:
        """The follower's state machine needs a snapshot through `index` (its log cannot give
        what comes before: a rotten record beyond repair, its own newer snapshot damaged):
        send ours if it reaches that far, else take one first if our state does."""
        if index >= 0 and self.state != State.INSTALL and self._install_past(index):
            self.effects.append(PUMP)

    def _install_past(self, index: int) -> bool:
        """Send the follower our snapshot if it covers `index` (True); else, if our state machine
        has applied that far, take one now so the next attempt can."""
        snap, a = self.env.snapshot_meta, self.env.applier
        if a is None:
            return False
        if snap is not None and snap.last_index >= index:
            self._install()
            return True
        if a.applied_index >= index:
            self.env.want_snapshot()
        return False

    def on_chunk_read(self, ctx: ChunkCtx, data: bytes, crc: int, error: str) -> None:
        epoch, last_index, offset = ctx.epoch, ctx.last_index, ctx.offset
        s = self.sender
        if epoch != self.epoch or self.state != State.INSTALL or s.meta is None or \
                (s.meta.last_index, s.offset) != (last_index, offset):
            return
        s.on_chunk(epoch, data, crc, error)
        self.effects.append(PUMP)

    def on_install_response(self, ctx: InstallCtx, resp: InstallSnapshotResponse | None) -> None:
        epoch, term, last_index = ctx.epoch, ctx.term, ctx.last_index
        env = self.env
        if epoch != self.epoch or term != env.member.term or not env.member.is_leader or \
                self.state != State.INSTALL:
            return
        if resp is not None:
            if env.elector.observe_term(resp.term):
                return
            if resp.term == env.member.term:
                self.note_durable(resp.durable_index)
        if self.sender.on_response(resp):
            # it holds our log through last_index now: match from there (its end may be higher)
            self.progress.needs_snapshot = False
            self.progress.installed_through = last_index
            self._matched(last_index)
            self.reset(resp.end_index if resp is not None else last_index, f"snapshot {last_index} installed")
        self.effects.append(PUMP)

    def _last_index_of_term(self, term: int, upto: int) -> int:
        """Highest j <= upto whose term is `term` in our log, or -1."""
        store = self.env.store
        lo, hi = store.begin_index, min(upto, store.end_index)
        if hi < lo:
            return -1
        # terms grow along the log: find the last j with term_at(j) <= term
        if store.term_at(lo) > term:
            return -1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if store.term_at(mid) <= term:
                lo = mid
            else:
                hi = mid - 1
        return lo if store.term_at(lo) == term else -1

    def _on_append(self, seq: int, resp: PushResponse | None) -> None:
        if not self.inflight:
            return
        self.early[seq] = resp
        # apply strictly in send order
        while self.inflight and self.inflight[0][0] in self.early:
            head_seq, first, last, sent = self.inflight[0]
            r = self.early.pop(head_seq)
            if r is None or r.code != ResponseCode.SUCCESS:
                why = "timeout or network error" if r is None else f"answered {_code_name(r.code)}"
                if r is not None and r.reason:
                    self._warn("append", "push to %s of entries %d..%d rejected (%s): %s", self.peer, first, last,
                               _code_name(r.code), r.reason)
                self.reset(self.next_index - 1, why)
                return
            self.inflight.popleft()
            rtt = self.env.now - sent
            self.srtt_ms = rtt if self.srtt_ms < 0 else 0.8 * self.srtt_ms + 0.2 * rtt
            self._matched(last)
            pr = self.progress
            pr.follower_commit = max(pr.follower_commit, min(r.end_index, self.env.store.committed_index))

    def _matched(self, index: int) -> None:
        if index > self.progress.match_index:
            self.progress.match_index = index
            if self.env.cfg.flush == "async":
                self.env.quorum.advance()

    # --- data faults ------------------------------------------------------------------------

    def _on_rejected_record(self, resp: PushResponse) -> None:
        """The follower found one of the records we pushed damaged: check our own copy."""
        env, store = self.env, self.env.store
        i = resp.bad_index
        own = store.verify(i) if store.begin_index <= i <= store.end_index else None
        if own is not None:
            self._warn("rejected", "push to %s: it rejects our record %d (%s), and our copy is damaged: %s",
                       self.peer, i, resp.reason, own)
            self.reset(self.next_index - 1, f"our record {i} is damaged")
            if env.is_beyond_repair(i):  # no member holds a good copy: only a snapshot past it helps
                if not self._install_past(i):
                    self.paused_until = env.now + env.cfg.heart_beat_time_interval_ms  # do not loop
                return
            # hands leadership over (or steps down) once applied: the caller only asks for a pump after
            self.effects.append(MarkCorrupt(i, own))
            return
        hb = env.cfg.heart_beat_time_interval_ms
        self._warn("rejected", "push to %s: it rejects our record %d (%s), which verifies here (a network or "
                   "disk fault on its side?); retrying every %d ms", self.peer, i, resp.reason, hb)
        self.paused_until = env.now + hb
        self.reset(self.next_index - 1, f"record {i} rejected: {resp.reason}")

    def note_corrupt(self, index: int) -> None:
        """The follower's answers report its first corrupt record (-1: none): repair it."""
        self.progress.corrupt = index >= 0
        if index < 0:
            if self.progress.repair_index >= 0 and not self.repair_busy:
                self._log.info("corrupt", "push to %s: it reports no corrupt record any more", self.peer)
                self.progress.repair_index = -1
            return
        if index != self.progress.repair_index:
            if self.progress.repair_index < 0:
                self._warn("corrupt", "push to %s: it reports a corrupt record at index %d; sending it our copy",
                           self.peer, index)
            self.progress.repair_index = index
            self.effects.append(PUMP)

    def _pump_repair(self) -> None:
        """Send the follower our copies of the records from its first corrupt one (verified
        here first: a damaged copy of ours is never sent; it makes us corrupt instead)."""
        env = self.env
        if self.progress.repair_index < 0 or self.repair_busy or env.now < self.repair_paused_until:
            return
        store, hb = env.store, env.cfg.heart_beat_time_interval_ms
        i = self.progress.repair_index
        if i < store.begin_index:
            self._warn("repair", "follower %s: its record %d is corrupt and ours was deleted by retention (log "
                       "begins at %d): it cannot be repaired; told it so", self.peer, i, store.begin_index)
            self.repair_paused_until = env.now + STRANDED_RETRY_MS
            self._send_repair(store.begin_index, 0, b"")  # no record: "our log begins at first_index"
            if env.applier is not None and self.state != State.INSTALL:
                self._install()  # its state machine may need that record: our snapshot replaces it
            return
        if i > store.end_index:  # not an entry of ours: replication truncates it
            self.repair_paused_until = env.now + hb
            return
        raw = store.read_raw(i, env.cfg.max_batch_push_bytes)
        data = bytes(raw.data)
        raw.data.release()
        res = scan(data, 0, len(data), i, HEADER.unpack_from(data, 0)[4], store.chain_at(i - 1),
                   store.term_at(i - 1))
        if res.count < raw.count:
            bad = i + res.count
            env.mark_corrupt(bad, f"record {bad}, read to repair {self.peer}: {res.stop.removeprefix('corrupt: ')}")
            if res.count == 0 or not env.member.is_leader:
                return
        self._send_repair(i, res.count, data[: res.consumed])

    def _send_repair(self, first: int, count: int, data: bytes) -> None:
        env, store, m = self.env, self.env.store, self.env.member
        req = PushRequest(m.group, m.self_id, self.peer, m.term, int(PushType.REPAIR), first - 1,
                          store.term_at(first - 1), first, count, store.committed_index)
        self.repair_busy = True
        env.send(self.peer, RequestCode.PUSH, req,
                  PushCtx(self.peer, self.epoch, 0, int(PushType.REPAIR), first, m.term), data)

    def _on_repair(self, first: int, resp: msgspec.Struct | None) -> None:
        env = self.env
        self.repair_busy = False
        hb = env.cfg.heart_beat_time_interval_ms
        if not isinstance(resp, PushResponse):
            self.repair_paused_until = env.now + hb
            self.effects.append(PUMP)
            return
        if env.elector.observe_term(resp.term):
            return
        if resp.code == ResponseCode.SUCCESS:
            self.progress.last_ack = env.now
            if resp.corrupt_index < 0:
                self._warn("repaired", "push to %s: its corrupt records are repaired", self.peer)
            elif resp.corrupt_index == first:  # still damaged after our copy: do not loop
                self._warn("repair", "push to %s: record %d still corrupt there after a repair", self.peer, first)
                self.repair_paused_until = env.now + hb
        else:
            self._warn("repair", "push to %s: repair from %d failed (%s): %s; retrying every %d ms", self.peer, first,
                       _code_name(resp.code), resp.reason, hb)
            self.repair_paused_until = env.now + hb
        self.note_corrupt(resp.corrupt_index)
        self.effects.append(PUMP)

    def lost_match(self, end: int, matched: int) -> None:
        """The follower's log ends at `end`, below the `matched` it had acknowledged (its store
        was wiped, or a crash cut its unsynced tail): it no longer counts toward the commit;
        match it again now rather than on the next append."""
        self._warn("lost", "push to %s: its log ends at %d, below the %d it had acknowledged (store wiped or tail "
                   "lost); matching again", self.peer, end, matched)
        self.progress.lost()
        self.compare_floor = -1
        self.progress.follower_commit = -1
        self.paused_until = 0
        self.reset(end, "its log ends below its match")
        self.effects.append(PUMP)

    def note_durable(self, durable: int) -> None:
        """The follower's fsynced prefix equal to our log (any answer carries it); in sync
        mode it is what counts toward the commit."""
        if durable > self.progress.durable:
            self.progress.durable = durable
            if self.env.cfg.flush == "sync":
                self.env.quorum.advance()


def _code_name(code: int) -> str:
    return ResponseCode(code).name if code in ResponseCode._value2member_map_ else str(code)
