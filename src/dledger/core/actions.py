"""What a Node asks its driver to do (`Node.drain()`): send, reply, and the jobs of the worker
thread, each reported back as a core.contexts.Completion (`Node.complete`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from dledger.core.contexts import ChunkCtx, Context
from dledger.membership import Membership
from dledger.statemachine.applier import ApplyBatch
from dledger.statemachine.snapshot import SnapshotMeta


@dataclass(slots=True)
class Send:
    peer: str
    code: int
    msg: msgspec.Struct
    data: bytes | memoryview
    ctx: Context  # handed back with the answer (core.contexts.Answered)
    timeout_ms: int


@dataclass(slots=True)
class Reply:
    token: Any
    code: int  # the request code, to pick the response type
    msg: msgspec.Struct
    data: bytes = b""


@dataclass(slots=True)
class Apply:
    """Apply these committed entries to the state machine, then report `Applied` (or `ApplyFailed`)."""

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
    actions only), then report `SnapshotTaken`. Without a state machine the snapshot is empty."""

    index: int
    term: int
    chain_crc: int
    next_pos: int  # where record index + 1 starts (or would): a follower installing it continues there
    keep: tuple[int, ...] = ()  # snapshots being sent to followers: not pruned
    producers: bytes = b""  # the producer table (core.producers): the snapshot's PRODUCERS_FILE
    members: Membership | None = None  # the configuration at `index` (the snapshot meta's `members`)
    config_index: int = -1  # its CONFIG_CHANGE entry (-1: the command line's peers)


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
