"""Mutual TLS for member and client connections (TLS 1.3 only, Python's `ssl`).

With ``tls_cert``, ``tls_key`` and ``tls_ca`` set, every connection, member to member and
client to member, is TLS 1.3 and *both* ends present a certificate signed by the group's CA:

* the server side (`server_context`) requires a client certificate (``CERT_REQUIRED``); a
  connection without one, with one from another CA, or offering only TLS 1.2 or older never
  completes its handshake, so it never gets to send a request;
* the client side (`client_context`) verifies the member's certificate against the same CA
  but does not check host names (``check_hostname=False``): members are addressed by IP, and
  identity is checked by *name* as below.

Identity rule:

* A member's certificate names the member id: subject CN = id and a DNS subjectAltName = id
  (`dledger certs` issues them so; it may carry more DNS/IP names for the hosts).
* A member message (vote, heartbeat, push, ...) is accepted only when its sender id is one of
  the names on the connection's certificate (`cert_names` / `peer_names`) AND that id is a
  member of the group (`member_allowed`; a group whose membership changes: the node's own
  rule, Node.takes_member: a member a configuration it holds names, or a leader newer than
  its log that a member it knows names a voter, core.config_probe). A member therefore
  cannot speak for another one, and a certificate of the CA whose name no configuration
  holds leads nobody.
* A client certificate (CN ``client`` by default) signed by the same CA may send client
  requests only (append, get, metadata, ...). Do not issue client certificates whose names
  are member ids: such a certificate would be accepted as that member.

Errors loading the PEM files (missing file, not PEM, encrypted key, key not matching the
certificate) raise `ConfigError` with one line naming the file and the reason.

Build each context once per process and share it: loading the files per connection is slow.
This module imports only the standard library and `dledger.config` (and `cryptography`,
lazily, in `cert_file_names` / `check_member_cert`).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

from dledger.config import ConfigError, DLedgerConfig
from dledger.security.roles import AccessRole, roles_of_units

DEFAULT_CLIENT_NAME = "client"


@dataclass(frozen=True)
class TlsConfig:
    """PEM paths: the group's CA, this end's certificate (chain) and its private key."""

    ca: str
    cert: str
    key: str

    @classmethod
    def from_config(cls, cfg: DLedgerConfig) -> TlsConfig | None:
        """The TLS settings of `cfg`, or None when TLS is off (no ``tls_cert``).

        Reads no file: errors in the files show when a context is built.
        """
        if not cfg.tls_enabled:
            return None
        return cls(ca=cfg.tls_ca, cert=cfg.tls_cert, key=cfg.tls_key)

    @classmethod
    def from_dir(cls, directory: str | Path, name: str = "client") -> TlsConfig:
        """The files `dledger certs` (and `dledger cluster`) write for `name` in `directory`:
        ca.pem, <name>.pem, <name>-key.pem (client.pem for a client, admin.pem for an admin)."""
        d = Path(directory)
        return cls(ca=str(d / "ca.pem"), cert=str(d / f"{name}.pem"), key=str(d / f"{name}-key.pem"))


class _HasExtraInfo(Protocol):
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """A TLS 1.3 server context that requires a client certificate signed by ``tls.ca``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(ctx, tls)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(tls: TlsConfig) -> ssl.SSLContext:
    """A TLS 1.3 client context: presents our certificate, verifies the server's against ``tls.ca``.

    Host names are not checked (members are addressed by IP); check the server's identity
    with `peer_names` after the handshake.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    _configure(ctx, tls)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def cert_names(peercert: Mapping[str, Any] | None) -> frozenset[str]:
    """The names a verified peer certificate carries: subject commonName(s) plus DNS subjectAltNames.

    `peercert` is the dict `ssl.SSLSocket.getpeercert()` and asyncio's
    ``transport.get_extra_info("peercert")`` return; None or {} (no certificate) gives no names.
    IP subjectAltNames are not names.
    """
    if not peercert:
        return frozenset()
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                names.add(str(value))
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS" and value:
            names.add(str(value))
    return frozenset(names)


def peer_names(transport: _HasExtraInfo) -> frozenset[str]:
    """`cert_names` of the peer certificate on a transport (or StreamWriter); empty without TLS."""
    return cert_names(transport.get_extra_info("peercert"))


def member_allowed(names: Iterable[str], sender: str, members: Iterable[str]) -> bool:
    """The identity rule for member messages: `sender` is named on the certificate and is a member."""
    return sender in set(names) and sender in set(members)


def cert_file_names(path: str) -> frozenset[str]:
    """The names (CN and DNS subjectAltNames) on the first certificate of a PEM file."""
    return _cert_file(path)[0]


def _cert_file(path: str) -> tuple[frozenset[str], list[str]]:
    """Names (CN, DNS subjectAltNames) and OU values of the first certificate of a PEM file."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    data = _read(path, "tls_cert")
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError:
        _fail("tls_cert", path, "not a PEM certificate")
    names = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) if a.value}
    units = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        pass
    else:
        names.update(san.get_values_for_type(x509.DNSName))
    return frozenset(names), units


