"""Mutual TLS: certificate generation, contexts and identities, over real loopback TLS connections.

Every server binds 127.0.0.1 port 0; nothing asserts on elapsed time (the only timeout is a
generous cap so that a hang fails the test instead of stalling the suite).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import stat
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dledger.config import ConfigError, DLedgerConfig
from dledger.security import (
    TlsConfig,
    cert_names,
    client_context,
    member_allowed,
    peer_names,
    server_context,
)
from dledger.security.certs import make_certs
from dledger.security.certs_command import certs
from dledger.security.tls import cert_file_names, check_member_cert

T = TypeVar("T")
LOOPS = ["asyncio", "uvloop"]
MEMBERS = ["n0", "n1", "n2"]


def run(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """asyncio.run with a hard cap, so a hang fails the test instead of stalling the suite."""
    factory = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(asyncio.wait_for(coro, 30))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pki")
    make_certs(out, MEMBERS, hosts=["127.0.0.1"])
    return out


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Certificates with the same names, signed by another CA."""
    out = tmp_path_factory.mktemp("other")
    make_certs(out, MEMBERS, hosts=["127.0.0.1"])
    return out


def tls_of(pki: Path, name: str, ca: Path | None = None) -> TlsConfig:
    return TlsConfig(ca=str(ca or pki / "ca.pem"), cert=str(pki / f"{name}.pem"), key=str(pki / f"{name}-key.pem"))


@dataclass
class Outcome:
    ok: bool  # the request went through and came back
    server_saw: list[frozenset[str]]  # peer names the server's handler saw (no handler: refused)
    client_saw: frozenset[str] = frozenset()
    error: str = ""


