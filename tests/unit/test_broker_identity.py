"""Broker registration with a persistent id (ReplicasManagerRegisterTest's scenarios), and the
controller's lease bookkeeping for brokers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger.broker.identity import METADATA_FILE, TEMP_FILE, IdentityError, RegisterState, Registration
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller.heartbeats import HeartbeatTable
from dledger.controller.messages import Response


class FakeController:
    """Answers the three registration requests; `fail` names the step that fails."""

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.applied: list[tuple[int, str]] = []

    async def get_next_broker_id(self, cluster: str, broker: str) -> Response:
        if self.fail == "next":
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "down")
        return Response(next_broker_id=len(self.applied) + 1)

    async def apply_broker_id(self, cluster: str, broker: str, broker_id: int, check_code: str) -> Response:
        if self.fail == "apply":
            return Response(int(RC.CONTROLLER_BROKER_ID_INVALID), "taken")
        if self.fail == "apply-lost":
            raise DLedgerError(ResponseCode.TIMEOUT, "no answer")
        self.applied.append((broker_id, check_code))
        return Response()

    async def register_broker(self, cluster: str, broker: str, broker_id: int, address: str) -> Response:
        if self.fail == "register":
            return Response(int(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED), "no")
        return Response(master_broker_id=None)


def register(reg: Registration, controller: FakeController) -> bool:
    return asyncio.run(reg.register(controller))  # type: ignore[arg-type]


def test_register_success_and_restart_keeps_the_id(tmp_path: Path) -> None:
    c = FakeController()
    reg = Registration(tmp_path, "C", "b0", "127.0.0.1:1|127.0.0.1:2")
    assert register(reg, c) and reg.state == RegisterState.REGISTERED and reg.broker_id == 1
    assert (tmp_path / METADATA_FILE).read_text() == "C#b0#1" and not (tmp_path / TEMP_FILE).exists()
    again = Registration(tmp_path, "C", "b0", "127.0.0.1:9|127.0.0.1:10")  # a new address, the same id
    assert again.state == RegisterState.CREATE_METADATA_FILE_DONE and again.broker_id == 1
    assert register(again, c) and len(c.applied) == 1


def test_restart_with_changed_config_is_refused(tmp_path: Path) -> None:
    assert register(Registration(tmp_path, "C", "b0", "a"), FakeController())
    with pytest.raises(IdentityError, match="configured as cluster 'C' broker 'b1'"):
        Registration(tmp_path, "C", "b1", "a")
    with pytest.raises(IdentityError):
        Registration(tmp_path, "D", "b0", "a")


def test_failed_at_get_next_broker_id(tmp_path: Path) -> None:
    reg = Registration(tmp_path, "C", "b0", "a")
    with pytest.raises(DLedgerError):
        register(reg, FakeController("next"))
    assert reg.state == RegisterState.INITIAL and not list(tmp_path.iterdir())


def test_failed_apply_deletes_the_temp_file(tmp_path: Path) -> None:
    reg = Registration(tmp_path, "C", "b0", "a")
    assert not register(reg, FakeController("apply"))
    assert reg.state == RegisterState.INITIAL and not (tmp_path / TEMP_FILE).exists()


def test_lost_apply_answer_retries_with_the_same_check_code(tmp_path: Path) -> None:
    reg = Registration(tmp_path, "C", "b0", "a")
    with pytest.raises(DLedgerError):
        register(reg, FakeController("apply-lost"))
    assert reg.state == RegisterState.CREATE_TEMP_METADATA_FILE_DONE
    code = (tmp_path / TEMP_FILE).read_text().split("#")[3]
    c = FakeController()
    assert register(Registration(tmp_path, "C", "b0", "a"), c)  # after a restart too
    assert c.applied == [(1, code)]


def test_failed_register_keeps_the_metadata_file(tmp_path: Path) -> None:
    reg = Registration(tmp_path, "C", "b0", "a")
    assert not register(reg, FakeController("register"))
    assert reg.state == RegisterState.CREATE_METADATA_FILE_DONE and (tmp_path / METADATA_FILE).exists()


def test_a_leased_master_outlives_its_closed_connection() -> None:
    t = HeartbeatTable(default_timeout_ms=1500, lease_drift_ms=200)
    t.beat("C", "b0", 1, "a", now_ms=1000, conn="x", lease_ms=1000)
    t.beat("C", "b0", 2, "b", now_ms=1000, conn="y")
    assert t.connection_closed("y", 1000) == [("b0", 2)]  # no lease: gone at once
    assert t.connection_closed("x", 1000) == []  # a lease: alive until it surely ended
    assert t.alive("b0", 1, 1000 + 1200)
    assert not t.alive("b0", 1, 1000 + 1201)
    assert t.expire(2300) == [("b0", 1)]


def test_a_lease_stretches_a_short_heartbeat_timeout() -> None:
    t = HeartbeatTable(default_timeout_ms=500, lease_drift_ms=200)
    t.beat("C", "b0", 1, "a", now_ms=0, lease_ms=1000)
    assert t.alive("b0", 1, 1200) and not t.alive("b0", 1, 1201)
