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
- pushes carry raw record bytes straight from the store (`read_raw`);
- flow control: a follower catching up from far behind the commit index is
  limited to `peer_push_quota` bytes/s, so it cannot starve live replication to
  others; the followers the commit waits for are never throttled;
- what counts toward the commit: in `async` flush mode the match index; in `sync`
  mode only what the follower reports both fsynced and equal to our log
  (`durable_index` of its answers, see handler), whichever path reported the match;
- a follower whose disk cannot write (DISK_FULL / DISK_ERROR) is retried after a
  heartbeat interval, not re-probed in a tight loop.
"""

from __future__ import annotations

import logging
from collections import deque
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import msgspec

from dledger.codes import DISK_FAULTS, PushType, RequestCode, ResponseCode
from dledger.core.messages import PushRequest, PushResponse

if TYPE_CHECKING:
    from dledger.core.node import Node

log = logging.getLogger(__name__)


STRANDED_RETRY_MS = 1000


class State(IntEnum):
    COMPARE = PushType.COMPARE
    TRUNCATE = PushType.TRUNCATE
    APPEND = PushType.APPEND


class EntryDispatcher:
    def __init__(self, node: Node, peer: str) -> None:
        self.node = node
        self.peer = peer
        self.state = State.COMPARE
        self.epoch = 0
        self.match_index = -1
        self.next_index = node.store.end_index + 1
        self.compare_index = node.store.end_index - 1  # a new leader's NOOP is not there yet
        self.compare_floor = -1  # highest index known to match (COMPARE searches above it)
        self.busy = False  # a COMPARE / TRUNCATE / COMMIT is in flight
        self.inflight: deque[tuple[int, int, int]] = deque()  # (seq, first, last) in send order
        self.early: dict[int, PushResponse | None] = {}  # answers that overtook an earlier push
        self.seq = 0
        self.follower_commit = -1
        self.tokens = float(node.cfg.peer_push_quota)
        self.last_refill = node.now
        self.durable = -1  # highest durable_index the follower reported in this term
        self.paused_until = 0  # its disk failed: retry from then
        self.disk_fault = False  # logged once per episode
        self.needs_snapshot = False  # it needs entries below our log begin (metric, logged once)

    # --- state changes ---------------------------------------------------------------

    def reset(self, compare_at: int, why: str) -> None:
        if self.state != State.COMPARE or self.inflight:
            log.info("push to %s: back to COMPARE at %d (%s)", self.peer, compare_at, why)
        self.state = State.COMPARE
        self.epoch += 1
        self.inflight.clear()
        self.early.clear()
        self.busy = False
        self.compare_floor = self.match_index
        self.compare_index = max(min(compare_at, self.node.store.end_index), self.match_index)

    # --- sending -----------------------------------------------------------------------

    def tick(self) -> None:
        self.pump()

    def pump(self) -> None:
        node = self.node
        if not node.member.is_leader or node.now < self.paused_until:
            return
        if self.state == State.APPEND:
            self._send_appends()
            if not self.inflight and not self.busy and self.follower_commit < node.store.committed_index:
                self._send(PushType.COMMIT, self.match_index)
        elif not self.busy:
            at = self.compare_index if self.state == State.COMPARE else self.compare_floor
            self._send(PushType(self.state), at)

    def _send(self, kind: PushType, prev_index: int, first: int = 0, count: int = 0,
              data: bytes | memoryview = b"") -> None:
        node, m = self.node, self.node.member
        store = node.store
        prev_term = store.term_at(prev_index) if prev_index >= store.begin_index - 1 else -1
        next_term = -1
        if kind == PushType.TRUNCATE and prev_index + 1 <= store.end_index:
            next_term = store.term_at(prev_index + 1)
        req = PushRequest(m.group, m.self_id, self.peer, m.term, int(kind), prev_index, prev_term,
                          first, count, store.committed_index, next_term)
        if kind == PushType.APPEND:
            self.seq += 1
            self.inflight.append((self.seq, first, first + count - 1))
            ctx: tuple[Any, ...] = ("push", self.peer, self.epoch, self.seq, int(kind), prev_index, m.term)
        else:
            self.busy = True
            ctx = ("push", self.peer, self.epoch, 0, int(kind), prev_index, m.term)
        node.send(self.peer, RequestCode.PUSH, req, ctx, data)

    def _send_appends(self) -> None:
        node = self.node
        store = node.store
        cfg = node.cfg
        while len(self.inflight) < cfg.max_inflight_pushes and self.next_index <= store.end_index:
            if not self._quota_allows():
                return
            raw = store.read_raw(self.next_index, cfg.max_batch_push_bytes)
            # bytes() copies once: the view must not outlive a later truncate of the store
            data = bytes(raw.data)
            raw.data.release()
            self._send(PushType.APPEND, self.next_index - 1, self.next_index, raw.count, data)
            self.next_index += raw.count
            self.tokens -= len(data)

    def _quota_allows(self) -> bool:
        """Token bucket, applied only to a follower catching up from far behind the commit index.

        DLedger's checkQuotaAndWait throttles a follower that lags the leader's *end* by more
        than a window. After a burst (an async leader stores far faster than it replicates)
        every follower lags so, and commits crawled at the quota: the group stalled for
        minutes. A follower within a window of the commit index is one the commit waits for
        (the commit index is a majority's match), so it is never throttled."""
        node = self.node
        cfg = node.cfg
        quota = cfg.peer_push_quota
        self.tokens = min(float(quota), self.tokens + (node.now - self.last_refill) * quota / 1000)
        self.last_refill = node.now
        if self.match_index >= node.store.committed_index - cfg.max_pending_requests:
            return True
        return self.tokens > 0

    # --- answers -----------------------------------------------------------------------

    def on_response(self, ctx: Any, resp: msgspec.Struct | None) -> None:
        _, _, epoch, seq, kind, prev_index, term = ctx
        # every term's dispatchers count epochs from 0: the term tells an answer to a push
        # of an earlier leadership of ours apart
        if epoch != self.epoch or term != self.node.member.term or not self.node.member.is_leader:
            return
        if resp is not None:
            assert isinstance(resp, PushResponse)
            if self.node.elector.observe_term(resp.term):
                return
            if resp.term == self.node.member.term:
                self.note_durable(resp.durable_index)
            if resp.code == ResponseCode.SUCCESS:
                self.node.elector.ack(self.peer)
                self.disk_fault = False
            elif resp.code in DISK_FAULTS:
                if not self.disk_fault:
                    log.warning("push to %s: its disk cannot write (%s); retrying every %d ms", self.peer,
                                ResponseCode(resp.code).name, self.node.cfg.heart_beat_time_interval_ms)
                self.disk_fault = True
                self.paused_until = self.node.now + self.node.cfg.heart_beat_time_interval_ms
                # it says nothing of its log: try the same push again later
                self.reset(self.compare_index if self.state == State.COMPARE else self.next_index - 1,
                           f"its disk answered {ResponseCode(resp.code).name}")
                self.node.request_pump()
                return
        if kind == PushType.APPEND:
            self._on_append(seq, resp if isinstance(resp, PushResponse) else None)
        else:
            self.busy = False
            if isinstance(resp, PushResponse):
                self._on_control(PushType(kind), prev_index, resp)
        self.node.request_pump()

    def _on_control(self, kind: PushType, prev_index: int, resp: PushResponse) -> None:
        ok = resp.code == ResponseCode.SUCCESS
        if kind == PushType.COMMIT:
            if ok:
                self.follower_commit = max(self.follower_commit, min(resp.end_index, self.node.store.committed_index))
            else:
                self.reset(self.next_index - 1, f"COMMIT answered {resp.code}")
        elif kind == PushType.COMPARE:
            self._on_compare(prev_index, resp)
        elif kind == PushType.TRUNCATE:
            if ok:
                self._start_append()
            else:
                self.reset(self.next_index - 1, f"TRUNCATE answered {resp.code}")

    def _on_compare(self, i: int, resp: PushResponse) -> None:
        """Search the highest shared index; only entries above it may be truncated,
        and those differ from ours, so they were never committed."""
        if resp.code == ResponseCode.SUCCESS:
            self.compare_floor = max(self.compare_floor, i)
            self._matched(i)
            higher = min(resp.end_index, self.node.store.end_index)
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
                log.warning("push to %s: its log ends at %d, below the %d it had acknowledged; matching again",
                            self.peer, resp.end_index, self.compare_floor)
                self.match_index = self.compare_floor = self.durable = -1
                self.node.quorum.match[self.peer] = -1
            nxt = self._next_compare(i, resp)
            if nxt > self.compare_floor:
                self.compare_index = nxt
                return
        # the highest shared index is compare_floor
        if resp.end_index > self.compare_floor:
            self.state = State.TRUNCATE
        else:
            self._start_append()

    def _start_append(self) -> None:
        self.state = State.APPEND
        self.next_index = self.compare_floor + 1

    def _next_compare(self, i: int, resp: PushResponse) -> int:
        """Where to compare next after a mismatch at i (conflict-term skipping)."""
        store = self.node.store
        if resp.x_term < 0:
            nxt = min(resp.end_index, i - 1)  # follower's log ends before i
        else:
            last = self._last_index_of_term(resp.x_term, i - 1)
            nxt = last if last >= resp.x_index else resp.x_index - 1
        if nxt < store.begin_index - 1:
            # it needs entries retention deleted (it was silent for longer than retention_hold_ms):
            # only a snapshot install could help; ask again now and then, not in a tight loop
            if not self.needs_snapshot:
                log.error("follower %s needs entries before our log begin %d (no snapshot install yet); "
                          "asking again every %d ms", self.peer, store.begin_index, STRANDED_RETRY_MS)
            self.needs_snapshot = True
            self.paused_until = self.node.now + STRANDED_RETRY_MS
            return store.begin_index - 1
        self.needs_snapshot = False
        return max(nxt, -1)

    def _last_index_of_term(self, term: int, upto: int) -> int:
        """Highest j <= upto whose term is `term` in our log, or -1."""
        store = self.node.store
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
            head_seq, _first, last = self.inflight[0]
            r = self.early.pop(head_seq)
            if r is None or r.code != ResponseCode.SUCCESS:
                why = "timeout or network error" if r is None else f"answered {ResponseCode(r.code).name}"
                self.reset(self.next_index - 1, why)
                return
            self.inflight.popleft()
            self._matched(last)
            self.follower_commit = max(self.follower_commit, min(r.end_index, self.node.store.committed_index))

    def _matched(self, index: int) -> None:
        if index > self.match_index:
            self.match_index = index
            if self.node.cfg.flush == "async":
                self.node.quorum.ack(self.peer, index)

    def note_durable(self, durable: int) -> None:
        """The follower's fsynced prefix equal to our log (any answer carries it); in sync
        mode it is what counts toward the commit."""
        if durable > self.durable:
            self.durable = durable
            if self.node.cfg.flush == "sync":
                self.node.quorum.ack(self.peer, durable)