async def exchange(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext | None) -> Outcome:
    """One request over a real TLS connection: the server echoes a line back."""
    seen: list[frozenset[str]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(peer_names(writer))
        try:
            writer.write(await reader.readline())
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        except (ssl.SSLError, ConnectionError) as e:
            return Outcome(False, seen, error=repr(e))
        client_saw = peer_names(writer)
        try:
            writer.write(b"ping\n")
            await writer.drain()
            line = await reader.readline()
        except (ssl.SSLError, ConnectionError) as e:
            return Outcome(False, seen, client_saw, repr(e))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        return Outcome(line == b"ping\n", seen, client_saw, "" if line else "closed")
    finally:
        server.close()
        await server.wait_closed()


# --- handshakes -------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_member_to_member_handshake_carries_both_ids(pki: Path, loop: str) -> None:
    out = run(exchange(server_context(tls_of(pki, "n0")), client_context(tls_of(pki, "n1"))), loop)
    assert out.ok, out.error
    assert out.server_saw == [frozenset({"n1"})]
    assert out.client_saw == frozenset({"n0"})
    assert member_allowed(out.server_saw[0], "n1", MEMBERS)
    assert not member_allowed(out.server_saw[0], "n2", MEMBERS)  # n1 cannot speak for n2


@pytest.mark.parametrize("loop", LOOPS)
def test_client_certificate_is_named_client_and_is_no_member(pki: Path, loop: str) -> None:
    out = run(exchange(server_context(tls_of(pki, "n0")), client_context(tls_of(pki, "client"))), loop)
    assert out.ok, out.error
    assert out.server_saw == [frozenset({"client"})]
    assert not member_allowed(out.server_saw[0], "client", MEMBERS)
    assert not any(member_allowed(out.server_saw[0], m, MEMBERS) for m in MEMBERS)


@pytest.mark.parametrize("loop", LOOPS)
def test_client_without_certificate_is_refused(pki: Path, loop: str) -> None:
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname = False
    bare.minimum_version = ssl.TLSVersion.TLSv1_3
    bare.load_verify_locations(str(pki / "ca.pem"))  # trusts the server, presents nothing
    out = run(exchange(server_context(tls_of(pki, "n0")), bare), loop)
    assert not out.ok
    assert out.server_saw == []  # the handler never ran: no request got through


def test_plaintext_client_is_refused(pki: Path) -> None:
    out = run(exchange(server_context(tls_of(pki, "n0")), None))
    assert not out.ok
    assert out.server_saw == []


def test_certificate_from_another_ca_is_refused_by_the_server(pki: Path, other_pki: Path) -> None:
    # same name n1, but signed by another CA (the client trusts our CA, so only the server can refuse)
    forged = tls_of(other_pki, "n1", ca=pki / "ca.pem")
    out = run(exchange(server_context(tls_of(pki, "n0")), client_context(forged)))
    assert not out.ok
    assert out.server_saw == []


def test_server_from_another_ca_is_refused_by_the_client(pki: Path, other_pki: Path) -> None:
    forged = tls_of(other_pki, "n0", ca=pki / "ca.pem")
    out = run(exchange(server_context(forged), client_context(tls_of(pki, "n1"))))
    assert not out.ok
    assert "CERTIFICATE_VERIFY_FAILED" in out.error


@pytest.mark.parametrize("loop", LOOPS)
def test_tls12_client_is_refused(pki: Path, loop: str) -> None:
    old = client_context(tls_of(pki, "n1"))
    old.minimum_version = ssl.TLSVersion.TLSv1_2
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    out = run(exchange(server_context(tls_of(pki, "n0")), old), loop)
    assert not out.ok
    assert out.server_saw == []


def test_tls12_server_is_refused(pki: Path) -> None:
    old = server_context(tls_of(pki, "n0"))
    old.minimum_version = ssl.TLSVersion.TLSv1_2
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    out = run(exchange(old, client_context(tls_of(pki, "n1"))))
    assert not out.ok


def test_context_settings(pki: Path) -> None:
    server = server_context(tls_of(pki, "n0"))
    client = client_context(tls_of(pki, "n1"))
    for ctx in (server, client):
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname is False


# --- names ------------------------------------------------------------------------------------


def test_cert_names_reads_cn_and_dns_sans_only() -> None:
    peercert = {
        "subject": ((("organizationName", "dledger"),), (("commonName", "n0"),)),
        "subjectAltName": (("DNS", "n0"), ("DNS", "n0.example"), ("IP Address", "127.0.0.1")),
    }
    assert cert_names(peercert) == frozenset({"n0", "n0.example"})
    assert cert_names({}) == frozenset()
    assert cert_names(None) == frozenset()


def test_peer_names_without_tls_is_empty() -> None:
    class Plain:
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return default

    assert peer_names(Plain()) == frozenset()


def test_member_certificate_names_id_and_dns_hosts(tmp_path: Path) -> None:
    files = make_certs(tmp_path, ["n0"])  # default hosts: 127.0.0.1 (an IP SAN, no name) and localhost
    assert cert_file_names(str(files["n0"])) == frozenset({"n0", "localhost"})
    assert cert_file_names(str(files["client"])) == frozenset({"client"})


def test_check_member_cert(pki: Path) -> None:
    check_member_cert(tls_of(pki, "n0"), "n0")
    with pytest.raises(ConfigError, match=r"n0\.pem: names n0, not this member's id 'n1'"):
        check_member_cert(tls_of(pki, "n0"), "n1")


def test_tls_config_from_config() -> None:
    assert TlsConfig.from_config(DLedgerConfig()) is None
    cfg = DLedgerConfig(tls_cert="c.pem", tls_key="k.pem", tls_ca="ca.pem")
    assert TlsConfig.from_config(cfg) == TlsConfig(ca="ca.pem", cert="c.pem", key="k.pem")


# --- make_certs and the command ---------------------------------------------------------------


def test_make_certs_writes_every_file_with_private_keys_0600(tmp_path: Path) -> None:
    files = make_certs(tmp_path / "pki", ["n0", "n1"], clients=["client", "ops"])
    assert set(files) == {"ca", "ca-key", "n0", "n0-key", "n1", "n1-key", "client", "client-key", "ops", "ops-key",
                          "admin", "admin-key"}
    for stem, path in files.items():
        assert path == tmp_path / "pki" / f"{stem}.pem"
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if stem.endswith("-key") else 0o644), (stem, oct(mode))
    assert not [p for p in (tmp_path / "pki").iterdir() if p.name.endswith(".tmp")]


def test_make_certs_refuses_to_overwrite_a_ca(tmp_path: Path) -> None:
    files = make_certs(tmp_path, ["n0"])
    before = files["ca"].read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite the CA") as e:
        make_certs(tmp_path, ["n0"])
    assert "\n" not in str(e.value)
    assert files["ca"].read_bytes() == before
    make_certs(tmp_path, ["n0"], force=True)
    assert files["ca"].read_bytes() != before


