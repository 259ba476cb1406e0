"""Why FileLedgerStore writes with pwrite: stores into a shared file mapping stall the machine.

    .venv/bin/python benchmarks/mmap_stall.py [--rate 18500] [--writers 3] [--seconds 8]

Starts `--writers` processes that each append 1,072-byte records (a 1 KiB entry with its
header) at `--rate` records/s to a fresh sparse 1 GiB file in the store's directory
(`--dir`), 32 records per write, either by storing into an mmap of the file or with
`os.pwrite` (mode `pwrite+read` also reads every write back through a mapping, as the
leader does for pushes). Meanwhile a monitor process that touches no file sleeps 2 ms at a
time and counts the sleeps that took more than 8 ms: those are stalls of the whole machine.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import tempfile
import time

RECORD = 1072
PER_WRITE = 32


def writer(mode: str, directory: str, rate: float, seconds: float) -> None:
    path = os.path.join(directory, f"f{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    size = 1 << 30
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size) if mode != "pwrite" else None
    chunk = os.urandom(RECORD * PER_WRITE)
    interval = PER_WRITE / rate
    off = 0
    start = nxt = time.monotonic()
    try:
        while time.monotonic() - start < seconds and off + len(chunk) <= size:
            nxt += interval
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if mode == "mmap":
                assert mm is not None
                mm[off : off + len(chunk)] = chunk
            else:
                os.pwrite(fd, chunk, off)
                if mm is not None:
                    bytes(mm[off : off + len(chunk)])
            off += len(chunk)
    finally:
        if mm is not None:
            mm.close()
        os.close(fd)
        os.unlink(path)


def monitor(seconds: float, out: mp.Queue[list[float]]) -> None:
    stalls = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        time.sleep(0.002)
        lag = (time.perf_counter() - t) * 1000
        if lag > 8:
            stalls.append(lag)
    out.put(stalls)


def run(mode: str, args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    q: mp.Queue[list[float]] = ctx.Queue()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        ws = [ctx.Process(target=writer, args=(mode, d, args.rate, args.seconds)) for _ in range(args.writers)]
        for w in ws:
            w.start()
        time.sleep(0.5)
        m = ctx.Process(target=monitor, args=(args.seconds - 1, q))
        m.start()
        stalls = q.get()
        m.join()
        for w in ws:
            w.join()
    worst = f", worst {max(stalls):.0f} ms" if stalls else ""
    mb = args.writers * args.rate * RECORD / 1e6
    print(f"{mode:12s} {args.writers} writers x {args.rate:,.0f} records/s ({mb:.0f} MB/s in all): "
          f"{len(stalls)} stalls > 8 ms of a process that touches no file in {args.seconds - 1:.0f} s{worst}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=18500, help="records/s per writer")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--dir", default=None, help="where the files go (default: the temp directory)")
    ap.add_argument("--modes", default="mmap,pwrite,pwrite+read")
    args = ap.parse_args()
    for mode in args.modes.split(","):
        run(mode, args)


if __name__ == "__main__":
    main()
