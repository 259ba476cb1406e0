"""etcd side of the comparison: a local 3-member cluster and a load of concurrent puts.

The load goes through etcd 3.4's JSON gRPC gateway (`POST /v3/kv/put`, `POST /v3/kv/txn`,
keys and values base64) over raw HTTP/1.1 keep-alive connections written with asyncio
streams (uvloop), one request in flight per connection, in K processes. The Go `benchmark`
tool is not packaged in Debian; `etcdctl check perf` (also run, as a cross-check) has fixed
loads only and gives no percentiles.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.bench.load import LoadResult
from dledger.local_cluster import stop_processes
from dledger.ports import free_ports


class EtcdCluster:
    """`n` etcd members on 127.0.0.1, data dirs under `base`, stopped on exit."""

    def __init__(self, base: Path, n: int = 3) -> None:
        self.base = base
        self.n = n
        ports = free_ports(2 * n)
        self.client_ports = ports[:n]
        self.peer_ports = ports[n:]
        self.names = [f"e{k}" for k in range(n)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.leader: str = ""

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.client_ports[self.names.index(name)]}"

    @property
    def endpoints(self) -> list[str]:
        return [self.url(m) for m in self.names]

    def commands(self) -> list[list[str]]:
        etcd = shutil.which("etcd") or "etcd"
        cluster = ",".join(f"{m}=http://127.0.0.1:{p}" for m, p in zip(self.names, self.peer_ports, strict=True))
        out = []
        for m, cp, pp in zip(self.names, self.client_ports, self.peer_ports, strict=True):
            out.append([
                etcd, "--name", m, "--data-dir", str(self.base / m),
                "--listen-client-urls", f"http://127.0.0.1:{cp}", "--advertise-client-urls", f"http://127.0.0.1:{cp}",
                "--listen-peer-urls", f"http://127.0.0.1:{pp}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"bench-{os.getpid()}",
                "--quota-backend-bytes", str(8 << 30), "--logger", "zap", "--log-level", "error",
            ])  # fmt: skip
        return out

    def __enter__(self) -> EtcdCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        for m, cmd in zip(self.names, self.commands(), strict=True):
            log = open(self.base / f"{m}.log", "wb")  # the member keeps its own copy of the fd
            self.procs[m] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        try:
            self.wait_ready(30.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        stop_processes(self.procs.values())

    def status(self, name: str) -> dict[str, Any]:
        return post_json(self.url(name) + "/v3/maintenance/status", {})

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m, p in self.procs.items():
                if p.poll() is not None:
                    log = (self.base / f"{m}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"etcd member {m} exited with code {p.returncode}:\n{log}")
            try:
                views = {m: self.status(m) for m in self.names}
                leaders = {v.get("leader") for v in views.values()}
                if len(leaders) == 1 and None not in leaders:
                    (lead,) = leaders
                    self.leader = next(m for m, v in views.items() if v["header"]["member_id"] == lead)
                    post_json(self.url(self.leader) + "/v3/kv/put", {"key": b64(b"warm"), "value": b64(b"up")})
                    return
            except (OSError, KeyError, StopIteration, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"etcd cluster not ready in {timeout:.0f} s")

    def check_perf(self, load: str, prefix: str, timeout: float = 180.0) -> dict[str, Any]:
        """`etcdctl check perf --load LOAD` against the leader; its verdict lines parsed."""
        cmd = [shutil.which("etcdctl") or "etcdctl", f"--endpoints={self.url(self.leader)}", "check", "perf",
               f"--load={load}", f"--prefix={prefix}"]
        env = dict(os.environ, ETCDCTL_API="3")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out: dict[str, Any] = {"command": " ".join([cmd[0], "--endpoints=LEADER", *cmd[2:]]), "exit": p.returncode}
        for line in p.stdout.splitlines():
            if "writes/s" in line:
                out["writes_per_s"] = int(line.split(":")[-1].split()[0])
                out["throughput_line"] = line.strip()
            elif "Slowest request" in line:
                out["slowest_s"] = float(line.rstrip("s").split()[-1].rstrip("s"))
            elif "Stddev" in line:
                out["stddev_s"] = float(line.rstrip("s").split()[-1].rstrip("s"))
        if "writes_per_s" not in out:
            out["error"] = (p.stdout + p.stderr)[-500:]
        return out


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def post_json(url: str, obj: object, timeout: float = 2.0) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(obj).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


# --- the load ------------------------------------------------------------------------------------


@dataclass
class EtcdLoadSpec:
    url: str  # client URL of the member to load (the leader)
    proc: int  # index of this load process (keys are unique per process)
    conns: int = 16  # connections = concurrent requests (closed loop) or the pool (open loop)
    size: int = 1024
    batch: int = 1  # puts per request: 1 = /v3/kv/put, more = one /v3/kv/txn of `batch` puts
    duration: float = 10.0
    warmup: float = 1.0
    rate: float = 0.0  # entries/s of this process, open loop; 0: closed loop


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def call(self, request: bytes) -> None:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if head[9:12] != b"200":
            raise RuntimeError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
        lower = head.lower()
        i = lower.find(b"content-length:")
        if i >= 0:
            n = int(lower[i + 15 : lower.index(b"\r\n", i)])
            await self.reader.readexactly(n)
        elif b"chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        # etcd's gateway answers errors with a non-200 status, so a 200 is a success


def _request_factory(spec: EtcdLoadSpec) -> Callable[[int, int], bytes]:
    host = spec.url.split("//", 1)[1]
    value = b64(os.urandom(spec.size)).encode()

    def key(conn: int, seq: int, j: int) -> bytes:
        return base64.b64encode(b"/bench/%d/%d/%d/%d" % (spec.proc, conn, seq, j))

    def http(path: bytes, body: bytes) -> bytes:
        return (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path, host.encode(), len(body))
            + body
        )

    if spec.batch == 1:
        return lambda conn, seq: http(b"/v3/kv/put", b'{"key":"%s","value":"%s"}' % (key(conn, seq, 0), value))

    def txn(conn: int, seq: int) -> bytes:
        puts = b",".join(
            b'{"requestPut":{"key":"%s","value":"%s"}}' % (key(conn, seq, j), value) for j in range(spec.batch)
        )
        return http(b"/v3/kv/txn", b'{"success":[%s]}' % puts)

    return txn


async def etcd_load(spec: EtcdLoadSpec, ready: Callable[[], Awaitable[object]]) -> LoadResult:
    """One load process: closed loop (one request in flight per connection) or open loop."""
    host, port = spec.url.split("//", 1)[1].split(":")
    make = _request_factory(spec)
    conns = [_Conn(*await asyncio.open_connection(host, int(port))) for _ in range(spec.conns)]
    await conns[0].call(make(0, -1))  # fail fast
    await ready()
    result = LoadResult(size=spec.size, batch=spec.batch)
    start = time.perf_counter() + spec.warmup
    end = start + spec.duration
    cpu: list[float] = []

    def ok(sent: float) -> None:
        now = time.perf_counter()
        if now >= start:
            result.entries += spec.batch
            result.requests += 1
            result.latencies_ms.append((now - sent) * 1000)
            result.done_at.append(now - start)

    def error(e: Exception) -> None:
        if time.perf_counter() >= start:
            name = type(e).__name__ if not isinstance(e, RuntimeError) else str(e)[:60]
            result.errors[name] = result.errors.get(name, 0) + 1

    async def cpu_window() -> None:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        cpu.append(time.process_time())

    async def closed(k: int, c: _Conn) -> None:
        seq = 0
        while time.perf_counter() < end:
            seq += 1
            sent = time.perf_counter()
            try:
                await c.call(make(k, seq))
                ok(sent)
            except (RuntimeError, OSError, asyncio.IncompleteReadError) as e:
                error(e)
                await asyncio.sleep(0.01)

    async def open_loop() -> None:
        idle: asyncio.Queue[tuple[int, _Conn]] = asyncio.Queue()
        for k, c in enumerate(conns):
            idle.put_nowait((k, c))
        inflight: set[asyncio.Task[None]] = set()
        interval = spec.batch / spec.rate
        seq = 0

        async def one(scheduled: float, seq: int) -> None:
            k, c = await idle.get()
            try:
                await c.call(make(k, seq))
                ok(scheduled)
            except (RuntimeError, OSError, asyncio.IncompleteReadError) as e:
                error(e)
            finally:
                idle.put_nowait((k, c))

        next_at = time.perf_counter()
        while time.perf_counter() < end:
            now = time.perf_counter()
            while next_at <= now:
                seq += 1
                t = asyncio.ensure_future(one(next_at, seq))
                inflight.add(t)
                t.add_done_callback(inflight.discard)
                next_at += interval
            await asyncio.sleep(max(0.001, min(next_at - time.perf_counter(), 0.005)))  # uvloop: ms timers
        if inflight:
            await asyncio.wait(inflight, timeout=15)

    watcher = asyncio.ensure_future(cpu_window())
    if spec.rate > 0:
        await open_loop()
    else:
        await asyncio.gather(*(closed(k, c) for k, c in enumerate(conns)))
    result.elapsed = max(time.perf_counter() - start, 1e-9)
    result.cpu_s = time.process_time() - cpu[0] if cpu else 0.0
    watcher.cancel()
    for c in conns:
        c.writer.close()
    result.compute_timeline()
    return result
