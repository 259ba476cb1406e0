"""No traceback reaches a user (issue 11): every failure of the `dledger` command ends with
one line on stderr and exit code 1 (2 for a usage error); and `dledger store inspect` /
`repair-term` on a real store whose currterm a forged term pushed past the wire limit."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.config import ConfigError, DLedgerConfig
from dledger.local_cluster import stop_processes
from dledger.ports import free_port_run, free_ports
from dledger.runtime.client import DLedgerClient
from integration.harness import MakeCluster, wait_until

LIMIT = 1 << 62


def dledger(*args: str | bytes, stdin: bytes | None = None, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "dledger", *args], input=stdin, capture_output=True,
                          timeout=timeout, check=False, cwd=cwd)


def one_error_line(p: subprocess.CompletedProcess[bytes], code: int = 1) -> str:
    """Exit `code`, exactly one non-empty line on stderr, no traceback; that line."""
    err = p.stderr.decode(errors="replace")
    assert p.returncode == code, f"exit {p.returncode}, want {code}; stderr: {err}; stdout {p.stdout!r}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def unreachable_peers() -> str:
    return ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(free_ports(3)))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on a free port of 127.0.0.1, as another program holding it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", free_ports(1)[0]))
    s.listen()
    try:
        yield s
    finally:
        s.close()


# --- 1. indexes beyond the wire limit -------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("args", [
    ["get", "--index", str(2**64)],
    ["get", "--index", str(LIMIT)],
    ["read", "--from", str(2**64)],
    ["read", "--from", str(LIMIT)],
    ["read", "--max", str(2**64)],
    ["read", "--from", "0", "--max", str(LIMIT)],
])
def test_an_index_beyond_the_wire_limit_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    p = dledger(args[0], "--peers", unreachable_peers(), *args[1:], cwd=tmp_path)
    line = one_error_line(p, code=2)
    assert "2**62" in line and args[-1] in line, line
    assert p.stdout == b""


@pytest.mark.integration
def test_the_largest_index_below_the_limit_is_sent(tmp_path: Path) -> None:
    """2**62 - 1 passes the CLI; the (unreachable) group is what fails, on one line."""
    line = one_error_line(dledger("get", "--peers", unreachable_peers(), "--index", str(LIMIT - 1), cwd=tmp_path))
    assert "2**62" not in line


# --- 2. bodies that are not UTF-8 ------------------------------------------------------------------


@pytest.mark.integration
def test_non_utf8_bodies_are_appended_as_bytes(make_cluster: MakeCluster, tmp_path: Path) -> None:
    c = make_cluster(1)
    c.wait_leader()
    common = ["--peers", c.peers, "--group", c.group]
    stdin_bodies = [b"\xff\xfe\x80 not utf-8", b"plain", b"\x00\xc3(", b""]
    p = dledger("append", *common, stdin=b"\n".join(stdin_bodies) + b"\n", cwd=tmp_path)
    assert p.returncode == 0 and p.stderr.strip() == b"", p.stderr.decode(errors="replace")
    stdin_results = [json.loads(line) for line in p.stdout.decode().splitlines()]
    argv_body = b"argv \xff\xfe"
    p = dledger("append", *common, argv_body, "text", cwd=tmp_path)
    assert p.returncode == 0 and p.stderr.strip() == b"", p.stderr.decode(errors="replace")
    argv_results = [json.loads(line) for line in p.stdout.decode().splitlines()]
    expected = [*stdin_bodies, argv_body, b"text"]
    results = stdin_results + argv_results
    assert len(results) == len(expected), results
    for r, body in zip(results, expected, strict=True):
        assert c.ctl.get(r["index"]).body == body
        assert dledger("get", *common, "--index", str(r["index"]), cwd=tmp_path).stdout == body


# --- 3. config values of the wrong type ------------------------------------------------------------


BAD_VALUES = [
    ("peers", "5", "a string"),
    ("self_id", '["n0"]', "a string"),
    ("store_dir", "7", "a string"),
    ("flush_interval_ms", '"10"', "an integer"),
    ("metrics_port", "true", "an integer"),
    ("max_connections", "1.5", "an integer"),
    ("enable_fault_injection", "1", "true or false"),
    ("file_reserved_hours", '"72"', "a number"),
    ("preferred_leader_ids", "[1]", "a list of strings"),
    ("tls_cert", "[]", "a string"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_a_config_value_of_the_wrong_type_names_the_key(tmp_path: Path, key: str, value: str,
                                                         expected: str) -> None:
    port = free_ports(1)[0]
    base = {"self_id": '"n0"', "peers": f'"n0-127.0.0.1:{port}"', "store_dir": f'"{tmp_path / "s"}"'}
    base[key] = value
    config = tmp_path / "member.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in base.items()))
    line = one_error_line(dledger("server", "--config", str(config), cwd=tmp_path))
    assert f"{key} must be {expected}" in line, line


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("peers", 5, "a string"),
    ("max_pending_requests", True, "an integer"),
    ("max_pending_requests", 2.0, "an integer"),
    ("enable_fault_injection", 0, "true or false"),
    ("preferred_leader_ids", ("n0",), "a list of strings"),
    ("disk_space_ratio_to_force_clean", None, "a number"),
])
def test_from_dict_checks_every_value_against_its_field_type(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as ei:
        DLedgerConfig.from_dict({key: value})
    assert f"{key} must be {expected}" in ei.value.message


def test_an_int_passes_as_a_float_and_good_values_pass() -> None:
    cfg = DLedgerConfig.from_dict({"file_reserved_hours": 2, "disk_space_ratio_to_force_clean": 1,
                                   "preferred_leader_ids": ["n0"], "enable_fault_injection": True,
                                   "metrics_port": 0, "tls_cert": ""})
    assert cfg.file_reserved_hours == 2.0 and isinstance(cfg.file_reserved_hours, float)
    assert cfg.preferred_leader_ids == ["n0"] and cfg.enable_fault_injection is True


# --- 4. a member on a port in use ------------------------------------------------------------------


@pytest.mark.integration
def test_server_on_a_port_in_use(tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    p = dledger("server", "--id", "n0", "--peers", f"n0-127.0.0.1:{port}", "--store-dir", str(tmp_path / "s"),
                cwd=tmp_path)
    assert one_error_line(p) == f"dledger: error: cannot listen on 127.0.0.1:{port}: address already in use"
    # the failed start let go of its store: another member can open it
    lock = tmp_path / "s" / "lock"
    assert not lock.exists() or lock.read_text() == ""


@pytest.mark.integration
def test_server_with_its_metrics_port_in_use(tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    p = dledger("server", "--id", "n0", "--peers", f"n0-127.0.0.1:{free_ports(1, avoid=[port])[0]}",
                "--store-dir", str(tmp_path / "s"), "--metrics-port", str(port), cwd=tmp_path)
    line = one_error_line(p)
    assert str(port) in line and "address already in use" in line, line


# --- 5. a local cluster on ports in use ------------------------------------------------------------


def _stop(p: subprocess.Popen[bytes]) -> None:
    stop_processes([p], 60)


@pytest.mark.integration
def test_cluster_on_the_ports_of_a_running_cluster_refuses_before_starting(tmp_path: Path) -> None:
    base = free_port_run(3)
    first = subprocess.Popen([sys.executable, "-m", "dledger", "cluster", "--insecure", "--nodes", "1",
                              "--base-port", str(base), "--data-dir", str(tmp_path / "first")],
                             cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        with DLedgerClient(f"n0-127.0.0.1:{base}", "default", timeout=1.0) as c:
            wait_until(lambda: first.poll() is None and c.metadata("n0").leader_id, 60, "the first cluster leads")
        p = dledger("cluster", "--nodes", "3", "--base-port", str(base), "--data-dir", str(tmp_path / "second"),
                    cwd=tmp_path)
        line = one_error_line(p)
        assert f"{base} (n0)" in line and "in use" in line, line
        assert f"{base + 1} (n1)" not in line, line  # only the busy ones are named
        assert b"peers:" not in p.stdout
        assert not (tmp_path / "second" / "default").exists(), "a member of the refused cluster started"
        assert first.poll() is None, "the first cluster was disturbed"
    finally:
        _stop(first)


@pytest.mark.integration
def test_cluster_with_a_metrics_port_in_use(tmp_path: Path, listener: socket.socket) -> None:
    busy = listener.getsockname()[1]
    base = free_port_run(2)
    p = dledger("cluster", "--nodes", "2", "--base-port", str(base), "--metrics-base-port", str(busy - 1),
                "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    line = one_error_line(p)
    assert f"{busy} (n1 metrics)" in line, line
    assert b"peers:" not in p.stdout and not (tmp_path / "d" / "default").exists()


# --- 6. unusable store directories ----------------------------------------------------------------


def _server_args(store_dir: Path) -> list[str]:
    return ["server", "--id", "n0", "--peers", f"n0-127.0.0.1:{free_ports(1)[0]}", "--store-dir", str(store_dir)]


@pytest.mark.integration
def test_store_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "not-a-dir"
    f.write_bytes(b"x")
    line = one_error_line(dledger(*_server_args(f), cwd=tmp_path))
    assert str(f) in line and "not a directory" in line, line
    line = one_error_line(dledger(*_server_args(f / "below"), cwd=tmp_path))
    assert str(f) in line and "not a directory" in line, line


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_store_dir_that_is_read_only(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        for store_dir in (d, d / "member"):
            line = one_error_line(dledger(*_server_args(store_dir), cwd=tmp_path))
            assert str(d) in line and "not writable" in line, line
    finally:
        d.chmod(stat.S_IRWXU)


# --- 7. anything else ------------------------------------------------------------------------------


_BOOM = """
import sys
from dledger import cli

