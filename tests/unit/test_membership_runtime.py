"""The runtime follows the group's configuration (docs/operations.md): member addresses, the
member identities it accepts, and who may ask for or change the configuration.

The node keeping the configuration is the core's (core.membership); these tests hand the
runtime a configuration through its one accessor (`node_membership`) and check what the
runtime makes of it, against a real DLedgerServer on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.membership import ChangeMembersRequest, Membership, MembersRequest
from dledger.core.messages import VoteRequest, encode
from dledger.local_cluster import client_tls, local_certs
from dledger.ports import free_ports
from dledger.runtime.client import AsyncDLedgerClient
from dledger.runtime.members import MemberAddresses, node_membership
from dledger.runtime.server import DLedgerServer, GroupRuntime
from dledger.runtime.transport import Message, TransportClient
from dledger.security.tls import client_context

ADMIN, CLIENT, CLUSTER = "admin-secret", "client-secret", "cluster-secret"


def test_addresses_come_from_the_configuration_in_force_and_the_command_line_until_then() -> None:
    cfg = DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3",
                        peer_listen="n0-127.0.0.1:11;n1-127.0.0.1:12;n2-127.0.0.1:13", store_type="memory")
    a = MemberAddresses(cfg)
    assert a.ids() == ["n0", "n1", "n2"] and a.address_of("n1") == "127.0.0.1:12"  # the member listener
    assert a.client_address("n1") == "127.0.0.1:2" and a.address_of("n9") is None
    # n1 removed, n3 added as a learner, n2 moved: the configuration's addresses rule
    removed = a.update(Membership({"n0": "127.0.0.1:1", "n2": "127.0.0.1:33"}, {"n3": "127.0.0.1:4"}))
    assert removed == {"n1"}
    assert a.ids() == ["n0", "n2", "n3"]
    assert a.address_of("n0") == "127.0.0.1:11"  # its client address unchanged: still its peer_listen one
    assert a.address_of("n2") == "127.0.0.1:33" and a.address_of("n3") == "127.0.0.1:4"
    assert a.address_of("n1") is None and a.send_address("n1") == "127.0.0.1:12"  # a send under way ends
    assert a.member_addresses() == {"127.0.0.1:11": "n0", "127.0.0.1:33": "n2", "127.0.0.1:4": "n3"}
    assert a.peers_string() == "n0-127.0.0.1:1;n2-127.0.0.1:33;n3-127.0.0.1:4"
    a.update(Membership({"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"}))  # n1 back: no longer a former member
    assert a.former == {"n2": "127.0.0.1:33", "n3": "127.0.0.1:4"}


def test_the_accessor_reads_the_configuration_in_force_on_the_node() -> None:
    from dledger.core.node import Node
    from dledger.store.memory import MemoryLedgerStore

    cfg = DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1;n1-127.0.0.1:2", store_type="memory")
    assert node_membership(Node(cfg, MemoryLedgerStore(), 0)) == Membership({"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"})
    joined = Membership({"n1": "127.0.0.1:2"}, {"n0": "127.0.0.1:1"})  # --join: the group's answer
    assert node_membership(Node(cfg, MemoryLedgerStore(), 0, membership=joined)) == joined


def _token_config(tmp_path: Path, port: int) -> DLedgerConfig:
    return DLedgerConfig(group="g", self_id="n0", peers=f"n0-127.0.0.1:{port}", store_dir=str(tmp_path / "n0"),
                         store_type="memory", auth_token=CLUSTER, client_token=CLIENT, admin_token=ADMIN)


def test_only_an_admin_may_change_members_and_any_role_may_read_them(tmp_path: Path) -> None:
    """CHANGE_MEMBERS from a client's token is refused by the transport (430) before any node
    sees it; an admin's reaches the node (which answers it: UNSUPPORTED from a node without
    membership, the change itself from one with it). MEMBERS is read with a client's token."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    change = encode(ChangeMembersRequest("g", "", "", "add-learner", "n1", "127.0.0.1:1"))

    async def main() -> None:
        server = DLedgerServer(_token_config(tmp_path, port))
        await server.start()
        client, admin = TransportClient(auth_token=CLIENT.encode()), TransportClient(auth_token=ADMIN.encode())
        try:
            refused = await client.request(address, Message(RequestCode.CHANGE_MEMBERS, change), 10.0)
            assert refused.code == ResponseCode.UNAUTHENTICATED
            reached = await admin.request(address, Message(RequestCode.CHANGE_MEMBERS, change), 10.0)
            assert reached.code != ResponseCode.UNAUTHENTICATED
            assert b"unknown request code" not in bytes(reached.meta)  # the transport knows the code
            read = await client.request(address, Message(RequestCode.MEMBERS, encode(MembersRequest("g"))), 10.0)
            assert read.code != ResponseCode.UNAUTHENTICATED
            # the client API carries the response code
            async with AsyncDLedgerClient(f"n0-{address}", "g", timeout=5.0, auth_token=CLIENT) as c:
                with pytest.raises(DLedgerError) as e:
                    await c.add_learner("n1", "127.0.0.1:1")
                assert e.value.code == ResponseCode.UNAUTHENTICATED
                with pytest.raises(DLedgerError) as e:
                    await c.add_learner("n1", "no port")
                assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
        finally:
            await client.close()
            await admin.close()
            await server.stop()

    asyncio.run(main())


