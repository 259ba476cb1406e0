"""How fast a wiped follower catches up from the leader's snapshot (InstallSnapshot, issue 12).

Goal: a follower 1 GiB behind the leader's compacted log catches up at 100 MB/s or more.

`python benchmarks/install_snapshot.py [--size-mib 1024] [--members 3] [--chunk-mib N] [--json]`:
a local file-store group runs `dledger.bench.blob_machine:BlobMachine` (tiny entries, a
snapshot of --size-mib MiB) with no automatic snapshots and no margin; small data files
(64 KiB) and a 200 ms retention check, so the log before a snapshot is deleted soon after.

1. propose b"grow:<n>" entries up to the size, then append plain entries over several data files;
2. kill a follower and delete its store directory (it comes back empty);
3. snapshot the remaining members, append a little more, wait until the leader's log begin
   is past 0 (the wiped follower cannot get entry 0 any more: it must install the snapshot);
4. restart it and poll its METADATA every 20 ms until applied_index >= the snapshot index.

Reported: startup (restart -> first METADATA answer: process start, not the install),
install = first answer -> applied (the headline, MB/s = snapshot bytes / install, 1 MB =
10^6 bytes), split into wait (-> first install progress seen: heartbeat, reconnect), stream
(the rate between the first and last partial progress samples) and tail (the last partial
sample -> applied: the last chunks, verification, rename, restore). Member processes inherit
this process's environment (PYTHONPATH included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from dledger.codes import DLedgerError
from dledger.config import Peer, format_peers, parse_peers
from dledger.local_cluster import local_cluster
from dledger.ports import free_ports
from dledger.runtime.client import AsyncDLedgerClient, Metadata

MiB = 1 << 20
GROUP = "default"
MACHINE = "dledger.bench.blob_machine:BlobMachine"
POLL_S = 0.020
PLAIN_BODY = b"p" * 1024


def config_toml(chunk_mib: float | None) -> str:
    lines = ["data_file_size = 65536", "retention_check_interval_ms = 200"]
    if chunk_mib:
        lines.append(f"install_chunk_bytes = {int(chunk_mib * MiB)}")
    return "\n".join(lines) + "\n"


async def fill(c: AsyncDLedgerClient, size: int, entry_bytes: int, plain: int) -> None:
    """The state up to `size` bytes, then `plain` 1 KiB entries (many 64 KiB data files)."""
    left = size
    while left > 0:
        n = min(left, entry_bytes)
        await c.propose(b"grow:%d" % n)
        left -= n
    for k in range(0, plain, 100):
        await c.append_batch([PLAIN_BODY] * min(100, plain - k))


async def wait_compacted(c: AsyncDLedgerClient, leader: str, timeout: float) -> int:
    """Append a little until the leader's log begin is past 0; that begin."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await c.append_batch([PLAIN_BODY] * 20)
        md = await c.metadata(leader)
        if md.ledger_begin_index > 0:
            return md.ledger_begin_index
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the leader's log begin stayed at 0 for {timeout:.0f} s after the snapshot")


async def probe(peers: str, member: str) -> Metadata | None:
    """`member`'s METADATA from a fresh client (a long-lived one backs off after failed connects,
    up to 2 s: that would blur when the restarted member first answers)."""
    try:
        async with AsyncDLedgerClient(peers, GROUP, timeout=1.0, request_timeout=0.5) as p:
            return await p.metadata(member)
    except (DLedgerError, OSError):
        return None


Sample = tuple[float, int, int]  # (perf_counter, install_bytes, install_total) while installing


async def watch(lc: local_cluster, peers: str, member: str, index: int,
                deadline: float) -> tuple[float, float, list[Sample]]:
    """Poll `member` every POLL_S until its state machine applied `index`: (when it first answered,
    when it had applied, its install progress samples)."""
    first_answer: float | None = None
    samples: list[Sample] = []
    poller: AsyncDLedgerClient | None = None
    try:
        while True:
            if lc.procs[member].poll() is not None:
                raise RuntimeError(f"{member} exited with code {lc.procs[member].returncode}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{member} did not apply index {index} in time (last progress {samples[-1:]})")
            tick = time.perf_counter()
            md: Metadata | None = None
            if poller is None:
                md = await probe(peers, member)
            else:
                with contextlib.suppress(DLedgerError):
                    md = await poller.metadata(member)
            now = time.perf_counter()
            if md is not None:
                if first_answer is None:
                    first_answer = now
                    poller = AsyncDLedgerClient(peers, GROUP, timeout=5.0)  # it answers now: no backoff
                if md.state_machine_error:
                    raise RuntimeError(f"{member}: state machine stopped: {md.state_machine_error}")
                if md.install_index >= 0:
                    samples.append((now, md.install_bytes, md.install_total))
                if md.applied_index >= index:
                    return first_answer, now, samples
            await asyncio.sleep(max(0.0, tick + POLL_S - time.perf_counter()))
    finally:
        if poller is not None:
            await poller.close()


