"""Starts three `syncobj_node.py` members and runs loads on them together (see that module)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from dledger.bench.load import LoadResult, merge
from dledger.ports import free_ports

NODE = Path(__file__).with_name("syncobj_node.py")


class SyncObjCluster:
    def __init__(self, base: Path, n: int = 3, conf: dict[str, Any] | None = None) -> None:
        self.base = base
        self.conf = conf or {}
        self.addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
        self.procs: list[subprocess.Popen[str]] = []

    def command(self, k: int) -> list[str]:
        others = [a for a in self.addrs if a != self.addrs[k]]
        return [sys.executable, str(NODE), self.addrs[k], *others, "--journal", str(self.base / f"journal{k}.bin"),
                "--conf", json.dumps(self.conf)]

    def __enter__(self) -> SyncObjCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        for k in range(len(self.addrs)):
            with open(self.base / f"node{k}.err", "wb") as err:  # the member keeps its own copy of the fd
                self.procs.append(
                    subprocess.Popen(self.command(k), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                     text=True)
                )
        try:
            for p in self.procs:
                line = p.stdout.readline() if p.stdout else ""
                if line.strip() != "ready":
                    raise RuntimeError(f"PySyncObj member did not start (exit {p.poll()})")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin:
                try:
                    p.stdin.write("quit\n")
                    p.stdin.flush()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def log_lines(self, needle: str) -> int:
        """How many lines of the members' stderr contain `needle` (PySyncObj logs there)."""
        n = 0
        for k in range(len(self.addrs)):
            path = self.base / f"node{k}.err"
            if path.exists():
                n += sum(needle in line for line in path.read_text(errors="replace").splitlines())
        return n

    @property
    def pids(self) -> dict[str, int]:
        return {f"s{k}": p.pid for k, p in enumerate(self.procs)}

    def load(self, mode: str, size: int, batch: int, duration: float, warmup: float,
             window: int = 0, rate: float = 0.0) -> LoadResult:
        """Every member submits: `window` commands in flight each (closed), or rate/n each."""
        n = len(self.procs)
        cmd: dict[str, Any] = {"mode": mode, "size": size, "batch": batch, "duration": duration,
                               "warmup": warmup, "window": window, "rate": rate / n,
                               "start_at": time.time() + 0.5}
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()
        results = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"PySyncObj member exited with code {p.wait()}")
            d = json.loads(line)
            r = LoadResult(entries=d["entries"], requests=d["requests"], elapsed=d["elapsed"], size=size,
                           batch=batch, errors=d["errors"])
            r.latencies_ms = array("d", d["latencies_ms"])
            r.done_at = array("d", d["done_at"])
            results.append(r)
        return merge(results)
