"""`make bench-store`: FileLedgerStore append throughput against raw write(2)/fdatasync(2) baselines.

Each store cell is followed at once by its raw baseline on the same disk, in the
same process, so the ratio means something on a noisy machine where the
absolute numbers do not. MB/s counts body bytes (10^6 bytes per MB) on both
sides: the baseline writes whole records (body + 48-byte header) but is
credited only with their bodies, so a ratio of 1.0 means "as many entries per
second as a naive log doing the same syscalls".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from dledger.entry import HEADER_SIZE
from dledger.store.durability import DurabilityWaiter
from dledger.store.file import FileLedgerStore

log = logging.getLogger(__name__)

DESCRIPTION = "FileLedgerStore append throughput against raw write(2)/fdatasync(2) baselines."

MB = 1_000_000
TERM = 1
MODES = ("async", "sync")
TARGET_BATCH = 100
SYNC_TARGET_RATIO = 0.70  # of the raw write+fdatasync baseline's MB/s
ASYNC_TARGET_MB_S = 300.0


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One mode x batch cell and its raw baseline, measured in alternating slices."""

    mode: str
    batch: int
    appends_per_s: float  # entries per second, not append calls
    mb_per_s: float
    fsyncs: int | None  # flushes the store published during the run
    entries: int
    elapsed_s: float
    cpu_s: float  # process CPU time while the store ran: below elapsed_s means it was starved
    baseline: str
    baseline_mb_per_s: float
    baseline_fsyncs: int
    round_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        return self.mb_per_s / self.baseline_mb_per_s if self.baseline_mb_per_s > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = self.ratio
        return d


@dataclass(frozen=True, slots=True)
class TargetCheck:
    name: str
    measured: str
    met: bool


@dataclass(frozen=True, slots=True)
class _Run:
    entries: int
    elapsed_s: float
    fsyncs: int
    cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.entries / self.elapsed_s


class _FlushCounter:
    """Flush listener: each published flush is one round of fdatasync calls (a group commit)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, durable: int) -> None:
        self.count += 1


def run_store_bench(
    directory: Path,
    body_size: int = 1024,
    batches: Sequence[int] = (1, 100),
    modes: Sequence[str] = MODES,
    duration_s: float = 3.0,
    concurrency: int = 16,
    rounds: int = 3,
) -> list[BenchResult]:
    """Run every mode x batch cell in fresh stores under `directory`.

    A cell's `duration_s` is split into `rounds` slices that alternate store and
    raw baseline, so a burst of load from a neighbour hits both sides alike
    instead of skewing the ratio.
    """
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown flush mode {mode!r}; expected one of {MODES}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    body = os.urandom(body_size)
    record = body_size + HEADER_SIZE
    slice_s = duration_s / rounds
    _settle()
    results: list[BenchResult] = []
    for mode in modes:
        durable = mode == "sync"
        label = "write+fdatasync" if durable else "write"
        for batch in batches:
            log.info("flush=%s batch=%d: %d x (store, %s) slices of %.2fs", mode, batch, rounds, label, slice_s)
            stores: list[_Run] = []
            bases: list[_Run] = []
            for r in range(rounds):
                run = _store_cell(directory / f"store-{mode}-b{batch}-r{r}", mode, [body] * batch, slice_s, concurrency)
                stores.append(run)
                bases.append(
                    _raw_baseline(
                        directory / f"raw-{mode}-b{batch}-r{r}",
                        chunk=os.urandom(batch * record),
                        record_size=record,
                        total_bytes=run.entries * record,
                        fdatasync=durable,
                        duration_s=slice_s,
                    )
                )
            store, base = _total(stores), _total(bases)
            results.append(
                BenchResult(
                    mode=mode,
                    batch=batch,
                    appends_per_s=store.rate,
                    mb_per_s=store.rate * body_size / MB,
                    fsyncs=store.fsyncs,
                    entries=store.entries,
                    elapsed_s=store.elapsed_s,
                    cpu_s=store.cpu_s,
                    baseline=label,
                    baseline_mb_per_s=base.rate * body_size / MB,
                    baseline_fsyncs=base.fsyncs,
                    round_ratios=tuple(s.rate / b.rate for s, b in zip(stores, bases, strict=True)),
                )
            )
    return results


def _total(runs: Sequence[_Run]) -> _Run:
    return _Run(
        sum(r.entries for r in runs),
        sum(r.elapsed_s for r in runs),
        sum(r.fsyncs for r in runs),
        sum(r.cpu_s for r in runs),
    )


def _store_cell(directory: Path, mode: str, bodies: list[bytes], duration_s: float, concurrency: int) -> _Run:
    shutil.rmtree(directory, ignore_errors=True)
    store = FileLedgerStore(directory, flush=mode)
    try:
        created = sorted(p.name for p in (directory / "data").iterdir())
        if created:  # a 1 GiB file per cell must not be paid for before the first append
            log.warning("%s: data files exist before the first append: %s", directory, created)
        counter = _FlushCounter()
        store.add_flush_listener(counter)
        return asyncio.run(_drive(store, counter, bodies, duration_s, concurrency))
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
        _settle()


async def _drive(
    store: FileLedgerStore, counter: _FlushCounter, bodies: list[bytes], duration_s: float, concurrency: int
) -> _Run:
    # sync: each writer waits for its own entries, so writers that arrive during
    # an fsync share the next one; async: writers only yield, durability comes
    # from the flusher's timer plus one final flush, which is timed too.
    waiter = DurabilityWaiter(store) if store.sync_mode else None
    n = len(bodies)
    entries = 0
    fsyncs_before = counter.count
    cpu_start = time.process_time()
    start = time.perf_counter()
    deadline = start + duration_s

    async def writer() -> None:
        nonlocal entries
        clock = time.perf_counter
        append = store.append_as_leader
        while clock() < deadline:
            result = append(bodies, TERM)
            entries += n
            if waiter is not None:
                await waiter.wait(result.last_index)
            else:
                await asyncio.sleep(0)

    await asyncio.gather(*(writer() for _ in range(concurrency)))
    if waiter is None:
        store.flush()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    if store.durable_index != store.end_index:
        raise RuntimeError(f"run ended with durable {store.durable_index} < end {store.end_index}")
    return _Run(entries, elapsed, counter.count - fsyncs_before, cpu)


def _raw_baseline(
    directory: Path,
    *,
    chunk: bytes,
    record_size: int,
    total_bytes: int,
    fdatasync: bool,
    duration_s: float,
) -> _Run:
    """What a naive log does: append each batch with write(2), then fdatasync(2) if durable.

    Writes as many bytes as the store slice did (at least one chunk), or stops
    at `duration_s`; counts whole records.
    """
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    path = directory / "raw.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    written = syncs = 0
    try:
        start = time.perf_counter()
        deadline = start + duration_s
        while written == 0 or (written < total_bytes and time.perf_counter() < deadline):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            written += len(chunk)
            if fdatasync:
                os.fdatasync(fd)
                syncs += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)
        _settle()
    return _Run(written // record_size, elapsed, syncs)


def _settle(pause_s: float = 0.3) -> None:
    """Let the previous phase's writeback and file deletions finish before the next one is timed.

    Freed blocks are discarded at the next journal commit (ext4 `discard`), and
    that commit would otherwise be the next phase's first fsyncs.
    """
    os.sync()
    time.sleep(pause_s)


def check_targets(results: Sequence[BenchResult]) -> list[TargetCheck]:
    """The issue's targets, for the cells that were run."""
    checks: list[TargetCheck] = []
    for r in results:
        if r.batch != TARGET_BATCH:
            continue
        if r.mode == "sync":
            checks.append(
                TargetCheck(
                    f"sync, batch {TARGET_BATCH}: >= {SYNC_TARGET_RATIO:.0%} of raw write+fdatasync MB/s",
                    f"{r.ratio:.1%} ({r.mb_per_s:.1f} vs {r.baseline_mb_per_s:.1f} MB/s)",
                    r.ratio >= SYNC_TARGET_RATIO,
                )
            )
        elif r.mode == "async":
            checks.append(
                TargetCheck(
                    f"async, batch {TARGET_BATCH}: >= {ASYNC_TARGET_MB_S:.0f} MB/s",
                    f"{r.mb_per_s:.1f} MB/s",
                    r.mb_per_s >= ASYNC_TARGET_MB_S,
                )
            )
    return checks