@pytest.mark.parametrize(
    ("members", "hosts", "clients", "match"),
    [
        ([], ["127.0.0.1"], ["client"], "at least one member"),
        (["n-0"], ["127.0.0.1"], ["client"], "bad member id"),
        (["n0"], ["127.0.0.1"], ["n0"], "named twice"),
        (["n0", "n0"], ["127.0.0.1"], [], "named twice"),
        (["n0"], ["bad host"], [], "bad host"),
        (["n0", "n1"], ["n1"], [], "also a member or client name"),
        (["ca"], ["127.0.0.1"], [], "reserved"),
    ],
)
def test_make_certs_rejects_bad_names(
    tmp_path: Path, members: list[str], hosts: list[str], clients: list[str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        make_certs(tmp_path / "pki", members, hosts, clients)
    assert not (tmp_path / "pki").exists()


def test_certs_command(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    result = CliRunner().invoke(certs, ["--out", str(out), "--members", "n0,n1,n2"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'ca.pem'}" in result.output
    assert f"--tls-cert {out}/n0.pem --tls-key {out}/n0-key.pem --tls-ca {out}/ca.pem" in result.output
    assert cert_file_names(str(out / "n2.pem")) == frozenset({"n2", "localhost"})
    again = CliRunner().invoke(certs, ["--out", str(out), "--members", "n0"])
    assert again.exit_code == 1
    assert "refusing to overwrite the CA" in again.output
    forced = CliRunner().invoke(certs, ["--out", str(out), "--members", "n0", "--hosts", "10.0.0.1", "--force"])
    assert forced.exit_code == 0, forced.output


# --- loading errors: one line naming the file -------------------------------------------------


def one_line_error(tls: TlsConfig, *fragments: str) -> None:
    for build in (server_context, client_context):
        with pytest.raises(ConfigError) as e:
            build(tls)
        text = str(e.value)
        assert "\n" not in text and "_ssl.c" not in text, text
        for fragment in fragments:
            assert fragment in text, (fragment, text)


def test_missing_files_are_named(pki: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    good = tls_of(pki, "n0")
    one_line_error(TlsConfig(ca=missing, cert=good.cert, key=good.key), "tls_ca", missing, "no such file")
    one_line_error(TlsConfig(ca=good.ca, cert=missing, key=good.key), "tls_cert", missing, "no such file")
    one_line_error(TlsConfig(ca=good.ca, cert=good.cert, key=missing), "tls_key", missing, "no such file")


def test_bad_pem_is_named(pki: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("this is not PEM\n")
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    good = tls_of(pki, "n0")
    one_line_error(TlsConfig(ca=str(junk), cert=good.cert, key=good.key), "tls_ca", str(junk))
    one_line_error(TlsConfig(ca=str(broken), cert=good.cert, key=good.key), "tls_ca", str(broken))
    one_line_error(TlsConfig(ca=good.ca, cert=str(junk), key=good.key), "tls_cert", str(junk))
    one_line_error(TlsConfig(ca=good.ca, cert=str(broken), key=good.key), "tls_cert", str(broken))
    one_line_error(TlsConfig(ca=good.ca, cert=good.cert, key=str(junk)), "tls_key", str(junk))
    one_line_error(TlsConfig(ca=good.ca, cert=good.key, key=good.key), "tls_cert", good.key)  # swapped
    one_line_error(TlsConfig(ca=good.ca, cert=good.cert, key=good.cert), "tls_key", good.cert)


def test_key_not_matching_certificate_is_named(pki: Path) -> None:
    good = tls_of(pki, "n0")
    other_key = str(pki / "n1-key.pem")
    one_line_error(TlsConfig(ca=good.ca, cert=good.cert, key=other_key), "tls_key", other_key, "does not match")


def test_encrypted_key_is_refused_without_prompting(pki: Path, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key((pki / "n0-key.pem").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    locked = tmp_path / "locked-key.pem"
    locked.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    ))
    good = tls_of(pki, "n0")
    one_line_error(TlsConfig(ca=good.ca, cert=good.cert, key=str(locked)), "tls_key", str(locked), "encrypted")
