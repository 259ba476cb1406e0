"""A producer id reused by a second process for other data fails loudly at its first append.

Each writer is a real process with its own client (blocking or asyncio), as a restarted
service would be: the first appends A1..A4 under a producer id, the second B1..B4 under
the same id. Before the leader compared bodies the second got the first's indexes for
B1..B3 and only B4 was stored, without a word; now its first append is refused, nothing
of it is stored, and the error says how to start a new session (core.producers,
runtime.client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from .harness import Cluster, MakeCluster, read_all

pytestmark = pytest.mark.integration

_WRITER = textwrap.dedent("""
    import asyncio, json, sys
    from dledger.codes import DLedgerError
    from dledger.runtime.client import AsyncDLedgerClient, DLedgerClient
    peers, group, pid, epoch, mode = sys.argv[1:6]
    bodies = [b.encode() for b in sys.argv[6:]]
    out = {"indexes": []}

    async def run_async():
        async with AsyncDLedgerClient(peers, group, timeout=30, idempotent=True, producer_id=pid,
                                      producer_epoch=int(epoch)) as c:
            for b in bodies:
                out["indexes"].append((await c.append(b)).index)

    try:
        if mode == "async":
            asyncio.run(run_async())
        else:
            with DLedgerClient(peers, group, timeout=30, idempotent=True, producer_id=pid,
                               producer_epoch=int(epoch)) as c:
                if mode == "batch":
                    out["indexes"] = [r.index for r in c.append_batch(bodies)]
                else:
                    for b in bodies:
                        out["indexes"].append(c.append(b).index)
    except DLedgerError as e:
        out["code"], out["error"] = int(e.code), str(e)
    print(json.dumps(out))
""")


def _write(cluster: Cluster, pid: str, bodies: list[str], mode: str = "one", epoch: int = 0) -> dict[str, object]:
    """Run one writer process to its end: the indexes it got, and the error it ended on."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", _WRITER, cluster.peers, cluster.group, pid, str(epoch), mode, *bodies],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _log(cluster: Cluster) -> Counter[bytes]:
    return Counter(body for _, body in read_all(cluster.ctl).values())


@pytest.mark.parametrize("first_mode,second_mode", [("one", "one"), ("batch", "async")])
def test_a_second_process_reusing_a_producer_id_fails_at_its_first_append(
        make_cluster: MakeCluster, first_mode: str, second_mode: str) -> None:
    cluster = make_cluster(1)
    pid = f"svc-{first_mode}-{second_mode}"
    a = [f"A{k}" for k in range(1, 5)]
    b = [f"B{k}" for k in range(1, 5)]
    first = _write(cluster, pid, a, first_mode)
    assert "code" not in first and len(first["indexes"]) == 4  # type: ignore[arg-type]
    second = _write(cluster, pid, b, second_mode)
    assert second["code"] == 436 and second["indexes"] == [], second  # refused at its first append
    assert "producer_epoch above every epoch" in str(second["error"]) and "another producer_id" in str(second["error"])
    log = _log(cluster)
    assert all(log[x.encode()] == 1 for x in a) and not any(log[x.encode()] for x in b), log
    # the way the error names: a new session of the same id stores B1..B4, each once
    third = _write(cluster, pid, b, second_mode, epoch=1)
    assert "code" not in third and len(third["indexes"]) == 4, third  # type: ignore[arg-type]
    log = _log(cluster)
    assert all(log[x.encode()] == 1 for x in a + b), log


def test_a_process_behind_a_later_session_is_fenced_at_its_first_append(make_cluster: MakeCluster) -> None:
    """The first process ran a later epoch (its own choice, or its client's new session after
    the group forgot it): a second one starting at epoch 0 is fenced, and told which epoch
    to go above; the same epoch with other bodies is a reuse."""
    cluster = make_cluster(1)
    first = _write(cluster, "svc-epoch", ["A1", "A2"], epoch=3)
    assert "code" not in first, first
    for mode in ("one", "async"):
        second = _write(cluster, "svc-epoch", ["B1", "B2"], mode)
        assert second["code"] == 434 and second["indexes"] == [], second
        assert "producer_epoch above" in str(second["error"]), second
    again = _write(cluster, "svc-epoch", ["B1", "B2"], epoch=3)
    assert again["code"] == 436 and again["indexes"] == [], again
    assert not any(_log(cluster)[x] for x in (b"B1", b"B2"))
    # the very same bodies again (a restarted process re-sending what it had sent) are answered
    resent = _write(cluster, "svc-epoch", ["A1", "A2"], epoch=3)
    assert resent["indexes"] == first["indexes"], resent
    assert all(_log(cluster)[x] == 1 for x in (b"A1", b"A2"))
