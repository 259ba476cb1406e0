"""State machines in the simulator (issue 12): each member's KV store, its worker (the node's
Apply / RunQuery / TakeSnapshot actions run as events, in order, a few ms each) and its
snapshots (kept in memory, written whole or not at all: a crash before the worker's event
loses the snapshot, as a crash before the rename does on disk).

Invariant: two members that applied up to the same index hold the same state.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from dledger.kv.machine import KVStateMachine
from dledger.statemachine.api import AppliedEntry, SnapshotReader, SnapshotWriter
from dledger.statemachine.applier import Applier

KEEP = 2


class _Buffer(io.BytesIO):
    def __init__(self, files: dict[str, bytes], name: str) -> None:
        super().__init__()
        self._files, self._name = files, name

    def close(self) -> None:
        if not self.closed:
            self._files[self._name] = self.getvalue()
        super().close()


class _Writer(SnapshotWriter):
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def open(self, name: str) -> BinaryIO:
        return _Buffer(self.files, name)


class _Reader(SnapshotReader):
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def names(self) -> list[str]:
        return sorted(self.files)

    def open(self, name: str) -> BinaryIO:
        return io.BytesIO(self.files[name])


@dataclass
class SimSnapshot:
    index: int
    term: int
    chain_crc: int
    files: dict[str, bytes] = field(default_factory=dict)


class SimMachines:
    """The state machines of a SimCluster's members, and the checks on them."""

    def __init__(self, ids: list[str], rng: random.Random) -> None:
        self.rng = rng
        self.sms: dict[str, KVStateMachine] = {}
        self.snapshots: dict[str, list[SimSnapshot]] = {i: [] for i in ids}
        self.worker_free: dict[str, int] = {i: 0 for i in ids}
        self._digests: dict[int, tuple[str, int]] = {}  # applied index -> (member, state digest)

    def start(self, member: str) -> Applier:
        """A (re)started member: its newest snapshot restored, the log after it to apply."""
        sm = KVStateMachine()
        snaps = self.snapshots[member]
        snap = snaps[-1] if snaps else None
        sm.restore(_Reader(snap.files) if snap is not None else None)
        self.sms[member] = sm
        start = snap.index if snap is not None else -1
        return Applier(start, start)

    def work_at(self, member: str, now: int) -> int:
        """When the member's worker runs its next action (after the one before: in order)."""
        at = max(now, self.worker_free[member]) + self.rng.randint(0, 3)
        self.worker_free[member] = at
        return at

    def apply(self, member: str, entries: Sequence[AppliedEntry]) -> list[bytes]:
        return list(self.sms[member].apply(entries))

    def query(self, member: str, request: bytes) -> bytes:
        return self.sms[member].query(request)

    def snapshot(self, member: str, index: int, term: int, chain_crc: int) -> None:
        w = _Writer()
        self.sms[member].snapshot(w)
        snaps = self.snapshots[member]
        snaps.append(SimSnapshot(index, term, chain_crc, w.files))
        snaps.sort(key=lambda s: s.index)
        del snaps[:-KEEP]

    def check(self, member: str, applied: int) -> str | None:
        """Two members at the same applied index hold the same state; a violation, or None."""
        digest = hash(tuple(self.sms[member].dump()))
        seen = self._digests.setdefault(applied, (member, digest))
        if seen[1] != digest:
            return f"{member} and {seen[0]} hold different states at applied index {applied}"
        return None

    def size(self, member: str) -> int:
        return len(self.sms[member])