async def run(lc: local_cluster, peers: str, data_dir: Path, size: int, entry_bytes: int, plain: int,
              timeout: float) -> dict[str, Any]:
    members = list(parse_peers(peers))
    out: dict[str, Any] = {"size_bytes": size, "members": len(members)}
    async with AsyncDLedgerClient(peers, GROUP, timeout=60) as c:
        t = time.perf_counter()
        await fill(c, size, entry_bytes, plain)
        out["fill_s"] = time.perf_counter() - t
        leader = (await c.metadata()).leader_id
        assert leader is not None
        victim = next(m for m in members if m != leader)
        out["leader"], out["follower"] = leader, victim

        proc = lc.procs[victim]
        proc.kill()
        proc.wait()
        shutil.rmtree(data_dir / GROUP / victim)

        snap_index, out["snapshot_take_s"] = -1, {}
        for m in members:
            if m == victim:
                continue
            t = time.perf_counter()
            idx = await c.snapshot(m)
            out["snapshot_take_s"][m] = round(time.perf_counter() - t, 3)
            if m == leader:
                snap_index = idx
        out["snapshot_index"] = snap_index
        t = time.perf_counter()
        out["leader_begin"] = await wait_compacted(c, leader, 60.0)
        out["compaction_wait_s"] = time.perf_counter() - t

        t0 = time.perf_counter()
        lc.start_member(victim)
        first_answer, done, samples = await watch(lc, peers, victim, snap_index, t0 + timeout)
        state = await c.query(b"size", member=victim)
        if int(state) < size:
            raise RuntimeError(f"{victim} restored a state of {int(state)} bytes, expected at least {size}")

    snap_bytes = max((s[2] for s in samples), default=size + len(str(size)))
    install = done - first_answer
    out.update(snapshot_bytes=snap_bytes, startup_s=first_answer - t0, install_s=install,
               total_s=done - t0, mb_per_s=snap_bytes / install / 1e6, progress_samples=len(samples))
    if samples:
        out["wait_s"] = samples[0][0] - first_answer
        first = [samples[0]]  # the first install's samples: install_bytes only grows until it restarts
        for s in samples[1:]:
            if s[1] < first[-1][1]:
                break
            first.append(s)
        out["restarts_seen"] = sum(1 for a, b in itertools.pairwise(samples) if b[1] < a[1])
        partial = [s for s in first if 0 < s[1] < s[2]]
        if len(partial) >= 2 and partial[-1][0] > partial[0][0]:
            (ta, ba, _), (tb, bb, _) = partial[0], partial[-1]
            out["stream_mb_per_s"] = (bb - ba) / (tb - ta) / 1e6
            out["tail_s"] = done - tb  # the last chunk(s), verification, fsync, rename, restore
            out["tail_bytes"] = snap_bytes - bb
    return out


def summary(r: dict[str, Any]) -> str:
    line = (f"install_snapshot: {r['snapshot_bytes'] / MiB:.0f} MiB to {r['follower']} in {r['install_s']:.2f} s "
            f"= {r['mb_per_s']:.1f} MB/s (startup {r['startup_s']:.2f} s excluded")
    if "wait_s" in r:
        line += f"; wait {r['wait_s']:.2f} s"
    if "stream_mb_per_s" in r:
        line += f", stream {r['stream_mb_per_s']:.1f} MB/s, tail {r['tail_s']:.2f} s"
    if r.get("restarts_seen"):
        line += f"; install restarted {r['restarts_seen']}x"
    return line + f"; chunk {r['chunk']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--size-mib", type=int, default=1024, help="snapshot size (state machine bytes)")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--chunk-mib", type=float, default=None,
                    help="install_chunk_bytes in MiB [the member default]")
    ap.add_argument("--entry-mib", type=int, default=64, help="bytes each grow entry adds, MiB")
    ap.add_argument("--plain-entries", type=int, default=400, help="1 KiB entries appended before the snapshot")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds the restarted follower gets")
    ap.add_argument("--dir", default=None, help="parent of the temporary data directory [system temp]")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object too")
    args = ap.parse_args()
    if args.members < 2:
        ap.error("--members must be at least 2 (a leader and the follower to wipe)")
    ports = free_ports(args.members)
    peers = format_peers({f"n{k}": Peer(f"n{k}", "127.0.0.1", p) for k, p in enumerate(ports)})
    with tempfile.TemporaryDirectory(prefix="dledger-install-", dir=args.dir) as d:
        conf = Path(d) / "member.toml"
        conf.write_text(config_toml(args.chunk_mib))
        extra = ["--config", str(conf), "--state-machine", MACHINE, "--snapshot-threshold-entries", "0",
                 "--snapshot-threshold-bytes", "0", "--snapshot-margin-entries", "0"]
        lc = local_cluster(peers, GROUP, Path(d) / "data", extra=extra)
        with lc:
            r = asyncio.run(run(lc, peers, Path(d) / "data", args.size_mib * MiB, args.entry_mib * MiB,
                                args.plain_entries, args.timeout))
    r["chunk"] = f"{args.chunk_mib:g} MiB" if args.chunk_mib else "default"
    print(summary(r))
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))


if __name__ == "__main__":
    main()
