"""Which state machine a group runs, from its config (`state_machine`), and where it lives:
the worker thread that applies, queries, snapshots and installs it, one action at a time in
order; and the snapshot files a leader streams to a follower (read on another thread: a chunk
never waits behind applies)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import shutil
import tempfile
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from dledger.codes import DLedgerError, ResponseCode
from dledger.config import DLedgerConfig
from dledger.membership import Membership
from dledger.ratelog import RateLimitedLog
from dledger.statemachine.api import DirectoryReader, NullStateMachine, StateMachine
from dledger.statemachine.install import InstallSink, SnapshotSource
from dledger.statemachine.snapshot import SnapshotError, SnapshotMeta, SnapshotStore, read_meta, read_producers

log = logging.getLogger(__name__)

T = TypeVar("T")


def load_state_machine(spec: str) -> StateMachine | None:
    """"" -> None (a plain log); "kv" -> the reference KV store; "pkg.mod:factory" -> factory()."""
    if not spec:
        return None
    module, _, attr = ("dledger.kv.machine:KVStateMachine" if spec == "kv" else spec).partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
        sm = factory()
    except (ImportError, AttributeError) as e:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"state_machine {spec!r}: {e}") from e
    if not isinstance(sm, StateMachine):
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"state_machine {spec!r} made a {type(sm).__name__}, not a dledger.StateMachine")
    return sm


class StateMachineHost:
    """A group's state machine (or none), its snapshots and its worker thread."""

    def __init__(self, cfg: DLedgerConfig, sm: StateMachine | None) -> None:
        self.sm = sm
        self._tmp: str | None = None
        if cfg.store_type == "file":
            snap_dir = Path(cfg.store_dir)
        else:  # a memory store keeps its snapshots for the process's life only
            self._tmp = tempfile.mkdtemp(prefix=f"dledger-snap-{cfg.group}-{cfg.self_id}-")
            snap_dir = Path(self._tmp)
        self.snapshots = SnapshotStore(snap_dir)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"sm-{cfg.group}-{cfg.self_id}")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix=f"snap-{cfg.group}-{cfg.self_id}")
        self._sink: InstallSink | None = None  # a snapshot being received (worker thread only)
        # a leader's INSTALL_SNAPSHOT (without TLS, anyone's) can end in a restore per request
        self._restores = RateLimitedLog(log)

    def restore(self) -> tuple[SnapshotMeta, bytes | None] | None:
        """Load the newest valid snapshot into the state machine (the empty state without one);
        its meta and producer table, or None."""
        found = self.snapshots.newest()
        if self.sm is not None:
            self.sm.restore(found[1] if found is not None else None)
        if found is None:
            return None
        meta = found[0]
        log.info("restored snapshot through index %d (term %d) from %s", meta.last_index, meta.last_term,
                 self.snapshots.dir)
        return meta, read_producers(self.snapshots.dir / f"{meta.last_index:020d}", meta)

    def submit(self, fn: Callable[..., T], *args: Any, done: Callable[[Future[T]], None]) -> None:
        """Run fn(*args) on the worker; `done(future)` then runs on the event loop."""
        _submit(self._worker, fn, args, done)

    def submit_read(self, fn: Callable[..., T], *args: Any, done: Callable[[Future[T]], None]) -> None:
        """As `submit`, on the snapshot reader's thread."""
        _submit(self._reader, fn, args, done)

    def read_chunk(self, meta: SnapshotMeta, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Bytes of snapshot `meta`'s stream from `offset`, and their CRC32 (reader thread)."""
        data = SnapshotSource(self.snapshots.dir / f"{meta.last_index:020d}", meta).read(offset, max_bytes)
        return data, zlib.crc32(data)

    def install_chunk(self, meta: SnapshotMeta, offset: int, data: bytes | memoryview, crc: int) -> tuple[int, bool]:
        """Write a chunk of a snapshot from the leader (worker thread): the next offset wanted,
        and whether the snapshot is now whole and in place. A new meta starts over."""
        sink = self._sink
        if sink is None or sink.meta != meta:
            if sink is not None:
                sink.abort()
            sink = self._sink = InstallSink(self.snapshots, meta)
        try:
            nxt = sink.write(offset, data, crc)
            if not sink.done:
                return nxt, False
            self._sink = None
            sink.finish()
        except BaseException:
            self._sink = None
            sink.abort()
            raise
        return nxt, True

    def drop_install(self) -> None:
        """Delete a partial snapshot copy no longer needed (worker thread)."""
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.abort()

    def restore_installed(self, meta: SnapshotMeta) -> bytes | None:
        """Replace the state with installed snapshot `meta` (worker thread; its files were
        checked as it was installed, just before this on the same thread); its producer table."""
        directory = self.snapshots.dir / f"{meta.last_index:020d}"
        if read_meta(directory) != meta:
            raise SnapshotError(f"snapshot {meta.last_index} was replaced before it was restored")
        if self.sm is not None:
            self.sm.restore(DirectoryReader(directory, meta.files))
        self._restores.info("restored", "restored installed snapshot through index %d (term %d)", meta.last_index,
                            meta.last_term)
        return read_producers(directory, meta)

    def take_snapshot(self, index: int, term: int, chain_crc: int, next_pos: int, members: str | Membership,
                      keep: tuple[int, ...] = (), producers: bytes = b"", config_index: int = -1) -> SnapshotMeta:
        """`members`: the configuration as of `index` (a peers string only for a group that never
        changed), `config_index` its CONFIG_CHANGE entry (-1: the command line's)."""
        return self.snapshots.take(self.sm or NullStateMachine(), index, term, chain_crc, members, next_pos, keep,
                                   producers, config_index)

    def close(self) -> None:
        """Let the action running finish (never stop an apply half-way); drop the queued ones."""
        self._worker.shutdown(wait=True, cancel_futures=True)
        self._reader.shutdown(wait=True, cancel_futures=True)
        if self._sink is not None:
            self._sink.abort()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _submit(pool: ThreadPoolExecutor, fn: Callable[..., T], args: tuple[Any, ...],
            done: Callable[[Future[T]], None]) -> None:
    loop = asyncio.get_running_loop()
    try:
        fut = pool.submit(fn, *args)
    except RuntimeError:  # shut down: the member is stopping
        return
    fut.add_done_callback(lambda f: loop.call_soon_threadsafe(done, f))
