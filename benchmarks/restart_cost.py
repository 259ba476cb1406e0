"""What a member's start costs against the size of its log (docs/performance.md, "Restart cost").

`python benchmarks/restart_cost.py [--gib 1 4] [--body 262144] [--dir DIR] [--repeat 1] [--keep] [--json]`

For each size, builds a store of that many GiB of log through the store API (large bodies,
so it fills fast), fsyncs it and drops its pages from the page cache (`posix_fadvise
DONTNEED`: a cold start, as after a reboot), then starts `dledger server` on it as the only
member of its group and measures:

- `metadata_s`: from the process start until it answers METADATA (it serves);
- `append_s`: ... until an append of 1 KiB is acknowledged (it has elected itself: a single
  member's election timeout, about 1 s, is in this);
- `rss_mib`, `rss_later_mib`, `hwm_mib`: its resident memory (VmRSS) after that append and
  `--hold` seconds later (its scrub verifying the log meanwhile), and the most it held
  (VmHWM), from /proc/PID/status.

`fresh` is the same on an empty directory (the first start of a new member).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dledger.fsutil import evict_page_cache


def build(d: Path, gib: float, body_size: int) -> int:
    """A store of `gib` GiB of entries of `body_size` bytes; the number of entries."""
    from dledger.store.file import FileLedgerStore

    shutil.rmtree(d, ignore_errors=True)
    s = FileLedgerStore(d, flush="async")
    body = (bytes(range(256)) * (body_size // 256 + 1))[:body_size]
    per = max(1, (4 << 20) // body_size)
    total = int(gib * (1 << 30)) // body_size
    n = 0
    while n < total:
        k = min(per, total - n)
        s.append_as_leader([body] * k, 1)
        n += k
    s.flush()
    s.write_checkpoint()
    s.close()
    return n


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


async def _probe(peers: str, deadline: float) -> tuple[float, float]:
    """Seconds until the member first answers METADATA (any role), and until an append is
    acknowledged (it must have elected itself: its election timeout is in that)."""
    from dledger.runtime.client import AsyncDLedgerClient

    t0 = time.monotonic()
    meta_at = 0.0
    while time.monotonic() < deadline:
        try:
            async with AsyncDLedgerClient(peers, timeout=1.0) as c:
                if not meta_at:
                    await c.metadata()
                    meta_at = time.monotonic()
                await c.append(b"x" * 1024)
                return meta_at - t0, time.monotonic() - t0
        except Exception:
            await asyncio.sleep(0.01)
    raise TimeoutError("the member did not serve in time")


def start_and_measure(d: Path, src: str | None = None, hold: float = 0.0, timeout: float = 120.0) -> dict[str, float]:
    """Start a member on `d` (with `src` first on its PYTHONPATH: another version's code)."""
    port = free_port()
    peers = f"n0-127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "dledger", "server", "--id", "n0", "--peers", peers, "--store-dir", str(d)]
    t0 = time.monotonic()
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        meta, app = asyncio.run(_probe(peers, t0 + timeout))
        spawn = time.monotonic() - t0 - app  # the probe started this long after the process
        rss = status_kib(p.pid, "VmRSS") / 1024
        time.sleep(hold)  # the scrub reads the log meanwhile
        later = status_kib(p.pid, "VmRSS") / 1024
        hwm = status_kib(p.pid, "VmHWM") / 1024
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return {"metadata_s": round(meta + spawn, 3), "append_s": round(app + spawn, 3),
            "rss_mib": round(rss, 1), "rss_later_mib": round(later, 1),
            "hwm_mib": round(hwm, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, nargs="*", default=[1.0, 4.0])
    ap.add_argument("--body", type=int, default=256 << 10)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/dledger-restart-cost"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="reuse a store already built at the size")
    ap.add_argument("--no-fresh", action="store_true")
    ap.add_argument("--before", metavar="SRC", help="also start each case with this src directory (another "
                    "version, e.g. `git archive REV src`), alternating with this one")
    ap.add_argument("--hold", type=float, default=20.0, help="seconds the member runs on (its scrub reading "
                    "the log) before its RSS is read again [20]")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a start may take [300]")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows: list[dict[str, object]] = []
    versions: list[tuple[str, str | None]] = [("before", a.before)] if a.before else []
    versions.append(("this", None))
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at {time.strftime('%H:%M:%S')}",
          file=sys.stderr)
    if not a.no_fresh:
        for _ in range(a.repeat):
            for name, src in versions:
                d = a.dir / "fresh"
                shutil.rmtree(d, ignore_errors=True)
                got = start_and_measure(d, src, a.hold, a.timeout)
                rows.append({"log_gib": 0, "case": "fresh", "code": name, **got})
    for gib in a.gib:
        d = a.dir / (f"{gib:g}gib" if a.body == 256 << 10 else f"{gib:g}gib-{a.body}b")
        marker = d / ".built"
        if not (a.keep and marker.exists()):
            t = time.monotonic()
            n = build(d, gib, a.body)
            marker.write_text(str(n))
            print(f"built {gib:g} GiB ({n} entries) in {time.monotonic() - t:.1f} s", file=sys.stderr)
        # each version starts on its own last checkpoint (a member's own stop wrote it): the
        # other version's would lack what this one keeps there (the CONFIG_CHANGE marks), and
        # the first start of this version on a store the old one wrote (the upgrade) is its own row
        saved: dict[str, bytes] = {}
        if a.before:
            evict_page_cache(d)
            got = start_and_measure(d, None, a.hold, a.timeout)
            rows.append({"log_gib": gib, "case": "upgrade", "code": "this", **got})
            saved["this"] = (d / "checkpoint").read_bytes()
        for _ in range(a.repeat):
            for name, src in versions:
                if name in saved:
                    (d / "checkpoint").write_bytes(saved[name])
                evict_page_cache(d)
                got = start_and_measure(d, src, a.hold, a.timeout)
                rows.append({"log_gib": gib, "case": "restart", "code": name, **got})
                saved[name] = (d / "checkpoint").read_bytes()
    if a.json:
        print(json.dumps(rows))
        return
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at {time.strftime('%H:%M:%S')}")
    print(f"{'log':>7} {'case':>8} {'code':>7} {'METADATA s':>11} {'append s':>9} {'RSS MiB':>8} {'later':>8} "
          f"{'HWM MiB':>8}")
    for r in rows:
        print(f"{r['log_gib']:>5g}Gi {r['case']:>8} {r['code']:>7} {r['metadata_s']:>11} "
              f"{r['append_s']:>9} {r['rss_mib']:>8} {r['rss_later_mib']:>8} {r['hwm_mib']:>8}")


if __name__ == "__main__":
    main()
