"""InstallSnapshot (Raft §7; DLedger's INSTALL_SNAPSHOT): a follower whose next entry is below
the leader's log begin gets the leader's newest snapshot instead, then entries as usual.

Leader (`SnapshotSender`, one per follower, driven by its EntryDispatcher): the snapshot's
files travel as one stream (statemachine.install), `install_chunk_bytes` per request, one in flight:
the follower's answer paces the next, which is the flow control. The runtime reads a chunk
off the event loop (`ReadChunk` -> `ChunkRead`). Every request carries the whole
meta, its offset and CRC; the follower answers where the next chunk must start, so a timeout
or a dropped connection resends from the last chunk acknowledged, and a follower that
restarted (its partial copy deleted) answers 0. Its `done` answer says it holds the log
through last_index; the dispatcher matches from there. A plain log has no state to send, only
where its log begins: its snapshot is empty and made up on the spot at begin - 1 (retention
deleted what came before, on every member in time).

Follower (`SnapshotReceiver`): chunks go to the worker thread in arrival order (`InstallChunk`;
the runtime's InstallSink writes them under a temporary name and renames the directory into
place once whole and verified). When it is in, the follower adopts it, unless its log got the
entry last_index meanwhile (a newer leader sent it): the log is reset to begin after last_index
(`store.reset`) and the state machine restored from the snapshot (`RestoreSnapshot`), nothing
applied in between. A crash between the rename and the reset is mended at start (the node
aligns a log that does not hold the newest snapshot's last entry).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from dledger.codes import DISK_FAULTS, DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import ChunkCtx, InstallCtx
from dledger.core.env import MemberEnv
from dledger.core.messages import InstallSnapshotRequest, InstallSnapshotResponse, SnapshotFile
from dledger.core.progress import Progress
from dledger.ratelog import RateLimitedLog
from dledger.statemachine.applier import Applier
from dledger.statemachine.snapshot import FileInfo, SnapshotMeta
from dledger.store.base import LedgerStore, StoreError

log = logging.getLogger(__name__)

TIMEOUT_FACTOR = 4  # a chunk may wait behind applies on the follower's worker: more than a push's timeout


def holds(store: LedgerStore, last_index: int, last_term: int, chain_crc: int) -> bool:
    """Whether this log already holds the snapshot's last entry (or compacted past it): then it
    matches the leader's log through there and needs no install."""
    if last_index < store.begin_index - 1:
        return True  # our own snapshot is newer; what we committed there is the leader's
    if not _same_entry(store, last_index, last_term, chain_crc):
        return False
    # a rotten copy of it is not held: one beyond repair (the leader's log begins after it) could
    # neither be repaired nor truncated after; the install replaces it
    return last_index < store.begin_index or store.verify(last_index) is None


def _same_entry(store: LedgerStore, index: int, term: int, chain_crc: int) -> bool:
    """Our entry `index` (or the one our log begins after) is that one, by its header."""
    if not store.begin_index - 1 <= index <= store.end_index:
        return False
    return store.term_at(index) == term and store.chain_at(index) == chain_crc


def meta_of(req: InstallSnapshotRequest) -> SnapshotMeta:
    files = {n: FileInfo(f.size, f.crc32) for n, f in req.files.items()}
    return SnapshotMeta(req.last_index, req.last_term, req.chain_crc, req.members, files, next_pos=req.next_pos,
                        config_index=req.config_index)


class SenderContext(MemberEnv, Protocol):
    """All a SnapshotSender needs of its leader (the Node is one): the member, store, options
    and clock; the snapshot to send (and whether it is ours: a refused one may be damaged); the
    follower's Progress; an outbox for chunk reads and requests; the install counters."""

    install_bytes_sent: int  # metrics, across followers
    installs_sent: int

    @property
    def cfg(self) -> DLedgerConfig: ...
    @property
    def applier(self) -> Applier | None: ...
    @property
    def snapshot_meta(self) -> SnapshotMeta | None: ...
    @property
    def progress(self) -> Mapping[str, Progress]: ...

    def snapshot_to_send(self) -> SnapshotMeta | None: ...
    def want_snapshot(self) -> None: ...
    def read_chunk(self, peer: str, meta: SnapshotMeta, offset: int, max_bytes: int, ctx: ChunkCtx) -> None: ...
    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: InstallCtx, data: bytes | memoryview,
             timeout_ms: int) -> None: ...


