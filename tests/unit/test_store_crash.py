"""Crash and corruption tests of FileLedgerStore recovery.

- damage after the checkpoint's trusted point (torn tails, flipped bytes, lost
  files): reopen keeps a valid prefix that reaches the trusted point;
- damage inside the trusted region: never served as good data (DISK_ERROR); a rotten
  durable record whose extent is certain is kept and reported for repair;
- damaged or lost index files: rebuilt from the data files;
- flush="sync": a real writer process is SIGKILLed; every append it reported
  durable is there after recovery, also after the tail past it is torn.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.entry import HEADER_SIZE, MAGIC_NORMAL, chain_crc
from dledger.store.base import CorruptEntryError, StoreError
from dledger.store.durability import DurabilityWaiter
from dledger.store.file import FileLedgerStore

DATA_FILE_SIZE = 4096
INDEX_FILE_SIZE = 32 * 16
ITERATIONS = 40


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests simulate process crashes: what survives is the page cache, which fsync
    does not change. Skipping fsync keeps them fast on a busy disk; durability itself is
    tested with a real process and real fsyncs below."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


def open_store(path: Path, **kw: Any) -> FileLedgerStore:
    kw.setdefault("retention_check_interval_ms", 3_600_000)
    return FileLedgerStore(
        path, data_file_size=DATA_FILE_SIZE, index_file_size=INDEX_FILE_SIZE, **kw
    )


def body_for(i: int) -> bytes:
    """Deterministic body of entry i (8 to ~400 bytes)."""
    return (f"entry-{i}-".encode() * (1 + (i * 7) % 37))[: 8 + (i * 53) % 400]


@dataclass
class Written:
    """What was appended: term, body and position of every index."""

    terms: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    @property
    def end_index(self) -> int:
        return len(self.bodies) - 1

    def record_end(self, index: int) -> int:
        return self.positions[index] + HEADER_SIZE + len(self.bodies[index])

    def index_at(self, pos: int) -> int | None:
        """The entry whose record holds byte `pos`, if any."""
        for i, p in enumerate(self.positions):
            if p <= pos < self.record_end(i):
                return i
        return None


def append_some(store: FileLedgerStore, w: Written, n: int, rng: random.Random) -> None:
    term = w.terms[-1] if w.terms else 0
    done = 0
    while done < n:
        k = min(n - done, rng.randint(1, 10))
        if rng.random() < 0.2:
            term += 1
        first = len(w.bodies)
        bodies = [body_for(first + j) for j in range(k)]
        r = store.append_as_leader(bodies, term)
        assert r.first_index == first
        w.terms += [term] * k
        w.bodies += bodies
        w.positions += list(r.positions)
        done += k


def read_checkpoint(store_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((store_dir / "checkpoint").read_text())
    return data


def trusted_index(store_dir: Path) -> int:
    t = read_checkpoint(store_dir)["trusted"]
    return -1 if t is None else int(t["index"])


def data_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / "data").iterdir())


def index_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / "index").iterdir())


def patch_file(store_dir: Path, pos: int, new: bytes) -> None:
    """Overwrite bytes at logical data position `pos` (within one file)."""
    path = store_dir / "data" / f"{pos - pos % DATA_FILE_SIZE:020d}"
    with open(path, "r+b") as f:
        f.seek(pos % DATA_FILE_SIZE)
        f.write(new)


def read_at(store_dir: Path, pos: int, n: int) -> bytes:
    path = store_dir / "data" / f"{pos - pos % DATA_FILE_SIZE:020d}"
    with open(path, "rb") as f:
        f.seek(pos % DATA_FILE_SIZE)
        return f.read(n)


def crash_image(store: FileLedgerStore, src: Path, dst: Path) -> None:
    """What a process crash leaves: the files as they are in the page cache now.

    (mmap writes are in the page cache, which survives the process; the copy is
    taken while the store is open and idle, then the store is dropped.)
    """
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.tmp"))
    store.close()


def check_valid_prefix(store: FileLedgerStore, w: Written, at_least: int) -> None:
    """The store holds entries 0..end_index exactly as written, end_index >= at_least,
    and appends continue the chain."""
    assert store.begin_index == 0
    assert at_least <= store.end_index <= w.end_index
    end = store.end_index
    for i in range(end + 1):
        e = store.get(i)
        assert (e.index, e.term, e.body, e.pos) == (i, w.terms[i], w.bodies[i], w.positions[i])
        assert store.term_at(i) == w.terms[i]
    got = []
    i = 0
    while i <= end:
        es = store.read(i, max_entries=500)
        got += [e.body for e in es]
        i += len(es)
    assert got == w.bodies[: end + 1]
    if end >= 0:
        last = store.get(end)
        assert (store.end_term, store.end_chain_crc) == (last.term, last.chain_crc)
        assert store.pos_of_next() == w.record_end(end)
    # the log goes on from the recovered end
    term = max(store.end_term, 0)
    r = store.append_as_leader([b"after recovery"], term)
    assert r.first_index == end + 1
    e = store.get(end + 1)
    prev = store.get(end).chain_crc if end >= 0 else 0
    assert e.chain_crc == chain_crc(end + 1, term, zlib.crc32(b"after recovery"), prev)


# --- damage after the trusted point ------------------------------------------------------

DAMAGES_AFTER = [
    "truncate last data file",
    "truncate last index file",
    "truncate both",
    "flip byte",
    "zero range",
    "garbage range",
    "drop later data files",
    "delete index files",
]


def _build(
    tmp_path: Path, it: int, rng: random.Random, crash: bool
) -> tuple[Path, Written]:
    """A store with several data files and a checkpoint somewhere in the middle, then
    closed cleanly (everything trusted) or crashed (the tail after the checkpoint is
    not). Returns the directory to recover and what was written."""
    d = tmp_path / f"s{it}"
    store = open_store(d, checkpoint_interval_ms=3_600_000)
    w = Written()
    append_some(store, w, rng.randint(20, 120), rng)
    store.flush()
    store.write_checkpoint()
    append_some(store, w, rng.randint(1, 80), rng)
    if not crash:
        store.close()
        return d, w
    img = tmp_path / f"c{it}"
    crash_image(store, d, img)
    return img, w


@pytest.mark.usefixtures("no_fsync")
def test_damage_after_trusted_point_keeps_a_valid_prefix(tmp_path: Path) -> None:
    for it in range(len(DAMAGES_AFTER) * 8):
        rng = random.Random(7000 + it)
        crash = it % 4 != 0
        d, w = _build(tmp_path, it, rng, crash)
        t = trusted_index(d)
        assert t == w.end_index if not crash else 0 <= t < w.end_index
        t_end = w.record_end(t)
        # damage goes into the records after the trusted one or, when there are none,
        # into the zeros after the end of the log (which must not be taken for records)
        write_end = w.record_end(w.end_index)
        if write_end <= t_end:
            write_end = t_end - t_end % DATA_FILE_SIZE + DATA_FILE_SIZE
        damage = DAMAGES_AFTER[it % len(DAMAGES_AFTER)]
        expect_end: int | None = None  # exact end when the damage surely cuts there
        if damage.startswith("truncate"):
            if damage != "truncate last index file":
                # (a shorter file reads as zeros up to its size when reopened)
                last = data_files(d)[-1]
                start = int(last.name)
                lo = max(t_end - start, 0)
                cut = rng.randint(lo, DATA_FILE_SIZE) if lo < DATA_FILE_SIZE else DATA_FILE_SIZE
                os.truncate(last, cut)
            else:
                expect_end = w.end_index
            if damage != "truncate last data file":
                last = index_files(d)[-1]
                os.truncate(last, rng.randint(0, INDEX_FILE_SIZE))
        elif damage in ("flip byte", "zero range", "garbage range"):
            pos = rng.randrange(t_end, write_end)
            k = w.index_at(pos)
            if k is None and pos >= w.record_end(w.end_index):
                expect_end = w.end_index
            if damage == "flip byte":
                old = read_at(d, pos, 1)[0]
                j = pos - w.positions[k] if k is not None else -1
                xor = rng.randint(1, 255)
                if j == 3 and (old ^ xor) in (1, 2, 3):
                    xor = 0x80  # keep the magic invalid (magics differ in low bits only)
                patch_file(d, pos, bytes([old ^ xor]))
                if k is not None:
                    expect_end = k - 1
            else:
                n = min(rng.randint(1, 300), DATA_FILE_SIZE - pos % DATA_FILE_SIZE)
                fill = bytes(n) if damage == "zero range" else rng.randbytes(n)
                patch_file(d, pos, fill)
        elif damage == "drop later data files":
            t_file = w.positions[t] - w.positions[t] % DATA_FILE_SIZE
            for p in data_files(d):
                if int(p.name) > t_file and rng.random() < 0.7:
                    # only a suffix may go missing
                    for q in data_files(d):
                        if int(q.name) >= int(p.name):
                            q.unlink()
                    break
        else:
            for p in index_files(d):
                p.unlink()
            expect_end = w.end_index
        store = open_store(d)
        try:
            if expect_end is not None:
                assert store.end_index == expect_end, (it, damage)
            check_valid_prefix(store, w, at_least=t)
            end = store.end_index
        finally:
            store.close()
        # the cut is final: a second recovery finds the same log
        store = open_store(d)
        try:
            assert store.end_index == end  # including the append after the first recovery
            assert store.get(end).body == b"after recovery"
        finally:
            store.close()


@pytest.mark.usefixtures("no_fsync")
def test_tail_records_flipped_one_by_one(tmp_path: Path) -> None:
    """A flip in every field of the first record after the trusted point cuts exactly there,
    and the recovered chain is that of the record before (not of the damaged one)."""
    base = tmp_path / "base"
    store = open_store(tmp_path / "live", checkpoint_interval_ms=3_600_000)
    w = Written()
    rng = random.Random(3)
    append_some(store, w, 30, rng)
    store.flush()
    store.write_checkpoint()
    append_some(store, w, 10, rng)
    crash_image(store, tmp_path / "live", base)
    t = trusted_index(base)
    assert t < w.end_index
    k = t + 1
    size = HEADER_SIZE + len(w.bodies[k])
    # a byte of every header field but the magic (size, index, term, pos, channel, chain,
    # body crc, body size), and of the body
    for j in [4, 7, 8, 15, 16, 23, 24, 31, 32, 35, 36, 39, 40, 43, 44, 47, 48, size - 1]:
        d = tmp_path / f"flip{j}"
        shutil.copytree(base, d)
        old = read_at(d, w.positions[k] + j, 1)[0]
        patch_file(d, w.positions[k] + j, bytes([old ^ 0x10]))
        s = open_store(d)
        try:
            assert s.end_index == t, j
            check_valid_prefix(s, w, at_least=t)
        finally:
            s.close()


# --- damage inside the trusted region --------------------------------------------------------


def _magic_flip_stays_valid(j: int, old: int, xor: int) -> bool:
    return j == 3 and (old ^ xor) in (1, 2, 3)


@pytest.mark.usefixtures("no_fsync")
def test_damage_in_trusted_region_is_never_served(tmp_path: Path) -> None:
    refused_at_open = served_error = 0
    for it in range(ITERATIONS):
        rng = random.Random(9100 + it)
        d = tmp_path / f"t{it}"
        store = open_store(d)
        w = Written()
        append_some(store, w, rng.randint(10, 120), rng)
        store.close()  # clean close: everything is trusted
        t = trusted_index(d)
        assert t == w.end_index
        k = rng.randint(0, t)
        size = HEADER_SIZE + len(w.bodies[k])
        j = rng.randrange(size)
        pos = w.positions[k] + j
        old = read_at(d, pos, 1)[0]
        xor = rng.randint(1, 255)
        if _magic_flip_stays_valid(j, old, xor):
            # NORMAL/NOOP/CONFIG_CHANGE differ in their low bits and no CRC covers the
            # magic (docs/format.md): such a flip is undetectable by the format
            xor = 0x80
        patch_file(d, pos, bytes([old ^ xor]))
        try:
            store = open_store(d)
        except StoreError as e:
            assert e.code == ResponseCode.DISK_ERROR
            refused_at_open += 1
            continue
        try:
            assert store.end_index >= t
            for i in range(store.end_index + 1):
                try:
                    assert store.term_at(i) == w.terms[i], f"wrong term of {i} (damage {k}/{j})"
                except StoreError as err:
                    assert err.code == ResponseCode.DISK_ERROR
                try:
                    got = store.get(i)
                except StoreError as err:
                    assert err.code == ResponseCode.DISK_ERROR
                    served_error += 1
                    continue
                assert i != k or 32 <= j < 36, f"damaged entry {k} (byte {j}) was served"
                assert (got.index, got.term, got.magic, got.body, got.pos) == (
                    i, w.terms[i], MAGIC_NORMAL, w.bodies[i], w.positions[i],
                )
                assert got.chain_crc == w_chain(w, i)
            # a bulk read either fails or returns only good entries
            try:
                es = store.read(0, max_entries=1000)
            except DLedgerError as err:
                assert err.code == ResponseCode.DISK_ERROR
            else:
                for r in es:
                    assert r.index != k or 32 <= j < 36, f"damaged entry {k} (byte {j}) was read"
                    assert (r.term, r.body, r.pos, r.chain_crc) == (
                        w.terms[r.index], w.bodies[r.index], w.positions[r.index],
                        w_chain(w, r.index),
                    )
        finally:
            store.close()
    assert refused_at_open + served_error > 0


def w_chain(w: Written, i: int) -> int:
    chain = 0
    for k in range(i + 1):
        chain = chain_crc(k, w.terms[k], zlib.crc32(w.bodies[k]), chain)
    return chain


def _reopened_with_rot(d: Path, w: Written, k: int, header: bool, good: bytes, on_open: bool = True) -> None:
    """Open `d` whose record k rotted: it opens, reports k, never serves it, serves the rest,
    refuses to truncate after it, takes appends that chain on, and takes the leader's copy
    (`good`) back; it opens again after all that. After a rotten header the next record's
    chain link cannot be checked: k is named then. `on_open`: recovery itself reports k (the
    trusted record); rot below it is not read on open, the first verification (the scrub's)
    reports it."""
    store = open_store(d)
    try:
        if on_open:
            assert store.recovered_corrupt is not None and store.recovered_corrupt[0] == k
        else:
            assert store.recovered_corrupt is None
            assert store.verify(k) is not None
        assert store.end_index == w.end_index
        if k < w.end_index:  # the new end's chain CRC would come from the rotten header
            with pytest.raises(CorruptEntryError):
                store.truncate(k + 1)
        store.append_as_leader([b"after"], term=w.terms[-1])
        w.terms.append(w.terms[-1])
        w.bodies.append(b"after")
        for i in range(w.end_index + 1):
            if i == k or (header and i == k + 1):
                with pytest.raises(CorruptEntryError) as ei:
                    store.get(i)
                assert ei.value.index == k
            else:
                got = store.get(i)
                assert (got.body, got.chain_crc) == (w.bodies[i], w_chain(w, i))
        store.repair(k, good)
        assert store.verify(k) is None and store.get(k + 1).body == w.bodies[k + 1]
    finally:
        store.close()
    store = open_store(d)
    try:
        assert store.recovered_corrupt is None
        assert [store.get(i).body for i in range(w.end_index + 1)] == w.bodies
    finally:
        store.close()


@pytest.mark.usefixtures("no_fsync")
def test_rotten_durable_record_is_kept_and_reported(tmp_path: Path) -> None:
    """A durable record that rotted no longer bricks the member (it refused to open, for good):
    recovery keeps it when its extent is certain and reports it for repair."""
    for case in ("body", "header", "size", "before-trusted"):
        d = tmp_path / case
        store = open_store(d)
        w = Written()
        append_some(store, w, 50, random.Random(1))
        store.close()
        t = trusted_index(d)
        k = t - 1 if case == "before-trusted" else t
        if case == "before-trusted":
            assert w.positions[k] // DATA_FILE_SIZE == w.positions[t] // DATA_FILE_SIZE
        good = read_at(d, w.positions[k], HEADER_SIZE + len(w.bodies[k]))
        if case == "body":
            patch_file(d, w.positions[k] + HEADER_SIZE, b"\x00\xff")
        elif case == "size":  # no CRC covers it: it was written into the unit (and repair refused)
            patch_file(d, w.positions[k] + 6, b"\x10")
        else:  # the index field of the header: only the index unit as written knows the extent
            patch_file(d, w.positions[k] + 8, b"\x7f")
        _reopened_with_rot(d, w, k, header=case != "body", good=good, on_open=case != "before-trusted")
    # header and index unit both gone: the extent is unknown, refused
    d = tmp_path / "both"
    store = open_store(d)
    w = Written()
    append_some(store, w, 50, random.Random(1))
    store.close()
    t = trusted_index(d)
    patch_file(d, w.positions[t], b"\x00" * 8)
    for f in index_files(d):
        f.write_bytes(b"\x00" * f.stat().st_size)
    with pytest.raises(StoreError) as e:
        open_store(d)
    assert e.value.code == ResponseCode.DISK_ERROR
    # a lost data file below the trusted point: refused as well
    d2 = tmp_path / "s2"
    store = open_store(d2)
    append_some(store, Written(), 80, random.Random(1))
    store.close()
    files = data_files(d2)
    assert len(files) >= 3
    files[-1].unlink()
    with pytest.raises(StoreError) as ei:
        open_store(d2)
    assert ei.value.code == ResponseCode.DISK_ERROR


# --- index files ---------------------------------------------------------------------------

INDEX_DAMAGES = [
    "delete all",
    "delete last",
    "truncate one",
    "zero range",
    "garbage range",
    "flip bytes",
]


@pytest.mark.usefixtures("no_fsync")
def test_damaged_index_files_are_rebuilt_from_data(tmp_path: Path) -> None:
    for it in range(ITERATIONS):
        rng = random.Random(4400 + it)
        d = tmp_path / f"i{it}"
        store = open_store(d)
        w = Written()
        append_some(store, w, rng.randint(30, 150), rng)
        if rng.random() < 0.5:
            store.close()
        else:
            img = tmp_path / f"ic{it}"
            crash_image(store, d, img)
            d = img
        damage = INDEX_DAMAGES[it % len(INDEX_DAMAGES)]
        files = index_files(d)
        if damage == "delete all":
            for p in files:
                p.unlink()
        elif damage == "delete last":
            files[-1].unlink()
        elif damage == "truncate one":
            os.truncate(rng.choice(files), rng.randrange(INDEX_FILE_SIZE))
        else:
            p = rng.choice(files)
            raw = bytearray(p.read_bytes())
            if damage == "flip bytes":
                for _ in range(rng.randint(1, 5)):
                    raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
            else:
                a = rng.randrange(len(raw))
                b = min(len(raw), a + rng.randint(1, 200))
                raw[a:b] = bytes(b - a) if damage == "zero range" else rng.randbytes(b - a)
            p.write_bytes(bytes(raw))
        store = open_store(d)
        try:
            assert store.end_index == w.end_index, (it, damage)
            for i in range(w.end_index + 1):
                assert store.term_at(i) == w.terms[i], (it, damage, i)
            check_valid_prefix(store, w, at_least=w.end_index)
            for term in sorted(set(w.terms)):
                assert store.first_index_of_term(term) == w.terms.index(term)
        finally:
            store.close()


# --- flush="sync": durability -------------------------------------------------------------------


def test_sync_mode_reports_durability_in_order(tmp_path: Path) -> None:
    d = tmp_path / "s"
    store = open_store(d, flush="sync")
    seen: list[int] = []
    store.add_flush_listener(seen.append)
    durable_when_released: dict[int, int] = {}

    async def writer(n: int, waiter: DurabilityWaiter) -> None:
        for _ in range(n):
            i = store.end_index + 1
            r = store.append_as_leader([body_for(i)], 1)
            await waiter.wait(r.first_index)
            durable_when_released[r.first_index] = store.durable_index

    async def main() -> None:
        waiter = DurabilityWaiter(store)
        await asyncio.wait_for(asyncio.gather(*(writer(40, waiter) for _ in range(5))), 60)

    try:
        asyncio.run(main())
        assert sorted(durable_when_released) == list(range(200))
        for i, durable in durable_when_released.items():
            assert durable >= i
        assert seen == sorted(seen)
        assert seen[-1] == 199
        # durable data is in the files: read them back through a second, fresh store
        shutil.copytree(d, tmp_path / "copy", ignore=shutil.ignore_patterns("*.tmp"))
    finally:
        store.close()
    again = open_store(tmp_path / "copy")
    try:
        assert again.end_index == 199
        assert [again.get(i).body for i in range(200)] == [body_for(i) for i in range(200)]
    finally:
        again.close()


WRITER = textwrap.dedent(
    """
    import asyncio
    import sys

    from dledger.store.durability import DurabilityWaiter
    from dledger.store.file import FileLedgerStore

    def body_for(i):
        return (f"entry-{i}-".encode() * (1 + (i * 7) % 37))[: 8 + (i * 53) % 400]

    async def main(path):
        store = FileLedgerStore(
            path, flush="sync", data_file_size=4096, index_file_size=512,
            checkpoint_interval_ms=20, retention_check_interval_ms=3_600_000,
        )
        waiter = DurabilityWaiter(store)

        async def worker():
            while True:
                i = store.end_index + 1
                r = store.append_as_leader([body_for(i)], i // 50)
                await waiter.wait(r.first_index)
                sys.stdout.write(f"{r.first_index} {r.positions[0]}\\n")
                sys.stdout.flush()

        await asyncio.gather(*(worker() for _ in range(4)))

    asyncio.run(main(sys.argv[1]))
    """
)


def _run_writer_and_kill(tmp_path: Path, store_dir: Path, want: int) -> dict[int, int]:
    """Start a sync-mode writer process, SIGKILL it once `want` appends were reported
    durable; returns {index: pos} of every append it reported."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    err_path = tmp_path / "writer.stderr"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(store_dir)],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    reported: dict[int, int] = {}
    deadline = time.monotonic() + 120
    try:
        while len(reported) < want:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            i, pos = map(int, line.split())
            reported[i] = pos
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        reader.join(timeout=60)
    # lines already in the pipe were reported before the kill
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            break
        if line is None:
            continue
        parts = line.split()
        if len(parts) == 2:
            reported[int(parts[0])] = int(parts[1])
    assert proc.stdout is not None
    proc.stdout.close()
    err = err_path.read_text()
    assert len(reported) >= want, f"writer reported {len(reported)} appends; stderr:\n{err}"
    assert proc.returncode == -signal.SIGKILL
    return reported


def _check_reported(store: FileLedgerStore, reported: dict[int, int]) -> None:
    assert store.end_index >= max(reported)
    for i, pos in sorted(reported.items()):
        e = store.get(i)
        assert (e.index, e.term, e.pos, e.body) == (i, i // 50, pos, body_for(i)), i
    # and everything up to the end is a valid log
    for i in range(store.end_index + 1):
        e = store.get(i)
        assert (e.term, e.body) == (i // 50, body_for(i))


@pytest.mark.parametrize("torn", [False, True])
def test_sigkill_keeps_every_durable_append(tmp_path: Path, torn: bool) -> None:
    d = tmp_path / "store"
    reported = _run_writer_and_kill(tmp_path, d, 300)
    last = max(reported)
    if torn:
        # Tear the tail after the last durable record (and after the checkpoint's trusted
        # record, which may be newer than the last line the writer got to print).
        rng = random.Random(last)
        t = read_checkpoint(d)["trusted"]
        ends = [reported[last] + HEADER_SIZE + len(body_for(last))]
        if t is not None:
            ends.append(int(t["pos"]) + HEADER_SIZE + len(body_for(int(t["index"]))))
        safe = max(ends)
        file_end = safe - safe % DATA_FILE_SIZE + DATA_FILE_SIZE
        cut = rng.randint(safe, file_end - 1)
        n = rng.randint(1, file_end - cut)
        fill = bytes(n) if rng.random() < 0.5 else rng.randbytes(n)
        patch_file(d, cut, fill)
        for p in data_files(d):
            if int(p.name) >= file_end and rng.random() < 0.5:
                # a later file lost, or torn at its start
                p.write_bytes(rng.randbytes(100) + bytes(DATA_FILE_SIZE - 100))
    store = open_store(d)
    try:
        _check_reported(store, reported)
        end = store.end_index
    finally:
        store.close()
    store = open_store(d)
    try:
        assert store.end_index == end
        _check_reported(store, reported)
    finally:
        store.close()


@pytest.mark.usefixtures("no_fsync")
def test_check_magics_rebuilds_a_damaged_unit_instead_of_blaming_the_record(tmp_path: Path) -> None:
    """Review: the leader's magic check read units as written and called a healthy record
    corrupt when its unit was damaged (units are a cache, rebuilt on use), deposing itself."""
    d = tmp_path / "s"
    store = open_store(d)
    w = Written()
    append_some(store, w, 20, random.Random(3))
    with (d / "index" / f"{0:020d}").open("r+b") as f:  # under the running store (its mapping sees it)
        f.seek(5 * 32 + 20)
        f.write(b"\xff\xff\xff\xff")  # unit 5's index field
    try:
        raw = store.read_raw(0, 1 << 20)
        try:
            assert raw.first_index == 0 and raw.count > 5
            store.check_magics(raw)  # no CorruptEntryError: the record is fine
        finally:
            raw.data.release()
        assert store.verify(5) is None
    finally:
        store.close()


@pytest.mark.usefixtures("no_fsync")
@pytest.mark.parametrize("damage", ["record", "unit", "unit magic"])
def test_check_magics_names_a_flipped_record_magic_and_passes_a_rebuilt_unit(damage: str, tmp_path: Path) -> None:
    """The file store reads the index's magics in one pass and checks unit by unit only on a
    mismatch: a record whose magic flipped (NORMAL -> CONFIG_CHANGE, no CRC covers it) is still
    named, and a unit whose magic is garbage is rebuilt from the healthy record instead."""
    d = tmp_path / "s"
    store = open_store(d)
    w = Written()
    append_some(store, w, 20, random.Random(4))
    pos = store.get(7).pos
    if damage == "record":
        where, at, value = d / "data" / f"{0:020d}", pos, (3).to_bytes(4, "big")  # CONFIG_CHANGE
    elif damage == "unit":
        where, at, value = d / "index" / f"{0:020d}", 7 * 32 + 4, (pos + 1).to_bytes(8, "big")  # its pos
    else:
        where, at, value = d / "index" / f"{0:020d}", 7 * 32, b"\x7f\x00\x00\x09"  # no magic at all
    with where.open("r+b") as f:  # under the running store (its mapping sees it)
        f.seek(at)
        f.write(value)
    try:
        raw = store.read_raw(0, 1 << 20)
        try:
            assert raw.first_index == 0 and raw.count == store.end_index + 1
            if damage == "record":
                with pytest.raises(CorruptEntryError, match="record of entry 7 says magic 3; the index 1"):
                    store.check_magics(raw)
            else:
                store.check_magics(raw)
        finally:
            raw.data.release()
    finally:
        store.close()


class _Crash(BaseException):
    """The process dies here (nothing after it runs)."""


@pytest.mark.parametrize("where", ["checkpoint", "drop"])
def test_a_crash_inside_reset_leaves_a_store_that_opens(where: str, tmp_path: Path, no_fsync: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: reset deleted the files before writing the checkpoint naming the new log; a
    crash in between left a checkpoint naming a deleted record, and the store refused to open
    (DISK_ERROR) until wiped by hand. Now the checkpoint comes first: a crash before it keeps
    the old log, one after it opens the new, empty one."""
    import dledger.store.file as file_module

    s = open_store(tmp_path)
    for k in range(60):
        s.append_as_leader([body_for(k)], 1)
    s.set_committed(59)
    s.flush()
    s.write_checkpoint()
    if where == "checkpoint":
        monkeypatch.setattr(file_module, "write_atomic", lambda *a, **kw: (_ for _ in ()).throw(_Crash()))
    else:
        monkeypatch.setattr(s.data, "drop_all", lambda: (_ for _ in ()).throw(_Crash()))
    with pytest.raises(_Crash):
        s.reset(200, 3, 0x1234, 50 * DATA_FILE_SIZE + 100)
    monkeypatch.undo()
    s._flusher.stop()  # the dead process's threads and lock go with it
    s._dir_lock.release()
    again = open_store(tmp_path)
    try:
        if where == "checkpoint":
            assert (again.begin_index, again.end_index) == (0, 59)
            assert again.get(59).body == body_for(59)
        else:
            assert (again.begin_index, again.end_index, again.end_term) == (200, 199, 3)
            assert again.pos_of_next() == 50 * DATA_FILE_SIZE + 100
            again.append_as_leader([b"after"], 3)
            assert again.get(200).body == b"after"
    finally:
        again.close()
