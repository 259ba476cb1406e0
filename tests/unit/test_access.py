"""Every request code a server answers names the roles that may send it (docs/security.md, "Roles").

The servers are built for real (a member with the controller service attached, a broker) and
their handler registries compared with their access tables: a code added without an entry
fails here, and so does an entry without a handler.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger.broker.config import BrokerConfig
from dledger.broker.server import BROKER_ACCESS, BrokerServer
from dledger.codes import RequestCode
from dledger.config import DLedgerConfig
from dledger.controller.config import ControllerConfig
from dledger.controller.machine import ControllerStateMachine
from dledger.controller.service import CONTROLLER_ACCESS, ControllerService
from dledger.core.messages import REQUEST_TYPES, LeadershipTransferRequest
from dledger.runtime.access import RAFT_ACCESS, content_refusal
from dledger.runtime.server import DLedgerServer
from dledger.security.roles import ANONYMOUS, AccessRole, Principal, Tokens, cert_principal, roles_of_units


def test_every_group_protocol_code_has_an_entry_and_nothing_else_does() -> None:
    assert set(REQUEST_TYPES) == set(RAFT_ACCESS)
    assert RequestCode.AUTH not in RAFT_ACCESS  # the transport's own gate, before any role


def test_a_member_with_the_controller_service_registers_every_code_with_its_roles(tmp_path: Path) -> None:
    cfg = DLedgerConfig(group="controller", self_id="c0", peers="c0-127.0.0.1:1", store_dir=str(tmp_path),
                        store_type="memory")

    async def build() -> DLedgerServer:
        server = DLedgerServer(cfg, {"controller": ControllerStateMachine()})
        ControllerService(server, "controller", ControllerConfig(), ControllerStateMachine())
        return server

    server = asyncio.run(build())
    registered = set(REQUEST_TYPES) | set(server.services)
    assert registered == set(server.access)
    assert set(server.services) == set(CONTROLLER_ACCESS)
    with pytest.raises(ValueError, match="access entry"):
        server.register_service({59_999: lambda *_: None}, {})


def test_a_broker_serves_exactly_the_codes_of_its_table(tmp_path: Path) -> None:
    cfg = BrokerConfig(cluster="c", name="b0", controller="127.0.0.1:1", listen="127.0.0.1:1",
                       ha_listen="127.0.0.1:2", store_dir=str(tmp_path / "b"))
    broker = BrokerServer(cfg)
    try:
        assert set(broker._dispatch) == set(BROKER_ACCESS)
    finally:
        broker.store.close()


def test_roles_come_from_the_certificate_units() -> None:
    assert roles_of_units([]) == (frozenset({AccessRole.CLIENT}), "")  # no role unit: a client only
    assert roles_of_units(["member", "controller"]) == (frozenset({AccessRole.MEMBER, AccessRole.CONTROLLER}), "")
    assert roles_of_units(["broker:b0"]) == (frozenset({AccessRole.BROKER}), "b0")
    assert roles_of_units(["Member", "root", "broker:"]) == (frozenset({AccessRole.CLIENT}), "")  # exact values only
    p = cert_principal({"subject": ((("organizationalUnitName", "admin"),), (("commonName", "ops"),)),
                        "subjectAltName": (("DNS", "ops"), ("IP Address", "127.0.0.1"))})
    assert p.name == "ops" and p.has(AccessRole.ADMIN) and p.has(AccessRole.CLIENT) and not p.has(AccessRole.MEMBER)
    assert p.names == frozenset({"ops"}) and p.bound
    assert not cert_principal(None).roles


def test_tokens_make_principals_by_role() -> None:
    alone = dict(Tokens.of("c").principals())
    assert alone[b"c"].roles == frozenset(AccessRole)  # one shared token: every role, as before roles
    three = dict(Tokens.of("c", "client-secret", "admin-secret").principals())
    assert three[b"c"].has(AccessRole.MEMBER) and not three[b"c"].has(AccessRole.CLIENT)
    assert three[b"client-secret"].roles == frozenset({AccessRole.CLIENT})
    assert three[b"admin-secret"].has(AccessRole.CLIENT) and not three[b"admin-secret"].has(AccessRole.MEMBER)
    assert not any(p.bound for p in three.values())


def test_a_transfer_is_a_members_hand_over_or_an_admins_request() -> None:
    client = Principal("app", frozenset({AccessRole.CLIENT}))
    member = Principal("n0", frozenset({AccessRole.MEMBER}), frozenset({"n0"}))
    admin = Principal("ops", frozenset({AccessRole.ADMIN}))
    ask = LeadershipTransferRequest("g", transferee_id="n1")
    hand_over = LeadershipTransferRequest("g", "n0", "n1", transfer_id="n0", transferee_id="n1")
    code = RequestCode.LEADERSHIP_TRANSFER
    assert "admin" in (content_refusal(code, ask, client) or "")
    assert content_refusal(code, ask, admin) is None
    assert "member" in (content_refusal(code, hand_over, admin) or "")
    assert content_refusal(code, hand_over, member) is None
    assert content_refusal(code, hand_over, ANONYMOUS) is None  # no TLS, no token: every role
