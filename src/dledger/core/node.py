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

Its parts: the client append path (core.appends.AppendPath), snapshot orchestration
(core.snapshots.SnapshotPath), reads (core.reads), integrity (core.integrity), the actions
(core.actions), and the role objects, each built from a narrow context. node.py keeps the
inputs and their dispatch, ticks, store faults, role changes, producers and the applier.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any, TypeGuard

import msgspec

from dledger.codes import DISK_FAULTS, DLedgerError, PushType, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.actions import (
    Action,
    Apply,
    DropInstall,
    InstallChunk,
    ReadChunk,
    Reply,
    RestoreSnapshot,
    RunQuery,
    Send,
    TakeSnapshot,
)
from dledger.core.appends import AppendPath, PendingAppend
from dledger.core.changes import MembershipPath, recover_configs
from dledger.core.config_probe import ConfigProbe
from dledger.core.contexts import (
    Answered,
    Applied,
    ApplyFailed,
    ChunkInstalled,
    ChunkRead,
    Completion,
    Context,
    Durable,
    HeartbeatCtx,
    InstallCtx,
    MembersCtx,
    PushCtx,
    ReadIndexCtx,
    Restored,
    SnapshotTaken,
    TransferCtx,
    VoteCtx,
)
from dledger.core.dispatcher import EntryDispatcher
from dledger.core.effects import BeyondRepair, Effect, ForgetCorruptAbove, MarkCorrupt, Pump, PushReply, Repaired
from dledger.core.elector import LeaderElector
from dledger.core.follower_read import FollowerReads
from dledger.core.handler import EntryHandler
from dledger.core.install_snapshot import SnapshotReceiver
from dledger.core.integrity import Integrity
from dledger.core.leader_wait import LeaderWaits
from dledger.core.member_state import MemberState
from dledger.core.messages import (
    AppendRequest,
    AppendResponse,
    ChangeMembersRequest,
    ChangeMembersResponse,
    EntriesResponse,
    GetRequest,
    HeartBeatRequest,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    MembersRequest,
    MembersResponse,
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
    SnapshotRequest,
    SnapshotResponse,
    VoteRequest,
    VoteResponse,
    is_member_message,
)
from dledger.core.producers import CreationLimiter, ProducerTable
from dledger.core.progress import Progress
from dledger.core.quorum import QuorumAckChecker
from dledger.core.read_index import ReadIndex
from dledger.core.reads import ReadPath
from dledger.core.snapshots import SnapshotPath
from dledger.core.status import FollowerStatus, NodeStatus, RoleView
from dledger.entry import MAGIC_NOOP
from dledger.membership import Membership
from dledger.statemachine.applier import Applier
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.base import CorruptEntryError, LedgerStore, StoreError

log = logging.getLogger(__name__)

PRODUCERS_SAVE_ENTRIES = 10_000  # a plain log's producer table is saved after this many entries folded,
PRODUCERS_SAVE_MS = 30_000  # or this long after it changed
# clients' requests a removed member answers NOT_A_MEMBER (the client asks the group's members)
_CLIENT_CODES = frozenset((RequestCode.APPEND, RequestCode.GET, RequestCode.READ, RequestCode.QUERY,
                           RequestCode.MEMBERS, RequestCode.CHANGE_MEMBERS, RequestCode.LEADERSHIP_TRANSFER))


