"""The performance goals of docs/performance.md, measured side by side in one run (part of
`make bench-compare`; alone with `benchmarks/compare.py --systems "" --goals ...`).

Each goal pits dledger (`flush=sync`) against etcd on the same machine, one system at a time,
right after each other, so the ratios hold even on a busy machine (the load average is recorded
with every number):

- clients: 256 clients each on its own connection, one 1 KiB append in flight each (dledger with
  one and with two load processes, the better counts; etcd with two);
- tail: open loop at half of the maximum just measured (the better of dledger's closed-loop
  runs in this goal run), p50/p99/p99.9;
- members: the clients goal with five members, and the leader's CPU per entry against three
  members (a five-member leader sends each entry to four followers instead of two);
- reads: linearizable reads of 1,000 committed 1 KiB entries per request (dledger `read`, etcd a
  range read of 1,000 keys) and of one entry (dledger `get`, etcd a single-key range read),
  entries/s and latency.

Each goal gets one chart (docs/goal-*.png) and a table in the section GOALS_SECTION.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import CpuSampler, loadavg, run_procs, wait_converged  # noqa: E402
from dledger.bench.load import LoadResult  # noqa: E402

GOALS_SECTION = "## Side by side: the goals (make bench-compare)"
GOALS = ("clients", "tail", "members", "reads")
KIB = 1024
READ_SPAN = 1000  # entries per `read` (and keys per etcd range read)
READ_PRELOAD = 4000  # entries (keys) written before the reads
Record = dict[str, Any]


def say(msg: str) -> None:
    print(f"[goals {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- groups -----------------------------------------------------------------------------------------


@contextmanager
def dledger_group(tmp: Path, members: int, flush: str = "sync") -> Iterator[tuple[str, dict[str, Any]]]:
    from dledger.config import Peer, format_peers
    from dledger.local_cluster import local_cluster
    from dledger.ports import free_port_run

    port = free_port_run(members)
    peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(members)})
    with local_cluster(peers, "default", tmp / f"dledger-{members}-{flush}", flush=flush) as procs:
        yield peers, procs


def dledger_pids(peers: str, procs: dict[str, Any]) -> dict[str, int]:
    from dledger.runtime.client import DLedgerClient

    with DLedgerClient(peers, "default", timeout=5.0) as c:
        leader = c.metadata().leader_id or "n0"
    return {("leader" if m == leader else m): p.pid for m, p in procs.items()}


def etcd_pids(ec: Any) -> dict[str, int]:
    ec.wait_ready(10.0)
    return {("leader" if m == ec.leader else m): p.pid for m, p in ec.procs.items()}


def followers_cpu(cpu: dict[str, float]) -> float:
    return round(sum(v for k, v in cpu.items() if k not in ("leader", "machine_busy")), 2)


# --- loads ------------------------------------------------------------------------------------------


@dataclass
class ReadSpec:
    """One read-load process: `conns` readers, each with one request in flight."""

    system: str  # "dledger" or "etcd"
    target: str  # dledger: the peers; etcd: the leader's client URL
    span: int  # entries per request: READ_SPAN (`read` / range) or 1 (`get` / one key)
    first: int  # the first readable index (dledger) or key number (etcd)
    last: int  # the last one
    conns: int = 16
    duration: float = 10.0
    warmup: float = 2.0


async def read_load(spec: ReadSpec, ready: Callable[[], Awaitable[object]]) -> LoadResult:
    """Closed-loop linearizable reads from random places of the preloaded log (keys)."""
    result = LoadResult(size=KIB, batch=spec.span)
    if spec.system == "dledger":
        from dledger.runtime.client import AsyncDLedgerClient

        clients = [AsyncDLedgerClient(spec.target, "default", request_timeout=10.0) for _ in range(spec.conns)]

        async def one(k: int, at: int) -> int:
            c = clients[k]
            if spec.span == 1:
                await c.get(at, consistency="linearizable")
                return 1
            return len(await c.read(at, spec.span, consistency="linearizable"))
    else:
        from benchmarks.etcd_load import _Conn

        host, port = spec.target.split("//", 1)[1].split(":")
        conns = [_Conn(*await asyncio.open_connection(host, int(port))) for _ in range(spec.conns)]

        def http(body: bytes) -> bytes:
            return (b"POST /v3/kv/range HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % (host.encode(), port.encode(), len(body)) + body)

        async def one(k: int, at: int) -> int:
            import base64

            key = base64.b64encode(etcd_key(at)).decode()
            if spec.span == 1:
                await conns[k].call(http(b'{"key":"%s"}' % key.encode()))
            else:
                end = base64.b64encode(etcd_key(at + spec.span)).decode()
                await conns[k].call(http(b'{"key":"%s","range_end":"%s","limit":%d}' % (
                    key.encode(), end.encode(), spec.span)))
            return spec.span

    await one(0, spec.first)  # fail fast
    await ready()
    start = time.perf_counter() + spec.warmup
    end = start + spec.duration
    cpu: list[float] = []
    rng = random.Random(os.getpid())

    async def reader(k: int) -> None:
        while time.perf_counter() < end:
            at = rng.randint(spec.first, max(spec.first, spec.last - spec.span + 1))
            sent = time.perf_counter()
            try:
                n = await one(k, at)
            except Exception as e:  # counted, as the write loads count theirs
                if sent >= start:
                    result.errors[type(e).__name__] = result.errors.get(type(e).__name__, 0) + 1
                await asyncio.sleep(0.01)
                continue
            now = time.perf_counter()
            if sent >= start and now < end:
                result.entries += n
                result.requests += 1
                result.latencies_ms.append((now - sent) * 1000)
                result.done_at.append(now - start)

    async def cpu_window() -> None:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        cpu.append(time.process_time())

    watcher = asyncio.ensure_future(cpu_window())
    await asyncio.gather(*(reader(k) for k in range(spec.conns)))
    result.elapsed = spec.duration
    result.cpu_s = time.process_time() - cpu[0] if cpu else 0.0
    watcher.cancel()
    if spec.system == "dledger":
        for c in clients:
            await c.close()
    result.compute_timeline()
    return result


def etcd_key(n: int) -> bytes:
    return b"/read/%08d" % n


def etcd_preload(url: str, count: int) -> None:
    """`count` keys of 1 KiB under /read/, in txns of 100 puts."""
    from benchmarks.etcd_load import b64, post_json

    value = b64(os.urandom(KIB))
    for at in range(0, count, 100):
        puts = [{"requestPut": {"key": b64(etcd_key(n)), "value": value}} for n in range(at, min(count, at + 100))]
        post_json(url + "/v3/kv/txn", {"success": puts}, timeout=30.0)


def dledger_preload(peers: str, count: int) -> tuple[int, int]:
    """`count` entries of 1 KiB, in batches of 100: (first, last) index written."""
    from dledger.runtime.client import DLedgerClient

    body = os.urandom(KIB)
    first = last = -1
    with DLedgerClient(peers, "default", timeout=10.0) as c:
        for _ in range(0, count, 100):
            res = c.append_batch([body] * 100)
            first = res[0].index if first < 0 else first
            last = res[-1].index
    return first, last


# --- the goals --------------------------------------------------------------------------------------


class Goals:
    """Runs the goals with `args` (compare.py's options), measurements in `records`."""

    def __init__(self, args: Any, tmp: Path, bin_dir: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.bin = bin_dir
        self.records: list[Record] = []

    def add(self, goal: str, system: str, what: str, report: dict[str, Any], cpu: dict[str, float],
            command: str, **extra: Any) -> Record:
        rec = {"goal": goal, "system": system, "what": what, "report": report, "server_cpu": cpu,
               "loadavg": loadavg()[0], "command": command, **extra}
        lat = report["latency_ms"]
        say(f"{goal:<8} {system:<14} {what:<34} {report['entries_per_s']:>10,.0f} entries/s  p50 {lat['p50']} "
            f"p99 {lat['p99']} p99.9 {lat['p999']} ms  errors {sum(report['errors'].values())}  "
            f"servers {cpu}  load CPU {report.get('client_cpu_cores')}  load avg {rec['loadavg']}")
        self.records.append(rec)
        return rec

    # dledger writes: the `dledger bench` command, as in the sweep
    def dledger_write(self, goal: str, peers: str, procs_map: dict[str, Any], clients: int, procs: int = 1,
                      rate: float = 0.0, what: str = "", members: int = 3) -> Record:
        a = self.args
        out = self.tmp / f"goal-{goal}-{len(self.records)}.json"
        cmd = [str(self.bin / "dledger"), "bench", "--peers", peers, "--clients", str(clients), "--size", str(KIB),
               "--batch", "1", "--duration", str(a.duration), "--warmup", str(a.warmup), "--json", str(out)]
        if procs > 1:
            cmd += ["--procs", str(procs)]
        if rate:
            cmd += ["--rate", f"{rate:.0f}"]
        wait_converged(peers, say=say)  # a follower left behind by the previous load must not load this one
        pids = dledger_pids(peers, procs_map)
        with CpuSampler(pids) as cs:
            p = subprocess.run(cmd, capture_output=True, timeout=a.duration + a.warmup + 180)
        if p.returncode != 0 or not out.exists():
            raise RuntimeError(f"dledger bench failed: {' '.join(cmd)}\n{p.stderr.decode(errors='replace')[-2000:]}")
        shown = " ".join(cmd).replace(peers, "$PEERS").replace(str(out), "out.json")
        shown = shown.replace(str(self.bin / "dledger"), "dledger")
        return self.add(goal, "dledger sync", what or f"{clients} clients/conns, {procs} proc(s)",
                        json.loads(out.read_text()), cs.summary(), shown, members=members, clients=clients,
                        procs=procs, rate=rate)

    def etcd_write(self, goal: str, ec: Any, conns: int, rate: float = 0.0, what: str = "",
                   members: int = 3) -> Record:
        from benchmarks.etcd_load import EtcdLoadSpec, etcd_load

        a = self.args
        k = max(1, min(a.etcd_procs, conns))
        specs = [EtcdLoadSpec(ec.url(ec.leader), i, conns // k + (i < conns % k), KIB, 1, a.duration, a.warmup,
                              rate / k) for i in range(k)]
        with CpuSampler(etcd_pids(ec)) as cs:
            res = run_procs(etcd_load, specs, a.duration + a.warmup + 120)
        return self.add(goal, "etcd", what or f"{conns} conns, {k} procs", res.report(), cs.summary(),
                        f"benchmarks/etcd_load.py: {k} procs x {conns // k} keep-alive conns, POST /v3/kv/put "
                        f"(1 KiB value)" + (f", open loop {rate:.0f} entries/s" if rate else ", closed loop"),
                        members=members, clients=conns, procs=k, rate=rate)

    def reads(self, system: str, target: str, first: int, last: int, span: int, pids: dict[str, int]) -> Record:
        a = self.args
        k = max(1, a.etcd_procs)
        specs = [ReadSpec(system, target, span, first, last, max(1, a.read_conns // k), a.duration, a.warmup)
                 for _ in range(k)]
        with CpuSampler(pids) as cs:
            res = run_procs(read_load, specs, a.duration + a.warmup + 120)
        if system == "dledger":
            what = f"read of {span}" if span > 1 else "get"
            call = f"read(i, {span}" if span > 1 else "get(i"
            cmd = f"AsyncDLedgerClient.{call}, consistency='linearizable')"
        else:
            what = f"range of {span} keys" if span > 1 else "one key"
            cmd = "POST /v3/kv/range " + (f"{{key, range_end, limit: {span}}}" if span > 1 else "{key}")
        return self.add("reads", "dledger sync" if system == "dledger" else "etcd", what, res.report(),
                        cs.summary(), f"benchmarks/goals.py read_load: {k} procs x {a.read_conns // k} readers, "
                        f"{cmd}, linearizable, closed loop", members=3, span=span)

    def run(self, goals: list[str]) -> None:
        from benchmarks.etcd_load import EtcdCluster

        a = self.args
        clients = a.goal_clients
        write_goals = [g for g in goals if g in ("clients", "tail")]
        if write_goals or "reads" in goals:
            say("dledger: 3 members, flush=sync")
            with dledger_group(self.tmp, 3) as (peers, procs):
                best: Record | None = None
                if write_goals:
                    for p in (1, 2):
                        r = self.dledger_write("clients", peers, procs, clients, procs=p)
                        if best is None or r["report"]["entries_per_s"] > best["report"]["entries_per_s"]:
                            best = r
                    assert best is not None
                    best["best"] = True
                if "tail" in goals and best is not None:
                    rate = 0.5 * best["report"]["entries_per_s"]
                    self.dledger_write("tail", peers, procs, clients, procs=best["procs"], rate=rate,
                                       what=f"open loop {rate:,.0f}/s, {clients} conns")
                if "reads" in goals:
                    first, last = dledger_preload(peers, READ_PRELOAD)
                    pids = dledger_pids(peers, procs)
                    for span in (READ_SPAN, 1):
                        self.reads("dledger", peers, first, last, span, pids)
            say("etcd: 3 members")
            with EtcdCluster(self.tmp / "etcd3") as ec:
                if write_goals:
                    best_e = self.etcd_write("clients", ec, clients)
                    best_e["best"] = True
                    if "tail" in goals:
                        rate = 0.5 * best_e["report"]["entries_per_s"]
                        self.etcd_write("tail", ec, clients, rate=rate,
                                        what=f"open loop {rate:,.0f}/s, {clients} conns")
                if "reads" in goals:
                    etcd_preload(ec.url(ec.leader), READ_PRELOAD)
                    for span in (READ_SPAN, 1):
                        self.reads("etcd", ec.url(ec.leader), 0, READ_PRELOAD - 1, span, etcd_pids(ec))
        if "members" in goals:
            measured = _best(self.records, "clients", "dledger sync")
            k = measured["procs"] if measured is not None else 1  # the load processes that did best
            for n in (3, 5):
                say(f"dledger: {n} members, flush=sync")
                with dledger_group(self.tmp, n) as (peers, procs):
                    self.dledger_write("members", peers, procs, clients, procs=k, members=n,
                                       what=f"{n} members, {clients} conns, {k} proc(s)")
                say(f"etcd: {n} members")
                with EtcdCluster(self.tmp / f"etcd{n}-m", n=n) as ec:
                    self.etcd_write("members", ec, clients, members=n, what=f"{n} members, {clients} conns")


# --- report -----------------------------------------------------------------------------------------


def _eps(r: Record) -> float:
    return float(r["report"]["entries_per_s"])


def _find(records: list[Record], goal: str, system: str, **kw: Any) -> list[Record]:
    return [r for r in records if r["goal"] == goal and r["system"] == system
            and all(r.get(k) == v for k, v in kw.items())]


def _best(records: list[Record], goal: str, system: str, **kw: Any) -> Record | None:
    rs = _find(records, goal, system, **kw)
    return max(rs, key=_eps) if rs else None


def us_per_entry(r: Record, key: str = "leader") -> float | None:
    """CPU of the leader (or of all followers) per entry, in microseconds."""
    cores = r["server_cpu"].get(key) if key == "leader" else followers_cpu(r["server_cpu"])
    eps = _eps(r)
    return round(cores / eps * 1e6, 1) if cores is not None and eps else None


def per_core(r: Record) -> float | None:
    """Entries per CPU-second of the system's members and its load generator together: on a
    machine whose scheduler hands the systems unequal shares of the cores, the rate each would
    reach with the same CPU."""
    cores = sum(v for k, v in r["server_cpu"].items() if k != "machine_busy") + (r["report"].get("client_cpu_cores")
                                                                               or 0.0)
    return round(_eps(r) / cores) if cores > 0 else None


def summarize_goals(records: list[Record]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    d, e = _best(records, "clients", "dledger sync"), _best(records, "clients", "etcd")
    if d and e:
        out["clients_ratio"] = round(_eps(d) / _eps(e), 2)
        dc, ec = per_core(d), per_core(e)
        if dc and ec:
            out["clients_ratio_per_core"] = round(dc / ec, 2)
    t = _find(records, "tail", "dledger sync")
    if t:
        out["tail_p99_ms"] = t[0]["report"]["latency_ms"]["p99"]
        out["tail_p999_ms"] = t[0]["report"]["latency_ms"]["p999"]
    for n in (3, 5):
        dn, en = _best(records, "members", "dledger sync", members=n), _best(records, "members", "etcd", members=n)
        if dn and en:
            out[f"members{n}_ratio"] = round(_eps(dn) / _eps(en), 2)
            out[f"members{n}_leader_us"] = us_per_entry(dn)
    if out.get("members3_leader_us") and out.get("members5_leader_us"):
        out["fanout_cost"] = round(out["members5_leader_us"] / out["members3_leader_us"], 2)
    for span, name in ((READ_SPAN, "read"), (1, "get")):
        dr, er = _find(records, "reads", "dledger sync", span=span), _find(records, "reads", "etcd", span=span)
        if dr and er:
            out[f"{name}_ratio"] = round(_eps(dr[0]) / _eps(er[0]), 2)
    return out


def render_goals(records: list[Record], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    la = meta["loadavg"]
    lines = [
        GOALS_SECTION, "",
        f"One run of `{meta['command']}` on {meta['date']} ({meta['commit']}): dledger `flush=sync` and etcd "
        f"{meta.get('etcd', '')} one after the other on this 2-core machine, the load generators on the same "
        "cores. **Load average** (1 min) at the start {:.2f}, mean {:.2f}, max {:.2f} (other jobs "
        "included: read the ratios, not the absolute numbers).".format(la["start"], la["mean"], la["max"]), "",
        "| goal | system | what | entries/s | p50 ms | p99 ms | p99.9 ms | errors | leader CPU | followers CPU "
        "| leader us/entry | load-gen CPU | entries per CPU-s | load avg |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in records:
        rep, lat, cpu = r["report"], r["report"]["latency_ms"], r["server_cpu"]
        lines.append(f"| {r['goal']} | {r['system']}{' **best**' if r.get('best') else ''} | {r['what']} | "
                     f"{rep['entries_per_s']:,.0f} | {lat['p50']} | {lat['p99']} | {lat['p999']} | "
                     f"{sum(rep['errors'].values())} | {cpu.get('leader', '-')} | {followers_cpu(cpu)} | "
                     f"{us_per_entry(r) or '-'} | {rep.get('client_cpu_cores', '-')} | "
                     f"{per_core(r) or '-'} | {r['loadavg']} |")
    lines += ["", "| goal | target | measured | met |", "|---|---|--:|:-:|"]

    def row(name: str, target: str, key: str, ok: Callable[[float], bool] | None, unit: str = "") -> None:
        v = summary.get(key)
        shown = "n/a" if v is None else f"{v}{unit}"
        met = "n/a" if v is None else "-" if ok is None else "yes" if ok(v) else "**no**"
        lines.append(f"| {name} | {target} | {shown} | {met} |")

    row("clients", "separate connections, dledger sync / etcd >= 5x", "clients_ratio", lambda v: v >= 5, "x")
    row("clients", "(the same per CPU-second of members and load generator)", "clients_ratio_per_core",
        lambda v: v >= 5, "x")
    row("tail", "sync p99 at half the maximum <= 10 ms", "tail_p99_ms", lambda v: v <= 10, " ms")
    row("tail", "(reported) sync p99.9 at half the maximum", "tail_p999_ms", None, " ms")
    row("members", "five members: dledger / etcd >= 5x", "members5_ratio", lambda v: v >= 5, "x")
    row("members", "leader CPU per entry, 5 / 3 members <= 2 (four followers instead of two)", "fanout_cost",
        lambda v: v <= 2.0, "x")
    row("reads", f"linearizable read of {READ_SPAN}: dledger / etcd range read, entries/s", "read_ratio",
        lambda v: v >= 1, "x")
    row("reads", "linearizable get: dledger / etcd single-key read, entries/s", "get_ratio", lambda v: v >= 1, "x")
    lines += ["", "Charts: " + ", ".join(f"![{g}](goal-{g}.png)" for g in GOALS), "", "Commands:", "",
              "<!-- check: a benchmark (minutes on an idle machine); its results are on this page -->", "```"]
    for r in records:
        lines.append(f"# {r['goal']}: {r['system']}, {r['what']}")
        lines.append(r["command"])
    lines += ["```", ""]
    return "\n".join(lines)


def write_section(path: Path, section: str, heading: str = GOALS_SECTION) -> None:
    """Replace (or append) the section that starts with `heading`, up to the next `## `."""
    text = path.read_text() if path.exists() else "# Performance\n"
    if heading in text:
        head, rest = text.split(heading, 1)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1 :] if nxt >= 0 else ""
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def plot_goals(records: list[Record], summary: dict[str, Any], docs: Path) -> list[Path]:
    """One chart per goal that was measured: docs/goal-<goal>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"dledger sync": "tab:blue", "etcd": "tab:orange"}
    written: list[Path] = []

    def save(fig: Any, goal: str) -> None:
        fig.tight_layout()
        path = docs / f"goal-{goal}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    def bar_pair(ax: Any, labels: list[str], values: list[float], cols: list[str], ylabel: str, title: str) -> None:
        bars = ax.bar(labels, values, color=cols)
        for b, v in zip(bars, values, strict=True):
            ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:.1f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=9)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)

    rs = [r for r in records if r["goal"] == "clients"]
    if rs:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        labels = [f"{r['system']}\n{r['what']}" for r in rs]
        bar_pair(ax, labels, [_eps(r) for r in rs], [colors[r["system"]] for r in rs], "entries/s",
                 f"{rs[0]['clients']} clients, own connections, 1 KiB, sync: "
                 f"{summary.get('clients_ratio', 'n/a')}x (goal 5x)")
        bar_pair(ax2, labels, [per_core(r) or 0 for r in rs], [colors[r["system"]] for r in rs],
                 "entries per CPU-second", f"per CPU-second of members + load: "
                 f"{summary.get('clients_ratio_per_core', 'n/a')}x")
        for a in (ax, ax2):
            a.tick_params(axis="x", labelsize=7)
        save(fig, "clients")
    rs = [r for r in records if r["goal"] == "tail"]
    if rs:
        fig, ax = plt.subplots(figsize=(7, 4))
        pcts = ["p50", "p99", "p999"]
        w = 0.8 / len(rs)
        for k, r in enumerate(rs):
            vals = [r["report"]["latency_ms"][p] or 0 for p in pcts]
            ax.bar([i + k * w for i in range(3)], vals, w, label=f"{r['system']} ({r['what']})",
                   color=colors[r["system"]])
        ax.axhline(10, color="red", linestyle="--", linewidth=1, label="goal: p99 10 ms")
        ax.set_xticks([i + w * (len(rs) - 1) / 2 for i in range(3)], ["p50", "p99", "p99.9"])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title("Latency at half of the maximum load (open loop)", fontsize=10)
        ax.legend(fontsize=8)
        save(fig, "tail")
    rs = [r for r in records if r["goal"] == "members"]
    if rs:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        bar_pair(a1, [f"{r['system']}\n{r['members']} members" for r in rs], [_eps(r) for r in rs],
                 [colors[r["system"]] for r in rs], "entries/s",
                 f"3 and 5 members, {rs[0]['clients']} connections, sync")
        ds = [r for r in rs if r["system"] == "dledger sync"]
        bar_pair(a2, [f"{r['members']} members" for r in ds], [us_per_entry(r) or 0 for r in ds],
                 ["tab:blue"] * len(ds), "leader CPU per entry (us)",
                 f"dledger leader CPU per entry: 5/3 = {summary.get('fanout_cost', 'n/a')}x (bound 2x)")
        a1.tick_params(axis="x", labelsize=8)
        save(fig, "members")
    rs = [r for r in records if r["goal"] == "reads"]
    if rs:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        labels = [f"{r['system']}\n{r['what']}" for r in rs]
        bar_pair(a1, labels, [_eps(r) for r in rs], [colors[r["system"]] for r in rs], "entries/s",
                 "Linearizable reads, 1 KiB entries")
        bar_pair(a2, labels, [r["report"]["latency_ms"]["p99"] or 0 for r in rs], [colors[r["system"]] for r in rs],
                 "p99 ms", "p99 latency per request")
        for ax in (a1, a2):
            ax.tick_params(axis="x", labelsize=7)
        save(fig, "reads")
    return written


def main() -> None:
    """Render the section and the charts again from a run's JSON (docs/bench-goals.json)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("json", nargs="?", default=str(ROOT / "docs" / "bench-goals.json"))
    ap.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    a = ap.parse_args()
    run = json.loads(Path(a.json).read_text())
    records = run["records"]
    summary = summarize_goals(records)
    write_section(Path(a.doc), render_goals(records, summary, run["meta"]))
    plot_goals(records, summary, Path(a.doc).parent)
    run["summary"] = summary
    Path(a.json).write_text(json.dumps(run, indent=1))
    say(f"goals: {summary}")


if __name__ == "__main__":
    main()
