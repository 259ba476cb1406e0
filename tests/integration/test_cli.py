"""The `dledger` command against a running group (docs/cli.md), as a user runs it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.local_cluster import stop_processes
from dledger.ports import free_port_run, free_ports

from .harness import Cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(3, tmp_path_factory.mktemp("cli"), group="cli")
    try:
        c.start()
        yield c
    finally:
        c.cleanup()


def dledger(*args: str, stdin: bytes | None = None, timeout: float = 60, env_peers: str | None = None,
            env_group: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run the command; `env_peers`/`env_group` go in DLEDGER_PEERS/DLEDGER_GROUP."""
    env = {k: v for k, v in os.environ.items() if k not in ("DLEDGER_PEERS", "DLEDGER_GROUP")}
    env.update({k: v for k, v in (("DLEDGER_PEERS", env_peers), ("DLEDGER_GROUP", env_group)) if v})
    return subprocess.run([sys.executable, "-m", "dledger", *args], input=stdin, capture_output=True,
                          timeout=timeout, check=False, env=env)


def ok(p: subprocess.CompletedProcess[bytes]) -> bytes:
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr.decode(errors='replace')}"
    return p.stdout


def json_lines(out: bytes) -> list[dict[str, Any]]:
    lines = out.decode().splitlines()
    assert lines and all(line.strip() for line in lines), out
    return [json.loads(line) for line in lines]


def assert_user_error(p: subprocess.CompletedProcess[bytes]) -> str:
    """Non-zero exit, one line on stderr, no traceback."""
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, f"exit 0; stdout {p.stdout!r}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_append_get_read(cluster: Cluster) -> None:
    common = ["--peers", cluster.peers, "--group", cluster.group]
    results = json_lines(ok(dledger("append", *common, "alpha", "beta gamma")))
    results += json_lines(ok(dledger("append", *common, stdin=b"one\ntwo\nthree\n")))
    results += json_lines(ok(dledger("append", *common, "--batch", "2", stdin=b"four\nfive\nsix\n")))
    bodies = [b"alpha", b"beta gamma", b"one", b"two", b"three", b"four", b"five", b"six"]
    assert len(results) == len(bodies)
    for r in results:
        assert set(r) == {"index", "term", "pos"}, r
        assert all(isinstance(v, int) for v in r.values()), r
    indexes = [r["index"] for r in results]
    assert indexes == sorted(set(indexes))
    assert [r["pos"] for r in results] == sorted({r["pos"] for r in results})
    # the two bodies of one command line and a batch of stdin lines are consecutive
    assert indexes[1] == indexes[0] + 1 and indexes[6] == indexes[5] + 1

    for r, body in zip(results, bodies, strict=True):
        assert ok(dledger("get", *common, "--index", str(r["index"]))) == body  # raw: no newline added
        assert cluster.ctl.get(r["index"]).body == body

    raw = b"\x00\xff\xfe raw\n"
    binary = cluster.ctl.append(raw)
    assert ok(dledger("get", *common, "--index", str(binary.index))) == raw

    entries = json_lines(ok(dledger("read", *common, "--from", str(indexes[0]), "--max", "3")))
    assert entries == [{"index": r["index"], "term": r["term"], "body": b.decode()}
                       for r, b in zip(results[:3], bodies[:3], strict=True)]
    entries = json_lines(ok(dledger("read", *common, "--from", str(indexes[0]))))
    assert [e["index"] for e in entries] == [*indexes, binary.index]
    assert entries[-1]["body"] == {"b64": base64.b64encode(raw).decode()}
    assert all(set(e) == {"index", "term", "body"} for e in entries)


