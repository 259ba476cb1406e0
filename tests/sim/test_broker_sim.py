"""Controllers and a broker set under seeded faults (issue 14): kills, power losses,
partitions (a master cut off from the controllers but not its slaves), slow disks, lost
controller replies, controller failovers, a master and the controller leader lost together.
The invariants of sim.brokers are checked after every event."""

from __future__ import annotations

import pytest

from dledger.sim.brokers import BrokerSim, run_broker_seed

pytestmark = pytest.mark.sim


def test_broker_seeds_keep_the_invariants() -> None:
    acked = truncations = 0
    for seed in range(990_000, 990_025):
        report = run_broker_seed(seed)
        assert report.ok, (report.summary(), report.violations, report.trace[-40:])
        acked += report.acked
        truncations += sum("truncated" in t or "power loss" in t for t in report.trace)
    assert acked > 10_000  # the workload is real: sends were acknowledged through the faults
    assert truncations > 0


def test_a_broken_rule_is_caught() -> None:
    """The checks can fail: a master that acknowledges without waiting for its slaves breaks
    the all-ack invariant at once."""
    sim = BrokerSim(990_000)
    for b in sim.brokers.values():
        original = b.settle

        def careless(b=b, original=original) -> None:  # type: ignore[no-untyped-def]
            r = b.replica
            if r.master_ha is not None:
                r.master_ha.acked = lambda next_offset, need: True
            original()

        b.settle = careless  # type: ignore[method-assign]
    report = sim.run()
    assert not report.ok and any("not on SyncStateSet member" in v for v in report.violations)
