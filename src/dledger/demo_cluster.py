"""The cluster stage of `make demo`: failover under load loses nothing acknowledged."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dledger.codes import DLedgerError
from dledger.config import Peer, format_peers
from dledger.local_cluster import client_tls, local_cluster
from dledger.ports import free_port_run
from dledger.runtime.client import DLedgerClient
from dledger.security.certs import make_certs
from dledger.security.tls import TlsConfig

console = Console()

WRITERS = 4
BATCH = 20





class Workload:
    """Writers append unique bodies and record every acknowledged (index, body)."""

    def __init__(self, peers: str, total: int, tls: TlsConfig | None = None) -> None:
        self.peers = peers
        self.tls = tls
        self.total = total
        self.acked: dict[int, bytes] = {}
        self.errors: dict[str, int] = {}
        self.lock = threading.Lock()
        self.next_id = 0
        self.stop = threading.Event()
        self.last_ok = time.monotonic()
        self.longest_gap = 0.0
        self.first_ack: dict[int, float] = {}  # term -> when an append of that term was first acknowledged

    def _claim(self) -> int | None:
        with self.lock:
            if self.next_id >= self.total:
                return None
            k = self.next_id
            self.next_id += BATCH
            return k

    def writer(self) -> None:
        with DLedgerClient(self.peers, timeout=10.0, tls=self.tls) as c:
            while not self.stop.is_set():
                k = self._claim()
                if k is None:
                    return
                bodies = [f"order-{i:07d}".encode() for i in range(k, min(k + BATCH, self.total))]
                while not self.stop.is_set():
                    try:
                        results = c.append_batch(bodies)
                    except DLedgerError as e:
                        with self.lock:
                            self.errors[e.code.name] = self.errors.get(e.code.name, 0) + 1
                        time.sleep(0.05)
                        continue  # unknown outcome: retried bodies may appear twice (at-least-once)
                    now = time.monotonic()
                    with self.lock:
                        self.longest_gap = max(self.longest_gap, now - self.last_ok)
                        self.last_ok = now
                        self.first_ack.setdefault(results[0].term, now)
                        for r, b in zip(results, bodies, strict=True):
                            self.acked[r.index] = b
                    break

    def failover_after(self, term: int, since: float) -> float | None:
        """Seconds from `since` to the first append acknowledged in a term after `term`
        (an answer of the old leader that arrives after the kill does not count)."""
        with self.lock:
            later = [t for k, t in self.first_ack.items() if k > term]
        return min(later) - since if later else None

    @property
    def done(self) -> int:
        with self.lock:
            return len(self.acked)


def cluster_demo(base: Path, total: int = 20_000) -> bool:
    console.rule("[bold]2. cluster: 3 members, SIGKILL the leader under load")
    port = free_port_run(3)
    peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
    tls_dir = base / "certs"
    make_certs(tls_dir, ["n0", "n1", "n2"], force=True)
    tls = client_tls(tls_dir)
    lc = local_cluster(peers, "default", base / "cluster", flush="sync", tls_dir=tls_dir)
    with lc as procs, DLedgerClient(peers, tls=tls) as admin:
        console.print(f"peers: {peers}  (flush=sync: acknowledged = fsynced on a majority; mutual TLS)")
        meta = admin.metadata()
        leader, term = meta.leader_id, meta.term
        console.print(f"leader elected: [bold]{leader}[/bold]")
        work = Workload(peers, total, tls)
        threads = [threading.Thread(target=work.writer, daemon=True) for _ in range(WRITERS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        killed_at = failover_s = None
        new_leader = None
        cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn())
        with Progress(*cols, console=console) as progress:
            task = progress.add_task("appending", total=total)
            while any(t.is_alive() for t in threads):
                done = work.done
                progress.update(task, completed=done)
                if killed_at is None and done >= total // 3 and leader is not None:
                    os.kill(procs[leader].pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                    progress.console.print(f"[red]SIGKILL leader {leader}[/red] after {done} acknowledged entries")
                if killed_at is not None and failover_s is None:
                    failover_s = work.failover_after(term, killed_at)
                    if failover_s is not None:
                        new_leader = _new_leader(admin, leader)
                        progress.console.print(f"[green]appends flow again[/green] after {failover_s:.2f} s, "
                                               f"new leader {new_leader}")
                time.sleep(0.1)
            progress.update(task, completed=work.done)
        elapsed = time.monotonic() - t0
        if leader is not None:
            lc.start_member(leader)
            console.print(f"restarted {leader}; waiting for it to catch up")
        ok = _verify(admin, peers, work)
        table = Table(title="cluster run")
        table.add_column("metric")
        table.add_column("value")
        table.add_row("acknowledged entries", str(len(work.acked)))
        rate = len(work.acked) / elapsed
        table.add_row("throughput", f"{rate:,.0f} entries/s ({WRITERS} writers, batches of {BATCH})")
        table.add_row("failover (kill -> appends flow)", f"{failover_s:.2f} s" if failover_s else "n/a")
        table.add_row("longest append gap", f"{work.longest_gap:.2f} s")
        table.add_row("client errors (retried)", ", ".join(f"{k} x{v}" for k, v in work.errors.items()) or "none")
        table.add_row("all acknowledged present on every member", "[green]yes[/green]" if ok else "[red]NO[/red]")
        console.print(table)
        return ok


def _new_leader(admin: DLedgerClient, old: str | None, timeout: float = 10.0) -> str | None:
    """The leader once the members have noticed the old one is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            lead = admin.metadata().leader_id
        except DLedgerError:
            lead = None
        if lead not in (None, old):
            return lead
        time.sleep(0.1)
    return None


def _verify(admin: DLedgerClient, peers: str, work: Workload, timeout: float = 60.0) -> bool:
    """Every member caught up to the same commit index, and every acknowledged
    entry is at its index, read through each member."""
    members = [p.split("-")[0] for p in peers.split(";")]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            views = [admin.metadata(m) for m in members]
            if len({(v.ledger_end_index, v.committed_index) for v in views}) == 1:
                break
        except DLedgerError:
            pass
        time.sleep(0.3)
    else:
        console.print("[red]members did not converge[/red]")
        return False
    top = max(work.acked) if work.acked else -1
    for m in members:
        got: dict[int, bytes] = {}
        index = 0
        while index <= top:
            batch = admin.read(index, 5000, member=m)
            if not batch:
                break
            got.update((e.index, e.body) for e in batch)
            index = batch[-1].index + 1
        missing = [i for i, b in work.acked.items() if got.get(i) != b]
        if missing:
            console.print(f"[red]{m}: {len(missing)} acknowledged entries missing, e.g. {missing[:5]}[/red]")
            return False
        console.print(f"{m}: all {len(work.acked)} acknowledged entries present")
    return True