def test_status_json(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    status = json.loads(ok(dledger("status", "--peers", cluster.peers, "--group", cluster.group, "--json")))
    assert set(status) == set(cluster.ids)
    for m, v in status.items():
        assert {"role", "term", "leader", "ledger_end_index", "committed_index"} <= set(v), (m, v)
        assert v["leader"] == leader
        assert isinstance(v["term"], int) and isinstance(v["ledger_end_index"], int)
    assert [m for m, v in status.items() if v["role"] == "leader"] == [leader]
    # the table form works too
    table = ok(dledger("status", "--peers", cluster.peers, "--group", cluster.group)).decode()
    assert all(m in table for m in cluster.ids) and "leader" in table


def test_transfer(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    target = next(m for m in cluster.ids if m != leader)
    out = ok(dledger("transfer", "--peers", cluster.peers, "--group", cluster.group, "--to", target))
    assert json.loads(out) == {"leader": target}
    wait_until(lambda: cluster.agreed_leader() == target, 30, f"{target} leads after `dledger transfer`")
    line = assert_user_error(dledger("transfer", "--peers", cluster.peers, "--group", cluster.group, "--to", "n9"))
    assert "n9" in line


def test_errors_on_a_running_cluster(cluster: Cluster) -> None:
    common = ["--peers", cluster.peers, "--group", cluster.group]
    line = assert_user_error(dledger("get", *common, "--index", "1000000"))
    assert "1000000" in line or "INDEX_OUT_OF_RANGE" in line
    assert_user_error(dledger("status", "--peers", cluster.peers, "--group", "no-such-group", "--json"))


@pytest.mark.parametrize("peers", ["garbage", "n0-127.0.0.1", "n0-127.0.0.1:99999", "n0-127.0.0.1:1;n0-127.0.0.1:2"])
def test_bad_peers_string(peers: str) -> None:
    for args in (["append", "x"], ["get", "--index", "0"], ["read"], ["status", "--json"], ["transfer", "--to", "n0"]):
        p = dledger(args[0], "--peers", peers, *args[1:])
        line = assert_user_error(p)
        assert "peer" in line.lower(), line
        assert p.stdout == b""


def test_server_says_where_it_listens(tmp_path: Path) -> None:
    """`dledger server` prints one line once it serves: what a user starting a member waits
    for (address, store, security, flush mode) and what scripts wait for."""
    from dledger.runtime.client import DLedgerClient

    port = free_port_run(1)
    p = subprocess.Popen([sys.executable, "-m", "dledger", "server", "--group", "g", "--id", "n0",
                          "--peers", f"n0-127.0.0.1:{port}", "--store", "memory"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []

    def collect() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    try:
        listening = wait_until(lambda: next((x for x in lines if "listening on" in x), None), 60,
                               "the member's listening line")
        assert listening == (f"dledger g/n0: listening on 127.0.0.1:{port}, store in memory, "
                             "no TLS: loopback connections only, flush=async"), lines
        with DLedgerClient(f"n0-127.0.0.1:{port}", "g", timeout=30) as c:  # and it does serve
            assert c.metadata("n0").self_id == "n0"
    finally:
        stop_processes([p], 60)
        reader.join(timeout=10)
    assert p.returncode == 0, lines
    assert "Traceback" not in "\n".join(lines), lines


def test_unreachable_cluster(tmp_path: Path) -> None:
    peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(free_ports(3)))
    commands = [["append", "x"], ["get", "--index", "0"], ["read"], ["status", "--json"], ["status"]]
    # run side by side: each waits for its client timeout before giving up
    procs = [subprocess.Popen([sys.executable, "-m", "dledger", args[0], "--peers", peers, *args[1:]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path) for args in commands]
    try:
        for args, p in zip(commands, procs, strict=True):
            out, err = p.communicate(timeout=60)
            line = assert_user_error(subprocess.CompletedProcess(p.args, p.returncode, out, err))
            assert line, args
            if args[0] != "status":
                assert out == b"", (args, out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_health_and_status_check_exit_codes(make_cluster: Any) -> None:
    c = make_cluster(3)
    p = dledger("health", "--group", c.group, env_peers=c.peers)
    assert p.returncode == 0 and p.stdout.decode().startswith("healthy: leader n"), p.stdout + p.stderr
    assert " 3/3 up, max lag " in p.stdout.decode()
    verdict = json.loads(ok(dledger("health", "--peers", c.peers, "--group", c.group, "--json")))
    assert verdict["ok"] and verdict["up"] == 3
    started = time.monotonic()
    wrong = dledger("health", "--peers", c.peers, "--group", "nosuch", "--wait", "600")
    assert wrong.returncode == 1 and "UNKNOWN_GROUP (400)" in wrong.stdout.decode()
    assert time.monotonic() - started < 300  # a wrong group: no waiting helps, so it does not wait
    follower = next(m for m in c.ids if m != c.wait_leader())
    c.kill(follower)
    p = dledger("status", "--peers", c.peers, "--group", c.group, "--check")
    assert p.returncode == 1 and "NOT healthy: " in p.stdout.decode() and "2/3 up" in p.stdout.decode()
    assert dledger("status", "--peers", c.peers, "--group", c.group).returncode == 0  # without --check: a report
    p = dledger("health", "--peers", c.peers, "--group", c.group, "--wait", "1")
    assert p.returncode == 1 and f"{follower}: down" in p.stdout.decode() and "(after waiting " in p.stdout.decode()


def test_version_and_environment(cluster: Cluster) -> None:
    assert ok(dledger("--version")).decode().startswith("dledger ")
    out = json.loads(ok(dledger("append", "from-env", env_peers=cluster.peers, env_group=cluster.group)))
    assert out["index"] >= 0


def test_get_of_a_noop_and_read_at_its_max_say_so(cluster: Cluster) -> None:
    common = ["--peers", cluster.peers, "--group", cluster.group]
    for k in range(3):
        ok(dledger("append", *common, f"r{k}"))
    line = assert_user_error(dledger("get", *common, "--index", "0"))  # the first leader's NOOP
    assert "entry 0 is a NOOP" in line
    p = dledger("read", *common, "--from", "0", "--max", "2")
    assert len(ok(p).splitlines()) == 2 and b"(stopped at --max 2; more may follow: --from " in p.stderr


def test_a_closed_client_says_so(cluster: Cluster) -> None:
    from dledger.codes import DLedgerError
    from dledger.runtime.client import DLedgerClient

    c = DLedgerClient(cluster.peers, cluster.group)
    c.close()
    with pytest.raises(DLedgerError, match="this client is closed"):
        c.append(b"x")


def test_binary_bodies_in_and_out(cluster: Cluster, tmp_path: Path) -> None:
    common = ["--peers", cluster.peers, "--group", cluster.group]
    blob = bytes(range(256))
    (tmp_path / "blob").write_bytes(blob)
    first = json.loads(ok(dledger("append", *common, "--file", str(tmp_path / "blob"))))["index"]
    out = ok(dledger("append", *common, "-0", stdin=b"a\nb\x00\xff\xfe\x00c"))
    nul = [json.loads(x)["index"] for x in out.splitlines()]
    b64 = json.loads(ok(dledger("append", *common, "--base64", base64.b64encode(b"\x00z").decode())))["index"]
    assert ok(dledger("get", *common, "--index", str(first))) == blob
    assert [ok(dledger("get", *common, "--index", str(i))) for i in nul] == [b"a\nb", b"\xff\xfe", b"c"]
    out = ok(dledger("read", *common, "--from", str(b64), "--max", "1", "--base64"))
    rows = [json.loads(x) for x in out.splitlines()]
    assert base64.b64decode(rows[0]["body"]) == b"\x00z"
    assert_user_error(dledger("append", *common, "--base64", "not base64!"))


def test_top_runs_live_under_a_terminal(make_cluster: Any) -> None:
    """`dledger top` under a pseudo-terminal (rich draws live only on one): the group's rows,
    refreshed, with rates and the metrics' columns."""
    import pty

    c = make_cluster(3, metrics=True)
    leader = c.wait_leader()
    c.ctl.append_batch([b"x" * 100] * 50)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, on the terminal
        os.execv(sys.executable, [sys.executable, "-m", "dledger", "top", "--peers", c.peers, "--group", c.group,
                                  "--interval", "0.5", "-n", "4", "--metrics-base-port", str(c.metrics_base_port)])
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child ended: the terminal is gone
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert f"dledger top — group {c.group} — healthy" in text
    assert all(m in text for m in c.ids) and "leader" in text and "appends/s" in text and "fsync ms" in text
    assert text.count("dledger top") >= 2  # redrawn
    assert leader in text


def test_output_json_or_table(cluster: Cluster) -> None:
    common = ["--peers", cluster.peers, "--group", cluster.group]
    table = ok(dledger("append", *common, "-o", "table", "tabled")).decode()
    assert "index" in table and "term" in table and "{" not in table
    rows = ok(dledger("read", *common, "--from", "0", "--max", "3", "-o", "table")).decode()
    assert "body" in rows and "index" in rows
    status = json.loads(ok(dledger("status", *common, "-o", "json")))
    assert set(status) == set(cluster.ids)
    assert json.loads(ok(dledger("health", *common, "-o", "json")))["ok"] is True


def test_get_and_snapshot_output_json_or_table(cluster: Cluster) -> None:
    """`get` prints raw bytes without -o (test_append_get_read), `snapshot` text lines
    (test_state_machine); with -o, JSON lines or a table."""
    common = ["--peers", cluster.peers, "--group", cluster.group]
    text, binary = cluster.ctl.append(b"got me"), cluster.ctl.append(b"\xff\x00")
    got = json.loads(ok(dledger("get", *common, "--index", str(text.index), "-o", "json")))
    assert got == {"index": text.index, "term": text.term, "body": "got me"}
    got = json.loads(ok(dledger("get", *common, "--index", str(binary.index), "-o", "json")))
    assert got["body"] == {"b64": base64.b64encode(b"\xff\x00").decode()}  # as `read`'s
    got = json.loads(ok(dledger("get", *common, "--index", str(text.index), "-o", "json", "--base64")))
    assert got["body"] == base64.b64encode(b"got me").decode()  # --base64: one type whatever the content
    assert ok(dledger("get", *common, "--index", str(binary.index), "--base64")) == b"/wA=\n"
    table = ok(dledger("get", *common, "--index", str(text.index), "-o", "table")).decode()
    assert "got me" in table and str(text.index) in table and "body" in table
    snaps = json_lines(ok(dledger("snapshot", *common, "-o", "json")))
    assert sorted(s["member"] for s in snaps) == sorted(cluster.ids)
    assert all(set(s) == {"member", "index"} and isinstance(s["index"], int) for s in snaps), snaps
    table = ok(dledger("snapshot", *common, "--member", cluster.ids[0], "-o", "table")).decode()
    assert cluster.ids[0] in table and "index" in table and "snapshot through" not in table
    p = dledger("snapshot", *common, "--member", "n9", "-o", "json")  # the member's error, then the summary
    err = p.stderr.decode()
    assert p.returncode == 1 and p.stdout == b"" and "no snapshot on n9" in err and "Traceback" not in err, err
