"""InstallSnapshot against the Raft thesis (§5.4.1 / Raft paper §7: a follower whose next entry
the leader's log no longer holds gets the leader's snapshot, in chunks, and its log then begins
after the snapshot), one test per rule. The sender and receiver are built from their narrow
contexts (core.install_snapshot.SenderContext, ReceiverContext), without a Node; the term checks,
which are the elector's, go through a Node (tests/unit/raft_harness.py)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.contexts import ChunkCtx, InstallCtx
from dledger.core.install_snapshot import SnapshotReceiver, SnapshotSender
from dledger.core.member_state import MemberState
from dledger.core.messages import InstallSnapshotRequest, InstallSnapshotResponse, Role, SnapshotFile
from dledger.core.progress import Progress
from dledger.entry import MAGIC_NORMAL
from dledger.statemachine.applier import Applier
from dledger.statemachine.snapshot import FileInfo, SnapshotMeta
from dledger.store.base import StoreError
from dledger.store.memory import MemoryLedgerStore

from .raft_harness import Member

PEERS = "n0-127.0.0.1:20000;n1-127.0.0.1:20001;n2-127.0.0.1:20002"
CHUNK = 1000
META = SnapshotMeta(9, 2, 1234, PEERS, {"a": FileInfo(1500, 1), "b": FileInfo(1000, 2)}, next_pos=4096)


def _cfg(self_id: str) -> DLedgerConfig:
    return DLedgerConfig(self_id=self_id, peers=PEERS, store_type="memory", install_chunk_bytes=CHUNK)


def _store(cfg: DLedgerConfig, terms: list[int]) -> MemoryLedgerStore:
    store = MemoryLedgerStore(cfg.max_body_bytes)
    for t in terms:
        store.append_as_leader([b"t%d" % t], t, MAGIC_NORMAL)
    return store


# --- the leader's side ---------------------------------------------------------------------------


@dataclass
class SenderEnv:
    """Leader n0 of term 3 sending snapshot META to n1."""

    meta: SnapshotMeta | None = META
    now: int = 0
    install_bytes_sent: int = 0
    installs_sent: int = 0
    applier: Applier | None = None
    snapshot_meta: SnapshotMeta | None = META
    reads: list[tuple[str, SnapshotMeta, int, int, ChunkCtx]] = field(default_factory=list)
    outbox: list[tuple[str, int, msgspec.Struct, InstallCtx, bytes | memoryview, int]] = field(default_factory=list)
    wanted: int = 0

    def __post_init__(self) -> None:
        self.cfg = _cfg("n0")
        self.store = _store(self.cfg, [1, 2, 3])
        self.member = MemberState(self.cfg.group, "n0", list(self.cfg.peer_map), self.store)
        self.member.set_term(3)
        self.member.role = Role.LEADER
        self.progress = {p: Progress(p) for p in self.member.others}

    def snapshot_to_send(self) -> SnapshotMeta | None:
        return self.meta

    def want_snapshot(self) -> None:
        self.wanted += 1

    def read_chunk(self, peer: str, meta: SnapshotMeta, offset: int, max_bytes: int, ctx: ChunkCtx) -> None:
        self.reads.append((peer, meta, offset, max_bytes, ctx))

    def send(self, peer: str, code: int, msg: msgspec.Struct, ctx: InstallCtx, data: bytes | memoryview,
             timeout_ms: int) -> None:
        self.outbox.append((peer, code, msg, ctx, data, timeout_ms))


def _sending(env: SenderEnv | None = None) -> tuple[SenderEnv, SnapshotSender]:
    env = env or SenderEnv()
    s = SnapshotSender(env, "n1")
    assert s.start()
    return env, s


def _ok(next_offset: int, done: bool = False) -> InstallSnapshotResponse:
    return InstallSnapshotResponse(int(ResponseCode.SUCCESS), 3, next_offset, done)


def test_no_snapshot_reaching_the_log_begin_sends_nothing() -> None:
    env = SenderEnv(meta=None)
    s = SnapshotSender(env, "n1")
    assert not s.start() and not s.active
    s.pump(0)
    assert not env.reads and not env.outbox


def test_the_sender_reads_one_chunk_at_a_time_from_where_the_follower_is() -> None:
    """one chunk in flight: the follower's answer paces the next (the flow control)."""
    env, s = _sending()
    s.pump(0)
    s.pump(0)
    assert len(env.reads) == 1
    peer, meta, offset, max_bytes, ctx = env.reads[0]
    assert (peer, meta, offset, max_bytes) == ("n1", META, 0, CHUNK)
    assert ctx == ChunkCtx(0, META.last_index, 0)


