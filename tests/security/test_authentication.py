"""Who may speak to a member (issue 11): mutual TLS, the shared token, the member listener.

Real groups of member processes; the attacks are raw frames, as in test_forged_messages, but
sent with whatever credentials the attacker could hold: none, a client certificate, another
member's certificate, a certificate of another CA, the wrong token.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.core.messages import HeartBeatRequest, LeadershipTransferRequest, encode
from dledger.local_cluster import client_tls
from dledger.ports import free_ports
from dledger.runtime.client import DLedgerClient
from dledger.runtime.transport import Message, TransportClient
from dledger.security.certs import make_certs
from dledger.security.tls import TlsConfig, client_context
from integration.harness import Cluster, MakeCluster

pytestmark = pytest.mark.integration


def address_of(c: Cluster, member: str, peers: str | None = None) -> str:
    entry = next(p for p in (peers or c.peers).split(";") if p.startswith(f"{member}-"))
    return entry.split("-", 1)[1]


def tls_of(certs: Path, name: str = "client") -> TlsConfig:
    tls = client_tls(certs, name)
    assert tls is not None
    return tls


def send(address: str, code: int, meta: bytes, *, ctx: ssl.SSLContext | None = None,
         token: bytes | None = None) -> int:
    """One request; the answer's code, or the transport's error code."""

    async def go() -> int:
        t = TransportClient(ssl=ctx, auth_token=token, connect_timeout_s=5)
        try:
            return (await t.request(address, Message(code, meta), 10.0)).code
        except DLedgerError as e:
            return int(e.code)
        finally:
            await t.close()

    return asyncio.run(go())


def forged_heartbeat(c: Cluster, sender: str, target: str, term: int) -> bytes:
    return encode(HeartBeatRequest(c.group, sender, target, term))


def terms(c: Cluster) -> dict[str, int]:
    out = {}
    for m in c.ids:
        v = c.meta(m)
        assert v is not None, f"{m} does not answer"
        out[m] = v.term
    return out


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    make_certs(d, ["n0", "n1", "n2"], hosts=["127.0.0.1"], clients=["client"])
    return d


def test_with_tls_only_the_named_member_may_send_member_messages(make_cluster: MakeCluster, certs: Path,
                                                                 tmp_path: Path) -> None:
    c = make_cluster(3, tls_dir=certs)
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    impostor = next(m for m in c.ids if m not in (leader, follower))
    client = c.client()
    r = client.append(b"over tls")
    assert client.get(r.index).body == b"over tls"
    before = terms(c)
    target = address_of(c, follower)
    hb = forged_heartbeat(c, leader, follower, max(before.values()) + 1000)

    # a client certificate of the group's CA cannot speak as the leader
    as_client = client_context(tls_of(certs))
    assert send(target, RequestCode.HEART_BEAT, hb, ctx=as_client) == ResponseCode.UNAUTHENTICATED
    # nor can another member's certificate
    as_impostor = client_context(tls_of(certs, impostor))
    assert send(target, RequestCode.HEART_BEAT, hb, ctx=as_impostor) == ResponseCode.UNAUTHENTICATED
    # without TLS (told so, and closed), or with a certificate of another CA, nothing gets through
    assert send(target, RequestCode.HEART_BEAT, hb) == ResponseCode.UNAUTHENTICATED
    other = tmp_path / "other-ca"
    make_certs(other, ["n0", "n1", "n2"], hosts=["127.0.0.1"])
    as_stranger = client_context(tls_of(other, leader))
    assert send(target, RequestCode.HEART_BEAT, hb, ctx=as_stranger) in (
        ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT)

    # a member may not hand over leadership in the leader's name
    term = before[leader]
    handover = encode(LeadershipTransferRequest(c.group, impostor, follower, term, leader, follower))
    assert send(target, RequestCode.LEADERSHIP_TRANSFER, handover, ctx=as_impostor) == ResponseCode.UNEXPECTED_MEMBER

    assert terms(c) == before, "a refused message moved a term"
    assert c.wait_leader() == leader
    assert client.append(b"still serving").index == r.index + 1


def test_a_client_without_a_certificate_cannot_use_a_tls_group(make_cluster: MakeCluster, certs: Path) -> None:
    c = make_cluster(3, tls_dir=certs)
    c.wait_leader()
    with DLedgerClient(c.peers, c.group, timeout=3.0) as plain, pytest.raises(DLedgerError) as e:
        plain.append(b"no certificate")
    assert e.value.code == ResponseCode.UNAUTHENTICATED and "requires mutual TLS" in e.value.message, e.value


def test_the_cli_speaks_tls(make_cluster: MakeCluster, certs: Path) -> None:
    c = make_cluster(3, tls_dir=certs)
    c.wait_leader()
    flags = ["--tls-cert", str(certs / "client.pem"), "--tls-key", str(certs / "client-key.pem"),
             "--tls-ca", str(certs / "ca.pem")]
    dledger = [sys.executable, "-m", "dledger"]
    out = subprocess.run([*dledger, "append", "--peers", c.peers, "--group", c.group, *flags, "via-cli"],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([*dledger, "status", "--peers", c.peers, "--group", c.group, "--json", *flags],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    roles = {v["role"] for v in msgspec.json.decode(out.stdout).values()}
    assert "unreachable" not in roles
    out = subprocess.run([*dledger, "status", "--peers", c.peers, "--group", c.group, "--json"],
                         capture_output=True, timeout=60)
    assert out.returncode == 1 and b"Traceback" not in out.stderr


def test_the_auth_token_keeps_strangers_out(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, auth_token="correct horse")
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    client = c.client()
    assert client.append(b"with token").index >= 0
    before = terms(c)
    hb = forged_heartbeat(c, leader, follower, max(before.values()) + 1000)
    target = address_of(c, follower)
    assert send(target, RequestCode.HEART_BEAT, hb) == ResponseCode.UNAUTHENTICATED
    assert send(target, RequestCode.HEART_BEAT, hb, token=b"wrong") == ResponseCode.UNAUTHENTICATED
    with DLedgerClient(c.peers, c.group, timeout=3.0) as stranger, pytest.raises(DLedgerError) as e:
        stranger.append(b"no token")
    assert e.value.code == ResponseCode.UNAUTHENTICATED
    assert terms(c) == before


def test_the_member_listener_takes_member_messages_only(make_cluster: MakeCluster) -> None:
    member_ports = free_ports(3)
    peer_listen = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(member_ports))
    c = make_cluster(3, extra=["--peer-listen", peer_listen])
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    client = c.client()
    r = client.append(b"split listeners")
    assert client.get(r.index).body == b"split listeners"
    before = terms(c)
    hb = forged_heartbeat(c, leader, follower, max(before.values()) + 1000)
    # member messages on the client address are refused
    assert send(address_of(c, follower), RequestCode.HEART_BEAT, hb) == ResponseCode.UNEXPECTED_MEMBER
    # client requests on the member address are refused (METADATA excepted)
    append = msgspec.msgpack.encode([c.group, "", "", [b"x"]])
    assert send(address_of(c, leader, peer_listen), RequestCode.APPEND, append) == ResponseCode.UNSUPPORTED
    assert terms(c) == before
