"""`make demo`: shows what dledger does, end to end, on this machine.

1. Storage: a writer process appends with `flush=sync`, reporting each entry
   once fsynced; we SIGKILL it mid-stream, reopen the store, and check that
   every entry reported durable is there, byte for byte.
2. Cluster: a local 3-member group (separate processes, `flush=sync`), four
   writers appending with a progress bar; we SIGKILL the leader midway, time
   the failover, restart it, and check that every acknowledged entry is at
   its index on every member.
3. Spark: events appended through `df.write.format("dledger")`, a streaming
   query into Parquet stopped midway and restarted from its checkpoint, and
   the output checked for every event exactly once (examples/pipeline.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from dledger.store import FileLedgerStore
from dledger.store.durability import DurabilityWaiter

log = logging.getLogger(__name__)
console = Console()

DEMO_FILE_SIZE = 1 << 20  # small files so the demo crosses file boundaries


def body_of(index: int) -> bytes:
    """Deterministic bodies let the checker verify content without a side channel."""
    return (f"event-{index:08d}|" * 8).encode()


async def _write_forever(directory: Path) -> None:
    store = FileLedgerStore(directory, data_file_size=DEMO_FILE_SIZE, flush="sync")
    waiter = DurabilityWaiter(store)
    index = store.end_index + 1

    async def client(batch: int) -> None:
        nonlocal index
        while True:
            bodies = [body_of(index + k) for k in range(batch)]
            index += batch
            r = store.append_as_leader(bodies, term=1)
            await waiter.wait(r.last_index)
            sys.stdout.write(f"{r.last_index}\n")
            sys.stdout.flush()

    await asyncio.gather(*(client(b) for b in (1, 1, 4, 16)))


def writer_main(directory: str) -> None:
    asyncio.run(_write_forever(Path(directory)))


def storage_demo(base: Path, target: int = 20_000) -> bool:
    console.rule("[bold]1. storage: durable appends survive SIGKILL")
    directory = base / "store"
    shutil.rmtree(directory, ignore_errors=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dledger.demo", "writer", str(directory)],
        stdout=subprocess.PIPE, text=True,
    )
    durable = -1
    assert proc.stdout is not None
    with Progress(console=console) as progress:
        task = progress.add_task("appending (flush=sync)", total=target)
        for line in proc.stdout:
            durable = max(durable, int(line))
            progress.update(task, completed=min(durable + 1, target))
            if durable + 1 >= target:
                break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    console.print(f"writer killed with SIGKILL after {durable + 1} entries were reported durable")
    store = FileLedgerStore(directory, data_file_size=DEMO_FILE_SIZE)
    try:
        entries = [e for i in range(0, store.end_index + 1, 1000) for e in store.read(i, 1000, 1 << 30)]
        bad = [e.index for e in entries if e.body != body_of(e.index)]
        ok = store.end_index >= durable and not bad
        files = len(store.data.files)
        console.print(
            f"reopened: {store.end_index + 1} entries in {files} data files, "
            f"chain crc {store.end_chain_crc:#010x}; durable ones all present: "
            + ("[green]yes[/green]" if ok else f"[red]NO[/red] (bad: {bad[:5]})")
        )
    finally:
        store.close()
    return ok


def spark_demo(base: Path) -> bool:
    console.rule("[bold]5. Spark: a streaming pipeline restarted from its checkpoint, exactly once")
    from dledger.spark.java import java_problem

    if (problem := java_problem()) is not None:
        console.print(f"[red]no Java[/red]: {escape(problem)}")
        return False
    try:
        from dledger.spark.pipeline_demo import run_pipeline_demo
    except ImportError as e:
        console.print(f"[red]Spark part unavailable[/red] ({e}): pip install 'dledger[spark]'")
        return False
    return run_pipeline_demo(base / "pipeline")


def run_demo() -> int:
    base = Path(tempfile.mkdtemp(prefix="dledger-demo-"))
    try:
        ok = storage_demo(base, target=5000)
        from dledger.demo_cluster import cluster_demo

        ok = cluster_demo(base) and ok
        from dledger.demo_kv import kv_demo

        ok = kv_demo(base) and ok
        from dledger.demo_broker import broker_demo

        ok = broker_demo(base) and ok
        ok = spark_demo(base) and ok
    finally:
        shutil.rmtree(base, ignore_errors=True)
    console.rule("[bold green]demo passed" if ok else "[bold red]demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "writer":
        writer_main(sys.argv[2])
    else:
        sys.exit(run_demo())
