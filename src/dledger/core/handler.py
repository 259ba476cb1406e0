"""EntryHandler: a follower's side of replication (seeds 000, 002).

Pushes are handled in arrival order (TCP keeps a leader's pushes ordered).
An APPEND that starts past our end is kept by index until the gap fills; if
it waits longer than `max_push_timeout_ms` it is answered INCONSISTENT_STATE,
so the leader re-probes (DLedger's checkAbnormalFuture, fast-forward case). An
APPEND wholly below our end is a retry whose ack was lost: it succeeds if our
entries are the same, else INCONSISTENT_STATE (fall-behind case). A second
push for an index already pending is REPEATED_PUSH.

The chain CRC of the first pushed record covers our whole log before it, so a
successful append proves our log matches the leader's up to its last entry;
`matched_index` records that, and bounds the commit index we accept.

Data faults: a pushed record that fails verification is answered with its index and
the reason (`bad_index`, `reason`), never a bare mismatch the leader would retry
forever; the leader then checks its own copy. Our own records that fail verification
(found by reads, the node's scrub, or here) mark the node corrupt; every answer then
carries `corrupt_index` and the leader sends those records again (REPAIR), which
overwrite ours in place once they match what our index says of them.

Every answer (pushes and heartbeats) reports `durable_index`: min(fsynced end,
matched_index), the prefix that is both on our disk and equal to the leader's log.
In `sync` flush mode the leader counts only that toward the commit, whatever path
(APPEND, COMPARE, a retried push) reported the match; an APPEND's answer also waits
until its entries are durable, which is the fast path. The value stays true for the
rest of the leader's term (entries equal to its log are never truncated in it, and a
power loss keeps what was fsynced), so the leader may keep the highest it saw.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from dledger.codes import DISK_FAULTS, DLedgerError, PushType, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.effects import BeyondRepair, Effect, ForgetCorruptAbove, MarkCorrupt, PushReply, Repaired
from dledger.core.env import MemberEnv
from dledger.core.install_snapshot import LeaderCheck
from dledger.core.messages import PushRequest, PushResponse
from dledger.entry import HEADER, HEADER_SIZE
from dledger.ratelog import RateLimitedLog
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.base import CorruptEntryError, PushRejected, StoreError

log = logging.getLogger(__name__)


class PartialInstall(Protocol):
    """The snapshot being received, if any (core.install_snapshot.SnapshotReceiver)."""

    @property
    def meta(self) -> SnapshotMeta | None: ...

    def drop_partial(self) -> None: ...


class HandlerContext(MemberEnv, Protocol):
    """All an EntryHandler needs of its follower (the Node is one): the member, store, options
    and clock; the elector's leader check; the install in progress (a leader that extends our
    log makes it moot). Its answers and what it asks of the member's integrity are effects
    (core.effects), which the node takes after each call (`take_effects`)."""

    @property
    def cfg(self) -> DLedgerConfig: ...
    @property
    def elector(self) -> LeaderCheck: ...
    @property
    def receiver(self) -> PartialInstall: ...

    # the log changed under a configuration entry: calls, not effects, since the configuration
    # in force must follow the log before the rest of the push is handled (core.changes)
    def log_appended(self, first: int, last: int) -> None: ...
    def log_truncated(self, end: int) -> None: ...


class EntryHandler:
    def __init__(self, env: HandlerContext) -> None:
        self.env = env
        self._matched = (-1, -1)  # (term, highest index known equal to that term's leader's log)
        self.pending: dict[int, tuple[PushRequest, bytes, Any, int]] = {}  # first_index -> push
        self.unsynced: list[tuple[int, Any]] = []  # (end, token): APPEND answers waiting for fsync
        self.leader_committed = -1  # the highest commit index a leader's push named (a follower's lag, metrics)
        self.effects: list[Effect] = []  # answers and integrity effects, in order, until the node takes them
        # every line below can be had for one push each (a forged HEART_BEAT + TRUNCATE made an old
        # leader log "refusing to truncate committed entries" at 175 KB/s): one per kind per 10 s
        self._log = RateLimitedLog.on_ms(log, lambda: env.now)

    def on_leader_change(self) -> None:
        """A new leader (or none): what matched the old one proves nothing now, and answers
        owed to it must not say SUCCESS for entries a new leader may truncate."""
        self._matched = (-1, -1)
        for req, _, token, _ in self.pending.values():
            self._answer(token, ResponseCode.INCONSISTENT_STATE, req)
        self.pending.clear()
        self._fail_unsynced(-1)

    def take_effects(self) -> list[Effect]:
        """What the calls so far asked for, in order (core.effects); the caller applies them."""
        out, self.effects = self.effects, []
        return out

    def _fail_unsynced(self, above: int) -> None:
        """Answer INCONSISTENT_STATE to waiting APPENDs whose entries end past `above`."""
        keep = []
        for end, token in self.unsynced:
            if end > above:
                self.effects.append(PushReply(token, self._response(ResponseCode.INCONSISTENT_STATE)))
            else:
                keep.append((end, token))
        self.unsynced = keep

    @property
    def matched_index(self) -> int:
        """Valid only in the term it was learnt: after adopting a higher term (a vote) and
        before hearing the new leader, an answer to the old leader's push must not report
        a match against a log the new term may have truncated."""
        term, index = self._matched
        return index if term == self.env.member.term else -1

    def _match(self, index: int) -> None:
        self._matched = (self.env.member.term, max(self.matched_index, index))

    def note_match(self, index: int, leader_commit: int) -> None:
        """Our log is known equal to the leader's through `index` (an InstallSnapshot found
        or put its last entry here)."""
        self._match(index)
        if leader_commit >= 0:
            self.update_commit(leader_commit)

    def after_reset(self, end: int) -> None:
        """The store was reset to end at `end` (a snapshot installed): answers waiting for the
        fsync of entries past it fail; pushes parked for a gap wait on (or time out)."""
        self._fail_unsynced(end)

    def durable_match(self) -> int:
        """The prefix both fsynced here and known equal to the leader's log."""
        return min(self.env.store.durable_index, self.matched_index)

    # --- entry point -------------------------------------------------------------------

    def handle_push(self, req: PushRequest, data: memoryview | bytes | bytearray, token: Any) -> None:
        env = self.env
        err = env.elector.accept_leader(req.term, req.leader_id)
        if err is not None:
            self._answer(token, err, req)
            return
        kind = req.type
        self.leader_committed = max(self.leader_committed, req.committed_index)
        try:
            if kind == PushType.APPEND:
                self._append(req, data, token)
            elif kind == PushType.COMPARE:
                self._compare(req, token)
            elif kind == PushType.TRUNCATE:
                self._truncate(req, token)
            elif kind == PushType.COMMIT:
                self.update_commit(req.committed_index)
                self._answer(token, ResponseCode.SUCCESS, req)
            elif kind == PushType.REPAIR:
                self._repair(req, data, token)
            else:
                self._answer(token, ResponseCode.UNSUPPORTED, req)
        except CorruptEntryError as e:
            # one of our own records fails verification: the answer names it (corrupt_index),
            # and the leader sends it again
            self.effects.append(MarkCorrupt(e.index, e.message))
            # (named even when beyond repair, which the mark ignores: the leader then sends a
            # snapshot past it — the simulator found a TRUNCATE after such a record refused for ever)
            self._answer(token, ResponseCode.INCONSISTENT_STATE, req, reason=e.message, corrupt_index=e.index)
        except DLedgerError as e:
            self._log.warning("failed", "push %s from %s failed: %s", _kind_name(kind), req.leader_id, e)
            self._answer(token, _failure_code(e), req, reason=e.message)
        store = env.store
        if env.cfg.flush == "sync" and store.durable_index < store.end_index:
            store.request_flush()  # what a COMPARE or a retried push matched must become durable too

    # --- COMPARE / TRUNCATE ----------------------------------------------------------------

    def _compare(self, req: PushRequest, token: Any) -> None:
        store = self.env.store
        i = req.prev_index
        if i > store.end_index:
            self._answer(token, ResponseCode.INCONSISTENT_STATE, req)
            return
        # below our log: compacted behind our snapshot, so committed, and committed entries are
        # the leader's (the review found a leader walking down below our begin one index per
        # round trip, then a TRUNCATE there failing for ever); it probes higher next
        below = i < store.begin_index - 1
        term = -1 if below else store.term_at(i)
        if below or term == req.prev_term:
            self.note_match(i, req.committed_index)
            self._answer(token, ResponseCode.SUCCESS, req)
            return
        first = store.first_index_of_term(term)
        self._answer(token, ResponseCode.INCONSISTENT_STATE, req, x_index=max(first, store.begin_index), x_term=term)

    def _truncate(self, req: PushRequest, token: Any) -> None:
        store = self.env.store
        i = req.prev_index
        if i > store.end_index or (i >= store.begin_index and store.term_at(i) != req.prev_term):
            self._answer(token, ResponseCode.INCONSISTENT_STATE, req)
            return
        # A late or duplicated TRUNCATE must not remove entries the leader already
        # counted: entries of the leader's own term came from it, and an entry at i + 1
        # of the leader's term there matches its log; in both cases all after i match.
        stale = store.end_term == req.term or (
            req.next_term >= 0 and i + 1 <= store.end_index and store.term_at(i + 1) == req.next_term)
        if i < store.end_index and not stale:
            self._log.info("truncate", "%s: truncating entries after %d (end %d) for leader %s",
                           self.env.member.self_id, i, store.end_index, req.leader_id)
            self._fail_unsynced(i)
            store.truncate(i + 1)
            self.effects.append(ForgetCorruptAbove(i))
            self.env.log_truncated(i)  # a configuration entry removed: the one before is in force
        self._match(i)
        self.update_commit(req.committed_index)
        self._answer(token, ResponseCode.SUCCESS, req)

    # --- APPEND ----------------------------------------------------------------------------------

    def _append(self, req: PushRequest, data: memoryview | bytes | bytearray, token: Any) -> None:
        store = self.env.store
        first, last = req.first_index, req.first_index + req.count - 1
        if req.count <= 0 or not data:
            self._answer(token, ResponseCode.REQUEST_WITH_EMPTY_BODYS, req)
        elif first == store.end_index + 1:
            self._write(req, data, token)
            self._drain_pending()
        elif last <= store.end_index:
            self._fall_behind(req, data, token)
        elif first <= store.end_index:
            skip = self._skip_known(req, data)
            if skip is None:
                self._answer(token, ResponseCode.INCONSISTENT_STATE, req)
            else:
                self._write(req, memoryview(data)[skip:], token)
                self._drain_pending()
        elif first in self.pending:
            self._answer(token, ResponseCode.REPEATED_PUSH, req)
        else:
            self.pending[first] = (req, bytes(data), token, self.env.now)

    def _write(self, req: PushRequest, data: memoryview | bytes | bytearray, token: Any) -> None:
        store = self.env.store
        first = store.end_index + 1
        try:
            end = store.append_as_follower(data)
        except PushRejected as e:
            self._rejected(req, first, e, token)
            return
        except DLedgerError as e:
            # a disk that cannot write says so (DISK_FULL / DISK_ERROR), so the leader backs
            # off instead of re-probing
            self._log.info("disk", "%s: push at %d rejected: %s", self.env.member.self_id, req.first_index,
                           e.message)
            self._answer(token, _failure_code(e), req, reason=e.message)
            return
        self.env.log_appended(first, end)  # a configuration entry among them takes effect now
        self._match(end)
        self.update_commit(req.committed_index)
        if self.env.receiver.meta is not None:  # a leader extends our log: no install is coming back
            self.env.receiver.drop_partial()
        if self.env.cfg.flush == "sync" and store.durable_index < end:
            self.unsynced.append((end, token))
            store.request_flush()
        else:
            self._answer(token, ResponseCode.SUCCESS, req)

    def _rejected(self, req: PushRequest, first: int, e: PushRejected, token: Any) -> None:
        """A pushed record failed verification. A chain CRC mismatch on the first record
        means our log differs before the push (the leader re-probes), unless we hold the
        leader's (prev_index, prev_term): then one of the two copies is damaged. Anything
        else is a damaged record (or a misconfigured member): the answer names it, so the
        leader checks its own copy and says so, instead of retrying for ever in silence."""
        store, env = self.env.store, self.env
        me = env.member.self_id
        if e.index == first and e.reason == "chain crc mismatch":
            prev = first - 1
            same_prev = first > req.first_index or (
                req.prev_index == prev and store.term_at(prev) == req.prev_term)
            if not same_prev:
                self._log.info("mismatch", "%s: push at %d rejected: %s", me, req.first_index, e.message)
                self._answer(token, ResponseCode.INCONSISTENT_STATE, req)
                return
            own = store.verify(prev) if prev >= store.begin_index else None
            if own is not None:
                self.effects.append(MarkCorrupt(prev, own))
                self._answer(token, ResponseCode.INCONSISTENT_STATE, req, reason=own)
                return
        self._log.warning("rejected", "%s: push from %s at %d rejected: %s", me, req.leader_id, req.first_index,
                          e.message)
        self._answer(token, ResponseCode.INCONSISTENT_STATE, req, bad_index=e.index, reason=e.message)

    # --- REPAIR ----------------------------------------------------------------------------------

    def _repair(self, req: PushRequest, data: memoryview | bytes | bytearray, token: Any) -> None:
        """Records we hold, sent again by the leader: each of ours that fails verification is
        overwritten with the leader's (the store checks it is the same entry), the others
        are left alone. The answer's corrupt_index says what is still damaged."""
        env, store = self.env, self.env.store
        off, index, n = 0, req.first_index, len(data)
        if req.count == 0 and n == 0:  # the leader's log begins at first_index: nothing below to repair from
            self.effects.append(BeyondRepair(req.first_index))
            self._answer(token, ResponseCode.SUCCESS, req)
            return
        repaired: list[int] = []
        try:
            while off < n and index <= store.end_index:
                if n - off < HEADER_SIZE:
                    raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, "repair push holds no whole record")
                size = HEADER.unpack_from(data, off)[1]
                if size < HEADER_SIZE or off + size > n:
                    raise StoreError(ResponseCode.UNEXPECTED_ARGUMENT, f"repair record {index} has a bad size {size}")
                if index >= store.begin_index and store.verify(index) is not None:
                    store.repair(index, memoryview(data)[off : off + size])
                    repaired.append(index)
                off += size
                index += 1
        except StoreError as e:
            self._log.warning("repair", "%s: repair from %s at %d failed: %s", env.member.self_id, req.leader_id,
                              index, e.message)
            self.effects.append(Repaired(req.first_index, index - 1, tuple(repaired)))
            self._answer(token, _failure_code(e), req, reason=e.message)
            return
        self.effects.append(Repaired(req.first_index, index - 1, tuple(repaired)))
        self.update_commit(req.committed_index)
        self._answer(token, ResponseCode.SUCCESS, req)

    def _fall_behind(self, req: PushRequest, data: memoryview | bytes | bytearray, token: Any) -> None:
        """A retried push we already hold: succeed only if our copy is the same."""
        if self._skip_known(req, data) == len(data):
            self._match(req.first_index + req.count - 1)
            self._answer(token, ResponseCode.SUCCESS, req)
        else:
            self._answer(token, ResponseCode.INCONSISTENT_STATE, req)

    def _skip_known(self, req: PushRequest, data: memoryview | bytes | bytearray) -> int | None:
        """Byte length of the pushed records we already hold identically (by chain CRC);
        None if one of them differs."""
        store = self.env.store
        off, index = 0, req.first_index
        n = len(data)
        while off < n and index <= store.end_index:
            if n - off < HEADER_SIZE:
                return None  # a torn or forged push: no whole header (struct.error before)
            _, size, idx, _term, _, _, chain, _, _ = HEADER.unpack_from(data, off)
            # the stored chain CRC field, not a verified read: a damaged body of ours is the
            # same entry (repaired separately), and must not fail every retried push
            if size < HEADER_SIZE or idx != index or index < store.begin_index or \
                    store.chain_at(index) != chain:
                return None  # (a size of 0 looped here for ever)
            off += size
            index += 1
        return off

    def _drain_pending(self) -> None:
        store = self.env.store
        while self.pending:
            nxt = self.pending.pop(store.end_index + 1, None)
            if nxt is None:
                return
            req, data, token, _ = nxt
            self._write(req, data, token)

    # --- commit, durability, timeouts -----------------------------------------------------------

    def update_commit(self, leader_commit: int) -> None:
        """Commit only what is known to match the leader's log."""
        store = self.env.store
        c = min(leader_commit, self.matched_index, store.end_index)
        if c > store.committed_index:
            store.set_committed(c)

    def on_durable(self, index: int) -> None:
        """`index` is the store's durable index now (the env clamps the flush thread's hint)."""
        if not self.unsynced:
            return
        keep = []
        for end, token in self.unsynced:
            if end <= index:
                self.effects.append(PushReply(token, self._response(ResponseCode.SUCCESS)))
            else:
                keep.append((end, token))
        self.unsynced = keep

    def tick(self) -> None:
        """Fast-forward case: a push that waited too long for its gap to fill."""
        if not self.pending:
            return
        limit = self.env.now - self.env.cfg.max_push_timeout_ms
        for first in [f for f, p in self.pending.items() if p[3] <= limit]:
            req, _, token, _ = self.pending.pop(first)
            self._log.info("gap", "%s: push at %d waited too long for %d", self.env.member.self_id, first,
                           self.env.store.end_index + 1)
            self._answer(token, ResponseCode.INCONSISTENT_STATE, req)

    # --- answers ----------------------------------------------------------------------------------

    def _response(self, code: ResponseCode, x_index: int = -1, x_term: int = -1, bad_index: int = -1,
                  reason: str = "", corrupt_index: int = -1) -> PushResponse:
        """`corrupt_index`: a record of ours a read just found corrupt; the node puts its own
        first corrupt record in its place, if it knows one, when it applies the reply
        (core.effects.PushReply): the mark may be an effect before it in the same list."""
        env = self.env
        return PushResponse(int(code), env.member.term, env.store.end_index, x_index, x_term, self.durable_match(),
                            corrupt_index, bad_index, reason[:512])

    def _answer(self, token: Any, code: ResponseCode, req: PushRequest, x_index: int = -1, x_term: int = -1,
                bad_index: int = -1, reason: str = "", corrupt_index: int = -1) -> None:
        self.effects.append(PushReply(token, self._response(code, x_index, x_term, bad_index, reason, corrupt_index)))


def _kind_name(kind: int) -> str:
    return PushType(kind).name if kind in PushType._value2member_map_ else str(kind)


def _failure_code(e: DLedgerError) -> ResponseCode:
    """What a failed push answers: a disk fault as itself, anything else as a log mismatch."""
    if e.code in DISK_FAULTS:
        return e.code
    return ResponseCode.INCONSISTENT_STATE