class SnapshotSender:
    """The leader's side, for one follower."""

    def __init__(self, env: SenderContext, peer: str) -> None:
        self.env = env
        self.peer = peer
        self.meta: SnapshotMeta | None = None
        self.offset = 0  # the follower has the stream up to here
        self.busy = False  # a chunk is being read or is in flight
        self.paused_until = 0
        self.started = 0
        self._last_sent = -1
        self._log = RateLimitedLog.on_ms(log, lambda: env.now)  # lines the follower's answers trigger
        self._warn = self._log.warning

    @property
    def active(self) -> bool:
        return self.meta is not None

    def start(self) -> bool:
        """Begin sending our newest snapshot (False: none reaches our log begin)."""
        meta = self.env.snapshot_to_send()
        if meta is None:
            return False
        self.meta, self.offset, self.busy, self.started = meta, 0, False, self.env.now
        # (once per snapshot: a refused install starts over every heartbeat interval)
        (log.info if meta.last_index != self._last_sent else log.debug)(
            "push to %s: it needs entries before our log begin %d; sending snapshot %d (%d bytes)",
            self.peer, self.env.store.begin_index, meta.last_index, meta.size)
        self._last_sent = meta.last_index
        return True

    def stop(self) -> None:
        self.meta, self.busy = None, False

    def pump(self, epoch: int) -> None:
        meta = self.meta
        if meta is None or self.busy or self.env.now < self.paused_until:
            return
        self.busy = True
        if meta.size == 0:
            self._send(epoch, b"", 0)
        else:
            self.env.read_chunk(self.peer, meta, self.offset, self.env.cfg.install_chunk_bytes,
                                ChunkCtx(epoch, meta.last_index, self.offset))

    def on_chunk(self, epoch: int, data: bytes, crc: int, error: str) -> None:
        """The runtime read the chunk asked for (or failed: our snapshot went, a newer one
        replaced it; start again with the newest)."""
        self.busy = False
        if error:
            self._warn("read", "push to %s: reading snapshot %s failed (%s); starting again with our newest",
                       self.peer, self.meta.last_index if self.meta else "?", error)
            self.meta = None
            self.paused_until = self.env.now + self.env.cfg.heart_beat_time_interval_ms
            return
        self.busy = True
        self._send(epoch, data, crc)

    def _send(self, epoch: int, data: bytes, crc: int) -> None:
        env, m, meta = self.env, self.env.member, self.meta
        assert meta is not None
        files = {n: SnapshotFile(f.size, f.crc32) for n, f in meta.files.items()}
        req = InstallSnapshotRequest(m.group, m.self_id, self.peer, m.term, meta.last_index, meta.last_term,
                                     meta.chain_crc, max(meta.next_pos, 0), meta.members, files, self.offset, crc,
                                     env.store.committed_index, meta.config_index)
        env.send(self.peer, RequestCode.INSTALL_SNAPSHOT, req,
                 InstallCtx(self.peer, epoch, m.term, meta.last_index, self.offset), data,
                 TIMEOUT_FACTOR * env.cfg.max_push_timeout_ms)
        env.install_bytes_sent += len(data)

    def on_response(self, resp: InstallSnapshotResponse | None) -> bool:
        """An answer to our chunk; True once the follower holds the snapshot."""
        self.busy = False
        env, meta = self.env, self.meta
        if meta is None:
            return False
        hb = env.cfg.heart_beat_time_interval_ms
        if resp is None:  # timeout or network error: the same chunk again, not in a tight loop
            self.paused_until = env.now + hb  # (a member down fails at once: it spun a core)
            return False
        if resp.code != ResponseCode.SUCCESS:
            self._warn("install", "push to %s: install of snapshot %d refused (%s): %s; retrying every %d ms",
                       self.peer, meta.last_index, _code_name(resp.code), resp.reason, hb)
            self.paused_until = env.now + hb
            if resp.code == ResponseCode.INSTALL_SNAPSHOT_ERROR and env.applier is not None \
                    and meta == env.snapshot_meta:
                env.want_snapshot()  # ours may be damaged (or not byte-for-byte reproducible): a new one
            self.meta = None  # start again with our newest (the follower dropped its partial copy)
            return False
        env.progress[self.peer].last_ack = env.now  # it still follows us
        if resp.done:
            env.installs_sent += 1
            self._log.info("installed", "push to %s: snapshot %d installed (%d bytes in %d ms)", self.peer,
                           meta.last_index, meta.size, env.now - self.started)
            self.meta = None
            return True
        if not 0 <= resp.next_offset <= meta.size:
            self._warn("install", "push to %s: it asks for offset %d of a %d-byte snapshot; starting again",
                       self.peer, resp.next_offset, meta.size)
            self.offset = 0
        else:
            self.offset = resp.next_offset
        return False


