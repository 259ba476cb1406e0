"""The machine's own latency tail: what a replicated append's path of process wake-ups costs at
p99 with no dledger code on it (docs/performance.md, "The machine's own tail").

`python benchmarks/machine_tail.py [--rate 100,1000] [--lookups 0,250] [--duration 10] [--dledger]`

A relay in the shape of a replicated append, over TCP on 127.0.0.1, one process per role: the
load process sends a 1 KiB frame to a "leader", which sends it on to two "followers"; each
answers 36 bytes, and the leader answers the load process at the first answer (a majority of
three). That is four process wake-ups per request, as in dledger (fewer: no flush thread, no
Python on the way), so its p99 at a rate is a floor for dledger's at that rate on this machine.
Each relay process can also do some memory work per message (`--lookups`: random reads of a
~50 MB heap, as an interpreter's work touches its heap); with as many reads as make the relay's
p50 match dledger's, its p99 shows what the machine adds to a path of that much work.
The load is an open loop (latency from the scheduled send time, as `dledger bench --rate`).

Also printed: the spread of a fixed 0.3 ms compute step run back to back ("compute jitter",
what the machine takes away from a busy process) and right after a 10 ms sleep ("after a
sleep", what it takes from a process that woke up). With `--dledger`, the same open loop
against a fresh 3-member group (`flush=sync`, `dledger bench --rate R`, 16 clients) runs
right after each relay run, so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from multiprocessing import Process
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dledger.bench.load import LoadResult  # noqa: E402

REQUEST = 1024
ANSWER = 36


def pct(xs: list[float]) -> dict[str, float | None]:
    """Latencies in seconds as `dledger bench` reports them (p50 .. p999 and max, ms): the
    relay's and dledger's lines are summarised by the same code."""
    lat: dict[str, float | None] = LoadResult(latencies_ms=array("d", (x * 1e3 for x in xs))).report()["latency_ms"]
    return lat


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise ConnectionError("closed")
        buf += got
    return buf


class _Heap:
    """A member's work on a message, in the shape of an interpreter's: `lookups` random reads
    of a ~50 MB heap of small objects (a spin loop would touch no memory, and on a virtual
    machine what costs most after a wake-up is memory: caches and TLB gone cold)."""

    def __init__(self, lookups: int) -> None:
        self.lookups = lookups
        self.heap = {i: str(i) for i in range(500_000)} if lookups else {}
        self.keys = list(self.heap)
        self.at = 0

    def work(self) -> None:
        n, keys, heap = len(self.keys), self.keys, self.heap
        for _ in range(self.lookups):
            self.at = (self.at * 1103515245 + 12345) % 2147483648
            heap[keys[self.at % n]]


def _follower(listener: socket.socket, lookups: int) -> None:
    """Answers each 1 KiB frame with 36 bytes (a follower's push answer)."""
    heap = _Heap(lookups)
    conn = _nodelay(listener.accept()[0])
    try:
        while True:
            _recv_exact(conn, REQUEST)
            heap.work()
            conn.sendall(b"a" * ANSWER)
    except (ConnectionError, OSError):
        pass


def _leader(listener: socket.socket, followers: list[tuple[str, int]], lookups: int) -> None:
    """One event loop (selectors): a request goes to both followers; the first answer of each
    request answers the client (answers come back in order on each follower's connection)."""
    heap = _Heap(lookups)
    fs = [_nodelay(socket.create_connection(a)) for a in followers]
    client = _nodelay(listener.accept()[0])
    sel = selectors.DefaultSelector()
    sel.register(client, selectors.EVENT_READ, "client")
    for k, f in enumerate(fs):
        sel.register(f, selectors.EVENT_READ, k)
    pending = bytearray()
    acked = [0, 0]  # answers seen per follower
    answered = 0  # requests answered to the client
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "client":
                    data = client.recv(65536)
                    if not data:
                        return
                    pending += data
                    while len(pending) >= REQUEST:
                        frame = bytes(pending[:REQUEST])
                        del pending[:REQUEST]
                        heap.work()
                        for f in fs:
                            f.sendall(frame)
                else:
                    k = key.data
                    data = fs[k].recv(65536)
                    if not data:
                        return
                    acked[k] += len(data) // ANSWER  # (answers are small: they arrive whole here)
                    majority = max(acked)
                    if majority > answered:
                        heap.work()
                        client.sendall(b"r" * ANSWER * (majority - answered))
                        answered = majority
    except (ConnectionError, OSError):
        pass


def relay(rate: float, duration: float, lookups: int = 0) -> dict[str, float | None]:
    """The relay's latency percentiles at `rate` requests/s, open loop; each process does
    `lookups` random reads of its heap for each message it handles."""
    fl = [_listener(), _listener()]
    ll = _listener()
    procs = [Process(target=_follower, args=(f, lookups), daemon=True) for f in fl]
    procs.append(Process(target=_leader, args=(ll, [f.getsockname() for f in fl], lookups), daemon=True))
    for p in procs:
        p.start()
    conn = _nodelay(socket.create_connection(ll.getsockname()))
    sent: list[float] = []
    lat: list[float] = []

    def receive() -> None:
        got = 0
        while got < len(sent) or not done.is_set():
            data = conn.recv(65536)
            if not data:
                return
            now = time.perf_counter()
            n = len(data) // ANSWER
            lat.extend(now - sent[got + k] for k in range(n))
            got += n

    done = threading.Event()
    rx = threading.Thread(target=receive, daemon=True)
    rx.start()
    frame = b"q" * REQUEST
    start = time.perf_counter() + 0.2
    at = start
    while at < start + duration:
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent.append(at)  # latency counts from the scheduled time
        conn.sendall(frame)
        at += 1.0 / rate
    done.set()
    rx.join(timeout=10)
    conn.close()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return pct(lat)


def compute_jitter(duration: float = 5.0) -> dict[str, dict[str, float | None]]:
    """A ~0.3 ms loop timed back to back, and after each of a run of 10 ms sleeps."""
    def step() -> float:
        t = time.perf_counter()
        x = 0
        for i in range(2000):
            x += i
        return time.perf_counter() - t

    busy: list[float] = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        busy.append(step())
    woke: list[float] = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        time.sleep(0.01)
        woke.append(step())
    return {"back to back": pct(busy), "after a sleep": pct(woke)}


def dledger_run(rate: float, duration: float) -> dict[str, float | None]:
    """`dledger bench --rate` against a fresh 3-member `flush=sync` group: its latency report."""
    from dledger.config import Peer, format_peers
    from dledger.local_cluster import local_cluster
    from dledger.ports import free_port_run

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port_run(3)
        peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", port + k) for k in range(3)})
        with local_cluster(peers, "default", Path(tmp), flush="sync"):
            out = Path(tmp) / "bench.json"
            subprocess.run([sys.executable, "-m", "dledger", "bench", "--peers", peers, "--clients", "16",
                            "--size", "1024", "--batch", "1", "--duration", f"{duration:g}", "--warmup", "2",
                            "--rate", f"{rate:g}", "--json", str(out)], capture_output=True, check=True)
            lat: dict[str, float | None] = json.loads(out.read_text())["latency_ms"]
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="100,1000", help="comma-separated requests/s")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--lookups", default="0,250", help="comma-separated: heap reads per message in each relay process")
    ap.add_argument("--dledger", action="store_true", help="also dledger at each rate, right after the relays")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, p in compute_jitter().items():
        print(f"compute jitter, {name:13s} ms: {p}")
    for rate in (float(r) for r in a.rate.split(",")):
        for lookups in (int(n) for n in a.lookups.split(",")):
            got = relay(rate, a.duration, lookups)
            print(f"relay   {rate:8,.0f}/s  {lookups:5d} reads/message  ms: {got}", flush=True)
        if a.dledger:
            print(f"dledger {rate:8,.0f}/s  {'':18s}  ms: {dledger_run(rate, a.duration)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
