"""InstallSnapshot on real member processes (issue 12): a member whose store was wiped, and one
that was down while the others compacted their logs past it, catch up from the leader's
snapshot while writes go on, and end with the same state as everyone else. Waits poll a
condition up to a generous deadline; nothing is timed.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from dledger.codes import DLedgerError
from dledger.kv import KVClient
from integration.harness import Cluster, MakeCluster, wait_until
from integration.test_state_machine import kv_client, snapshot_dirs, state_of

pytestmark = pytest.mark.integration


class Writer:
    """A thread putting keys until stopped; the keys acknowledged."""

    def __init__(self, c: Cluster, prefix: str) -> None:
        self.kv: KVClient = kv_client(c)
        self.prefix = prefix
        self.acked: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            key = f"{self.prefix}/{k:05d}"
            try:
                if self.kv.put(key, "w" * 100).ok:
                    self.acked.append(key)
            except DLedgerError:
                pass  # a leader change: the next put goes on
            k += 1

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        return self.acked


def compacting_cluster(make_cluster: MakeCluster, tmp_path: Path) -> Cluster:
    toml = tmp_path / "small-files.toml"
    toml.write_text("data_file_size = 65536\nindex_file_size = 32768\nretention_check_interval_ms = 200\n")
    return make_cluster(3, extra=["--config", str(toml), "--state-machine", "kv", "--snapshot-threshold-entries",
                                  "100", "--snapshot-margin-entries", "20"])


def fill(c: Cluster, prefix: str, n: int) -> None:
    kv = kv_client(c)
    for k in range(n):
        assert kv.put(f"{prefix}/{k:04d}", "v" * 200).ok


def wait_same_state(c: Cluster, x: str) -> dict[bytes, tuple[bytes, int]]:
    end = c.wait_caught_up(timeout=90)
    wait_until(lambda: all(c.meta(m) is not None and c.meta(m).applied_index >= end for m in c.ids),  # type: ignore[union-attr]
               90, "every member applied everything")
    other = next(m for m in c.ids if m != x)
    want = state_of(c, other)
    assert state_of(c, x) == want, f"{x} holds another state than {other}"
    return want


def test_a_wiped_member_rejoins_by_install_snapshot_while_writes_go_on(make_cluster: MakeCluster,
                                                                       tmp_path: Path) -> None:
    c = compacting_cluster(make_cluster, tmp_path)
    fill(c, "a", 400)
    leader = c.wait_leader()
    wait_until(lambda: (v := c.meta(leader)) is not None and v.ledger_begin_index > 100, 60,
               "the leader compacts its log behind its snapshots")
    x = next(m for m in c.ids if m != leader)
    c.kill(x)
    shutil.rmtree(c.store_dir(x))  # a disk replaced: nothing left
    w = Writer(c, "live")
    c.restart(x)
    wait_until(lambda: (v := c.meta(x)) is not None and v.ledger_begin_index > 100 and v.applied_index > 400, 90,
               f"{x} installs the leader's snapshot and applies past it")
    acked = w.stop()
    assert acked, "no write went through while the member caught up"
    state = wait_same_state(c, x)
    assert all(k.encode() in state for k in acked)
    assert len([k for k in state if k.startswith(b"a/")]) == 400
    assert snapshot_dirs(c, x), f"{x} keeps the snapshot it installed"


def test_a_member_down_while_the_others_compact_rejoins_from_the_snapshot(make_cluster: MakeCluster,
                                                                          tmp_path: Path) -> None:
    c = compacting_cluster(make_cluster, tmp_path)
    fill(c, "a", 50)
    x = next(m for m in c.ids if m != c.wait_leader())
    c.wait_caught_up()
    c.kill(x)
    down_end = c.store_dir(x)
    assert down_end.exists()
    fill(c, "b", 500)
    others = [m for m in c.ids if m != x]
    wait_until(lambda: all((v := c.meta(m)) is not None and v.ledger_begin_index > 60 for m in others), 60,
               "the others compact past what the member holds")
    c.restart(x)
    wait_same_state(c, x)
    v = c.meta(x)
    assert v is not None and v.ledger_begin_index > 60 and v.snapshot_index >= 100
