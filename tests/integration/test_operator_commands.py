"""The operator's commands on real processes (docs/brokers.md, "Operating broker sets"):
`dledger admin broker-sets`, `dledger broker status`, GET_BROKER_EPOCH_CACHE, and
`dledger admin controller-config get|set`, each checked against the facts the replicas and
controllers hold (three `dledger controller` members, `dledger broker` replicas on 127.0.0.1).

Waits are for conditions with generous deadlines; epochs are asserted "at least" where a late
heartbeat on a noisy machine could cause an extra election.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dledger.broker.local import local_broker_cluster
from dledger.ports import free_port_run

from .harness import wait_until

pytestmark = pytest.mark.integration

ALL_ACK = ["--all-ack-in-sync-state-set"]


def deployment(tmp_path: Path, broker_sets: int = 1, replicas: int = 2,
               tls_dir: Path | None = None) -> local_broker_cluster:
    base = free_port_run(3 + 2 * broker_sets * replicas)
    return local_broker_cluster(tmp_path, controllers=3, broker_sets=broker_sets, replicas=replicas,
                                base_port=base, broker_args=ALL_ACK, tls_dir=tls_dir)


def dledger(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dledger", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})  # (tables: one line a row)


def json_lines(p: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert p.returncode == 0 and "Traceback" not in p.stderr, p
    return [json.loads(line) for line in p.stdout.splitlines()]


def broker_sets(d: local_broker_cluster) -> dict[str, dict[str, Any]]:
    return {s["broker"]: s for s in json_lines(dledger("admin", "broker-sets", "--controller", d.controller,
                                                       "-o", "json"))}


def status(d: local_broker_cluster, broker: str = "b0") -> dict[int, dict[str, Any]]:
    rows = json_lines(dledger("broker", "status", "--controller", d.controller, "--broker", broker, "-o", "json"))
    return {r["broker_id"]: r for r in rows}


def master_and_slave(d: local_broker_cluster, broker: str = "b0") -> tuple[str, str]:
    master = wait_until(lambda: d.master_of(broker), 60, "a master")
    wait_until(lambda: len(d.info(master).sync_state_set) == 2, 60, "a SyncStateSet of 2")
    return master, next(k for k in d.brokers if k.startswith(f"{broker}/") and k != master)


def caught_up(d: local_broker_cluster, master: str, slave: str) -> bool:
    """The slave has every byte, the master confirmed them, and the slave heard so."""
    m, s = d.info(master), d.info(slave)
    return s.max_offset == m.max_offset == m.confirm_offset == s.confirm_offset


def test_broker_sets_and_status_show_what_the_replicas_hold(tmp_path: Path) -> None:
    """After sends and the slave catching up: every set is listed with its master, epochs,
    SyncStateSet and live replicas; each replica's role, offsets, epochs and the master's view
    of its slave's ack are what the replicas themselves report. A killed slave shows dead (the
    controllers) and unreachable (status), and the command still answers."""
    with deployment(tmp_path, broker_sets=2) as d:
        master, slave = master_and_slave(d)
        with d.client("b0") as c:
            sent = c.send_batch([b"op-%d" % i for i in range(20)])
        wait_until(lambda: caught_up(d, master, slave), 60, "the slave caught up")
        m, s = d.info(master), d.info(slave)
        assert m.max_offset > sent[-1].offset  # the record ends beyond where it starts

        sets = broker_sets(d)
        assert sorted(sets) == ["b0", "b1"], sets
        b0 = sets["b0"]
        assert (b0["master_broker_id"], b0["master_epoch"]) == (m.broker_id, m.master_epoch), b0
        assert b0["sync_state_set"] == sorted(m.sync_state_set) == sorted([m.broker_id, s.broker_id])
        assert b0["sync_state_set_epoch"] == m.sync_state_set_epoch
        assert b0["master_address"].split("|")[0] == d.specs[master].address
        assert {r["broker_id"]: (r["alive"], r["in_sync"], r["master"]) for r in b0["replicas"]} == {
            m.broker_id: (True, True, True), s.broker_id: (True, True, False)}
        assert sets["b1"]["master_broker_id"] is not None and len(sets["b1"]["replicas"]) == 2

        st = status(d)
        mine, theirs = st[m.broker_id], st[s.broker_id]
        assert (mine["role"], theirs["role"]) == ("MASTER", "SLAVE")
        assert mine["max_offset"] == mine["confirm_offset"] == theirs["max_offset"] == m.max_offset
        assert theirs["confirm_offset"] == m.max_offset  # the slave learned it from the master's frames
        assert mine["master_epoch"] == theirs["master_epoch"] == m.master_epoch
        assert mine["truncated_at"] is None and theirs["truncated_at"] is None
        assert mine["slaves"] == [{"broker_id": s.broker_id, "ack_offset": m.max_offset, "lag": 0, "in_sync": True}]
        assert theirs["slaves"] == []
        assert mine["epochs"][-1] == {"epoch": m.master_epoch, "start_offset": mine["epochs"][-1]["start_offset"],
                                      "end_offset": m.max_offset}
        assert mine["epochs"] == theirs["epochs"]

        table = dledger("broker", "status", "--controller", d.controller, "--broker", "b0")
        assert table.returncode == 0 and "MASTER" in table.stdout and "SLAVE" in table.stdout, table
        table = dledger("admin", "broker-sets", "--controller", d.controller, "-o", "table")
        assert table.returncode == 0 and "b0" in table.stdout and "b1" in table.stdout, table

        d.kill_broker(slave)
        wait_until(lambda: not {r["broker_id"]: r for r in broker_sets(d)["b0"]["replicas"]}[s.broker_id]["alive"],
                   60, "the killed slave dead in broker-sets")
        gone = status(d)[s.broker_id]
        assert gone["role"] == "unreachable" and gone["error"] and not gone["alive"], gone
        missing = dledger("broker", "status", "--controller", d.controller, "--broker", "nope")
        assert missing.returncode == 1 and "2008" in missing.stderr and "Traceback" not in missing.stderr


def test_get_broker_epoch_answers_the_epochs_after_a_master_change(tmp_path: Path) -> None:
    """GET_BROKER_EPOCH_CACHE (1007): the new master's entries are the old epoch up to where
    the old master's records end and its own epoch from there to its max offset; the old
    master, back as a slave, answers the same entries once it caught up."""
    with deployment(tmp_path) as d:
        master, slave = master_and_slave(d)
        with d.client("b0") as c:
            c.send_batch([b"before-%d" % i for i in range(10)])
            wait_until(lambda: caught_up(d, master, slave), 60, "the slave caught up")
            before = c.epoch_cache(d.specs[master].address)
            old_epoch, old_end = d.info(master).master_epoch, d.info(master).max_offset
            assert before.broker_name == "b0" and before.max_offset == old_end
            assert before.epochs[-1].epoch == old_epoch and before.epochs[-1].end_offset == old_end
            d.kill_broker(master)
            wait_until(lambda: d.info(slave).role == "MASTER", 60, "the slave became master")
            c.send(b"after")
            new = d.info(slave)
            cache = c.epoch_cache(d.specs[slave].address)
            assert cache.broker_id == new.broker_id and cache.max_offset == new.max_offset > old_end
            last = cache.epochs[-1]
            assert last.epoch == new.master_epoch > old_epoch
            assert (last.start_offset, last.end_offset) == (old_end, new.max_offset)
            assert [(e.epoch, e.start_offset, e.end_offset) for e in cache.epochs[:-1]] == [
                (e.epoch, e.start_offset, e.end_offset) for e in before.epochs]
            d.start_broker(master)
            wait_until(lambda: d.info(master).role == "SLAVE" and d.info(master).max_offset == new.max_offset, 60,
                       "the old master caught up as a slave")
            assert c.epoch_cache(d.specs[master].address).epochs == cache.epochs
            assert status(d)[new.broker_id]["epochs"][-1] == {"epoch": last.epoch, "start_offset": old_end,
                                                              "end_offset": new.max_offset}


def config_of(d: local_broker_cluster) -> dict[str, dict[str, Any]]:
    rows = json_lines(dledger("admin", "controller-config", "get", "--controller", d.controller, "-o", "json"))
    return {r["controller"]: r["config"] for r in rows}


def alive(d: local_broker_cluster, broker_id: int) -> bool:
    return bool({r["broker_id"]: r for r in broker_sets(d)["b0"]["replicas"]}[broker_id]["alive"])


def test_controller_config_round_trips_under_upstream_names_and_steers(tmp_path: Path) -> None:
    """`set` with upstream's names changes every controller (as `get` shows); an unknown key
    and a bad value change nothing and name the key; a black-listed key is refused 16. A
    raised broker_heartbeat_timeout_ms keeps a stopped slave alive past the default timeout
    (1.5 s), which without it is declared dead."""
    with deployment(tmp_path) as d:
        _, slave = master_and_slave(d)
        before = config_of(d)
        assert len(before) == 3 and all(c["scan_interval_ms"] == 250 for c in before.values()), before
        out = json_lines(dledger("admin", "controller-config", "set", "--controller", d.controller,
                                 "scanNotActiveBrokerInterval=400", "electMasterMaxRetryCount=5", "-o", "json"))
        assert [r["updated"] for r in out] == [{"scan_interval_ms": 400, "elect_master_max_retry_count": 5}] * 3
        after = config_of(d)
        assert all((c["scan_interval_ms"], c["elect_master_max_retry_count"]) == (400, 5) for c in after.values())

        for bad, named in (("bogusKey=1", "bogusKey"), ("scan_interval_ms=soon", "scan_interval_ms")):
            refused = dledger("admin", "controller-config", "set", "--controller", d.controller, bad)
            assert refused.returncode == 1 and "2005" in refused.stderr and named in refused.stderr, refused
            assert "Traceback" not in refused.stderr
        black = dledger("admin", "controller-config", "set", "--controller", d.controller,
                        "enableElectUncleanMaster=true")
        assert black.returncode == 1 and "NO_PERMISSION (16)" in black.stderr, black
        assert config_of(d) == after

        slave_id = d.info(slave).broker_id
        pid = d.brokers[slave].pid
        os.kill(pid, signal.SIGSTOP)  # the default timeout: declared dead
        try:
            wait_until(lambda: not alive(d, slave_id), 60, "the stopped slave dead after 1.5 s")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: alive(d, slave_id), 60, "the slave alive again")
        json_lines(dledger("admin", "controller-config", "set", "--controller", d.controller,
                           "broker_heartbeat_timeout_ms=60000", "-o", "json"))
        time.sleep(1.0)  # a heartbeat after the change: its timeout is the new default
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(6.0)  # four times the default timeout
            assert alive(d, slave_id), "a 60 s heartbeat timeout did not keep the stopped slave alive"
        finally:
            os.kill(pid, signal.SIGCONT)


def test_controller_config_set_needs_the_admin_role(tmp_path: Path) -> None:
    """Under TLS the client certificate may read the sets and the replicas' status but is
    refused 430 for `controller-config set` and `get`; the admin certificate (--tls-dir's
    admin.pem) sets, and nothing changed before it did."""
    tls_dir = tmp_path / "certs"
    with deployment(tmp_path / "d", tls_dir=tls_dir) as d:
        master_and_slave(d)
        dirs = {"DLEDGER_TLS_DIR": str(tls_dir)}
        client = ["--tls-cert", str(tls_dir / "client.pem"), "--tls-key", str(tls_dir / "client-key.pem"),
                  "--tls-ca", str(tls_dir / "ca.pem")]
        for args in (["set", "scan_interval_ms=300"], ["get"]):
            refused = dledger("admin", "controller-config", *args, "--controller", d.controller, *client)
            assert refused.returncode == 1 and "UNAUTHENTICATED (430)" in refused.stderr, refused
            assert "admin role" in refused.stderr
        ok = dledger("admin", "controller-config", "set", "--controller", d.controller, "scan_interval_ms=300",
                     "-o", "json", env=dirs)
        assert ok.returncode == 0 and ok.stdout.count('"scan_interval_ms": 300') == 3, ok
        got = json_lines(dledger("admin", "controller-config", "get", "--controller", d.controller, "-o", "json",
                                 env=dirs))
        assert [r["config"]["scan_interval_ms"] for r in got] == [300] * 3
        sets = json_lines(dledger("admin", "broker-sets", "--controller", d.controller, "-o", "json", *client))
        assert [s["broker"] for s in sets] == ["b0"]
        st = json_lines(dledger("broker", "status", "--controller", d.controller, "--broker", "b0", "-o", "json",
                                *client))
        assert sorted(r["role"] for r in st) == ["MASTER", "SLAVE"], st
