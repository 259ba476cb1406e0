"""peer_uid: the kernel's exact lookup (sock_diag) and the table scan agree on whose socket it is."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from dledger.security import peer_uid as pu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/net/tcp").exists(),
                                reason="Linux: sock_diag and /proc/net/tcp")


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_the_exact_lookup_names_the_owner_the_table_names(family: int, host: str) -> None:
    with socket.socket(family) as srv:
        srv.bind((host, 0))
        srv.listen()
        with socket.socket(family) as client:
            client.connect(srv.getsockname()[:2])
            accepted, peer = srv.accept()
            with accepted:
                local, remote = accepted.getsockname()[:2], peer[:2]
                forms = pu._forms(remote[0]), pu._forms(local[0])
                assert pu._table_uid(*forms, local, remote) == os.getuid()
                got = pu._diag_uid(family, (remote[0], remote[1]), (local[0], local[1]))
                assert got in (None, os.getuid())  # None: no sock_diag here (then the table is read)
                assert pu.peer_uid(local, remote) == os.getuid()
                # a socket nobody holds: neither way finds an owner
                assert pu.peer_uid(local, (remote[0], remote[1] ^ 1 or 1)) == -1


def test_an_ipv4_client_of_a_dual_stack_listener_is_found_in_the_other_family() -> None:
    with socket.socket(socket.AF_INET6) as srv:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.bind(("::", 0))
        srv.listen()
        with socket.socket(socket.AF_INET) as client:
            client.connect(("127.0.0.1", srv.getsockname()[1]))
            accepted, peer = srv.accept()
            with accepted:
                assert pu.peer_uid(accepted.getsockname()[:2], peer[:2]) == os.getuid()
                assert pu.not_local(accepted.getsockname(), peer) is None
