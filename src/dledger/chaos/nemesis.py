"""The nemesis: faults drawn from a seed and applied one at a time to a running group.

Every fault draws the same number of values from `random.Random(seed)` whatever
happens at run time (who leads, how much data a member holds), so a seed always
replays the same schedule of fault kinds, targets by draw, hold times and modes;
only the run-time facts (which member leads) can differ between replays.

Faults are sequential: one is applied, held, healed, then a quiet gap follows.
A torn write is the exception that needs care: it destroys a member's records
past its checkpoint's trusted point, which may include entries that member had
acknowledged (async mode acks from the page cache; and in sync mode the trusted
point lags what was fsynced). Raft survives losing them on one member only if no
second failure follows before that member is whole again, so the torn member is
a follower and the nemesis waits until it has caught up before the next fault.
Bytes up to the trusted point are never touched: they were fsynced, and the
store rightly refuses to start (DISK_ERROR) when they are damaged.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.chaos.harness import Harness
from dledger.chaos.proxy import Mode

log = logging.getLogger(__name__)

Record = Callable[[dict[str, Any]], None]

_HEADER = struct.Struct(">iiqqqiIIi")  # docs/format.md: magic, size, index, term, pos, channel, chain/body crc, size
_ENTRY_MAGICS = (1, 2, 3, 4)
_BLANK = -1

FAULTS_ANY = ("kill-random", "kill-leader", "pause-random", "pause-leader", "partition-halves",
              "partition-leader", "bridge", "torn-write", "slow-links", "one-way-leader", "transfer-leader",
              "transfer-cut-off")
FAULTS_5 = ("majority-ring",)


def fault_kinds(nodes: int) -> tuple[str, ...]:
    """The faults that mean something for a group of `nodes` members (a ring of three
    members is full connectivity)."""
    return FAULTS_ANY + (FAULTS_5 if nodes >= 5 else ())


@dataclass
class FaultLog:
    kind: str
    start: float
    end: float | None
    members: list[str]
    detail: dict[str, Any]


# --- torn writes ---------------------------------------------------------------------------------------------


def _data_files(store_dir: Path) -> list[tuple[int, Path]]:
    d = store_dir / "data"
    if not d.is_dir():
        return []
    return sorted((int(p.name), p) for p in d.iterdir() if p.name.isdigit() and len(p.name) == 20)


def _read_at(files: list[tuple[int, Path]], size: int, pos: int, n: int) -> tuple[int, bytes] | None:
    """(file start, up to n bytes at logical `pos`, never past its file end)."""
    for start, path in files:
        if start <= pos < start + size:
            with open(path, "rb") as f:
                f.seek(pos - start)
                return start, f.read(min(n, start + size - pos))
    return None


def written_range(store_dir: Path) -> tuple[int, int, int, int] | None:
    """For a stopped member: (trusted_end, write_end, last_file_start, file_size).

    trusted_end is the end of the checkpoint's trusted record (the log begin when there
    is none); write_end follows well-formed record headers (and file-closing blanks) from
    there, i.e. the end of what the member wrote. None when it has no data file."""
    files = _data_files(store_dir)
    if not files:
        return None
    size = files[0][1].stat().st_size
    try:
        ckpt = json.loads((store_dir / "checkpoint").read_bytes())
    except (OSError, ValueError):
        ckpt = {}
    trusted = ckpt.get("trusted") if isinstance(ckpt, dict) else None
    pos = int(ckpt.get("begin_pos", files[0][0])) if isinstance(ckpt, dict) else files[0][0]
    if isinstance(trusted, dict):
        got = _read_at(files, size, int(trusted["pos"]), _HEADER.size)
        if got is None or len(got[1]) < _HEADER.size:
            raise ValueError(f"{store_dir}: trusted record at {trusted['pos']} is not in the data files")
        h = _HEADER.unpack(got[1])
        pos = int(trusted["pos"]) + h[1]
    trusted_end = pos
    while True:
        got = _read_at(files, size, pos, _HEADER.size)
        if got is None or len(got[1]) < 8:
            break
        start, b = got
        magic, rsize = struct.unpack_from(">ii", b)
        if magic == _BLANK and rsize == start + size - pos:
            pos = start + size
            continue
        if len(b) < _HEADER.size or magic not in _ENTRY_MAGICS or rsize < _HEADER.size:
            break
        h = _HEADER.unpack(b)
        if h[4] != pos or pos + rsize > start + size:
            break
        pos += rsize
    write_end = pos
    last_start = max((s for s, _ in files if s < write_end), default=files[0][0])
    return trusted_end, write_end, last_start, size


def tear(store_dir: Path, rng: random.Random) -> dict[str, Any]:
    """Zero or garble a stopped member's last data file from a random offset after the
    trusted record's end to the end of written data, as a torn write would leave it."""
    wr = written_range(store_dir)
    if wr is None:
        return {"cut": False, "why": "no data file"}
    trusted_end, write_end, last_start, _ = wr
    lo, hi = max(trusted_end, last_start), write_end
    how = rng.choice(("zero", "garble"))
    if hi <= lo:
        return {"cut": False, "why": "nothing written after the trusted point", "trusted_end": trusted_end}
    at = rng.randrange(lo, hi)
    n = hi - at
    data = bytes(n) if how == "zero" else rng.randbytes(n)
    path = store_dir / "data" / f"{last_start:020d}"
    with open(path, "r+b") as f:
        f.seek(at - last_start)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    log.info("tore %s: %s %d bytes from offset %d (trusted end %d, written end %d)",
             path, how, n, at - last_start, trusted_end, write_end)
    return {"cut": True, "how": how, "file": path.name, "offset": at - last_start, "bytes": n,
            "trusted_end": trusted_end, "write_end": write_end}