def test_a_member_removed_from_the_configuration_is_refused_and_cut_off(tmp_path: Path) -> None:
    """With TLS, member n1's messages are taken while n1 is in a configuration the node holds;
    once the node's configurations drop it (here: a snapshot's configuration replaces them, as
    an install would), its connection is closed and what it sends is refused (430). A learner
    the configuration adds shows in the status, as its sends go to it."""
    port, other = free_ports(2)
    certs = local_certs(tmp_path / "certs", members=["n0", "n1", "n2"])
    cfg = DLedgerConfig(group="g", self_id="n0", peers=f"n0-127.0.0.1:{port};n1-127.0.0.1:{other}",
                        store_dir=str(tmp_path / "n0"), store_type="memory", tls_cert=str(certs / "n0.pem"),
                        tls_key=str(certs / "n0-key.pem"), tls_ca=str(certs / "ca.pem"))
    address = f"127.0.0.1:{port}"
    n1_tls = client_tls(certs, "n1")
    assert n1_tls is not None

    async def vote(t: TransportClient) -> int:
        req = VoteRequest("g", "n1", "n0", term=1, ledger_end_index=-1, ledger_end_term=-1)
        return (await t.request(address, Message(RequestCode.VOTE, encode(req)), 10.0)).code

    async def main() -> None:
        server = DLedgerServer(cfg)
        await server.start()
        n1 = TransportClient(ssl=client_context(n1_tls))
        g: GroupRuntime = server.groups["g"]
        try:
            assert await vote(n1) != ResponseCode.UNAUTHENTICATED  # a member: the node answers
            g.node.configs.add(0, Membership({"n0": address, "n1": f"127.0.0.1:{other}"}, {"n2": "127.0.0.1:9"}))
            g._execute()
            assert g.status().members == (("n0", address), ("n1", f"127.0.0.1:{other}"), ("n2", "127.0.0.1:9"))
            assert g.address_of("n2") == "127.0.0.1:9"
            g.node.configs.reset(1, Membership({"n0": address}, {"n2": "127.0.0.1:9"}))
            g._execute()  # n1 removed: its connection is closed
            assert server.server is not None
            for _ in range(200):
                if server.server.connection_count == 0:
                    break
                await asyncio.sleep(0.05)
            assert server.server.connection_count == 0
            assert await vote(n1) == ResponseCode.UNAUTHENTICATED  # a new connection, refused
            assert g.member_ids() == ["n0", "n2"]
        finally:
            await n1.close()
            await server.stop()

    asyncio.run(main())