def check_member_cert(tls: TlsConfig, self_id: str, role: AccessRole = AccessRole.MEMBER) -> None:
    """Refuse to start a member whose certificate does not name its own id, or does not carry
    the role it needs (ConfigError): its peers would refuse every message it sends."""
    names, units = _cert_file(tls.cert)
    if self_id not in names:
        shown = ", ".join(sorted(names)) or "no names"
        _fail("tls_cert", tls.cert, f"names {shown}, not this member's id {self_id!r}")
    roles, _ = roles_of_units(units)
    if role not in roles:
        _fail("tls_cert", tls.cert, f"carries the roles {', '.join(sorted(roles))}, not {role} (an OU={role} "
              "attribute; `dledger certs` issues them, docs/security.md)")


def check_broker_cert(tls: TlsConfig, broker_set: str) -> None:
    """Refuse to start a broker whose certificate is not a replica of its set (OU broker:<set>)."""
    _, units = _cert_file(tls.cert)
    roles, cert_set = roles_of_units(units)
    if AccessRole.BROKER not in roles or cert_set != broker_set:
        shown = f"broker set {cert_set}" if cert_set else f"the roles {', '.join(sorted(roles))}"
        _fail("tls_cert", tls.cert, f"is a certificate of {shown}, not a replica of broker set {broker_set!r} "
              f"(OU=broker:{broker_set}; `dledger certs --brokers {broker_set}/r0`, docs/security.md)")


def _configure(ctx: ssl.SSLContext, tls: TlsConfig) -> None:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    _load_ca(ctx, tls.ca)
    _load_chain(ctx, tls.cert, tls.key)


def _fail(field: str, path: str, reason: str) -> NoReturn:
    line = f"{field} {path}: {reason}"
    raise ConfigError(" ".join(line.split()))


def _read(path: str, field: str) -> bytes:
    if not path:
        _fail(field, "''", "no file given")
    p = Path(path)
    try:
        if p.is_dir():
            _fail(field, path, "is a directory, not a PEM file")
        return p.read_bytes()
    except FileNotFoundError:
        _fail(field, path, "no such file")
    except PermissionError:
        _fail(field, path, "permission denied")
    except OSError as e:
        _fail(field, path, f"cannot read: {e.strerror or e}")


def _load_ca(ctx: ssl.SSLContext, path: str) -> None:
    data = _read(path, "tls_ca")
    if b"-----BEGIN CERTIFICATE-----" not in data:
        _fail("tls_ca", path, "no PEM certificate in it")
    try:
        ctx.load_verify_locations(cadata=data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError):
        _fail("tls_ca", path, "not a valid PEM certificate")


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    cert_data = _read(cert, "tls_cert")
    key_data = _read(key, "tls_key")
    if b"-----BEGIN CERTIFICATE-----" not in cert_data:
        _fail("tls_cert", cert, "no PEM certificate in it")
    try:  # parse the certificate alone, so a later failure is the key's
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=cert_data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError):
        _fail("tls_cert", cert, "not a valid PEM certificate")
    if b"ENCRYPTED PRIVATE KEY" in key_data or b"Proc-Type: 4,ENCRYPTED" in key_data:
        _fail("tls_key", key, "the private key is encrypted: give an unencrypted key (mode 0600)")
    if b"PRIVATE KEY-----" not in key_data:
        _fail("tls_key", key, "no PEM private key in it")

    def no_password() -> NoReturn:
        _fail("tls_key", key, "the private key is encrypted: give an unencrypted key (mode 0600)")

    try:
        ctx.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as e:
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH":
            _fail("tls_key", key, f"does not match the certificate in {cert}")
        _fail("tls_key", key, "not a valid PEM private key")
    except FileNotFoundError:  # removed between the read and the load
        _fail("tls_cert", f"{cert} / {key}", "no such file")
    except OSError as e:
        _fail("tls_cert", f"{cert} / {key}", f"cannot load: {e.strerror or e}")
