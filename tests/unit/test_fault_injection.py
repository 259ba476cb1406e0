"""Fault injection lives behind one FaultInjector, built only with --enable-fault-injection
(runtime/faults.py): without it nothing on the request path consults one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dledger.broker.config import BrokerConfig
from dledger.broker.server import BrokerServer
from dledger.config import DLedgerConfig
from dledger.runtime.faults import FaultInjector
from dledger.runtime.server import DLedgerServer


def test_a_member_drops_traffic_to_and_from_the_ids_of_its_group_only() -> None:
    f = FaultInjector()
    f.set_member("g", ["n1"], False, ["127.0.0.1:9001"])
    assert f.drops_from("g", "n1") and not f.drops_from("g", "n2") and not f.drops_from("g", "")
    assert not f.drops_from("other", "n1")
    assert f.drops_to("g", "n1", handover=False) and f.drops_to("g", "n1", handover=True)
    assert not f.drops_to("g", "n2", handover=False)
    assert f.is_blocked("127.0.0.1:9001")
    f.set_member("g", [], False, [])  # heals
    assert not f.drops_from("g", "n1") and not f.drops_to("g", "n1", False) and not f.is_blocked("127.0.0.1:9001")


def test_spare_handover_drops_at_its_own_door_and_still_hands_over() -> None:
    f = FaultInjector()
    f.set_member("g", ["n1"], True, ["127.0.0.1:9001"])
    assert f.drops_from("g", "n1") and f.drops_to("g", "n1", handover=False)
    assert not f.drops_to("g", "n1", handover=True)
    assert not f.is_blocked("127.0.0.1:9001")  # its client is not cut: only this member drops


def _member(tmp_path: Path, enabled: bool) -> DLedgerConfig:
    return DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1", store_dir=str(tmp_path),
                         store_type="memory", enable_fault_injection=enabled)


def test_a_member_builds_an_injector_only_when_enabled(tmp_path: Path) -> None:
    async def build(enabled: bool) -> DLedgerServer:
        return DLedgerServer(_member(tmp_path, enabled))

    assert asyncio.run(build(False)).faults is None
    assert isinstance(asyncio.run(build(True)).faults, FaultInjector)


def _broker(tmp_path: Path, enabled: bool) -> BrokerServer:
    cfg = BrokerConfig(cluster="c", name="b0", controller="127.0.0.1:1", listen="127.0.0.1:1",
                       ha_listen="127.0.0.1:2", store_dir=str(tmp_path / "b"), enable_fault_injection=enabled)
    return BrokerServer(cfg)


def test_a_broker_builds_an_injector_only_when_enabled(tmp_path: Path) -> None:
    broker = _broker(tmp_path, False)
    try:
        assert broker.faults is None and broker.ha._faults is None
        assert broker.controller._transport._faults is None  # its controller client consults nothing
    finally:
        broker.store.close()
    broker = _broker(tmp_path, True)
    try:
        assert isinstance(broker.faults, FaultInjector) and broker.ha._faults is broker.faults
    finally:
        broker.store.close()