class LeaderCheck(Protocol):
    """The elector's check of a request's term and leader (core.elector.LeaderElector)."""

    def accept_leader(self, term: int, leader_id: str) -> ResponseCode | None: ...


class MatchNotes(Protocol):
    """The follower's record of how far its log matches the leader's (core.handler.EntryHandler)."""

    def note_match(self, index: int, leader_commit: int) -> None: ...
    def durable_match(self) -> int: ...


class ReceiverContext(MemberEnv, Protocol):
    """All a SnapshotReceiver needs of its follower (the Node is one): the member, store and
    clock; the elector's leader check and the handler's match notes; the applier and whether a
    restore is queued; an outbox for chunk writes, drops and replies; and the node's own steps
    once a snapshot is in (note it, restore from it, reset the log to it, a store fault)."""

    @property
    def applier(self) -> Applier | None: ...
    @property
    def restoring(self) -> bool: ...
    @property
    def elector(self) -> LeaderCheck: ...
    @property
    def handler(self) -> MatchNotes: ...

    def apply_needs(self) -> int: ...
    def install_chunk(self, token: Any, meta: SnapshotMeta, offset: int, data: bytes | memoryview,
                      crc: int) -> None: ...
    def drop_install(self) -> None: ...
    def reply(self, token: Any, code: int, msg: msgspec.Struct) -> None: ...
    def store_error(self, e: StoreError) -> None: ...
    def note_snapshot(self, meta: SnapshotMeta) -> None: ...
    def restore_from(self, meta: SnapshotMeta) -> None: ...
    def reset_log_to(self, meta: SnapshotMeta) -> None: ...