@cli.cli.command("boom")
def boom() -> None:
    raise RuntimeError("a bug\\nover two lines")

sys.argv = ["dledger", *sys.argv[1:]]
cli.main()
"""


@pytest.mark.integration
def test_an_unexpected_exception_is_one_line_and_the_traceback_is_behind_vv(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-c", _BOOM, *args], capture_output=True, timeout=60, check=False,
                              cwd=tmp_path)

    want = "dledger: internal error: RuntimeError: a bug over two lines (run with -vv for the traceback)"
    assert one_error_line(run("boom")) == want
    p = run("-vv", "boom")
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1
    assert "Traceback" in err and "RuntimeError" in err, err
    assert err.strip().splitlines()[-1] == want


# --- store inspect / repair-term ----------------------------------------------------------------


def _json(p: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 1, lines
    out = json.loads(lines[0])
    assert isinstance(out, dict)
    return out


@pytest.mark.integration
def test_store_inspect_and_repair_term_on_a_member_store(make_cluster: MakeCluster, tmp_path: Path) -> None:
    c = make_cluster(1)
    c.wait_leader()
    client = c.client()
    acked = [client.append(f"entry {k}".encode()) for k in range(5)]
    last_term = acked[-1].term
    store = c.store_dir("n0")

    # a running member holds its store: inspect reads beside it, repair-term refuses
    view = _json(dledger("store", "inspect", "--store-dir", str(store), cwd=tmp_path))
    assert view["problems"] == [] and view["end_index"] >= acked[-1].index
    line = one_error_line(dledger("store", "repair-term", "--store-dir", str(store), cwd=tmp_path))
    assert "in use" in line and str(store) in line, line

    c.stop()
    bogus = 2**63 - 1  # what a forged HEART_BEAT once left behind
    (store / "currterm").write_text(json.dumps({"term": bogus, "voted_for": "n0"}))

    view = _json(dledger("store", "inspect", "--store-dir", str(store), cwd=tmp_path))
    # a term no message or record could carry: unreadable (a member refuses it), the problem names it
    assert view["term"] is None and view["voted_for"] is None
    assert view["end_index"] >= acked[-1].index and view["last_term"] >= last_term
    assert any(f"term {bogus} is at or beyond dledger's limit" in p and "repair-term" in p
               for p in view["problems"]), view

    # refusals, each one line, nothing written
    line = one_error_line(dledger("store", "repair-term", "--store-dir", str(store), "--term", str(LIMIT),
                                  cwd=tmp_path))
    assert "2**62" in line, line
    line = one_error_line(dledger("store", "repair-term", "--store-dir", str(store), "--term", "0", cwd=tmp_path))
    assert "below the last entry's term" in line, line
    assert json.loads((store / "currterm").read_text())["term"] == bogus
    one_error_line(dledger("store", "inspect", "--store-dir", str(tmp_path), cwd=tmp_path))

    change = _json(dledger("store", "repair-term", "--store-dir", str(store), cwd=tmp_path))
    assert change["term"] == {"before": None, "after": view["last_term"]}  # the unreadable term replaced
    assert change["voted_for"] == {"before": None, "after": None}
    repaired = _json(dledger("store", "inspect", "--store-dir", str(store), cwd=tmp_path))
    assert repaired["problems"] == [] and repaired["term"] == view["last_term"] and repaired["voted_for"] is None

    c.restart("n0")
    c.wait_leader(timeout=60)
    meta = c.leader_meta()
    assert view["last_term"] < meta.term < LIMIT
    for r in acked:
        assert c.ctl.get(r.index).body == f"entry {r.index - acked[0].index}".encode()
    r = c.client().append(b"after the repair")
    assert r.term == meta.term and c.ctl.get(r.index).body == b"after the repair"


@pytest.mark.integration
def test_repair_term_with_an_explicit_term(make_cluster: MakeCluster, tmp_path: Path) -> None:
    c = make_cluster(1)
    c.wait_leader()
    last = c.client().append(b"x").term
    c.stop()
    store = c.store_dir("n0")
    (store / "currterm").write_text("{not json")
    view = _json(dledger("store", "inspect", "--store-dir", str(store), cwd=tmp_path))
    assert view["term"] is None and any("unreadable" in p for p in view["problems"]), view
    change = _json(dledger("store", "repair-term", "--store-dir", str(store), "--term", str(last + 10), cwd=tmp_path))
    assert change["term"] == {"before": None, "after": last + 10}
    c.restart("n0")
    c.wait_leader(timeout=60)
    assert c.leader_meta().term > last + 10
