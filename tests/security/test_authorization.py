"""What an authenticated party may ask (issue 26): roles on certificates and tokens, and a
member without either serving loopback only unless --insecure.

Real member processes; requests are raw frames sent with whatever credential the attacker
holds: a client certificate, an admin's, a member's, a client or admin token. Each refusal
is 430 naming the missing role, and nothing refused changes a term or a log.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import msgspec
import pytest

from dledger.broker.local import local_broker_cluster
from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.controller import messages as cm
from dledger.controller.client import ControllerClient
from dledger.core.messages import (
    AppendRequest,
    FaultRequest,
    GetRequest,
    HeartBeatRequest,
    InstallSnapshotRequest,
    LeadershipTransferRequest,
    MetadataRequest,
    PushRequest,
    QueryRequest,
    ReadIndexRequest,
    ReadRequest,
    SnapshotRequest,
    VoteRequest,
    encode,
)
from dledger.ports import free_port_run, free_ports
from dledger.runtime.client import DLedgerClient
from dledger.runtime.transport import Message, TransportClient
from dledger.security.certs import make_certs
from dledger.security.peer_uid import LOOPBACK_ONLY, OTHER_USER
from dledger.security.tls import client_context
from integration.harness import Cluster, MakeCluster, wait_until

from .test_authentication import address_of, send, terms, tls_of

pytestmark = pytest.mark.integration


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    make_certs(d, ["n0", "n1", "n2"], hosts=["127.0.0.1"], clients=["client", "other"], admins=["admin"])
    return d


def answer(address: str, code: int, meta: bytes, *, ctx: object = None, token: bytes | None = None) -> tuple[int, str]:
    """One raw request: the answer's code and its text (the transport's error for none)."""
    import asyncio

    async def go() -> tuple[int, str]:
        t = TransportClient(ssl=ctx, auth_token=token, connect_timeout_s=5)  # type: ignore[arg-type]
        try:
            m = await t.request(address, Message(code, meta), 10.0)
        except DLedgerError as e:
            return int(e.code), e.message
        finally:
            await t.close()
        decoded = msgspec.msgpack.decode(m.meta) if m.meta else None
        text = decoded.get("error", "") if isinstance(decoded, dict) else ""
        return m.code, str(text)

    return asyncio.run(go())


def member_requests(c: Cluster, leader: str, target: str, term: int) -> dict[str, tuple[int, bytes]]:
    """One of every member message, as the leader would send it to `target`."""
    g = c.group
    return {
        "VOTE": (RequestCode.VOTE, encode(VoteRequest(g, leader, target, term + 1000, 10**6, term + 1000))),
        "HEART_BEAT": (RequestCode.HEART_BEAT, encode(HeartBeatRequest(g, leader, target, 2**62 - 1))),
        "PUSH": (RequestCode.PUSH, encode(PushRequest(g, leader, target, term, 2, 10**6, term))),
        "TRUNCATE": (RequestCode.PUSH, encode(PushRequest(g, leader, target, term + 1, 1, 0, 0))),
        "INSTALL_SNAPSHOT": (RequestCode.INSTALL_SNAPSHOT, encode(InstallSnapshotRequest(
            g, leader, target, term, 1_000_000, term))),
        "READ_INDEX": (RequestCode.READ_INDEX, encode(ReadIndexRequest(g, leader, target))),
    }


def test_a_client_certificate_may_read_and_write_and_nothing_else(make_cluster: MakeCluster, certs: Path) -> None:
    c = make_cluster(3, tls_dir=certs)
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    client = c.client()
    first = client.append(b"acknowledged")
    before, end = terms(c), c.leader_meta().ledger_end_index
    as_client = client_context(tls_of(certs))
    for name, (code, meta) in member_requests(c, leader, follower, before[leader]).items():
        got, text = answer(address_of(c, follower), code, meta, ctx=as_client)
        assert got == ResponseCode.UNAUTHENTICATED and "needs the member role" in text, (name, got, text)
        assert "CN=client" in text, text
    g = c.group
    for name, code, meta in [
        ("SNAPSHOT", RequestCode.SNAPSHOT, encode(SnapshotRequest(g))),
        ("FAULT", RequestCode.FAULT, encode(FaultRequest(g, blocked=[follower]))),
        ("LEADERSHIP_TRANSFER", RequestCode.LEADERSHIP_TRANSFER,
         encode(LeadershipTransferRequest(g, transferee_id=follower))),
    ]:
        got, text = answer(address_of(c, leader), code, meta, ctx=as_client)
        assert got == ResponseCode.UNAUTHENTICATED and "needs the admin" in text, (name, got, text)
    got, text = answer(address_of(c, leader), 59_999, b"", ctx=as_client)
    assert got == ResponseCode.UNSUPPORTED, (got, text)
    assert terms(c) == before, "a refused request moved a term"
    assert c.leader_meta().ledger_end_index == end, "a refused request changed the log"
    assert client.get(first.index).body == b"acknowledged"
    # what a client is for, it may do
    read = encode(ReadRequest(g, from_index=first.index))
    assert answer(address_of(c, leader), RequestCode.READ, read, ctx=as_client)[0] == ResponseCode.SUCCESS


def test_an_admin_certificate_steers_but_cannot_speak_as_a_member(make_cluster: MakeCluster, certs: Path) -> None:
    c = make_cluster(3, tls_dir=certs)
    leader = c.wait_leader()
    target = next(m for m in c.ids if m != leader)
    before = terms(c)
    as_admin = client_context(tls_of(certs, "admin"))
    for name, (code, meta) in member_requests(c, leader, target, before[leader]).items():
        got, text = answer(address_of(c, target), code, meta, ctx=as_admin)
        assert got == ResponseCode.UNAUTHENTICATED and "member role" in text, (name, got, text)
    assert terms(c) == before
    with c.client(role="admin") as admin:  # the operator's hand-over works
        admin.transfer_leadership(target)
    assert wait_until(lambda: c.agreed_leader() == target, 30, "the transfer")
    with c.client() as client, pytest.raises(DLedgerError) as e:  # not a client's
        client.transfer_leadership(leader)
    assert e.value.code == ResponseCode.UNAUTHENTICATED and "needs the admin" in e.value.message


def test_tokens_give_their_roles(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, auth_token="cluster-secret",
                     extra=["--client-token", "client-secret", "--admin-token", "admin-secret"])
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    before = terms(c)
    g = c.group
    with DLedgerClient(c.peers, g, timeout=5.0, auth_token="client-secret") as client:
        r = client.append(b"with the client token")
        assert client.get(r.index).body == b"with the client token"
        with pytest.raises(DLedgerError) as e:
            client.transfer_leadership(follower)
        assert e.value.code == ResponseCode.UNAUTHENTICATED and "client token" in e.value.message
    for name, (code, meta) in member_requests(c, leader, follower, before[leader]).items():
        for token in (b"client-secret", b"admin-secret"):
            got, text = answer(address_of(c, follower), code, meta, token=token)
            assert got == ResponseCode.UNAUTHENTICATED and "member role" in text, (name, token, got, text)
    got, _ = answer(address_of(c, leader), RequestCode.SNAPSHOT, encode(SnapshotRequest(g)), token=b"client-secret")
    assert got == ResponseCode.UNAUTHENTICATED
    assert terms(c) == before
    with DLedgerClient(c.peers, g, timeout=10.0, auth_token="admin-secret") as admin:
        admin.transfer_leadership(follower)
    assert wait_until(lambda: c.agreed_leader() == follower, 30, "the admin token's transfer")
    assert send(address_of(c, leader), RequestCode.APPEND, b"", token=b"guess") == ResponseCode.UNAUTHENTICATED


def _outside_address() -> str | None:
    """An address of this machine that is not a loopback one (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.mark.parametrize("insecure", [False, True])
def test_without_tls_or_a_token_only_loopback_is_served(tmp_path: Path, insecure: bool) -> None:
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback")
    port, metrics = free_ports(2)
    cmd = [sys.executable, "-m", "dledger", "server", "--id", "n0", "--peers", f"n0-0.0.0.0:{port}",
           "--store-dir", str(tmp_path / "n0"), "--store", "memory", "--metrics-port", str(metrics),
           *(["--insecure"] if insecure else [])]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with DLedgerClient(f"n0-127.0.0.1:{port}", timeout=30) as local:
            assert local.append(b"from loopback").index >= 0
            assert local.metadata("n0").security == ("insecure" if insecure else "loopback")
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert f'dledger_insecure{{group="default",member="n0"}} {1.0 if insecure else 0.0}' in scraped
        got, text = answer(f"{outside}:{port}", RequestCode.METADATA, encode(ReadRequest("default")))
        if insecure:
            assert got == ResponseCode.UNEXPECTED_ARGUMENT or got == ResponseCode.SUCCESS, (got, text)
        else:
            assert got == ResponseCode.UNAUTHENTICATED and text == LOOPBACK_ONLY, (got, text)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert ("INSECURE" in err) == insecure, err
    assert ("loopback addresses only" in err) != insecure, err


def test_a_producer_belongs_to_its_principal_and_its_markers_stay_hidden(make_cluster: MakeCluster,
                                                                        certs: Path) -> None:
    """A victim's producer id, appended under by another certificate at its next sequence,
    made the victim's next append be acknowledged with the attacker's index and never
    stored; and a READ with only_normal=false showed every producer's id and sequence."""
    c = make_cluster(3, tls_dir=certs)
    leader = c.wait_leader()
    with DLedgerClient(c.peers, c.group, timeout=10.0, tls=tls_of(certs), idempotent=True,
                       producer_id="orders-7") as victim:
        first = victim.append(b"victim 0")
        with DLedgerClient(c.peers, c.group, timeout=10.0, tls=tls_of(certs, "other"), idempotent=True,
                           producer_id="orders-7") as attacker, pytest.raises(DLedgerError) as e:
            attacker.append(b"attacker 0")
        assert e.value.code == ResponseCode.PRODUCER_NOT_OWNED, e.value
        second = victim.append(b"victim 1")
    with c.client() as reader:
        assert reader.get(second.index).body == b"victim 1"
        entries = [x for x in reader.read(first.index - 1, 100) if x.index >= first.index - 1]
    assert [x.body for x in entries if x.body.startswith(b"victim")] == [b"victim 0", b"victim 1"]
    read_all = encode(ReadRequest(c.group, from_index=0, only_normal=False))
    got, _ = answer(address_of(c, leader), RequestCode.READ, read_all, ctx=client_context(tls_of(certs)))
    assert got == ResponseCode.SUCCESS
    with DLedgerClient(c.peers, c.group, timeout=10.0, tls=tls_of(certs)) as plain:
        shown = plain._run(plain._async.read(0, 1000, only_normal=False))
    assert shown and not [x for x in shown if b"orders-7" in x.body], "a session marker reached a client"


def test_a_broker_without_tls_serves_loopback_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The broker's client port answers another host's request 430 and closes; its HA port
    closes such a connection before any handshake; loopback is served (and says how)."""
    import asyncio

    from dledger.broker import messages as bm
    from dledger.broker.config import BrokerConfig
    from dledger.broker.server import BrokerServer

    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback")
    port, ha_port = free_ports(2)
    cfg = BrokerConfig(cluster="c", name="b0", controller="127.0.0.1:1", listen=f"0.0.0.0:{port}",
                       ha_listen=f"0.0.0.0:{ha_port}", store_dir=str(tmp_path / "b0"))

    async def main() -> None:
        broker = BrokerServer(cfg)
        await broker.start()
        t = TransportClient(connect_timeout_s=5)
        try:
            info = await t.request(f"127.0.0.1:{port}", Message(RequestCode.GET_BROKER_RUNTIME_INFO), 10)
            assert info.code == ResponseCode.SUCCESS
            assert msgspec.msgpack.decode(info.meta, type=bm.RuntimeInfo).security == "loopback"
            refused = await t.request(f"{outside}:{port}", Message(RequestCode.GET_BROKER_RUNTIME_INFO), 10)
            assert refused.code == ResponseCode.UNAUTHENTICATED and LOOPBACK_ONLY.encode() in refused.meta
            for host in ("127.0.0.1", outside):
                reader, writer = await asyncio.open_connection(host, ha_port)
                with contextlib.suppress(ConnectionError):  # closed (not master: there is no controller)
                    assert await asyncio.wait_for(reader.read(), 10) == b""
                writer.close()
            lines = [r.getMessage() for r in caplog.records if "HA connection refused" in r.getMessage()]
            assert len(lines) == 1 and outside in lines[0], lines  # the other host's, not loopback's
        finally:
            await t.close()
            await broker.stop()

    asyncio.run(main())


_RAW_CLIENT = """
import socket, struct, sys
family, host = {"4": (socket.AF_INET, "127.0.0.1"), "6": (socket.AF_INET6, "::ffff:127.0.0.1"),
                "v6": (socket.AF_INET6, "::1")}[sys.argv[2]]
s = socket.socket(family, socket.SOCK_STREAM)
s.settimeout(10)
s.connect((host, int(sys.argv[1])))
meta = bytes([0x91, 0xa7]) + b"default"  # a METADATA request naming group "default"
s.sendall(struct.pack(">IBQiI", 17 + len(meta), 0, 1, 50000, len(meta)) + meta)
head = b""
while len(head) < 21:
    head += s.recv(21 - len(head))
length, kind, rid, code, mlen = struct.unpack(">IBQiI", head)
body = b""
while len(body) < length - 17:
    body += s.recv(length - 17 - len(body))
print(code, body[:mlen].decode("utf-8", "replace"))
"""


@pytest.mark.skipif(not hasattr(os, "setuid") or os.getuid() != 0 or not Path("/proc/net/tcp").exists(),
                    reason="needs root (to connect as another user) and Linux's /proc/net/tcp")
@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"])
def test_without_tls_or_a_token_another_users_loopback_connection_is_refused(tmp_path: Path, host: str) -> None:
    """Loopback mode trusts this machine's processes of the member's own user (they could as
    well write its store); another user's process gets 430, as from another host. On IPv6
    loopback too (its sockets are in /proc/net/tcp6)."""
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "dledger", "server", "--id", "n0", "--peers", f"n0-{host}:{port}",
           "--store-dir", str(tmp_path / "n0"), "--store", "memory"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with DLedgerClient(f"n0-{host}:{port}", timeout=30) as own:
            assert own.append(b"from this user").index >= 0

        def as_nobody() -> None:
            os.setgid(65534)
            os.setuid(65534)

        python = next((x for x in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(x).exists()), None)
        if python is None:
            pytest.skip("no Python another user may run (the venv's is under /root)")
        # (an IPv6 socket to ::ffff:127.0.0.1 is listed in the other table)
        for family in ("4", "6") if host == "127.0.0.1" else ("v6",):
            out = subprocess.run([python, "-c", _RAW_CLIENT, str(port), family], capture_output=True, text=True,
                                 timeout=60, preexec_fn=as_nobody, cwd="/")
            code, _, text = out.stdout.strip().partition(" ")
            assert code == str(int(ResponseCode.UNAUTHENTICATED)) and OTHER_USER in text, (family, out)
    finally:
        p.terminate()
        p.wait(30)


def test_the_controller_group_serves_no_client_its_log(tmp_path: Path) -> None:
    """The controller's log is its own (sealed): no client certificate, nor an admin's,
    appends to it, reads it (certificate names, addresses) or queries it with a hand-made
    command past the controller's role checks; METADATA and the controller's requests
    still work."""
    import asyncio

    with local_broker_cluster(tmp_path, controllers=1, broker_sets=1, replicas=1, base_port=free_port_run(3),
                              tls_dir=tmp_path / "tls") as d:
        assert d.tls is not None and d.admin_tls is not None
        group, address = "controller", d.controller
        forged = cm.encode(cm.Command(cm.GetNextBrokerId("DefaultCluster", "b0")))
        data_plane = {
            "APPEND": (RequestCode.APPEND, encode(AppendRequest(group, bodies=[b"x"]))),
            "GET": (RequestCode.GET, encode(GetRequest(group, index=0))),
            "GET_FOLLOWER": (RequestCode.GET, encode(GetRequest(group, index=0, follower_read=True))),
            "READ": (RequestCode.READ, encode(ReadRequest(group, from_index=0))),
            "READ_LOCAL": (RequestCode.READ, encode(ReadRequest(group, from_index=0, local=True))),
            "QUERY": (RequestCode.QUERY, encode(QueryRequest(group, request=forged))),
        }

        async def ask(tls: object, code: int, meta: bytes) -> Message:
            t = TransportClient(ssl=client_context(tls), connect_timeout_s=5)  # type: ignore[arg-type]
            try:
                return await t.request(address, Message(code, meta), 10.0)
            finally:
                await t.close()

        for who in (d.tls, d.admin_tls):
            for name, (code, meta) in data_plane.items():
                got = asyncio.run(ask(who, code, meta))
                assert got.code == ResponseCode.UNSUPPORTED, (name, got.code)
                assert b"members only" in bytes(got.meta), (name, bytes(got.meta))
                assert b"CN=" not in bytes(got.meta) + bytes(got.data), name
            got = asyncio.run(ask(who, RequestCode.METADATA, encode(MetadataRequest(group))))
            assert got.code == ResponseCode.SUCCESS

        async def controller_metadata() -> bool:
            async with ControllerClient(d.controller, timeout=10.0, tls=d.tls) as c:
                return any(not isinstance(v, str) and v.is_leader for v in (await c.metadata()).values())

        assert asyncio.run(controller_metadata())
        assert d.master_of("b0")  # the controller still serves its brokers