def test_each_chunk_carries_the_whole_snapshot_its_offset_and_crc() -> None:
    env, s = _sending()
    s.pump(4)
    data = b"x" * CHUNK
    s.on_chunk(4, data, zlib.crc32(data), "")
    assert len(env.outbox) == 1
    peer, code, req, ctx, sent, _ = env.outbox[0]
    assert peer == "n1" and code == RequestCode.INSTALL_SNAPSHOT and sent == data
    assert isinstance(req, InstallSnapshotRequest)
    assert (req.term, req.last_index, req.last_term, req.chain_crc, req.next_pos) == (3, 9, 2, 1234, 4096)
    assert req.files == {"a": SnapshotFile(1500, 1), "b": SnapshotFile(1000, 2)}
    assert (req.offset, req.crc) == (0, zlib.crc32(data))
    assert ctx == InstallCtx("n1", 4, 3, 9, 0)
    assert env.install_bytes_sent == CHUNK
    s.pump(4)
    assert len(env.reads) == 1  # still in flight: no second read


def test_the_follower_answer_sets_where_the_next_chunk_starts() -> None:
    env, s = _sending()
    s.pump(0)
    s.on_chunk(0, b"x" * CHUNK, 0, "")
    assert not s.on_response(_ok(CHUNK))
    assert env.progress["n1"].last_ack == env.now  # it still follows us
    s.pump(0)
    assert env.reads[-1][2] == CHUNK


def test_an_offset_outside_the_snapshot_starts_it_again() -> None:
    env, s = _sending()
    s.pump(0)
    s.on_chunk(0, b"x" * CHUNK, 0, "")
    s.on_response(_ok(META.size + 1))
    s.pump(0)
    assert env.reads[-1][2] == 0


def test_no_answer_resends_the_same_chunk_after_a_pause() -> None:
    env, s = _sending()
    s.pump(0)
    s.on_chunk(0, b"x" * CHUNK, 0, "")
    s.on_response(_ok(CHUNK))
    s.pump(0)
    s.on_chunk(0, b"y" * CHUNK, 0, "")
    assert not s.on_response(None)
    s.pump(0)
    assert len(env.reads) == 2  # paused: not in a tight loop
    env.now += env.cfg.heart_beat_time_interval_ms
    s.pump(0)
    assert env.reads[-1][2] == CHUNK  # the same chunk again


def test_a_follower_holding_the_snapshot_ends_the_install() -> None:
    env, s = _sending()
    s.pump(0)
    s.on_chunk(0, b"x" * CHUNK, 0, "")
    assert s.on_response(_ok(META.size, done=True))
    assert not s.active and env.installs_sent == 1


def test_a_refused_install_starts_again_with_the_newest_snapshot() -> None:
    env, s = _sending()
    s.pump(0)
    s.on_chunk(0, b"x" * CHUNK, 0, "")
    refused = InstallSnapshotResponse(int(ResponseCode.INSTALL_SNAPSHOT_ERROR), 3, 0, reason="bad chunk")
    assert not s.on_response(refused)
    assert not s.active and s.paused_until == env.now + env.cfg.heart_beat_time_interval_ms
    assert env.wanted == 0  # a plain log's snapshot is made up on the spot: nothing to retake


def test_an_empty_snapshot_is_sent_without_reading() -> None:
    empty = SnapshotMeta(2, 3, 77, PEERS, next_pos=100)
    env, s = _sending(SenderEnv(meta=empty, snapshot_meta=None))
    s.pump(1)
    assert not env.reads and len(env.outbox) == 1
    req = env.outbox[0][2]
    assert isinstance(req, InstallSnapshotRequest) and req.last_index == 2 and req.files == {}


def test_a_chunk_that_cannot_be_read_starts_again_after_a_pause() -> None:
    env, s = _sending()
    s.pump(0)
    s.on_chunk(0, b"", 0, "SnapshotError: gone")
    assert not s.active and not env.outbox
    assert s.paused_until == env.now + env.cfg.heart_beat_time_interval_ms


# --- the follower's side -------------------------------------------------------------------------


