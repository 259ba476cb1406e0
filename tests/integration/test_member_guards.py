"""What a member refuses to do for a stranger, on real member processes over TCP:
obey FAULT without `--enable-fault-injection`, and share its store directory with
a second `dledger server`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.local_cluster import stop_processes, wait_ready
from dledger.ports import free_ports
from dledger.runtime.client import DLedgerClient

from .harness import MakeCluster, wait_until

pytestmark = pytest.mark.integration


def test_fault_request_is_refused_without_the_flag(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, fault_injection=False)
    leader = c.wait_leader()
    others = [m for m in c.ids if m != leader]
    with pytest.raises(DLedgerError) as ei:
        c.ctl.inject_faults(leader, others)
    assert ei.value.code == ResponseCode.UNSUPPORTED
    assert "--enable-fault-injection" in ei.value.message, ei.value.message
    # nothing was cut: the group keeps serving, and every member, the leader asked to
    # isolate itself included, holds and commits the next append
    r = c.client().append(b"after the refused fault")
    assert c.wait_caught_up() >= r.index
    assert c.ctl.get(r.index).body == b"after the refused fault"


def test_fault_injection_flag_lets_fault_requests_cut_links(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)  # the harness starts members with --enable-fault-injection
    leader = c.wait_leader()
    cut = next(m for m in c.ids if m != leader)
    rest = [m for m in c.ids if m != cut]
    c.isolate(cut)  # accepted: no error
    r = c.client(c.peers_of(rest)).append(b"while one member is cut off")
    assert c.wait_caught_up(rest) >= r.index
    view = c.meta(cut)
    assert view is not None and view.ledger_end_index < r.index, view  # it never received the entry
    c.heal()
    assert c.wait_caught_up() >= r.index


def _server(member: str, port: int, store_dir: Path) -> list[str]:
    return [sys.executable, "-m", "dledger", "server", "--group", "g", "--id", member,
            "--peers", f"{member}-127.0.0.1:{port}", "--store-dir", str(store_dir)]


def test_second_server_on_one_store_directory_exits_naming_the_holder(tmp_path: Path) -> None:
    store_dir = tmp_path / "lk"
    first_port, second_port = free_ports(2)
    first = subprocess.Popen(_server("s0", first_port, store_dir))
    try:
        peers = f"s0-127.0.0.1:{first_port}"
        wait_ready(peers, "g", 30.0, {"s0": first})
        with DLedgerClient(peers, "g") as client:
            before = client.append(b"before the second server")
            second = subprocess.run(_server("s0", second_port, store_dir), capture_output=True, text=True,
                                    timeout=120, check=False)
            assert second.returncode == 1, second
            lines = [line for line in second.stderr.splitlines() if line.strip()]
            assert len(lines) == 1, second.stderr  # one line, no traceback, no log noise
            assert lines[0].startswith("dledger: error: "), lines[0]
            assert str(store_dir) in lines[0] and f"process {first.pid}" in lines[0], lines[0]
            # the first server never noticed: it keeps serving what it acknowledged, and more
            assert first.poll() is None
            after = client.append(b"after the second server")
            assert after.index == before.index + 1
            assert wait_until(lambda: [e.body for e in client.read(before.index, 10)], 30, "read back") == [
                b"before the second server", b"after the second server"]
    finally:
        stop_processes([first])
    assert first.returncode == 0