# --- the schedule --------------------------------------------------------------------------------------------------


def draw_fault(rng: random.Random, ids: list[str], kinds: tuple[str, ...]) -> tuple[float, str, dict[str, Any]]:
    """The quiet gap before the next fault, its kind and its parameters. Every fault draws
    the same values, used or not, so the schedule of a seed never depends on run time."""
    quiet = rng.uniform(1.0, 2.5)
    kind = rng.choice(kinds)
    order = list(ids)
    rng.shuffle(order)
    params = {
        "pick": rng.random(),  # which member, by position in a list known only at run time
        "order": order,  # partitions, bridge and ring are cut from this order
        "hold": rng.uniform(1.5, 4.0),
        "down": rng.uniform(0.3, 2.5),
        "pause": rng.uniform(1.5, 3.0),
        "mode": rng.choice(("refuse", "blackhole")),
        "delay": rng.uniform(0.05, 0.4),
        "sub_seed": rng.getrandbits(32),  # a torn write's offset and bytes
    }
    return quiet, kind, params


def preview(seed: int, nodes: int, count: int, kinds: tuple[str, ...] | None = None) -> list[str]:
    """The first `count` fault kinds a seed schedules (how many fit in a run depends on time)."""
    rng = random.Random(seed)
    ids = [f"n{k}" for k in range(nodes)]
    return [draw_fault(rng, ids, kinds or fault_kinds(nodes))[1] for _ in range(count)]


# --- the nemesis -------------------------------------------------------------------------------------------------