class Notes:
    """The follower's match notes (core.handler.EntryHandler's part)."""

    def __init__(self) -> None:
        self.matched: list[tuple[int, int]] = []

    def note_match(self, index: int, leader_commit: int) -> None:
        self.matched.append((index, leader_commit))

    def durable_match(self) -> int:
        return -1


class Leaders:
    """Accepts n0 of term 3 (the term checks are the elector's: tested through a Node below)."""

    def accept_leader(self, term: int, leader_id: str) -> ResponseCode | None:
        return None if (term, leader_id) == (3, "n0") else ResponseCode.EXPIRED_TERM


@dataclass
class ReceiverEnv:
    """Follower n1 of term 3 with a log of terms 1, 1, 2 (none committed)."""

    now: int = 0
    applier: Applier | None = None
    restoring: bool = False
    needs: int = -1
    chunks: list[tuple[Any, SnapshotMeta, int, bytes | memoryview, int]] = field(default_factory=list)
    replies: list[tuple[Any, int, msgspec.Struct]] = field(default_factory=list)
    dropped: int = 0
    faults: list[StoreError] = field(default_factory=list)
    noted: list[SnapshotMeta] = field(default_factory=list)
    restored: list[SnapshotMeta] = field(default_factory=list)
    reset_to: list[SnapshotMeta] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cfg = _cfg("n1")
        self.store = _store(self.cfg, [1, 1, 2])
        self.member = MemberState(self.cfg.group, "n1", list(self.cfg.peer_map), self.store)
        self.member.set_term(3)
        self.member.leader_id = "n0"
        self.elector = Leaders()
        self.handler = Notes()

    def apply_needs(self) -> int:
        return self.needs

    def install_chunk(self, token: Any, meta: SnapshotMeta, offset: int, data: bytes | memoryview, crc: int) -> None:
        self.chunks.append((token, meta, offset, data, crc))

    def drop_install(self) -> None:
        self.dropped += 1

    def reply(self, token: Any, code: int, msg: msgspec.Struct) -> None:
        self.replies.append((token, code, msg))

    def store_error(self, e: StoreError) -> None:
        self.faults.append(e)

    def note_snapshot(self, meta: SnapshotMeta) -> None:
        self.noted.append(meta)

    def restore_from(self, meta: SnapshotMeta) -> None:
        self.restored.append(meta)

    def reset_log_to(self, meta: SnapshotMeta) -> None:
        self.reset_to.append(meta)

    def answer(self, token: Any) -> InstallSnapshotResponse:
        for t, code, msg in reversed(self.replies):
            if t == token:
                assert code == RequestCode.INSTALL_SNAPSHOT and isinstance(msg, InstallSnapshotResponse)
                return msg
        raise AssertionError(f"no answer to {token!r}")


def _chunk(meta: SnapshotMeta, offset: int, data: bytes, term: int = 3, committed: int = 9) -> InstallSnapshotRequest:
    files = {n: SnapshotFile(f.size, f.crc32) for n, f in meta.files.items()}
    return InstallSnapshotRequest("default", "n0", "n1", term, meta.last_index, meta.last_term,
                                  meta.chain_crc, meta.next_pos, meta.members, files, offset, zlib.crc32(data),
                                  committed)


def test_chunks_go_to_the_worker_in_arrival_order() -> None:
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    r.handle(_chunk(META, 0, b"x" * CHUNK), b"x" * CHUNK, "c0")
    r.handle(_chunk(META, CHUNK, b"y" * CHUNK), b"y" * CHUNK, "c1")
    assert [(t, m, o) for t, m, o, _, _ in env.chunks] == [("c0", META, 0), ("c1", META, CHUNK)]
    assert not env.replies  # answered once written
    assert r.progress() == (9, 0, META.size)


def test_a_written_chunk_is_answered_with_where_the_next_must_start() -> None:
    """an out-of-order chunk (the worker's sink takes only the one at its offset) is answered
    with the offset it still wants: the leader resends from there."""
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    r.handle(_chunk(META, 0, b"x" * CHUNK), b"x" * CHUNK, "c0")
    r.on_chunk_installed("c0", META, CHUNK, False, "")
    a = env.answer("c0")
    assert (a.code, a.next_offset, a.done, a.term) == (ResponseCode.SUCCESS, CHUNK, False, 3)
    r.handle(_chunk(META, 2 * CHUNK, b"z" * 500), b"z" * 500, "c2")  # skips a chunk
    r.on_chunk_installed("c2", META, CHUNK, False, "")  # the sink did not take it
    a = env.answer("c2")
    assert (a.code, a.next_offset, a.done) == (ResponseCode.SUCCESS, CHUNK, False)
    assert r.progress() == (9, CHUNK, META.size)


