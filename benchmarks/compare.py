"""Side-by-side benchmark: dledger (flush=sync and flush=async) against etcd and PySyncObj.

    make bench-compare            # or: .venv/bin/python benchmarks/compare.py --help

Everything runs on 127.0.0.1, three members each, one system at a time:

* dledger: `dledger bench --peers ...` against a local group (dledger.local_cluster);
* etcd 3.4: three `etcd` members; load = concurrent puts (or txns of 100 puts) through the
  JSON gRPC gateway over raw keep-alive HTTP/1.1 in K processes (benchmarks/etcd_load.py),
  plus `etcdctl check perf` as a cross-check with etcd's own Go client;
* PySyncObj: three members, each submitting replicated commands with callbacks
  (benchmarks/syncobj_node.py, the pattern of PySyncObj's own benchmarks).

Workloads: (a) single 1 KiB appends, closed loop, a sweep of concurrency (the best counts);
(b) batches of 100 x 1 KiB; (c) open loop at half of the system's own (a) maximum.
Then one profiled run of dledger (py-spy on the leader, a follower, the load generator), and
the goals of docs/performance.md (benchmarks/goals.py: independent clients, tail latency at half
the maximum, five members, linearizable reads; dledger sync against etcd), each with its chart
docs/goal-*.png. A subset: `--systems "" --goals clients,tail` runs only those goals.

Writes the section "Side by side (make bench-compare)" of docs/performance.md (other
sections are kept), docs/bench-compare.png and docs/bench-compare.json. Waits (up to
--wait s) for a quiet machine first: 1-min load average below --max-load.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent
try:
    BIN_SHOWN = str(BIN.relative_to(ROOT))
except ValueError:
    BIN_SHOWN = str(BIN)
SECTION = "## Side by side (make bench-compare)"
KIB = 1024

Record = dict[str, Any]


def say(msg: str) -> None:
    print(f"bench-compare: {msg}", flush=True)


def die(msg: str) -> None:
    print(f"bench-compare: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


# --- tools -----------------------------------------------------------------------------------------


def ensure_tools(args: argparse.Namespace) -> None:
    """etcd + etcdctl from Debian (apt-get) and pysyncobj from PyPI (pip, only when PySyncObj
    is among the systems run), when missing."""
    if not (shutil.which("etcd") and shutil.which("etcdctl")):
        say("etcd/etcdctl not found: installing the Debian packages etcd-server and etcd-client with apt-get")
        if os.geteuid() != 0:
            die("apt-get needs root: run `sudo apt-get install -y etcd-server etcd-client`, then make bench-compare")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "etcd-server", "etcd-client"]
        if subprocess.run(install, env=env).returncode != 0:
            say("apt-get install failed; running apt-get update and trying again")
            subprocess.run(["apt-get", "update"], env=env)
            if subprocess.run(install, env=env).returncode != 0:
                die("could not install etcd-server etcd-client with apt-get")
        if not (shutil.which("etcd") and shutil.which("etcdctl")):
            die("etcd-server/etcd-client installed but etcd or etcdctl is not on PATH")
    if "pysyncobj" in args.systems and importlib.util.find_spec("pysyncobj") is None:
        say(f"pysyncobj not found: installing it with {sys.executable} -m pip install pysyncobj")
        if subprocess.run([sys.executable, "-m", "pip", "install", "-q", "pysyncobj"]).returncode != 0:
            die("could not install pysyncobj with pip")
        importlib.invalidate_caches()
    from benchmarks.profiling import py_spy

    if py_spy() is None:
        say("py-spy not found (it is in the dev extras: make venv): the profiles are skipped")


def versions() -> dict[str, str]:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    etcd = out(["etcd", "--version"]).splitlines()
    try:
        syncobj = importlib.metadata.version("pysyncobj")
    except importlib.metadata.PackageNotFoundError:  # (a goals-only run does not install it)
        syncobj = "-"
    cpu = ""
    with suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return {
        "dledger": importlib.metadata.version("dledger"),
        "dledger_commit": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip(),
        "etcd": etcd[0].split(":", 1)[1].strip() if etcd else "?",
        "pysyncobj": syncobj,
        "python": platform.python_version(),
        "uvloop": importlib.metadata.version("uvloop"),
        "kernel": platform.release(),
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
    }


# --- quiet machine -------------------------------------------------------------------------------


def wait_quiet(max_load: float, wait_s: float) -> tuple[bool, float]:
    from benchmarks.common import loadavg

    deadline = time.monotonic() + wait_s
    while True:
        one = loadavg()[0]
        if one < max_load:
            say(f"load average {one:.2f} < {max_load}: starting")
            return True, one
        if time.monotonic() >= deadline:
            say(f"load average still {one:.2f} after {wait_s:.0f} s: running anyway (the report says so)")
            return False, one
        say(f"1-min load average {one:.2f} >= {max_load}: waiting for a quiet machine ...")
        time.sleep(15)


def others_busy(seconds: float = 3.0) -> float:
    """Cores the rest of the machine keeps busy, measured while none of our processes runs."""
    from benchmarks.common import machine_busy_s

    b0, t0 = machine_busy_s()
    time.sleep(seconds)
    b1, t1 = machine_busy_s()
    return (b1 - b0) / (t1 - t0) * (os.cpu_count() or 1) if t1 > t0 else 0.0


def quiet_gate(max_busy: float, wait_s: float, seconds: float = 3.0) -> float:
    """Before each system: our load average is our own, so wait on the CPU the others use instead."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = others_busy(seconds)
        if busy < max_busy or time.monotonic() >= deadline:
            if busy >= max_busy:
                say(f"other processes still keep {busy:.2f} cores busy: going on")
            return busy
        say(f"other processes keep {busy:.2f} cores busy (>= {max_busy}): waiting ...")
        time.sleep(10)


