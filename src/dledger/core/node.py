"""Node: one member of one group, as a pure state machine (DLedgerServer's core).

Inputs, each with the current time in ms: `handle` (a request), `tick`, and
`complete` (one input for every report of work the node asked for, core.contexts.Completion:
the answer to a request this node sent, or None when the transport failed; the store's
flush thread made entries durable; a worker's job done).
Data faults: a member that finds one of its records corrupt (a read, the scrub of
idle ticks, a push) marks itself corrupt (`corrupt`): it hands leadership over, does
not campaign, and reports the index until the leader's REPAIR push restored it.
Outputs: `drain()` returns the actions to execute: `Send` a request to a peer,
`Reply` to a request; with a state machine (an `Applier`) also `Apply` a batch of
committed entries, `RunQuery`, `TakeSnapshot`, and for InstallSnapshot (core.install_snapshot)
`InstallChunk`, `RestoreSnapshot` — the runtime runs those, in the order given, on one
worker thread and reports back (`complete` with `Applied`, `ApplyFailed`, `SnapshotTaken`,
`ChunkInstalled`, `Restored`); `ReadChunk` (a leader's snapshot chunk for a follower)
runs beside them (`ChunkRead`). The node reads no clock and does no I/O besides its
LedgerStore, whose appends only touch memory or the page cache.
"""

from __future__ import annotations

import logging
import random
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

import msgspec

from dledger.codes import DISK_FAULTS, DLedgerError, PushType, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import (
    Answered,
    Applied,
    ApplyFailed,
    ChunkCtx,
    ChunkInstalled,
    ChunkRead,
    Completion,
    Context,
    Durable,
    HeartbeatCtx,
    InstallCtx,
    PushCtx,
    ReadIndexCtx,
    Restored,
    SnapshotTaken,
    TransferCtx,
    VoteCtx,
)
from dledger.core.dispatcher import EntryDispatcher
from dledger.core.elector import LeaderElector
from dledger.core.follower_read import FollowerReads
from dledger.core.handler import EntryHandler
from dledger.core.install_snapshot import SnapshotReceiver, holds
from dledger.core.integrity import Integrity
from dledger.core.member_state import MemberState
from dledger.core.messages import (
    AppendRequest,
    AppendResponse,
    EntriesResponse,
    GetRequest,
    HeartBeatRequest,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    MetadataRequest,
    MetadataResponse,
    Msg,
    PushRequest,
    QueryRequest,
    QueryResponse,
    ReadIndexRequest,
    ReadIndexResponse,
    ReadRequest,
    Role,
    SimpleResponse,
    SnapshotResponse,
    VoteRequest,
    is_member_message,
)
from dledger.core.producers import CreationLimiter, Decision, Producer, ProducerTable, Run, marker_body, unverifiable
from dledger.core.progress import Progress
from dledger.core.quorum import QuorumAckChecker
from dledger.core.read_index import ReadIndex
from dledger.core.reads import ReadPath
from dledger.core.status import FollowerStatus, NodeStatus, RoleView
from dledger.entry import MAGIC_NOOP, MAGIC_NORMAL, MAGIC_SESSION
from dledger.statemachine.applier import Applier, ApplyBatch, Proposal
from dledger.statemachine.snapshot import PRODUCERS_FILE, SnapshotMeta
from dledger.store.base import AppendedBatch, CorruptEntryError, LedgerStore, StoreError

log = logging.getLogger(__name__)

PRODUCERS_SAVE_ENTRIES = 10_000  # a plain log's producer table is saved after this many entries folded,
PRODUCERS_SAVE_MS = 30_000  # or this long after it changed


@dataclass(slots=True, frozen=True)
class _Append:
    """A client append taken, stored at the next drain."""

    token: Any
    bodies: list[bytes]
    producer: str = ""  # an idempotent producer's (core.producers)
    sequence: int = 0
    epoch: int = 0
    principal: str = ""  # who sent it (a certificate's or token's name; "" anonymous): producers' owners


@dataclass(slots=True)
class Send:
    peer: str
    code: int
    msg: msgspec.Struct
    data: bytes | memoryview
    ctx: Context  # handed back to on_response (core.contexts)
    timeout_ms: int


@dataclass(slots=True)
class Reply:
    token: Any
    code: int  # the request code, to pick the response type
    msg: msgspec.Struct
    data: bytes = b""


@dataclass(slots=True)
class Apply:
    """Apply these committed entries to the state machine, then call `on_applied`."""

    batch: ApplyBatch


@dataclass(slots=True)
class RunQuery:
    """Run `StateMachine.query(request)` (its state includes `applied_index`); answer `token`."""

    token: Any
    request: bytes
    applied_index: int


@dataclass(slots=True)
class TakeSnapshot:
    """Snapshot the state machine as of `index` (nothing after it is applied yet: earlier
    actions only), then call `on_snapshot`. Without a state machine the snapshot is empty."""

    index: int
    term: int
    chain_crc: int
    next_pos: int  # where record index + 1 starts (or would): a follower installing it continues there
    keep: tuple[int, ...] = ()  # snapshots being sent to followers: not pruned
    producers: bytes = b""  # the producer table (core.producers): the snapshot's PRODUCERS_FILE


@dataclass(slots=True)
class ReadChunk:
    """Read `max_bytes` of snapshot `meta`'s stream from `offset` (off the event loop), then
    report `ChunkRead(peer, ctx, data, crc32, error)`."""

    peer: str
    meta: SnapshotMeta
    offset: int
    max_bytes: int
    ctx: ChunkCtx


@dataclass(slots=True)
class InstallChunk:
    """Write a chunk of the leader's snapshot `meta` (statemachine.install.InstallSink; a new
    meta starts a new one), then report `ChunkInstalled(token, meta, next_offset, done,
    error)`; `done`: the snapshot is whole, verified and in place (not yet restored)."""

    token: Any
    meta: SnapshotMeta
    offset: int
    data: bytes | memoryview
    crc: int


@dataclass(slots=True)
class DropInstall:
    """Delete the partial copy of a snapshot being received (no longer needed)."""


@dataclass(slots=True)
class RestoreSnapshot:
    """Replace the state machine's state with installed snapshot `meta`, then report `Restored`."""

    meta: SnapshotMeta


Action = Send | Reply | Apply | RunQuery | TakeSnapshot | ReadChunk | InstallChunk | RestoreSnapshot | DropInstall