def test_no_chunk_is_taken_while_the_last_one_is_being_installed() -> None:
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    r.handle(_chunk(META, 0, b"x" * META.size), b"x" * META.size, "last")
    with pytest.raises(DLedgerError) as e:
        r.handle(_chunk(META, 0, b"x" * CHUNK), b"x" * CHUNK, "again")
    assert e.value.code == ResponseCode.REPEATED_PUSH
    assert len(env.chunks) == 1


def test_a_whole_snapshot_replaces_the_log_it_does_not_continue() -> None:
    """the log then begins after the snapshot, matching the leader's through its last index."""
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    r.handle(_chunk(META, 0, b"x" * META.size), b"x" * META.size, "last")
    r.on_chunk_installed("last", META, META.size, True, "")
    a = env.answer("last")
    assert (a.code, a.next_offset, a.done) == (ResponseCode.SUCCESS, META.size, True)
    assert env.noted == [META] and env.reset_to == [META]
    assert env.handler.matched == [(9, -1)]
    assert r.installs == 1 and r.progress() == (-1, 0, 0)


def test_a_snapshot_the_log_already_holds_is_answered_done_at_once() -> None:
    """a log that holds the snapshot's last entry matches the leader's through there."""
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    held = SnapshotMeta(1, 1, env.store.chain_at(1), PEERS, {"a": FileInfo(10, 1)}, next_pos=0)
    r.handle(_chunk(held, 0, b"x" * 10, committed=5), b"x" * 10, "h")
    a = env.answer("h")
    assert a.code == ResponseCode.SUCCESS and a.done
    assert not env.chunks and env.handler.matched == [(1, 5)]


def test_a_snapshot_that_differs_from_a_committed_entry_is_refused() -> None:
    """committed entries are never replaced (Log Matching / Leader Completeness)."""
    env = ReceiverEnv()
    env.store.set_committed(2)
    r = SnapshotReceiver(env)
    other = SnapshotMeta(1, 1, env.store.chain_at(1) ^ 1, PEERS, {"a": FileInfo(10, 1)}, next_pos=0)
    with pytest.raises(DLedgerError) as e:
        r.handle(_chunk(other, 0, b"x" * 10), b"x" * 10, "o")
    assert e.value.code == ResponseCode.INCONSISTENT_STATE
    assert not env.chunks


def test_a_chunk_that_cannot_be_written_is_refused_and_the_copy_dropped() -> None:
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    r.handle(_chunk(META, 0, b"x" * CHUNK), b"x" * CHUNK, "c0")
    r.on_chunk_installed("c0", META, 0, False, "OSError: [Errno 28] No space left on device")
    assert env.answer("c0").code == ResponseCode.DISK_FULL
    assert r.progress() == (-1, 0, 0)


def test_a_request_of_a_refused_leader_is_answered_with_the_refusal() -> None:
    env = ReceiverEnv()
    r = SnapshotReceiver(env)
    r.handle(_chunk(META, 0, b"x" * CHUNK, term=2), b"x" * CHUNK, "old")
    assert env.answer("old").code == ResponseCode.EXPIRED_TERM and not env.chunks


# --- term checks (the elector's, through a Node) ---------------------------------------------------


def test_a_receiver_refuses_a_chunk_of_an_older_term() -> None:
    m = Member(self_id="n1", terms=[1, 2])
    m.node.member.set_term(4)
    a = m.handle(RequestCode.INSTALL_SNAPSHOT, _chunk(META, 0, b"x" * CHUNK, term=3), b"x" * CHUNK)
    assert isinstance(a, InstallSnapshotResponse) and a.code == ResponseCode.EXPIRED_TERM and a.term == 4


def test_a_chunk_of_a_newer_term_makes_its_sender_our_leader() -> None:
    m = Member(self_id="n1", terms=[1, 2])
    m.handle(RequestCode.INSTALL_SNAPSHOT, _chunk(META, 0, b"x" * CHUNK, term=5), b"x" * CHUNK)
    assert m.node.member.term == 5 and m.node.member.leader_id == "n0"
    assert m.node.receiver.progress() == (9, 0, META.size)
