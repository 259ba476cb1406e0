"""The leader's client append path (DLedger's DLedgerServer.handleAppend and the leader's
append in DLedgerLeaderElector's term): a client APPEND is checked when it arrives (leader,
no transfer, the pending bound and the store's pressure: backpressure before anything is
taken), taken, and stored at the next drain together with every other append taken since
(a group append: one store write, one encode pass, one quorum check); each request keeps its
own indexes and answer. Idempotent producers' appends (core.producers) are decided against
the producer table and stored after a session marker. Answers go out when the quorum
commits (core.quorum) or, for a proposal, once the state machine applied it.

`AppendPath` is a part of `Node` (core.node), carved out of it: it holds no state of its
own; what it reads and calls of the node is declared below.
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.core.configs import ChangeToken
from dledger.core.messages import AppendRequest, AppendResponse
from dledger.core.producers import Decision, Producer, Run, marker_body, unverifiable
from dledger.entry import MAGIC_NORMAL, MAGIC_SESSION
from dledger.statemachine.applier import Proposal
from dledger.store.base import AppendedBatch, StoreError

if TYPE_CHECKING:
    import msgspec

    from dledger.config import DLedgerConfig
    from dledger.core.elector import LeaderElector
    from dledger.core.integrity import Integrity
    from dledger.core.member_state import MemberState
    from dledger.core.producers import CreationLimiter, ProducerTable
    from dledger.core.quorum import QuorumAckChecker
    from dledger.statemachine.applier import Applier
    from dledger.store.base import LedgerStore


@dataclass(slots=True)
class PendingAppend:
    """A client append taken, stored at the next drain. (Not frozen: a frozen dataclass's
    __init__ sets each field through object.__setattr__, ~1 us per append on the leader's
    hot path; nothing changes one after it is made.)"""

    token: Any
    bodies: list[bytes]
    producer: str = ""  # an idempotent producer's (core.producers)
    sequence: int = 0
    epoch: int = 0
    principal: str = ""  # who sent it (a certificate's or token's name; "" anonymous): producers' owners


class AppendPath:
    """The Node's client appends: taken (`_handle_append`), stored at the drain
    (`_store_appends`), answered (`_complete_append`, the quorum's callback)."""

    if TYPE_CHECKING:  # the node's, used here
        cfg: DLedgerConfig
        store: LedgerStore
        member: MemberState
        elector: LeaderElector
        quorum: QuorumAckChecker
        applier: Applier | None
        producers: ProducerTable
        creations: CreationLimiter
        integrity: Integrity
        now: int
        wall_offset_ms: int
        _appends: list[PendingAppend]
        _proposers: set[Any]
        _duplicates: dict[Any, tuple[list[int], int]]
        _pump_needed: bool

        def _check_producers_ready(self) -> None: ...
        def _hard_fault(self, e: DLedgerError) -> TypeGuard[StoreError]: ...
        def store_failed(self, e: StoreError) -> None: ...
        def reply(self, token: Any, code: int, msg: msgspec.Struct, data: bytes = b"") -> None: ...
        def _change_answered(self, token: Any, code: ResponseCode, res: AppendedBatch | None,
                             message: str) -> None: ...

    def _handle_append(self, msg: AppendRequest, token: Any, principal: str = "") -> None:
        m = self.member
        if not m.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER, f"leader is {m.leader_id or 'unknown'}")
        if self.elector.transferring:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING, "leadership transfer in progress")
        pending = self.quorum.pending + len(self._appends)
        if pending >= self.cfg.max_pending_requests:
            raise DLedgerError(ResponseCode.LEADER_PENDING_FULL, f"{pending} appends pending")
        full = self.store.pressure_error()
        if full is not None:
            raise full
        self.store.check_bodies(msg.bodies, m.term)  # a bad request fails alone, before the batch
        if msg.producer:
            if msg.want_results:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "an idempotent producer cannot propose")
            self._check_producers_ready()
        if msg.want_results:
            if self.applier is None:
                raise DLedgerError(ResponseCode.UNSUPPORTED, f"group {m.group} has no state machine to propose to")
            if self.applier.stopped is not None:
                raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {self.applier.stopped}")
            self._proposers.add(token)
        self._appends.append(PendingAppend(token, msg.bodies, msg.producer, msg.sequence, msg.epoch, principal))
        self.integrity.active = True

    def _store_appends(self) -> None:
        """Store the appends taken since the last drain with one store write (group append:
        one encode pass, one quorum check); each request keeps its own indexes and answer."""
        batch, self._appends = self._appends, []
        m = self.member
        if not m.is_leader or self.elector.transferring:  # changed since they were taken: not stored
            code = ResponseCode.NOT_LEADER if not m.is_leader else ResponseCode.LEADER_TRANSFERRING
            for a in batch:
                self._complete_append(a.token, code, None, "leadership changed before the append was stored")
            return
        if any(a.producer for a in batch):
            self._store_idempotent(batch)
            return
        bodies = batch[0].bodies if len(batch) == 1 else [b for a in batch for b in a.bodies]
        try:
            res = self.store.append_as_leader(bodies, m.term, MAGIC_NORMAL)
        except DLedgerError as e:
            self._fail_write(batch, e)
            return
        deadline = self.now + self.cfg.max_wait_ack_ms
        if len(batch) == 1:
            self.quorum.add(batch[0].token, res, deadline)
        else:
            off = 0
            for a in batch:
                n = len(a.bodies)
                self.quorum.add(a.token, AppendedBatch(res.first_index + off, res.term, res.positions[off : off + n]),
                                deadline)
                off += n
        self._written(res)

    def _fail_write(self, batch: list[PendingAppend], e: DLedgerError) -> None:
        for a in batch:
            self._complete_append(a.token, e.code, None, e.message)
        if self._hard_fault(e):
            self.store_failed(e)

    def _written(self, res: AppendedBatch) -> None:
        """Entries through res are stored: the leader counts itself once they are durable enough."""
        if self.cfg.flush == "async" or self.store.durable_index >= res.last_index:
            self.quorum.ack_self(res.last_index)
        else:
            self.store.request_flush()
        self._pump_needed = True

    def _store_idempotent(self, batch: list[PendingAppend]) -> None:
        """A write with idempotent appends (core.producers): what the log holds already is
        answered from the producer table; the rest is stored after a session marker naming
        each entry's producer and sequence, in order."""
        table, term = self.producers, self.member.term
        first = self.store.end_index + 2  # the marker takes end + 1
        ts = self.now + self.wall_offset_ms
        views: dict[str, Producer] = {}  # producers as they will be after this write
        runs: list[Run] = []
        bodies: list[bytes] = []
        taken: list[tuple[PendingAppend, Decision, int, int]] = []  # (append, decision, first new index, new count)
        creating: dict[str, int] = {}  # producers this write creates, per principal
        for a in batch:
            d = Decision(0)
            if a.producer:
                view = views.get(a.producer) or table.lookup(a.producer)
                try:
                    d = self._decide(a, view, creating, first, bodies)
                except DLedgerError as e:
                    self._complete_append(a.token, e.code, None, e.message)
                    continue
            new = a.bodies[d.duplicates:]
            at = first + len(bodies)
            if new:
                seq = a.sequence + d.duplicates if a.producer else 0
                if a.producer:
                    view = view.copy(table.folded) if view is not None else Producer(owner=a.principal)
                    view.add(seq, at, len(new), ts, a.epoch)
                    views[a.producer] = view
                _add_run(runs, Run(a.producer, seq, len(new), a.epoch, a.principal if a.producer else ""))
                bodies.extend(new)
            taken.append((a, d, at, len(new)))
        marker = marker_body(ts, runs)
        if len(marker) > self.cfg.max_body_bytes and len(batch) > 1:  # a marker is a body: halve the write
            half = len(batch) // 2
            self._store_idempotent(batch[:half])
            self._store_idempotent(batch[half:])  # decided against the first half's (the overlay)
            return
        res = None
        if bodies:
            res = self._write_marked(marker, bodies, [a for a, *_ in taken])
            if res is None:
                return
            table.note_own(views.items())
            for principal, count in creating.items():
                self.creations.spend(principal, count, self.now)
        deadline = self.now + self.cfg.max_wait_ack_ms
        for a, d, at, n in taken:
            k = at - res.first_index if res is not None else 0
            result = AppendedBatch(at, term, res.positions[k : k + n] if res is not None else array("q"))
            if not d.duplicates:
                self.quorum.add(a.token, result, deadline)
                continue
            self._duplicates[a.token] = (d.indexes + list(range(at, at + n)), d.duplicates)
            wait = max(d.wait_index, at + n - 1) if n else d.wait_index
            if wait <= self.store.committed_index:
                self._complete_append(a.token, ResponseCode.SUCCESS, result, "")
            else:
                self.quorum.add(a.token, result, deadline, wait)
        if res is not None:
            self._written(res)

    def _decide(self, a: PendingAppend, view: Producer | None, creating: dict[str, int], first: int,
                planned: list[bytes]) -> Decision:
        """An idempotent append against its producer's `view` (core.producers.decide), then the
        leader's own checks, all before anything is written: a creation within its principal's
        rate (`creating` counts this write's), duplicates that are the stored entries."""
        d = self.producers.decide(view, a.producer, a.sequence, len(a.bodies), a.epoch, a.principal)
        if view is None:
            count = creating.get(a.principal, 0) + 1
            self.creations.check(a.principal, count, self.now)
            creating[a.principal] = count
        if d.duplicates:
            self._check_duplicates(a, d, first, planned)
        return d

    def _check_duplicates(self, a: PendingAppend, d: Decision, first: int, planned: list[bytes]) -> None:
        """A body answered as a duplicate must be the stored entry (its body CRC, from the record
        header; from index `first` on, the bodies `planned` for this write): else the id is
        being reused, and success would answer for a body that was never stored. One whose
        entry cannot be read (deleted by retention or a snapshot) is refused, not answered."""
        for k, i in enumerate(d.indexes):
            try:
                stored = zlib.crc32(planned[i - first]) if i >= first else self.store.body_crc(i)
            except StoreError as e:
                raise unverifiable(a.producer, a.sequence + k, f"its entry {i} cannot be read here: {e.message}") from e
            if zlib.crc32(a.bodies[k]) != stored:
                raise DLedgerError(ResponseCode.SEQUENCE_REUSED,
                                   f"sequence {a.sequence + k} of producer {a.producer!r} is stored with a different "
                                   f"body: this producer id is being reused; start a new session (a new epoch) or "
                                   f"use another id")

    def _write_marked(self, marker: bytes, bodies: list[bytes], batch: list[PendingAppend]) -> AppendedBatch | None:
        """Store the session marker, then the bodies: both or neither (a marker must never be
        followed by entries it does not describe). None: failed, the appends answered."""
        store, term = self.store, self.member.term
        try:
            mres = store.append_as_leader([marker], term, MAGIC_SESSION)
        except DLedgerError as e:
            self._fail_write(batch, e)
            return None
        try:
            return store.append_as_leader(bodies, term, MAGIC_NORMAL)
        except DLedgerError as e:
            try:
                store.truncate(mres.first_index)  # not pushed yet: nobody else has seen it
            except StoreError as te:
                self.store_failed(te)  # a leader that cannot drop it must not write after it
            self._fail_write(batch, e)
            return None

    def _complete_append(self, token: Any, code: ResponseCode, res: AppendedBatch | None, message: str) -> None:
        if isinstance(token, ChangeToken):  # a configuration change waits in the quorum as an append does
            self._change_answered(token.token, code, res, message)
            return
        m = self.member
        dup = self._duplicates.pop(token, None)
        if token in self._proposers:
            self._proposers.discard(token)
            a = self.applier
            if code == ResponseCode.SUCCESS and res is not None and a is not None:
                if a.stopped is not None:  # committed, but no result will ever come from here
                    msg = AppendResponse(int(ResponseCode.INTERNAL_ERROR), m.self_id, res.term, res.first_index,
                                         res.positions.tolist(), f"committed; state machine stopped: {a.stopped}")
                    self.reply(token, RequestCode.APPEND, msg)
                    return
                # committed: the answer waits for the results (apply follows commit, never precedes it)
                a.wait_proposal(Proposal(token, res.first_index, res.last_index, res.term, res.positions.tolist()))
                return
        if code == ResponseCode.SUCCESS and dup is not None:
            msg = self._duplicate_answer(*dup)
        elif code == ResponseCode.SUCCESS and res is not None:
            msg = AppendResponse(int(code), m.self_id, res.term, res.first_index, res.positions.tolist())
        else:
            msg = AppendResponse(int(code), m.leader_id or "", m.term, message=message)
        self.reply(token, RequestCode.APPEND, msg)

    def _duplicate_answer(self, indexes: list[int], duplicates: int) -> AppendResponse:
        """Each body's index, term and position, the duplicates' from where the log holds them."""
        terms, positions = [], []
        for i in indexes:
            try:
                pos, _, term = self.store.slot(i) if i >= 0 else (-1, 0, -1)
            except StoreError:
                pos, term = -1, -1
            terms.append(term)
            positions.append(pos)
        return AppendResponse(int(ResponseCode.SUCCESS), self.member.self_id, self.member.term, indexes[0], positions,
                              indexes=indexes, terms=terms, duplicates=duplicates)


def _add_run(runs: list[Run], run: Run) -> None:
    """Append `run`, merged into the last one when it continues it (plain appends, mostly)."""
    last = runs[-1] if runs else None
    if last is not None and last.producer == run.producer and (not run.producer or (
            last.epoch == run.epoch and last.first_seq + last.count == run.first_seq)):
        runs[-1] = Run(run.producer, last.first_seq, last.count + run.count, run.epoch, run.owner)
    else:
        runs.append(run)
