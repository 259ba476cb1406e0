"""Who a connection is (its `Principal`) and what it may ask (roles): docs/security.md, "Roles".

Authentication says who connects; authorization, here, says what that party may do. Every
request code a server answers names the roles that may send it (each server's table, checked
in one place by the transport before any handler runs); a request from a principal holding
none of them is answered 430 UNAUTHENTICATED naming the role that was missing.

Where a principal's roles come from:

* **mutual TLS**: the certificate. Its subject's organizational unit (OU) attributes name
  its roles, one per attribute: ``member``, ``controller``, ``client``, ``admin`` or
  ``broker:<set>`` (a replica of that broker set). Its common name (CN) is the principal's
  name: a member's or controller's id, a broker replica's name (``<set>/<replica>``), a
  client's or an admin's name. A certificate without a role OU is a client only (a certificate
  made before roles existed cannot speak as a member any more: issue new ones with
  `dledger certs`).
* **tokens**: the token it presented. The cluster token (``auth_token``) is the members' (and,
  when no separate client or admin token is configured, everybody's: every role);
  ``client_token`` gives the client role, ``admin_token`` the admin role.
* **neither** (a member started without TLS or a token): every connection is `ANONYMOUS`, with
  every role. Such a member accepts connections from loopback addresses only, unless it was
  started with ``--insecure`` (docs/security.md says what a forger can then do).

The admin role includes the client role; no role includes another otherwise.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias


class AccessRole(StrEnum):
    MEMBER = "member"  # a member of a Raft group: votes, heartbeats, pushes (its id is its certificate's name)
    CONTROLLER = "controller"  # a member of a controller group: tells brokers who their master is
    BROKER = "broker"  # a replica of a broker set (the certificate says which set: OU broker:<set>)
    CLIENT = "client"  # reads and writes data
    ADMIN = "admin"  # steers: controller config, clean broker data, elect master, transfer, snapshot, faults


ALL_ROLES = frozenset(AccessRole)
INTERNAL_ROLES = frozenset((AccessRole.MEMBER, AccessRole.CONTROLLER, AccessRole.BROKER))
BROKER_PREFIX = "broker:"  # an OU naming a broker set: "broker:b0"


@dataclass(frozen=True)
class Principal:
    """Who sent a request: `name` (certificate CN or token name; "" anonymous), its `roles`,
    every name its certificate carries (`names`: CN and DNS subjectAltNames, for the member
    identity rule), the broker set it is a replica of ("" none), and whether anything proved
    who it is (`authenticated`; False for the anonymous principal of a member without TLS or
    a token)."""

    name: str
    roles: frozenset[AccessRole]
    names: frozenset[str] = field(default_factory=frozenset)
    broker_set: str = ""
    authenticated: bool = True
    via: str = "tls"  # "tls", "token" or "none": how the principal was established

    def has(self, role: AccessRole) -> bool:
        """Holds `role` (admin includes client)."""
        return role in self.roles or (role == AccessRole.CLIENT and AccessRole.ADMIN in self.roles)

    def has_any(self, roles: Iterable[AccessRole]) -> bool:
        return any(self.has(r) for r in roles)

    @property
    def bound(self) -> bool:
        """Its identity is a certificate's: requests that name a member, a broker set or a
        replica must name the one the certificate does (tokens and anonymous are not bound)."""
        return self.via == "tls"

    def describe(self) -> str:
        """For refusals and logs: `CN=x (roles a, b)`, `token "client" (roles client)`, `anonymous`."""
        roles = ", ".join(sorted(self.roles)) or "none"
        if self.via == "none":
            return "an anonymous connection"
        if self.via == "token":
            return f"the {self.name} (roles {roles})"
        shown = self.name or "(no CN)"
        extra = f", broker set {self.broker_set}" if self.broker_set else ""
        return f"certificate CN={shown} (roles {roles}{extra})"


ANONYMOUS = Principal("", ALL_ROLES, authenticated=False, via="none")


def cert_principal(peercert: Mapping[str, Any] | None) -> Principal:
    """The principal a verified peer certificate names (`ssl` getpeercert() dict); no
    certificate: a principal with no role (it can send nothing)."""
    if not peercert:
        return Principal("", frozenset(), via="tls")
    cn = ""
    units: list[str] = []
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                cn = cn or str(value)
                names.add(str(value))
            elif key == "organizationalUnitName" and value:
                units.append(str(value))
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS" and value:
            names.add(str(value))
    roles, broker_set = roles_of_units(units)
    return Principal(cn, roles, frozenset(names), broker_set, via="tls")


def roles_of_units(units: Iterable[str]) -> tuple[frozenset[AccessRole], str]:
    """The roles and broker set named by a certificate's OU values; no role OU: client."""
    roles: set[AccessRole] = set()
    broker_set = ""
    for unit in units:
        if unit.startswith(BROKER_PREFIX) and len(unit) > len(BROKER_PREFIX):
            roles.add(AccessRole.BROKER)
            broker_set = unit[len(BROKER_PREFIX):]
        elif unit in AccessRole.__members__.values():
            roles.add(AccessRole(unit))
    return frozenset(roles or {AccessRole.CLIENT}), broker_set