def test_a_client_follows_the_configuration_members_answer() -> None:
    """Members a member names join the client's peers; only a committed configuration the
    leader itself answered removes any."""
    from dledger.core.membership import MemberInfo, MembersResponse

    async def main() -> None:
        async with AsyncDLedgerClient("n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3", "g") as c:
            c.leader_id = "n0"
            new = [MemberInfo("n1", "127.0.0.1:2", True), MemberInfo("n2", "127.0.0.1:3", True),
                   MemberInfo("n3", "127.0.0.1:4", False)]
            seen = c._learn_members("n1", MembersResponse(200, "n1", 3, 9, True, new))  # n1 leads, n0 removed
            assert list(c.peers) == ["n1", "n2", "n3"] and c.leader_id is None
            assert [m.id for m in seen.learners] == ["n3"] and seen.members[0].leader
            # a follower's answer (or an uncommitted configuration) only adds
            more = [*new, MemberInfo("n4", "127.0.0.1:5", False)]
            c._learn_members("n2", MembersResponse(200, "n1", 3, 10, True, more[1:]))
            c._learn_members("n1", MembersResponse(200, "n1", 3, 11, False, more[2:]))
            assert list(c.peers) == ["n1", "n2", "n3", "n4"]
            c._learn_peers("n5-127.0.0.1:6;n1-127.0.0.1:2")  # a METADATA answer's peers: added
            assert c.peers_string() == ("n1-127.0.0.1:2;n2-127.0.0.1:3;n3-127.0.0.1:4;n4-127.0.0.1:5;"
                                        "n5-127.0.0.1:6")
            with pytest.raises(DLedgerError) as e:  # a member no longer known is not asked
                await c.members("n0")
            assert e.value.code == ResponseCode.UNKNOWN_MEMBER

    asyncio.run(main())


def test_with_tls_a_client_certificate_cannot_change_members_and_an_admins_reaches_the_node(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    certs = local_certs(tmp_path / "certs", members=["n0"])
    cfg = DLedgerConfig(group="g", self_id="n0", peers=f"n0-127.0.0.1:{port}", store_dir=str(tmp_path / "n0"),
                        store_type="memory", tls_cert=str(certs / "n0.pem"), tls_key=str(certs / "n0-key.pem"),
                        tls_ca=str(certs / "ca.pem"))
    address = f"127.0.0.1:{port}"
    change = encode(ChangeMembersRequest("g", "", "", "remove", "n0"))
    client_cert, admin_cert = client_tls(certs, "client"), client_tls(certs, "admin")
    assert client_cert is not None and admin_cert is not None

    async def main() -> None:
        server = DLedgerServer(cfg)
        await server.start()
        client = TransportClient(ssl=client_context(client_cert))
        admin = TransportClient(ssl=client_context(admin_cert))
        anonymous = TransportClient()  # no TLS at all
        try:
            refused = await client.request(address, Message(RequestCode.CHANGE_MEMBERS, change), 10.0)
            assert refused.code == ResponseCode.UNAUTHENTICATED and b"admin" in bytes(refused.meta)
            reached = await admin.request(address, Message(RequestCode.CHANGE_MEMBERS, change), 10.0)
            assert reached.code != ResponseCode.UNAUTHENTICATED
            read = await client.request(address, Message(RequestCode.MEMBERS, encode(MembersRequest("g"))), 10.0)
            assert read.code != ResponseCode.UNAUTHENTICATED
            try:  # plain text to a TLS member: refused, in words or by closing
                plain = await anonymous.request(address, Message(RequestCode.MEMBERS, encode(MembersRequest("g"))), 5.0)
            except DLedgerError:
                pass
            else:
                assert plain.code == ResponseCode.UNAUTHENTICATED
        finally:
            for t in (client, admin, anonymous):
                await t.close()
            await server.stop()

    asyncio.run(main())