class Nemesis:
    """Runs the seeded fault schedule against `harness` until `duration` has passed."""

    def __init__(self, harness: Harness, seed: int, record: Record, clock: Callable[[], float],
                 kinds: tuple[str, ...] | None = None, catch_up_bound_s: float = 30.0) -> None:
        self.h = harness
        self.seed = seed
        self.rng = random.Random(seed)
        self.record = record
        self.clock = clock
        self.kinds = kinds or fault_kinds(len(harness.ids))
        self.catch_up_bound_s = catch_up_bound_s
        self.faults: list[FaultLog] = []
        self.stop_event = threading.Event()

    # --- schedule ------------------------------------------------------------------------------------------

    def run(self, duration: float) -> None:
        end = self.clock() + duration
        while not self.stop_event.is_set():
            quiet, kind, params = draw_fault(self.rng, self.h.ids, self.kinds)
            if self.clock() + quiet >= end:
                break
            self._sleep(quiet)
            self.h.check_crashes()
            self._apply(kind, params)
            self.h.check_crashes()
        self.heal_all()

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)

    def _pick(self, params: dict[str, Any], among: list[str]) -> str:
        return among[min(len(among) - 1, int(params["pick"] * len(among)))]

    def _leader_or_pick(self, params: dict[str, Any]) -> tuple[str, bool]:
        lead = self.h.leader()
        if lead is not None:
            return lead, True
        return self._pick(params, list(self.h.ids)), False

    def _target(self, kind: str, params: dict[str, Any]) -> tuple[str, bool]:
        """The leader for "-leader" faults (a drawn member when none is known), else a
        drawn member; and whether the target is the leader as far as we know."""
        if kind.endswith("-leader"):
            return self._leader_or_pick(params)
        target = self._pick(params, list(self.h.ids))
        return target, target == self.h.leader()

    def _start(self, kind: str, members: list[str], **detail: Any) -> FaultLog:
        f = FaultLog(kind, self.clock(), None, members, detail)
        self.faults.append(f)
        log.info("fault %s on %s %s", kind, members, detail)
        self.record({"kind": "nemesis", "fault": kind, "phase": "start", "time": f.start,
                     "members": members, "detail": detail})
        return f

    def _end(self, f: FaultLog, **detail: Any) -> None:
        f.end = self.clock()
        f.detail.update(detail)
        self.record({"kind": "nemesis", "fault": f.kind, "phase": "end", "time": f.end,
                     "members": f.members, "detail": detail})

    # --- faults ----------------------------------------------------------------------------------------------

    def _apply(self, kind: str, p: dict[str, Any]) -> None:
        ids = list(self.h.ids)
        if kind in ("kill-random", "kill-leader"):
            target, is_leader = self._target(kind, p)
            f = self._start(kind, [target], was_leader=is_leader, down_s=round(p["down"], 3))
            self.h.kill(target, signal.SIGKILL)
            self._sleep(p["down"])
            self.h.start(target)
            self._end(f)
        elif kind in ("pause-random", "pause-leader"):
            target, is_leader = self._target(kind, p)
            f = self._start(kind, [target], was_leader=is_leader, pause_s=round(p["pause"], 3))
            self.h.pause(target)
            self._sleep(p["pause"])
            self.h.resume(target)
            self._end(f)
        elif kind == "partition-halves":
            order: list[str] = p["order"]
            k = len(order) // 2
            self._partition(kind, [order[:k], order[k:]], p)
        elif kind == "partition-leader":
            alone, _ = self._leader_or_pick(p)
            self._partition(kind, [[alone], [m for m in ids if m != alone]], p)
        elif kind == "bridge":
            order = p["order"]
            mid = len(order) // 2
            left, bridge, right = order[:mid], order[mid], order[mid + 1:]
            allowed = _pairs([*left, bridge]) + _pairs([bridge, *right])
            f = self._start(kind, order, left=left, bridge=bridge, right=right, mode=p["mode"],
                            hold_s=round(p["hold"], 3))
            self._hold_links(f, allowed, p)
        elif kind == "majority-ring":
            order = p["order"]
            allowed = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]
            f = self._start(kind, order, ring=order, mode=p["mode"], hold_s=round(p["hold"], 3))
            self._hold_links(f, allowed, p)
        elif kind == "torn-write":
            self._torn_write(p)
        elif kind == "one-way-leader":
            target, _ = self._leader_or_pick(p)
            f = self._start(kind, [target], mode=p["mode"], hold_s=round(p["hold"], 3))
            self.h.cut_outgoing(target, p["mode"])
            self._sleep(p["hold"])
            self.h.heal_links()
            self._end(f)
        elif kind == "transfer-leader":
            lead, known = self._leader_or_pick(p)
            target = self._pick(p, [m for m in ids if m != lead])
            f = self._start(kind, [lead, target], leader_known=known)
            error = self.h.transfer(lead, target)
            self._end(f, error=error)
        elif kind == "transfer-cut-off":
            self._transfer_cut_off(p)
        elif kind == "slow-links":
            target = self._pick(p, ids)
            f = self._start(kind, [target], delay_s=round(p["delay"], 3), hold_s=round(p["hold"], 3))
            self.h.slow(target, p["delay"])
            self._sleep(p["hold"])
            self.h.heal_links()
            self._end(f)
        else:
            raise ValueError(f"unknown fault {kind!r}")

    def _transfer_cut_off(self, p: dict[str, Any]) -> None:
        """A leadership transfer cut off mid-way: the leader sends its hand-over and hears
        nothing more; the target takes over at once, while the old leader believes it leads
        until its check-quorum (the window where `leader` reads are stale)."""
        lead, known = self._leader_or_pick(p)
        target = self._pick(p, [m for m in self.h.ids if m != lead])
        f = self._start("transfer-cut-off", [lead, target], leader_known=known, hold_s=round(p["hold"], 3))
        error = self.h.cut_off_but_handover(lead)
        transfer = threading.Thread(target=self.h.transfer, args=(lead, target), name="chaos-transfer", daemon=True)
        transfer.start()
        self._sleep(p["hold"])
        self.h.heal_member_faults(lead)
        transfer.join(20)
        self._end(f, error=error)

    def _partition(self, kind: str, sides: list[list[str]], p: dict[str, Any]) -> None:
        allowed = [pair for side in sides for pair in _pairs(side)]
        f = self._start(kind, [m for s in sides for m in s], sides=sides, mode=p["mode"],
                        hold_s=round(p["hold"], 3))
        self._hold_links(f, allowed, p)

    def _hold_links(self, f: FaultLog, allowed: list[tuple[str, str]], p: dict[str, Any]) -> None:
        mode: Mode = p["mode"]
        self.h.connect_only(allowed, mode)
        self._sleep(p["hold"])
        self.h.heal_links()
        self._end(f)

    def _torn_write(self, p: dict[str, Any]) -> None:
        lead = self.h.leader()
        followers = [m for m in self.h.ids if m != lead and self.h.members[m].running]
        if not followers:
            followers = [m for m in self.h.ids if m != lead] or list(self.h.ids)
        target = self._pick(p, followers)
        f = self._start("torn-write", [target], leader=lead, down_s=round(p["down"], 3))
        self.h.kill(target, signal.SIGKILL)
        try:
            cut = tear(self.h.members[target].store_dir, random.Random(p["sub_seed"]))
        except (OSError, ValueError) as e:
            cut = {"cut": False, "why": f"could not tear: {e}"}
        self.record({"kind": "nemesis", "fault": "torn-write", "phase": "cut", "time": self.clock(),
                     "members": [target], "detail": cut})
        self._sleep(p["down"])
        self.h.start(target)
        caught, waited = self._wait_caught_up(target)
        self._end(f, cut=cut, caught_up=caught, catch_up_s=round(waited, 3))

    def _wait_caught_up(self, member: str) -> tuple[bool, float]:
        """Until `member` holds everything the leader had committed when we started waiting."""
        t0 = self.clock()
        target: int | None = None
        while self.clock() - t0 < self.catch_up_bound_s and not self.stop_event.is_set():
            if not self.h.members[member].running:
                return False, self.clock() - t0
            if target is None:
                lead = self.h.leader()
                view = self.h.metadata(lead) if lead is not None else None
                if view is not None:
                    target = view.committed_index
            else:
                v = self.h.metadata(member)
                if v is not None and v.ledger_end_index >= target:
                    return True, self.clock() - t0
            time.sleep(0.1)
        return False, self.clock() - t0

    def heal_all(self) -> float:
        """End every fault: links pass, paused members resume, stopped members start."""
        self.h.heal_links()
        for m in self.h.ids:
            self.h.resume(m)
            self.h.heal_member_faults(m)
        for m in self.h.ids:
            if not self.h.members[m].running:
                self.h.start(m)
        t = self.clock()
        self.record({"kind": "nemesis", "fault": "heal-all", "phase": "end", "time": t, "members": list(self.h.ids),
                     "detail": {}})
        return t


def _pairs(members: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(members) for b in members[i + 1:]]
