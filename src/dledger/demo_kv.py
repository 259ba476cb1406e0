"""The key-value stage of `make demo`: a replicated state machine on the log (docs/state-machines.md).

Three members run `--state-machine kv` with small snapshot thresholds (and small data files,
so compaction behind snapshots deletes some). The demo writes keys through proposals (each
answered with its apply result), runs a compare-and-set race that exactly one client wins,
kills the leader and writes on, restarts it, wipes a follower's disk and lets it rejoin by
InstallSnapshot, reads at that follower (a follower read, linearizable), and checks that every
member's own copy of the state is the same and that members snapshotted on their own.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dledger.codes import DLedgerError
from dledger.config import Peer, format_peers
from dledger.kv import AsyncKVClient, KVClient
from dledger.local_cluster import local_cluster
from dledger.ports import free_port_run
from dledger.runtime.client import DLedgerClient, Metadata

console = Console()
KEYS = 2000


def _state(kv: KVClient, member: str) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    after: bytes | None = None
    while True:
        page = kv.range("", 1000, after, member=member)
        out.update({i.key: i.value for i in page.items})
        if not page.more:
            return out
        after = page.items[-1].key


async def _race(peers: str, key: str, expect: int, n: int = 8) -> int:
    clients = [AsyncKVClient(peers, timeout=10) for _ in range(n)]
    try:
        results = await asyncio.gather(*(c.cas(key, f"owner-{k}", expect_index=expect)
                                         for k, c in enumerate(clients)))
        return sum(r.ok for r in results)
    finally:
        for c in clients:
            await c.close()


async def _put_many(peers: str, start: int, count: int) -> None:
    async with AsyncKVClient(peers, timeout=30) as kv:
        sem = asyncio.Semaphore(64)

        async def put(k: int) -> None:
            async with sem:
                await kv.put(f"user/{k:05d}", f"profile-{k}")

        await asyncio.gather(*(put(k) for k in range(start, start + count)))


def _wait(cond: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if cond():
                return True
        except DLedgerError:
            pass  # a member not listening yet
        time.sleep(0.2)
    return False


def kv_demo(base: Path) -> bool:
    console.rule("[bold]3. a replicated key-value store: the log as a state machine")
    port = free_port_run(3)
    peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
    (base / "kv").mkdir(parents=True, exist_ok=True)
    toml = base / "kv" / "small-files.toml"  # small data files: compaction deletes whole ones
    toml.write_text("data_file_size = 65536\nretention_check_interval_ms = 500\n")
    extra = ["--state-machine", "kv", "--snapshot-threshold-entries", "500", "--snapshot-margin-entries", "100",
             "--config", str(toml)]
    lc = local_cluster(peers, "default", base / "kv", extra=extra)
    with lc as procs, KVClient(peers, timeout=30) as kv, DLedgerClient(peers, timeout=30) as log:
        t0 = time.monotonic()
        asyncio.run(_put_many(peers, 0, KEYS))
        rate = KEYS / (time.monotonic() - t0)
        lock = kv.put("lock", "free")
        winners = asyncio.run(_race(peers, "lock", lock.index))
        leader = log.metadata().leader_id or "n0"
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait()
        asyncio.run(_put_many(peers, KEYS, 200))
        lc.start_member(leader)
        metas: dict[str, Metadata] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                metas = {m: log.metadata(m) for m in procs}
            except DLedgerError:
                continue  # the restarted member is not listening yet
            committed = max(v.committed_index for v in metas.values())
            if all(v.applied_index == committed for v in metas.values()):
                break
        # a follower's disk replaced: it comes back empty, behind the leader's compacted log
        lead = log.metadata().leader_id or leader
        wiped = next(m for m in procs if m != lead)
        procs[wiped].send_signal(signal.SIGKILL)
        procs[wiped].wait()
        shutil.rmtree(base / "kv" / "default" / wiped)
        asyncio.run(_put_many(peers, KEYS + 200, 100))
        compacted = _wait(lambda: log.metadata(lead).ledger_begin_index > 0, 30)
        lc.start_member(wiped)
        top = log.metadata().committed_index
        installed = _wait(lambda: (v := log.metadata(wiped)).applied_index >= top and v.ledger_begin_index > 0, 60)
        follower_read = kv.get("user/00007", member=wiped, consistency="linearizable")
        metas = {m: log.metadata(m) for m in procs}
        states = {m: _state(kv, m) for m in procs}
        same = len({tuple(sorted(s.items())) for s in states.values()}) == 1
        table = Table(show_header=True)
        table.add_column("check")
        table.add_column("result")
        table.add_row("proposals (put, answered once applied)", f"{KEYS:,} at {rate:,.0f}/s (64 in flight)")
        table.add_row("compare-and-set race, 8 clients", f"{winners} winner")
        table.add_row(f"leader {leader} killed, 200 more puts, restarted", "ok")
        table.add_row(f"{wiped}'s disk wiped; it rejoins by InstallSnapshot",
                      f"{'yes' if installed else 'NO'} (its log begins at {metas[wiped].ledger_begin_index}; "
                      f"the leader compacted: {'yes' if compacted else 'no'})")
        table.add_row(f"linearizable read at follower {wiped}",
                      follower_read.value.decode() if follower_read is not None else "MISSING")
        table.add_row("every member's own state equal", f"{'yes' if same else 'NO'} ({len(states[leader]):,} keys)")
        table.add_row("snapshots (every 500 entries)",
                      ", ".join(f"{m}: {v.snapshot_index}" for m, v in sorted(metas.items())))
        console.print(table)
        ok = same and winners == 1 and len(states[leader]) == KEYS + 301 and installed and all(
            v.snapshot_index > 0 for v in metas.values()) and follower_read is not None
    console.print("[green]OK[/green]" if ok else "[red]FAILED[/red]")
    return ok