class Node(AppendPath, SnapshotPath, MembershipPath):
    def __init__(self, cfg: DLedgerConfig, store: LedgerStore, now_ms: int, rng: random.Random | None = None,
                 applier: Applier | None = None, snapshot: SnapshotMeta | None = None,
                 producers: bytes | None = None, membership: Membership | None = None) -> None:
        """`snapshot`: this member's newest snapshot (restored into the applier's state machine;
        a plain log's is empty); `producers`: its PRODUCERS_FILE (else the table is folded
        from the log's begin); `membership`: the configuration to start from when neither the
        snapshot nor the log holds one (a member joining a changed group: the group's answer to
        MEMBERS), else the command line's peers (a group that never changed)."""
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
        self._compact_waiters: list[tuple[Any, int]] = []  # `dledger compact` (a plain log): token, through
        self._snapshot_wanted = False  # a follower needs a snapshot newer than ours (see want_snapshot)
        self._snapshot_pending = False  # a TakeSnapshot was emitted and not reported yet
        self._snapshot_config: tuple[int, Membership] = (-1, Membership({}))  # what that TakeSnapshot asked for
        self.rng = rng or random.Random()
        self.now = now_ms
        # the configurations of our log (core.configs): the newest in force, committed or not
        self.configs = recover_configs(cfg, store, snapshot, membership)
        self.member = MemberState(cfg.group, cfg.self_id, self.configs.current, store)
        # configurations our log does not hold yet, as known members tell; strict where member
        # identities are verified (TLS certificates name them)
        self.probe = ConfigProbe(self, bool(cfg.tls_ca), lambda: self.elector.leader_alive())
        self.actions: list[Action] = []
        # what this member, as leader, knows of each follower (core.progress): one object each,
        # shared by the dispatchers, the elector and the quorum; kept in step with the
        # configuration (_sync_members)
        self.progress: dict[str, Progress] = {p: Progress(p) for p in self.member.others}
        self._synced = (-1, -2)  # (configs.version, committed configuration index) last applied
        self._left_in_term = -1  # the term in which a removed leader began handing over
        self.quorum = QuorumAckChecker(self.member, store, self._complete_append, self.progress, cfg.flush == "sync")
        self.leader_waits = LeaderWaits()  # METADATA waiting until we lead (core.leader_wait)
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
        self._appends: list[PendingAppend] = []  # client appends taken since the last drain
        # a write that failed although the store did not report itself failed: no campaign until then
        self._store_fault: tuple[StoreError, int] | None = None
        # our own records that fail verification, and the scrub (core.integrity)
        self.integrity = Integrity(store, cfg.group, cfg.self_id, now_ms)
        # until a leader says what its followers need, retention deletes nothing (any member may
        # lead next, and a follower needing a deleted prefix could never catch up)
        store.set_retention_floor(store.begin_index, "a follower (no leader known yet)")
        if store.recovered_corrupt is not None:
            self.mark_corrupt(*store.recovered_corrupt)
        self._sync_members()

    # --- inputs ---------------------------------------------------------------

    def handle(self, code: int, msg: Msg, data: memoryview | bytes | bytearray, token: Any, now_ms: int,
               principal: str = "") -> None:
        """A request from a peer or a client; its reply is emitted now or later. `principal`:
        who sent it (a certificate's or token's name, "" anonymous): an idempotent producer
        belongs to the principal that created it."""
        self.now = now_ms
        err = self._check_addressing(code, msg)
        if err is None and code in _CLIENT_CODES and self.not_a_member and \
                not (isinstance(msg, LeadershipTransferRequest) and msg.transfer_id):
            err = ResponseCode.NOT_A_MEMBER  # removed: the client asks the group's members
            if code == RequestCode.MEMBERS:  # ... which it names: where the group went without us
                view = self.probe.view if self.probe.removed and self.probe.view is not None else self.members_view()
                self.reply(token, code, msgspec.structs.replace(
                    view, code=int(err), message=f"{self.member.self_id} is not a member of the group"))
                return
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
        # class patterns without captures: an isinstance check each (positional captures cost
        # a __match_args__ lookup per field, on the path of every answer to a push)
        match c:
            case Answered():
                self._answered(c.ctx, c.resp, now_ms)
            case Durable():
                self._durable(c.index, now_ms)
            case ChunkRead():
                self._chunk_read(c.peer, c.ctx, c.data, c.crc, c.error, now_ms)
            case ChunkInstalled():
                self._chunk_installed(c.token, c.meta, c.next_offset, c.done, c.error, now_ms)
            case Applied():
                self._applied(c.results, now_ms)
            case ApplyFailed():
                self._apply_failed(c.reason, now_ms)
            case SnapshotTaken():
                self._snapshot_taken(c.index, c.error, now_ms, c.meta)
            case Restored():
                self._restored(c.meta, c.error, now_ms, c.producers)

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
                    try:
                        d.on_response(ctx, resp)
                    finally:
                        self._apply_effects(d.take_effects())
            case HeartbeatCtx():
                self.elector.on_heartbeat_response(ctx, resp)
            case VoteCtx():
                if isinstance(resp, VoteResponse) and resp.code == ResponseCode.UNKNOWN_MEMBER:
                    self.probe.ask()  # a voter that knows no such member: were we removed?
                self.elector.on_vote_response(ctx, resp)
            case TransferCtx():
                self.elector.on_transfer_response(ctx, resp)
            case MembersCtx():
                if self.probe.on_answer(ctx, resp):
                    self._sync_members()
            case ReadIndexCtx():
                self.follower_reads.on_response(ctx, resp if isinstance(resp, ReadIndexResponse) else None)
            case InstallCtx():
                d = self.dispatchers.get(ctx.peer)
                if d is not None:
                    try:
                        d.on_install_response(ctx, resp if isinstance(resp, InstallSnapshotResponse) else None)
                    finally:
                        self._apply_effects(d.take_effects())

    def tick(self, now_ms: int) -> None:
        self.now = now_ms
        try:
            if self.member.is_leader and (err := self.unwritable()) is not None:
                self.step_down(f"its store cannot write: {err.message}")
            self.elector.tick()
            if len(self.leader_waits):
                self._answer_leader_waits(self.leader_waits.expired(now_ms))
            self.probe.silence(self.elector.leader_alive())
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
                    try:
                        d.tick()
                    finally:
                        self._apply_effects(d.take_effects())
                self._hold_retention()
                if self.corrupt is None:
                    self._relieve_pressure()
            try:
                self.handler.tick()
            finally:
                self._apply_effects(self.handler.take_effects())
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
        self._apply_effects(self.handler.take_effects())

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

    def _new_dispatcher(self, peer: str) -> EntryDispatcher:
        return EntryDispatcher(self, peer)

    def _fit_followers(self) -> Iterator[str]:
        """Followers that can take leadership at once, needing nothing from us
        (`Progress.fit_to_lead`)."""
        if not self.member.is_leader:
            return
        lease, end = self.elector.leader_lease_ms, self.store.end_index
        for p in self.member.other_voters:  # leadership goes to voters only
            pr = self.progress.get(p)
            if pr is not None and pr.fit_to_lead(self.now, lease, end):
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
            cidx = self._config_unsaved()  # the only copy of the configuration until a snapshot holds it
            if 0 <= cidx < floor:
                floor, holder = cidx, f"the configuration entry {cidx} of {self.member.self_id} (no snapshot yet)"
        self.store.set_retention_floor(floor if floor >= 0 else None, holder)

    def drain(self) -> list[Action]:
        """Actions to execute now. Pushes are built here, once per batch of inputs,
        so concurrent client appends travel to followers together."""
        self._take_dispatcher_effects()
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
        self._sync_members()
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
        if self.applier is not None or self._snapshot_pending or self._producers_restoring:
            return
        index = self._plain_snapshot_index()
        cidx = self._config_unsaved()
        if cidx >= 0:  # a committed configuration only the log holds
            if index >= cidx:  # (else once the table is folded past it)
                self._take_snapshot(index)
                if self._snapshot_pending and not t.empty:
                    self._producers_saving = t.folded
            return
        if t.empty or t.folded <= saved:
            return
        # (under pressure at most once a second: encoding a big table costs the event loop)
        if (t.folded - saved >= PRODUCERS_SAVE_ENTRIES or self.now - at >= PRODUCERS_SAVE_MS
                or (self.now - at >= 1000 and self.store.pressure_error() is not None)):
            self._take_snapshot(index)
            if self._snapshot_pending:
                self._producers_saving = t.folded

    def _plain_snapshot_index(self) -> int:
        """Where a plain log's snapshot goes: never past the entry its producer table is folded
        through (the table folds a long log over several drains). A snapshot labelled later
        would let a follower install it, begin its log after the label and never fold the
        markers between: a retry of an append stored there would be stored again."""
        return min(self.store.committed_index, self.producers.folded)

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
            # (not while an installed table is read: the snapshot would carry the one it replaces)
            if (self._snapshot_waiters or self._compact_waiters) and not self._snapshot_pending \
                    and not self._producers_restoring:
                self._take_snapshot(self._plain_snapshot_index())  # a plain log: an empty snapshot
                if self._snapshot_pending and not self.producers.empty:
                    self._producers_saving = self.producers.folded  # with the table: retention may pass it
            return
        if a.stopped is not None:  # its state is half-changed: a snapshot of it would be wrong
            if self._snapshot_waiters:
                self._answer_snapshot(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {a.stopped}")
            return
        # (the snapshot carries the producer table: never labelled past what it is folded through)
        if a.in_flight is None and not a.snapshotting and not a.installing and \
                a.applied_index <= self.producers.folded and (
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

    # --- outputs (used by the components) --------------------------------------

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: Context,
             data: bytes | memoryview = b"", timeout_ms: int | None = None) -> None:
        self.actions.append(Send(peer, code, msg, data, ctx, timeout_ms or self.cfg.max_push_timeout_ms))

    def reply(self, token: Any, code: int, msg: msgspec.Struct, data: bytes = b"") -> None:
        if type(msg) is AppendResponse and msg.config_index != self.configs.index:
            msg = msgspec.structs.replace(msg, config_index=self.configs.index)  # (clients follow it)
        self.actions.append(Reply(token, code, msg, data))

    def request_pump(self) -> None:
        self._pump_needed = True

    def _apply_effects(self, effects: list[Effect]) -> None:
        """Apply what a role object asked for (core.effects), in the order it asked: the one
        place the handler's and the dispatchers' effects reach the rest of the member."""
        for e in effects:
            match e:
                case PushReply():
                    resp = e.resp
                    if self.integrity.corrupt_index >= 0:  # ours, as it stands after the effects before
                        resp.corrupt_index = self.integrity.corrupt_index  # (a fresh struct: nobody else holds it)
                    self.reply(e.token, RequestCode.PUSH, resp)
                case Pump():
                    self._pump_needed = True
                case MarkCorrupt():
                    self.mark_corrupt(e.index, e.reason)
                case ForgetCorruptAbove():
                    self.forget_corrupt_above(e.end)
                case BeyondRepair():
                    self.beyond_repair(e.leader_begin)
                case Repaired():
                    self.repaired(e.first, e.last, list(e.indexes))

    def _take_dispatcher_effects(self) -> None:
        """Effects of dispatcher calls the node did not make itself (the elector's notes from
        heartbeat answers): only pumps, which nothing reads before `drain`."""
        for d in self.dispatchers.values():
            if d.effects:
                self._apply_effects(d.take_effects())

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
            self._take_dispatcher_effects()
            self.dispatchers = {p: self._new_dispatcher(p) for p in m.others}
            self.elector.on_leader()
            self._answer_leader_waits(self.leader_waits.take_all())
            return
        if role == Role.CANDIDATE:
            m.role = Role.CANDIDATE
            m.leader_id = None
            return
        if leader_id:
            m.leader_id = leader_id
            self.handler.on_leader_change()
            self._apply_effects(self.handler.take_effects())
            self.forget_beyond_repair()
            return
        was_leader = m.is_leader
        m.role = Role.FOLLOWER
        if m.leader_id == m.self_id:
            m.leader_id = None
        self._take_dispatcher_effects()
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
        self._apply_effects(self.handler.take_effects())

    def _answer_leader_waits(self, tokens: list[Any]) -> None:
        """Parked leader searches (core.leader_wait): our view now, one METADATA for all."""
        if tokens:
            view = self.metadata()
            for token in tokens:
                self.reply(token, RequestCode.METADATA, view)

    # --- request dispatch -----------------------------------------------------

    def _dispatch(self, code: int, msg: Msg, data: memoryview | bytes | bytearray, token: Any,
                  principal: str = "") -> None:
        if code == RequestCode.PUSH:
            assert isinstance(msg, PushRequest)
            if msg.type != PushType.COMMIT:
                self.integrity.active = True
            try:
                self.handler.handle_push(msg, data, token)
            finally:
                self._apply_effects(self.handler.take_effects())
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
                              msg.consistency, token, msg.wait_ms, msg.follower_read, msg.bodies, msg.markers,
                              msg.columnar)
        elif code == RequestCode.READ_INDEX:
            assert isinstance(msg, ReadIndexRequest)
            self.read_path.when_confirmed(code, msg.consistency, token,
                                 lambda ri: self.reply(token, code, ReadIndexResponse(200, self.member.self_id, ri)))
        elif code == RequestCode.METADATA:
            assert isinstance(msg, MetadataRequest)
            if msg.consistency:  # a confirmed leader's view
                self.read_path.when_confirmed(code, msg.consistency, token,
                                              lambda _: self.reply(token, code, self.metadata()))
            elif msg.wait_ms > 0 and not self.member.is_leader and \
                    self.leader_waits.park(token, self.now, msg.wait_ms, principal):
                pass  # answered when we lead (_change_role) or when the wait runs out (tick)
            else:
                self.reply(token, code, self.metadata())
        elif code == RequestCode.LEADERSHIP_TRANSFER:
            assert isinstance(msg, LeadershipTransferRequest)
            self.elector.handle_transfer(msg, token)
        elif code == RequestCode.QUERY:
            assert isinstance(msg, QueryRequest)
            self._handle_query(msg, token)
        elif code == RequestCode.SNAPSHOT:
            assert isinstance(msg, SnapshotRequest)
            self._handle_snapshot(token, msg)
        elif code == RequestCode.INSTALL_SNAPSHOT:
            assert isinstance(msg, InstallSnapshotRequest)
            self.integrity.active = True
            self.receiver.handle(msg, data, token)
        elif code == RequestCode.MEMBERS:
            assert isinstance(msg, MembersRequest)
            self.reply(token, code, self.members_view())
        elif code == RequestCode.CHANGE_MEMBERS:
            assert isinstance(msg, ChangeMembersRequest)
            self._change_members(msg, token)
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
        if msg.leader_id and not self.admits(code, msg.leader_id, getattr(msg, "term", -1), self.now):
            return ResponseCode.UNKNOWN_MEMBER
        if is_member_message(code, msg) and (not msg.leader_id or msg.leader_id == m.self_id):
            return ResponseCode.UNEXPECTED_MEMBER
        # a hand-over comes from the leader itself: a member (even one whose certificate is
        # checked) must not hand over in another member's name
        if isinstance(msg, LeadershipTransferRequest) and msg.transfer_id and msg.transfer_id != msg.leader_id:
            return ResponseCode.UNEXPECTED_MEMBER
        return None

    def admits(self, code: int, sender: str, term: int, now_ms: int) -> bool:
        """takes_member; a leader's message (of `term`) it refuses makes us ask the members we
        know about its sender (core.config_probe). The runtime checks a member certificate's
        sender by this same rule."""
        self.now = now_ms
        if self.takes_member(code, sender):
            return True
        self.probe.unknown(code, sender, term)
        return False

    def takes_member(self, code: int, sender: str) -> bool:
        """Whether a message `code` from member `sender` is taken: a member of our configuration
        in force or of the committed one (a member whose removal is not committed still
        campaigns; one whose removal committed is refused, whatever older configurations our
        log still holds), or a leader or candidate our log lags behind (core.config_probe)."""
        m = self.member
        return m.membership.has(sender) or sender in m.committed_members or self.probe.takes(code, sender)

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
        cfgs = self.configs
        cur, end = cfgs.current, s.end_index
        if m.is_leader:
            followers = tuple(FollowerStatus(p, d.progress.match_index, d.progress.needs_snapshot,
                                             d.progress.repair_index, cur.is_voter(p),
                                             end - d.progress.match_index if d.progress.match_index >= 0 else -1)
                              for p, d in self.dispatchers.items())
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
            self.read_path.entries_read, self.read_path.read_body_bytes, followers,
            tuple(cur.voters.items()), tuple(cur.learners.items()), cfgs.index, cfgs.index <= s.committed_index,
            cfgs.committed(s.committed_index)[0], self.not_a_member)

    def metadata(self) -> MetadataResponse:
        st = self.status()
        problems = [st.full] if st.full else []
        if st.not_a_member:
            problems.append(f"{st.self_id} is not a member of the group's configuration (removed)")
        if st.corrupt_index >= 0:
            problems.append(f"corrupt record at index {st.corrupt_index} ({st.corrupt_reason}); "
                            "not leading until it is repaired from the leader")
        return MetadataResponse(
            200, st.group, st.self_id, st.role.name.lower(), st.leader_id, st.term, self.configs.current.peers_string(),
            st.begin_index, st.end_index, st.end_term, st.committed_index,
            store_error="; ".join(problems), retention_held_by=st.retention_held_by,
            applied_index=st.applied_index, snapshot_index=st.snapshot_index,
            state_machine_error=st.state_machine_error,
            install_index=st.install_index, install_bytes=st.install_bytes, install_total=st.install_total,
            security=st.security_mode,
        )