def render(results: Sequence[BenchResult], body_size: int, duration_s: float, concurrency: int) -> Table:
    """CPU is the store's process CPU time over its wall time (up to 200% on 2 cores): far below
    100% in a CPU-bound cell means a neighbour took the cores."""
    table = Table(
        title=(
            f"FileLedgerStore appends: {body_size}-byte bodies, {concurrency} writers, "
            f"{duration_s:g}s of store per cell"
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ("mode", "batch", "appends/s", "MB/s", "CPU", "flushes", "raw baseline", "raw MB/s", "ratio", "per round")
    for name in columns:
        table.add_column(name, justify="left" if name in ("mode", "raw baseline") else "right", no_wrap=True)
    for r in results:
        table.add_row(
            r.mode,
            str(r.batch),
            f"{r.appends_per_s:,.0f}",
            f"{r.mb_per_s:.1f}",
            f"{r.cpu_s / r.elapsed_s:.0%}",
            "-" if r.fsyncs is None else f"{r.fsyncs:,}",
            r.baseline,
            f"{r.baseline_mb_per_s:.1f}",
            f"{r.ratio:.2f}",
            f"{min(r.round_ratios):.2f}-{max(r.round_ratios):.2f}" if r.round_ratios else "",
        )
    return table


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from e
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dledger.bench.store_bench", description=DESCRIPTION)
    parser.add_argument("--dir", type=Path, help="where to write (default: a fresh temp dir, removed after)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per cell (default 3)")
    parser.add_argument("--size", type=int, default=1024, help="body bytes per entry (default 1024)")
    parser.add_argument("--batches", type=_positive_ints, default=[1, 100], help="comma-separated (default 1,100)")
    parser.add_argument("--modes", default="async,sync", help="comma-separated flush modes (default async,sync)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent writer tasks (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="store/baseline slices per cell (default 3)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in modes):
        parser.error(f"--modes: expected a subset of {','.join(MODES)}")

    console = Console()
    if not console.is_terminal:
        console = Console(width=110)  # piped into a file or a doc: do not squeeze the table to 80 columns
    handler = RichHandler(console=console, show_time=False, show_path=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler])
    logging.getLogger("dledger.store").setLevel(logging.WARNING)  # one "recovered" line per cell is noise
    tmp = args.dir is None
    directory: Path = Path(tempfile.mkdtemp(prefix="dledger-bench-")) if tmp else args.dir
    try:
        results = run_store_bench(
            directory, args.size, args.batches, modes, args.duration, args.concurrency, args.rounds
        )
    finally:
        if tmp:
            shutil.rmtree(directory, ignore_errors=True)

    console.print(render(results, args.size, args.duration, args.concurrency))
    checks = check_targets(results)
    for c in checks:
        verdict = "[green]met[/green]" if c.met else "[red]NOT met[/red]"
        console.print(f"target {c.name}: {c.measured} -> {verdict}")
    if args.json is not None:
        doc = {
            "body_size": args.size,
            "duration_s": args.duration,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "results": [r.to_json() for r in results],
            "targets": [asdict(c) for c in checks],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if args.check and not all(c.met for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
