"""Latency at a fixed open-loop rate, this code against another's, alternating (docs/performance.md,
"Ack-clocked pushes").

`python benchmarks/tail_latency.py [--rate 8000] [--clients 256] [--repeat 3] [--before SRC] [--flush sync]`

Each run starts a fresh 3-member group on 127.0.0.1 (file store) and drives it with
`dledger bench --rate R` (one connection per client, 1 KiB bodies, 10 s after a 2 s warm-up),
then prints the latency percentiles and each member's CPU (cores). With `--before SRC` every
run is preceded by the same run with SRC first on PYTHONPATH (the members' and the load
generator's code), so a pair shares the machine's conditions. The goal's rate is half of the
maximum that `benchmarks/compare.py --goals clients` finds; a fixed rate compares two versions
at equal load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import proc_cpu_s  # noqa: E402
from dledger.config import Peer, format_peers  # noqa: E402
from dledger.local_cluster import local_cluster  # noqa: E402
from dledger.ports import free_port_run  # noqa: E402


def one_run(rate: float, clients: int, flush: str, src: str | None) -> dict[str, object]:
    """A fresh group, one open-loop bench against it: its latency report and the members' CPU."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the members inherit it from local_cluster
    try:
        with tempfile.TemporaryDirectory() as tmp:
            port = free_port_run(3)
            peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
            with local_cluster(peers, "default", Path(tmp), flush=flush) as procs:
                out = Path(tmp) / "bench.json"
                c0 = {m: proc_cpu_s(p.pid) or 0.0 for m, p in procs.items()}
                t0 = time.monotonic()
                subprocess.run([sys.executable, "-m", "dledger", "bench", "--peers", peers, "--clients", str(clients),
                                "--size", "1024", "--batch", "1", "--duration", "10", "--warmup", "2",
                                "--rate", f"{rate:.0f}", "--json", str(out)], capture_output=True, check=True)
                dt = time.monotonic() - t0
                cpu = {m: round(((proc_cpu_s(p.pid) or 0.0) - c0[m]) / dt, 2) for m, p in procs.items()}
                report = json.loads(out.read_text())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"entries_per_s": report["entries_per_s"], "latency_ms": report["latency_ms"], "cpu_cores": cpu,
            "loadavg": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=8000.0)
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flush", choices=["sync", "async"], default="sync")
    ap.add_argument("--before", metavar="SRC", help="also run another version's src directory before each run")
    a = ap.parse_args()
    versions = [("before", a.before), ("this", None)] if a.before else [("this", None)]
    for _ in range(a.repeat):
        for name, src in versions:
            r = one_run(a.rate, a.clients, a.flush, src)
            lat = r["latency_ms"]
            assert isinstance(lat, dict)
            print(f"{name:6s} {r['entries_per_s']:8,.0f}/s  p50 {lat['p50']} p90 {lat['p90']} p99 {lat['p99']} "
                  f"p99.9 {lat['p999']} ms  members' CPU {r['cpu_cores']}  load {r['loadavg']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
