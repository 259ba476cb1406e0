"""What an append costs when the log crosses into a new data file (docs/performance.md, "Restart cost").

`python benchmarks/file_crossing.py [--files 40] [--file-mib 16] [--mbps 40] [--before SRC] [--rounds 2]`

Appends batches of 16 entries of 1 KiB through FileLedgerStore (flush=sync: its flusher
fsyncs meanwhile, as a member's does) at `--mbps` MB/s, with data files of `--file-mib` MiB
and index files of 1/32 of that (both cross often), until the log has filled `--files` data
files. Each append runs on the caller's thread, as on a member's event loop: how long the
calls that crossed into a new file took is the stall a member's loop saw there
(dledger_loop_stall_seconds). Prints, per version: the crossing calls' median and worst, the
other calls' median, p99 and worst, and how many files the appender had to create itself.
`--before SRC` runs another version (e.g. `git archive REV src`) alternating with this one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, statistics, sys, time
from dledger.store.file import FileLedgerStore
d, files, size, mbps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = FileLedgerStore(d, data_file_size=size, index_file_size=max(32, size // 32 // 32 * 32), flush="sync")
time.sleep(0.5)  # a member serves ~1 s after its start at the earliest
body = [os.urandom(1024)] * 16
batch = 16 * (1024 + 48)
cross, other = [], []
interval = batch / (mbps * 1e6)
nxt = time.perf_counter()
while s.write_pos < files * size:
    nxt += interval
    delay = nxt - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    nd, ni = len(s.data.files), len(s.index.files)
    t = time.perf_counter()
    s.append_as_leader(body, 1)
    dt = time.perf_counter() - t
    (cross if (len(s.data.files), len(s.index.files)) != (nd, ni) else other).append(dt)
inline = (getattr(s.data, "created_inline", None), getattr(s.index, "created_inline", None))
s.close()
other.sort()
print(json.dumps({"crossings": len(cross), "cross_median_ms": statistics.median(cross) * 1e3,
                  "cross_max_ms": max(cross) * 1e3, "other_median_ms": statistics.median(other) * 1e3,
                  "other_p99_ms": other[int(len(other) * 0.99)] * 1e3, "other_max_ms": other[-1] * 1e3,
                  "created_inline": inline}))
"""


def run(src: str, a: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        env = dict(os.environ, PYTHONPATH=src)
        out = subprocess.run([sys.executable, "-c", CHILD, d, str(a.files), str(a.file_mib << 20), str(a.mbps)],
                             env=env, check=True, capture_output=True, text=True).stdout
    r: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--file-mib", type=int, default=16)
    ap.add_argument("--mbps", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", metavar="SRC")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    versions = ([("before", a.before)] if a.before else []) + [("this", here)]
    print(f"load average {os.getloadavg()[0]:.1f} at {time.strftime('%H:%M:%S')}")
    print(f"{'code':>7} {'crossings':>9} {'cross med ms':>12} {'cross max ms':>12} {'other med':>9} "
          f"{'p99':>7} {'max':>7}  created by the appender (data, index)")
    for _ in range(a.rounds):
        for name, src in versions:
            r = run(src, a)
            print(f"{name:>7} {r['crossings']:>9} {r['cross_median_ms']:>12.2f} {r['cross_max_ms']:>12.2f} "
                  f"{r['other_median_ms']:>9.2f} {r['other_p99_ms']:>7.2f} {r['other_max_ms']:>7.2f}  "
                  f"{r['created_inline']}")
    print(f"load average {os.getloadavg()[0]:.1f} at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