def _why(e: DLedgerError | None) -> str:
    return "" if e is None else (e.message or ResponseCode(e.code).name)


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
    if code == RequestCode.MEMBERS:
        return MembersResponse(int(err), leader, m.term, message=message)
    if code == RequestCode.CHANGE_MEMBERS:
        return ChangeMembersResponse(int(err), leader, m.term, message=message)
    if code == RequestCode.INSTALL_SNAPSHOT:
        return InstallSnapshotResponse(int(err), m.term, end_index=node.store.end_index, reason=message[:512])
    from dledger.core.messages import HeartBeatResponse, PushResponse

    if code == RequestCode.PUSH:
        return PushResponse(int(err), m.term, node.store.end_index, corrupt_index=node.corrupt_index,
                            reason=message[:512])
    if code == RequestCode.HEART_BEAT:
        return HeartBeatResponse(int(err), m.term, leader)
    if code == RequestCode.VOTE:
        return VoteResponse(m.term, 0, code=int(err))
    return SimpleResponse(int(err), m.term, leader, message)


# the actions, importable from here as before (core.actions)
__all__ = ["Action", "Apply", "DropInstall", "InstallChunk", "Node", "ReadChunk", "Reply", "RestoreSnapshot",
           "RunQuery", "Send", "TakeSnapshot"]
