"""Idempotent producers under the simulator's faults (sim.producers): no body stored twice."""

from __future__ import annotations

import logging
import os

import pytest

from dledger.core import producers
from dledger.sim.producers import SimProducers
from dledger.sim.schedule import run_seed

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("DLEDGER_SIM_SEEDS", "500")) // 2
CHUNK = 50


@pytest.mark.parametrize("start", range(0, SEEDS, CHUNK))
def test_producers_store_each_body_once(start: int) -> None:
    logging.disable(logging.CRITICAL)
    try:
        failures = [f"{r.summary()}: {r.violations[:3]}" for seed in range(start, min(start + CHUNK, SEEDS))
                    if not (r := run_seed(seed, idempotent=True)).ok]
    finally:
        logging.disable(logging.NOTSET)
    assert not failures, "replay with: python -m dledger.sim --idempotent --start SEED --seeds 1 --trace\n" + \
        "\n".join(failures)


def test_the_checker_catches_a_leader_that_forgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without deduplication the same seeds store bodies twice: the check is not vacuous,
    and the schedules do retry unknown outcomes and answer duplicates."""
    answered: list[int] = []
    check = SimProducers.check

    def counting(self: SimProducers, leader: str) -> list[str]:
        answered.append(self.duplicates_answered)
        return check(self, leader)

    monkeypatch.setattr(SimProducers, "check", counting)
    logging.disable(logging.CRITICAL)
    try:
        assert all(run_seed(s, idempotent=True).ok for s in range(60))
        assert sum(answered) > 10
        monkeypatch.setattr(producers.ProducerTable, "decide",
                            lambda self, view, producer, seq, n: producers.Decision(0))
        assert not all(run_seed(s, idempotent=True).ok for s in range(60))
    finally:
        logging.disable(logging.NOTSET)
