"""The offline readers of a store directory, timed without Spark (issue 27).

`python benchmarks/offline_scan.py [--entries 200000] [--size 100] [--dir /tmp/dledger-offline-bench] [--json]`

Builds (once; reused while its entry count and body size match) a store of `--entries`
committed entries of `--size`-byte bodies in 64 MiB data files, then times, each best of
`--repeat` (wall and CPU time), on a warm page cache:

- `files`: `dledger-files`' planner and its copy-free scan (spark.files.plan + read_file
  on every task, entries mode with bodies: what a Spark task does, without the JVM);
- `files-nobody`: the same without a `body` column (bodies CRC-checked in place);
- `records`: records mode (one row per record, with its validation result);
- `inspect`: `dledger store inspect` (store.admin.inspect: the scan recovery would do).

Run it against two trees with PYTHONPATH (docs/performance.md, "Offline store view").
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

FILE_SIZE = 64 << 20


def build(d: Path, entries: int, size: int) -> None:
    from dledger.store.file import FileLedgerStore

    stamp = d / "bench.json"
    if stamp.exists() and json.loads(stamp.read_text()) == {"entries": entries, "size": size}:
        return
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    s = FileLedgerStore(d / "grp" / "n0", data_file_size=FILE_SIZE)
    rng = random.Random(1)
    bodies = [rng.randbytes(size) for _ in range(1000)]
    try:
        n = 0
        while n < entries:
            k = min(1000, entries - n)
            s.append_as_leader(bodies[:k], 1 + n // 50_000)
            n += k
        s.set_committed(s.end_index)
        s.save_term(s.end_term, None)
        s.flush_once()
    finally:
        s.close()
    stamp.write_text(json.dumps({"entries": entries, "size": size}))


def best(repeat: int, run: Callable[[], int]) -> tuple[float, float, int]:
    """Best wall time, best CPU time of this process (less hurt by other processes on a
    busy machine), and the rows read."""
    t = cpu = float("inf")
    rows = 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = run()
        t, cpu = min(t, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return t, cpu, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/dledger-offline-bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = Path(args.dir) / f"{args.entries}x{args.size}"
    build(base, args.entries, args.size)
    store = base / "grp" / "n0"

    import dledger
    from dledger.spark.files import plan, read_file
    from dledger.store.admin import inspect

    def files(bodies: bool = True, records: bool = False) -> Callable[[], int]:
        def run() -> int:
            rows = 0
            for p in plan(store, include_uncommitted=False, records=records, bodies=bodies):
                for b in read_file(p):
                    rows += b.num_rows
            return rows
        return run

    def admin() -> int:
        view = inspect(store)
        assert not view["problems"], view
        return int(view["end_index"]) + 1  # type: ignore[call-overload]

    out: dict[str, object] = {"tree": str(Path(dledger.__file__).parent.parent), "entries": args.entries,
                              "size": args.size}
    for name, run in (("files", files()), ("files-nobody", files(bodies=False)),
                      ("records", files(records=True)), ("inspect", admin)):
        secs, cpu, rows = best(args.repeat, run)
        out[name] = {"s": round(secs, 3), "cpu_s": round(cpu, 3), "rows": rows, "rows_per_s": round(rows / secs)}
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:14} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
