"""The controller's state machine under the simulator's fault schedules (docs/controller.md).

Every member applies `ControllerStateMachine` (`python -m dledger.sim --controller`); clients
append controller commands for a few broker sets: id applications, registrations, elections
of the three kinds, alters of the SyncStateSet with current or stale epochs (a master that
missed an election), cleans — each with liveness facts drawn by the seed, as a leader would
have written them. The commands are made from some member's applied state, so many are
valid and many are stale by the time they are applied.

Invariants (docs/controller.md, "What is guaranteed"), checked at every apply on every member, by `CheckedController`:
- a broker set's master epoch and SyncStateSet epoch never decrease;
- after a successful election or alter the master is in the SyncStateSet;
- an alter succeeds only if its master id, master epoch and SyncStateSet epoch were all
  current just before it was applied;
- every member that applied an entry made the same answer for it (and the simulator's own
  check: two members at the same applied index hold the same state).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller.elect_policy import LiveInfo
from dledger.controller.machine import ControllerStateMachine
from dledger.controller.state import BrokerSet
from dledger.statemachine.api import AppliedEntry

SETS = ("b0", "b1", "b2")
CHECK_CODES = ("a", "b")  # two brokers may race for one id with different check codes


class Referee:
    """What all members' checked machines report to: answers by index, and violations."""

    def __init__(self) -> None:
        self.answers: dict[int, bytes] = {}  # index -> the first answer made for it
        self.violations: list[str] = []
        self.outcomes: dict[str, int] = {}  # "Request:code" -> applies (every member's: to see the mix)

    def machine(self) -> CheckedController:
        return CheckedController(self)


class CheckedController(ControllerStateMachine):
    def __init__(self, referee: Referee) -> None:
        super().__init__()
        self.referee = referee

    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        out = []
        for e in entries:
            before = {n: _epochs(s) for n, s in self.state.sets.items()}
            (answer,) = super().apply([e])
            self._check(e, answer, before)
            out.append(answer)
        return out

    def dump(self) -> bytes:
        return self.state.dump()

    def _check(self, e: AppliedEntry, answer: bytes,
               before: dict[str, tuple[int, int, int | None, frozenset[int]]]) -> None:
        ref = self.referee
        first = ref.answers.setdefault(e.index, answer)
        if first != answer:
            ref.violations.append(f"entry {e.index}: answers differ between members")
        for name, bs in self.state.sets.items():
            old = before.get(name)
            if old is not None and (bs.master_epoch < old[0] or bs.sync_state_set_epoch < old[1]):
                ref.violations.append(f"entry {e.index}: {name}'s epochs went back from {old[:2]} to "
                                      f"{(bs.master_epoch, bs.sync_state_set_epoch)}")
        try:
            req = m.decode_command(e.body).request
        except m.DECODE_ERRORS:
            return
        resp = m.decode_response(answer)
        s = self.state.get(getattr(req, "broker_name", ""))
        kind = f"{type(req).__name__}:{resp.code}"
        ref.outcomes[kind] = ref.outcomes.get(kind, 0) + 1
        if resp.code != RC.SUCCESS or not isinstance(req, m.ElectMaster | m.AlterSyncStateSet):
            return
        if s is None or s.master_id not in s.sync_state_set:
            ref.violations.append(f"entry {e.index}: after a successful {type(req).__name__} the master "
                                  f"{s and s.master_id} is not in the SyncStateSet {s and s.sync_state_set}")
        if isinstance(req, m.AlterSyncStateSet):
            old = before.get(req.broker_name)
            current = (old[2], old[0], old[1]) if old is not None else None
            if current != (req.master_broker_id, req.master_epoch, req.sync_state_set_epoch):
                ref.violations.append(f"entry {e.index}: an alter with (master, epoch, sss epoch) "
                                      f"{(req.master_broker_id, req.master_epoch, req.sync_state_set_epoch)} "
                                      f"succeeded on {current}")


def _epochs(s: BrokerSet) -> tuple[int, int, int | None, frozenset[int]]:
    return s.master_epoch, s.sync_state_set_epoch, s.master_id, frozenset(s.sync_state_set)


def command(r: random.Random, view: ControllerStateMachine | None, unclean: bool) -> bytes:
    """One controller command for a random broker set, made from `view` (some member's
    applied state, possibly behind), with random liveness facts."""
    mastered = sorted(n for n, bs in view.state.sets.items() if bs.master_id is not None) if view else []
    x = r.random()
    name = r.choice(mastered) if mastered and 0.55 <= x < 0.98 and r.random() < 0.8 else r.choice(SETS)
    s = view.state.get(name) if view is not None else None
    ids = sorted(s.replicas) if s is not None and s.replicas else [1]
    alive = {i: LiveInfo(r.randint(0, 3), r.randint(0, 1 << 33), r.randint(0, 3))
             for i in range(1, 5) if r.random() < 0.7}
    req: m.WriteRequest
    if x < 0.2:
        nxt = s.next_assign_id if s is not None else 1
        i = nxt if r.random() < 0.8 else r.randint(1, 4)
        code = r.choice(CHECK_CODES)
        req = m.ApplyBrokerId("c", name, i, f"10.0.0.{i}:{code};{code}")
    elif x < 0.3:
        i = r.choice(ids)
        req = m.RegisterBroker("c", name, i, f"10.0.0.{i}:{r.choice(CHECK_CODES)}")
    elif x < 0.55:
        kind = r.random()
        if kind < 0.4:
            req = m.ElectMaster(broker_name=name)  # controller-triggered
        else:
            req = m.ElectMaster("c", name, r.choice([*ids, 9]), kind > 0.8)
    elif x < 0.98:
        req = _alter(r, name, s, ids)
    else:  # mostly some replicas; the whole set now and then
        req = m.CleanBrokerData("c", name, ";".join(str(i) for i in ids if r.random() < 0.3) or "9",
                                r.random() < 0.5)
    return m.encode(m.Command(req, {name: alive}, unclean))


def _alter(r: random.Random, name: str, s: BrokerSet | None, ids: list[int]) -> m.AlterSyncStateSet:
    """An alter as the master would send it, sometimes on stale epochs or by a stale master."""
    master = s.master_id if s is not None and s.master_id is not None else r.choice(ids)
    epoch = s.master_epoch if s is not None else 0
    sss_epoch = s.sync_state_set_epoch if s is not None else 0
    if r.random() < 0.3:
        epoch -= r.randint(0, 1)
        sss_epoch -= r.randint(0, 1)
        master = r.choice([*ids, master])
    members = set(s.sync_state_set) if s is not None else set()
    others = [i for i in ids if i != master]
    if others:  # widen or narrow by one replica, as a master does
        members ^= {r.choice(others)}
    if r.random() < 0.95:
        members.add(master)
    return m.AlterSyncStateSet(name, master, epoch, sorted(members), sss_epoch)
