"""What opening a store costs: with dledger's checkpoint, and without one (docs/performance.md).

`python benchmarks/recovery_open.py [--entries 200000] [--size 1024] [--repeat 3] [--dir DIR] [--json]`

Builds a store of `--entries` entries of `--size`-byte bodies (1 GiB data files, dledger's
default), then opens it, alternating, `--repeat` times each way:

- `checkpoint`: a restart as every member does it: recovery scans only past the trusted
  record;
- `strict`: the checkpoint removed (a store upstream DLedger wrote, or one whose checkpoint
  was lost): recovery validates the whole log and checks that nothing but zeros follows its
  end (sparse holes skipped), before it writes a byte;
- `upstream`: the same store with every record's CRC fields 0 (upstream's form), opened
  strictly: the records are read unverified.

Times are wall seconds on a warm page cache (the store was just written or read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path


def build(d: Path, entries: int, size: int) -> None:
    from dledger.store.file import FileLedgerStore

    shutil.rmtree(d, ignore_errors=True)
    s = FileLedgerStore(d)
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for k in range(0, entries, 5000):
        s.append_as_leader([body] * min(5000, entries - k), 1)
    s.flush()
    s.close()


def upstream_copy(src: Path, dst: Path) -> None:
    """`dst`: `src` with both CRC fields of every record 0, as upstream writes them."""
    from dledger.store.file import FileLedgerStore

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    s = FileLedgerStore(src)
    positions = [s.get(i).pos for i in range(s.begin_index, s.end_index + 1)]
    s.close()
    size = 1 << 30
    fds: dict[int, int] = {}
    try:
        for p in positions:
            start = p - p % size
            if start not in fds:
                fds[start] = os.open(dst / "data" / f"{start:020d}", os.O_WRONLY)
            os.pwrite(fds[start], bytes(8), p % size + 36)
    finally:
        for fd in fds.values():
            os.close(fd)
    (dst / "checkpoint").unlink()


def open_once(d: Path, strict: bool) -> float:
    from dledger.store.file import FileLedgerStore

    saved = None
    if strict and (d / "checkpoint").exists():
        saved = (d / "checkpoint").read_bytes()
        (d / "checkpoint").unlink()
    t = time.perf_counter()
    s = FileLedgerStore(d)
    took = time.perf_counter() - t
    s.close()
    if strict:
        (d / "checkpoint").unlink()  # the open wrote one: keep the next strict open strict
        if saved is not None:
            (d / "checkpoint").write_bytes(saved)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/dledger-recovery-bench")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = Path(a.dir)
    build(base / "own", a.entries, a.size)
    upstream_copy(base / "own", base / "upstream")
    runs: dict[str, list[float]] = {"checkpoint": [], "strict": [], "upstream": []}
    for _ in range(a.repeat):
        runs["checkpoint"].append(open_once(base / "own", strict=False))
        runs["strict"].append(open_once(base / "own", strict=True))
        runs["upstream"].append(open_once(base / "upstream", strict=True))
    out = {k: [round(v, 3) for v in vs] for k, vs in runs.items()}
    if a.json:
        print(json.dumps({"entries": a.entries, "size": a.size, "open_s": out}))
    else:
        for k, vs in out.items():
            print(f"{k:>10}: {vs}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
