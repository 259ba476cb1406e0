"""Snapshot orchestration, a part of `Node` (core.node) carved out of it: when to take one
(the applier's interval, disk pressure, a follower needing one past our log begin) and what
is done with it once written; what a follower needing entries before our log begin is sent
(core.install_snapshot sends it), the chunks read and written through the worker, the log
reset to an installed snapshot and the state machine restored from it; on-demand snapshots
(`dledger snapshot`); at start, a log aligned with the newest snapshot.

`SnapshotPath` holds no state of its own; what it reads and calls of the node is declared
below.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.core.actions import DropInstall, InstallChunk, ReadChunk, RestoreSnapshot, TakeSnapshot
from dledger.core.contexts import ChunkCtx
from dledger.core.install_snapshot import holds
from dledger.core.messages import AppendResponse, SnapshotRequest, SnapshotResponse
from dledger.membership import Membership, membership_of
from dledger.statemachine.snapshot import PRODUCERS_FILE, SnapshotMeta
from dledger.store.base import CorruptEntryError, StoreError

if TYPE_CHECKING:
    from dledger.config import DLedgerConfig
    from dledger.core.actions import Action
    from dledger.core.configs import ConfigHistory
    from dledger.core.dispatcher import EntryDispatcher
    from dledger.core.effects import Effect
    from dledger.core.handler import EntryHandler
    from dledger.core.install_snapshot import SnapshotReceiver
    from dledger.core.integrity import Integrity
    from dledger.core.member_state import MemberState
    from dledger.core.producers import ProducerTable
    from dledger.statemachine.applier import Applier
    from dledger.store.base import LedgerStore

log = logging.getLogger(__name__)


class SnapshotPath:
    """The Node's snapshots: taken, sent, installed, restored."""

    if TYPE_CHECKING:  # the node's, used here
        cfg: DLedgerConfig
        store: LedgerStore
        member: MemberState
        applier: Applier | None
        snapshot_meta: SnapshotMeta | None
        actions: list[Action]
        producers: ProducerTable
        now: int
        restoring: bool
        integrity: Integrity
        dispatchers: dict[str, EntryDispatcher]
        receiver: SnapshotReceiver
        handler: EntryHandler
        _snapshot_waiters: list[Any]
        _compact_waiters: list[tuple[Any, int]]
        _snapshot_pending: bool
        _snapshot_wanted: bool
        _producers_saving: int
        _producers_saved: tuple[int, int]
        _producers_restoring: bool
        _snapshot_config: tuple[int, Membership]
        configs: ConfigHistory

        def reply(self, token: Any, code: int, msg: msgspec.Struct, data: bytes = b"") -> None: ...
        def _apply_effects(self, effects: list[Effect]) -> None: ...
        def _load_producers(self, data: bytes, where: str) -> None: ...
        def _stop_applier(self, reason: str) -> None: ...
        def _run_due_queries(self) -> None: ...
        def _sync_members(self) -> None: ...
        def _hold_retention(self) -> None: ...
        def store_error(self, e: StoreError) -> None: ...

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
        # the table is folded at or past `index` (the callers wait for it): entries between are
        # committed, so every log that continues the snapshot holds them as folded
        cidx, members = self.configs.at(index)  # the configuration at the snapshot's index
        self._snapshot_config = (cidx, members)
        self.actions.append(TakeSnapshot(index, term, chain, next_pos, sending, self.producers.encode()
                                         if not self.producers.empty else b"", members, cidx))

    def _snapshot_taken(self, index: int, error: str, now_ms: int, meta: SnapshotMeta | None = None) -> None:
        """The worker wrote the snapshot of `index` (`meta`; or failed: `error`)."""
        self.now = now_ms
        if meta is not None:
            cidx, members = self._snapshot_config
            if meta.config_index != cidx or membership_of(meta.members, members) != members:
                # a driver that wrote another configuration (the command line's): what we send
                # and what retention waits for is the one asked for
                log.warning("%s/%s: snapshot %d was written with configuration %s, not entry %d's",
                            self.member.group, self.member.self_id, index, meta.members, cidx)
                meta = msgspec.structs.replace(meta, members=members, config_index=cidx)
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
        else:
            self._compact(index)
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
            cidx, members = self.configs.at(b - 1)
            return SnapshotMeta(b - 1, store.begin_term, store.begin_chain_crc, members,
                                next_pos=self._pos_of(b), config_index=cidx)
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
            self._apply_effects(d.take_effects())

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
        # the snapshot's configuration is ours now (the log that held any other is gone)
        self.configs.reset(meta.config_index, membership_of(meta.members, self.configs.current))
        self._sync_members()
        self.handler.after_reset(L)
        self._apply_effects(self.handler.take_effects())
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
        if code != ResponseCode.SUCCESS:  # compactions wait for the same snapshot: they failed too
            compacts, self._compact_waiters = self._compact_waiters, []
            for token, _ in compacts:
                self.reply(token, RequestCode.SNAPSHOT, SnapshotResponse(int(code), -1, message))

    # --- `dledger compact` (a plain log) ---------------------------------------------------------

    def _handle_compact(self, token: Any, req: SnapshotRequest) -> None:
        """Compact a plain log through `req.through` (-1: the commit index). A snapshot with the
        producer table is written first (retention never passes the last saved table); then
        the store deletes the whole data files before that point as far as the same floors as
        retention allow (the commit and fsynced indexes, live followers, the configuration)."""
        if self.applier is not None:
            raise DLedgerError(ResponseCode.UNSUPPORTED,
                               f"group {self.member.group} applies its log to a state machine: its log is compacted "
                               "behind its snapshots (`dledger snapshot`), not by `dledger compact`")
        store = self.store
        committed = store.committed_index
        if committed < 0:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                               f"nothing is committed on {self.member.self_id} yet: nothing to compact")
        through = committed if req.through < 0 else req.through
        if through > committed:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                               f"index {through} is not committed on {self.member.self_id} (commit index {committed}): "
                               "only committed entries can be compacted")
        if through < store.begin_index:
            self.reply(token, RequestCode.SNAPSHOT, SnapshotResponse(
                int(ResponseCode.SUCCESS), through, f"already compacted: the log begins at {store.begin_index}",
                store.begin_index))
            return
        self._compact_waiters.append((token, through))

    def _compact(self, index: int) -> None:
        """A plain log's snapshot at `index` is written: the compactions waiting for it go ahead."""
        waiters, self._compact_waiters = self._compact_waiters, []
        if not waiters:
            return
        store = self.store
        through = min(index, max(t for _, t in waiters))
        answered = 0
        try:
            store.set_compaction_point(through)
            if self.member.is_leader:
                self._hold_retention()  # the floor with the table just saved, before the store looks
            store.request_retention()
            floor, holder = store.retention_hold()
            for token, t in waiters:
                point = min(t, index)
                begin = store.compaction_begin(point)
                held = f"held at {floor} by {holder}" if floor is not None and floor < begin and holder else ""
                if point < t:  # the snapshot stops where the producer table is folded (it catches up)
                    held = "; ".join(filter(None, (held, f"compacted through {point} only: the producer table is "
                                                        f"folded through {index} so far; run it again shortly")))
                self.reply(token, RequestCode.SNAPSHOT,
                           SnapshotResponse(int(ResponseCode.SUCCESS), point, held, begin))
                answered += 1
        except StoreError as e:  # e.g. a rotten index unit where the compaction would begin
            # the waiters are off the list: answered now, or never (their clients would time out)
            for token, _ in waiters[answered:]:
                self.reply(token, RequestCode.SNAPSHOT,
                           SnapshotResponse(int(e.code), -1, f"compaction through {through}: {e.message}"))
            if isinstance(e, CorruptEntryError):
                self.store_error(e)  # marked: the leader's copy repairs it
            else:
                log.warning("%s/%s: compaction through %d: %s", self.member.group, self.member.self_id, through, e)

    def _handle_snapshot(self, token: Any, req: SnapshotRequest | None = None) -> None:
        if req is not None and req.through < -1:  # (-1 alone means "the commit index")
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"through must be an index, or -1 for the commit index, not {req.through}")
        if req is not None and req.compact:
            self._handle_compact(token, req)
            return
        a = self.applier
        if a is not None and a.stopped is not None:
            raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"state machine stopped: {a.stopped}")
        if (a.applied_index if a is not None else self.store.committed_index) < 0:
            self.reply(token, RequestCode.SNAPSHOT, SnapshotResponse(200, -1, "nothing committed yet"))
            return
        self._snapshot_waiters.append(token)