class SnapshotReceiver:
    """The follower's side: at most one snapshot being received, whoever sends it."""

    def __init__(self, env: ReceiverContext) -> None:
        self.env = env
        self.meta: SnapshotMeta | None = None  # the snapshot being received
        self.received = 0
        self.finishing = False  # its last chunk is on the worker: the state must not change meanwhile
        self.queued = 0  # chunks on the worker (a resent one may be queued behind the last)
        self.installs = 0  # snapshots adopted (metrics)
        self.bytes = 0  # chunk bytes taken (metrics)
        # a (forged) empty snapshot is a whole install per request: its lines are rate-limited
        self._log = RateLimitedLog.on_ms(log, lambda: env.now)
        self._warn = self._log.warning

    def handle(self, req: InstallSnapshotRequest, data: memoryview | bytes | bytearray, token: Any) -> None:
        env = self.env
        err = env.elector.accept_leader(req.term, req.leader_id)
        if err is not None:
            self._answer(token, err)
            return
        store = env.store
        held = holds(store, req.last_index, req.last_term, req.chain_crc)
        if held and not 0 <= env.apply_needs() <= req.last_index:  # (unless our state machine needs it)
            env.handler.note_match(req.last_index, req.committed_index)
            self.drop_partial()
            self._answer(token, ResponseCode.SUCCESS, done=True)
            return
        # a committed entry of ours that differs (a rotten copy of the same entry is replaced)
        if not held and req.last_index <= store.committed_index and \
                not _same_entry(store, req.last_index, req.last_term, req.chain_crc):
            raise DLedgerError(ResponseCode.INCONSISTENT_STATE,
                               f"snapshot {req.last_index} (term {req.last_term}) differs from our committed entry")
        a = env.applier
        if a is not None and a.stopped is not None:
            raise DLedgerError(ResponseCode.INSTALL_SNAPSHOT_ERROR, f"state machine stopped: {a.stopped}")
        if self.finishing:
            raise DLedgerError(ResponseCode.REPEATED_PUSH, "the snapshot's last chunk is being installed")
        meta = meta_of(req)
        if meta != self.meta:
            self.meta, self.received = meta, 0
            self._log.info("receiving", "%s: receiving snapshot %d (term %d, %d bytes) from %s", env.member.self_id,
                           meta.last_index, meta.last_term, meta.size, req.leader_id)
        if req.offset + len(data) >= meta.size:  # may complete it: nothing is applied until it is adopted
            self.finishing = True
            if a is not None:
                a.installing = True
        self.queued += 1
        # a frame's data is its own buffer (or a copy): the worker may hold it, no copy of 4 MiB
        env.install_chunk(token, meta, req.offset, bytes(data) if isinstance(data, bytearray) else data, req.crc)

    def on_chunk_installed(self, token: Any, meta: SnapshotMeta, next_offset: int, done: bool, error: str) -> None:
        """The worker wrote the chunk (`next_offset`: where the next must start); `done`: the
        snapshot is whole and in place."""
        env = self.env
        self.queued -= 1
        a = env.applier
        if done or self.queued == 0:
            self.finishing = False
            if not done and a is not None and not env.restoring:  # (a resent last chunk that found the
                a.installing = False  # install done has nothing to hold back; a restore queued does)
        if error:
            self.meta, self.received = None, 0
            code = ResponseCode.DISK_FULL if "No space left" in error else ResponseCode.INSTALL_SNAPSHOT_ERROR
            self._warn("failed", "%s: install of snapshot %d failed: %s", env.member.self_id, meta.last_index, error)
            self._answer(token, code, reason=error)
            return
        self.bytes += max(0, next_offset - self.received)
        self.received = next_offset
        if done:
            self.meta, self.received = None, 0
            try:
                self._adopt(meta)
            except StoreError as e:
                if a is not None:
                    a.installing = False
                env.store_error(e)
                self._answer(token, e.code if e.code in DISK_FAULTS else ResponseCode.INSTALL_SNAPSHOT_ERROR,
                             reason=e.message)
                return
        self._answer(token, ResponseCode.SUCCESS, next_offset=next_offset, done=done)

    def _adopt(self, meta: SnapshotMeta) -> None:
        """The snapshot is in place: our log begins after it (unless it holds its last entry
        by now), and the state machine is restored from it."""
        env, store = self.env, self.env.store
        env.note_snapshot(meta)
        self.installs += 1
        if env.applier is not None:
            env.applier.installing = False  # restore_from sets it again until the state is replaced
        # (committed past it meanwhile: the log holds the leader's entries there, maybe a rotten copy
        # of the last one, which is repaired as usual; a reset would drop committed entries)
        if holds(store, meta.last_index, meta.last_term, meta.chain_crc) or env.member.is_leader \
                or meta.last_index < store.committed_index:
            self._log.info("installed", "%s: snapshot %d installed; our log holds its last entry by now: kept as it "
                           "is", env.member.self_id, meta.last_index)
            if 0 <= env.apply_needs() <= meta.last_index:  # but our state machine needs it
                env.restore_from(meta)
            return
        self._log.info("installed", "%s: snapshot %d installed; the log now begins at %d", env.member.self_id,
                       meta.last_index, meta.last_index + 1)
        env.reset_log_to(meta)
        env.handler.note_match(meta.last_index, -1)

    def drop_partial(self) -> None:
        """An install we no longer need (our log holds its last entry, or a leader extends our
        log): its partial copy goes, and status no longer shows it."""
        if self.meta is not None and not self.finishing and not self.queued:
            self.meta, self.received = None, 0
            self.env.drop_install()

    def progress(self) -> tuple[int, int, int]:
        """(last index, bytes received, bytes in all) of the snapshot being received, or (-1, 0, 0)."""
        if self.meta is None:
            return -1, 0, 0
        return self.meta.last_index, self.received, self.meta.size

    def _answer(self, token: Any, code: ResponseCode, next_offset: int = 0, done: bool = False,
                reason: str = "") -> None:
        env = self.env
        store = env.store
        env.reply(token, RequestCode.INSTALL_SNAPSHOT,
                  InstallSnapshotResponse(int(code), env.member.term, next_offset, done, store.end_index,
                                          env.handler.durable_match(), reason[:512]))


def _code_name(code: int) -> str:
    return ResponseCode(code).name if code in ResponseCode._value2member_map_ else str(code)
