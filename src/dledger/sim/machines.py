"""State machines in the simulator (docs/state-machines.md): each member's KV store (or none: a plain log),
its worker (the node's Apply / RunQuery / TakeSnapshot / InstallChunk / RestoreSnapshot
actions run as events, in order, a few ms each) and its snapshots (kept in memory, written
whole or not at all: a crash before the worker's event loses the snapshot, as a crash before
the rename does on disk; a snapshot being received from the leader is lost with a crash, as
the file store deletes a `.tmp-` install at start). A leader's snapshot chunks are read from
the same memory (ReadChunk).

Invariant: two members that applied up to the same index hold the same state.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dledger.kv.machine import KVStateMachine
from dledger.membership import Membership
from dledger.statemachine.api import AppliedEntry, MemoryReader, MemoryWriter, StateMachine
from dledger.statemachine.applier import Applier
from dledger.statemachine.snapshot import PRODUCERS_FILE, FileInfo, SnapshotMeta

KEEP = 2


@dataclass
class SimSnapshot:
    meta: SnapshotMeta
    files: dict[str, bytes] = field(default_factory=dict)

    def stream(self) -> bytes:
        return b"".join(self.files[n] for n in sorted(self.files))


MachineFactory = Callable[[], StateMachine]


def kv_machine() -> StateMachine:
    return KVStateMachine()


def state_digest(sm: StateMachine) -> int:
    """The whole state as one number (to compare members at the same applied index)."""
    if isinstance(sm, KVStateMachine):
        return hash(tuple(sm.dump()))
    dump = getattr(sm, "dump", None)
    if dump is None:
        raise TypeError(f"{type(sm).__name__} has no dump() to compare members by")
    return hash(dump())


class SimMachines:
    """The state machines (made by `factory`; without one, plain logs) of a SimCluster's
    members, their snapshots, and the checks on them."""

    def __init__(self, ids: list[str], rng: random.Random, factory: MachineFactory | None = kv_machine) -> None:
        self.rng = rng
        self.factory = factory
        self.sms: dict[str, StateMachine] = {}
        self.snapshots: dict[str, list[SimSnapshot]] = {i: [] for i in ids}
        self.worker_free: dict[str, int] = {i: 0 for i in ids}
        self._digests: dict[int, tuple[str, int]] = {}  # applied index -> (member, state digest)
        self._sinks: dict[str, tuple[SnapshotMeta, bytearray]] = {}  # snapshots being received
        self.installs = 0  # snapshots adopted from a leader (reports)

    def add(self, member: str) -> None:
        """A new member (a learner joining the group), with nothing yet."""
        self.snapshots.setdefault(member, [])
        self.worker_free.setdefault(member, 0)

    def start(self, member: str) -> tuple[Applier | None, SnapshotMeta | None, bytes | None]:
        """A (re)started member: its newest snapshot restored, the log after it to apply; the
        snapshot's meta and producer table (for the node)."""
        self._sinks.pop(member, None)
        snaps = self.snapshots[member]
        snap = snaps[-1] if snaps else None
        meta = snap.meta if snap is not None else None
        producers = snap.files.get(PRODUCERS_FILE) if snap is not None else None
        if self.factory is None:
            return None, meta, producers
        sm = self.factory()
        sm.restore(MemoryReader(snap.files) if snap is not None else None)
        self.sms[member] = sm
        start = snap.meta.last_index if snap is not None else -1
        return Applier(start, start), meta, producers

    def work_at(self, member: str, now: int) -> int:
        """When the member's worker runs its next action (after the one before: in order)."""
        at = max(now, self.worker_free[member]) + self.rng.randint(0, 3)
        self.worker_free[member] = at
        return at

    def apply(self, member: str, entries: Sequence[AppliedEntry]) -> list[bytes]:
        return list(self.sms[member].apply(entries))

    def query(self, member: str, request: bytes) -> bytes:
        return self.sms[member].query(request)

    def snapshot(self, member: str, index: int, term: int, chain_crc: int, next_pos: int, members: str | Membership,
                 keep: tuple[int, ...] = (), producers: bytes = b"", config_index: int = -1) -> SnapshotMeta:
        w = MemoryWriter()
        if self.factory is not None:
            self.sms[member].snapshot(w)
        if producers:
            w.files[PRODUCERS_FILE] = producers
        files = {n: FileInfo(len(b), zlib.crc32(b)) for n, b in w.files.items()}
        meta = SnapshotMeta(index, term, chain_crc, members, files, next_pos=next_pos, config_index=config_index)
        self._keep(member, SimSnapshot(meta, w.files), keep)
        return meta

    def _keep(self, member: str, snap: SimSnapshot, pinned: tuple[int, ...] = ()) -> None:
        """The KEEP newest, and those pinned (being sent), as SnapshotStore.prune."""
        snaps = [s for s in self.snapshots[member] if s.meta.last_index != snap.meta.last_index]
        snaps.append(snap)
        snaps.sort(key=lambda s: s.meta.last_index)
        self.snapshots[member] = [s for k, s in enumerate(snaps) if k >= len(snaps) - KEEP
                                  or s.meta.last_index in pinned]

    # --- InstallSnapshot ---------------------------------------------------------------------

    def read_chunk(self, member: str, meta: SnapshotMeta, offset: int, max_bytes: int) -> tuple[bytes, int, str]:
        """(data, crc, error) as the runtime's reader thread answers."""
        snap = next((s for s in self.snapshots[member] if s.meta == meta), None)
        if snap is None:
            return b"", 0, f"snapshot {meta.last_index} is gone"
        data = snap.stream()[offset : offset + max_bytes]
        return data, zlib.crc32(data), ""

    def install_chunk(self, member: str, meta: SnapshotMeta, offset: int, data: bytes | memoryview,
                      crc: int) -> tuple[int, bool]:
        """As the runtime's InstallSink: the next offset wanted, and whether it is whole."""
        sink = self._sinks.get(member)
        if sink is None or sink[0] != meta:
            sink = self._sinks[member] = (meta, bytearray())
        buf = sink[1]
        if offset == len(buf) and zlib.crc32(data) == crc and offset + len(data) <= meta.size:
            buf += data
        if len(buf) < meta.size:
            return len(buf), False
        del self._sinks[member]
        files, pos = {}, 0
        for name in sorted(meta.files):
            info = meta.files[name]
            files[name] = bytes(buf[pos : pos + info.size])
            pos += info.size
            assert zlib.crc32(files[name]) == info.crc32, f"{member}: installed file {name} fails its CRC"
        self._keep(member, SimSnapshot(meta, files))
        self.installs += 1
        return len(buf), True

    def drop_install(self, member: str) -> None:
        self._sinks.pop(member, None)

    def restore_installed(self, member: str, meta: SnapshotMeta) -> bytes | None:
        """Restore the state machine; the snapshot's producer table."""
        snap = next(s for s in self.snapshots[member] if s.meta == meta)
        if self.factory is not None:
            self.sms[member].restore(MemoryReader(snap.files))
        return snap.files.get(PRODUCERS_FILE)

    def digest(self, member: str) -> int:
        return state_digest(self.sms[member])

    def check(self, member: str, applied: int) -> str | None:
        """Two members at the same applied index hold the same state; a violation, or None."""
        d = state_digest(self.sms[member])
        seen = self._digests.setdefault(applied, (member, d))
        if seen[1] != d:
            return f"{member} and {seen[0]} hold different states at applied index {applied}"
        return None

    @property
    def kv(self) -> bool:
        """Members apply their logs to state machines (not only plain logs)."""
        return self.factory is not None