# --- dledger ---------------------------------------------------------------------------------------


class Runner:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.records: list[Record] = []
        self.profiles: dict[str, Any] = {}
        self.commands: dict[str, str] = {}
        self.loadavg_summary: dict[str, Any] | None = None
        self.others_busy: dict[str, float] = {}  # cores busy on the machine just before each system

    def gate(self) -> float:
        """Before each measurement (the group idle): wait while other processes keep the machine busy."""
        return round(quiet_gate(self.args.max_others_busy + 0.1, self.args.gate_wait / 2), 2)

    def add(self, rec: Record) -> Record:
        r = rec["report"]
        lat = r["latency_ms"]
        say(
            f"{rec['system']:<16} {rec['workload']:<3} {rec['concurrency']:<14} {r['entries_per_s']:>10,.0f} entries/s "
            f"{r['mb_per_s']:>7.1f} MB/s  p50 {num(lat['p50'], 2)} ms  p99 {num(lat['p99'], 2)} ms  "
            f"errors {sum(r['errors'].values())}  load CPU {r['client_cpu_cores']}  "
            f"servers {rec.get('server_cpu', {})}"
        )
        self.records.append(rec)
        return rec

    # dledger ------------------------------------------------------------------------------------

    @contextmanager
    def dledger_group(self, flush: str) -> Iterator[tuple[str, dict[str, Any]]]:
        from dledger.config import Peer, format_peers
        from dledger.local_cluster import local_cluster
        from dledger.ports import free_port_run

        port = free_port_run(3)
        peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
        with local_cluster(peers, "default", self.tmp / f"dledger-{flush}", flush=flush) as procs:
            yield peers, procs

    @staticmethod
    def member_pids(peers: str, procs: dict[str, Any]) -> dict[str, int]:
        from dledger.runtime.client import DLedgerClient

        with DLedgerClient(peers, "default", timeout=5.0) as c:
            leader = c.metadata().leader_id or "n0"
        follower = next(m for m in procs if m != leader)
        out = {"leader": procs[leader].pid, "follower": procs[follower].pid}
        out.update({m: p.pid for m, p in procs.items() if m not in (leader, follower)})
        return out

    def bench_cmd(self, peers: str, clients: int, batch: int, rate: float, procs: int, out: Path,
                  conns: int = 0) -> list[str]:
        a = self.args
        cmd = [str(BIN / "dledger"), "bench", "--peers", peers, "--clients", str(clients), "--size", str(KIB),
               "--batch", str(batch), "--duration", str(a.duration), "--warmup", str(a.warmup), "--json", str(out)]
        if rate:
            cmd += ["--rate", f"{rate:.0f}"]
        if procs > 1:
            cmd += ["--procs", str(procs)]
        if conns:
            cmd += ["--conns", str(conns)]
        return cmd

    def dledger_bench(self, flush: str, workload: str, peers: str, procs_map: dict[str, Any], clients: int,
                      batch: int = 1, rate: float = 0.0, procs: int = 1, conns: int = 0,
                      on_start: Callable[[subprocess.Popen[bytes], dict[str, int]], None] | None = None) -> Record:
        from benchmarks.common import CpuSampler, wait_converged

        wait_converged(peers, say=say)
        idle = self.gate()
        pids = self.member_pids(peers, procs_map)
        out = self.tmp / f"dledger-{flush}-{workload}-{clients}-{procs}-{len(self.records)}.json"
        cmd = self.bench_cmd(peers, clients, batch, rate, procs, out, conns)
        log = self.tmp / (out.stem + ".log")
        with CpuSampler(pids) as cs, open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            if on_start is not None:
                on_start(p, pids)
            rc = p.wait(timeout=self.args.duration + self.args.warmup + 120)
        if rc != 0 or not out.exists():
            die(f"dledger bench failed ({rc}): {' '.join(cmd)}\n{log.read_text(errors='replace')[-3000:]}")
        report = json.loads(out.read_text())
        shown = " ".join(cmd).replace(peers, "$PEERS").replace(str(out), f"{workload}.json")
        shown = shown.replace(str(BIN / "dledger"), "dledger")
        conc = f"{clients} clients" + (f" / {conns} conns" if conns else "") + (f", {procs} procs" if procs > 1 else "")
        return self.add({"system": f"dledger {flush}", "workload": workload, "concurrency": conc, "idle_busy": idle,
                         "report": report, "server_cpu": cs.summary(), "command": shown,
                         "clients": clients, "procs": procs, "conns": conns})

    def run_dledger(self, flush: str) -> None:
        a = self.args
        say(f"dledger flush={flush}: starting a local group of 3 members")
        with self.dledger_group(flush) as (peers, procs_map):
            self.commands[f"dledger {flush} group"] = (
                f"{BIN_SHOWN}/python -m dledger server --group default --id nK --peers $PEERS "
                f"--store-dir DIR/default/nK --flush {flush} --store file   (x3, by dledger.local_cluster)"
            )
            best: Record | None = None
            for c in a.clients:
                r = self.dledger_bench(flush, "a", peers, procs_map, c)
                if best is None or r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                    best = r
            assert best is not None
            procs = 1
            if a.dledger_procs == "auto":
                # is the one load process the bottleneck? the same load from 2 processes says
                r = self.dledger_bench(flush, "a", peers, procs_map, best["clients"], procs=2)
                if r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                    best, procs = r, 2
            elif int(a.dledger_procs) > 1:
                procs = int(a.dledger_procs)
                r = self.dledger_bench(flush, "a", peers, procs_map, best["clients"], procs=procs)
                if r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                    best = r
            for conns in a.dledger_conns:
                # the same clients sharing a few connections (as etcd's benchmark --conns, or one
                # AsyncDLedgerClient shared by an application's tasks)
                r = self.dledger_bench(flush, "a", peers, procs_map, best["clients"], procs=procs, conns=conns)
                if r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                    best = r
            best["best"] = True
            bs = [self.dledger_bench(flush, "b", peers, procs_map, bc, batch=100, procs=procs)
                  for bc in a.batch_clients]
            max(bs, key=lambda r: r["report"]["mb_per_s"])["best"] = True
            rate = 0.5 * best["report"]["entries_per_s"]
            self.dledger_bench(flush, "c", peers, procs_map, best["clients"], rate=rate, procs=procs,
                               conns=best.get("conns", 0))

    def profile_dledger(self) -> None:
        """A separate run (not a measured one) of (a) and (b) at flush=sync with py-spy attached."""
        from benchmarks.profiling import RATE, parse_raw, record

        a = self.args
        best = self.best("dledger sync", "a")
        clients = best["clients"] if best else 64
        procs = best["procs"] if best else 1
        conns = best.get("conns", 0) if best else 0
        pdir = Path(a.profile_dir)
        pdir.mkdir(parents=True, exist_ok=True)
        span = a.duration + a.warmup + 1
        say(f"profiling dledger flush=sync with py-spy (files in {pdir})")
        with self.dledger_group("sync") as (peers, procs_map):
            spies: list[subprocess.Popen[bytes]] = []

            def attach_a(p: subprocess.Popen[bytes], pids: dict[str, int]) -> None:
                time.sleep(0.5)
                for pid, name, fmt, sub, gil in ((pids["leader"], "leader-a.svg", "flamegraph", False, False),
                                                  (pids["leader"], "leader-a.txt", "raw", False, True),
                                                  (pids["follower"], "follower-a.txt", "raw", False, True),
                                                  (p.pid, "loadgen-a.txt", "raw", True, True)):
                    s = record(pid, pdir / name, span, fmt, subprocesses=sub, gil=gil)
                    if s is not None:
                        spies.append(s)

            r = self.dledger_bench("sync", "a", peers, procs_map, clients, procs=procs, conns=conns,
                                   on_start=attach_a)
            for s in spies:
                s.wait(timeout=60)
            spies.clear()
            self.profiles["run_a"] = {"entries_per_s": r["report"]["entries_per_s"], "clients": clients,
                                      "server_cpu": r["server_cpu"]}
            self.records.pop()  # profiled runs are not measurements

            def attach_b(p: subprocess.Popen[bytes], pids: dict[str, int]) -> None:
                time.sleep(0.5)
                s = record(pids["leader"], pdir / "leader-b.txt", span, "raw", gil=True)
                if s is not None:
                    spies.append(s)

            best_b = self.best("dledger sync", "b")
            bclients = best_b["clients"] if best_b else a.batch_clients[0]
            r = self.dledger_bench("sync", "b", peers, procs_map, bclients, batch=100, procs=procs,
                                   on_start=attach_b)
            for s in spies:
                s.wait(timeout=60)
            self.profiles["run_b"] = {"mb_per_s": r["report"]["mb_per_s"], "server_cpu": r["server_cpu"]}
            self.records.pop()
        for name in ("leader-a", "follower-a", "loadgen-a", "leader-b"):
            prof = parse_raw(pdir / f"{name}.txt")
            self.profiles[name] = {"samples": prof.samples, "gil_busy": round(prof.samples / (RATE * span), 2),
                                   "self": prof.top("self", 15),
                                   "inclusive": prof.top("inclusive", 40), "files": prof.top("files", 10)}
        self.profiles["dir"] = str(pdir)

    # etcd ---------------------------------------------------------------------------------------

    def run_etcd(self) -> None:
        from benchmarks.common import CpuSampler, run_procs
        from benchmarks.etcd_load import EtcdCluster, EtcdLoadSpec, etcd_load

        a = self.args
        say("etcd: starting 3 members")
        with EtcdCluster(self.tmp / "etcd") as ec:
            cmd0 = " ".join(ec.commands()[0]).replace(str(self.tmp), "$TMP")
            self.commands["etcd member"] = cmd0 + "   (x3: e0, e1, e2)"

            def pids() -> dict[str, int]:
                leader = ec.leader
                ec.wait_ready(10.0)
                if ec.leader != leader:
                    say(f"etcd leader moved to {ec.leader}")
                follower = next(m for m in ec.names if m != ec.leader)
                return {"leader": ec.procs[ec.leader].pid, "follower": ec.procs[follower].pid}

            def load(workload: str, conns: int, batch: int = 1, rate: float = 0.0) -> Record:
                k = max(1, min(a.etcd_procs, conns))
                specs = [EtcdLoadSpec(ec.url(ec.leader), i, conns // k + (i < conns % k), KIB, batch, a.duration,
                                      a.warmup, rate / k) for i in range(k)]
                idle = self.gate()
                with CpuSampler(pids()) as cs:
                    res = run_procs(etcd_load, specs, a.duration + a.warmup + 120)
                conc = f"{conns} conns, {k} procs"
                return self.add({"system": "etcd", "workload": workload, "concurrency": conc, "idle_busy": idle,
                                 "report": res.report(), "server_cpu": cs.summary(), "clients": conns, "procs": k,
                                 "command": f"benchmarks/etcd_load.py: {k} procs x {conns // k} keep-alive conns, "
                                            + ("POST /v3/kv/put (1 KiB value)" if batch == 1 else
                                               f"POST /v3/kv/txn of {batch} puts (1 KiB values)")
                                            + (f", open loop {rate:.0f} entries/s" if rate else ", closed loop")})

            best: Record | None = None
            for c in a.clients:
                r = load("a", c)
                if best is None or r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                    best = r
            assert best is not None
            best["best"] = True
            bs = [load("b", bc, batch=100) for bc in a.batch_clients]
            max(bs, key=lambda r: r["report"]["mb_per_s"])["best"] = True
            load("c", best["clients"], rate=0.5 * best["report"]["entries_per_s"])
            if a.check_perf:
                say(f"etcd: etcdctl check perf --load {a.check_perf} (60 s, etcd's own Go client)")
                with CpuSampler(pids()) as cs:
                    cp = ec.check_perf(a.check_perf, "/etcdctl-check-perf/")
                cp["server_cpu"] = cs.summary()
                self.profiles["etcd_check_perf"] = cp
                say(f"etcdctl check perf: {cp}")

    # PySyncObj -----------------------------------------------------------------------------------

    def run_pysyncobj(self) -> None:
        from benchmarks.common import CpuSampler
        from benchmarks.syncobj_cluster import SyncObjCluster

        a = self.args
        say("PySyncObj: starting 3 members")
        with SyncObjCluster(self.tmp / "pysyncobj") as sc:
            member = " ".join(sc.command(0)).replace(str(self.tmp), "$TMP")
            member = member.replace(sys.executable, f"{BIN_SHOWN}/python").replace(str(ROOT) + "/", "")
            self.commands["pysyncobj member"] = member + "   (x3)"

            def load(workload: str, conc: str, **kw: Any) -> Record:
                idle = self.gate()
                with CpuSampler(sc.pids) as cs:
                    res = sc.load(size=KIB, duration=a.duration, warmup=a.warmup, **kw)
                rep = res.report()
                rep["client_cpu_cores"] = None  # the load runs inside the members
                cpu = cs.summary()
                cpu["leader"] = max(v for k, v in cpu.items() if k != "machine_busy")
                return self.add({"system": "PySyncObj", "workload": workload, "concurrency": conc, "report": rep,
                                 "idle_busy": idle,
                                 "server_cpu": cpu, "clients": kw.get("window", 0),
                                 "command": f"syncobj_node.py load {json.dumps(kw)} on each of the 3 members"})

            best: Record | None = None
            for w in a.syncobj_windows:
                r = load("a", f"{w} in flight x3", mode="closed", batch=1, window=w)
                if best is None or r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                    best = r
            assert best is not None
            best["best"] = True
            bs = []
            for bc in a.batch_clients:
                w = max(1, bc // 3)
                bs.append(load("b", f"{w} in flight x3", mode="closed", batch=100, window=w))
            max(bs, key=lambda r: r["report"]["mb_per_s"])["best"] = True
            rate = 0.5 * best["report"]["entries_per_s"]
            load("c", f"{rate:.0f}/s", mode="rate", batch=1, rate=rate)
            self.profiles["pysyncobj_log"] = {
                "truncating already-applied": sc.log_lines("truncating already-applied"),
                "exceeds journal end": sc.log_lines("exceeds journal end"),
            }

    def best(self, system: str, workload: str) -> Record | None:
        rs = [r for r in self.records if r["system"] == system and r["workload"] == workload]
        if not rs:
            return None
        if workload in ("a", "b"):
            return max(rs, key=lambda r: r["report"]["entries_per_s"])
        return rs[-1]


# --- the report ------------------------------------------------------------------------------------


def num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(run: Runner) -> dict[str, Any]:
    def eps(system: str, w: str) -> float | None:
        r = run.best(system, w)
        return r["report"]["entries_per_s"] if r else None

    def mbs(system: str, w: str) -> float | None:
        r = run.best(system, w)
        return r["report"]["mb_per_s"] if r else None

    def p99(system: str) -> float | None:
        r = run.best(system, "c")
        return r["report"]["latency_ms"]["p99"] if r else None

    cp = run.profiles.get("etcd_check_perf", {})
    etcd_http = eps("etcd", "a")
    etcd_go = cp.get("writes_per_s")
    etcd_best = max([x for x in (etcd_http, etcd_go) if x], default=None)
    out = {
        "sync_vs_etcd": ratio(eps("dledger sync", "a"), etcd_best),
        "sync_vs_etcd_http": ratio(eps("dledger sync", "a"), etcd_http),
        "async_vs_pysyncobj": ratio(eps("dledger async", "a"), eps("PySyncObj", "a")),
        "sync_batch_mb_s": mbs("dledger sync", "b"),
        "async_batch_mb_s": mbs("dledger async", "b"),
        "sync_batch_vs_etcd": ratio(mbs("dledger sync", "b"), mbs("etcd", "b")),
        "async_batch_vs_pysyncobj": ratio(mbs("dledger async", "b"), mbs("PySyncObj", "b")),
        "sync_p99_half_rate_ms": p99("dledger sync"),
        "async_p99_half_rate_ms": p99("dledger async"),
        "etcd_p99_half_rate_ms": p99("etcd"),
        "pysyncobj_p99_half_rate_ms": p99("PySyncObj"),
        "etcd_best_writes_per_s": etcd_best,
    }
    targets = [
        ("single-entry appends: dledger sync >= 3x etcd writes/s", out["sync_vs_etcd"], 3.0, ">=", "x"),
        ("single-entry appends: dledger async >= 5x PySyncObj", out["async_vs_pysyncobj"], 5.0, ">=", "x"),
        ("batches of 100 x 1 KiB: dledger sync >= 150 MB/s", out["sync_batch_mb_s"], 150.0, ">=", " MB/s"),
        ("p99 at half the max rate (dledger sync) <= 10 ms", out["sync_p99_half_rate_ms"], 10.0, "<=", " ms"),
        ("p99 at half the max rate (dledger async) <= 10 ms", out["async_p99_half_rate_ms"], 10.0, "<=", " ms"),
    ]
    out["targets"] = [
        {"target": t, "measured": v, "unit": u,
         "met": (v is not None and (v >= lim if op == ">=" else v <= lim))}
        for t, v, lim, op, u in targets
    ]
    return out


def render(run: Runner, summary: dict[str, Any], meta: dict[str, Any]) -> str:
    a = run.args
    la = meta["loadavg"]
    lines = [SECTION, ""]
    lines += [
        f"One run of `make bench-compare` (benchmarks/compare.py) on {meta['date']}: "
        f"{meta['versions']['cpus']} CPUs ({meta['versions']['cpu']}), Linux {meta['versions']['kernel']}, "
        f"Python {meta['versions']['python']}, dledger {meta['versions']['dledger']} "
        f"({meta['versions']['dledger_commit']}), etcd {meta['versions']['etcd']}, "
        f"PySyncObj {meta['versions']['pysyncobj']}. Everything on 127.0.0.1, three members per system, "
        f"one system at a time; the load generators run on the same 2 cores as the members.",
        "",
        f"**Load average** (1 min): {la['start']:.2f} at the start"
        f"{'' if meta['quiet'] else ' (the machine did not become quiet within the wait: numbers are noisy)'}; "
        f"during the run mean {la['mean']:.2f}, max {la['max']:.2f} (sampled every 5 s; the benchmark's own "
        f"processes count in it); {la['end']:.2f} at the end. Just before each system started, with none of "
        "the benchmark's processes running, the rest of the machine kept busy (cores, over 3 s; the script waits "
        f"for < {a.max_others_busy}): "
        + ", ".join(f"{k} {v}" for k, v in run.others_busy.items()) + ".",
        "",
        f"Each measurement: {a.warmup:g} s warm-up, then {a.duration:g} s measured; latency = from sending a request "
        "(open loop: from its scheduled time) to its acknowledgement. Closed-loop throughput is the best of a "
        f"concurrency sweep ({', '.join(map(str, a.clients))} clients / connections; PySyncObj: "
        f"{', '.join(map(str, a.syncobj_windows))} commands in flight per member); (b) likewise over "
        f"{', '.join(map(str, a.batch_clients))} clients (PySyncObj: a third of that per member). "
        "(c) is open loop at half of the same system's best (a).",
        "",
        "### Results",
        "",
        "| system | durability | workload | concurrency | entries/s | MB/s | requests/s | p50 ms | p99 ms | "
        "p99.9 ms | errors | leader CPU (cores) | load-gen CPU (cores) | busy before (cores) |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    dur = {"dledger sync": "fsync on a majority", "dledger async": "page cache (flush every interval)",
           "etcd": "WAL fsync on a majority", "PySyncObj": "mmap journal, no fsync"}
    wl = {"a": "(a) 1 x 1 KiB", "b": "(b) 100 x 1 KiB", "c": "(c) open loop, ½ max"}
    for r in run.records:
        rep = r["report"]
        lat = rep["latency_ms"]
        errs = sum(rep["errors"].values())
        name = r["system"] + (" **best**" if r.get("best") else "")
        lines.append(
            f"| {name} | {dur[r['system']]} | {wl[r['workload']]} | {r['concurrency']} | "
            f"{num(rep['entries_per_s'])} | {num(rep['mb_per_s'], 1)} | {num(rep['requests_per_s'])} | "
            f"{num(lat['p50'], 2)} | {num(lat['p99'], 2)} | {num(lat['p999'], 2)} | {errs} | "
            f"{num(r['server_cpu'].get('leader'), 2)} | {num(rep['client_cpu_cores'], 2)} | "
            f"{num(r.get('idle_busy'), 2)} |"
        )
    cp = run.profiles.get("etcd_check_perf")
    if cp:
        lines += [
            "",
            f"etcd's own tool, `etcdctl check perf --load {a.check_perf}` against the leader (Go gRPC client, "
            "1000 clients, 256 B keys + 1 KiB values, capped at 15,000 writes/s, 60 s): "
            f"**{num(cp.get('writes_per_s'))} writes/s**, slowest {cp.get('slowest_s', '?')} s, stddev "
            f"{cp.get('stddev_s', '?')} s; leader CPU {cp.get('server_cpu', {}).get('leader', '?')} cores, "
            f"machine {cp.get('server_cpu', {}).get('machine_busy', '?')} cores busy.",
        ]
    lines += ["", "**Was the load generator the bottleneck?**", ""]
    for system in ("dledger sync", "dledger async"):
        best = run.best(system, "a")
        if best is None:
            continue
        same = [r for r in run.records if r["system"] == system and r["workload"] == "a"
                and r["clients"] == best["clients"]]
        lines.append(f"- {system}, {best['clients']} clients: " + "; ".join(
            f"{r['procs']} load process(es) {num(r['report']['entries_per_s'])} entries/s, load CPU "
            f"{r['report']['client_cpu_cores']} cores, leader {r['server_cpu'].get('leader')} cores, machine "
            f"{r['server_cpu'].get('machine_busy')} of {os.cpu_count()} cores busy" for r in same) + ".")
    e = run.best("etcd", "a")
    if e:
        lines.append(f"- etcd, {e['concurrency']}: load CPU {e['report']['client_cpu_cores']} cores for "
                     f"{num(e['report']['entries_per_s'])} puts/s, leader {e['server_cpu'].get('leader')} cores.")
    log = run.profiles.get("pysyncobj_log")
    if log:
        lines.append(f"- PySyncObj members logged {log['truncating already-applied']} 'truncating already-applied "
                     f"log entries' and {log['exceeds journal end']} 'raftCommitIndex exceeds journal end' "
                     "messages during its runs (its own warnings; no command failed unless counted in errors).")
    s = summary
    lines += [
        "",
        "### Ratios",
        "",
        "| ratio | value |",
        "|---|--:|",
        f"| (a) dledger sync / etcd (best of the HTTP load and `check perf`: {num(s['etcd_best_writes_per_s'])} "
        f"writes/s) | {num(s['sync_vs_etcd'], 2)}x |",
        f"| (a) dledger sync / etcd (HTTP gateway load) | {num(s['sync_vs_etcd_http'], 2)}x |",
        f"| (a) dledger async / PySyncObj | {num(s['async_vs_pysyncobj'], 2)}x |",
        f"| (b) dledger sync / etcd, MB/s | {num(s['sync_batch_vs_etcd'], 2)}x |",
        f"| (b) dledger async / PySyncObj, MB/s | {num(s['async_batch_vs_pysyncobj'], 2)}x |",
        "",
        "### Targets",
        "",
        "| target | measured | met |",
        "|---|--:|:-:|",
    ]
    for t in s["targets"]:
        v = t["measured"]
        shown = "-" if v is None else (f"{v:.2f}{t['unit']}")
        lines.append(f"| {t['target']} | {shown} | {'yes' if t['met'] else '**no**'} |")
    lines += ["", "![side by side](bench-compare.png)", "", "### How each system was loaded", ""]
    lines += [
        "- **dledger**: `dledger bench --peers $PEERS ...` (the commands below) against a group started by "
        "`dledger.local_cluster`; one asyncio (uvloop) process with one `AsyncDLedgerClient` (one "
        "connection) per client, requests to the leader; with `--conns N` the clients share N clients (and "
        "connections), each client still with one request in flight, as etcd's benchmark `--clients`/`--conns`; "
        "the `append` calls of clients sharing one in the same loop iteration then travel as one request "
        "(the client's coalescing, what an application with many tasks sharing a client gets). "
        "`--procs K` splits the clients over K processes and "
        "merges their latencies exactly; (a) is also run with `--procs 2` at the best concurrency, and the "
        "better of the two counts (and sets K for (b) and (c)).",
        "- **etcd**: the JSON gRPC gateway of etcd 3.4 (`POST /v3/kv/put`, base64 key and value; batches: one "
        "`POST /v3/kv/txn` with 100 `requestPut`), raw HTTP/1.1 keep-alive connections written with asyncio "
        "streams + uvloop, one request in flight per connection, in K processes, all sent to the leader "
        "(benchmarks/etcd_load.py). The Go `benchmark` tool is not packaged for Debian, so `etcdctl check perf` "
        "(fixed, rate-capped loads, no percentiles) is the cross-check with etcd's own Go client. The gateway "
        "runs inside each etcd member (JSON <-> protobuf plus a loop-back gRPC call), which costs etcd CPU that "
        "a native gRPC client would not: the ratio uses the better of the two etcd numbers. A txn of 100 puts "
        "is one Raft entry applied atomically, the closest equivalent of a dledger batch (which becomes 100 log "
        "entries).",
        "- **PySyncObj**: three members (benchmarks/syncobj_node.py, default `SyncObjConf` as in its own "
        "benchmarks, plus a file journal) each submitting `@replicated` commands (a counter of appended "
        "bodies; the 1 KiB body is the argument, so it is in the Raft log) with callbacks and counting the "
        "commands whose callback reported SUCCESS; closed loop with a window of commands in flight per "
        "member, or submissions on a fixed schedule for (c). Its load runs inside the members.",
        "- **leader CPU** is the median over 1-s samples of the busier half of the run (from /proc); "
        "**load-gen CPU** is the CPU time of the load process(es) over the measured window, in cores; "
        "**busy before** is the machine's CPU use in the 3 s before that measurement, with the group idle "
        "(other engineers' jobs; the script waits while it is above "
        f"{a.max_others_busy + 0.1:g} cores, at most {a.gate_wait / 2:.0f} s).",
        "",
        "Exact commands (`$PEERS`: the group's members, ports chosen free; `$TMP`: a temporary directory):",
        "",
        "```",
    ]
    seen: set[str] = set()
    for r in run.records:
        c = f"# {r['system']} ({r['workload']})\n{r['command']}"
        if c not in seen:
            seen.add(c)
            lines.append(c)
    for k, v in run.commands.items():
        lines.append(f"# {k}\n{v}")
    if cp:
        lines.append(f"# etcd check perf\n{cp.get('command', '')}")
    lines += ["```", ""]
    if run.profiles.get("leader-a"):
        lines += render_profiles(run)
    return "\n".join(lines) + "\n"


def render_profiles(run: Runner) -> list[str]:
    p = run.profiles
    ra, rb = p.get("run_a", {}), p.get("run_b", {})
    lines = [
        "### Where dledger's time goes (py-spy)",
        "",
        "A separate run at flush=sync with `py-spy record --nonblocking --rate 100` attached to the leader, a "
        f"follower and the load generator (files in `{p['dir']}`; leader flame graph `leader-a.svg`). "
        f"Run (a): {num(ra.get('entries_per_s'))} entries/s with {ra.get('clients')} clients under the profiler, "
        f"CPU (cores) {ra.get('server_cpu')}; run (b): {num(rb.get('mb_per_s'), 1)} MB/s, CPU {rb.get('server_cpu')}. "
        "The tables use `--gil` sampling: only the thread holding the GIL is sampled, so waiting (epoll, fsync) "
        "is left out and the percentages are shares of the process's Python-level CPU; *GIL busy* = samples / "
        "(100 Hz x seconds): near 1.0 means the process is bound by its one interpreter thread.",
        "",
    ]
    for name, title in (("leader-a", "leader, (a) single appends"), ("follower-a", "follower, (a)"),
                        ("loadgen-a", "load generator, (a)"), ("leader-b", "leader, (b) batches of 100")):
        prof = p.get(name) or {}
        if not prof.get("samples"):
            continue
        lines += [f"**{title}** ({prof['samples']} samples, GIL busy {prof.get('gil_busy')}): top functions by "
                  "own time", "",
                  "| function | self % |", "|---|--:|"]
        lines += [f"| `{_label(f)}` | {v} |" for f, v in prof["self"][:12]]
        lines += ["", "by file (self %): " + ", ".join(f"`{f}` {v}" for f, v in prof["files"][:8]), ""]
        incl = [(f, v) for f, v in prof["inclusive"] if not _wrapper(f)]
        lines += ["inclusive (function and what it calls): "
                  + ", ".join(f"`{f}` {v}" for f, v in incl[:14]), ""]
    return lines


def _label(frame: str) -> str:
    if frame.startswith("Runner.run (asyncio/runners.py)"):
        # innermost Python frame while uvloop's C code runs with the GIL (callbacks, timers, I/O handles)
        return "Runner.run (asyncio/runners.py) = uvloop's own C code"
    return frame


def _wrapper(frame: str) -> bool:
    """Frames every stack goes through (entry points, click, asyncio's runner): no information."""
    return frame.startswith(("<module>", "run (", "_run_module", "_run_code", "main (", "Runner.run", "server (",
                             "_run_member", "bench (", "_run (", "BaseProcess", "spawn_main", "_main (", "_proc_main",
                             "Thread.run", "Thread._bootstrap")) or "(click/" in frame


def chart(run: Runner, summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["dledger sync", "dledger async", "etcd", "PySyncObj"]
    colors = ["tab:blue", "tab:cyan", "tab:orange", "tab:green"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))

    def bars(ax: Any, values: list[float | None], title: str, ylabel: str, fmt: str,
             line: float | None = None, log: bool = False) -> None:
        xs = range(len(systems))
        vals = [v or 0.0 for v in values]
        b = ax.bar(xs, vals, color=colors)
        ax.set_xticks(list(xs), systems, rotation=15)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        for rect, v in zip(b, values, strict=True):
            ax.annotate("n/a" if v is None else fmt.format(v), (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                        ha="center", va="bottom", fontsize=9)
        if line is not None:
            ax.axhline(line, color="red", linestyle="--", linewidth=1)

    def val(system: str, w: str, key: str) -> float | None:
        r = run.best(system, w)
        if r is None:
            return None
        rep = r["report"]
        v = rep["latency_ms"]["p99"] if key == "p99" else rep[key]
        return None if v is None else float(v)  # no latency: nothing succeeded in that run

    a_vals = [val(s, "a", "entries_per_s") for s in systems]
    cp = run.profiles.get("etcd_check_perf", {}).get("writes_per_s")
    bars(axes[0], a_vals, "(a) single 1 KiB appends (closed loop, best)", "entries / s", "{:,.0f}")
    if cp:
        axes[0].plot([2], [cp], marker="D", color="black", label=f"etcdctl check perf: {cp:,}/s")
        axes[0].legend(fontsize=8)
    bars(axes[1], [val(s, "b", "mb_per_s") for s in systems], "(b) batches of 100 x 1 KiB", "MB / s", "{:,.1f}",
         line=150.0)
    bars(axes[2], [val(s, "c", "p99") for s in systems], "(c) p99 latency at half the max rate", "ms (log)",
         "{:,.2f}", line=10.0, log=True)
    la = run_meta_loadavg(run)
    rs = [f"sync/etcd {summary['sync_vs_etcd']:.2f}x" if summary["sync_vs_etcd"] else "",
          f"async/PySyncObj {summary['async_vs_pysyncobj']:.2f}x" if summary["async_vs_pysyncobj"] else ""]
    fig.suptitle(f"3 members each on 127.0.0.1, {os.cpu_count()} cores; load average during the run: {la}; "
                 f"(a) ratios: {', '.join(r for r in rs if r) or 'n/a'}; dashed red: targets", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_meta_loadavg(run: Runner) -> str:
    la = run.loadavg_summary
    return f"mean {la['mean']:.2f}, max {la['max']:.2f}" if la else "?"


# --- main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--clients", default="16,64,256,512", help="concurrency sweep of (a), dledger and etcd")
    ap.add_argument("--batch-clients", default="16,64,128",
                    help="concurrency sweep of (b) (PySyncObj: /3 per member)")
    ap.add_argument("--dledger-conns", default="8",
                    help="(a) is also run at the best client count over this many shared connections ('' to skip)")
    ap.add_argument("--syncobj-windows", default="100,1000,3000", help="PySyncObj commands in flight per member, (a)")
    ap.add_argument("--dledger-procs", default="auto",
                    help="load processes of dledger bench: auto (the best of 1 and 2) or a number")
    ap.add_argument("--etcd-procs", type=int, default=2, help="load processes for etcd")
    ap.add_argument("--check-perf", default="xl", help="etcdctl check perf load (s, m, l, xl; '' to skip)")
    ap.add_argument("--systems", default="dledger-sync,dledger-async,etcd,pysyncobj")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-dir", default=str(Path(tempfile.gettempdir()) / "dledger-bench-compare-profiles"))
    ap.add_argument("--max-load", type=float, default=1.0, help="start when the 1-min load average is below")
    ap.add_argument("--wait", type=float, default=1800.0, help="seconds to wait for a quiet machine")
    ap.add_argument("--max-others-busy", type=float, default=0.3,
                    help="before each system: wait until the machine's other processes use fewer cores than this")
    ap.add_argument("--gate-wait", type=float, default=300.0, help="seconds to wait at each such gate")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--chart", default=str(ROOT / "docs" / "bench-compare.png"))
    ap.add_argument("--json", default=str(ROOT / "docs" / "bench-compare.json"))
    ap.add_argument("--goals", default="clients,tail,members,reads",
                    help="goals to measure after the sweep (benchmarks/goals.py; '' to skip)")
    ap.add_argument("--goal-clients", type=int, default=256,
                    help="clients, each on its own connection, of the clients, tail and members goals")
    ap.add_argument("--read-conns", type=int, default=16, help="concurrent readers of the reads goal")
    ap.add_argument("--goals-json", default=str(ROOT / "docs" / "bench-goals.json"))
    args = ap.parse_args(argv)
    args.clients = [int(x) for x in str(args.clients).split(",") if x]
    args.batch_clients = [int(x) for x in str(args.batch_clients).split(",") if x]
    args.dledger_conns = [int(x) for x in str(args.dledger_conns).split(",") if x and int(x) > 0]
    args.syncobj_windows = [int(x) for x in str(args.syncobj_windows).split(",") if x]
    args.systems = [x for x in str(args.systems).split(",") if x]
    args.goals = [x for x in str(args.goals).split(",") if x]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ensure_tools(args)
    from benchmarks.common import load_samples

    quiet, start_load = wait_quiet(args.max_load, args.wait)
    tmp = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    run = Runner(args, tmp)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through every `with`: members stopped, tmp removed

    signal.signal(signal.SIGTERM, on_signal)
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    try:
        with load_samples() as samples:
            steps: dict[str, Callable[[], None]] = {
                "dledger-sync": lambda: run.run_dledger("sync"),
                "dledger-async": lambda: run.run_dledger("async"),
                "etcd": run.run_etcd,
                "pysyncobj": run.run_pysyncobj,
            }
            for name in args.systems:
                run.others_busy[name] = round(quiet_gate(args.max_others_busy, args.gate_wait), 2)
                steps[name]()
        if not args.no_profile and "dledger-sync" in args.systems:
            run.profile_dledger()
        goals = None
        if args.goals:
            from benchmarks.goals import Goals

            goals = Goals(args, tmp, BIN)
            with load_samples() as goal_samples:
                goals.run(args.goals)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if goals is not None:
        write_goals(args, goals.records, goal_samples, start_load, started, versions())
    if not args.systems:
        return
    ones = [s[0] for s in samples]
    la = {"start": start_load, "mean": sum(ones) / len(ones), "max": max(ones), "end": ones[-1],
          "samples": ones}
    run.loadavg_summary = la
    summary = summarize(run)
    meta = {"date": started, "versions": versions(), "loadavg": la, "quiet": quiet}
    section = render(run, summary, meta)
    from benchmarks.goals import write_section
    write_section(Path(args.doc), section, SECTION)
    chart(run, summary, Path(args.chart))
    Path(args.json).write_text(json.dumps({"meta": meta, "summary": summary, "records": run.records,
                                           "profiles": run.profiles, "commands": run.commands}, indent=1))
    say(f"wrote {args.doc} ({SECTION[3:]}), {args.chart}, {args.json}")
    for t in summary["targets"]:
        v = t["measured"]
        shown = "n/a" if v is None else f"{v:.2f}{t['unit']}"
        say(f"target {'MET' if t['met'] else 'NOT MET'}: {t['target']} (measured {shown})")
    say(f"load average during the run: mean {la['mean']:.2f}, max {la['max']:.2f}")


def write_goals(args: argparse.Namespace, records: list[Record], samples: list[tuple[float, float, float]],
                start_load: float, started: str, vers: dict[str, str]) -> None:
    """The goals' section of docs/performance.md, their charts and their JSON."""
    from benchmarks.goals import plot_goals, render_goals, summarize_goals, write_section

    ones = [s[0] for s in samples]
    la = {"start": start_load, "mean": sum(ones) / len(ones), "max": max(ones), "end": ones[-1], "samples": ones}
    summary = summarize_goals(records)
    shown = shlex.join(["benchmarks/compare.py", *sys.argv[1:]]) if sys.argv[1:] else "make bench-compare"
    meta = {"date": started, "loadavg": la, "command": shown, "etcd": vers.get("etcd", "?"),
            "commit": f"dledger {vers.get('dledger', '?')} ({vers.get('dledger_commit', '?')})"}
    write_section(Path(args.doc), render_goals(records, summary, meta))
    charts = plot_goals(records, summary, Path(args.doc).parent)
    Path(args.goals_json).write_text(json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1))
    say(f"goals: {summary}; wrote {args.doc}, {', '.join(str(c) for c in charts)}, {args.goals_json}")


if __name__ == "__main__":
    main()
