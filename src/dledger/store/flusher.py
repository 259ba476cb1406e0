"""FlushService: the one thread that fsyncs (DLedger's FlushDataService).

Appends only write to the page cache; this thread makes them durable. In
`sync` mode every append asks for a flush and all appends that arrive while a
flush runs share the next one (group commit). In `async` mode it flushes every
`flush_interval_ms`. It also writes the checkpoint and runs retention, so no
fsync ever happens on the event loop thread.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Protocol

from dledger.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

# Out of file descriptors (process or system): nothing was written badly, only not opened.
_TRANSIENT = frozenset((errno.EMFILE, errno.ENFILE))
EAGER_PERIOD_S = 0.25


class Flushable(Protocol):
    def flush_once(self) -> None: ...
    def write_checkpoint(self) -> None: ...
    def run_retention(self) -> None: ...
    def fail(self, error: BaseException) -> None: ...


class FlushService:
    def __init__(
        self,
        store: Flushable,
        sync: bool,
        flush_interval_s: float,
        checkpoint_interval_s: float,
        retention_interval_s: float,
    ) -> None:
        self._store = store
        self._sync = sync
        self._interval = flush_interval_s
        self._checkpoint_interval = checkpoint_interval_s
        self._retention_interval = retention_interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._eager_until = 0.0  # monotonic: until then retention runs every EAGER_PERIOD_S
        self._thread = threading.Thread(target=self._run, name="dledger-flush", daemon=True)
        self._warn = RateLimitedLog(log).warning

    def start(self) -> None:
        self._thread.start()

    def request(self) -> None:
        self._wake.set()

    def retention_soon(self, for_s: float) -> None:
        """Run retention at once and then every EAGER_PERIOD_S for `for_s` seconds (a compaction
        waits for floors that move within heartbeats, not for the retention interval)."""
        self._eager_until = time.monotonic() + for_s
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        now = time.monotonic()
        next_checkpoint = now + self._checkpoint_interval
        next_retention = now + self._retention_interval
        last_retention = 0.0
        while not self._stop.is_set():
            timeout = self._interval
            eager = time.monotonic() < self._eager_until
            if self._sync:
                timeout = max(0.0, min(next_checkpoint, next_retention) - time.monotonic())
            if eager:
                timeout = min(timeout, EAGER_PERIOD_S)
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._store.flush_once()
                now = time.monotonic()
                if now >= next_checkpoint:
                    self._store.write_checkpoint()
                    next_checkpoint = now + self._checkpoint_interval
                if now >= next_retention or (now < self._eager_until and now - last_retention >= EAGER_PERIOD_S):
                    self._store.run_retention()
                    last_retention = now
                    next_retention = now + self._retention_interval
            except OSError as e:
                if e.errno in _TRANSIENT:  # no file descriptor to open a checkpoint: try again later
                    self._warn("fds", "flush round skipped: %s; retrying", e)
                    continue
                self._fail(e)
                return
            except Exception as e:
                self._fail(e)
                return

    def _fail(self, e: BaseException) -> None:
        """fsync errors are fatal for durability (fsyncgate): the store refuses further writes."""
        log.exception("flush failed; the store refuses further writes")
        self._store.fail(e)
