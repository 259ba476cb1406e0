"""Warnings an attacker can trigger at will, rate-limited so a flood of bad requests does
not become a flood in our log (nor a disk filled with it)."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """At most one line per `every_s` per kind; the next one says how many were skipped.
    `clock` (seconds) lets the sans-I/O core pass its own time, as the simulator drives it
    (see `on_ms`). Kinds are a caller's constants, never taken from a message: each costs a
    dict entry for good."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._every = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()

    @classmethod
    def on_ms(cls, logger: logging.Logger, now_ms: Callable[[], int], every_s: float = 10.0) -> RateLimitedLog:
        """For core/ (pure: no OS clock): rate-limited by the node's own `now` in ms."""
        return cls(logger, every_s, lambda: now_ms() / 1000)

    def warning(self, kind: str, text: str, *args: object) -> None:
        self.log(logging.WARNING, kind, text, *args)

    def info(self, kind: str, text: str, *args: object) -> None:
        self.log(logging.INFO, kind, text, *args)

    def log(self, level: int, kind: str, text: str, *args: object) -> None:
        if not self._log.isEnabledFor(level):
            return
        now = self._clock()
        if now - self._last.get(kind, -self._every) < self._every:
            self._suppressed[kind] += 1
            return
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        self._log.log(level, text + (f" ({more} more like this suppressed)" if more else ""), *args)
