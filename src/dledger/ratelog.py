"""Warnings an attacker can trigger at will, rate-limited so a flood of bad requests does
not become a flood in our log (nor a disk filled with it)."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """At most one warning per `every_s` per kind; the next one says how many were skipped.
    `clock` (seconds) lets the sans-I/O core pass its own time, as the simulator drives it."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._every = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()

    def warning(self, kind: str, text: str, *args: object) -> None:
        now = self._clock()
        if now - self._last.get(kind, -self._every) < self._every:
            self._suppressed[kind] += 1
            return
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        self._log.warning(text + (f" ({more} more like this suppressed)" if more else ""), *args)