@dataclass(frozen=True)
class Tokens:
    """The tokens a server takes and the principal each one makes (docs/security.md)."""

    cluster: bytes = b""
    client: bytes = b""
    admin: bytes = b""

    @classmethod
    def of(cls, cluster: str = "", client: str = "", admin: str = "") -> Tokens:
        return cls(cluster.encode(), client.encode(), admin.encode())

    def __bool__(self) -> bool:
        return bool(self.cluster or self.client or self.admin)

    def principals(self) -> list[tuple[bytes, Principal]]:
        """(token, principal) for every configured token. A cluster token alone is every role
        (one shared secret, as before roles); beside a client or admin token it is the members'."""
        out = []
        if self.cluster:
            alone = not (self.client or self.admin)
            out.append((self.cluster, Principal("cluster token", ALL_ROLES if alone else INTERNAL_ROLES, via="token")))
        if self.client:
            out.append((self.client, Principal("client token", frozenset({AccessRole.CLIENT}), via="token")))
        if self.admin:
            out.append((self.admin, Principal("admin token", frozenset({AccessRole.ADMIN}), via="token")))
        return out


def is_loopback(host: str) -> bool:
    """A loopback address (127.0.0.0/8, ::1, an IPv4-mapped 127.x); a name is not."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@dataclass(frozen=True)
class Access:
    """What a request code needs: any one of `roles`. `request` names it in refusals."""

    request: str
    roles: frozenset[AccessRole]


def needs(request: str, *roles: AccessRole) -> Access:
    return Access(request, frozenset(roles))


# A client's check of the server it reached: (address, the server's principal) -> what is
# wrong with it, or None. With TLS, a member must be the member the address belongs to, a
# controller a controller, a broker a replica of the set it was asked for.
ServerCheck: TypeAlias = Callable[[str, Principal], "str | None"]


def expect_members(ids: Mapping[str, str]) -> ServerCheck:
    """Members at these addresses (address -> member id): a member's certificate naming that id.
    Other addresses are not checked (they are not members: a broker NOTIFY goes there)."""

    def check(address: str, p: Principal) -> str | None:
        expected = ids.get(address)
        if expected is None or (p.has(AccessRole.MEMBER) and expected in p.names):
            return None
        return f"{address}: {p.describe()} is not member {expected}"

    return check


def expect_role(role: AccessRole, broker_set: str = "") -> ServerCheck:
    """Any server holding `role` (a broker: of `broker_set`, when given)."""

    def check(address: str, p: Principal) -> str | None:
        if p.has(role) and (not broker_set or p.broker_set == broker_set):
            return None
        wanted = f"a replica of broker set {broker_set}" if broker_set else f"a {role}"
        return f"{address}: {p.describe()} is not {wanted}"

    return check


def refusal_text(request: str, needed: Iterable[AccessRole], principal: Principal) -> str:
    """430's message: which role the request needed and what the connection holds."""
    roles = sorted(needed)
    wanted = roles[0] if len(roles) == 1 else " or ".join(roles)
    return f"{request} needs the {wanted} role; this is {principal.describe()}"


__all__ = [
    "ALL_ROLES",
    "ANONYMOUS",
    "BROKER_PREFIX",
    "INTERNAL_ROLES",
    "Access",
    "AccessRole",
    "Principal",
    "Role",
    "ServerCheck",
    "Tokens",
    "cert_principal",
    "expect_members",
    "expect_role",
    "is_loopback",
    "needs",
    "refusal_text",
    "roles_of_units",
]


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
Role = AccessRole
