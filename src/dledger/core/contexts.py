"""What the node hands the runtime with a request it sends, and gets back with the answer.

`Send.ctx` is one of the contexts below, returned untouched with the answer
(`Answered`, `Node.complete`), and `ReadChunk.ctx` a `ChunkCtx`; the node routes each by its class
(`match`), and each part checks it against its own state (term, round, epoch), so a late
answer to an earlier round, term or window is inert. Frozen: the runtime may keep one as long
as it likes. msgspec structs without GC tracking: one is built per push on the hot path.

The runtime's reports of work done (`Completion`, `Node.complete`) are the other input shape.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dledger.statemachine.snapshot import SnapshotMeta


class VoteCtx(msgspec.Struct, frozen=True, gc=False):
    round: int  # the elector's round: an answer to an earlier one is ignored
    pre_vote: bool
    peer: str


class HeartbeatCtx(msgspec.Struct, frozen=True, gc=False):
    peer: str
    term: int
    matched: int  # what the follower had acknowledged when we asked: its answer must not report less
    round: int  # ReadIndex's heartbeat round: a majority acknowledging it confirms waiting reads


class PushCtx(msgspec.Struct, frozen=True, gc=False):
    peer: str
    epoch: int  # the dispatcher's window: a reset makes answers of the old one inert
    seq: int  # an APPEND's place in the pipeline (0: COMPARE / TRUNCATE / COMMIT / REPAIR)
    kind: int  # PushType
    prev_index: int  # (REPAIR: the first index sent)
    term: int  # every term's dispatchers count epochs from 0


class TransferCtx(msgspec.Struct, frozen=True, gc=False):
    target: str
    term: int


class ReadIndexCtx(msgspec.Struct, frozen=True, gc=False):
    rid: int  # a follower read waiting for the leader's read index


class InstallCtx(msgspec.Struct, frozen=True, gc=False):
    peer: str
    epoch: int
    term: int
    last_index: int  # the snapshot being sent
    offset: int  # of this chunk


class MembersCtx(msgspec.Struct, frozen=True, gc=False):
    """A MEMBERS question to a member we know (core.config_probe)."""

    round: int
    peer: str


class ChunkCtx(msgspec.Struct, frozen=True, gc=False):
    """A snapshot chunk the leader asked the runtime to read (`ReadChunk`)."""

    epoch: int
    last_index: int
    offset: int


Context = VoteCtx | HeartbeatCtx | PushCtx | TransferCtx | ReadIndexCtx | InstallCtx | MembersCtx


# --- completions: the runtime's reports of work the node asked for --------------------------


class Answered(msgspec.Struct, frozen=True, gc=False):
    """The answer to one of our Sends (`resp` None: timeout or network failure)."""

    ctx: Context
    resp: Any  # a response struct, or None


class ChunkRead(msgspec.Struct, frozen=True, gc=False):
    """A ReadChunk done: `data` and its CRC, or `error`."""

    peer: str
    ctx: ChunkCtx
    data: bytes
    crc: int
    error: str


class ChunkInstalled(msgspec.Struct, frozen=True, gc=False):
    """An InstallChunk written (`done`: the snapshot is whole and in place), or `error`."""

    token: Any
    meta: SnapshotMeta
    next_offset: int
    done: bool
    error: str


class Applied(msgspec.Struct, frozen=True, gc=False):
    """The Apply batch in flight was applied: one result per entry."""

    results: list[bytes]


class ApplyFailed(msgspec.Struct, frozen=True, gc=False):
    reason: str


class SnapshotTaken(msgspec.Struct, frozen=True, gc=False):
    """A TakeSnapshot done (`meta`), or failed (`error`)."""

    index: int
    error: str
    meta: SnapshotMeta | None = None


class Restored(msgspec.Struct, frozen=True, gc=False):
    """A RestoreSnapshot done (or failed: `error`); `producers`: the snapshot's PRODUCERS_FILE."""

    meta: SnapshotMeta
    error: str
    producers: bytes | None = None


class Durable(msgspec.Struct, frozen=True, gc=False):
    """The flush thread made entries through `index` durable (a hint: the store's own value counts)."""

    index: int


Completion = Answered | ChunkRead | ChunkInstalled | Applied | ApplyFailed | SnapshotTaken | Restored | Durable
