"""A development CA and the certificates of a deployment (`dledger certs`), each carrying its roles.

`make_certs` writes, in one directory:

* ``ca.pem`` / ``ca-key.pem``: a self-signed CA that signs everything below;
* per member ``<id>.pem`` / ``<id>-key.pem``: CN = id, OU = member, subjectAltName DNS = id
  plus a DNS or IP name per host, extended key usage serverAuth + clientAuth (a member is
  both ends);
* per controller: the same with OU = member and OU = controller (a controller is a member of
  the controller group, and tells brokers who their master is);
* per broker replica ``<set>/<replica>``: ``<set>-<replica>.pem``, CN = ``<set>/<replica>``,
  OU = ``broker:<set>``, the hosts as subjectAltNames, serverAuth + clientAuth;
* per client ``<name>.pem``: CN = DNS = name, OU = client, clientAuth only; per admin the
  same with OU = admin.

How a certificate carries its role is in `dledger.security.roles` (and docs/security.md).

Keys are EC P-256, written with mode 0600; every file is written atomically (temporary file,
fsync, rename). This is for development and tests: a production group should use its own
PKI, under the identity rule of `dledger.security.tls`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dledger.config import ConfigError
from dledger.fsutil import write_atomic
from dledger.security.roles import BROKER_PREFIX, AccessRole

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
DEFAULT_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost")
DEFAULT_CLIENTS: tuple[str, ...] = ("client",)
DEFAULT_ADMINS: tuple[str, ...] = ("admin",)
DEFAULT_DAYS = 825

_ID_RE = re.compile(r"^[A-Za-z0-9_.]+$")  # a member id, as in the peers string
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_REPLICA_RE = re.compile(r"^([A-Za-z0-9_.]+)/([A-Za-z0-9_.]+)$")  # a broker replica: set/replica


def broker_file_stem(replica: str) -> str:
    """`b0/r0` -> `b0-r0`: the files of a broker replica's certificate (neither part has a '-')."""
    return replica.replace("/", "-")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.*-]+$")


def make_certs(
    out_dir: Path,
    members: Sequence[str],
    hosts: Sequence[str] = DEFAULT_HOSTS,
    clients: Sequence[str] = DEFAULT_CLIENTS,
    days: int = DEFAULT_DAYS,
    *,
    force: bool = False,
    controllers: Sequence[str] = (),
    brokers: Sequence[str] = (),
    admins: Sequence[str] = DEFAULT_ADMINS,
) -> dict[str, Path]:
    """Write a development CA and one certificate per member, controller, broker replica
    (``set/replica``), client and admin into `out_dir`.

    Returns the files written, keyed by file stem (``ca``, ``ca-key``, ``n0``, ``n0-key``, ...).
    Raises ConfigError for bad names, or when `out_dir` already holds a CA and not `force`
    (replacing the CA invalidates every certificate it signed).
    """
    out_dir = Path(out_dir)
    members, hosts, clients = list(members), list(hosts), list(clients)
    controllers, brokers, admins = list(controllers), list(brokers), list(admins)
    _check_names(members + controllers, hosts, clients + admins, days, brokers)
    for name in (CA_CERT, CA_KEY):
        if (out_dir / name).exists() and not force:
            raise ConfigError(
                f"{out_dir / name} exists: refusing to overwrite the CA "
                "(force it to replace the CA and every certificate it signed)"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the directory: {e.strerror or e}") from e

    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    not_before = now - dt.timedelta(hours=1)  # tolerate clocks a little behind
    not_after = now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dledger"),
        x509.NameAttribute(NameOID.COMMON_NAME, "dledger development CA"),
    ])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    written: dict[str, Path] = {}

    def issue(name: str, roles: list[str], sans: list[x509.GeneralName], usages: list[x509.ObjectIdentifier],
              stem: str | None = None) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dledger")]
        subject += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role) for role in roles]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, name))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        stem = stem or name
        written[f"{stem}-key"] = _write(out_dir / f"{stem}-key.pem", _key_pem(key), 0o600)
        written[stem] = _write(out_dir / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)

    def host_sans(first: list[x509.GeneralName]) -> list[x509.GeneralName]:
        sans = list(first)
        for host in hosts:
            san = _host_name(host)
            if san not in sans:
                sans.append(san)
        return sans

    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    # the CA key first, its certificate last: a crash midway leaves no ca.pem to refuse over
    ca_key_path = _write(out_dir / CA_KEY, _key_pem(ca_key), 0o600)
    for member in members:
        issue(member, [AccessRole.MEMBER], host_sans([x509.DNSName(member)]), both)
    for controller in controllers:
        issue(controller, [AccessRole.MEMBER, AccessRole.CONTROLLER], host_sans([x509.DNSName(controller)]), both)
    for replica in brokers:
        broker_set = replica.split("/", 1)[0]
        issue(replica, [BROKER_PREFIX + broker_set], host_sans([]) or [x509.DNSName(broker_set)], both,
              stem=broker_file_stem(replica))
    for client in clients:
        issue(client, [AccessRole.CLIENT], [x509.DNSName(client)], [ExtendedKeyUsageOID.CLIENT_AUTH])
    for admin in admins:
        issue(admin, [AccessRole.ADMIN], [x509.DNSName(admin)], [ExtendedKeyUsageOID.CLIENT_AUTH])
    ca_path = _write(out_dir / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return {"ca": ca_path, "ca-key": ca_key_path, **written}


def _check_names(members: list[str], hosts: list[str], clients: list[str], days: int,
                 brokers: list[str] | None = None) -> None:
    """`members`: members and controllers; `clients`: clients and admins."""
    brokers = brokers or []
    if not members:
        raise ConfigError("certs: give at least one member id")
    for m in members:
        if not _ID_RE.match(m):
            raise ConfigError(f"certs: bad member id {m!r}: use letters, digits, '_', '.' (as in peers)")
    for c in clients:
        if not _NAME_RE.match(c):
            raise ConfigError(f"certs: bad client name {c!r}: use letters, digits, '_', '.', '-'")
    for b in brokers:
        if not _REPLICA_RE.match(b):
            raise ConfigError(f"certs: bad broker replica {b!r}: give SET/REPLICA, each of letters, digits, '_', '.'")
    for h in hosts:
        if not h or not (_is_ip(h) or _HOST_RE.match(h)):
            raise ConfigError(f"certs: bad host {h!r}: give an IP address or a DNS name")
    clash = sorted(set(hosts) & set(members + clients))
    if clash:
        raise ConfigError(
            f"certs: host {clash[0]!r} is also a member or client name: every member certificate "
            "would carry that name, so any member could speak as it"
        )
    names = members + clients + [broker_file_stem(b) for b in brokers]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"certs: {', '.join(dupes)} named twice: every certificate needs a file name of its own")
    if {n.lower() for n in names} & {"ca", "ca-key"} or any(n.endswith("-key") for n in clients):
        raise ConfigError("certs: 'ca' and names ending in '-key' are reserved for the CA and key files")
    if days <= 0:
        raise ConfigError(f"certs: days must be positive, not {days}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_name(host: str) -> x509.GeneralName:
    if _is_ip(host):
        return x509.IPAddress(ipaddress.ip_address(host))
    return x509.DNSName(host)


def _key_usage(ca: bool) -> x509.KeyUsage:
    """Signatures only (TLS 1.3 with EC keys); the CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int) -> Path:
    """Write `data` to `path` atomically with exactly `mode`."""
    try:
        write_atomic(path, data, mode)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write: {e.strerror or e}") from e
    return path
