"""Replicated state machines on real member processes (issue 12): the KV store as the state
machine, proposals answered with apply results, queries, snapshots (on demand and by
threshold), restarts that restore a snapshot and apply the log after it, a damaged
snapshot skipped. Waits poll a condition up to a generous deadline; nothing is timed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dledger.cli import cli
from dledger.clitools import UserError
from dledger.codes import DLedgerError, ResponseCode
from dledger.kv import AsyncKVClient, KVClient
from integration.harness import Cluster, MakeCluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kv_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A KV group shared by the tests that only touch keys of their own."""
    c = Cluster(3, tmp_path_factory.mktemp("kv"), extra=["--state-machine", "kv"])
    try:
        c.start()
        yield c
    finally:
        c.cleanup()


def kv_client(c: Cluster) -> KVClient:
    return KVClient("", client=c.client(timeout=30))


def snapshot_dirs(c: Cluster, member: str) -> list[str]:
    d = c.store_dir(member) / "snapshot"
    return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


def state_of(c: Cluster, member: str) -> dict[bytes, tuple[bytes, int]]:
    """Everything `member` holds, from its own applied copy."""
    kv = kv_client(c)
    out: dict[bytes, tuple[bytes, int]] = {}
    after: bytes | None = None
    while True:
        page = kv.range("", 1000, after, member=member)
        out.update({i.key: (i.value, i.mod_index) for i in page.items})
        if not page.more:
            return out
        after = page.items[-1].key


def test_kv_group_proposes_queries_and_survives_restarts(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, extra=["--state-machine", "kv", "--snapshot-threshold-entries", "40"])
    kv = kv_client(c)
    r = kv.put("k0", "v0")
    assert r.ok and r.prev is None and r.prev_index == -1
    first = r.index
    assert kv.put("k0", "v1").prev == b"v0"
    item = kv.get("k0")
    assert item is not None and (item.value, item.mod_index) == (b"v1", first + 1)
    # compare-and-set on the mod index: only the right expectation wins
    assert not kv.cas("k0", "x", expect_index=first).ok
    assert kv.cas("k0", "v2", expect_index=first + 1).ok
    assert kv.cas("new", "n", expect_index=-1).ok and not kv.cas("new", "n", expect_index=-1).ok
    assert kv.delete("new").ok and not kv.delete("new").ok
    assert kv.get("new") is None
    for k in range(100):  # past the threshold of 40: every member snapshots on its own
        kv.put(f"p/{k:03d}", f"value-{k}")
    page = kv.range("p/", limit=30)
    assert [i.key for i in page.items] == [f"p/{k:03d}".encode() for k in range(30)] and page.more
    page = kv.range("p/", limit=1000, start_after="p/090")
    assert [i.key for i in page.items] == [f"p/{k:03d}".encode() for k in range(91, 100)] and not page.more
    end = c.wait_caught_up()
    wait_until(lambda: all(c.meta(m) is not None and c.meta(m).applied_index == end for m in c.ids),  # type: ignore[union-attr]
               60, "every member applied everything")
    want = state_of(c, c.ids[0])
    assert len(want) == 101
    for m in c.ids:
        assert state_of(c, m) == want, f"{m} holds another state"
        wait_until(lambda m=m: len(snapshot_dirs(c, m)) >= 1, 60, f"{m} snapshots past the threshold")  # type: ignore[misc]
        assert len(snapshot_dirs(c, m)) <= 2  # the two newest are kept

    # a member killed (no clean stop) restores its newest snapshot and applies the log after it
    x = next(m for m in c.ids if c.meta(m) is not None and c.meta(m).role == "follower")  # type: ignore[union-attr]
    c.kill(x)
    kv.put("while-down", "yes")
    c.restart(x)
    end = c.wait_caught_up(timeout=60)
    wait_until(lambda: (c.meta(x) is not None and c.meta(x).applied_index == end), 60,  # type: ignore[union-attr]
               f"{x} applied everything again")
    assert state_of(c, x) == state_of(c, c.ids[0] if c.ids[0] != x else c.ids[1])
    assert c.meta(x).snapshot_index >= 40  # type: ignore[union-attr]


