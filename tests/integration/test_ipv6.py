"""IPv6 literals end to end (issue 27): a Raft group and a broker set whose every address is
`[::1]:port`, started as real processes. Without TLS or a token they serve loopback
connections only, so this also shows the loopback check (/proc/net/tcp6) admits ::1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.broker.local import local_broker_cluster
from dledger.local_cluster import local_cluster
from dledger.ports import free_port_run, free_ports
from dledger.runtime.client import DLedgerClient

from .harness import wait_until

pytestmark = pytest.mark.integration


def test_a_raft_group_on_ipv6_loopback(tmp_path: Path) -> None:
    """Three members on [::1]: a leader, appends from a client that reaches them over IPv6,
    the same entries read back from every member."""
    peers = ";".join(f"n{k}-[::1]:{p}" for k, p in enumerate(free_ports(3)))
    with local_cluster(peers, "v6", tmp_path), DLedgerClient(peers, "v6", timeout=5.0) as c:
        results = [c.append(b"v6-%d" % i) for i in range(10)]
        indexes = [r.index for r in results]
        assert indexes == list(range(indexes[0], indexes[0] + 10))
        for member in ("n0", "n1", "n2"):

            def committed(m: str = member) -> bool:
                return c.metadata(m).committed_index >= indexes[-1]

            wait_until(committed, 30, f"{member} committed the appends")
            got = [e.body for e in c.read(indexes[0], 10, member=member)]
            assert got == [b"v6-%d" % i for i in range(10)], member


def test_a_broker_set_on_ipv6_loopback(tmp_path: Path) -> None:
    """Three controllers, a master and a slave, all on [::1] (client and HA ports): the slave
    joins the SyncStateSet over IPv6, sends are acknowledged by both and read back from each."""
    base = free_port_run(3 + 4)
    with local_broker_cluster(tmp_path, controllers=3, broker_sets=1, replicas=2, base_port=base, host="::1",
                              broker_args=["--all-ack-in-sync-state-set"]) as d:
        assert all(s.address.startswith("[::1]:") for s in d.specs.values())
        master = wait_until(lambda: d.master_of("b0"), 30, "a master")
        wait_until(lambda: len(d.info(master).sync_state_set) == 2, 30, "the slave in the SyncStateSet")
        with d.client("b0") as c:
            sent = [c.send(b"m%d" % i) for i in range(20)]
            assert [r.index for r in sent] == list(range(20))
            for s in d.specs.values():

                def has_all(address: str = s.address) -> bool:
                    return [r.body for r in c.read(0, 100, replica=address)] == [b"m%d" % i for i in range(20)]

                wait_until(has_all, 30, f"{s.key}'s records")