class Node:
    def __init__(self, cfg: DLedgerConfig, store: LedgerStore, now_ms: int, rng: random.Random | None = None,
                 applier: Applier | None = None, snapshot: SnapshotMeta | None = None,
                 producers: bytes | None = None) -> None:
        """`snapshot`: this member's newest snapshot (restored into the applier's state machine;
        a plain log's is empty); `producers`: its PRODUCERS_FILE (else the table is folded
        from the log's begin)."""
        self.cfg = cfg
        self.store = store
        self.producers = ProducerTable(cfg.producer_expiry_ms, cfg.max_producers, store.begin_index - 1,
                                       cfg.max_producers_per_principal, cfg.max_producer_spans)
        # the leader's bound on producer creations per principal (in memory, by `now`)
        self.creations = CreationLimiter(cfg.producer_creations_per_second, 10 * cfg.producer_creations_per_second)
        if producers:
            self._load_producers(producers, "our snapshot")
        # a plain log saves its table in a snapshot of its own (a restart cannot fold markers
        # retention deleted): through here, and when (now_ms), and the one being written
        self._producers_saved = (self.producers.folded if producers else -1, now_ms)
        self._producers_saving = -1
        self._producers_restoring = False  # a plain log's installed table is being read
        self.wall_offset_ms = 0  # wall clock minus the `now_ms` clock (the runtime's is monotonic)
        self._duplicates: dict[Any, tuple[list[int], int]] = {}  # token -> (each body's index, duplicates)
        self.applier = applier  # None: a plain log, nothing applied
        self.snapshot_meta = snapshot  # what a follower needing our deleted prefix gets
        if applier is not None and snapshot is not None:
            self._align_with_snapshot(snapshot)
        self._proposers: set[Any] = set()  # append tokens that wait for their apply results
        self._snapshot_waiters: list[Any] = []  # on-demand snapshot requests
        self._snapshot_wanted = False  # a follower needs a snapshot newer than ours (see want_snapshot)
        self._snapshot_pending = False  # a TakeSnapshot was emitted and not reported yet
        self.rng = rng or random.Random()
        self.now = now_ms
        self.member = MemberState(cfg.group, cfg.self_id, list(cfg.peer_map), store)
        self.actions: list[Action] = []
        # what this member, as leader, knows of each follower (core.progress): one object each,
        # shared by the dispatchers, the elector and the quorum
        self.progress: dict[str, Progress] = {p: Progress(p) for p in self.member.others}
        self.quorum = QuorumAckChecker(self.member, store, self._complete_append, self.progress, cfg.flush == "sync")
        self.elector = LeaderElector(self)
        self.reads = ReadIndex(self)
        self.follower_reads = FollowerReads(self)
        self.read_path = ReadPath(store, self.member, cfg, self.reply,
                                  lambda code, err, message: _error_for(code, err, self, message),
                                  lambda: self.now, lambda: self.elector.transferring, self.mark_corrupt,
                                  self.reads, self.follower_reads)
        self.handler = EntryHandler(self)
        self.receiver = SnapshotReceiver(self)
        self.restoring = False  # a RestoreSnapshot is on the worker: nothing is applied until it is done
        self.installs_sent = 0  # snapshots followers installed from us (metrics)
        self.install_bytes_sent = 0
        self.dispatchers: dict[str, EntryDispatcher] = {}
        self._pump_needed = False
        self._appends: list[_Append] = []  # client appends taken since the last drain
        # a write that failed although the store did not report itself failed: no campaign until then
        self._store_fault: tuple[StoreError, int] | None = None
        # our own records that fail verification, and the scrub (core.integrity)
        self.integrity = Integrity(store, cfg.group, cfg.self_id, now_ms)
        # until a leader says what its followers need, retention deletes nothing (any member may
        # lead next, and a follower needing a deleted prefix could never catch up)
        store.set_retention_floor(store.begin_index, "a follower (no leader known yet)")
        if store.recovered_corrupt is not None:
            self.mark_corrupt(*store.recovered_corrupt)

    # --- inputs ---------------------------------------------------------------

    def handle(self, code: int, msg: Msg, data: memoryview | bytes | bytearray, token: Any, now_ms: int,
               principal: str = "") -> None:
        """A request from a peer or a client; its reply is emitted now or later. `principal`:
        who sent it (a certificate's or token's name, "" anonymous): an idempotent producer
        belongs to the principal that created it."""
        self.now = now_ms
        err = self._check_addressing(code, msg)
        if err is not None:
            self.reply(token, code, _error_for(code, err, self))
            return
        try:
            self._dispatch(code, msg, data, token, principal)
        except CorruptEntryError as e:
            self.reply(token, code, _error_for(code, e.code, self, e.message))
            self.mark_corrupt(e.index, e.message)
        except DLedgerError as e:
            self.reply(token, code, _error_for(code, e.code, self, e.message))
            if self._hard_fault(e):
                self.store_failed(e)  # e.g. a vote whose term could not be persisted

    def complete(self, c: Completion, now_ms: int) -> None:
        """One input for every report of work the node asked for (core.contexts): answers to
        Sends, chunks read or installed, batches applied, snapshots taken or restored, fsyncs."""
        match c:
            case Answered(ctx, resp):
                self._answered(ctx, resp, now_ms)
            case ChunkRead(peer, ctx, data, crc, error):
                self._chunk_read(peer, ctx, data, crc, error, now_ms)
            case ChunkInstalled(token, meta, next_offset, done, error):
                self._chunk_installed(token, meta, next_offset, done, error, now_ms)
            case Applied(results):
                self._applied(results, now_ms)
            case ApplyFailed(reason):
                self._apply_failed(reason, now_ms)
            case SnapshotTaken(index, error, meta):
                self._snapshot_taken(index, error, now_ms, meta)
            case Restored(meta, error, producers):
                self._restored(meta, error, now_ms, producers)
            case Durable(index):
                self._durable(index, now_ms)

    def _answered(self, ctx: Context, resp: msgspec.Struct | None, now_ms: int) -> None:
        """The answer to one of our Sends (None: timeout or network failure)."""
        self.now = now_ms
        try:
            self._route_answer(ctx, resp)
        except StoreError as e:  # e.g. persisting a higher term on a full disk
            self.store_error(e)

    def _route_answer(self, ctx: Context, resp: msgspec.Struct | None) -> None:
        match ctx:
            case PushCtx():
                d = self.dispatchers.get(ctx.peer)
                if d is not None:
                    d.on_response(ctx, resp)
            case HeartbeatCtx():
                self.elector.on_heartbeat_response(ctx, resp)
            case VoteCtx():
                self.elector.on_vote_response(ctx, resp)
            case TransferCtx():
                self.elector.on_transfer_response(ctx, resp)
            case ReadIndexCtx():
                self.follower_reads.on_response(ctx, resp if isinstance(resp, ReadIndexResponse) else None)
            case InstallCtx():
                d = self.dispatchers.get(ctx.peer)
                if d is not None:
                    d.on_install_response(ctx, resp if isinstance(resp, InstallSnapshotResponse) else None)

    def tick(self, now_ms: int) -> None:
        self.now = now_ms
        try:
            if self.member.is_leader and (err := self.unwritable()) is not None:
                self.step_down(f"its store cannot write: {err.message}")
            self.elector.tick()
            self.integrity.forget_deleted()
            if self.member.is_leader and self.corrupt is not None and not self.elector.transferring:
                # no healthy follower took over in time (or none could): leave anyway; after
                # the elector's tick, so a transfer that just timed out is not replaced
                self.step_down(f"corrupt record at index {self.corrupt[0]}")
            if self.member.is_leader and self.apply_needs() >= 0 and not self.elector.transferring:
                self._hand_over(f"our state machine needs a snapshot through {self.apply_needs()}, which our log "
                                "cannot rebuild: a follower can get one from the next leader")
            if self.member.is_leader:
                self.quorum.expire(now_ms)
                for d in self.dispatchers.values():
                    d.tick()
                self._hold_retention()
                if self.corrupt is None:
                    self._relieve_pressure()
            self.handler.tick()
            if self.applier is not None:
                for q in self.applier.expired_queries(now_ms):
                    self.reply(q.token, RequestCode.QUERY,
                               QueryResponse(int(ResponseCode.TIMEOUT), self.member.leader_id or "",
                                             message="the state machine did not reach the read index "
                                                     f"{q.read_index} in time"))
            for index, reason in self.integrity.scrub(self.now):
                self.mark_corrupt(index, reason)
            self._save_producers()
        except StoreError as e:
            self.store_error(e)

    def _durable(self, index: int, now_ms: int) -> None:
        """The flush thread made entries durable. Its `index` is a hint delivered late (a
        truncate may have lowered the durable index since): the store's own value counts."""
        self.now = now_ms
        durable = min(index, self.store.durable_index)
        if self.member.is_leader and self.cfg.flush == "sync":
            self.quorum.ack_self(durable)
        self.handler.on_durable(durable)

    # --- store faults ------------------------------------------------------------------------

    def unwritable(self) -> StoreError | None:
        """Why this member's store cannot take writes, or None. While it cannot, the member
        neither leads nor campaigns: it would win and fail every append."""
        err = self.store.write_error()
        if err is None and self._store_fault is not None:
            err, until = self._store_fault
            if self.now >= until:
                self._store_fault, err = None, None
        return err

    def _hard_fault(self, e: DLedgerError) -> TypeGuard[StoreError]:
        """A write that failed (not a client append refused because the disk is full)."""
        if not isinstance(e, StoreError) or e.code not in DISK_FAULTS:
            return False
        return e.code != ResponseCode.DISK_FULL or self.store.pressure_error() is None

    def store_error(self, e: StoreError) -> None:
        """A store operation failed: a corrupt record, or a write that failed."""
        if isinstance(e, CorruptEntryError):
            self.mark_corrupt(e.index, e.message)
        else:
            self.store_failed(e)

    def unfit_to_lead(self) -> str:
        """Why this member must neither campaign nor take a hand-over ("" if it may lead): a store
        that cannot write (it would fail the NOOP), a corrupt record (it could serve it), a state
        machine that cannot advance (it could answer no proposal)."""
        fault = self.unwritable()
        if fault is not None:
            return f"its store cannot write: {fault.message}"
        if self.corrupt is not None:
            return f"{self.member.self_id} holds a corrupt record at index {self.corrupt[0]}"
        if self.apply_needs() >= 0:
            return (f"{self.member.self_id}'s state machine needs a snapshot through {self.apply_needs()} (its log "
                    "cannot give what comes before)")
        return ""

    # --- corrupt records ---------------------------------------------------------------------

    @property
    def corrupt(self) -> tuple[int, str] | None:
        """(index, reason) of our first record known to fail verification (core.integrity)."""
        return self.integrity.corrupt

    @property
    def corrupt_index(self) -> int:
        return self.integrity.corrupt_index

    @property
    def scrub_entries(self) -> int:
        return self.integrity.scrub_entries

    @scrub_entries.setter
    def scrub_entries(self, n: int) -> None:
        self.integrity.scrub_entries = n

    @property
    def records_repaired(self) -> int:
        return self.integrity.records_repaired

    def mark_corrupt(self, index: int, reason: str) -> None:
        """One of our records fails verification. We keep the log as it is (its end and last
        term decide votes: shrinking it could let a candidate lacking committed entries win
        ours), say so loudly, leave leadership and stay out of elections until the leader's
        copy restored it (`repaired`)."""
        if not self.integrity.mark(index, reason):
            return  # known already, or below what the leader still holds (see beyond_repair)
        m = self.member
        if m.is_leader:
            self._hand_over(f"corrupt record at index {index}")
        elif m.role == Role.CANDIDATE:
            self.step_down(f"corrupt record at index {index}")

    def _hand_over(self, why: str) -> None:
        """A leader unfit to lead (a corrupt record, a state machine stuck) hands leadership to a
        live, healthy follower that already holds our whole log (it needs nothing from us, the
        bad record included: no election gap); with none, it steps down at once, and at the
        latest when the transfer times out."""
        el = self.elector
        if el.transferring:
            return
        target = next(self._fit_followers(), None)
        if target is None:
            self.step_down(why)
            return
        log.warning("%s/%s: %s; handing leadership to %s (it holds our whole log, up to %d)", self.member.group,
                    self.member.self_id, why, target, self.store.end_index)
        el.begin_transfer(target, None)

    def _fit_followers(self) -> Iterator[str]:
        """Followers that can take leadership at once, needing nothing from us
        (`Progress.fit_to_lead`)."""
        if not self.member.is_leader:
            return
        lease, end = self.elector.leader_lease_ms, self.store.end_index
        for p, pr in self.progress.items():
            if pr.fit_to_lead(self.now, lease, end):
                yield p

    def repaired(self, first: int, last: int, indexes: list[int]) -> None:
        """The leader's REPAIR push covered [first, last]; `indexes` were rewritten."""
        self.integrity.repaired(first, last, indexes, self.now)

    def beyond_repair(self, leader_begin: int) -> None:
        """The leader's retention deleted everything below `leader_begin` (Integrity.beyond_repair)."""
        self.integrity.beyond_repair(leader_begin)

    def want_snapshot(self) -> None:
        """Take a snapshot soon (between batches): a follower needs one past a record of ours
        that is rotten beyond repair."""
        self._snapshot_wanted = True

    def is_beyond_repair(self, index: int) -> bool:
        """A leader told us our record `index` is below what any member still holds."""
        return self.integrity.is_beyond_repair(index)

    def forget_beyond_repair(self) -> None:
        self.integrity.forget_beyond_repair()

    def forget_corrupt_above(self, end: int) -> None:
        """A truncate removed our records after `end`: a corrupt one among them is gone."""
        self.integrity.forget_above(end)

    def store_failed(self, e: StoreError) -> None:
        """A write failed: remember it (for a few election rounds when the store itself does
        not report a failure) and leave leadership, so a member that can write takes over."""
        if e.code not in DISK_FAULTS:
            raise e
        backoff = 5 * self.cfg.max_vote_interval_ms
        if self._store_fault is None:
            log.error("%s/%s: store cannot write (%s); not leading or campaigning for %d ms",
                      self.member.group, self.member.self_id, e, backoff)
        self._store_fault = (e, self.now + backoff)
        if self.member.role != Role.FOLLOWER:
            self.step_down(f"its store cannot write: {e.message}")

    def full(self) -> StoreError | None:
        """Why client appends are refused here for want of space (hard or soft), or None."""
        return self.unwritable() or self.store.pressure_error()

    def _relieve_pressure(self) -> None:
        """A leader whose disk is full (retention can free nothing) refuses client appends; a
        caught-up follower with room can take them, so hand leadership over. When every
        disk is full it stays: replicating to a lagging member is what frees retention."""
        el = self.elector
        if self.store.pressure_error() is None or el.transferring:
            return
        for p in self._fit_followers():
            log.warning("%s/%s: disk full; handing leadership to %s", self.member.group, self.member.self_id, p)
            el.begin_transfer(p, None)
            return

    def _hold_retention(self) -> None:
        self.follow_retention_floor(*self.retention_floor())

    def retention_floor(self) -> tuple[int, str]:
        """The first entry this leader or a live follower still needs, and whose: retention keeps
        it. A follower silent for longer than `retention_hold_ms` no longer holds it (it gets
        an empty snapshot at our log begin, losing what retention deleted everywhere). With a
        state machine a lagging follower holds nothing back at all (compaction keeps a margin;
        behind it the follower installs our snapshot), but one installing a snapshot keeps what
        follows it. Heartbeats carry the floor, so followers keep the same entries and whoever
        leads next can serve them."""
        # fsynced prefixes, not matches: a power loss takes the rest back (ours too)
        floor, holder = self.store.durable_index + 1, f"leader {self.member.self_id}"
        since, hold_ms, plain = self.elector.leader_since, self.cfg.retention_hold_ms, self.applier is None
        for d in self.dispatchers.values():
            pr = d.progress
            if not pr.heard_within(self.now, hold_ms, since):
                continue  # silent too long: it holds nothing back (nor a repair, nor an install)
            held = pr.retention_hold(d.install_hold(), plain, floor)
            if held is not None:
                floor, holder = held
        return floor, holder

    def follow_retention_floor(self, floor: int, holder: str) -> None:
        """Apply a retention floor (ours as leader, the leader's as follower). Our own corrupt
        record does not lower it: the leader's floor already keeps its good copy while we
        report the damage, and a rotten copy the leader no longer holds cannot be repaired
        by anyone — retention dropping it ends the mark (it held the group's retention and
        our candidacy for ever). With a state machine, nothing after our newest snapshot goes:
        a restart rebuilds the state from that snapshot and the log after it."""
        a = self.applier
        if a is not None and (floor < 0 or floor > a.snapshot_index + 1):
            floor, holder = a.snapshot_index + 1, f"the state machine of {self.member.self_id} (snapshot)"
        if a is None:  # a plain log: retention keeps what the producer table has not folded or saved
            t, saved = self.producers, self._producers_saved[0]
            hold = t.folded + 1 if t.empty else min(t.folded, saved) + 1
            if floor < 0 or floor > hold:
                floor, holder = hold, f"the producer table of {self.member.self_id} (folded through {t.folded}, " \
                                      f"saved through {saved})"
        self.store.set_retention_floor(floor if floor >= 0 else None, holder)

    def drain(self) -> list[Action]:
        """Actions to execute now. Pushes are built here, once per batch of inputs,
        so concurrent client appends travel to followers together."""
        try:
            if self._appends:
                self._store_appends()
            if self._pump_needed:
                self._pump_needed = False
                for d in self.dispatchers.values():
                    d.pump()
        except StoreError as e:  # a record that cannot be read for a push (damaged disk)
            if e.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                self._pump_needed = True  # compaction moved the log begin under us: next drain
            else:
                self.store_error(e)
        if self.reads.want_round and self.member.is_leader:
            self.elector.heartbeat_now()  # reads wait for a confirming round: no tick's delay
        self.read_path.wake()
        self.follower_reads.wake()
        self._fold_producers()
        self._feed_applier()
        actions, self.actions = self.actions, []
        return actions

    # --- idempotent producers (core.producers) --------------------------------------------------

    def _fold_producers(self) -> None:
        table, store = self.producers, self.store
        if store.committed_index <= table.folded:
            return
        try:
            if not table.fold(store, store.committed_index):
                self.integrity.active = True  # a long log (a restart): the rest at the next drains
        except CorruptEntryError as e:
            self.mark_corrupt(e.index, e.message)
        except StoreError as e:
            log.warning("%s/%s: folding the producer table: %s", self.member.group, self.member.self_id, e)

    def _save_producers(self) -> None:
        """A plain log snapshots its producer table (an empty log snapshot with the table's
        file) every PRODUCERS_SAVE_ENTRIES folded entries, or PRODUCERS_SAVE_MS after a change,
        or at once when the disk is under pressure: retention deletes nothing after the last
        saved table."""
        t, (saved, at) = self.producers, self._producers_saved
        if self.applier is not None or self._snapshot_pending or t.empty or t.folded <= saved:
            return
        # (under pressure at most once a second: encoding a big table costs the event loop)
        if (t.folded - saved >= PRODUCERS_SAVE_ENTRIES or self.now - at >= PRODUCERS_SAVE_MS
                or (self.now - at >= 1000 and self.store.pressure_error() is not None)):
            self._take_snapshot(self.store.committed_index)
            if self._snapshot_pending:
                self._producers_saving = t.folded

    def _load_producers(self, data: bytes, where: str) -> None:
        try:
            self.producers.load(data)
        except (msgspec.DecodeError, ValueError) as e:
            log.error("%s/%s: the producer table of %s is unreadable (%s): folded from the log instead",
                      self.cfg.group, self.cfg.self_id, where, e)

    def _check_producers_ready(self) -> None:
        """A new leader answers for producers once every entry of earlier terms is committed and
        folded: until its NOOP commits, its log may hold entries it does not know the fate of."""
        start = self.quorum.term_start
        a = self.applier
        restoring = self._producers_restoring or (a is not None and (a.installing or self.restoring))
        if self.store.committed_index < start or self.producers.folded < start - 1 or restoring:
            raise DLedgerError(ResponseCode.LEADER_NOT_READY,
                               f"term {self.member.term}: the producer table is not caught up yet")

    # --- the state machine ---------------------------------------------------------------------

    def _feed_applier(self) -> None:
        """A snapshot (due, or asked for) goes out between batches, before the next one: the
        worker thread runs actions in order, so it sees exactly the state at its index."""
        a = self.applier
        if a is None:
            if self._snapshot_waiters and not self._snapshot_pending:
                self._take_snapshot(self.store.committed_index)  # a plain log: an empty snapshot
            return
        if a.stopped is not None:  # its state is half-changed: a snapshot of it would be wrong
            if self._snapshot_waiters:
                self._answer_snapshot(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {a.stopped}")
            return
        if a.in_flight is None and not a.snapshotting and not a.installing and (
            self._snapshot_waiters or self._snapshot_wanted or a.snapshot_due(self.cfg.snapshot_threshold_entries,
                                                     self.cfg.snapshot_threshold_bytes) or self._snapshot_frees_disk()):
            self._take_snapshot(a.applied_index)
        try:
            batch = a.next_batch(self.store)
        except CorruptEntryError as e:  # applied once it is repaired
            self.mark_corrupt(e.index, e.message)
            return
        except StoreError as e:
            self.store_error(e)
            return
        if batch is not None:
            self.actions.append(Apply(batch))

    def _snapshot_frees_disk(self) -> bool:
        """The disk is full and retention may not delete past our newest snapshot: a new one
        (whatever the thresholds) lets it free the log applied since (the simulator found every
        member full and held back by its state machine, for ever)."""
        a = self.applier
        return (a is not None and a.applied_index > a.snapshot_index and self.store.pressure_error() is not None)

    def _take_snapshot(self, index: int) -> None:
        store = self.store
        if index < store.begin_index - 1:
            self._answer_snapshot(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                                  f"nothing to snapshot: index {index} is before the log begin {store.begin_index}")
            return
        try:
            term, chain = store.term_at(index), store.chain_at(index)
            next_pos = self._pos_of(index + 1)
        except StoreError as e:
            self._answer_snapshot(e.code, f"cannot snapshot at {index}: {e.message}")
            return
        self._snapshot_pending = True
        self._snapshot_wanted = False
        if self.applier is not None:
            self.applier.snapshotting = True
        sending = tuple(d.sender.meta.last_index for d in self.dispatchers.values() if d.sender.meta is not None)
        # the table is folded through the commit index, at or past `index`: entries between are
        # committed, so every log that continues the snapshot holds them as folded
        self.actions.append(TakeSnapshot(index, term, chain, next_pos, sending, self.producers.encode()
                                         if not self.producers.empty else b""))

    def _snapshot_taken(self, index: int, error: str, now_ms: int, meta: SnapshotMeta | None = None) -> None:
        """The worker wrote the snapshot of `index` (`meta`; or failed: `error`)."""
        self.now = now_ms
        if meta is not None:
            self.note_snapshot(meta)
        self._snapshot_pending = False
        a = self.applier
        if error:
            log.error("%s/%s: snapshot at %d failed: %s", self.member.group, self.member.self_id, index, error)
            if a is not None:
                a.snapshotting = False
            self._producers_saving = -1
            self._answer_snapshot(ResponseCode.DISK_ERROR, f"snapshot at {index} failed: {error}")
            return
        if self._producers_saving >= 0:
            self._producers_saved, self._producers_saving = (self._producers_saving, now_ms), -1
        if a is not None:
            a.snapshot_taken(index)
            # the log the snapshot covers goes, but for a margin a slow follower may still need
            # (behind it, it installs our snapshot)
            self.store.set_compaction_point(index - self.cfg.snapshot_margin_entries)
        self._answer_snapshot(ResponseCode.SUCCESS, "", index)

    @property
    def snapshot_index(self) -> int:
        """The last index of this member's newest snapshot (-1: none)."""
        if self.applier is not None:
            return self.applier.snapshot_index
        return self.snapshot_meta.last_index if self.snapshot_meta is not None else -1

    def note_snapshot(self, meta: SnapshotMeta) -> None:
        """A snapshot now on our disk (taken or installed): the newest is what we send."""
        if self.snapshot_meta is None or meta.last_index >= self.snapshot_meta.last_index:
            self.snapshot_meta = meta

    # --- InstallSnapshot (core.install_snapshot) -------------------------------------------------

    def snapshot_to_send(self) -> SnapshotMeta | None:
        """What a follower needing entries before our log begin gets: our newest snapshot (it
        reaches our log: compaction never passes it); a plain log's is empty, at begin - 1."""
        store = self.store
        if self.applier is None:
            # our own snapshot with the producer table, when the log continues it (retention keeps
            # the log after it); else an empty one at our log begin
            meta = self.snapshot_meta
            if (meta is not None and PRODUCERS_FILE in meta.files and meta.next_pos >= 0
                    and store.begin_index - 1 <= meta.last_index <= store.end_index):
                return meta
            b = store.begin_index
            return SnapshotMeta(b - 1, store.begin_term, store.begin_chain_crc, self.cfg.peers,
                                next_pos=self._pos_of(b))
        meta = self.snapshot_meta
        if meta is None or meta.last_index < store.begin_index - 1 or meta.next_pos < 0:
            log.error("%s/%s: no snapshot reaches our log begin %d (newest: %s); a follower that needs what "
                      "came before cannot catch up", self.member.group, self.member.self_id, store.begin_index,
                      meta.last_index if meta is not None else "none")
            return None
        return meta

    def _pos_of(self, index: int) -> int:
        """Where the record of `index` starts (or would: the log's next position)."""
        store = self.store
        return store.get(index).pos if index <= store.end_index else store.pos_of_next()

    def read_chunk(self, peer: str, meta: SnapshotMeta, offset: int, max_bytes: int, ctx: ChunkCtx) -> None:
        self.actions.append(ReadChunk(peer, meta, offset, max_bytes, ctx))

    def _chunk_read(self, peer: str, ctx: ChunkCtx, data: bytes, crc: int, error: str, now_ms: int) -> None:
        self.now = now_ms
        d = self.dispatchers.get(peer)
        if d is not None and self.member.is_leader:
            d.on_chunk_read(ctx, data, crc, error)

    def install_chunk(self, token: Any, meta: SnapshotMeta, offset: int, data: bytes | memoryview, crc: int) -> None:
        self.actions.append(InstallChunk(token, meta, offset, data, crc))

    def _chunk_installed(self, token: Any, meta: SnapshotMeta, next_offset: int, done: bool, error: str,
                           now_ms: int) -> None:
        self.now = now_ms
        self.receiver.on_chunk_installed(token, meta, next_offset, done, error)

    def drop_install(self) -> None:
        self.actions.append(DropInstall())

    def reset_log_to(self, meta: SnapshotMeta) -> None:
        """Our log is replaced by installed snapshot `meta`: it begins after it, empty; the state
        machine is restored from it before anything more is applied."""
        L = meta.last_index
        self.store.reset(L + 1, meta.last_term, meta.chain_crc, meta.next_pos)
        self.handler.after_reset(L)
        self.integrity.scrub_next = self.store.begin_index
        if self.applier is not None:
            self.restore_from(meta)
        elif PRODUCERS_FILE in meta.files:  # a plain log's snapshot carries only the producer table
            self._producers_restoring = True
            self.actions.append(RestoreSnapshot(meta))
        else:
            self.producers.skip_to(L)  # an empty snapshot: the producers of what it skipped stay unknown

    def restore_from(self, meta: SnapshotMeta) -> None:
        """The state machine's state becomes installed snapshot `meta`'s, nothing applied before."""
        assert self.applier is not None
        self.applier.installing = True
        self.restoring = True
        self.actions.append(RestoreSnapshot(meta))

    def apply_needs(self) -> int:
        """The lowest snapshot index that would unblock our state machine when it needs an
        entry our log cannot give (deleted, or rotten beyond repair); -1 when it is not stuck
        (or a restore is pending: that fixes it; or it stopped: it applies nothing anyway).
        After a snapshot through that index it applies on from our own log."""
        a = self.applier
        if a is None or a.installing or a.stopped is not None:
            return -1
        readable_from = self.integrity.readable_from
        return readable_from - 1 if a.handed_index + 1 < readable_from else -1

    def _restored(self, meta: SnapshotMeta, error: str, now_ms: int, producers: bytes | None = None) -> None:
        """The worker restored the state machine from installed snapshot `meta` (or failed);
        `producers`: the snapshot's PRODUCERS_FILE."""
        self.now = now_ms
        a = self.applier
        if a is None:  # a plain log's: the producer table only
            self._producers_restoring = False
            if producers and not error:
                self._load_producers(producers, f"installed snapshot {meta.last_index}")
            else:
                self.producers.skip_to(meta.last_index)
            return
        self.restoring = False
        if error:
            a.installing = False
            self._stop_applier(f"restoring installed snapshot {meta.last_index}: {error}")
            return
        if producers:
            self._load_producers(producers, f"installed snapshot {meta.last_index}")
        else:  # a snapshot without the file: no producer was known at its index
            self.producers.clear(meta.last_index)
        msg = (f"committed; its result is lost: {self.member.self_id}'s state was replaced by snapshot "
               f"{meta.last_index}")
        for p in a.installed(meta.last_index):
            self.reply(p.token, RequestCode.APPEND, AppendResponse(int(ResponseCode.INTERNAL_ERROR), message=msg))
        self._run_due_queries()

    def _align_with_snapshot(self, meta: SnapshotMeta) -> None:
        """At start: a state machine restored from `meta` needs a log that holds its last entry
        (or begins after it). A crash between installing a snapshot and resetting the log, or
        a power loss that took the log's unsynced tail, leaves one that does not: it is reset to
        begin after the snapshot (every entry it drops is covered by it, or was never committed).
        Not needed for safety (the leader would send the log, or the snapshot, again), only to
        spare a second install."""
        store = self.store
        if meta.next_pos < 0 or meta.last_index <= store.committed_index or \
                holds(store, meta.last_index, meta.last_term, meta.chain_crc):
            return  # (a committed entry there is the snapshot's, even a rotten copy: repaired as usual)
        log.warning("%s/%s: the log (%d..%d) does not hold the last entry %d of our newest snapshot; "
                    "it begins after the snapshot now", self.cfg.group, self.cfg.self_id,
                    store.begin_index, store.end_index, meta.last_index)
        try:
            store.reset(meta.last_index + 1, meta.last_term, meta.chain_crc, meta.next_pos)
        except StoreError as e:  # only saves a second install: the leader re-sends what the log lacks
            log.warning("%s/%s: could not reset the log to the snapshot: %s", self.cfg.group, self.cfg.self_id, e)

    def _answer_snapshot(self, code: ResponseCode, message: str, index: int = -1) -> None:
        waiters, self._snapshot_waiters = self._snapshot_waiters, []
        for token in waiters:
            self.reply(token, RequestCode.SNAPSHOT, SnapshotResponse(int(code), index, message))

    def _applied(self, results: list[bytes], now_ms: int) -> None:
        """The worker applied the batch in flight: answer its proposers and due queries."""
        self.now = now_ms
        a = self.applier
        assert a is not None
        for p in a.applied(results):
            self.reply(p.token, RequestCode.APPEND,
                       AppendResponse(200, self.member.self_id, p.term, p.first, p.positions, results=p.results))
        self._run_due_queries()

    def _apply_failed(self, reason: str, now_ms: int) -> None:
        """The state machine raised: its state may be half-changed, so nothing more is applied
        here (a restart restores the last snapshot and applies the log again)."""
        self.now = now_ms
        a = self.applier
        assert a is not None
        self._stop_applier(f"failed applying entries "
                           f"{f'{a.in_flight.first}..{a.in_flight.last}' if a.in_flight else '?'}: {reason}")

    def _stop_applier(self, reason: str) -> None:
        a = self.applier
        assert a is not None
        log.error("%s/%s: state machine %s; nothing more is applied until a restart", self.member.group,
                  self.member.self_id, reason)
        a.fail(reason)
        msg = f"state machine failed on {self.member.self_id}: {reason}"
        for p in a.drop_proposals():
            self.reply(p.token, RequestCode.APPEND, AppendResponse(int(ResponseCode.INTERNAL_ERROR), message=msg))
        for q in a.drop_queries():
            self.reply(q.token, RequestCode.QUERY, QueryResponse(int(ResponseCode.INTERNAL_ERROR), message=msg))

    def _run_due_queries(self) -> None:
        a = self.applier
        assert a is not None
        for q in a.due_queries():
            self.actions.append(RunQuery(q.token, q.request, a.applied_index))

    def _handle_query(self, msg: QueryRequest, token: Any) -> None:
        a = self.applier
        if a is None:
            raise DLedgerError(ResponseCode.UNSUPPORTED, f"group {self.member.group} has no state machine")
        if a.stopped is not None:
            raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {a.stopped}")

        def run_at(read_index: int) -> None:  # once applied up to the read index
            if a.stopped is not None:
                raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {a.stopped}")
            if not a.wait_query(read_index, token, msg.request, self.now + 2 * self.cfg.max_wait_ack_ms):
                raise DLedgerError(ResponseCode.LEADER_PENDING_FULL, "too many queries wait for the state machine")
            self._run_due_queries()

        if msg.consistency == "local":
            run_at(self.store.committed_index)  # our own commit index: may trail the leader's
        else:
            self.read_path.when_confirmed(RequestCode.QUERY, msg.consistency, token, run_at, msg.follower_read)

    def _handle_snapshot(self, token: Any) -> None:
        a = self.applier
        if a is not None and a.stopped is not None:
            raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {a.stopped}")
        if (a.applied_index if a is not None else self.store.committed_index) < 0:
            self.reply(token, RequestCode.SNAPSHOT, SnapshotResponse(200, -1, "nothing committed yet"))
            return
        self._snapshot_waiters.append(token)

    # --- outputs (used by the components) --------------------------------------

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Context,
             data: bytes | memoryview = b"", timeout_ms: int | None = None) -> None:
        self.actions.append(Send(peer, code, msg, data, ctx, timeout_ms or self.cfg.max_push_timeout_ms))

    def reply(self, token: Any, code: int, msg: msgspec.Struct, data: bytes = b"") -> None:
        self.actions.append(Reply(token, code, msg, data))

    def request_pump(self) -> None:
        self._pump_needed = True

    # --- role changes (called by the elector; reset in one place: _change_role) -----------

    def become_leader(self) -> bool:
        """All or nothing: the NOOP is stored first; if the store cannot take it, this member
        does not lead (False) and stays out of elections while its store is failed."""
        m = self.member
        if self.corrupt is not None:  # found corrupt during the round
            self.step_down(f"corrupt record at index {self.corrupt[0]}")
            return False
        # A NOOP of the new term lets entries of earlier terms commit (Raft §5.4.2).
        try:
            res = self.store.append_as_leader([b""], m.term, magic=MAGIC_NOOP)
        except StoreError as e:
            self.store_failed(e)
            return False
        self._change_role(Role.LEADER, "won the election", term_start=res.first_index)
        if self.cfg.flush == "async" or self.store.durable_index >= res.last_index:
            self.quorum.ack_self(self.store.end_index)
        else:
            self.store.request_flush()
        log.info("%s/%s: leader of term %d (end %d)", m.group, m.self_id, m.term, self.store.end_index)
        self.request_pump()
        return True

    def step_down(self, reason: str) -> None:
        """Leave leadership (or candidacy); waiting appends learn the term changed."""
        self._change_role(Role.FOLLOWER, reason)

    def become_candidate(self) -> None:
        """Start an election round: a leader steps down first; no leader is known meanwhile."""
        if self.member.is_leader:
            self.step_down("starting an election")
        self._change_role(Role.CANDIDATE, "starting an election")

    def follow(self, leader_id: str) -> None:
        """A follower (that knew no leader) learnt its leader of this term."""
        self._change_role(Role.FOLLOWER, f"follows {leader_id}", leader_id=leader_id)

    def _change_role(self, role: Role, reason: str, term_start: int = -1, leader_id: str = "") -> None:
        """The one place state tied to a role is reset (h11's one-owner rule). Every change
        goes through here, in this order:
        - to LEADER (its NOOP stored at `term_start`): the producers' overlay and waiting reads
          of an earlier leadership go, the quorum counts from the NOOP, every follower's
          `Progress` starts over (`begin_term`) and gets a new dispatcher, the elector's
          heartbeat and check-quorum clocks start;
        - to CANDIDATE (a follower's, or a deposed leader's, round): no leader is known;
        - to FOLLOWER of a leader now known (`leader_id`): what the handler matched of the
          previous one proves nothing, a record the previous leader could not repair may be
          repairable by this one;
        - to FOLLOWER (step down, from any role): dispatchers stop, a transfer in flight waits
          to see its target lead; a leader's waiting appends, reads and long polls are answered
          (the client asks the next leader); the handler forgets the old leader."""
        m = self.member
        if role == Role.LEADER:
            self.producers.drop_overlay()
            m.role = Role.LEADER
            m.leader_id = m.self_id
            self.reads.reset(ResponseCode.NOT_LEADER, "leadership changed")
            self.quorum.reset(term_start)
            for pr in self.progress.values():
                pr.begin_term()
            self.dispatchers = {p: EntryDispatcher(self, p) for p in m.others}
            self.elector.on_leader()
            return
        if role == Role.CANDIDATE:
            m.role = Role.CANDIDATE
            m.leader_id = None
            return
        if leader_id:
            m.leader_id = leader_id
            self.handler.on_leader_change()
            self.forget_beyond_repair()
            return
        was_leader = m.is_leader
        m.role = Role.FOLLOWER
        if m.leader_id == m.self_id:
            m.leader_id = None
        self.dispatchers = {}
        self.elector.on_step_down()
        if was_leader:
            log.info("%s/%s: steps down in term %d: %s", m.group, m.self_id, m.term, reason)
            self.quorum.fail_all(ResponseCode.TERM_CHANGED, f"leader stepped down: {reason}")
            self.producers.drop_overlay()
            # reads change nothing: the client asks the next leader
            self.reads.reset(ResponseCode.NOT_LEADER, f"leader stepped down before the read was confirmed: {reason}")
            for r in self.read_path.long_polls.take_leader_reads():
                self.reply(r.token, RequestCode.READ,
                           _error_for(RequestCode.READ, ResponseCode.NOT_LEADER, self,
                                      f"leader stepped down: {reason}"))
        self.handler.on_leader_change()

    # --- request dispatch -----------------------------------------------------

    def _dispatch(self, code: int, msg: Msg, data: memoryview | bytes | bytearray, token: Any,
                  principal: str = "") -> None:
        if code == RequestCode.PUSH:
            assert isinstance(msg, PushRequest)
            if msg.type != PushType.COMMIT:
                self.integrity.active = True
            self.handler.handle_push(msg, data, token)
        elif code == RequestCode.HEART_BEAT:
            assert isinstance(msg, HeartBeatRequest)
            self.elector.handle_heartbeat(msg, token)
        elif code == RequestCode.VOTE:
            assert isinstance(msg, VoteRequest)
            self.elector.handle_vote(msg, token)
        elif code == RequestCode.APPEND:
            assert isinstance(msg, AppendRequest)
            self._handle_append(msg, token, principal)
        elif code == RequestCode.GET:
            assert isinstance(msg, GetRequest)
            self.read_path.handle_read(code, msg.index, 1, 1 << 30, False, msg.local, msg.consistency, token,
                              addressed=msg.follower_read)
        elif code == RequestCode.READ:
            assert isinstance(msg, ReadRequest)
            self.read_path.handle_read(code, msg.from_index, msg.max_entries, msg.max_bytes, msg.only_normal, msg.local,
                              msg.consistency, token, msg.wait_ms, msg.follower_read, msg.bodies)
        elif code == RequestCode.READ_INDEX:
            assert isinstance(msg, ReadIndexRequest)
            self.read_path.when_confirmed(code, msg.consistency, token,
                                 lambda ri: self.reply(token, code, ReadIndexResponse(200, self.member.self_id, ri)))
        elif code == RequestCode.METADATA:
            assert isinstance(msg, MetadataRequest)
            if msg.consistency:  # a confirmed leader's view
                self.read_path.when_confirmed(code, msg.consistency, token,
                                              lambda _: self.reply(token, code, self.metadata()))
            else:
                self.reply(token, code, self.metadata())
        elif code == RequestCode.LEADERSHIP_TRANSFER:
            assert isinstance(msg, LeadershipTransferRequest)
            self.elector.handle_transfer(msg, token)
        elif code == RequestCode.QUERY:
            assert isinstance(msg, QueryRequest)
            self._handle_query(msg, token)
        elif code == RequestCode.SNAPSHOT:
            self._handle_snapshot(token)
        elif code == RequestCode.INSTALL_SNAPSHOT:
            assert isinstance(msg, InstallSnapshotRequest)
            self.integrity.active = True
            self.receiver.handle(msg, data, token)
        else:
            raise DLedgerError(ResponseCode.UNSUPPORTED, f"request code {code}")

    def _check_addressing(self, code: int, msg: Msg) -> ResponseCode | None:
        """Group, receiver and sender must be ours. Member messages (votes, heartbeats, pushes,
        a leader's hand-over) must name a sender that is another member: one with an empty
        or our own id was accepted (a leader ""), and nothing else could be checked."""
        m = self.member
        if msg.group != m.group:
            return ResponseCode.UNKNOWN_GROUP
        if msg.remote_id and msg.remote_id != m.self_id:
            return ResponseCode.UNEXPECTED_MEMBER
        if msg.leader_id and msg.leader_id not in m.peer_ids:
            return ResponseCode.UNKNOWN_MEMBER
        if is_member_message(code, msg) and (not msg.leader_id or msg.leader_id == m.self_id):
            return ResponseCode.UNEXPECTED_MEMBER
        # a hand-over comes from the leader itself: a member (even one whose certificate is
        # checked) must not hand over in another member's name
        if isinstance(msg, LeadershipTransferRequest) and msg.transfer_id and msg.transfer_id != msg.leader_id:
            return ResponseCode.UNEXPECTED_MEMBER
        return None

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
        self._appends.append(_Append(token, msg.bodies, msg.producer, msg.sequence, msg.epoch, principal))
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

    def _fail_write(self, batch: list[_Append], e: DLedgerError) -> None:
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

    def _store_idempotent(self, batch: list[_Append]) -> None:
        """A write with idempotent appends (core.producers): what the log holds already is
        answered from the producer table; the rest is stored after a session marker naming
        each entry's producer and sequence, in order."""
        table, term = self.producers, self.member.term
        first = self.store.end_index + 2  # the marker takes end + 1
        ts = self.now + self.wall_offset_ms
        views: dict[str, Producer] = {}  # producers as they will be after this write
        runs: list[Run] = []
        bodies: list[bytes] = []
        taken: list[tuple[_Append, Decision, int, int]] = []  # (append, decision, first new index, new count)
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

    def _decide(self, a: _Append, view: Producer | None, creating: dict[str, int], first: int,
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

    def _check_duplicates(self, a: _Append, d: Decision, first: int, planned: list[bytes]) -> None:
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

    def _write_marked(self, marker: bytes, bodies: list[bytes], batch: list[_Append]) -> AppendedBatch | None:
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

    def role_view(self) -> RoleView:
        """Role, term, leader, corrupt record and applied index (core.status): cheap, for readers
        that look after every event."""
        m, a, c = self.member, self.applier, self.integrity.corrupt
        return RoleView(m.role, m.term, m.leader_id or "", c[0] if c is not None else -1,
                        a.applied_index if a is not None else -1, a is not None)

    def status(self) -> NodeStatus:
        """A frozen view of this member (core.status): what metrics, METADATA, health, the
        controller and the simulator read."""
        m, s, a, r = self.member, self.store, self.applier, self.receiver
        install_index, install_bytes, install_total = r.progress()
        unwritable, full = self.unwritable(), self.full()
        followers: tuple[FollowerStatus, ...] = ()
        if m.is_leader:
            followers = tuple(FollowerStatus(p, d.progress.match_index, d.progress.needs_snapshot,
                                             d.progress.repair_index) for p, d in self.dispatchers.items())
        c = self.corrupt
        return NodeStatus(
            m.group, m.self_id, m.role, m.term, m.leader_id or "", s.begin_index, s.end_index, s.end_term,
            s.committed_index, s.durable_index, self.quorum.pending,
            _why(unwritable), _why(full),
            s.retention_held_by, c[0] if c is not None else -1, c[1] if c is not None else "",
            a.applied_index if a is not None else -1, self.snapshot_index,
            (a.stopped or "") if a is not None else "", a is not None, self.reads.lease_valid(),
            self.handler.leader_committed, self.cfg.security_mode, self.elector.elections, m.leader_changes,
            self.integrity.corruptions_found, self.integrity.records_repaired, r.installs, r.bytes, r.meta is not None,
            install_index, install_bytes, install_total, self.installs_sent, self.install_bytes_sent,
            self.read_path.entries_read, self.read_path.read_body_bytes, followers)

    def metadata(self) -> MetadataResponse:
        st = self.status()
        problems = [st.full] if st.full else []
        if st.corrupt_index >= 0:
            problems.append(f"corrupt record at index {st.corrupt_index} ({st.corrupt_reason}); "
                            "not leading until it is repaired from the leader")
        return MetadataResponse(
            200, st.group, st.self_id, st.role.name.lower(), st.leader_id, st.term, self.cfg.peers,
            st.begin_index, st.end_index, st.end_term, st.committed_index,
            store_error="; ".join(problems), retention_held_by=st.retention_held_by,
            applied_index=st.applied_index, snapshot_index=st.snapshot_index,
            state_machine_error=st.state_machine_error,
            install_index=st.install_index, install_bytes=st.install_bytes, install_total=st.install_total,
            security=st.security_mode,
        )


def _why(e: DLedgerError | None) -> str:
    return "" if e is None else (e.message or ResponseCode(e.code).name)


def _add_run(runs: list[Run], run: Run) -> None:
    """Append `run`, merged into the last one when it continues it (plain appends, mostly)."""
    last = runs[-1] if runs else None
    if last is not None and last.producer == run.producer and (not run.producer or (
            last.epoch == run.epoch and last.first_seq + last.count == run.first_seq)):
        runs[-1] = Run(run.producer, last.first_seq, last.count + run.count, run.epoch, run.owner)
    else:
        runs.append(run)


def _error_for(code: int, err: ResponseCode, node: Node, message: str = "") -> msgspec.Struct:
    """An error answer of the right response type for request `code`."""
    m = node.member
    leader = m.leader_id or ""
    if code == RequestCode.APPEND:
        return AppendResponse(int(err), leader, m.term, message=message)
    if code in (RequestCode.GET, RequestCode.READ):
        return EntriesResponse(int(err), leader, message=message, committed_index=node.store.committed_index)
    if code == RequestCode.METADATA:
        return MetadataResponse(int(err), message=message)
    if code == RequestCode.QUERY:
        return QueryResponse(int(err), leader, message=message)
    if code == RequestCode.SNAPSHOT:
        return SnapshotResponse(int(err), message=message)
    if code == RequestCode.READ_INDEX:
        return ReadIndexResponse(int(err), leader, message=message)
    if code == RequestCode.INSTALL_SNAPSHOT:
        return InstallSnapshotResponse(int(err), m.term, end_index=node.store.end_index, reason=message[:512])
    from dledger.core.messages import HeartBeatResponse, PushResponse, VoteResponse

    if code == RequestCode.PUSH:
        return PushResponse(int(err), m.term, node.store.end_index, corrupt_index=node.corrupt_index,
                            reason=message[:512])
    if code == RequestCode.HEART_BEAT:
        return HeartBeatResponse(int(err), m.term, leader)
    if code == RequestCode.VOTE:
        return VoteResponse(m.term, 0)
    return SimpleResponse(int(err), m.term, leader, message)