def test_a_damaged_snapshot_is_skipped_never_half_loaded(make_cluster: MakeCluster, tmp_path: Path) -> None:
    c = make_cluster(3, extra=["--state-machine", "kv", "--snapshot-threshold-entries", "0"])
    kv = kv_client(c)
    for k in range(10):
        kv.put(f"a{k}", str(k))
    first = subprocess.run([sys.executable, "-m", "dledger", "snapshot", "--peers", c.peers, "--group", c.group],
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("snapshot through index") == 3
    for k in range(10, 20):
        kv.put(f"a{k}", str(k))
    x = c.ids[2]
    assert kv.snapshot(x) > 0
    c.wait_caught_up()
    older, newest = snapshot_dirs(c, x)
    c.kill(x, signal.SIGTERM)
    blob = c.store_dir(x) / "snapshot" / newest / "kv.msgpack"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    (c.store_dir(x) / "snapshot" / ".tmp-00000000000000000999-1-1").mkdir()  # a half-written one
    c.restart(x)
    end = c.wait_caught_up(timeout=60)
    wait_until(lambda: c.meta(x) is not None and c.meta(x).applied_index == end, 60,  # type: ignore[union-attr]
               f"{x} rebuilt its state from the older snapshot and the log")
    assert state_of(c, x) == state_of(c, c.ids[0])
    assert len(state_of(c, x)) == 20
    assert not (c.store_dir(x) / "snapshot" / ".tmp-00000000000000000999-1-1").exists()
    assert c.meta(x).snapshot_index == int(older)  # type: ignore[union-attr]


def test_concurrent_compare_and_set_has_exactly_one_winner(kv_group: Cluster) -> None:
    c = kv_group

    async def race() -> list[bool]:
        clients = [AsyncKVClient(c.peers, c.group, timeout=30) for _ in range(8)]
        try:
            base = await clients[0].put("lock", "free")
            results = await asyncio.gather(*(kv.cas("lock", f"owner-{k}", expect_index=base.index)
                                             for k, kv in enumerate(clients)))
            return [r.ok for r in results]
        finally:
            for kv in clients:
                await kv.close()

    oks = asyncio.run(race())
    assert oks.count(True) == 1


def test_kv_commands_output_json_or_table(kv_group: Cluster) -> None:
    """`dledger kv` (in this process: no interpreter start per command): writes print a JSON
    object by default, `get` raw bytes, `range` key<TAB>value lines; -o json gives JSON lines
    (values as `read`'s bodies), -o table a table."""
    def kv(*args: str, stdin: bytes | None = None, ok: bool = True) -> Result:
        result = CliRunner(env={"COLUMNS": "200"}).invoke(
            cli, ["kv", "--peers", kv_group.peers, "--group", kv_group.group, *args], input=stdin)
        assert (result.exit_code == 0) == ok, (result.output, result.exception)
        return result

    first = kv("put", "cli/a", "alpha").stdout
    index = json.loads(first)["index"]
    assert first == f'{{"ok": true, "index": {index}, "prev": null, "prev_mod_index": -1}}\n'  # as before
    table = kv("put", "cli/a", "beta", "-o", "table").stdout
    assert "prev_mod_index" in table and "alpha" in table and str(index) in table and "{" not in table
    kv("put", "cli/bin", "--stdin", stdin=b"\xff\x00")
    over = json.loads(kv("put", "cli/bin", "text", "-o", "json").stdout)
    assert over["prev"] == {"b64": base64.b64encode(b"\xff\x00").decode()}  # as `read`'s bodies
    assert kv("get", "cli/a").stdout_bytes == b"beta"  # raw, as before
    got = json.loads(kv("get", "cli/a", "-o", "json").stdout)
    assert got == {"key": "cli/a", "value": "beta", "mod_index": index + 1}
    assert "beta" in kv("get", "cli/a", "-o", "table").stdout
    assert kv("range", "cli/").stdout == "cli/a\tbeta\ncli/bin\ttext\n"  # as before
    assert kv("range", "cli/", "--base64").stdout == "cli/a\tYmV0YQ==\ncli/bin\tdGV4dA==\n"
    assert kv("get", "cli/a", "--base64").stdout == "YmV0YQ==\n"
    rows = [json.loads(line) for line in kv("range", "cli/", "-o", "json").stdout.splitlines()]
    assert [(r["key"], r["value"]) for r in rows] == [("cli/a", "beta"), ("cli/bin", "text")]
    table = kv("range", "cli/", "-o", "table").stdout
    assert all(x in table for x in ("cli/a", "beta", "cli/bin", "mod_index"))
    failed = kv("cas", "cli/a", "z", "--expect-index", str(index), "-o", "json", ok=False)
    assert json.loads(failed.stdout)["ok"] is False and isinstance(failed.exception, UserError)
    assert "True" in kv("del", "cli/bin", "-o", "table").stdout
    assert json.loads(kv("del", "cli/bin", "-o", "json").stdout)["ok"] is False


def test_a_plain_log_refuses_proposals_and_queries_with_a_clear_error(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    kv = kv_client(c)
    with pytest.raises(DLedgerError) as e:
        kv.put("a", "b")
    assert e.value.code == ResponseCode.UNSUPPORTED and "no state machine" in e.value.message
    with pytest.raises(DLedgerError) as e:
        kv.get("a")
    assert e.value.code == ResponseCode.UNSUPPORTED
    c.client().append(b"plain")
    assert c.ctl.snapshot(c.ids[0]) >= 0  # a plain log's snapshot is empty (meta only)
    assert snapshot_dirs(c, c.ids[0])
    shutil.rmtree(c.store_dir(c.ids[1]) / "snapshot", ignore_errors=True)  # nothing depends on it


def test_snapshots_compact_the_log_and_a_restart_rebuilds_from_them(make_cluster: MakeCluster,
                                                                    tmp_path: Path) -> None:
    toml = tmp_path / "small-files.toml"
    toml.write_text("data_file_size = 65536\nindex_file_size = 32768\nretention_check_interval_ms = 200\n")
    c = make_cluster(3, extra=["--config", str(toml), "--state-machine", "kv", "--snapshot-threshold-entries",
                               "100", "--snapshot-margin-entries", "50"])
    kv = kv_client(c)
    for k in range(600):
        kv.put(f"k{k:04d}", "v" * 200)
    end = c.wait_caught_up()

    def compacted() -> bool:
        views = [c.meta(m) for m in c.ids]
        return all(v is not None and v.applied_index == end and v.ledger_begin_index > 100 for v in views)

    wait_until(compacted, 60, "every member deletes the log its snapshots cover")
    for m in c.ids:
        v = c.meta(m)
        assert v is not None and v.ledger_begin_index <= v.snapshot_index - 50 + 1  # the margin stays
    x = c.ids[1]
    c.kill(x)
    kv.put("late", "x")
    c.restart(x)
    end = c.wait_caught_up(timeout=60)
    wait_until(lambda: c.meta(x) is not None and c.meta(x).applied_index == end, 60,  # type: ignore[union-attr]
               f"{x} rebuilt its state from its snapshot and the log after it")
    assert state_of(c, x) == state_of(c, c.ids[0]) and len(state_of(c, x)) == 601
