"""Security: mutual TLS between members and for clients (see `dledger.security.tls`).

`dledger.security.certs` (development certificates) needs the `cryptography` package and is
not imported here, so importing TLS support stays light.
"""

from __future__ import annotations

from dledger.security.tls import (
    DEFAULT_CLIENT_NAME,
    TlsConfig,
    cert_names,
    client_context,
    member_allowed,
    peer_names,
    server_context,
)

__all__ = [
    "DEFAULT_CLIENT_NAME",
    "TlsConfig",
    "cert_names",
    "client_context",
    "member_allowed",
    "peer_names",
    "server_context",
]
