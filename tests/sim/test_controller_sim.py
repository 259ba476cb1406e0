"""The controller's state machine under the simulator's fault schedules (issue 13): every
member applies it, clients send a mix of controller requests made from members' (often stale)
views, and docs/controller.md's guarantees are checked at every apply on every member."""

from __future__ import annotations

import pytest

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller import processor
from dledger.controller.elect_policy import LiveInfo
from dledger.sim import controller as sim_controller
from dledger.sim.schedule import run_seed
from dledger.statemachine.api import AppliedEntry

pytestmark = pytest.mark.sim


def test_controller_seeds_keep_the_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    referees: list[sim_controller.Referee] = []
    made = sim_controller.Referee.machine

    def machine(self: sim_controller.Referee) -> sim_controller.CheckedController:
        if self not in referees:
            referees.append(self)
        return made(self)

    monkeypatch.setattr(sim_controller.Referee, "machine", machine)
    for seed in range(985_000, 985_040):
        report = run_seed(seed, 14, "controller")
        assert report.ok, (report.summary(), report.violations, report.trace[-30:])
    outcomes: dict[str, int] = {}
    for r in referees:
        for kind, n in r.outcomes.items():
            outcomes[kind] = outcomes.get(kind, 0) + n
    # the workload reaches the interesting cases, not only refusals
    for kind in ("AlterSyncStateSet:0", "AlterSyncStateSet:2000", "AlterSyncStateSet:2001", "ElectMaster:0",
                 "ElectMaster:2004", "ApplyBrokerId:0", "ApplyBrokerId:2014", "CleanBrokerData:0"):
        assert outcomes.get(kind, 0) > 0, (kind, outcomes)


def _entry(index: int, req: m.WriteRequest, alive: tuple[int, ...] = (1, 2)) -> AppliedEntry:
    return AppliedEntry(index, 1, m.encode(m.Command(req, {"b": {i: LiveInfo() for i in alive}})))


def test_the_checks_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that forgot the epoch fencing is caught: its stale alter succeeds."""
    referee = sim_controller.Referee()
    sm = referee.machine()
    entries = [_entry(0, m.ApplyBrokerId("c", "b", 1, "h1;1")), _entry(1, m.ApplyBrokerId("c", "b", 2, "h2;2")),
               _entry(2, m.ElectMaster("c", "b", 1)), _entry(3, m.AlterSyncStateSet("b", 1, 1, [1, 2], 1))]
    sm.apply(entries)
    assert not referee.violations
    stale = _entry(4, m.AlterSyncStateSet("b", 1, 1, [1], 1))  # epoch 1 is gone: 2 is current
    assert m.decode_response(sm.apply([stale])[0]).code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    real = processor._alter_sync_state_set

    def unfenced(state: object, req: m.AlterSyncStateSet, alive: object) -> processor.Outcome:
        s = sm.state.get(req.broker_name)
        assert s is not None
        return real(sm.state, m.AlterSyncStateSet(req.broker_name, s.master_id or 0, s.master_epoch,
                                                  req.sync_state_set, s.sync_state_set_epoch), {1: LiveInfo()})

    monkeypatch.setattr(processor, "_alter_sync_state_set", unfenced)
    sm.apply([_entry(5, m.AlterSyncStateSet("b", 1, 1, [1], 1))])
    assert any("succeeded on" in v for v in referee.violations), referee.violations
    other = referee.machine()  # a member whose answer for an index differs is caught too
    other.apply([_entry(0, m.ApplyBrokerId("c", "b", 7, "h;7"))])
    assert any("answers differ" in v for v in referee.violations)
